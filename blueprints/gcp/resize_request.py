"""The resize request of a flex-start cluster (:mod:`gpuinfra.plan.flex_start`).

A flex-start cluster's MIG is created empty (target size 0) and one
``gcp.compute.ResizeRequest`` asks for every node at once with the run duration of the plan:
"When resources are available, the MIG creates VMs all at once"; "At the end of the run duration,
the MIG deletes the created VMs" (cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig).
The request raises the group's target size by itself ("The group's target size will be increased by
this number": pulumi-gcp 10.2 ``ResizeRequestArgs.resize_by``), so the MIG ignores later
``targetSize`` differences: a later ``pulumi up`` must never shrink a formed cluster back to 0.
Creating the request returns once it is ACCEPTED; ``gpuinfra up`` then waits for it within its
capacity timeout and cancels it when it is not fulfilled (:mod:`gpuinfra.services.flex_start`).
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from gpuinfra.plan.flex_start import RESIZE_REQUEST, resize_request_name
from gpuinfra.plan.gcp import GcpClusterPlan
from gpuinfra.plan.naming import child
from gpuinfra.spec import ClusterSpec

__all__ = [
    "RESIZE_REQUEST",
    "build_resize_request",
    "flex_start_reservation_affinity",
]


def flex_start_reservation_affinity() -> gcp.compute.InstanceTemplateReservationAffinityArgs:
    """``NO_RESERVATION``: flex-start VMs come from the Dynamic Workload Scheduler's capacity, not a
    reservation (the provider's DWS resize-request example template sets it: pulumi-gcp 10.2
    ``compute.ResizeRequest`` docstring)."""
    return gcp.compute.InstanceTemplateReservationAffinityArgs(type="NO_RESERVATION")


def build_resize_request(
    name: str,
    spec: ClusterSpec,
    plan: GcpClusterPlan,
    group: gcp.compute.InstanceGroupManager,
    project: str,
    parent: pulumi.Resource,
) -> gcp.compute.ResizeRequest | None:
    """One resize request for all ``spec.nodes`` nodes of a flex-start group, with
    ``requested_run_duration`` = ``plan.resize_request_run_seconds``; None for other formations.

    A changed node count or run duration replaces the request (its fields cannot be updated:
    Compute API ``instanceGroupManagerResizeRequests`` has insert, get, list, cancel and delete
    only); the group is replaced with it only when its own inputs change.
    """
    if plan.formation != RESIZE_REQUEST or plan.resize_request_run_seconds is None:
        return None
    return gcp.compute.ResizeRequest(
        child(name, "resize"),
        name=resize_request_name(spec),
        instance_group_manager=group.name,
        zone=spec.zone,
        resize_by=spec.nodes,
        requested_run_duration=gcp.compute.ResizeRequestRequestedRunDurationArgs(
            seconds=str(plan.resize_request_run_seconds), nanos=0
        ),
        description=f"gpuinfra {spec.stack}: all {spec.nodes} nodes at once (flex-start)",
        project=project,
        opts=pulumi.ResourceOptions(parent=parent),
    )
