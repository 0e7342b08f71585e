"""Build the normalized catalog from the public price snapshot.

Input: ``data/snapshot/`` in the repository (README there gives provenance per file and the
known defects) plus the instance-fact inputs beside it:

* ``aws_vms.csv`` -- SkyPilot catalog v8 rows (on-demand and spot per AZ ID);
* ``gcp_vms.csv`` -- SkyPilot catalog v8 rows: which machine types and GPUs each zone offers,
  and their **spot** prices (host row + GPU row). Its on-demand GPU prices are **not used**
  except for the GPUs attached to N1 hosts: for A100, A100-80GB, H100, H100-Mega and H200
  they are DWS / flex-start SKUs posing as on-demand (data/snapshot/README.md, known defects);
* ``aws_reserved.json``, ``gcp_commitments.json`` -- commitment rates (written to
  ``commitments.csv`` / ``commitments.json``, :mod:`gpuinfra.catalog.commitments`);
* ``gcp_on_demand.csv`` -- on-demand price per machine type and region, one cited source
  per row (``source_ref``, ``source_date``): the whole machine as billed (vCPUs, memory,
  GPUs, bundled Local SSD).

Output: the package data in ``gpuinfra/catalog/data/`` (``offers.csv``,
``instance_types.json``, ``catalog.json``), written only when every gate of
:mod:`gpuinfra.catalog.gates` passes. Run ``python -m gpuinfra.catalog.build``; a test checks
that the shipped files equal a fresh build byte for byte.

Defects handled on purpose, each counted in :class:`BuildReport` (printed by the build):

* a GCP on-demand price that no cited source gives is dropped (``None``), never guessed;
* a spot price above on-demand is dropped (AWS: never paid by default; GCP: a wrong SKU);
* an AWS spot price below 10% of on-demand is dropped (AWS sells spot at up to 90% off:
  :mod:`gpuinfra.catalog.gates`, ``aws-spot-not-below-10-percent-of-on-demand``);
* GCP spot prices of machines with bundled Local SSD add the Local SSD spot price of the
  region (``prices.yaml`` ``local_ssd_spot_per_gb_month``), else they are dropped;
* AWS Local Zones / Wavelength zones are kept with ``local_zone=True`` and filtered at query
  time unless asked for;
* float noise is removed by rounding to 1e-5 USD.
"""

from __future__ import annotations

import ast
import csv
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from gpuinfra.catalog.commitments import write_commitments
from gpuinfra.catalog.facts import aws_facts_from_describe, aws_gpu_name, gcp_facts
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.gates import aws_spot_below_floor, check_offers
from gpuinfra.catalog.model import (
    CATALOG_SCHEMA_VERSION,
    OFFER_COLUMNS,
    Offer,
    add_prices,
    parse_price,
    price_source_keys,
    quantize_price,
)
from gpuinfra.catalog.prices import HOURS_PER_MONTH, region_prices
from gpuinfra.catalog.store import load_gcp_curated_facts, load_gpu_models
from gpuinfra.fsutil import atomic_write_text

#: A regular AZ ID: ``use1-az4``. Local Zones (``usw2-lax1-az1``) and Wavelength zones
#: (``use1-wl1-bos-wlz1``) have more dash-separated parts.
#: Source: docs.aws.amazon.com/ram/latest/userguide/working-with-az-ids.html and
#: docs.aws.amazon.com/local-zones/latest/ug/available-local-zones.html.
_REGULAR_AZ_ID = re.compile(r"^[a-z]{2,}\d+-az\d+$")

#: The day the SkyPilot rows were copied into gpuinfra (upstream commits are undated).
IMPORT_DATE = "2026-11-22"

