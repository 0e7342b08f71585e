"""GPU VMs: compact placement policy, one instance template, one zonal managed instance group,
and, for STANDARD and SPOT VMs, one all-or-nothing bulk insert.

Formation (``GcpClusterPlan.formation``), all or nothing in every market:

* STANDARD / SPOT (:data:`~gpuinfra.plan.formation.BULK_INSERT`): the nodes come from one
  ``instances.bulkInsert`` with ``minCount`` = ``count`` = nodes, under the fixed names
  ``<group>-n000..`` (:func:`gpuinfra.plan.naming.gcp_bulk_instance_names`), from the same template
  (:mod:`blueprints.gcp.bulk_insert`: within ``up --capacity-timeout`` every VM exists, or none
  does and ``up`` fails with the classified error). The MIG (same name, same template) is
  created at target size 0 with ``targetSize`` ignored: bulk mode, which would make the MIG
  itself all-or-nothing, "is only supported with instance templates that specify either a
  reservation-bound or flex-start provisioning model" (cloud.google.com/compute/docs/
  instance-groups/about-bulk-mode#limitations), and an ordinary MIG keeps creating VMs after a
  failed ``up``. Its only members are the replacements the nodes ask it for (``createInstances``
  when a node is lost), which its REPAIR policy then keeps;
* reservation-bound (:data:`~gpuinfra.plan.formation.BULK_MODE`): the MIG in bulk mode at target
  size N, as before.

All nodes come from one template, so the resource count does not grow with the node count.
Placement follows the formation (``GcpClusterPlan.compact_placement`` / ``workload_policy``):
bulk-inserted nodes are placed by the template's COLLOCATED compact policy (``vm_count`` = nodes,
no ``max_distance``: best effort) on every machine that takes one -- A2, G2, A3 1g-4g and also A3
High 8g, A3 Mega, A3 Ultra and A4, since a compact policy places "standalone compute instances,
or compute instances created in bulk" while workload policies are for MIGs with clustered GPUs
(cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy): a MIG's workload
policy places only the VMs that MIG creates, so the empty MIG of a bulk-insert formation has none,
and its replacements, from the same template, join the same compact policy. A reservation-bound
MIG (bulk mode) of A3 8g / Mega / Ultra / A4 creates the nodes itself and keeps the
HIGH_THROUGHPUT workload policy. The template's ``max_run_duration`` (TTL + the backstop delay of
:mod:`gpuinfra.plan.backstop`) is the cloud-side backstop and works inside a MIG: "When a VM
reaches its time limit, the MIG automatically terminates (deletes) that VM"
(cloud.google.com/compute/docs/instance-groups/limit-vm-runtime-in-migs), and since 2024 it is
not recreated: "When a VM in a MIG reaches its time limit, the MIG deletes that VM instead of
repairing it" (Compute Engine release notes, 2024-04-29, marked breaking). Failed VMs are not
repaired.

Lost nodes: a SPOT / STANDARD group repairs a VM that Compute Engine preempts (the template's
``instance_termination_action = DELETE`` deletes it) or that fails on its host
(``default_action_on_failure = REPAIR``, :data:`gpuinfra.rules.gcp.REPAIR` says why and cites
cloud.google.com/compute/docs/instance-groups/about-repair): the MIG recreates it under the same
name from the same template, and it restores the newest complete checkpoint and rejoins. Nodes
that end themselves go through the MIG (``delete-instances``, resize to 0), which the MIG never
repairs. Flex-start groups are created at target size 0 and get all their nodes at once from one
resize request (:mod:`blueprints.gcp.resize_request`). Bulk-mode (reservation-bound) and
flex-start groups keep ``DO_NOTHING`` ("MIG does not repair a failed
VM", pulumi_gcp ``InstanceGroupManagerInstanceLifecyclePolicyArgs``). Interplay:

* compact placement: the recreated VM comes from the same template, so the same compact policy
  (``vm_count`` = nodes, one of them gone) applies to it; when the zone has no capacity for it the
  MIG keeps retrying ("the group will retry until it creates that VM successfully", REPAIR's
  description in the Compute alpha API) while the survivors wait (the job re-forms with elastic
  rendezvous, ``gpuinfra run``); whether a recreated VM lands as close to the others as the
  first ones is not documented;
* workload policy (reservation-bound A3 8g / Mega / Ultra / A4 groups): applies to every VM the MIG
  creates, repairs included;
* ``force_update_on_repair = NO``: a repaired VM keeps the group's update policy (template edits
  never replace running training nodes: ``update_policy`` OPPORTUNISTIC with minimal action NONE);
* ``instance_redistribution_type`` is left unset: it is "The instance redistribution policy for
  regional managed instance groups" (pulumi_gcp ``InstanceGroupManagerUpdatePolicyArgs``), and
  this group is zonal (one zone: one compact policy, one fabric);
* no autohealing health check: a repair on a failed *application* check would recreate a node
  mid-job; only VMs that fail or that Compute Engine deletes are recreated.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from blueprints.gcp.bulk_insert import BulkInstances
from blueprints.gcp.resize_request import RESIZE_REQUEST, flex_start_reservation_affinity
from gpuinfra.catalog.prices import HYPERDISK_BALANCED_FREE_IOPS, HYPERDISK_BALANCED_FREE_THROUGHPUT_MIBPS
from gpuinfra.plan.boot_gcp import node_prefix, render_startup_script
from gpuinfra.plan.formation import BULK_INSERT
from gpuinfra.plan.gcp import GcpClusterPlan
from gpuinfra.plan.naming import child, gcp_bulk_instance_names
from gpuinfra.plan.node_bundle import NodeBundle
from gpuinfra.plan.tags import gcp_labels
from gpuinfra.spec import ClusterSpec


def build_workload_policy(
    name: str, spec: ClusterSpec, plan: GcpClusterPlan, project: str, parent: pulumi.Resource
) -> gcp.compute.ResourcePolicy | None:
    """HIGH_THROUGHPUT workload policy for a MIG that creates the nodes itself (bulk mode; A3 High
    8g, A3 Mega, A3 Ultra, A4): the MIG places its VMs close together
    (cloud.google.com/compute/docs/instance-groups/about-workload-policies)."""
    if not plan.workload_policy:
        return None
    return gcp.compute.ResourcePolicy(
        child(name, "workload"),
        region=spec.region,
        workload_policy=gcp.compute.ResourcePolicyWorkloadPolicyArgs(type="HIGH_THROUGHPUT"),
        project=project,
        opts=pulumi.ResourceOptions(parent=parent),
    )


def build_placement_policy(
    name: str, spec: ClusterSpec, plan: GcpClusterPlan, project: str, parent: pulumi.Resource
) -> gcp.compute.ResourcePolicy | None:
    """COLLOCATED group placement policy with ``vm_count`` = nodes (multi-node clusters of
    machines that take a compact policy in the template, and every multi-node bulk-insert
    formation: cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy). No
    ``max_distance``: Preview, and it makes placement strict instead of best effort (same page)."""
    if not plan.compact_placement:
        return None
    return gcp.compute.ResourcePolicy(
        child(name, "compact"),
        region=spec.region,
        group_placement_policy=gcp.compute.ResourcePolicyGroupPlacementPolicyArgs(
            collocation="COLLOCATED", vm_count=spec.nodes
        ),
        project=project,
        opts=pulumi.ResourceOptions(parent=parent),
    )


def build_template(
    name: str,
    spec: ClusterSpec,
    plan: GcpClusterPlan,
    networks,
    account,
    bucket,
    policy,
    project: str,
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource] | None = None,
    bundle: NodeBundle | None = None,
) -> gcp.compute.InstanceTemplate:
    """The instance template: machine, GPUs, gVNIC/MRDMA NICs, disks, scheduling, metadata;
    created after ``depends_on`` (the node bundle object: no VM boots before its bundle exists).
    The startup script pins ``bundle``'s SHA-256 (the bundle object's; None: rendered from the spec)."""
    interfaces = []
    for nic_type, subnets in networks:
        for subnet in subnets:
            interfaces.append(
                gcp.compute.InstanceTemplateNetworkInterfaceArgs(
                    subnetwork=subnet.id,
                    nic_type=nic_type,
                )
            )
    # a Hyperdisk Balanced boot disk is provisioned at the performance it includes for free, so
    # its cost is its capacity (GCP's unprovisioned default could be billed above it)
    hyperdisk = plan.boot_disk_type == "hyperdisk-balanced"
    disks = [
        gcp.compute.InstanceTemplateDiskArgs(
            boot=True,
            auto_delete=True,
            source_image=plan.image,
            disk_type=plan.boot_disk_type,
            disk_size_gb=spec.profile.root_disk_gib,
            provisioned_iops=HYPERDISK_BALANCED_FREE_IOPS if hyperdisk else None,
            provisioned_throughput=HYPERDISK_BALANCED_FREE_THROUGHPUT_MIBPS if hyperdisk else None,
            labels=gcp_labels(spec),
        )
    ]
    disks += [
        gcp.compute.InstanceTemplateDiskArgs(
            type="SCRATCH",
            disk_type="local-ssd",
            interface=plan.local_ssd_interface,
            disk_size_gb=plan.local_ssd_size_gib,
            auto_delete=True,
        )
        for _ in range(plan.local_ssd_listed)
    ]
    scheduling = gcp.compute.InstanceTemplateSchedulingArgs(
        on_host_maintenance="TERMINATE",
        automatic_restart=False,
        provisioning_model=plan.provisioning_model,
        preemptible=plan.provisioning_model == "SPOT",
        instance_termination_action="DELETE",
        # a flex-start group's run duration is its resize request's (blueprints/gcp/resize_request.py)
        max_run_duration=(
            gcp.compute.InstanceTemplateSchedulingMaxRunDurationArgs(seconds=plan.max_run_duration_seconds)
            if plan.resize_request_run_seconds is None
            else None
        ),
    )
    startup = bucket.name.apply(lambda bucket_name: render_startup_script(spec, plan, bucket_name, bundle))
    return gcp.compute.InstanceTemplate(
        child(name, "template"),
        name_prefix=f"{node_prefix(spec)[:30]}-",
        machine_type=spec.instance_type,
        region=spec.region,
        guest_accelerators=(
            [
                gcp.compute.InstanceTemplateGuestAcceleratorArgs(
                    type=plan.guest_accelerator[0], count=plan.guest_accelerator[1]
                )
            ]
            if plan.guest_accelerator
            else None
        ),
        network_interfaces=interfaces,
        disks=disks,
        scheduling=scheduling,
        service_account=gcp.compute.InstanceTemplateServiceAccountArgs(email=account.email, scopes=["cloud-platform"]),
        metadata={"startup-script": startup, "enable-oslogin": "TRUE"},
        resource_policies=policy.self_link if policy is not None else None,  # one self link (max 1 policy)
        reservation_affinity=(
            gcp.compute.InstanceTemplateReservationAffinityArgs(
                type="SPECIFIC_RESERVATION",
                specific_reservation=gcp.compute.InstanceTemplateReservationAffinitySpecificReservationArgs(
                    key="compute.googleapis.com/reservation-name", values=[spec.gcp_reservation]
                ),
            )
            if spec.gcp_reservation
            else (flex_start_reservation_affinity() if plan.formation == RESIZE_REQUEST else None)
        ),
        shielded_instance_config=gcp.compute.InstanceTemplateShieldedInstanceConfigArgs(
            enable_secure_boot=False, enable_integrity_monitoring=True, enable_vtpm=True
        ),
        labels=gcp_labels(spec),
        project=project,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=depends_on),
    )


def build_group(
    name: str,
    spec: ClusterSpec,
    plan: GcpClusterPlan,
    template: gcp.compute.InstanceTemplate,
    workload_policy: gcp.compute.ResourcePolicy | None,
    project: str,
    parent: pulumi.Resource,
) -> gcp.compute.InstanceGroupManager:
    """The zonal MIG of the nodes. Reservation-bound groups hold every node and are
    all-or-nothing (``targetSizePolicy.mode = BULK``: the MIG creates all VMs at once or none,
    cloud.google.com/compute/docs/instance-groups/about-target-size-policy). For a bulk-insert
    formation (STANDARD / SPOT) it starts at target size 0 and Pulumi ignores ``targetSize``
    (the nodes add their replacements to it: a later ``up`` must not undo them)."""
    # a bulk-insert formation's nodes are the bulk insert's; a flex-start group's come from its resize
    # request, which sets the size (the program never does): both groups start at 0 and keep
    # whatever size the replacements or the request give them
    starts_empty = plan.formation in (BULK_INSERT, RESIZE_REQUEST)
    return gcp.compute.InstanceGroupManager(
        child(name, "nodes"),
        name=node_prefix(spec),  # = base instance name: the agent finds its group from its VM name
        zone=spec.zone,
        base_instance_name=node_prefix(spec),
        versions=[
            gcp.compute.InstanceGroupManagerVersionArgs(instance_template=template.self_link_unique, name="nodes")
        ],
        target_size=0 if starts_empty else spec.nodes,
        target_size_policies=(
            [gcp.compute.InstanceGroupManagerTargetSizePolicyArgs(mode="BULK")] if plan.all_or_nothing else None
        ),
        resource_policies=(
            gcp.compute.InstanceGroupManagerResourcePoliciesArgs(workload_policy=workload_policy.self_link)
            if workload_policy is not None
            else None
        ),
        update_policy=gcp.compute.InstanceGroupManagerUpdatePolicyArgs(
            type="OPPORTUNISTIC",
            minimal_action="NONE",
            replacement_method="RECREATE",
            max_surge_fixed=0,
            max_unavailable_fixed=1,
        ),
        instance_lifecycle_policy=gcp.compute.InstanceGroupManagerInstanceLifecyclePolicyArgs(
            default_action_on_failure=plan.action_on_failure,
            force_update_on_repair="NO",
        ),
        wait_for_instances=not starts_empty,  # an empty group has nothing to wait for (`up` waits for the request)
        wait_for_instances_status="STABLE",
        project=project,
        # bulk mode is set at creation and a bulk-mode MIG grows only from size 0
        # (about-bulk-mode#limitations): a change of mode, or of size in bulk mode, replaces the
        # group, the old one deleted first (its name is fixed)
        opts=pulumi.ResourceOptions(
            parent=parent,
            replace_on_changes=["targetSizePolicies", *(["targetSize"] if plan.all_or_nothing else [])],
            delete_before_replace=True,
            ignore_changes=["targetSize"] if starts_empty else None,
        ),
    )


def build_bulk_instances(
    name: str,
    spec: ClusterSpec,
    plan: GcpClusterPlan,
    template: gcp.compute.InstanceTemplate,
    project: str,
    capacity_timeout_seconds: int,
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource] | None = None,
) -> BulkInstances | None:
    """The nodes of a bulk-insert formation (module docstring), or None for a bulk-mode group.

    Args:
        capacity_timeout_seconds: how long the create waits for every VM (``up --capacity-timeout``).
        depends_on: created after these (the MIG: a node that is lost at once finds its group).
    """
    if plan.formation != BULK_INSERT:
        return None
    return BulkInstances(
        child(name, "bulk"),
        project=project,
        zone=spec.zone,
        region=spec.region,
        template=template.self_link_unique,
        names=list(gcp_bulk_instance_names(node_prefix(spec), spec.nodes)),
        machine_type=spec.instance_type,
        capacity_timeout_seconds=capacity_timeout_seconds,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=depends_on, delete_before_replace=True),
    )
