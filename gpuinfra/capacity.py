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
        if code in ("AuthFailure", "UnauthorizedOperation", "ExpiredToken", "RequestExpired"):
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


def _utc(value: Any) -> datetime | None:
    """boto3 parses EC2's ``dateTime`` values into aware datetimes; the UTC value, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