#: Price sources of the shipped snapshot, by the key each offer's ``price_source`` names.
#: Dates are the sources' own dates where known (snapshot README, "Source").
PRICE_SOURCES: dict[str, dict[str, str]] = {
    "skypilot-v8-aws": {
        "what": "AWS on-demand and spot per AZ ID",
        "source": "github.com/skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv @00148f2af3672e2229b4f7bf8157d5a3f36e3c35",
        "date": f"undated upstream commit (content late 2026); imported {IMPORT_DATE}",
    },
    "skypilot-v8-gcp": {
        "what": "GCP spot (host row + GPU row) per zone; on-demand of GPUs attached to N1 hosts",
        "source": "github.com/skypilot-org/skypilot-catalog catalogs/v8/gcp/vms.csv @006059e0f18acb1341e22a27751e9f80df6ba92f",
        "date": f"undated upstream commit (content late 2026); imported {IMPORT_DATE}",
    },
    "cyclenerd-2026-08-20": {
        "what": "GCP on-demand per machine type and region (vCPU + memory + GPUs + bundled Local SSD), "
        "built from the Cloud Billing Catalog 'running in' SKUs (no DWS, commitment or spot SKUs)",
        "source": "github.com/Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml "
        "@dac31281f2a4575f0a8bff20ac04fc71a5ff2190 (compute.instance.<type>.cost.<region>.hour)",
        "date": "2026-08-20 (the file's own 'generated: Thu Aug 20 04:22:20 2026')",
    },
    "vantage-2025-11-30-spot": {
        "what": "AWS spot per instance type and region: lowest, average and highest Linux spot price over "
        "the extract's window (per region, all AZs); budgets use the highest (capped at on-demand, the "
        "default maximum price of a spot request)",
        "source": "github.com/tsaol/aws-gpu data/gpu_instances_raw.json @2d0108c7bd261c8e40493fbd35135437bd6c9099 "
        "(Vantage instances.json extract: pricing.<region>.linux.spot_min/spot_avg/spot_max)",
        "date": "2025-11-30 (the commit's date; the extract has no date of its own)",
    },
    "cyclenerd-2026-07-30-spot": {
        "what": "GCP spot per machine type and region (Spot VM vCPU + memory + GPUs + bundled Local SSD at "
        "the Spot rate), built from the Cloud Billing Catalog spot SKUs",
        "source": "github.com/Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml "
        "@fd66b26ff84fee5cdd94f341ea89206e76c06b99 (compute.instance.<type>.cost.<region>.hour_spot)",
        "date": "2026-07-30 (the file's own 'generated: Thu Jul 30 06:13:17 2026'); GCP spot prices "
        "can change up to once a day (cloud.google.com/spot-vms/pricing)",
    },
}

#: ``spot_price_date`` of spot prices from the undated SkyPilot rows.
UNDATED_SPOT = f"undated (imported {IMPORT_DATE})"

#: ``spot_price_date`` of AWS spot ranges from ``aws_spot_range.csv`` (its source's own date).
AWS_SPOT_RANGE_DATE = "2025-11-30"

#: ``spot_price_date`` of spot prices from ``gcp_spot.csv`` (its source's own date).
GCP_SPOT_DATE = "2026-07-30"


def is_local_zone(zone_id: str) -> bool:
    """True for AWS Local Zone / Wavelength zone IDs (``usw2-lax1-az1``), False for ``use1-az1``."""
    return not _REGULAR_AZ_ID.match(zone_id)


def _gpu_memory_mib(gpu_info: str) -> int:
    info = ast.literal_eval(gpu_info) if gpu_info else {}
    gpus = info.get("Gpus") or [{}]
    return int(gpus[0].get("MemoryInfo", {}).get("SizeInMiB", 0))


@dataclass
class BuildReport:
    """Counts of what the build dropped on purpose (printed by ``python -m gpuinfra.catalog.build``).

    Attributes:
        dropped: reason -> number of offer prices (or offers) dropped.
    """

    dropped: dict[str, int] = field(default_factory=dict)

    def count(self, reason: str) -> None:
        """Add one to ``reason``."""
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def lines(self) -> list[str]:
        """One line per reason, sorted."""
        return [f"dropped {n}: {reason}" for reason, n in sorted(self.dropped.items())]


def _sources(**by_market: str) -> str:
    return ";".join(f"{market.replace('_', '-')}:{key}" for market, key in by_market.items())


