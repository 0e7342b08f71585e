"""Rebuild the GCP part of the catalog from the Cloud Billing Catalog and Compute APIs.

Calls (google-cloud-billing and google-cloud-compute clients, install extra ``gcp-refresh``):

* Cloud Billing Catalog ``services/6F81-5844-456A/skus`` (Compute Engine): per region the
  price of vCPU cores, RAM (GiB-hour), GPUs and Local SSD (GiB-month) in each market
  (cloud.google.com/billing/docs/reference/rest/v1/services.skus/list). SKU descriptions:

  - on-demand: ``A2 Instance Core running in Americas``, ``N1 Predefined Instance Ram
    running in Americas``, ``Nvidia Tesla A100 GPU running in Americas``,
    ``Nvidia B200 (1 gpu slice) running in Americas``, ``SSD backed Local Storage``;
  - spot (usage type ``Preemptible``): ``Spot Preemptible A2 Instance Core running in ...``,
    ``Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Warsaw``,
    ``SSD backed Local Storage attached to Spot Preemptible VMs``;
  - flex-start / DWS (usage type ``OnDemand``!): ``Nvidia Tesla A100 GPU attached to DWS
    Defined Duration VMs running in ...`` and the matching core/RAM SKUs. These are **never**
    on-demand prices: they price the ``flex-start`` market only. Flex-start gets
    vCPUs, memory and GPUs at the DWS price; Local SSD stays at the on-demand price
    (cloud.google.com/compute/docs/instances/about-flex-start-vms: "For A4, A3, A2 ... you
    obtain vCPUs, memory, and any attached GPUs at a discounted price");
  - commitments, reservations, sole tenancy, custom and extended memory are skipped.

  H100 Mega GPUs are described in three ways across regions (``H100 80GB Mega GPU``,
  ``H100 Mega 80GB GPU``, ``H100 80GB Plus GPU``; skypilot-org/skypilot
  sky/catalog/data_fetchers/fetch_gcp.py, ``get_gpu_price``); B200 as ``B200 (1 gpu slice)``.
* The same SKU list, for the non-compute price tables a stack's cost uses
  (:data:`PRICE_TABLE_SKUS`, :func:`parse_price_skus`): Balanced PD, Hyperdisk Balanced capacity /
  IOPS / throughput and Local SSD (on-demand and Spot). Descriptions ``<kind> in <region>``
  (grafana/cloudcost-exporter docs/metrics/gcp/persistentvolumes.md @3756ae5f: "Balanced PD
  Capacity in <Region>", "Hyperdisk Balanced Capacity / IOPS / Throughput in <Region>", "SSD backed
  Local Storage [attached to Spot Preemptible VM] in <Region>"); a captured IOPS SKU:
  SpareCores/sc-crawler src/sc_crawler/vendors/gcp.py @3687b184 ("Hyperdisk Balanced IOPS in
  Santiago", SKU B02F-5C14-5872, resource family Storage, usage type OnDemand, usage unit ``mo``).
  External IP SKUs ("External IP Charge on a Standard VM") are global, not per region
  (infracost/infracost internal/resources/google/compute_address.go @da0a5862: region
  ``global``, with a free first tier), and Cloud NAT's ("Networking Cloud Nat Data Processing")
  are in the Networking service, not this one: neither is read.
* Compute ``machineTypes.aggregatedList``: vCPUs, memory and bundled accelerators of each
  machine type per zone.
* Compute ``acceleratorTypes.aggregatedList``: which zones offer the GPUs that attach to N1.

Price of a machine in a market = vCPUs x core price + memory GiB x RAM price + GPUs x GPU
price + bundled Local SSD GiB x Local SSD price / 730 (GCP bills bundled Local SSD with the
machine type). A part whose SKU is not found leaves that market unpriced (never $0) and is
reported.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from gpuinfra.catalog.facts import gcp_facts
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.model import MARKETS, Offer, add_prices, quantize_price
from gpuinfra.catalog.prices import HOURS_PER_MONTH, PriceGroup, PriceTable, shipped_price_book

COMPUTE_SERVICE = "services/6F81-5844-456A"
#: The method the SKUs are read with (the Catalog has no publication date: a refreshed price is
#: dated the day of the refresh).
SKUS_LIST_DOC = "https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list"

#: Accelerator type -> regular expression on the normalized SKU description (see
#: :func:`classify_sku`: market phrases removed, ``(1 gpu slice)`` read as ``gpu``).
GPU_SKU_PATTERNS: dict[str, str] = {
    "nvidia-tesla-t4": r"\bt4 gpu\b",
    "nvidia-tesla-v100": r"\bv100 gpu\b",
    "nvidia-tesla-p100": r"\bp100 gpu\b",
    "nvidia-tesla-p4": r"\bp4 gpu\b",
    "nvidia-tesla-a100": r"\ba100 gpu\b",
    "nvidia-a100-80gb": r"\ba100 80gb gpu\b",
    "nvidia-l4": r"\bl4 gpu\b",
    "nvidia-h100-80gb": r"\bh100 80gb gpu\b",
    "nvidia-h100-mega-80gb": r"\bh100 (?:80gb mega|mega 80gb|80gb plus) gpu\b",
    "nvidia-h200-141gb": r"\bh200 141gb gpu\b",
    "nvidia-b200": r"\bb200 gpu\b",
}
_HOST_SKU = re.compile(r"^(?P<family>.+?) (?:predefined )?instance (?P<part>core|ram) running in")
_LOCAL_SSD_SKU = re.compile(r"^ssd backed local storage\b")
_SKIP = re.compile(r"commit|reserv|sole tenan|custom|calendar|premium|extended|confidential")
_FLEX = re.compile(r"\s*(?:attached to )?dws defined duration(?: vms)?\s*")
_SPOT = re.compile(r"\s*(?:attached to )?spot preemptible(?: vms)?\s*")
_FAMILY_BY_PREFIX = (
    ("a3-megagpu-", "a3mega"),
    ("a3-ultragpu-", "a3ultra"),
    ("a3-highgpu-", "a3"),
    ("a2-", "a2"),
    ("a4-", "a4"),
    ("g2-", "g2"),
    ("n1-", "n1"),
)


def machine_family(machine_type: str) -> str | None:
    """Billing family of a machine type (``a3-megagpu-8g`` -> ``a3mega``), None if unknown."""
    for prefix, family in _FAMILY_BY_PREFIX:
        if machine_type.startswith(prefix):
            return family
    return None


def _money(unit_price) -> Decimal:
    return Decimal(int(unit_price.units or 0)) + Decimal(int(unit_price.nanos or 0)) / Decimal(10**9)


def classify_sku(description: str, usage_type: str) -> tuple[str, str] | None:
    """(market, normalized description) of one SKU, or None when it prices no market here.

    Args:
        description: the SKU's ``description``.
        usage_type: ``category.usageType`` (``OnDemand``, ``Preemptible``, ``Commit1Yr`` ...).

    Returns:
        ``("flex-start", ...)`` for DWS SKUs (whatever their usage type says),
        ``("spot", ...)`` for Spot Preemptible ones, ``("on-demand", ...)`` for the rest of
        the OnDemand SKUs; the text keeps what names the resource (``a2 instance core running
        in americas``, ``nvidia tesla a100 gpu running in americas``).
    """
    text = description.lower().replace("(1 gpu slice)", "gpu")
    if _SKIP.search(text) or usage_type not in ("OnDemand", "Preemptible"):
        return None
    if _FLEX.search(text):
        return "flex-start", re.sub(r"\s+", " ", _FLEX.sub(" ", text)).strip()
    if usage_type == "Preemptible" or _SPOT.search(text):
        return "spot", re.sub(r"\s+", " ", _SPOT.sub(" ", text)).strip()
    if "flex" in text or "dws" in text:  # a flex-start SKU worded another way: never on-demand
        return None
    return "on-demand", re.sub(r"\s+", " ", text).strip()


@dataclass
class SkuPrices:
    """Prices per market and region from the billing catalog.

    Attributes:
        host: (family, part 'core'|'ram', market, region) -> USD per vCPU-hour or GiB-hour.
        gpu: (accelerator type, market, region) -> USD per GPU-hour.
        local_ssd: (market, region) -> USD per GiB-month.
    """

    host: dict[tuple[str, str, str, str], Decimal] = field(default_factory=dict)
    gpu: dict[tuple[str, str, str], Decimal] = field(default_factory=dict)
    local_ssd: dict[tuple[str, str], Decimal] = field(default_factory=dict)


def parse_skus(skus: Iterable) -> SkuPrices:
    """Collect core/RAM/GPU/Local SSD prices from ``list_skus`` results (``billing_v1.Sku``)."""
    prices = SkuPrices()
    for sku in skus:
        category = sku.category
        if category.resource_family not in ("Compute", "Storage") or not sku.pricing_info:
            continue
        classified = classify_sku(sku.description, category.usage_type)
        if classified is None:
            continue
        market, text = classified
        paid = [_money(r.unit_price) for r in sku.pricing_info[0].pricing_expression.tiered_rates]
        paid = [p for p in paid if p > 0]
        if not paid:
            continue
        price = paid[0]  # the first paid tier (a first tier may be free)
        regions = list(sku.service_regions)
        if category.resource_group == "GPU":
            for accelerator, pattern in GPU_SKU_PATTERNS.items():
                if re.search(pattern, text):
                    for region in regions:
                        prices.gpu[(accelerator, market, region)] = price
                    break
            continue
        if category.resource_group == "LocalSSD" and _LOCAL_SSD_SKU.match(text):
            for region in regions:
                prices.local_ssd[(market, region)] = price
            continue
        match = _HOST_SKU.match(text)
        if match and category.resource_family == "Compute":
            family = re.sub(r"[^a-z0-9]", "", match.group("family"))
            for region in regions:
                prices.host[(family, match.group("part"), market, region)] = price
    return prices


def machine_price(
    prices: SkuPrices,
    family: str,
    market: str,
    region: str,
    vcpus: float,
    memory_gib: float,
    accelerator: str,
    gpu_count: int,
    local_ssd_gib: float,
) -> Decimal | None:
    """Per node-hour price of a machine in ``market``; None when any part has no SKU.

    Local SSD is priced at the spot rate for spot and at the on-demand rate otherwise (DWS
    discounts vCPUs, memory and GPUs only).
    """
    core = prices.host.get((family, "core", market, region))
    ram = prices.host.get((family, "ram", market, region))
    gpu = prices.gpu.get((accelerator, market, region))
    parts = [
        None if core is None else core * Decimal(str(vcpus)),
        None if ram is None else ram * Decimal(str(memory_gib)),
        None if gpu is None else gpu * gpu_count,
    ]
    if local_ssd_gib:
        lssd = prices.local_ssd.get(("spot" if market == "spot" else "on-demand", region))
        parts.append(None if lssd is None else lssd * Decimal(str(local_ssd_gib)) / HOURS_PER_MONTH)
    total = add_prices(*parts)
    return None if total is None else quantize_price(total)


#: Factor from a SKU's ``pricingExpression.usageUnit`` to a per-GiB-month table's unit: per
#: GiB-month as is, per GiB-hour x 730 (the month of :data:`HOURS_PER_MONTH`). Unit codes:
#: cloud.google.com/billing/docs/reference/rest/v1/services.skus/list ("usageUnit ... e.g. 'GiBy'
#: for gibibyte, 'h' for hour, 'mo' for month").
_PER_GIB_MONTH = {"GiBy.mo": Decimal(1), "GiBy.h": HOURS_PER_MONTH}
#: Per month of one provisioned unit (IOPS, MiB/s): usage unit ``mo`` (the sc-crawler capture above).
_PER_MONTH = {"mo": Decimal(1), "h": HOURS_PER_MONTH}
#: Words of SKUs that price another product than the table's: Regional / High Availability
#: (replicated) disks, storage pools, Confidential mode, commitments, reservations, DWS.
_PRICE_SKIP = re.compile(r"regional|high availability|pool|confidential|commit|reserv|dws|sole tenan", re.I)


@dataclass(frozen=True)
class PriceTableSku:
    """Which SKUs price one ``prices.yaml`` ``gcp`` table.

    Attributes:
        table: the table key; pattern: the whole description (``in <region>`` optional);
        usage_type: ``category.usageType``; units: usage unit -> factor to the table's unit.
    """

    table: str
    pattern: re.Pattern[str]
    usage_type: str
    units: Mapping[str, Decimal]


PRICE_TABLE_SKUS: tuple[PriceTableSku, ...] = (
    PriceTableSku(
        "pd_balanced_per_gb_month", re.compile(r"Balanced PD Capacity(?: in .+)?", re.I), "OnDemand", _PER_GIB_MONTH
    ),
    PriceTableSku(
        "hyperdisk_balanced_per_gib_month",
        re.compile(r"Hyperdisk Balanced Capacity(?: in .+)?", re.I),
        "OnDemand",
        _PER_GIB_MONTH,
    ),
    PriceTableSku(
        "hyperdisk_balanced_iops_per_month",
        re.compile(r"Hyperdisk Balanced IOPS(?: in .+)?", re.I),
        "OnDemand",
        _PER_MONTH,
    ),
    PriceTableSku(
        "hyperdisk_balanced_throughput_per_mibps_month",
        re.compile(r"Hyperdisk Balanced Throughput(?: in .+)?", re.I),
        "OnDemand",
        _PER_MONTH,
    ),
    PriceTableSku(
        "local_ssd_per_gb_month", re.compile(r"SSD backed Local Storage(?: in .+)?", re.I), "OnDemand", _PER_GIB_MONTH
    ),
    PriceTableSku(
        "local_ssd_spot_per_gb_month",
        re.compile(r"SSD backed Local Storage attached to Spot Preemptible VMs?(?: in .+)?", re.I),
        "Preemptible",
        _PER_GIB_MONTH,
    ),
)


@dataclass
class RefreshedPriceTables:
    """Non-compute price tables read from the SKU list.

    Attributes:
        tables: table key -> per-region table (tables with no region left out).
        warnings: one line per SKU or region left unpriced, and why.
    """

    tables: dict[str, PriceTable] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def priced_pairs(self, regions: Iterable[str]) -> tuple[int, int]:
        """(priced, all) (region, table) pairs over ``regions`` and :data:`PRICE_TABLE_SKUS`."""
        wanted = set(regions)
        priced = sum(len(wanted & set(group.regions or {})) for table in self.tables.values() for group in table.prices)
        return priced, len(wanted) * len(PRICE_TABLE_SKUS)


def _sku_price(sku, units: Mapping[str, Decimal]) -> tuple[Decimal | None, str]:
    """(price in the table's unit, "") or (None, why not): one USD rate, a known unit, above 0.

    Tiered SKUs are refused: the disk and Local SSD SKUs bill every unit at one rate, and no tier
    of theirs is documented to pick."""
    if not sku.pricing_info:
        return None, "no pricing info"
    expression = sku.pricing_info[0].pricing_expression
    factor = units.get(expression.usage_unit)
    if factor is None:
        return None, f"unknown usage unit {expression.usage_unit!r}"
    rates = list(expression.tiered_rates)
    if any(r.unit_price.currency_code not in ("", "USD") for r in rates):
        return None, "not priced in USD"
    values = {_money(r.unit_price) for r in rates}
    if len(values) != 1:
        return None, f"{len(values)} rates (tiered or none)"
    value = values.pop() * factor
    if value <= 0:
        return None, "price 0"
    return value, ""


def parse_price_skus(skus: Iterable, regions: Iterable[str] | None, date: str) -> RefreshedPriceTables:
    """The :data:`PRICE_TABLE_SKUS` tables from ``list_skus`` results (``billing_v1.Sku``).

    Args:
        skus: the Compute Engine SKUs.
        regions: keep only these regions (None: every region a SKU names in ``serviceRegions``).
        date: the refresh day (ISO), the date of every refreshed price.

    Returns:
        Tables in each shipped table's unit. A region is left unpriced, with a warning, when two
        SKUs match it, or when a matching SKU has no single USD rate above 0 in a known unit;
        never filled from another region or SKU.
    """
    wanted = set(regions) if regions else None
    shipped = shipped_price_book().gcp
    result = RefreshedPriceTables()
    for spec in PRICE_TABLE_SKUS:
        found: dict[str, list[tuple[str, Decimal | None]]] = {}
        for sku in skus:
            text = re.sub(r"\s+", " ", sku.description).strip()
            if (
                sku.category.usage_type != spec.usage_type
                or _PRICE_SKIP.search(text)
                or not spec.pattern.fullmatch(text)
            ):
                continue
            value, problem = _sku_price(sku, spec.units)
            mine = [r for r in sku.service_regions if wanted is None or r in wanted]
            if problem and mine:
                result.warnings.append(
                    f"SKU {sku.sku_id} ({text}): {problem}; {spec.table} unpriced in {', '.join(sorted(mine))}"
                )
            for region in mine:
                found.setdefault(region, []).append((sku.sku_id, value))
        prices: dict[str, Decimal] = {}
        ids: set[str] = set()
        for region, matches in sorted(found.items()):
            if len(matches) > 1:
                result.warnings.append(
                    f"{len(matches)} SKUs ({', '.join(sorted(i for i, _ in matches))}) match {spec.table} "
                    f"in {region}; left unpriced"
                )
                continue
            sku_id, value = matches[0]
            if value is not None:
                prices[region] = value
                ids.add(sku_id)
        if prices:
            source = (
                f"{SKUS_LIST_DOC} (Cloud Billing Catalog via gpuinfra catalog refresh, "
                f"SKU {', '.join(sorted(ids))}; the Catalog gives no publication date: dated the refresh day)"
            )
            table = shipped[spec.table]
            result.tables[spec.table] = PriceTable(
                unit=table.unit,
                what=table.what,
                prices=[PriceGroup(source=source, date=dt.date.fromisoformat(date), regions=prices)],
            )
    return result


@dataclass
class GcpRefreshReport:
    """What could not be priced, for the refresh summary, and the non-compute price tables."""

    missing_host_skus: set[str] = field(default_factory=set)
    missing_gpu_skus: set[str] = field(default_factory=set)
    price_tables: RefreshedPriceTables = field(default_factory=RefreshedPriceTables)


def build_gcp_offers(
    machine_types_by_zone: Mapping[str, list],
    accelerator_zones: Mapping[str, set[str]],
    prices: SkuPrices,
    curated: Mapping,
    gpu_by_accelerator: Mapping[str, str],
) -> tuple[list[Offer], list[InstanceFacts], GcpRefreshReport]:
    """Offers from machine types (per zone), accelerator availability and SKU prices.

    Args:
        machine_types_by_zone: zone -> list of ``compute_v1.MachineType``.
        accelerator_zones: accelerator type -> zones offering it (for N1 guest GPUs).
        prices: parsed SKU prices.
        curated: ``gcp_machine_facts.json`` (families, N1 limits).
        gpu_by_accelerator: accelerator type -> canonical GPU model.

    Returns:
        (offers, facts of the types offered, report of parts without a SKU). An offer is
        kept when some market is priced; the markets a type is not sold in are priced anyway
        (the ranking filters them by ``InstanceFacts.provisioning_models``).
    """
    report = GcpRefreshReport()
    offers: list[Offer] = []
    facts: dict[str, InstanceFacts] = {}
    limits = curated["n1_accelerator_limits"]
    for zone, machine_types in sorted(machine_types_by_zone.items()):
        region = zone.rsplit("-", 1)[0]
        for mt in machine_types:
            fact = gcp_facts(mt.name, curated)
            family = machine_family(mt.name)
            if fact is None or family is None:
                continue
            memory_gib = round(mt.memory_mb / 1024, 3)
            combos: list[tuple[str, int]] = []
            if mt.accelerators:
                acc = mt.accelerators[0]
                combos.append((acc.guest_accelerator_type, int(acc.guest_accelerator_count)))
            elif family == "n1":
                for accelerator, gpu in gpu_by_accelerator.items():
                    for count_text, (max_vcpus, max_mem) in limits.get(gpu, {}).items():
                        if (
                            zone in accelerator_zones.get(accelerator, set())
                            and mt.guest_cpus <= max_vcpus
                            and memory_gib <= max_mem
                        ):
                            combos.append((accelerator, int(count_text)))
            lssd_gib = fact.local_ssd.bundled_count * fact.local_ssd.size_gib
            for accelerator, count in combos:
                model = gpu_by_accelerator.get(accelerator)
                if model is None:
                    continue
                by_market = {
                    m: machine_price(prices, family, m, region, mt.guest_cpus, memory_gib, accelerator, count, lssd_gib)
                    for m in MARKETS
                }
                if all(v is None for v in by_market.values()):
                    if not any((family, "core", m, region) in prices.host for m in MARKETS):
                        report.missing_host_skus.add(f"{family} ({region})")
                    else:
                        report.missing_gpu_skus.add(f"{accelerator} ({region})")
                    continue
                facts.setdefault(mt.name, fact)
                offers.append(
                    Offer(
                        cloud="gcp",
                        instance_type=mt.name,
                        gpu=model,
                        gpu_count=count,
                        vcpus=float(mt.guest_cpus),
                        memory_gib=memory_gib,
                        region=region,
                        zone=zone,
                        on_demand_price_per_hour_usd=by_market["on-demand"],
                        spot_price_per_hour_usd=by_market["spot"],
                        flex_start_price_per_hour_usd=by_market["flex-start"],
                        price_source="all:gcp-billing-catalog",
                        accelerator_type=accelerator,
                    )
                )
    offers.sort(key=lambda o: (o.instance_type, o.gpu, o.gpu_count, o.region, o.zone))
    return offers, sorted(facts.values(), key=lambda f: f.instance_type), report


def fetch_gcp(
    billing_client,
    machine_types_client,
    accelerator_types_client,
    project: str,
    regions: Iterable[str] | None,
    curated: Mapping,
    gpu_models,
    date: str = "",
) -> tuple[list[Offer], list[InstanceFacts], GcpRefreshReport]:
    """Call the three APIs and build offers, and the non-compute price tables from the same SKUs
    (``report.price_tables``, dated ``date``, the refresh day; none when ``date`` is empty).

    Args:
        billing_client: ``billing_v1.CloudCatalogClient``.
        machine_types_client: ``compute_v1.MachineTypesClient``.
        accelerator_types_client: ``compute_v1.AcceleratorTypesClient``.
        project: project id for the Compute calls.
        regions: keep only these regions (None: all).
        curated: ``gcp_machine_facts.json``.
        gpu_models: :func:`gpuinfra.catalog.store.load_gpu_models` result.
    """
    wanted = set(regions) if regions else None
    skus = list(billing_client.list_skus(parent=COMPUTE_SERVICE))
    prices = parse_skus(skus)
    machine_types_by_zone: dict[str, list] = {}
    for scope, scoped in machine_types_client.aggregated_list(
        request={"project": project, "filter": 'name eq "(a2|a3|a4|g2|n1)-.*"'}
    ):
        zone = scope.removeprefix("zones/")
        if scoped.machine_types and (wanted is None or zone.rsplit("-", 1)[0] in wanted):
            machine_types_by_zone[zone] = list(scoped.machine_types)
    accelerator_zones: dict[str, set[str]] = {}
    for scope, scoped in accelerator_types_client.aggregated_list(request={"project": project}):
        for acc in scoped.accelerator_types:
            accelerator_zones.setdefault(acc.name, set()).add(scope.removeprefix("zones/"))
    gpu_by_accelerator = {g.gcp_accelerator_type: g.name for g in gpu_models if g.gcp_accelerator_type}
    gpu_by_accelerator["nvidia-h100-mega-80gb"] = "H100"
    offers, facts, report = build_gcp_offers(
        machine_types_by_zone, accelerator_zones, prices, curated, gpu_by_accelerator
    )
    if date:
        report.price_tables = parse_price_skus(skus, regions, date)
    return offers, facts, report
