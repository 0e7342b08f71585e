"""GCP flex-start (Dynamic Workload Scheduler) clusters: the run duration of a MIG resize request.

A flex-start cluster is one zonal MIG created at target size 0 from a ``FLEX_START`` instance
template, plus one resize request for all N nodes. Sources:

* Flex-start VMs "start running and keep running for a maximum of seven days"; they suit
  "all accelerator-optimized machine types (except A4X and G4)"; when the run duration ends
  "Compute Engine automatically stops or deletes the VMs based on the termination action"
  (cloud.google.com/compute/docs/instances/about-flex-start-vms).
* A resize request's ``requestedRunDuration`` "must be between 10 minutes and 7 days. At the end
  of the run duration, the MIG deletes the created VMs"; "When resources are available, the MIG
  creates VMs all at once ... to avoid charges for partial capacity"; resize requests are for
  "the flex-start or reservation-bound provisioning models"
  (cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig).
* The MIG of a resize request leaves failed VMs alone (``defaultActionOnFailure`` DO_NOTHING) and
  does not wait for instances (pulumi-gcp 10.2 ``compute.ResizeRequest`` example, from the
  provider's ``compute_mig_resize_request`` example); the template keeps ``on_host_maintenance``
  TERMINATE and ``automatic_restart`` false as every GPU VM here.

The run duration comes from the stack's TTL (``profile.ttl_hours``): TTL plus the backstop delay of
:mod:`gpuinfra.plan.backstop` (so the node agent ends the nodes first, with its checkpoint sync),
cut to the 7-day limit. A TTL over 7 days cannot be honoured and is refused.
"""

from __future__ import annotations

from gpuinfra.errors import SpecError
from gpuinfra.plan.backstop import BACKSTOP_DELAY_SECONDS
from gpuinfra.plan.naming import gcp_group_name
from gpuinfra.rules.gcp import FLEX_START_RUN_LIMITS_SECONDS
from gpuinfra.spec import ClusterSpec

#: Shortest and longest ``requestedRunDuration`` (10 minutes, 7 days; the longest run of a
#: flex-start VM too): :data:`gpuinfra.rules.gcp.FLEX_START_RUN_LIMITS_SECONDS` cites them.
FLEX_START_MIN_RUN_SECONDS, FLEX_START_MAX_RUN_SECONDS = FLEX_START_RUN_LIMITS_SECONDS
#: Longest TTL a flex-start stack takes, in hours (the 7-day limit in whole hours).
FLEX_START_MAX_TTL_HOURS = FLEX_START_MAX_RUN_SECONDS // 3600

#: ``GcpClusterPlan.formation`` of a flex-start cluster: a MIG at size 0 plus one resize request.
RESIZE_REQUEST = "resize_request"


def check_flex_start_ttl(spec: ClusterSpec) -> None:
    """Refuse a flex-start stack whose TTL is over the 7-day limit of flex-start VMs.

    Raises:
        SpecError: naming the bound (exit 2).
    """
    if spec.profile.ttl_hours > FLEX_START_MAX_TTL_HOURS:
        raise SpecError(
            f"profile ttl_hours {spec.profile.ttl_hours} is too long for flex-start: flex-start VMs run at most "
            f"7 days ({FLEX_START_MAX_TTL_HOURS} h; cloud.google.com/compute/docs/instances/about-flex-start-vms); "
            f"use ttl_hours <= {FLEX_START_MAX_TTL_HOURS}, or --spot / a reservation for longer runs"
        )


def flex_start_run_duration_seconds(spec: ClusterSpec) -> int:
    """The resize request's ``requestedRunDuration`` in seconds: the TTL plus the backstop delay,
    at most :data:`FLEX_START_MAX_RUN_SECONDS` and at least :data:`FLEX_START_MIN_RUN_SECONDS`.

    It counts from the VMs' creation, which is after the stack's creation (where the agent's TTL
    counts from), so Compute Engine's deletion never comes before the agent's end of the nodes.

    Raises:
        SpecError: the TTL is over the 7-day limit (:func:`check_flex_start_ttl`).
    """
    check_flex_start_ttl(spec)
    wanted = spec.profile.ttl_hours * 3600 + BACKSTOP_DELAY_SECONDS
    return max(FLEX_START_MIN_RUN_SECONDS, min(wanted, FLEX_START_MAX_RUN_SECONDS))


def resize_request_name(spec: ClusterSpec) -> str:
    """Name of the cluster's resize request, fixed so that ``up`` can poll and cancel it: the MIG's
    name (:func:`gpuinfra.plan.naming.gcp_group_name`, already 1-63 RFC 1035 characters, as a
    request name must be: Compute API ``InstanceGroupManagerResizeRequest.name``); request names
    are scoped to their MIG."""
    return gcp_group_name(spec)
