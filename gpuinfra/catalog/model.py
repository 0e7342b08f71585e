"""Typed rows of the gpuinfra catalog: offers (priced placements) and instance facts.

An *offer* is one instance/machine type in one zone with its price per node-hour in each
market the cloud sells it in: on-demand, spot and flex-start (GCP's Dynamic Workload
Scheduler, priced from its own SKUs). The hardware facts of a type (GPUs, NICs, local SSD,
placement, provisioning models) are :class:`gpuinfra.catalog.facts_model.InstanceFacts`.

Prices are :class:`decimal.Decimal` in USD per hour per node, rounded half-even to 1e-5 USD
(the snapshot carries float noise such as ``21.957642`` vs ``21.95764`` for one price;
data/snapshot/README.md, "Known defects"). ``None`` means "no price known for that market"
-- never zero. A GCP price is the whole machine as billed: vCPUs, memory, GPUs and any
bundled Local SSD ("Google Cloud bills accelerator-optimized machine types for their attached
GPUs, predefined vCPU, memory, and bundled Local SSD", cloud.google.com/compute/docs/
accelerator-optimized-machines, "Pricing and consumption options").
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from gpuinfra.catalog.gpus import gpu_model

PRICE_QUANTUM = Decimal("0.00001")

#: Version of the catalog folder layout: 3 = one price per market (on-demand, spot,
#: flex-start) with a price source per offer; no host/GPU split.
CATALOG_SCHEMA_VERSION = 3

#: Markets an offer can be priced in. ``flex-start`` is GCP's Dynamic Workload Scheduler
#: (cloud.google.com/compute/docs/instances/about-flex-start-vms), priced separately.
MARKETS: tuple[str, ...] = ("on-demand", "spot", "flex-start")

#: Column order of the normalized offers CSV.
OFFER_COLUMNS: tuple[str, ...] = (
    "cloud",
    "instance_type",
    "gpu",
    "gpu_count",
    "vcpus",
    "memory_gib",
    "region",
    "zone",
    "on_demand_price_per_hour_usd",
    "spot_price_per_hour_usd",
    "flex_start_price_per_hour_usd",
    "price_source",
    "accelerator_type",
    "local_zone",
    "spot_price_date",
    "spot_price_min_per_hour_usd",
    "spot_price_max_per_hour_usd",
    "spot_interruption_band",
)


def parse_price(text: str | None) -> Decimal | None:
    """Parse a price cell into USD/hour, or ``None`` when the cell is empty.

    Args:
        text: the cell as written in a CSV ("" or None for "not offered").

    Returns:
        The price rounded half-even to 1e-5 USD, or ``None``. A literal ``0`` is kept as
        ``Decimal(0)``; callers decide whether zero is meaningful for that column (the
        catalog gates refuse it in a shipped catalog).

    Raises:
        ValueError: the cell is not a number or is negative.
    """
    if text is None or text.strip() == "":
        return None
    try:
        value = Decimal(text.strip())
    except InvalidOperation as exc:
        raise ValueError(f"not a price: {text!r}") from exc
    if value < 0 or not value.is_finite():
        raise ValueError(f"price must be a finite number >= 0, got {text!r}")
    return quantize_price(value)


def quantize_price(value: Decimal) -> Decimal:
    """Round a USD/hour amount half-even to the catalog's 1e-5 USD."""
    return value.quantize(PRICE_QUANTUM, rounding=ROUND_HALF_EVEN)


def format_price(value: Decimal | None) -> str:
    """Write a price for the CSV: ``""`` for None, else a plain decimal string."""
    if value is None:
        return ""
    return format(quantize_price(value).normalize(), "f")


def add_prices(*parts: Decimal | None) -> Decimal | None:
    """Sum price components; ``None`` (no price) if any is missing."""
    if any(p is None for p in parts):
        return None
    return sum((p for p in parts if p is not None), Decimal(0))


def price_source_keys(price_source: str) -> set[str]:
    """Source keys named by an offer's ``price_source`` (``"on-demand:a;spot:b"`` -> ``{a, b}``;
    ``"all:a"`` names one source for every market)."""
    return {part.split(":", 1)[1] for part in price_source.split(";") if ":" in part}


#: Spellings accepted for a market on the command line: the field's short names and the
#: catalog's market names.
MARKET_ALIASES: dict[str, str] = {
    "on-demand": "on-demand",
    "ondemand": "on-demand",
    "spot": "spot",
    "flex": "flex-start",
    "flex-start": "flex-start",
    "dws": "flex-start",
    # commitments: ranked by ``offers``, never provisioned (gpuinfra/catalog/commitments.py)
    "commit-1y": "commit-1y",
    "commit-3y": "commit-3y",
}


def parse_market(text: str) -> str | None:
    """The market named by ``text`` (``flex`` -> ``flex-start``), None when unknown."""
    return MARKET_ALIASES.get(text.strip().lower())


def check_market(market: str) -> str:
    """Return ``market`` when it is one of :data:`MARKETS`.

    Raises:
        ValueError: another value, naming the allowed ones.
    """
    if market not in MARKETS:
        raise ValueError(f"unknown market {market!r}; choose one of: {', '.join(MARKETS)}")
    return market