@dataclass(frozen=True)
class SpotRange:
    """A dated spot price range of one instance type in one region (USD per node-hour).

    Attributes:
        min_usd / avg_usd / max_usd: lowest, average and highest spot price in the window.
        interruption_band: AWS Spot Instance Advisor frequency of interruption band for the
            type and region (``"<5%"``, ``"5-10%"``, ... ``">20%"`` of instances interrupted per
            month, aws.amazon.com/ec2/spot/instance-advisor/), "" when the source has none.
    """

    min_usd: Decimal
    avg_usd: Decimal
    max_usd: Decimal
    interruption_band: str = ""


def _cited_rows(path: Path, key_fields: tuple[str, ...]) -> Iterable[tuple[int, tuple[str, ...], dict]]:
    """``(line number, key, row)`` of a vendored price CSV whose every row names its source
    (``source_ref``) and that source's date (``source_date``), one row per key.

    Raises:
        ValueError: a row without source or date (before the caller reads it), or a key seen
            before (after the caller has checked that row's values).
    """
    seen: set[tuple[str, ...]] = set()
    with open(path, newline="") as f:
        for n, row in enumerate(csv.DictReader(f), start=2):
            if not row.get("source_ref") or not row.get("source_date"):
                raise ValueError(f"{path.name} line {n}: every price needs source_ref and source_date")
            key = tuple(row[k] for k in key_fields)
            yield n, key, row
            if key in seen:
                raise ValueError(f"{path.name} line {n}: duplicate {key}")
            seen.add(key)


def load_aws_spot_ranges(path: Path) -> dict[tuple[str, str], SpotRange]:
    """Read ``aws_spot_range.csv``: (instance type, region) -> :class:`SpotRange`.

    Raises:
        ValueError: a row without source or date, or not ``0 < min <= avg <= max``, or a duplicate.
    """
    ranges: dict[tuple[str, str], SpotRange] = {}
    for n, (itype, region), row in _cited_rows(path, ("instance_type", "region")):
        lo, avg, hi = (quantize_price(Decimal(row[f"spot_{k}_per_hour_usd"])) for k in ("min", "avg", "max"))
        if not 0 < lo <= avg <= hi:
            raise ValueError(f"{path.name} line {n}: need 0 < min <= avg <= max, got {lo}, {avg}, {hi}")
        ranges[(itype, region)] = SpotRange(lo, avg, hi, row["interruption_band"])
    return ranges


