"""EC2 capacity reservations (On-Demand Capacity Reservations and Capacity Blocks for ML).

``gpuinfra new --capacity-reservation cr-...`` reads the reservation with EC2
``DescribeCapacityReservations`` (docs.aws.amazon.com/AWSEC2/latest/APIReference/
API_DescribeCapacityReservations.html) and plans the cluster from what it says, so the nodes are
of the reserved type, in the reserved AZ and no more than it holds (ParallelCluster
``CapacityReservationValidator``; docs.aws.amazon.com/AWSEC2/latest/UserGuide/
capacity-blocks-launch.html: "the subnet must be in the Availability Zone of the Capacity Block").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from gpuinfra.credentials import aws_client_factory
from gpuinfra.errors import MissingDependencyError, RequestError

#: States in which instances can be launched into a reservation; a Capacity Block is
#: ``scheduled`` until its start time (API_CapacityReservation ``State``).
LAUNCHABLE_STATES = ("active", "scheduled")


@dataclass(frozen=True)
class CapacityReservation:
    """What EC2 says of one capacity reservation.

    Attributes:
        reservation_id: ``cr-...``.
        instance_type: the reserved instance type.
        zone_id: AZ ID of the reservation (``use1-az4``).
        region: the region it was read in.
        total_instance_count / available_instance_count: instances reserved / still free.
        placement_group: name of the cluster placement group the reservation is in, or None.
        capacity_block: ``ReservationType`` is ``capacity-block``.
        state: ``active`` | ``scheduled`` | ...
        end_date: ``EndDate`` (UTC; API_CapacityReservation: "The date and time at which the
            Capacity Reservation expires"), None for a reservation without one (``EndDateType``
            ``unlimited``). A Capacity Block always has one; EC2 begins to end its instances 30
            minutes before it (:data:`gpuinfra.spec.CAPACITY_BLOCK_TERMINATION_LEAD`).
    """

    reservation_id: str
    instance_type: str
    zone_id: str
    region: str
    total_instance_count: int
    available_instance_count: int
    placement_group: str | None
    capacity_block: bool
    state: str
    end_date: datetime | None = None
    start_date: datetime | None = None
    availability_zone: str | None = None
    upfront_price: CapacityBlockPrice | None = None


@dataclass(frozen=True)
class CapacityBlockPrice:
    """The upfront fee of a Capacity Block, with where it was read and when.

    A Capacity Block is paid once, up front, for the whole block (docs.aws.amazon.com/AWSEC2/
    latest/UserGuide/capacity-blocks-pricing-billing.html); ``DescribeCapacityReservations``
    carries no price, the offering does (API_CapacityBlockOffering ``UpfrontFee``: "The total
    price to be paid up front", docs.aws.amazon.com/AWSEC2/latest/APIReference/
    API_DescribeCapacityBlockOfferings.html), and the paid amount is on the purchase's bill.

    Attributes:
        upfront_usd: the fee in USD for the whole block.
        source: where it comes from (the offering id read, or the bill).
        date: the day it was read (``YYYY-MM-DD``, UTC).
    """

    upfront_usd: Decimal
    source: str
    date: str


def describe_capacity_reservation(
    reservation_id: str, region: str, client_factory: Callable[[str, str], Any] | None = None
) -> CapacityReservation:
    """Read ``reservation_id`` in ``region``.

    Args:
        reservation_id: ``cr-`` followed by 8 or 17 hex digits.
        region: the AWS region (DescribeCapacityReservations is regional).
        client_factory: ``(service, region) -> boto3 client`` (default: the credential chain).

    Raises:
        RequestError: a malformed id, a reservation EC2 does not know in ``region``, one that
            cannot take launches (expired, cancelled, ...), or one for another platform or
            tenancy than gpuinfra's Linux/UNIX default-tenancy nodes (a reservation matches only
            instances of its type, platform, AZ and tenancy:
            docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-using.html).
        MissingDependencyError: no AWS credentials, or EC2 refused them.
    """
    import re

    from botocore.exceptions import ClientError, NoCredentialsError

    if not re.fullmatch(r"cr-(?:[0-9a-f]{8}|[0-9a-f]{17})", reservation_id or ""):
        raise RequestError(
            f"--capacity-reservation: {reservation_id!r} is not a reservation id (cr- and 8 or 17 hex digits)"
        )
    if client_factory is None:
        client_factory = aws_client_factory()
    ec2 = client_factory("ec2", region)
    try:
        answer = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation_id])
    except NoCredentialsError:
        raise MissingDependencyError(
            "no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (see `aws configure`)"
        ) from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed"):
            raise RequestError(f"capacity reservation {reservation_id} does not exist in {region} ({code})") from None
        if code in CREDENTIAL_ERROR_CODES:
            raise MissingDependencyError(f"EC2 refused the credentials ({code}): {exc}") from None
        raise
    found = answer.get("CapacityReservations") or []
    if not found:
        raise RequestError(f"capacity reservation {reservation_id} does not exist in {region}")
    item = found[0]
    state = item.get("State", "")
    if state not in LAUNCHABLE_STATES:
        raise RequestError(
            f"capacity reservation {reservation_id} is {state}; only {' or '.join(LAUNCHABLE_STATES)} "
            "reservations take instances"
        )
    platform, tenancy = item.get("InstancePlatform", "Linux/UNIX"), item.get("Tenancy", "default")
    if not platform.startswith("Linux/UNIX") or tenancy != "default":
        raise RequestError(
            f"capacity reservation {reservation_id} is for {platform} with {tenancy} tenancy; gpuinfra "
            "launches Linux/UNIX instances with default tenancy, which only such a reservation takes"
        )
    group_arn = item.get("PlacementGroupArn") or ""
    total = int(item.get("TotalInstanceCount", 0))
    # a Capacity Block is "scheduled" until it starts, with nothing available yet: all of it will be
    available = total if state == "scheduled" else int(item.get("AvailableInstanceCount", 0))
    return CapacityReservation(
        reservation_id=reservation_id,
        instance_type=item["InstanceType"],
        zone_id=item["AvailabilityZoneId"],
        region=region,
        total_instance_count=total,
        available_instance_count=available,
        placement_group=group_arn.rsplit("/", 1)[-1] if group_arn else None,
        capacity_block=item.get("ReservationType") == "capacity-block",
        state=state,
        end_date=_utc(item.get("EndDate")),
        start_date=_utc(item.get("StartDate")),
        availability_zone=item.get("AvailabilityZone"),
    )


def quote_capacity_block(
    block: CapacityReservation, client_factory: Callable[[str, str], Any] | None = None, now: datetime | None = None
) -> CapacityBlockPrice | None:
    """The upfront fee EC2 quotes for a Capacity Block like ``block``: same instance type, count,
    AZ, start and end (``DescribeCapacityBlockOfferings``, docs.aws.amazon.com/AWSEC2/latest/
    APIReference/API_DescribeCapacityBlockOfferings.html: InstanceType, InstanceCount and
    CapacityDurationHours required; StartDateRange / EndDateRange bound the offerings).

    Capacity Block prices change with supply and demand (docs.aws.amazon.com/AWSEC2/latest/
    UserGuide/capacity-blocks-pricing-billing.html), so an offering read after the purchase is a
    quote for the same block, not the amount paid; the source says which offering and when. The
    paid amount is on the bill: write it in the stack file
    (``capacity_block_upfront_usd``) to price the stack at it.

    Args:
        block: a Capacity Block read by :func:`describe_capacity_reservation` (start and end
            dates set).
        client_factory: ``(service, region) -> boto3 client`` (default: the credential chain).
        now: the read time (default: now, UTC); its day is the price's date.

    Returns:
        The price, or None when the block has no dates, EC2 offers no block that matches it
        exactly, the offering is not in USD, its fee is not a number, there are no credentials,
        or EC2 refuses the call (then the stack's total stays incomplete).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    if not block.capacity_block or block.start_date is None or block.end_date is None:
        return None
    hours = int((block.end_date - block.start_date).total_seconds() // 3600)
    try:
        if client_factory is None:
            client_factory = aws_client_factory()
        answer = client_factory("ec2", block.region).describe_capacity_block_offerings(
            InstanceType=block.instance_type,
            InstanceCount=block.total_instance_count,
            CapacityDurationHours=hours,
            StartDateRange=block.start_date,
            EndDateRange=block.end_date,
        )
    except (ClientError, BotoCoreError, MissingDependencyError):
        return None
    for offer in answer.get("CapacityBlockOfferings") or []:
        same = (
            offer.get("InstanceType") == block.instance_type
            and int(offer.get("InstanceCount", 0)) == block.total_instance_count
            and _utc(offer.get("StartDate")) == block.start_date
            and _utc(offer.get("EndDate")) == block.end_date
            and offer.get("AvailabilityZone") in (None, block.availability_zone)
            and offer.get("CurrencyCode") == "USD"
        )
        if not same:
            continue
        try:
            fee = Decimal(offer.get("UpfrontFee", ""))
        except InvalidOperation:
            return None
        if not fee.is_finite() or fee <= 0:
            return None
        fee = fee.quantize(Decimal("0.000001"))
        day = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%d")
        source = (
            f"EC2 DescribeCapacityBlockOfferings {offer.get('CapacityBlockOfferingId', '')}: quote for the same "
            f"type, count, AZ, start and end as {block.reservation_id}"
        )
        return CapacityBlockPrice(fee, source, day)
    return None


#: EC2 error codes that mean the credentials, not the request, were refused
#: (docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
CREDENTIAL_ERROR_CODES = ("AuthFailure", "UnauthorizedOperation", "ExpiredToken", "RequestExpired")


def _ec2_answer(api: str, region: str, call: Callable[[Any], dict], client_factory: Callable) -> dict:
    """``call(ec2 client of region)``'s answer, with EC2's failures as gpuinfra errors.

    Raises:
        MissingDependencyError: no AWS credentials, or EC2 refused them (:data:`CREDENTIAL_ERROR_CODES`).
        RequestError: another EC2 error or a transport failure, naming ``api``, the region and the code.
    """
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        return call(client_factory("ec2", region))
    except NoCredentialsError:
        raise MissingDependencyError("no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID") from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in CREDENTIAL_ERROR_CODES:
            raise MissingDependencyError(f"EC2 refused the credentials ({code})") from None
        raise RequestError(f"{api} in {region}: {code}") from None
    except BotoCoreError as exc:
        raise RequestError(f"{api} in {region}: {exc}") from None


def _utc(value: Any) -> datetime | None:
    """boto3 parses EC2's ``dateTime`` values into aware datetimes; the UTC value, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


#: Durations EC2 sells a Capacity Block in: "1-day increments up to 14 days, and in 7-day increments
#: up to 182 days" (docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-purchase.html;
#: API_DescribeCapacityBlockOfferings ``CapacityDurationHours``), in hours.
CAPACITY_BLOCK_DURATIONS_HOURS: tuple[int, ...] = tuple(24 * d for d in range(1, 15)) + tuple(
    24 * d for d in range(21, 183, 7)
)


@dataclass(frozen=True)
class CapacityBlockOffering:
    """One offering of ``DescribeCapacityBlockOfferings`` (API_CapacityBlockOffering,
    docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CapacityBlockOffering.html).

    Attributes:
        offering_id: ``capacityBlockOfferingId`` (what a purchase names).
        instance_type, availability_zone, instance_count: what the block holds and where.
        start / end: the block's window (UTC); EC2 begins to end its instances 30 minutes before
            ``end`` (:data:`gpuinfra.spec.CAPACITY_BLOCK_TERMINATION_LEAD`).
        duration_hours: ``capacityBlockDurationHours``.
        upfront_usd: ``upfrontFee`` ("The total price to be paid up front") in USD; None when
            the fee is missing, not a positive number or not in USD (never $0).
        region: the region it was read in.
    """

    offering_id: str
    instance_type: str
    availability_zone: str
    instance_count: int
    start: datetime
    end: datetime
    duration_hours: int
    upfront_usd: Decimal | None
    region: str


def capacity_block_duration_hours(run_hours: Decimal) -> int:
    """The shortest Capacity Block duration (:data:`CAPACITY_BLOCK_DURATIONS_HOURS`) that holds a run
    of ``run_hours`` before EC2 starts ending the instances 30 minutes before the block's end.

    Raises:
        RequestError: the run is longer than the longest block (182 days).
    """
    need = run_hours + Decimal(1) / 2
    for hours in CAPACITY_BLOCK_DURATIONS_HOURS:
        if hours >= need:
            return hours
    raise RequestError(f"a run of {run_hours} h is longer than the longest Capacity Block (182 days)")


def capacity_block_offerings(
    instance_type: str,
    instance_count: int,
    duration_hours: int,
    start_from: datetime,
    end_by: datetime,
    region: str,
    client_factory: Callable[[str, str], Any] | None = None,
) -> list[CapacityBlockOffering]:
    """The Capacity Blocks EC2 offers for ``instance_count`` x ``instance_type`` for
    ``duration_hours`` that start on or after ``start_from`` and end by ``end_by``
    (``DescribeCapacityBlockOfferings``: InstanceType, InstanceCount, CapacityDurationHours,
    StartDateRange, EndDateRange; docs.aws.amazon.com/AWSEC2/latest/APIReference/
    API_DescribeCapacityBlockOfferings.html; "we provide the details of up to 6 available blocks",
    docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-purchase.html).

    Args:
        duration_hours: one of :data:`CAPACITY_BLOCK_DURATIONS_HOURS`.
        client_factory: ``(service, region) -> boto3 client`` (default: the credential chain).

    Returns:
        The offerings of that type and count, earliest start first.

    Raises:
        MissingDependencyError: no AWS credentials, or EC2 refused them.
        RequestError: EC2 refused the request (its code and message).
    """
    if client_factory is None:
        client_factory = aws_client_factory()
    answer = _ec2_answer(
        "DescribeCapacityBlockOfferings",
        region,
        lambda ec2: ec2.describe_capacity_block_offerings(
            InstanceType=instance_type,
            InstanceCount=instance_count,
            CapacityDurationHours=duration_hours,
            StartDateRange=start_from,
            EndDateRange=end_by,
        ),
        client_factory,
    )
    found = []
    for offer in answer.get("CapacityBlockOfferings") or []:
        start, end = _utc(offer.get("StartDate")), _utc(offer.get("EndDate"))
        if start is None or end is None or offer.get("InstanceType") != instance_type:
            continue
        if int(offer.get("InstanceCount", 0)) != instance_count:
            continue
        found.append(
            CapacityBlockOffering(
                offering_id=offer.get("CapacityBlockOfferingId", ""),
                instance_type=instance_type,
                availability_zone=offer.get("AvailabilityZone", ""),
                instance_count=instance_count,
                start=start,
                end=end,
                duration_hours=int(offer.get("CapacityBlockDurationHours") or 0),
                upfront_usd=_fee_usd(offer),
                region=region,
            )
        )
    return sorted(found, key=lambda o: (o.start, o.upfront_usd is None, o.upfront_usd or 0, o.offering_id))


def _fee_usd(offer: dict) -> Decimal | None:
    """``UpfrontFee`` in USD, or None unless it is a positive number in USD."""
    if offer.get("CurrencyCode") != "USD":
        return None
    try:
        fee = Decimal(offer.get("UpfrontFee", ""))
    except InvalidOperation:
        return None
    return fee.quantize(Decimal("0.000001")) if fee.is_finite() and fee > 0 else None


def held_capacity_reservations(
    region: str, instance_types: list[str], client_factory: Callable[[str, str], Any] | None = None
) -> list[CapacityReservation]:
    """The account's capacity reservations (ODCRs and Capacity Blocks) of ``instance_types`` in
    ``region`` that take or will take launches (``DescribeCapacityReservations`` with the filters
    ``instance-type`` and ``state`` = active | scheduled, docs.aws.amazon.com/AWSEC2/latest/
    APIReference/API_DescribeCapacityReservations.html); Linux/UNIX default-tenancy ones only
    (what gpuinfra launches).

    Raises:
        MissingDependencyError: no AWS credentials, or EC2 refused them.
        RequestError: another EC2 error.
    """
    if client_factory is None:
        client_factory = aws_client_factory()
    answer = _ec2_answer(
        "DescribeCapacityReservations",
        region,
        lambda ec2: ec2.describe_capacity_reservations(
            Filters=[
                {"Name": "instance-type", "Values": list(instance_types)},
                {"Name": "state", "Values": list(LAUNCHABLE_STATES)},
            ]
        ),
        client_factory,
    )
    held = []
    for item in answer.get("CapacityReservations") or []:
        state = item.get("State", "")
        platform, tenancy = item.get("InstancePlatform", "Linux/UNIX"), item.get("Tenancy", "default")
        if state not in LAUNCHABLE_STATES or not platform.startswith("Linux/UNIX") or tenancy != "default":
            continue
        if item.get("InstanceType") not in instance_types:
            continue
        total = int(item.get("TotalInstanceCount", 0))
        group_arn = item.get("PlacementGroupArn") or ""
        held.append(
            CapacityReservation(
                reservation_id=item.get("CapacityReservationId", ""),
                instance_type=item["InstanceType"],
                zone_id=item.get("AvailabilityZoneId", ""),
                region=region,
                total_instance_count=total,
                available_instance_count=total if state == "scheduled" else int(item.get("AvailableInstanceCount", 0)),
                placement_group=group_arn.rsplit("/", 1)[-1] if group_arn else None,
                capacity_block=item.get("ReservationType") == "capacity-block",
                state=state,
                end_date=_utc(item.get("EndDate")),
                start_date=_utc(item.get("StartDate")),
                availability_zone=item.get("AvailabilityZone"),
            )
        )
    return held


@dataclass(frozen=True)
class GcpReservation:
    """One Compute Engine reservation the project holds (``reservations.aggregatedList``,
    cloud.google.com/compute/docs/reference/rest/v1/reservations/aggregatedList; the Reservation
    resource, cloud.google.com/compute/docs/reference/rest/v1/reservations).

    Attributes:
        name: the reservation's name; zone: its zone (``us-central1-a``).
        machine_type: ``specificReservation.instanceProperties.machineType``.
        count / in_use: ``specificReservation.count`` / ``inUseCount``.
        end: ``deleteAtTime`` (when Compute Engine deletes it; calendar-mode reservations end so),
            None when it has none.
        calendar: ``reservationMode`` is ``CALENDAR`` ("The price for this reservation is
            different from on-demand", v1beta Reservation.ReservationMode).
    """

    name: str
    zone: str
    machine_type: str
    count: int
    in_use: int
    end: datetime | None
    calendar: bool


def held_gcp_reservations(
    project: str, session: Any, compute_api: str = "https://compute.googleapis.com"
) -> list[GcpReservation]:
    """The project's READY reservations in every zone: one ``GET {compute_api}/compute/v1/projects/
    {project}/aggregated/reservations`` through ``session`` (google-auth's ``AuthorizedSession``);
    the answer's ``items`` maps ``zones/<zone>`` to ``{"reservations": [...]}`` or a ``warning``.

    Raises:
        MissingDependencyError: the API refused the credentials (401/403).
        RequestError: another HTTP error or an answer that is not the documented JSON.
    """
    response = session.get(f"{compute_api}/compute/v1/projects/{project}/aggregated/reservations", timeout=10)
    if response.status_code in (401, 403):
        raise MissingDependencyError(f"Compute Engine refused the credentials (HTTP {response.status_code})")
    if response.status_code != 200:
        raise RequestError(f"reservations.aggregatedList in {project}: HTTP {response.status_code}")
    try:
        scopes = response.json().get("items", {})
    except ValueError:
        raise RequestError(f"reservations.aggregatedList in {project}: not JSON") from None
    held = []
    for scope in scopes.values():
        for item in scope.get("reservations", []):
            specific = item.get("specificReservation") or {}
            machine = (specific.get("instanceProperties") or {}).get("machineType", "")
            if item.get("status") != "READY" or not machine:
                continue
            held.append(
                GcpReservation(
                    name=item.get("name", ""),
                    zone=str(item.get("zone", "")).rsplit("/", 1)[-1],
                    machine_type=machine,
                    count=int(specific.get("count", 0)),
                    in_use=int(specific.get("inUseCount", 0)),
                    end=_utc(item.get("deleteAtTime")),
                    calendar=item.get("reservationMode") == "CALENDAR",
                )
            )
    return held
