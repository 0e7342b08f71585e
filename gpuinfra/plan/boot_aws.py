"""User data (cloud-init) of AWS GPU nodes, rendered from ``templates/``.

EC2 limits user data to 16 KB before base64 encoding
(docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html). The cloud-config is sent gzip-
compressed (it carries the node agent's source); :func:`render_user_data` refuses anything whose
compressed size is over the limit. What does not have to run before the bucket can be read is
in the node bundle (:func:`aws_node_bundle`, :mod:`gpuinfra.plan.node_bundle`).
"""

from __future__ import annotations

import base64
import gzip

from gpuinfra.agent.constants import PEER_DISCOVERY_WAIT_SECONDS, SCRATCH_MOUNT, TORCHRUN_PORT
from gpuinfra.errors import SpecError
from gpuinfra.fabrics import EFA, ENA
from gpuinfra.plan.aws import AwsClusterPlan
from gpuinfra.plan.fabric import (IMAGE_BUILD_DIR, RUN_SCRIPT_PATH, aws_fabric, efa_image_build, image_build_unit,
                                  render_run_script)
from gpuinfra.plan.health import expectations_for
from gpuinfra.plan.node_bundle import (BUNDLE_FETCH_PATH, BUNDLE_UNIT, IMAGE_UNIT, NodeBundle, add_health_gate,
                                       add_monitoring, fetch_script, fetch_unit, health_template_vars)
from gpuinfra.plan.node_files import NODE_FILES, node_env, scratch_script
from gpuinfra.spec import ClusterSpec
from gpuinfra.templating import agent_source, render

USER_DATA_LIMIT_BYTES = 16 * 1024
#: The unit that pre-pulls the profile's image on nodes without EFA (templates/aws-cloud-init.yaml.j2).
PREPULL_UNIT = "gpuinfra-prepull.service"
#: EC2 instance-store NVMe disks under /dev/disk/by-id (amazon-eks-ami setup-local-disks;
#: ParallelCluster setup-ephemeral-drives.sh).
AWS_NVME_GLOB = "*NVMe_Instance_Storage*"
#: Where the Deep Learning AMI mounts the instance store itself (DLAMI release notes,
#: "nvme_location: /opt/dlami/nvme"; cluster-facts.md section 3.6).
DLAMI_NVME_MOUNT = "/opt/dlami/nvme"


def nccl_env(plan: AwsClusterPlan, instance_type: str) -> dict[str, str]:
    """NCCL environment for the current DLAMI stack (libfabric >= 1.18, aws-ofi-nccl >= 1.7): the
    fabric's ``nccl.env`` settings (:data:`gpuinfra.fabrics.EFA` with EFA, else
    :data:`~gpuinfra.fabrics.ENA`), the EFA device count, and ``NCCL_SHM_USE_CUDA_MEMCPY=1`` on
    g5/g6 (no GPUDirect RDMA over EFA; aws-samples/awsome-distributed-training
    1.architectures/efa-cheatsheet.md). Never set ``RDMAV_*``.
    """
    env = dict((EFA if plan.efa_count else ENA).nccl_env)
    if plan.efa_count:
        env["GPUINFRA_EFA_DEVICES"] = str(plan.efa_count)
    if instance_type.startswith(("g5.", "g6.", "g6e.", "gr6.", "g4dn.")):
        env["NCCL_SHM_USE_CUDA_MEMCPY"] = "1"
    return env


def aws_node_bundle(spec: ClusterSpec, plan: AwsClusterPlan) -> NodeBundle:
    """The AWS node bundle: ``gpuinfra-run``; on EFA nodes with a container image, the
    EFA-enabled training image built at boot (which ``gpuinfra-run`` then runs by default); the
    monitoring agent; the health gate.

    Raises:
        SpecError / RuleViolationError: the plan refuses the spec (expectations).
    """
    bundle = NodeBundle()
    runtime = aws_fabric(plan.efa_count)
    image = spec.profile.container_image
    after: tuple[str, ...] = ()
    if plan.efa_count and image:
        build = efa_image_build(image)
        bundle.add(f"{IMAGE_BUILD_DIR}/Dockerfile", build.dockerfile)
        bundle.add(f"/etc/systemd/system/{IMAGE_UNIT}", image_build_unit(build))
        bundle.units.append(IMAGE_UNIT)
        image, after = build.tag, (IMAGE_UNIT,)
    elif image:
        after = (PREPULL_UNIT,)  # the gate's all-reduce runs in the pre-pulled image
    bundle.add(RUN_SCRIPT_PATH, render_run_script(runtime, image=image, instance_type=spec.instance_type,
                                                  scratch=SCRATCH_MOUNT), "0755")
    add_monitoring(bundle, spec, "aws")
    add_health_gate(bundle, spec, expectations_for(spec), after)
    return bundle


def render_user_data(spec: ClusterSpec, plan: AwsClusterPlan, bucket: str) -> str:
    """The ``#cloud-config`` text for the nodes of ``spec``.

    Args:
        spec: the cluster spec.
        plan: the AWS plan (NICs, EFA count).
        bucket: the stack's S3 bucket name (known at deploy time).

    Raises:
        SpecError: the result exceeds EC2's 16 KB user-data limit.
    """
    scratch = scratch_script(SCRATCH_MOUNT, AWS_NVME_GLOB, spec.facts.local_ssd.bundled_count, DLAMI_NVME_MOUNT)
    cluster_env = render(
        "aws-cluster-env.sh.j2",
        stack=spec.stack,
        nodes=spec.nodes,
        gpus_per_node=spec.gpu_count,
        master_port=TORCHRUN_PORT,
        wait_seconds=PEER_DISCOVERY_WAIT_SECONDS,
        **health_template_vars(spec),
    )
    # EFA nodes build the training image from the profile's image at boot (the bundle's
    # gpuinfra-image.service pulls it): no separate pre-pull
    prepull = "" if plan.efa_count else spec.profile.container_image
    text = render(
        "aws-cloud-init.yaml.j2",
        node_files=NODE_FILES,
        stack=spec.stack,
        instance_type=spec.instance_type,
        profile=spec.profile.name,
        scratch_script=scratch.rstrip("\n"),
        agent_source=agent_source(),
        cluster_env_script=cluster_env.rstrip("\n"),
        bundle_fetch_path=BUNDLE_FETCH_PATH,
        bundle_fetch_script=fetch_script("aws", bucket),
        bundle_unit=BUNDLE_UNIT,
        bundle_unit_text=fetch_unit().rstrip("\n"),
        mount_point=SCRATCH_MOUNT,
        container_image=prepull,
        prepull_unit=PREPULL_UNIT,
        nccl_env=nccl_env(plan, spec.instance_type),
        node_env=node_env(spec, "aws", bucket, SCRATCH_MOUNT),
    )
    size = len(gzip.compress(text.encode(), mtime=0))
    if size > USER_DATA_LIMIT_BYTES:
        raise SpecError(f"compressed user data is {size} bytes; EC2 allows {USER_DATA_LIMIT_BYTES}")
    return text


def encode_user_data(text: str) -> str:
    """gzip + base64 for the launch template (cloud-init detects and unpacks gzip user data:
    cloudinit.readthedocs.io/en/latest/explanation/format.html)."""
    return base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()