def normalize_aws(
    rows: Iterable[Mapping[str, str]],
    report: BuildReport | None = None,
    ranges: Mapping[tuple[str, str], SpotRange] | None = None,
) -> list[Offer]:
    """Turn SkyPilot-v8 AWS rows (one per type per AZ ID) into offers.

    Args:
        rows: dicts with the snapshot columns ``InstanceType, AcceleratorName,
            AcceleratorCount, vCPUs, MemoryGiB, GpuInfo, Price, SpotPrice, Region,
            AvailabilityZone``.
        report: counts of dropped prices (spot above on-demand).
        ranges: dated regional spot ranges (:func:`load_aws_spot_ranges`). Where one exists
            for the type and region, the offer's spot price is the range's **maximum** (the
            highest price seen in the window: a budget at that price holds for every AZ of
            the region over the whole window, and the fleet's maximum spot price is set to it,
            so the bill never exceeds the budget's basis), capped at on-demand (a spot
            request's default maximum price, docs.aws.amazon.com/AWSEC2/latest/UserGuide/
            using-spot-instances.html); the min/max are carried and the date is the source's.
            The undated per-AZ snapshot price is used only where no range exists, dated
            "undated (imported ...)"; snapshot prices outside the dated range are counted.

    Returns:
        Offers sorted by (instance type, region, zone); rows with neither an on-demand nor a
        spot price are dropped (nothing to rent).
    """
    report = report if report is not None else BuildReport()
    offers = []
    for row in rows:
        memory_mib = _gpu_memory_mib(row["GpuInfo"])
        on_demand = parse_price(row["Price"]) or None  # 0 on AWS means "no price"
        spot = parse_price(row["SpotPrice"]) or None
        if spot is not None and on_demand is not None and spot > on_demand:
            report.count("aws spot price above on-demand (spot dropped)")
            spot = None
        if aws_spot_below_floor(on_demand, spot):
            report.count("aws spot price below 10% of on-demand, AWS's largest spot discount (spot dropped)")
            spot = None
        spot_date = UNDATED_SPOT
        spot_min = spot_max = None
        source = "all:skypilot-v8-aws"
        dated = (ranges or {}).get((row["InstanceType"], row["Region"]))
        if dated is not None:
            if spot is not None and not dated.min_usd <= spot <= dated.max_usd:
                report.count("aws undated spot price outside the dated regional range (replaced)")
            spot, spot_min, spot_max = dated.max_usd, dated.min_usd, dated.max_usd
            if on_demand is not None and spot > on_demand:
                report.count("aws dated spot maximum above on-demand (capped at on-demand)")
                spot = on_demand
            spot_date = AWS_SPOT_RANGE_DATE
            source = "on-demand:skypilot-v8-aws;spot:vantage-2025-11-30-spot"
        if on_demand is None and spot is None:
            continue
        offers.append(
            Offer(
                cloud="aws",
                instance_type=row["InstanceType"],
                gpu=aws_gpu_name(row["AcceleratorName"], memory_mib),
                gpu_count=int(float(row["AcceleratorCount"])),
                vcpus=float(row["vCPUs"]),
                memory_gib=float(row["MemoryGiB"]),
                region=row["Region"],
                zone=row["AvailabilityZone"],
                on_demand_price_per_hour_usd=on_demand,
                spot_price_per_hour_usd=spot,
                price_source=source,
                local_zone=is_local_zone(row["AvailabilityZone"]),
                spot_price_date=spot_date if spot is not None else "",
                spot_price_min_per_hour_usd=spot_min,
                spot_price_max_per_hour_usd=spot_max,
                spot_interruption_band=dated.interruption_band if dated is not None else "",
            )
        )
    return sorted(offers, key=lambda o: (o.instance_type, o.region, o.zone))


def _gcp_hosts_for(gpu: str, count: int, host_map: Mapping) -> list[str]:
    hosts = host_map.get(gpu, {}).get(str(count))
    if hosts is None:
        return []
    return [hosts] if isinstance(hosts, str) else list(hosts)


def load_gcp_on_demand(path: Path) -> dict[tuple[str, str], Decimal]:
    """Read ``gcp_on_demand.csv``: (machine type, region) -> on-demand USD per node-hour.

    Every row must name its source (``source_ref``) and the source's date (``source_date``).

    Raises:
        ValueError: a row without a source or date, a price <= 0, or a duplicate key.
    """
    prices: dict[tuple[str, str], Decimal] = {}
    for n, (machine_type, region), row in _cited_rows(path, ("machine_type", "region")):
        price = parse_price(row["price_per_hour_usd"])
        if price is None or price <= 0:
            raise ValueError(f"{path.name} line {n}: price must be > 0, got {row['price_per_hour_usd']!r}")
        prices[(machine_type, region)] = price
    return prices


def load_gcp_spot(path: Path) -> dict[tuple[str, str], Decimal]:
    """Read ``gcp_spot.csv``: (machine type, region) -> spot USD per node-hour (whole machine).

    Each row is ``hour_spot`` of ``compute.instance.<type>.cost.<region>`` in Cyclenerd's
    ``pricing.yml`` (``source_ref``), which already includes bundled Local SSD at the Spot VM
    rate (its ``build/pricing.pl``: ``$costs_spot + $costs_local_ssd_hour_spot``).

    Raises:
        ValueError: a row without a source or date, a price <= 0, ``hour_spot x 730`` that
            disagrees with the file's own ``month_spot`` (a transcription error), or a duplicate.
    """
    prices: dict[tuple[str, str], Decimal] = {}
    for n, (machine_type, region), row in _cited_rows(path, ("machine_type", "region")):
        hour, month = Decimal(row["spot_price_per_hour_usd"]), Decimal(row["spot_price_per_month_usd"])
        if hour <= 0 or abs(hour * HOURS_PER_MONTH - month) > Decimal("0.01"):
            raise ValueError(f"{path.name} line {n}: hour_spot {hour} x 730 != month_spot {month}")
        prices[(machine_type, region)] = quantize_price(hour)
    return prices


