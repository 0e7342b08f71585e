"""The one place the box tier imports gpuinfra's boot-text renderers from.

The renderers are the Pulumi-free modules of :mod:`gpuinfra.plan`; every import the tier needs
from them is here, so a move is repointed in this file only.
"""

from __future__ import annotations

from pathlib import Path

from gpuinfra.plan import boot_aws as userdata
from gpuinfra.plan import boot_gcp as startup
from gpuinfra.plan import node_files
from gpuinfra.plan.aws import AwsClusterPlan, plan_aws_cluster
from gpuinfra.plan.boot_aws import aws_node_bundle, render_user_data
from gpuinfra.plan.boot_gcp import gcp_node_bundle, node_prefix, render_startup_script
from gpuinfra.plan.gcp import GcpClusterPlan, plan_gcp_cluster
from gpuinfra.plan.naming import gcp_bulk_instance_names
from gpuinfra.plan.node_bundle import BUNDLE_PREFIX, NodeBundle
from gpuinfra.spec import BakedImageRef, ClusterSpec
from gpuinfra.stackfile import read_stack_spec

__all__ = ["BUNDLE_PREFIX", "BootText", "baked_variant", "render_boot", "stack_spec"]

ROOT = Path(__file__).resolve().parents[2]


class BootText:
    """What a stack's nodes boot from.

    Attributes:
        cloud: ``aws`` | ``gcp``.
        text: the ``#cloud-config`` (AWS user data) or the bash startup script (GCP metadata).
        bundle: the node bundle document (JSON text) stored at :attr:`bundle_key` in the bucket.
        bundle_key: the bundle's object key (named after its SHA-256, which the boot text pins).
        group: the GCP managed instance group's base name (VM names are ``<group>-<suffix>``); "" on AWS.
        efa_devices: EFA interfaces per node (AWS plan); 0 on GCP.
        bulk_names: GCP: the names of the stack's bulk-inserted VMs (``<group>-n000`` ...); () on AWS.
    """

    def __init__(
        self,
        cloud: str,
        text: str,
        bundle: NodeBundle,
        group: str = "",
        efa_devices: int = 0,
        bulk_names: tuple[str, ...] = (),
    ) -> None:
        self.cloud, self.text, self.group, self.efa_devices = cloud, text, group, efa_devices
        self.bulk_names = bulk_names
        self.bundle, self.bundle_key = bundle.to_json(), bundle.key


def stack_spec(stack: str) -> ClusterSpec:
    """The spec of ``stacks/Pulumi.<stack>.yaml`` (:func:`gpuinfra.stackfile.read_stack_spec`)."""
    return read_stack_spec(ROOT, stack)


def baked_variant(spec: ClusterSpec, bake: str, image_id: str, repository: str, container: str = "") -> ClusterSpec:
    """``spec`` as ``gpuinfra new --image baked:<bake>`` writes it for a bake of its type
    (:func:`gpuinfra.bake.stack.apply_baked_image`): the bake's image, the bake recorded in
    ``baked_image`` (its region, a 200 GiB root, its ECR / Artifact Registry ``repository``), and
    the profile's container: ``container`` (AWS: the bake's ECR container), or unchanged (GCP: the
    manifest's container base, on the image under that reference)."""
    ref = BakedImageRef(bake=bake, region=spec.region, root_snapshot_gib=200, container_repository=repository)
    updates: dict = {"root_disk_gib": max(spec.profile.root_disk_gib, 200)}
    if container:
        updates["container_image"] = container
    profile = spec.profile.model_copy(update=updates)
    image = {"gcp_image": image_id} if spec.cloud == "gcp" else {"ami_id": image_id}
    return ClusterSpec.model_validate({**spec.model_dump(), **image, "baked_image": ref, "profile": profile})


def render_boot(spec: ClusterSpec, bucket: str) -> BootText:
    """Render the real boot text and node bundle of ``spec`` for ``bucket``, with one change: the
    scratch script is rendered for a machine without local NVMe disks (``expected_disks=0``: scratch
    is a folder on the root disk). A container has no NVMe disks to build the RAID0 from, and the
    script's answer to missing disks -- a read-only ``/scratch`` so nothing fills the root disk --
    would (rightly) fail every ``gpuinfra-run``, the health gate's all-reduce included.
    """

    def no_local_disks(
        mount_point: str, device_glob: str, expected_disks: int, existing_mount: str = "", **options: bool
    ) -> str:
        """:func:`gpuinfra.plan.node_files.scratch_script` with ``expected_disks=0``."""
        return node_files.scratch_script(mount_point, device_glob, 0, existing_mount, **options)

    saved = userdata.scratch_script, startup.scratch_script
    userdata.scratch_script = startup.scratch_script = no_local_disks
    try:
        if spec.cloud == "aws":
            aws_plan: AwsClusterPlan = plan_aws_cluster(spec)
            bundle = aws_node_bundle(spec, aws_plan)
            return BootText(
                "aws",
                render_user_data(spec, aws_plan, bucket, bundle),
                bundle,
                efa_devices=aws_plan.efa_count,
            )
        gcp_plan: GcpClusterPlan = plan_gcp_cluster(spec)
        bundle = gcp_node_bundle(spec, gcp_plan)
        return BootText(
            "gcp",
            render_startup_script(spec, gcp_plan, bucket, bundle),
            bundle,
            node_prefix(spec),
            bulk_names=gcp_bulk_instance_names(node_prefix(spec), spec.nodes),
        )
    finally:
        userdata.scratch_script, startup.scratch_script = saved
