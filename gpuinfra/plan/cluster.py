"""``plan_cluster``: a validated spec -> its :class:`~gpuinfra.plan.model.ClusterPlan`.

It dispatches to the cloud's planner (:func:`gpuinfra.plan.aws.plan_aws_cluster`,
:func:`gpuinfra.plan.gcp.plan_gcp_cluster`), renders the node bundle
(:func:`gpuinfra.plan.boot_aws.aws_node_bundle`, :func:`gpuinfra.plan.boot_gcp.gcp_node_bundle`)
and fills the cloud-neutral fields. Not to be confused with :func:`gpuinfra.planner.plan_cluster`,
which picks the offer (instance type, region, market) a spec is then written from.

Pure Python, no Pulumi imports.
"""

from __future__ import annotations

from gpuinfra.agent.constants import SCRATCH_MOUNT, TORCHRUN_PORT
from gpuinfra.errors import RuleViolationError
from gpuinfra.plan import boot_aws, boot_gcp
from gpuinfra.plan.aws import AwsClusterPlan, plan_aws_cluster
from gpuinfra.plan.fabric import aws_run_command, gcp_run_command
from gpuinfra.plan.gcp import GcpClusterPlan, plan_gcp_cluster
from gpuinfra.plan.gcp import nccl_env as gcp_nccl_env
from gpuinfra.plan.model import (
    ClusterIdentity,
    ClusterNodes,
    ClusterOutputs,
    ClusterPlacement,
    ClusterPlan,
    ClusterStorage,
    aws_network,
    gcp_network,
)
from gpuinfra.plan.naming import stack_id
from gpuinfra.plan.node_bundle import BUNDLE_PREFIX
from gpuinfra.rules.spec_rules import baked_image_violations
from gpuinfra.spec import ClusterSpec


def check_baked_image(spec: ClusterSpec) -> None:
    """Refuse a spec whose baked image is from another region or whose root disk is smaller than
    the image's root snapshot (rule ``baked-image``, :func:`gpuinfra.rules.spec_rules.baked_image_violations`).

    Raises:
        RuleViolationError: one line per violation (exit 2).
    """
    found = baked_image_violations(spec)
    if found:
        raise RuleViolationError(found)


def cloud_plan(spec: ClusterSpec) -> AwsClusterPlan | GcpClusterPlan:
    """The cloud planner's part of the plan alone (no node bundle is rendered): what the
    conformance rules judge (:func:`gpuinfra.rules.check_plan`) in the whole matrix.

    Args:
        spec: a validated cluster spec (``spec.cloud`` is ``aws`` or ``gcp``).

    Raises:
        SpecError / RuleViolationError: as :func:`plan_cluster`.
    """
    check_baked_image(spec)
    return plan_aws_cluster(spec) if spec.cloud == "aws" else plan_gcp_cluster(spec)


def plan_cluster(spec: ClusterSpec) -> ClusterPlan:
    """The whole plan of ``spec``, on its cloud.

    Args:
        spec: a validated cluster spec (``spec.cloud`` is ``aws`` or ``gcp``).

    Raises:
        SpecError / RuleViolationError: the cloud's planner refuses the spec (an invalid
            combination, a type not sold in the zone, a fabric that cannot boot); nothing is
            registered with Pulumi before this returns.
    """
    check_baked_image(spec)
    if spec.cloud == "aws":
        aws = plan_aws_cluster(spec)
        bundle = boot_aws.aws_node_bundle(spec, aws)
        return ClusterPlan(
            spec=spec,
            aws=aws,
            node_bundle=bundle,
            network=aws_network(spec, aws),
            placement=ClusterPlacement(
                zone=spec.zone,
                compact=aws.placement_group or aws.placement_group_name is not None,
                existing_group=aws.placement_group_name,
            ),
            nodes=_nodes(spec, aws.market),
            storage=ClusterStorage(
                bucket_scheme="s3",
                node_bundle_key=bundle.key,
                scratch_mount=SCRATCH_MOUNT,
                scratch_disks=aws.local_nvme_count,
            ),
            identity=_identity(spec, "ssm", "ec2-describe-instances"),
            outputs=ClusterOutputs(
                nccl_env=boot_aws.nccl_env(aws, spec.facts),
                run_command=aws_run_command(spec.region, stack_id(spec)),
                torchrun_port=TORCHRUN_PORT,
            ),
        )
    gcp = plan_gcp_cluster(spec)
    bundle = boot_gcp.gcp_node_bundle(spec, gcp)
    return ClusterPlan(
        spec=spec,
        gcp=gcp,
        node_bundle=bundle,
        network=gcp_network(gcp),
        placement=ClusterPlacement(zone=spec.zone, compact=gcp.compact_placement or gcp.workload_policy),
        nodes=_nodes(spec, gcp.provisioning_model),
        storage=ClusterStorage(
            bucket_scheme="gs",
            node_bundle_key=bundle.key,
            scratch_mount=SCRATCH_MOUNT,
            scratch_disks=gcp.local_ssd_count,
        ),
        identity=_identity(spec, "iap-ssh" if spec.network.iap_ssh else "none", "own-instance-group"),
        outputs=ClusterOutputs(
            nccl_env=gcp_nccl_env(gcp.nic_layout),
            run_command=gcp_run_command(spec.zone, boot_gcp.node_prefix(spec), spec.network.iap_ssh),
            torchrun_port=TORCHRUN_PORT,
        ),
    )


def _nodes(spec: ClusterSpec, market: str) -> ClusterNodes:
    return ClusterNodes(
        count=spec.nodes, instance_type=spec.instance_type, gpus_per_node=spec.gpu_count, gpu=spec.gpu, market=market
    )


def _identity(spec: ClusterSpec, remote_shell: str, peer_discovery: str) -> ClusterIdentity:
    return ClusterIdentity(
        remote_shell=remote_shell,
        peer_discovery=peer_discovery,
        bucket_read_only_prefix=BUNDLE_PREFIX,
        metric_writes=spec.profile.monitoring.enabled,
    )
