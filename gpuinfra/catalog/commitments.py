"""Commitment prices: 1-year and 3-year committed hourly rates per type and region.

A commitment is a **billing construct, not a provisioning model**: the nodes are ordinary
on-demand VMs, and the commitment changes what their hours cost in exchange for paying for
every hour of the term whether a VM runs or not (AWS: docs.aws.amazon.com/savingsplans/latest/
userguide/what-is-savings-plans.html; GCP: cloud.google.com/compute/docs/instances/
signing-up-committed-use-discounts). So the
markets ``commit-1y`` / ``commit-3y`` rank offers (``gpuinfra offers --market commit-1y``) and
``gpuinfra cost`` shows an on-demand stack's commitment view, but no stack is *provisioned* in
them: ``new`` stays on-demand.

The markets, precisely:

* AWS: **EC2 Standard Reserved Instance, regional, no upfront, Linux/UNIX**
  (Vantage's ``linux.reserved`` ``yrTerm1Standard.noUpfront`` / ``yrTerm3Standard.noUpfront``,
  USD per instance-hour). Chosen because it is the only commitment rate the dated public
  source carries per type and region (Vantage's extract has no Savings Plans rates), and it is
  the deepest no-upfront commitment (Convertible RIs cost more). An EC2 Instance Savings Plan
  has its own rate table: it is not given here. Some types have no 1-year standard rate in the
  source (p5.48xlarge in us-east-1): they stay unpriced.
* GCP: **resource-based committed use discount (1 or 3 years)** of the whole machine (vCPU,
  memory, bundled GPUs, bundled Local SSD), from Cyclenerd's ``pricing.yml`` ``month_1y`` /
  ``month_3y``, converted to hourly with the file's own 730 hours per month (its build script
  ``build/pricing.pl`` option ``hours``: "DEFAULT: 730, same as Google Cloud Pricing
  Calculator"). Only machine types with bundled GPUs (A2, A3, A4, G2): an N1 host's CUD does
  not include its attached GPUs, so N1 + T4/V100 stays unpriced.

Inputs (trimmed, vendored, each with its ``_source`` and date) live in ``data/snapshot/``:
``aws_reserved.json`` and ``gcp_commitments.json``; :func:`trim_aws` / :func:`trim_gcp` make
them from the upstream files (``python -m gpuinfra.catalog.commitments --aws RAW.json --gcp
pricing.yml``), :func:`build_commitments` turns them into ``gpuinfra/catalog/data/
commitments.csv`` (run by ``python -m gpuinfra.catalog.build``; a test checks the shipped file
equals a fresh build).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from gpuinfra.catalog.model import parse_price, quantize_price
from gpuinfra.fsutil import atomic_write_text

#: The commitment markets (ranked by ``offers``, shown by ``cost``; never provisioned).
COMMITMENT_MARKETS: tuple[str, ...] = ("commit-1y", "commit-3y")

#: Hours a commitment obliges you to pay for: a year is 365 x 24 h (EC2 reservation terms are
#: "the number of seconds in a year (365x24x60x60) times one of the supported durations (1 or
#: 3)": docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeHostReservationOfferings.html;
#: GCP commitments run 1 or 3 years, cloud.google.com/compute/docs/instances/
#: signing-up-committed-use-discounts).
TERM_HOURS: dict[str, int] = {"commit-1y": 8760, "commit-3y": 26280}

#: Hours per month of the GCP source's monthly figures (Cyclenerd build/pricing.pl ``hours``).
GCP_SOURCE_HOURS_PER_MONTH = Decimal(730)

#: Vantage reserved keys of the AWS market chosen (see the module docstring).
AWS_RESERVED_KEYS: dict[str, str] = {
    "commit-1y": "yrTerm1Standard.noUpfront",
    "commit-3y": "yrTerm3Standard.noUpfront",
}

#: Cyclenerd cost keys of the GCP market.
GCP_COMMIT_KEYS: dict[str, str] = {"commit-1y": "month_1y", "commit-3y": "month_3y"}

#: GCP machine families whose machine price includes the GPUs (accelerator-optimized).
GCP_BUNDLED_GPU_FAMILIES: tuple[str, ...] = ("a2-", "a3-", "a4-", "g2-")

#: What each market is called in output.
MARKET_NAMES: dict[str, str] = {
    "aws": "EC2 Standard Reserved Instance, regional, no upfront, Linux",
    "gcp": "Compute Engine resource-based committed use discount",
}

COMMITMENT_COLUMNS: tuple[str, ...] = (
    "cloud",
    "instance_type",
    "region",
    "market",
    "price_per_hour_usd",
    "source_on_demand_per_hour_usd",
    "source",
)

#: Keys of the two sources in ``commitments.csv`` ``source`` (``key:field``) and in
#: ``commitments.json`` (provenance per key).
AWS_KEY = "vantage-ri-2025-11-30"
GCP_KEY = "cyclenerd-cud-2026-07-30"


@dataclass(frozen=True, slots=True)
class CommitmentPrice:
    """One committed hourly rate.

    Attributes:
        cloud, instance_type, region: where it applies (per region: AWS regional RIs and GCP
            CUDs are regional).
        market: ``commit-1y`` or ``commit-3y``.
        price_per_hour_usd: committed USD per node-hour (AWS: the RI's effective hourly rate
            with no upfront; GCP: ``month_Ny`` / 730).
        source_on_demand_per_hour_usd: the same source's on-demand rate, to compare with the
            catalog's (a commitment is only shown against the on-demand price it discounts).
        source: ``key:field``: the key names a source in ``commitments.json`` (repository @
            commit, path, date), the field is where in that file the rate is.
    """

    cloud: str
    instance_type: str
    region: str
    market: str
    price_per_hour_usd: Decimal
    source_on_demand_per_hour_usd: Decimal
    source: str

    @property
    def source_key(self) -> str:
        """The key of the source in ``commitments.json``."""
        return self.source.split(":", 1)[0]

    @property
    def term_hours(self) -> int:
        """Hours of the term (8,760 or 26,280)."""
        return TERM_HOURS[self.market]

    @property
    def obligation_usd(self) -> Decimal:
        """What the commitment costs per node over its whole term, used or not."""
        return self.price_per_hour_usd * self.term_hours

    def to_row(self) -> dict[str, str]:
        """The CSV row (:data:`COMMITMENT_COLUMNS`)."""
        return {
            "cloud": self.cloud,
            "instance_type": self.instance_type,
            "region": self.region,
            "market": self.market,
            "price_per_hour_usd": format(self.price_per_hour_usd.normalize(), "f"),
            "source_on_demand_per_hour_usd": format(self.source_on_demand_per_hour_usd.normalize(), "f"),
            "source": self.source,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, str]) -> CommitmentPrice:
        """Parse one CSV row.

        Raises:
            ValueError: a missing or non-positive price, unknown market, or no source/date.
        """
        price = parse_price(row["price_per_hour_usd"])
        basis = parse_price(row["source_on_demand_per_hour_usd"])
        if price is None or price <= 0 or basis is None or basis <= 0:
            raise ValueError(f"commitment row without a positive price: {dict(row)}")
        if row["market"] not in COMMITMENT_MARKETS or ":" not in row["source"]:
            raise ValueError(f"commitment row without a known market and source: {dict(row)}")
        return cls(row["cloud"], row["instance_type"], row["region"], row["market"], price, basis, row["source"])


def trim_aws(raw: list[dict], instance_types: Iterable[str], source: str, source_date: str) -> dict:
    """Keep from Vantage's ``instances.json`` extract only what the commitment build reads.

    Args:
        raw: the extract (a list of instance dicts with ``pricing[region]["linux"]``).
        instance_types: AWS types to keep (the catalog's GPU types).
        source, source_date: provenance written into the trimmed file.

    Returns:
        ``{"_source", "_date", "prices": {type: {region: {"ondemand", <reserved keys>}}}}``.
    """
    wanted = set(instance_types)
    prices: dict[str, dict[str, dict[str, str]]] = {}
    for item in raw:
        if item["instance_type"] not in wanted:
            continue
        for region, by_os in sorted(item.get("pricing", {}).items()):
            linux = by_os.get("linux") or {}
            reserved = linux.get("reserved") or {}
            kept = {k: reserved[k] for k in AWS_RESERVED_KEYS.values() if k in reserved}
            if kept and linux.get("ondemand"):
                prices.setdefault(item["instance_type"], {})[region] = {"ondemand": linux["ondemand"], **kept}
    return {"_source": source, "_date": source_date, "prices": dict(sorted(prices.items()))}


def trim_gcp(pricing: Mapping, source: str) -> dict:
    """Keep from Cyclenerd's ``pricing.yml`` (parsed) the bundled-GPU machines' ``hour``,
    ``month_1y`` and ``month_3y`` per region, with the file's ``about.generated`` date."""
    prices: dict[str, dict[str, dict[str, str]]] = {}
    for machine, entry in sorted(pricing["compute"]["instance"].items()):
        if not machine.startswith(GCP_BUNDLED_GPU_FAMILIES) or not isinstance(entry.get("cost"), dict):
            continue
        for region, cost in sorted(entry["cost"].items()):
            kept = {k: repr(cost[k]) for k in ("hour", *GCP_COMMIT_KEYS.values()) if k in cost}
            if "hour" in kept and len(kept) > 1:
                prices.setdefault(machine, {})[region] = kept
    generated = str(pricing["about"]["generated"])
    return {
        "_source": f"{source} (about.generated: {generated})",
        "_date": datetime.strptime(generated, "%a %b %d %H:%M:%S %Y").date().isoformat(),
        "_hours_per_month": str(GCP_SOURCE_HOURS_PER_MONTH),
        "prices": prices,
    }


def build_commitments(snapshot_dir: Path) -> list[CommitmentPrice]:
    """Commitment prices from the trimmed inputs in ``snapshot_dir`` (see module docstring).

    Returns:
        Sorted by (cloud, type, region, market); a (type, region, market) the source does not
        price has no row (unpriced, never zero).
    """
    out: list[CommitmentPrice] = []
    aws = json.loads((snapshot_dir / "aws_reserved.json").read_text())
    for itype, regions in aws["prices"].items():
        for region, cell in regions.items():
            for market, key in AWS_RESERVED_KEYS.items():
                price = parse_price(cell.get(key))
                if price:
                    field = f"[{itype}].pricing.{region}.linux.reserved.{key}"
                    basis = parse_price(cell["ondemand"]) or Decimal(0)
                    out.append(CommitmentPrice("aws", itype, region, market, price, basis, f"{AWS_KEY}:{field}"))
    gcp = json.loads((snapshot_dir / "gcp_commitments.json").read_text())
    hours = Decimal(gcp["_hours_per_month"])
    for machine, regions in gcp["prices"].items():
        for region, cell in regions.items():
            for market, key in GCP_COMMIT_KEYS.items():
                if key not in cell:
                    continue
                price = quantize_price(Decimal(cell[key]) / hours)
                field = f"compute.instance.{machine}.cost.{region}.{key} / {hours}"
                basis = quantize_price(Decimal(cell["hour"]))
                out.append(CommitmentPrice("gcp", machine, region, market, price, basis, f"{GCP_KEY}:{field}"))
    return sorted(out, key=lambda c: (c.cloud, c.instance_type, c.region, c.market))


def commitment_sources(snapshot_dir: Path) -> dict[str, dict[str, str]]:
    """Provenance of each source key (``commitments.json``): market, source file, its date."""
    aws = json.loads((snapshot_dir / "aws_reserved.json").read_text())
    gcp = json.loads((snapshot_dir / "gcp_commitments.json").read_text())
    return {
        AWS_KEY: {"market": MARKET_NAMES["aws"], "source": aws["_source"], "date": aws["_date"]},
        GCP_KEY: {
            "market": MARKET_NAMES["gcp"] + f" (monthly figure / {gcp['_hours_per_month']} h)",
            "source": gcp["_source"],
            "date": gcp["_date"],
        },
    }


def commitments_csv(prices: Iterable[CommitmentPrice]) -> str:
    """The text of ``commitments.csv``."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COMMITMENT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for p in prices:
        writer.writerow(p.to_row())
    return buf.getvalue()


@dataclass(frozen=True)
class Commitments:
    """The commitment table of a catalog folder.

    Attributes:
        prices: (cloud, type, region, market) -> :class:`CommitmentPrice`.
        sources: source key -> ``{"market", "source", "date"}`` (``commitments.json``).
    """

    prices: Mapping[tuple[str, str, str, str], CommitmentPrice]
    sources: Mapping[str, Mapping[str, str]]

    def price(self, cloud: str, instance_type: str, region: str, market: str) -> CommitmentPrice | None:
        """The committed rate, or None when no cited source prices it (never zero)."""
        return self.prices.get((cloud, instance_type, region, market))

    def source_of(self, price: CommitmentPrice) -> Mapping[str, str]:
        """``{"market", "source", "date"}`` of a price's source."""
        return self.sources[price.source_key]


def read_commitments(folder: Path) -> Commitments:
    """Read ``commitments.csv`` and ``commitments.json`` from a catalog folder; an empty table
    when the folder has none (a folder written by an older ``catalog refresh``).

    Raises:
        ValueError: a malformed row or a row whose source key has no provenance.
    """
    if not (folder / "commitments.csv").is_file():
        return Commitments({}, {})
    sources = json.loads((folder / "commitments.json").read_text())["sources"]
    with open(folder / "commitments.csv", newline="") as f:
        rows = [CommitmentPrice.from_row(r) for r in csv.DictReader(f)]
    unknown = {r.source_key for r in rows} - set(sources)
    if unknown:
        raise ValueError(f"commitments.csv names sources without provenance: {sorted(unknown)}")
    return Commitments({(r.cloud, r.instance_type, r.region, r.market): r for r in rows}, sources)


def write_commitments(out_dir: Path, snapshot_dir: Path) -> int:
    """Write ``commitments.csv`` and ``commitments.json`` into ``out_dir``; returns the row count."""
    prices = build_commitments(snapshot_dir)
    doc = {
        "what": "committed USD per node-hour; the nodes stay on-demand VMs (a billing construct)",
        "term_hours": TERM_HOURS,
        "sources": commitment_sources(snapshot_dir),
        "built_by": "python -m gpuinfra.catalog.build",
    }
    atomic_write_text(out_dir / "commitments.csv", commitments_csv(prices))
    atomic_write_text(out_dir / "commitments.json", json.dumps(doc, indent=2) + "\n")
    return len(prices)


def main() -> None:  # pragma: no cover - developer entry point
    """Trim the upstream files into ``data/snapshot`` (run from the repository root)."""
    import argparse

    import yaml

    parser = argparse.ArgumentParser(description="trim commitment sources into data/snapshot")
    parser.add_argument("--aws", type=Path, required=True, help="tsaol/aws-gpu data/gpu_instances_raw.json")
    parser.add_argument("--aws-source", required=True)
    parser.add_argument("--aws-date", required=True)
    parser.add_argument("--gcp", type=Path, required=True, help="Cyclenerd pricing.yml")
    parser.add_argument("--gcp-source", required=True)
    parser.add_argument("--snapshot", type=Path, default=Path("data/snapshot"))
    args = parser.parse_args()
    with open(args.snapshot / "aws_vms.csv", newline="") as f:
        aws_types = {r["InstanceType"] for r in csv.DictReader(f)}
    aws = trim_aws(json.loads(args.aws.read_text()), aws_types, args.aws_source, args.aws_date)
    (args.snapshot / "aws_reserved.json").write_text(json.dumps(aws, indent=1, sort_keys=True) + "\n")
    gcp = trim_gcp(yaml.safe_load(args.gcp.read_text()), args.gcp_source)
    (args.snapshot / "gcp_commitments.json").write_text(json.dumps(gcp, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":  # pragma: no cover
    main()
