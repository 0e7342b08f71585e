"""Build the normalized catalog from the public price snapshot (SkyPilot catalog v8 schema).

Input: ``data/snapshot/`` in the repository (copied from ``shared/data/catalog`` with its
README giving provenance and known defects) plus the instance-fact inputs beside it.
Output: the package data in ``gpuinfra/catalog/data/`` (``offers.csv``,
``instance_types.json``, ``catalog.json``).

Run ``python -m gpuinfra.catalog.build`` after changing the snapshot; a test checks that the
shipped files equal a fresh build byte for byte.

Defects handled on purpose (snapshot README, "Known defects"):

* a missing price means "not offered for that pricing model" and stays ``None``;
* a4-highgpu-8g host rows priced ``0.0`` are a real component of a bundle whose GPU row
  carries the whole price, so the GCP total (host + GPU) is right; a zero *total* would be
  dropped;
* spot not below on-demand is kept and flagged (:attr:`Offer.spot_not_discounted`);
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
from pathlib import Path

from gpuinfra.catalog.facts import aws_facts_from_describe, aws_gpu_name, gcp_facts
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.model import CATALOG_SCHEMA_VERSION, Offer, add_prices, parse_price

#: A regular AZ ID: ``use1-az4``. Local Zones (``usw2-lax1-az1``) and Wavelength zones
#: (``use1-wl1-bos-wlz1``) have more dash-separated parts.
#: Source: docs.aws.amazon.com/ram/latest/userguide/working-with-az-ids.html and
#: docs.aws.amazon.com/local-zones/latest/ug/available-local-zones.html.
_REGULAR_AZ_ID = re.compile(r"^[a-z]{2,}\d+-az\d+$")

SNAPSHOT_SOURCE = (
    "skypilot-org/skypilot-catalog catalogs/v8 (aws/vms.csv @00148f2a, gcp/vms.csv @006059e0), "
    "GPU rows transcribed into shared/data/catalog"
)
#: Date the snapshot was imported into gpuinfra. Upstream commit dates are unknown
#: (snapshot README: "treat the snapshot as late 2026").
SNAPSHOT_DATE = "2026-11-22"

def is_local_zone(zone_id: str) -> bool:
    """True for AWS Local Zone / Wavelength zone IDs (``usw2-lax1-az1``), False for ``use1-az1``."""
    return not _REGULAR_AZ_ID.match(zone_id)


def _gpu_memory_mib(gpu_info: str) -> int:
    info = ast.literal_eval(gpu_info) if gpu_info else {}
    gpus = info.get("Gpus") or [{}]
    return int(gpus[0].get("MemoryInfo", {}).get("SizeInMiB", 0))


def normalize_aws(rows: Iterable[Mapping[str, str]]) -> list[Offer]:
    """Turn SkyPilot-v8 AWS rows (one per type per AZ ID) into offers.

    Args:
        rows: dicts with the snapshot columns ``InstanceType, AcceleratorName,
            AcceleratorCount, vCPUs, MemoryGiB, GpuInfo, Price, SpotPrice, Region,
            AvailabilityZone``.

    Returns:
        Offers sorted by (instance type, region, zone); rows with neither an on-demand nor a
        spot price are dropped (nothing to rent).
    """
    offers = []
    for row in rows:
        memory_mib = _gpu_memory_mib(row["GpuInfo"])
        on_demand = parse_price(row["Price"]) or None  # 0 on AWS means "no price"
        spot = parse_price(row["SpotPrice"]) or None
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
                local_zone=is_local_zone(row["AvailabilityZone"]),
            )
        )
    return sorted(offers, key=lambda o: (o.instance_type, o.region, o.zone))


def _gcp_hosts_for(gpu: str, count: int, host_map: Mapping) -> list[str]:
    hosts = host_map.get(gpu, {}).get(str(count))
    if hosts is None:
        return []
    return [hosts] if isinstance(hosts, str) else list(hosts)


def normalize_gcp(
    rows: Iterable[Mapping[str, str]], curated: Mapping, gpu_types: Mapping[str, str]
) -> list[Offer]:
    """Combine GCP host rows and GPU rows of the same zone into machine offers.

    Args:
        rows: snapshot rows; GPU rows have an empty ``InstanceType`` and carry the price of
            ``AcceleratorCount`` GPUs; host rows carry the machine-type price.
        curated: parsed ``gcp_machine_facts.json`` (``host_gpu_map`` for bundled GPUs,
            ``n1_accelerator_limits`` for GPUs attached to N1 hosts).
        gpu_types: canonical GPU name -> Compute Engine accelerator type.

    Returns:
        One offer per (machine type, GPU, GPU count, zone) where both rows exist. The price
        is host + GPU (snapshot README: "The price of a GPU machine is its host row plus the
        GPU row for the same zone"). N1 hosts are paired with T4/V100/P100/P4 counts whose
        vCPU and memory limits they satisfy (cloud.google.com/compute/docs/gpus#n1-gpus).
    """
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
        if raw_gpu in limits:
            limit = limits[raw_gpu].get(str(count))
            candidates = [
                h for h in n1_hosts
                if limit is not None
                and (h, row["AvailabilityZone"]) in hosts
                and float(hosts[(h, row["AvailabilityZone"])]["vCPUs"]) <= limit[0]
                and float(hosts[(h, row["AvailabilityZone"])]["MemoryGiB"]) <= limit[1]
            ]
            accelerator_type = gpu_types.get(gpu, "")
        else:
            candidates = _gcp_hosts_for(raw_gpu, count, curated["host_gpu_map"])
            accelerator_type = (
                "nvidia-h100-mega-80gb" if raw_gpu == "H100-MEGA" else gpu_types.get(gpu, "")
            )
        for machine_type in candidates:
            host = hosts.get((machine_type, row["AvailabilityZone"]))
            if host is None or gcp_facts(machine_type, curated) is None:
                continue
            gpu_od, gpu_spot = parse_price(row["Price"]), parse_price(row["SpotPrice"])
            host_od, host_spot = parse_price(host["Price"]), parse_price(host["SpotPrice"])
            on_demand = add_prices(host_od, gpu_od)
            spot = add_prices(host_spot, gpu_spot)
            on_demand = on_demand if on_demand else None  # a zero total is not a price
            spot = spot if spot else None
            if on_demand is None and spot is None:
                continue
            offers.append(
                Offer(
                    cloud="gcp",
                    instance_type=machine_type,
                    gpu=gpu,
                    gpu_count=count,
                    vcpus=float(host["vCPUs"]),
                    memory_gib=float(host["MemoryGiB"]),
                    region=row["Region"],
                    zone=row["AvailabilityZone"],
                    on_demand_price_per_hour_usd=on_demand,
                    spot_price_per_hour_usd=spot,
                    host_on_demand_price_per_hour_usd=host_od,
                    host_spot_price_per_hour_usd=host_spot,
                    accelerator_on_demand_price_per_hour_usd=gpu_od,
                    accelerator_spot_price_per_hour_usd=gpu_spot,
                    accelerator_type=accelerator_type,
                )
            )
    return sorted(offers, key=lambda o: (o.instance_type, o.gpu, o.gpu_count, o.region, o.zone))


def build_facts(aws_describe: Iterable[tuple[Mapping, str]], gcp_types: Iterable[str],
                curated: Mapping) -> list[InstanceFacts]:
    """Instance facts for every AWS type described (item, source) and every GCP machine type
    offered, sorted by (cloud, type)."""
    facts = [aws_facts_from_describe(it, source) for it, source in aws_describe]
    facts += [f for f in (gcp_facts(t, curated) for t in sorted(set(gcp_types))) if f is not None]
    return sorted(facts, key=lambda f: (f.cloud, f.instance_type))


def write_catalog(out_dir: Path, offers: list[Offer], facts: list[InstanceFacts], meta: dict) -> None:
    """Write ``offers.csv``, ``instance_types.json`` and ``catalog.json`` into ``out_dir``.

    Files are written to temporary names first and renamed, so a failure leaves the previous
    catalog intact.
    """
    from gpuinfra.catalog.model import OFFER_COLUMNS
    from gpuinfra.fsutil import atomic_write_text
    import io

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


def build_from_snapshot(snapshot_dir: Path) -> tuple[list[Offer], list[InstanceFacts], dict]:
    """Read the snapshot folder and return (offers, facts, metadata)."""
    from gpuinfra.catalog.store import load_gcp_curated_facts

    with open(snapshot_dir / "aws_vms.csv", newline="") as f:
        aws_rows = list(csv.DictReader(f))
    with open(snapshot_dir / "gcp_vms.csv", newline="") as f:
        gcp_rows = list(csv.DictReader(f))
    curated = load_gcp_curated_facts()
    describe = json.loads((snapshot_dir / "aws_describe_instance_types.json").read_text())
    extra = json.loads((snapshot_dir / "aws_extra_facts.json").read_text())
    from gpuinfra.catalog.store import load_gpu_models

    gpu_types = {g.name: g.gcp_accelerator_type or "" for g in load_gpu_models()}
    offers = normalize_aws(aws_rows) + normalize_gcp(gcp_rows, curated, gpu_types)
    described = [(it, describe["_source"]) for it in describe["InstanceTypes"]]
    described += [(it, extra["_about"]) for it in extra["InstanceTypes"]]
    facts = build_facts(described, {o.instance_type for o in offers if o.cloud == "gcp"}, curated)
    meta = {
        "schema_version": CATALOG_SCHEMA_VERSION,
        "catalog_date": SNAPSHOT_DATE,
        "sources": {
            "aws": {"prices": SNAPSHOT_SOURCE, "date": SNAPSHOT_DATE, "facts": describe["_source"]},
            "gcp": {"prices": SNAPSHOT_SOURCE, "date": SNAPSHOT_DATE, "facts": "gpuinfra/catalog/data/gcp_machine_facts.json (curated, sources per family)"},
        },
        "built_by": "python -m gpuinfra.catalog.build",
    }
    return offers, facts, meta


def main() -> None:  # pragma: no cover - developer entry point
    """Rebuild the shipped catalog from ``data/snapshot`` (run from the repository root)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", type=Path, default=Path("data/snapshot"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    args = parser.parse_args()
    offers, facts, meta = build_from_snapshot(args.snapshot)
    write_catalog(args.out, offers, facts, meta)
    print(f"wrote {len(offers)} offers and {len(facts)} instance types to {args.out}")


if __name__ == "__main__":  # pragma: no cover
    main()
