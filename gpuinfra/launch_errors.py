"""Why an instant EC2 Fleet launched fewer nodes than the cluster needs: its errors, classified.

An instant fleet's launch errors come back in the fleet's ``Errors`` list, never as an API error:
the ``CreateFleet`` response and ``DescribeFleets`` (``FleetData.Errors``, "Valid only when Type
is set to instant", docs.aws.amazon.com/AWSEC2/latest/APIReference/API_FleetData.html; each a
``DescribeFleetError`` with ``ErrorCode`` / ``ErrorMessage`` / ``Lifecycle``). pulumi_aws's
``Fleet`` exposes no errors (terraform-provider-aws ``ec2_fleet.go`` ``resourceFleetCreate`` does
not read ``output.Errors``), so the cluster program reads them with ``DescribeFleets`` on the
fleet id it got (:func:`describe_fleet_errors`) and raises one error class per cause
(:func:`launch_error`):

=================  ====  ======================================================================
class              exit  EC2 error codes (docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html)
=================  ====  ======================================================================
capacity           7     ``InsufficientInstanceCapacity``, ``InsufficientHostCapacity``,
                         ``InsufficientCapacity``, ``InsufficientCapacityOnHost``,
                         ``UnfulfillableCapacity``: another zone, region or market may have it;
                         ``ReservationCapacityExceeded``: the targeted capacity reservation is full
quota              9     ``VcpuLimitExceeded``, ``InstanceLimitExceeded``,
                         ``MaxSpotInstanceCountExceeded``: ask for more quota
profile not ready  11    ``InvalidParameterValue`` "Invalid IAM Instance Profile ...": a new
                         instance profile not yet usable; ``up`` retries (:data:`PROFILE_RETRY_SECONDS`)
IAM                11    ``UnauthorizedOperation``, ``AuthFailure``
invalid parameter  10    ``InvalidParameterValue``, ``InvalidParameterCombination``,
                         ``InvalidParameter``, ``Unsupported``, ``UnsupportedOperation``,
                         ``InvalidBlockDeviceMapping`` and every code not listed here
=================  ====  ======================================================================

When several causes come back, the one no other rung can cure wins: IAM before invalid parameter
before quota before capacity (a fleet that also hit a quota would hit it in any zone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuinfra.errors import (
    CapacityError,
    GpuinfraError,
    InstanceProfileNotReady,
    LaunchDeniedError,
    LaunchRejectedError,
    QuotaError,
)

#: The capacity code of a full targeted capacity reservation (errors-overview.html, below).
RESERVATION_FULL_CODE = "ReservationCapacityExceeded"
#: EC2 error codes that mean "no capacity now" (errors-overview.html: "There is not enough
#: capacity to fulfill your request"; UnfulfillableCapacity: "there isn't enough spare capacity
#: to fulfill your request for Spot Instances"; ReservationCapacityExceeded: "The targeted Capacity
#: Reservation does not enough available instance capacity to fulfill your request. Either increase
#: the instance capacity for the targeted Capacity Reservation, or target a different Capacity
#: Reservation" -- a shortfall of capacity, not a bad parameter).
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "InsufficientCapacityOnHost",
        "UnfulfillableCapacity",
        RESERVATION_FULL_CODE,
    }
)
#: Quota codes (errors-overview.html: VcpuLimitExceeded "You've reached the limit on the number
#: of vCPUs ... assigned to the running instances"; InstanceLimitExceeded "Capacity Reservations
#: count towards your On-Demand Instance limits"; MaxSpotInstanceCountExceeded).
QUOTA_CODES = frozenset({"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"})
#: Permission codes (errors-overview.html, common client errors).
IAM_CODES = frozenset({"UnauthorizedOperation", "AuthFailure"})
#: The message of an instance profile EC2 does not know yet (terraform-provider-aws
#: ``internal/service/ec2/ec2_instance.go`` ``resourceInstanceCreate`` retries RunInstances on
#: ``InvalidParameterValue`` containing it: "IAM instance profiles can take ~10 seconds to
#: propagate in AWS").
PROFILE_NOT_READY_TEXT = "Invalid IAM Instance Profile"
#: How long ``up`` keeps relaunching the fleet while a new instance profile propagates: the
#: bound terraform-provider-aws uses for the same retry (``iamPropagationTimeout = 2 *
#: time.Minute``, internal/service/ec2/wait.go: "We have settled on 2 minutes as the best timeout
#: value").
PROFILE_RETRY_SECONDS = 120
#: Wait between two such relaunches (AWS: about 10 s to propagate, per the comment above).
PROFILE_RETRY_WAIT_SECONDS = 10


@dataclass(frozen=True)
class FleetError:
    """One ``DescribeFleetError`` (or ``CreateFleetError``) of an instant fleet.

    Attributes:
        code: ``ErrorCode``; message: ``ErrorMessage``; lifecycle: ``spot`` | ``on-demand`` | "".
    """

    code: str
    message: str = ""
    lifecycle: str = ""

    @property
    def kind(self) -> str:
        """``capacity`` | ``quota`` | ``profile`` | ``iam`` | ``invalid`` (module docstring)."""
        if self.code in CAPACITY_CODES:
            return "capacity"
        if self.code in QUOTA_CODES:
            return "quota"
        if PROFILE_NOT_READY_TEXT.lower() in self.message.lower():
            return "profile"
        if self.code in IAM_CODES:
            return "iam"
        return "invalid"

    def line(self) -> str:
        """``Code: message`` as EC2 gave them."""
        return f"{self.code}: {self.message}" if self.message else self.code


#: Which class each kind raises, most specific (no other rung cures it) first.
_PRECEDENCE: tuple[tuple[str, type[GpuinfraError]], ...] = (
    ("iam", LaunchDeniedError),
    ("profile", InstanceProfileNotReady),
    ("invalid", LaunchRejectedError),
    ("quota", QuotaError),
    ("capacity", CapacityError),
)

_ADVICE = {
    "capacity": "EC2 had no capacity for all of them at once. Try later, another zone (`gpuinfra offers "
    "--instance-type {itype}`), spot, or a capacity reservation / Capacity Block",
    "quota": "a quota is too small: see `aws service-quotas list-service-quotas --service-code ec2 --region "
    "{region}` and ask for more in the Service Quotas console (docs/capacity.md)",
    "profile": "the stack's new instance profile was not usable yet (IAM propagates in seconds to a minute); "
    "run `gpuinfra up {stack}` again",
    "iam": "the credentials `gpuinfra up` runs with may not launch these instances: check their IAM policy "
    "(ec2:CreateFleet, ec2:RunInstances, iam:PassRole on the node role)",
    "invalid": "EC2 refused the launch's settings; nothing else is tried (another zone would refuse them too)",
}


def _most_specific(errors: list) -> tuple[str, type[GpuinfraError], list[str]]:
    """(kind, error class, the distinct lines of that kind's errors) of the most specific cause
    among ``errors`` (objects with ``kind`` and ``line()``; :data:`_PRECEDENCE` orders the kinds;
    none: capacity)."""
    kinds = {e.kind for e in errors} or {"capacity"}
    kind, cls = next((k, c) for k, c in _PRECEDENCE if k in kinds)
    seen: list[str] = []
    for error in errors:
        if error.kind == kind and error.line() not in seen:
            seen.append(error.line())
    return kind, cls, seen


def launch_error(
    errors: Iterable[FleetError], launched: int, nodes: int, instance_type: str, zone: str, region: str, stack: str
) -> GpuinfraError:
    """The error to raise for an instant fleet that launched ``launched`` of ``nodes`` instances.

    Args:
        errors: the fleet's errors (may be empty: then capacity, as EC2 with
            ``min_target_capacity`` = nodes launches none when it cannot launch all).
        launched, nodes: instances launched / needed.
        instance_type, zone, region, stack: for the message.

    Returns:
        An instance of the class of the most specific cause (module docstring); its message
        starts with the class's ``marker`` (the line ``gpuinfra up`` finds in Pulumi's output) and
        quotes EC2's codes and messages (at most three, de-duplicated).
    """
    errors = list(errors)  # read twice below
    kind, cls, seen = _most_specific(errors)
    said = f"; EC2 said: {' | '.join(seen[:3])}" if seen else "; EC2 reported no error"
    advice = _ADVICE[kind].format(itype=instance_type, region=region, stack=stack)
    if kind == "capacity" and any(e.code == RESERVATION_FULL_CODE for e in errors):
        advice = (
            f"{advice}. The targeted capacity reservation is full: increase the capacity reservation's "
            "instance count or target another"
        )
    return cls(
        f"{cls.marker} the EC2 Fleet launched {launched} of {nodes} {instance_type} instances in {zone}{said}. {advice}"
    )


def describe_fleet_errors(ec2, fleet_id: str) -> list[FleetError]:
    """The errors EC2 records for the instant fleet ``fleet_id`` (``DescribeFleets``,
    ``FleetData.Errors``: docs.aws.amazon.com/AWSEC2/latest/APIReference/API_FleetData.html).

    Args:
        ec2: a boto3 EC2 client in the fleet's region.
        fleet_id: ``fleet-...``.

    Raises:
        botocore ``ClientError`` / ``BotoCoreError``: the call failed (the caller decides).
    """
    fleets = ec2.describe_fleets(FleetIds=[fleet_id]).get("Fleets", [])
    return [
        FleetError(e.get("ErrorCode", ""), e.get("ErrorMessage", ""), e.get("Lifecycle", ""))
        for fleet in fleets
        for e in fleet.get("Errors", [])
    ]


def fleet_launch_error(
    read_errors: Callable[[], list[FleetError]],
    launched: int,
    nodes: int,
    instance_type: str,
    zone: str,
    region: str,
    stack: str,
    fleet_id: str,
) -> GpuinfraError:
    """:func:`launch_error` with the errors ``read_errors`` returns; when they cannot be read, a
    :class:`LaunchRejectedError` that says so (never capacity: an unknown cause must not send
    ``up --fallback`` to the next rung).
    """
    try:
        errors = read_errors()
    except Exception as exc:  # noqa: BLE001 - any failure to read them is reported, with the command to read them
        return LaunchRejectedError(
            f"{LaunchRejectedError.marker} the EC2 Fleet {fleet_id} launched {launched} of {nodes} {instance_type} "
            f"instances in {zone} and its errors could not be read ({exc}); read them with `aws ec2 describe-fleets "
            f"--region {region} --fleet-ids {fleet_id} --query Fleets[0].Errors`"
        )
    return launch_error(errors, launched, nodes, instance_type, zone, region, stack)


# -- GCP: the errors of one instances.bulkInsert ----------------------------------------------------
#
# A zonal ``instances.bulkInsert`` (cloud.google.com/compute/docs/reference/rest/v1/instances/
# bulkInsert) reports its failure in the zone operation's ``error.errors[]`` (each ``code`` /
# ``message``), or, refused before any operation exists, as the HTTP error of the call itself.

#: Type token of the resource that makes such a bulk insert (blueprints/gcp/bulk_insert.py, a
#: Pulumi dynamic resource: ``pulumi-python:dynamic/<module>:<name>``); defined here, the one
#: module the blueprint, the rules and the cost estimate all import without a cycle.
GCP_BULK_INSERT_TYPE = "pulumi-python:dynamic/gcp:BulkInsert"
#: Type token of a MIG resize request (the nodes of a flex-start cluster, blueprints/gcp/
#: resize_request.py), here for the same reason.
GCP_RESIZE_REQUEST_TYPE = "gcp:compute/resizeRequest:ResizeRequest"

#: Compute Engine's codes of a zone without the capacity asked for: "Compute Engine returns an
#: error message similar to one of the following ... ZONE_RESOURCE_POOL_EXHAUSTED,
#: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" (cloud.google.com/compute/docs/troubleshooting/
#: troubleshooting-resource-availability: "a quota increase doesn't resolve them").
GCP_CAPACITY_CODES = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"})
#: "If you exceed a quota for Compute Engine, Google Cloud typically returns an HTTP 403
#: QUOTA_EXCEEDED status code ... If the quota is a rate quota, then 403 RATE_LIMIT_EXCEEDED is
#: returned" (cloud.google.com/docs/quotas/troubleshoot).
GCP_QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "RATE_LIMIT_EXCEEDED"})
#: The code :func:`gcp_launch_error` gives a bulk insert still running when ``up``'s capacity
#: timeout passed (gpuinfra's own, not Compute Engine's): classified as capacity, as the zone did
#: not give every VM within the bound the user set.
GCP_TIMEOUT_CODE = "CAPACITY_TIMEOUT"
#: The words with which a bulk insert's error names the VMs its cleanup could not delete in its
#: bound (blueprints/gcp/bulk_insert.py): ``up`` then never says that nothing bills.
GCP_LEFT_RUNNING_TEXT = "deleting the VMs it made did not finish within"
#: HTTP status of a call the caller's permissions refuse (google.api_core.exceptions.Forbidden;
#: Compute's permission errors: "Required 'compute.instances.create' permission", a 403 whose
#: code is none of :data:`GCP_QUOTA_CODES`).
GCP_FORBIDDEN_STATUS = 403


@dataclass(frozen=True)
class GcpError:
    """One error of a bulk insert: an entry of the zone operation's ``error.errors`` (``code``,
    ``message``), or the HTTP error of the call (``status``: its HTTP status, else 0).

    Attributes:
        code: Compute Engine's error code (``ZONE_RESOURCE_POOL_EXHAUSTED``, ``QUOTA_EXCEEDED``, ...).
        message: its message.
        status: HTTP status of a refused call (403, 400, ...); 0 for an operation's error.
    """

    code: str
    message: str = ""
    status: int = 0

    @property
    def kind(self) -> str:
        """``capacity`` | ``quota`` | ``iam`` | ``invalid`` (:data:`GCP_CAPACITY_CODES`, ...)."""
        if self.code in GCP_CAPACITY_CODES or self.code == GCP_TIMEOUT_CODE:
            return "capacity"
        # a refused call's reason is the JSON API's camelCase of the same code ("Error 403: Quota
        # 'SSD_TOTAL_GB' exceeded. Limit: 100.0, quotaExceeded":
        # github.com/openshift-evangelists/openshifter/issues/15; "..., rateLimitExceeded":
        # github.com/hashicorp/terraform-provider-google/issues/8360)
        camel = self.code[:1].islower()
        upper = "".join(f"_{c}" if c.isupper() else c.upper() for c in self.code) if camel else self.code
        if upper in GCP_QUOTA_CODES or any(c in self.message for c in GCP_QUOTA_CODES):
            return "quota"
        if self.status == GCP_FORBIDDEN_STATUS:
            return "iam"
        return "invalid"

    def line(self) -> str:
        """``CODE: message`` as Compute Engine gave them."""
        return f"{self.code}: {self.message}" if self.message else self.code


_GCP_ADVICE = {
    "capacity": "the zone had no capacity for all of them at once; nothing was left running. Try later, another "
    "zone (`gpuinfra offers --instance-type {itype}`), spot, a reservation, or `gpuinfra up --fallback`",
    "quota": "a quota is too small: see `gcloud compute regions describe {region}` and ask for more "
    "(cloud.google.com/docs/quotas/view-manage; docs/capacity.md)",
    "iam": "the credentials `gpuinfra up` runs with may not create these VMs: they need compute.instances.create "
    "and iam.serviceAccounts.actAs on the nodes' service account",
    "invalid": "Compute Engine refused the request's settings; nothing else is tried (another zone would refuse "
    "them too)",
}


def gcp_launch_error(
    errors: Iterable[GcpError], created: int, nodes: int, instance_type: str, zone: str, region: str
) -> GpuinfraError:
    """The error to raise for a bulk insert of ``nodes`` VMs that did not create them all.

    Args:
        errors: the operation's errors or the call's (empty: capacity, as a ``minCount`` = count
            insert that ends without every VM created ran out of capacity).
        created: VMs that existed when it failed (all of them deleted again by the caller).
        nodes, instance_type, zone, region: for the message.

    Returns:
        An instance of the class of the most specific cause (IAM before invalid before quota
        before capacity, as :func:`launch_error`); its message starts with the class's ``marker``
        and quotes Compute Engine's codes (at most three, de-duplicated).
    """
    errors = list(errors)  # read twice below
    kind, cls, seen = _most_specific(errors)
    said = f"; Compute Engine said: {' | '.join(seen[:3])}" if seen else "; Compute Engine reported no error"
    advice = _GCP_ADVICE[kind].format(itype=instance_type, region=region)
    return cls(
        f"{cls.marker} the bulk insert created {created} of {nodes} {instance_type} VMs in {zone}{said}. {advice}"
    )
