"""GPU VMs: compact placement policy, one instance template, and the VMs made from it.

The VMs are created from the template one resource per node, not through a managed instance
group: the TTL deletes each VM when its ``max_run_duration`` ends and the idle watchdog deletes
idle VMs, and a MIG would recreate them to keep its target size (restarting the bill). So the
resource count is fixed + 1 per node; the per-VM resources carry only the name and the template
link (benchmarks/bench_preview.py --cloud gcp prints the counts). VM names ``<stack>-node-<i>``
also give each node its torchrun rank without any API call.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from blueprints.common.naming import child
from blueprints.common.tags import gcp_labels
from blueprints.gcp.plan import GcpClusterPlan
from blueprints.gcp.startup import node_prefix, render_startup_script
from gpuinfra.spec import ClusterSpec


def build_placement_policy(name: str, spec: ClusterSpec, plan: GcpClusterPlan, project: str,
                           parent: pulumi.Resource) -> gcp.compute.ResourcePolicy | None:
    """COLLOCATED group placement policy with ``vm_count`` = nodes (multi-node clusters)."""
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


def build_template(name: str, spec: ClusterSpec, plan: GcpClusterPlan, networks, account, bucket,
                   policy, project: str, parent: pulumi.Resource) -> gcp.compute.InstanceTemplate:
    """The instance template: machine, GPUs, gVNIC/MRDMA NICs, disks, scheduling, metadata."""
    interfaces = []
    for nic_type, subnets in networks:
        for subnet in subnets:
            interfaces.append(gcp.compute.InstanceTemplateNetworkInterfaceArgs(
                subnetwork=subnet.id, nic_type=nic_type,
            ))
    disks = [gcp.compute.InstanceTemplateDiskArgs(
        boot=True, auto_delete=True, source_image=plan.image, disk_type=plan.boot_disk_type,
        disk_size_gb=spec.profile.root_disk_gib, labels=gcp_labels(spec),
    )]
    disks += [
        gcp.compute.InstanceTemplateDiskArgs(type="SCRATCH", disk_type="local-ssd", interface="NVME",
                                             disk_size_gb=375, auto_delete=True)
        for _ in range(plan.local_ssd_count)
    ]
    scheduling = gcp.compute.InstanceTemplateSchedulingArgs(
        on_host_maintenance="TERMINATE",
        automatic_restart=False,
        provisioning_model="SPOT" if spec.spot else "STANDARD",
        preemptible=spec.spot,
        instance_termination_action="DELETE",
        max_run_duration=gcp.compute.InstanceTemplateSchedulingMaxRunDurationArgs(
            seconds=plan.max_run_duration_seconds
        ),
    )
    startup = bucket.name.apply(lambda bucket_name: render_startup_script(spec, plan, bucket_name))
    return gcp.compute.InstanceTemplate(
        child(name, "template"),
        name_prefix=f"{node_prefix(spec)[:30]}-",
        machine_type=spec.instance_type,
        region=spec.region,
        guest_accelerators=(
            [gcp.compute.InstanceTemplateGuestAcceleratorArgs(type=plan.guest_accelerator[0], count=plan.guest_accelerator[1])]
            if plan.guest_accelerator else None
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
            ) if spec.gcp_reservation else None
        ),
        shielded_instance_config=gcp.compute.InstanceTemplateShieldedInstanceConfigArgs(
            enable_secure_boot=False, enable_integrity_monitoring=True, enable_vtpm=True
        ),
        labels=gcp_labels(spec),
        project=project,
        opts=pulumi.ResourceOptions(parent=parent),
    )


def build_vms(name: str, spec: ClusterSpec, template: gcp.compute.InstanceTemplate, project: str,
              parent: pulumi.Resource) -> list[gcp.compute.InstanceFromTemplate]:
    """One VM per node from the template, all in the spec's zone (see module docstring)."""
    prefix = node_prefix(spec)
    return [
        gcp.compute.InstanceFromTemplate(
            child(name, f"node-{i}"),
            name=f"{prefix}-{i}",
            zone=spec.zone,
            source_instance_template=template.self_link_unique,
            labels=gcp_labels(spec),
            project=project,
            opts=pulumi.ResourceOptions(parent=parent),
        )
        for i in range(spec.nodes)
    ]
