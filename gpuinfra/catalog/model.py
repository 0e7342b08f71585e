"""Typed rows of the gpuinfra catalog: offers (priced placements) and instance facts.

An *offer* is one instance/machine type in one zone with its on-demand and spot price per
node-hour. The hardware facts of a type (GPUs, NICs, local SSD, placement, provisioning
models) are :class:`gpuinfra.catalog.facts_model.InstanceFacts`.

Prices are :class:`decimal.Decimal` in USD per hour per node, rounded half-even to 1e-5 USD
(the snapshot carries float noise such as ``21.957642`` vs ``21.95764`` for one price;
data/snapshot/README.md, "Known defects"). ``None`` means "not offered for that pricing
model" -- never zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

PRICE_QUANTUM = Decimal("0.00001")

#: Version of the catalog folder layout: 2 = typed facts (networks, local SSD, placement,
#: provisioning models) and no per-row GPU memory (one value per GPU model in ``gpus.json``).
CATALOG_SCHEMA_VERSION = 2

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
    "host_on_demand_price_per_hour_usd",
    "host_spot_price_per_hour_usd",
    "accelerator_on_demand_price_per_hour_usd",
    "accelerator_spot_price_per_hour_usd",
    "accelerator_type",
    "local_zone",
)


def parse_price(text: str | None) -> Decimal | None:
    """Parse a price cell into USD/hour, or ``None`` when the cell is empty.

    Args:
        text: the cell as written in a CSV ("" or None for "not offered").

    Returns:
        The price rounded half-even to 1e-5 USD, or ``None``. A literal ``0`` is kept as
        ``Decimal(0)``; callers decide whether zero is meaningful for that column.

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
    return value.quantize(PRICE_QUANTUM, rounding=ROUND_HALF_EVEN)


def format_price(value: Decimal | None) -> str:
    """Write a price for the CSV: ``""`` for None, else a plain decimal string."""
    if value is None:
        return ""
    return format(value.quantize(PRICE_QUANTUM, rounding=ROUND_HALF_EVEN).normalize(), "f")


def add_prices(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    """Sum two price components; ``None`` (not offered) if either is missing."""
    if a is None or b is None:
        return None
    return a + b


@dataclass(frozen=True, slots=True)
class Offer:
    """One type in one zone, priced per node-hour.

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
        on_demand_price_per_hour_usd: per node; None when not sold on demand.
        spot_price_per_hour_usd: per node; None when no spot price is known.
        host_on_demand_price_per_hour_usd, host_spot_price_per_hour_usd: GCP only, the
            machine-type part of the price (None on AWS).
        accelerator_on_demand_price_per_hour_usd, accelerator_spot_price_per_hour_usd: GCP
            only, the GPU part of the price for all GPUs of one node.
        accelerator_type: GCP accelerator type name (``nvidia-tesla-t4``) for guest
            accelerators attached to N1 hosts and bundled ones; "" on AWS.
        local_zone: AWS Local Zone / Wavelength zone (excluded from ranking unless asked).
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
    host_on_demand_price_per_hour_usd: Decimal | None = None
    host_spot_price_per_hour_usd: Decimal | None = None
    accelerator_on_demand_price_per_hour_usd: Decimal | None = None
    accelerator_spot_price_per_hour_usd: Decimal | None = None
    accelerator_type: str = ""
    local_zone: bool = False

    @property
    def spot_not_discounted(self) -> bool:
        """True when a spot price exists but is not below on-demand (a data defect to flag).

        On GCP the host and GPU parts are checked separately: the snapshot has A100-80GB GPU
        rows whose spot price is above on-demand even where the machine total is discounted.
        """
        pairs = (
            (self.spot_price_per_hour_usd, self.on_demand_price_per_hour_usd),
            (self.host_spot_price_per_hour_usd, self.host_on_demand_price_per_hour_usd),
            (self.accelerator_spot_price_per_hour_usd, self.accelerator_on_demand_price_per_hour_usd),
        )
        return any(
            spot is not None and on_demand is not None and on_demand > 0 and spot >= on_demand
            for spot, on_demand in pairs
        )

    @property
    def gpu_memory_gib(self) -> float:
        """Memory of one GPU in GiB: the GPU model's one value (``gpus.json``)."""
        from gpuinfra.catalog.gpus import gpu_model

        return gpu_model(self.gpu).memory_gib

    def price_per_hour_usd(self, spot: bool) -> Decimal | None:
        """Per-node price for the pricing model asked for (None: not offered that way)."""
        return self.spot_price_per_hour_usd if spot else self.on_demand_price_per_hour_usd

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
            "host_on_demand_price_per_hour_usd": format_price(self.host_on_demand_price_per_hour_usd),
            "host_spot_price_per_hour_usd": format_price(self.host_spot_price_per_hour_usd),
            "accelerator_on_demand_price_per_hour_usd": format_price(
                self.accelerator_on_demand_price_per_hour_usd
            ),
            "accelerator_spot_price_per_hour_usd": format_price(
                self.accelerator_spot_price_per_hour_usd
            ),
            "accelerator_type": self.accelerator_type,
            "local_zone": "1" if self.local_zone else "0",
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
            host_on_demand_price_per_hour_usd=parse_price(row["host_on_demand_price_per_hour_usd"]),
            host_spot_price_per_hour_usd=parse_price(row["host_spot_price_per_hour_usd"]),
            accelerator_on_demand_price_per_hour_usd=parse_price(
                row["accelerator_on_demand_price_per_hour_usd"]
            ),
            accelerator_spot_price_per_hour_usd=parse_price(
                row["accelerator_spot_price_per_hour_usd"]
            ),
            accelerator_type=row["accelerator_type"],
            local_zone=row["local_zone"] == "1",
        )


def _fmt_float(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text or "0"
