"""User data (cloud-init) of AWS GPU nodes: the node boot manifest (:mod:`gpuinfra.plan.boot`)
as ``#cloud-config``.

EC2 limits user data to 16 KB before base64 encoding
(docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html). The cloud-config is sent gzip-
compressed (it carries the node agent's source); :func:`render_user_data` refuses anything whose
compressed size is over the limit. What does not have to run before the bucket can be read is
in the node bundle (:func:`aws_node_bundle`, :mod:`gpuinfra.plan.node_bundle`).
"""

from __future__ import annotations

import base64
import gzip

import yaml

from gpuinfra.agent.constants import PEER_DISCOVERY_WAIT_SECONDS, SCRATCH_MOUNT, TORCHRUN_PORT
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.errors import SpecError
from gpuinfra.fabrics import EFA, ENA
from gpuinfra.plan.aws import AwsClusterPlan
from gpuinfra.plan.boot import (
    PREPULL_UNIT,
    CloudBoot,
    NodeBoot,
    node_boot,
    render_cluster_env,
)
from gpuinfra.plan.fabric import (
    IMAGE_BUILD_DIR,
    RUN_SCRIPT_PATH,
    aws_fabric,
    efa_image_build,
    image_build_systemd_unit,
    render_run_script,
)
from gpuinfra.plan.health import expectations_for
from gpuinfra.plan.naming import AWS_STACK_ID_TAG, stack_id
from gpuinfra.plan.node_bundle import (
    NodeBundle,
    add_checkpoint_restore,
    add_health_gate,
    add_job,
    add_monitoring,
    fetch_script,
    health_template_vars,
)
from gpuinfra.plan.node_files import docker_on_scratch, node_env, scratch_script
from gpuinfra.plan.tags import AWS_DEPLOYMENT_TAG
from gpuinfra.plan.units import ExecCommand, check_value, shell
from gpuinfra.spec import ClusterSpec

USER_DATA_LIMIT_BYTES = 16 * 1024
#: EC2 instance-store NVMe disks under /dev/disk/by-id (amazon-eks-ami setup-local-disks;
#: ParallelCluster setup-ephemeral-drives.sh).
AWS_NVME_GLOB = "*NVMe_Instance_Storage*"
#: Where the Deep Learning AMI mounts the instance store itself (DLAMI release notes,
#: "nvme_location: /opt/dlami/nvme"; docs/sources/cluster-facts.md section 3.6).
DLAMI_NVME_MOUNT = "/opt/dlami/nvme"
#: The Deep Learning AMI's unit that mounts the instance store at :data:`DLAMI_NVME_MOUNT`:
#: scratch starts after it so both never format the same disks.
DLAMI_NVME_UNIT = "dlami-nvme.service"


def nccl_env(plan: AwsClusterPlan, facts: InstanceFacts) -> dict[str, str]:
    """NCCL environment for the current DLAMI stack (libfabric >= 1.18, aws-ofi-nccl >= 1.7): the
    fabric's ``nccl.env`` settings (:data:`gpuinfra.fabrics.EFA` with EFA, else
    :data:`~gpuinfra.fabrics.ENA`), the EFA device count, and ``NCCL_SHM_USE_CUDA_MEMCPY=1`` on
    types without GPUDirect RDMA over EFA (:attr:`InstanceFacts.gpudirect_rdma`, a catalog fact
    with its source; aws-samples/awsome-distributed-training 1.architectures/efa-cheatsheet.md).
    Never set ``RDMAV_*``.
    """
    env = dict((EFA if plan.efa_count else ENA).nccl_env)
    if plan.efa_count:
        env["GPUINFRA_EFA_DEVICES"] = str(plan.efa_count)
    if not facts.gpudirect_rdma:
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
        unit = image_build_systemd_unit(build)
        bundle.add_unit(unit)
        image, after = build.tag, (unit.name,)
    elif image:
        after = (PREPULL_UNIT,)  # the gate's all-reduce runs in the pre-pulled image
    bundle.add(
        RUN_SCRIPT_PATH,
        render_run_script(runtime, image=image, instance_type=spec.instance_type, scratch=SCRATCH_MOUNT),
        "0755",
    )
    add_monitoring(bundle, spec, "aws")
    add_health_gate(bundle, spec, expectations_for(spec), after)
    add_checkpoint_restore(bundle)
    add_job(bundle)
    return bundle


#: ``aws ecr get-login-password`` piped to ``docker login`` (docs.aws.amazon.com/AmazonECR/latest/
#: userguide/registry_auth.html: "aws ecr get-login-password --region region | docker login
#: --username AWS --password-stdin aws_account_id.dkr.ecr.region.amazonaws.com"; the token is valid
#: 12 hours, enough for the boot's pulls). The password goes through the shell's printf builtin,
#: never a command line; region and registry arrive as ``$1`` / ``$2``.
ECR_LOGIN_SCRIPT = (
    'p="$(aws ecr get-login-password --region "$1")" && '
    'printf %s "$p" | /usr/bin/docker login --username AWS --password-stdin "$2"'
)


def ecr_login(spec: ClusterSpec) -> tuple[ExecCommand, ...]:
    """The command that logs Docker in to the bake's ECR registry (:data:`ECR_LOGIN_SCRIPT`), or
    () when the nodes boot no bake with a container repository.

    Raises:
        UnitValueError: a region or registry that cannot be written (validated by the spec).
    """
    ref = spec.baked_image
    if ref is None or not ref.registry_host:
        return ()
    region = ref.container_repository.split(":")[3]
    return (shell(ECR_LOGIN_SCRIPT, check_value("region", region), check_value("registry", ref.registry_host)),)