def normalize_gcp(
    rows: Iterable[Mapping[str, str]],
    curated: Mapping,
    gpu_types: Mapping[str, str],
    on_demand: Mapping[tuple[str, str], Decimal],
    local_ssd_spot_per_gib_month: Mapping[str, Decimal],
    report: BuildReport | None = None,
    dated_spot: Mapping[tuple[str, str], Decimal] | None = None,
) -> list[Offer]:
    """Combine GCP host rows and GPU rows of the same zone into machine offers.

    Args:
        rows: snapshot rows; GPU rows have an empty ``InstanceType`` and carry the price of
            ``AcceleratorCount`` GPUs; host rows carry the machine-type price.
        curated: parsed ``gcp_machine_facts.json`` (``host_gpu_map`` for bundled GPUs,
            ``n1_accelerator_limits`` for GPUs attached to N1 hosts).
        gpu_types: canonical GPU name -> Compute Engine accelerator type.
        on_demand: cited on-demand prices, (machine type, region) -> USD per node-hour
            (:func:`load_gcp_on_demand`).
        local_ssd_spot_per_gib_month: region -> Local SSD price for Spot VMs, added to the
            spot price of machines with bundled Local SSD.
        report: counts of dropped prices.
        dated_spot: dated spot prices, (machine type, region) -> USD per node-hour, whole
            machine (:func:`load_gcp_spot`). A machine type it prices takes its spot price
            only from there (dated); in a region it does not price, that type has no spot
            price (never the undated row). Types it does not price at all (N1 hosts with
            attached GPUs, A3 Ultra, A4) keep the undated host row + GPU row.

    Returns:
        One offer per (machine type, GPU, GPU count, zone) the snapshot lists with a price in
        some market:

        * on-demand: ``on_demand[(type, region)]`` for machines with bundled GPUs; host row +
          GPU row for N1 hosts with attached T4/V100/P100/P4 (those GPU SKUs have no DWS
          variant: N1 has no flex-start, cloud.google.com/compute/docs/gpus#n1-gpus);
        * spot: host row + GPU row (+ bundled Local SSD at the spot rate);
        * flex-start: none (the snapshot has no flex-start price for the whole machine;
          ``gpuinfra catalog refresh`` reads the DWS SKUs).

        N1 hosts are paired with T4/V100/P100/P4 counts whose vCPU and memory limits they
        satisfy (cloud.google.com/compute/docs/gpus#n1-gpus).
    """
    report = report if report is not None else BuildReport()
    dated_spot = dated_spot or {}
    dated_types = {t for t, _ in dated_spot}
    rows = list(rows)
    hosts: dict[tuple[str, str], Mapping[str, str]] = {}
    for row in rows:
        if row["InstanceType"]:
            hosts[(row["InstanceType"], row["AvailabilityZone"])] = row
    limits = curated["n1_accelerator_limits"]
    # hosts that take attached GPUs (N1), as the curated facts say
    n1_hosts = sorted({t for t, _ in hosts if (f := gcp_facts(t, curated)) is not None and f.guest_accelerators})
    offers = []
    for row in rows:
        if row["InstanceType"]:
            continue
        raw_gpu = row["AcceleratorName"]
        count = int(float(row["AcceleratorCount"]))
        gpu = "H100" if raw_gpu == "H100-MEGA" else raw_gpu
        attached = raw_gpu in limits
        if attached:
            limit = limits[raw_gpu].get(str(count))
            candidates = [
                h
                for h in n1_hosts
                if limit is not None
                and (h, row["AvailabilityZone"]) in hosts
                and float(hosts[(h, row["AvailabilityZone"])]["vCPUs"]) <= limit[0]
                and float(hosts[(h, row["AvailabilityZone"])]["MemoryGiB"]) <= limit[1]
            ]
            accelerator_type = gpu_types.get(gpu, "")
        else:
            candidates = _gcp_hosts_for(raw_gpu, count, curated["host_gpu_map"])
            accelerator_type = "nvidia-h100-mega-80gb" if raw_gpu == "H100-MEGA" else gpu_types.get(gpu, "")
        for machine_type in candidates:
            host = hosts.get((machine_type, row["AvailabilityZone"]))
            fact = gcp_facts(machine_type, curated)
            if host is None or fact is None:
                continue
            region = row["Region"]
            sources: dict[str, str] = {}
            if attached:
                od = add_prices(parse_price(host["Price"]), parse_price(row["Price"])) or None
                if od is not None:
                    sources["on_demand"] = "skypilot-v8-gcp"
            else:
                od = on_demand.get((machine_type, region))
                if od is not None:
                    sources["on_demand"] = "cyclenerd-2026-08-20"
                elif parse_price(row["Price"]) or parse_price(host["Price"]):
                    report.count("gcp on-demand price without a cited source (on-demand dropped)")
            spot = add_prices(parse_price(host["SpotPrice"]), parse_price(row["SpotPrice"])) or None
            bundled_gib = fact.local_ssd.bundled_count * fact.local_ssd.size_gib
            spot_source, spot_date = "skypilot-v8-gcp", UNDATED_SPOT
            if not attached and machine_type in dated_types:
                spot = dated_spot.get((machine_type, region))
                spot_source, spot_date = "cyclenerd-2026-07-30-spot", GCP_SPOT_DATE
                if spot is None:
                    report.count("gcp spot price without a dated source for the region (spot dropped)")
            elif spot is not None and bundled_gib:
                lssd = local_ssd_spot_per_gib_month.get(region)
                if lssd is None:
                    report.count("gcp spot price without a Local SSD spot price for the region (spot dropped)")
                    spot = None
                else:
                    spot = quantize_price(spot + Decimal(str(bundled_gib)) * lssd / HOURS_PER_MONTH)
            if spot is not None and od is not None and spot > od:
                report.count("gcp spot price above on-demand (spot dropped)")
                spot = None
            if spot is not None:
                sources["spot"] = spot_source
            if od is None and spot is None:
                continue
            offers.append(
                Offer(
                    cloud="gcp",
                    instance_type=machine_type,
                    gpu=gpu,
                    gpu_count=count,
                    vcpus=float(host["vCPUs"]),
                    memory_gib=float(host["MemoryGiB"]),
                    region=region,
                    zone=row["AvailabilityZone"],
                    on_demand_price_per_hour_usd=od,
                    spot_price_per_hour_usd=spot,
                    price_source=_sources(**sources),
                    accelerator_type=accelerator_type,
                    spot_price_date=spot_date if spot is not None else "",
                )
            )
    return sorted(offers, key=lambda o: (o.instance_type, o.gpu, o.gpu_count, o.region, o.zone))