@dataclass(frozen=True, slots=True)
class Offer:
    """One type in one zone, priced per node-hour in each market.

    Attributes:
        cloud: ``"aws"`` or ``"gcp"``.
        instance_type: EC2 instance type or Compute Engine machine type (``p4d.24xlarge``,
            ``a2-highgpu-4g``, ``n1-standard-8``).
        gpu: canonical GPU model name from ``gpus.json`` (``A100``, ``A100-80GB``, ``H100``).
        gpu_count: GPUs per node.
        vcpus: vCPUs per node.
        memory_gib: host RAM per node in GiB.
        region: cloud region (``us-east-1``, ``us-central1``).
        zone: AWS Availability Zone **ID** (``use1-az4``; names like ``us-east-1a`` differ per
            account) or GCP zone name (``us-central1-a``).
        on_demand_price_per_hour_usd: per node; None when no on-demand price is known.
        spot_price_per_hour_usd: per node; None when no spot price is known.
        flex_start_price_per_hour_usd: per node (GCP flex-start / DWS); None when unknown.
        price_source: ``market:key`` pairs joined by ``;`` (``all:key`` for every market);
            each key names a source in ``catalog.json`` ``price_sources`` (which table, which
            date), so every price can be traced.
        accelerator_type: GCP accelerator type name (``nvidia-tesla-t4``) for guest
            accelerators attached to N1 hosts and bundled ones; "" on AWS.
        local_zone: AWS Local Zone / Wavelength zone (excluded from ranking unless asked).
        spot_price_date: the spot price's own source date (``2026-07-30``), or a text saying
            it is undated (``undated (imported 2026-11-22)``); "" when there is no spot price.
        spot_price_min_per_hour_usd / spot_price_max_per_hour_usd: the lowest / highest spot
            price the source saw over its window (``catalog refresh`` reads
            ``DescribeSpotPriceHistory`` over a window); None when the source gives one point.
        spot_interruption_band: AWS Spot Instance Advisor frequency of interruption for the
            type and region as the dated source gives it (``"<5%"``, ``"5-10%"``, ``"10-15%"``,
            ``"15-20%"``, ``">20%"`` of instances per month,
            aws.amazon.com/ec2/spot/instance-advisor/); "" when unknown (GCP publishes none).
    """

    cloud: str
    instance_type: str
    gpu: str
    gpu_count: int
    vcpus: float
    memory_gib: float
    region: str
    zone: str
    on_demand_price_per_hour_usd: Decimal | None
    spot_price_per_hour_usd: Decimal | None
    flex_start_price_per_hour_usd: Decimal | None = None
    price_source: str = ""
    accelerator_type: str = ""
    local_zone: bool = False
    spot_price_date: str = ""
    spot_price_min_per_hour_usd: Decimal | None = None
    spot_price_max_per_hour_usd: Decimal | None = None
    spot_interruption_band: str = ""

    @property
    def spot_not_discounted(self) -> bool:
        """True when a spot price exists but is not below on-demand (equal: no discount there)."""
        spot, on_demand = self.spot_price_per_hour_usd, self.on_demand_price_per_hour_usd
        return spot is not None and on_demand is not None and spot >= on_demand

    @property
    def gpu_memory_gib(self) -> float:
        """Memory of one GPU in GiB: the GPU model's one value (``gpus.json``)."""
        return gpu_model(self.gpu).memory_gib

    def price_per_hour_usd(self, market: str) -> Decimal | None:
        """Per-node price in ``market`` (one of :data:`MARKETS`); None: no price known.

        Raises:
            ValueError: ``market`` is not one of :data:`MARKETS`.
        """
        return {
            "on-demand": self.on_demand_price_per_hour_usd,
            "spot": self.spot_price_per_hour_usd,
            "flex-start": self.flex_start_price_per_hour_usd,
        }[check_market(market)]

    def to_row(self) -> dict[str, str]:
        """Serialize to the normalized CSV row (see :data:`OFFER_COLUMNS`)."""
        return {
            "cloud": self.cloud,
            "instance_type": self.instance_type,
            "gpu": self.gpu,
            "gpu_count": str(self.gpu_count),
            "vcpus": _fmt_float(self.vcpus),
            "memory_gib": _fmt_float(self.memory_gib),
            "region": self.region,
            "zone": self.zone,
            "on_demand_price_per_hour_usd": format_price(self.on_demand_price_per_hour_usd),
            "spot_price_per_hour_usd": format_price(self.spot_price_per_hour_usd),
            "flex_start_price_per_hour_usd": format_price(self.flex_start_price_per_hour_usd),
            "price_source": self.price_source,
            "accelerator_type": self.accelerator_type,
            "local_zone": "1" if self.local_zone else "0",
            "spot_price_date": self.spot_price_date,
            "spot_price_min_per_hour_usd": format_price(self.spot_price_min_per_hour_usd),
            "spot_price_max_per_hour_usd": format_price(self.spot_price_max_per_hour_usd),
            "spot_interruption_band": self.spot_interruption_band,
        }

    @classmethod
    def from_row(cls, row: dict[str, str]) -> Offer:
        """Parse one normalized CSV row.

        Raises:
            ValueError: a numeric cell does not parse.
        """
        return cls(
            cloud=row["cloud"],
            instance_type=row["instance_type"],
            gpu=row["gpu"],
            gpu_count=int(row["gpu_count"]),
            vcpus=float(row["vcpus"]),
            memory_gib=float(row["memory_gib"]),
            region=row["region"],
            zone=row["zone"],
            on_demand_price_per_hour_usd=parse_price(row["on_demand_price_per_hour_usd"]),
            spot_price_per_hour_usd=parse_price(row["spot_price_per_hour_usd"]),
            flex_start_price_per_hour_usd=parse_price(row["flex_start_price_per_hour_usd"]),
            price_source=row["price_source"],
            accelerator_type=row["accelerator_type"],
            local_zone=row["local_zone"] == "1",
            spot_price_date=row.get("spot_price_date") or "",
            spot_price_min_per_hour_usd=parse_price(row.get("spot_price_min_per_hour_usd")),
            spot_price_max_per_hour_usd=parse_price(row.get("spot_price_max_per_hour_usd")),
            spot_interruption_band=row.get("spot_interruption_band") or "",
        )


def _fmt_float(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text or "0"