def aws_node_boot(spec: ClusterSpec, plan: AwsClusterPlan, bucket: str, bundle: NodeBundle | None = None) -> NodeBoot:
    """The boot manifest (:func:`gpuinfra.plan.boot.node_boot`) of the AWS nodes of ``spec``.

    AWS specifics: scratch starts after the DLAMI's ``dlami-nvme.service``; peers are found
    through EC2 (``templates/aws-cluster-env.sh.j2``); EFA nodes build their training image in
    the bundle (``gpuinfra-image.service``) instead of pre-pulling the profile's image.

    ``bundle``: the node bundle the bucket holds (its SHA-256 is pinned in the fetch script);
    None renders it from ``spec`` and ``plan`` (:func:`plan_cluster <gpuinfra.plan.cluster.plan_cluster>`
    does the same, so both give the same bytes).

    Raises:
        SpecError: the profile's container image is not an OCI reference.
    """
    cluster_env = render_cluster_env(
        "aws-cluster-env.sh.j2",
        stack=stack_id(spec),
        stack_tag=AWS_STACK_ID_TAG,
        nodes=spec.nodes,
        gpus_per_node=spec.gpu_count,
        master_port=TORCHRUN_PORT,
        wait_seconds=PEER_DISCOVERY_WAIT_SECONDS,
        deployment=spec.deployment_id or "",
        deployment_tag=AWS_DEPLOYMENT_TAG,
        **health_template_vars(spec),
    )
    cloud = CloudBoot(
        cloud="aws",
        summary=("Written by gpuinfra from its NodeBoot manifest (gpuinfra/plan/boot.py); cloud-init runs it once.",),
        scratch_script=scratch_script(
            SCRATCH_MOUNT,
            AWS_NVME_GLOB,
            spec.facts.local_ssd.bundled_count,
            DLAMI_NVME_MOUNT,
            docker_on_scratch=docker_on_scratch(spec),
        ),
        scratch_after=(DLAMI_NVME_UNIT,),
        cluster_env_script=cluster_env,
        nccl_env=nccl_env(plan, spec.facts),
        node_env=node_env(spec, "aws", bucket, SCRATCH_MOUNT),
        bundle_fetch_script=fetch_script("aws", bucket, (bundle or aws_node_bundle(spec, plan)).sha256()),
        # EFA nodes build the training image from the profile's image at boot (the bundle's
        # gpuinfra-image.service pulls it): no separate pre-pull
        prepull=not plan.efa_count,
        registry_login=ecr_login(spec),
    )
    return node_boot(spec, cloud)


class _CloudConfigDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing multi-line strings as literal blocks (readable files)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


class _Argv(list):
    """A ``runcmd`` entry: written in flow style, ``[systemctl, daemon-reexec]``."""


def _argv(dumper: yaml.SafeDumper, value: _Argv) -> yaml.SequenceNode:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)


_CloudConfigDumper.add_representer(str, _str)
_CloudConfigDumper.add_representer(_Argv, _argv)


def cloud_config(boot: NodeBoot) -> str:
    """``boot`` as ``#cloud-config`` text: ``write_files`` (every file and unit, with its
    permissions) and ``runcmd`` (the steps as argument lists, which cloud-init runs without a
    shell: cloudinit.readthedocs.io/en/latest/reference/modules.html#runcmd). Dumped by PyYAML's
    safe dumper, so no value can add a key. cloud-init runs ``runcmd`` on the first boot only,
    when every file is new: a step's ``when_changed`` always holds.
    """
    document = {
        "write_files": [{"path": f.path, "permissions": f.mode, "content": f.content} for f in boot.all_files()],
        "runcmd": [_Argv(step.argv) for step in boot.steps],
    }
    header = "".join(f"# {line}\n" for line in boot.summary)  # one line each (NodeBoot checks)
    body = yaml.dump(
        document,
        Dumper=_CloudConfigDumper,
        sort_keys=False,
        default_flow_style=False,
        width=4096,
        allow_unicode=True,
        indent=2,
    )
    return f"#cloud-config\n{header}{body}"


def render_user_data(spec: ClusterSpec, plan: AwsClusterPlan, bucket: str, bundle: NodeBundle | None = None) -> str:
    """The ``#cloud-config`` text for the nodes of ``spec`` (:func:`aws_node_boot`,
    :func:`cloud_config`).

    Args:
        spec: the cluster spec.
        plan: the AWS plan (NICs, EFA count).
        bucket: the stack's S3 bucket name (known at deploy time).
        bundle: the node bundle whose SHA-256 the user data pins (:func:`aws_node_boot`).

    Raises:
        SpecError: the result exceeds EC2's 16 KB user-data limit, or the container image is
            not an OCI reference.
    """
    text = cloud_config(aws_node_boot(spec, plan, bucket, bundle))
    size = len(gzip.compress(text.encode(), mtime=0))
    if size > USER_DATA_LIMIT_BYTES:
        raise SpecError(f"compressed user data is {size} bytes; EC2 allows {USER_DATA_LIMIT_BYTES}")
    return text


def encode_user_data(text: str) -> str:
    """gzip + base64 for the launch template (cloud-init detects and unpacks gzip user data:
    cloudinit.readthedocs.io/en/latest/explanation/format.html)."""
    return base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()