def build_facts(
    aws_describe: Iterable[tuple[Mapping, str]], gcp_types: Iterable[str], curated: Mapping
) -> list[InstanceFacts]:
    """Instance facts for every AWS type described (item, source) and every GCP machine type
    offered, sorted by (cloud, type)."""
    facts = [aws_facts_from_describe(it, source) for it, source in aws_describe]
    facts += [f for f in (gcp_facts(t, curated) for t in sorted(set(gcp_types))) if f is not None]
    return sorted(facts, key=lambda f: (f.cloud, f.instance_type))


def write_catalog(
    out_dir: Path, offers: list[Offer], facts: list[InstanceFacts], meta: dict, reference: dict | None = None
) -> None:
    """Write ``offers.csv``, ``instance_types.json`` and ``catalog.json`` into ``out_dir``.

    The offers must pass every gate of :mod:`gpuinfra.catalog.gates` first; files are written
    to temporary names and renamed, so a failure leaves the previous catalog intact.

    Args:
        reference: us-central1 on-demand prices for the GCP gate when ``offers`` lack that
            region (:func:`gpuinfra.catalog.gates.reference_prices`).

    Raises:
        CatalogGateError: a gate failed; nothing was written.
    """
    import io

    check_offers(offers, reference)
    out_dir.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=OFFER_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for offer in offers:
        writer.writerow(offer.to_row())
    facts_doc = {"schema_version": CATALOG_SCHEMA_VERSION, "instance_types": [f.to_dict() for f in facts]}
    atomic_write_text(out_dir / "offers.csv", buf.getvalue())
    atomic_write_text(out_dir / "instance_types.json", json.dumps(facts_doc, indent=1) + "\n")
    atomic_write_text(out_dir / "catalog.json", json.dumps(meta, indent=2) + "\n")


