"""Rebuild the GCP part of the catalog from the Cloud Billing Catalog and Compute APIs.

Calls (google-cloud-billing and google-cloud-compute clients, install extra ``gcp-refresh``):

* Cloud Billing Catalog ``services/6F81-5844-456A/skus`` (Compute Engine): per region the
  on-demand and spot ("Spot Preemptible") prices of vCPU cores, RAM (GiB-hour) and GPUs
  (cloud.google.com/billing/docs/reference/rest/v1/services.skus/list). SKU descriptions
  look like ``A2 Instance Core running in Americas``, ``N1 Predefined Instance Ram running in
  Americas``, ``Nvidia Tesla T4 GPU running in Americas`` and ``Nvidia Tesla T4 GPU attached
  to Spot Preemptible VMs running in Warsaw``.
* Compute ``machineTypes.aggregatedList``: vCPUs, memory and bundled accelerators of each
  machine type per zone.
* Compute ``acceleratorTypes.aggregatedList``: which zones offer the GPUs that attach to N1.

Price of a machine = vCPUs x core price + memory GiB x RAM price (the host) + GPUs x GPU price,
like the snapshot's host row + GPU row. A machine family whose core/RAM or GPU SKUs are not
found is left out and reported (never priced at $0).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from gpuinfra.catalog.facts import gcp_facts
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.model import PRICE_QUANTUM, Offer

COMPUTE_SERVICE = "services/6F81-5844-456A"

#: Accelerator type -> regular expression on the lower-cased SKU description.
GPU_SKU_PATTERNS: dict[str, str] = {
    "nvidia-tesla-t4": r"\bt4 gpu\b",
    "nvidia-tesla-v100": r"\bv100 gpu\b",
    "nvidia-tesla-p100": r"\bp100 gpu\b",
    "nvidia-tesla-p4": r"\bp4 gpu\b",
    "nvidia-tesla-a100": r"\ba100 gpu\b",
    "nvidia-a100-80gb": r"\ba100 80gb gpu\b",
    "nvidia-l4": r"\bl4 gpu\b",
    "nvidia-h100-80gb": r"\bh100 80gb gpu\b",
    "nvidia-h100-mega-80gb": r"\bh100 80gb mega gpu\b",
    "nvidia-h200-141gb": r"\bh200 141gb gpu\b",
    "nvidia-b200": r"\bb200 gpu\b",
}
_HOST_SKU = re.compile(r"^(?:spot preemptible )?(?P<family>.+?) (?:predefined )?instance (?P<part>core|ram) running in")
_SKIP = re.compile(r"commit|reserv|sole tenan|custom|dws|flex|calendar|premium|extended")
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


@dataclass
class SkuPrices:
    """Prices per region from the billing catalog.

    Attributes:
        host: (family, part 'core'|'ram', spot, region) -> USD per vCPU-hour or GiB-hour.
        gpu: (accelerator type, spot, region) -> USD per GPU-hour.
    """

    host: dict[tuple[str, str, bool, str], Decimal] = field(default_factory=dict)
    gpu: dict[tuple[str, bool, str], Decimal] = field(default_factory=dict)


def parse_skus(skus: Iterable) -> SkuPrices:
    """Collect core/RAM/GPU prices from ``list_skus`` results (google.cloud.billing_v1.Sku)."""
    prices = SkuPrices()
    for sku in skus:
        category = sku.category
        if category.resource_family != "Compute" or category.usage_type not in ("OnDemand", "Preemptible"):
            continue
        description = sku.description.lower()
        if _SKIP.search(description) or not sku.pricing_info:
            continue
        rates = sku.pricing_info[0].pricing_expression.tiered_rates
        if not rates:
            continue
        price = _money(rates[0].unit_price)
        spot = category.usage_type == "Preemptible"
        if category.resource_group == "GPU":
            for accelerator, pattern in GPU_SKU_PATTERNS.items():
                if re.search(pattern, description):
                    for region in sku.service_regions:
                        prices.gpu[(accelerator, spot, region)] = price
                    break
            continue
        match = _HOST_SKU.match(description)
        if match:
            family = re.sub(r"[^a-z0-9]", "", match.group("family").removeprefix("spot preemptible "))
            for region in sku.service_regions:
                prices.host[(family, match.group("part"), spot, region)] = price
    return prices


def _host_price(prices: SkuPrices, family: str, spot: bool, region: str, vcpus: float, memory_gib: float) -> Decimal | None:
    core = prices.host.get((family, "core", spot, region))
    ram = prices.host.get((family, "ram", spot, region))
    if core is None or ram is None:
        return None
    return (core * Decimal(str(vcpus)) + ram * Decimal(str(memory_gib))).quantize(PRICE_QUANTUM)


def _gpu_price(prices: SkuPrices, accelerator: str, spot: bool, region: str, count: int) -> Decimal | None:
    each = prices.gpu.get((accelerator, spot, region))
    return None if each is None else (each * count).quantize(PRICE_QUANTUM)


@dataclass
class GcpRefreshReport:
    """What could not be priced, for the refresh summary."""

    missing_host_skus: set[str] = field(default_factory=set)
    missing_gpu_skus: set[str] = field(default_factory=set)


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
                        if zone in accelerator_zones.get(accelerator, set()) and mt.guest_cpus <= max_vcpus and memory_gib <= max_mem:
                            combos.append((accelerator, int(count_text)))
            for accelerator, count in combos:
                gpu = gpu_by_accelerator.get(accelerator)
                if gpu is None:
                    continue
                parts = {}
                for spot in (False, True):
                    parts[spot] = (
                        _host_price(prices, family, spot, region, mt.guest_cpus, memory_gib),
                        _gpu_price(prices, accelerator, spot, region, count),
                    )
                if parts[False][0] is None and parts[True][0] is None:
                    report.missing_host_skus.add(f"{family} ({region})")
                    continue
                if parts[False][1] is None and parts[True][1] is None:
                    report.missing_gpu_skus.add(f"{accelerator} ({region})")
                    continue
                totals = {s: (h + g if h is not None and g is not None else None) for s, (h, g) in parts.items()}
                facts.setdefault(mt.name, fact)
                offers.append(
                    Offer(
                        cloud="gcp",
                        instance_type=mt.name,
                        gpu=gpu,
                        gpu_count=count,
                        vcpus=float(mt.guest_cpus),
                        memory_gib=memory_gib,
                        region=region,
                        zone=zone,
                        on_demand_price_per_hour_usd=totals[False],
                        spot_price_per_hour_usd=totals[True],
                        host_on_demand_price_per_hour_usd=parts[False][0],
                        host_spot_price_per_hour_usd=parts[True][0],
                        accelerator_on_demand_price_per_hour_usd=parts[False][1],
                        accelerator_spot_price_per_hour_usd=parts[True][1],
                        accelerator_type=accelerator,
                    )
                )
    offers.sort(key=lambda o: (o.instance_type, o.gpu, o.gpu_count, o.region, o.zone))
    return offers, sorted(facts.values(), key=lambda f: f.instance_type), report


def fetch_gcp(billing_client, machine_types_client, accelerator_types_client, project: str,
              regions: Iterable[str] | None, curated: Mapping, gpu_models) -> tuple[list[Offer], list[InstanceFacts], GcpRefreshReport]:
    """Call the three APIs and build offers.

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
    prices = parse_skus(billing_client.list_skus(parent=COMPUTE_SERVICE))
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
    return build_gcp_offers(machine_types_by_zone, accelerator_zones, prices, curated, gpu_by_accelerator)
