"""Rebuild the AWS part of the catalog from the EC2 and Price List APIs (boto3).

Calls, per region (docs.aws.amazon.com/AWSEC2/latest/APIReference/):

* ``DescribeInstanceTypes`` -> every NVIDIA GPU type and its facts (GPUs, EFA, network cards,
  instance store, placement strategies), parsed by :func:`aws_facts_from_describe`;
* ``DescribeAvailabilityZones`` -> AZ name -> AZ ID (spot history is keyed by name; the catalog
  by ID, which is the same in every account) and which zones are Local/Wavelength zones;
* ``DescribeInstanceTypeOfferings`` (``LocationType=availability-zone-id``) -> where each type
  is sold;
* ``DescribeSpotPriceHistory`` (``Linux/UNIX``, ``StartTime`` = now - :data:`SPOT_WINDOW`,
  ``EndTime`` = now) -> per AZ the lowest, highest and latest spot price over the window; the
  offer's spot price is the window's highest (the price budgets and the fleet's maximum price
  use, as in the shipped catalog), dated with the refresh day
  (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html: the
  history goes back 90 days; a price in effect at StartTime is returned too); one below 10% of on-demand
  is dropped: :mod:`gpuinfra.catalog.gates`);
* Price List ``GetProducts`` (service ``AmazonEC2``, Linux, shared tenancy, no pre-installed
  software, ``capacitystatus=Used``) -> on-demand price per type and region
  (docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html).
  The Price List endpoint lives in us-east-1.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from gpuinfra.catalog.facts import aws_facts_from_describe, aws_gpu_name
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.gates import aws_spot_below_floor
from gpuinfra.catalog.model import Offer, parse_price

PRICING_REGION = "us-east-1"

#: How far back ``catalog refresh`` reads the spot price history (at most 90 days are kept).
SPOT_WINDOW = timedelta(days=30)
_SOURCE = "EC2 DescribeInstanceTypes via gpuinfra catalog refresh"

#: boto3 client factory: (service, region) -> client. Tests pass one that points at moto.
ClientFactory = Callable[[str, str], Any]  # boto3 clients (untyped)


def _gpu_types(ec2) -> list[dict]:
    types = []
    for page in ec2.get_paginator("describe_instance_types").paginate():
        for it in page["InstanceTypes"]:
            gpus = (it.get("GpuInfo") or {}).get("Gpus") or []
            if gpus and gpus[0].get("Manufacturer", "NVIDIA") == "NVIDIA":
                types.append(it)
    return types


@dataclass(frozen=True)
class SpotWindow:
    """Spot prices of one type in one AZ over the history window (USD per instance-hour)."""

    min_usd: Decimal
    max_usd: Decimal
    latest_usd: Decimal


def spot_windows(
    ec2, instance_types: list[str], now: datetime, window: timedelta = SPOT_WINDOW
) -> dict[tuple[str, str], SpotWindow]:
    """Lowest, highest and latest Linux/UNIX spot price per (instance type, AZ name) from
    ``DescribeSpotPriceHistory`` between ``now - window`` and ``now``."""
    seen: dict[tuple[str, str], list[tuple[datetime, Decimal]]] = {}
    paginator = ec2.get_paginator("describe_spot_price_history")
    for chunk_start in range(0, len(instance_types), 50):
        pages = paginator.paginate(
            InstanceTypes=instance_types[chunk_start : chunk_start + 50],
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            StartTime=now - window,
            EndTime=now,
        )
        for page in pages:
            for item in page["SpotPriceHistory"]:
                price = parse_price(item["SpotPrice"])
                if price is not None and price > 0:
                    seen.setdefault((item["InstanceType"], item["AvailabilityZone"]), []).append(
                        (item["Timestamp"], price)
                    )
    return {
        key: SpotWindow(min(p for _, p in points), max(p for _, p in points), max(points, key=lambda x: x[0])[1])
        for key, points in seen.items()
    }


def parse_price_list_item(text: str) -> tuple[str, str, Decimal] | None:
    """(instance type, region code, on-demand USD/hour) from one Price List ``PriceList`` entry.

    Args:
        text: one element of ``GetProducts``' ``PriceList`` (a JSON document as a string).

    Returns:
        None when the product has no hourly on-demand price.
    """
    doc = json.loads(text)
    attributes = doc["product"]["attributes"]
    for term in doc.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term["priceDimensions"].values():
            if dimension.get("unit") in ("Hrs", "Hours"):
                price = parse_price(dimension["pricePerUnit"].get("USD"))
                if price:
                    return attributes["instanceType"], attributes["regionCode"], price
    return None


#: Price List attributes (field, value) of a Linux, shared-tenancy, on-demand EC2 instance hour
#: with no pre-installed software or license (``capacitystatus=Used``: running, not reserved
#: capacity): the filters of the GPU on-demand prices and of the bake instances' price table
#: (:mod:`gpuinfra.catalog.refresh_aws_prices`).
LINUX_ON_DEMAND_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("operatingSystem", "Linux"),
    ("tenancy", "Shared"),
    ("preInstalledSw", "NA"),
    ("capacitystatus", "Used"),
    ("licenseModel", "No License required"),
)


def on_demand_prices(pricing, region: str, instance_types: list[str]) -> dict[str, Decimal]:
    """On-demand Linux price per instance type in ``region`` from the Price List API."""
    filters = [
        {"Type": "TERM_MATCH", "Field": field, "Value": value}
        for field, value in (("regionCode", region), *LINUX_ON_DEMAND_ATTRIBUTES)
    ]
    wanted = set(instance_types)
    prices: dict[str, Decimal] = {}
    for page in pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters):
        for text in page["PriceList"]:
            parsed = parse_price_list_item(text)
            if parsed and parsed[0] in wanted and parsed[1] == region:
                prices[parsed[0]] = parsed[2]
    return prices


def fetch_aws(
    client: ClientFactory, regions: Iterable[str] | None = None, now: datetime | None = None
) -> tuple[list[Offer], list[InstanceFacts]]:
    """Offers and facts for every NVIDIA GPU type in ``regions`` (default: all enabled regions).

    Args:
        client: factory returning boto3 clients (``client("ec2", "us-east-1")``).
        regions: region names; None asks ``DescribeRegions``.
        now: time for the spot price history query (default: now, UTC).

    Raises:
        botocore.exceptions.BotoCoreError / ClientError: API failures (the caller reports them).
    """
    now = now or datetime.now(UTC)
    if regions is None:
        regions = sorted(r["RegionName"] for r in client("ec2", PRICING_REGION).describe_regions()["Regions"])
    pricing = client("pricing", PRICING_REGION)
    offers: list[Offer] = []
    facts: dict[str, InstanceFacts] = {}
    for region in regions:
        ec2 = client("ec2", region)
        types = {it["InstanceType"]: it for it in _gpu_types(ec2)}
        if not types:
            continue
        for name, it in types.items():
            facts.setdefault(name, aws_facts_from_describe(it, _SOURCE))
        zones = {
            z["ZoneName"]: z for z in ec2.describe_availability_zones(AllAvailabilityZones=True)["AvailabilityZones"]
        }
        zone_type_by_id = {z["ZoneId"]: z.get("ZoneType", "availability-zone") for z in zones.values()}
        offered: set[tuple[str, str]] = set()
        for page in ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone-id",
            Filters=[{"Name": "instance-type", "Values": sorted(types)}],
        ):
            offered.update((o["InstanceType"], o["Location"]) for o in page["InstanceTypeOfferings"])
        spot_by_name = spot_windows(ec2, sorted(types), now)
        spot = {(t, zones[z]["ZoneId"]): w for (t, z), w in spot_by_name.items() if z in zones}
        on_demand = on_demand_prices(pricing, region, sorted(types))
        for itype, zone_id in sorted(offered):
            it = types[itype]
            gpu = it["GpuInfo"]["Gpus"][0]
            memory_mib = int(gpu.get("MemoryInfo", {}).get("SizeInMiB", 0))
            od, win = on_demand.get(itype), spot.get((itype, zone_id))
            sp = None if win is None else win.max_usd
            if od is not None and sp is not None and sp > od:
                sp = od  # a default spot request never pays above on-demand (its default max price)
            if aws_spot_below_floor(od, sp):
                sp = None  # below AWS's largest spot discount (gate aws-spot-not-below-10-percent-of-on-demand)
            if sp is None:
                win = None
            if od is None and sp is None:
                continue
            offers.append(
                Offer(
                    cloud="aws",
                    instance_type=itype,
                    gpu=aws_gpu_name(gpu["Name"], memory_mib),
                    gpu_count=int(gpu["Count"]),
                    vcpus=float(it["VCpuInfo"]["DefaultVCpus"]),
                    memory_gib=round(it["MemoryInfo"]["SizeInMiB"] / 1024, 3),
                    region=region,
                    zone=zone_id,
                    on_demand_price_per_hour_usd=od,
                    spot_price_per_hour_usd=sp,
                    price_source="all:aws-price-list-and-spot-history",
                    local_zone=zone_type_by_id.get(zone_id, "availability-zone") != "availability-zone",
                    spot_price_date=f"{now:%Y-%m-%d} ({SPOT_WINDOW.days}-day window)" if win else "",
                    spot_price_min_per_hour_usd=None if win is None else win.min_usd,
                    spot_price_max_per_hour_usd=None if win is None else win.max_usd,
                )
            )
    offers.sort(key=lambda o: (o.instance_type, o.region, o.zone))
    return offers, sorted(facts.values(), key=lambda f: f.instance_type)