def build_from_snapshot(snapshot_dir: Path) -> tuple[list[Offer], list[InstanceFacts], dict, BuildReport]:
    """Read the snapshot folder and return (offers, facts, metadata, report of drops)."""
    with open(snapshot_dir / "aws_vms.csv", newline="") as f:
        aws_rows = list(csv.DictReader(f))
    with open(snapshot_dir / "gcp_vms.csv", newline="") as f:
        gcp_rows = list(csv.DictReader(f))
    curated = load_gcp_curated_facts()
    describe = json.loads((snapshot_dir / "aws_describe_instance_types.json").read_text())
    extra = json.loads((snapshot_dir / "aws_extra_facts.json").read_text())
    gpu_types = {g.name: g.gcp_accelerator_type or "" for g in load_gpu_models()}
    report = BuildReport()
    on_demand = load_gcp_on_demand(snapshot_dir / "gcp_on_demand.csv")
    dated_spot = load_gcp_spot(snapshot_dir / "gcp_spot.csv")
    ranges = load_aws_spot_ranges(snapshot_dir / "aws_spot_range.csv")
    offers = normalize_aws(aws_rows, report, ranges) + normalize_gcp(
        gcp_rows,
        curated,
        gpu_types,
        on_demand,
        region_prices("gcp", "local_ssd_spot_per_gb_month"),
        report,
        dated_spot,
    )
    described = [(it, describe["_source"]) for it in describe["InstanceTypes"]]
    described += [(it, extra["_about"]) for it in extra["InstanceTypes"]]
    facts = build_facts(described, {o.instance_type for o in offers if o.cloud == "gcp"}, curated)
    used = set().union(*(price_source_keys(o.price_source) for o in offers))
    meta = {
        "schema_version": CATALOG_SCHEMA_VERSION,
        "catalog_date": IMPORT_DATE,
        "sources": {
            "aws": {
                "prices": PRICE_SOURCES["skypilot-v8-aws"]["source"]
                + "; spot where a dated regional range exists: "
                + PRICE_SOURCES["vantage-2025-11-30-spot"]["source"],
                "date": f"undated (imported {IMPORT_DATE}); spot ranges {AWS_SPOT_RANGE_DATE}",
                "facts": describe["_source"],
            },
            "gcp": {
                "prices": "on-demand: "
                + PRICE_SOURCES["cyclenerd-2026-08-20"]["source"]
                + "; spot: "
                + PRICE_SOURCES["cyclenerd-2026-07-30-spot"]["source"]
                + " (N1 hosts with attached GPUs, A3 Ultra, A4: "
                + PRICE_SOURCES["skypilot-v8-gcp"]["source"]
                + ")",
                "date": f"2026-08-20 (on-demand); 2026-07-30 (spot; N1-attached, A3 Ultra, A4 spot {UNDATED_SPOT})",
                "facts": "gpuinfra/catalog/data/gcp_machine_facts.json (curated, sources per family)",
            },
        },
        "price_sources": {k: v for k, v in PRICE_SOURCES.items() if k in used},
        "dropped_on_build": report.dropped,
        "built_by": "python -m gpuinfra.catalog.build",
    }
    return offers, facts, meta, report


def main() -> None:  # pragma: no cover - developer entry point
    """Rebuild the shipped catalog from ``data/snapshot`` (run from the repository root)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", type=Path, default=Path("data/snapshot"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    args = parser.parse_args()
    offers, facts, meta, report = build_from_snapshot(args.snapshot)
    write_catalog(args.out, offers, facts, meta)
    commitments = write_commitments(args.out, args.snapshot)
    print(f"wrote {len(offers)} offers, {len(facts)} instance types and {commitments} commitment prices to {args.out}")
    for line in report.lines():
        print(f"  {line}")


if __name__ == "__main__":  # pragma: no cover
    main()
