"""Non-compute price tables (``data/prices.yaml``) and usage defaults (``data/usage_defaults.yaml``).

Every price carries its source page and the date it was recorded. A region missing from a
table yields None ("price not found"), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

import yaml

from gpuinfra.errors import GpuinfraError

DATA_DIR = Path(__file__).parent / "data"
#: Infracost/AWS/GCP convention: a month is 730 hours.
HOURS_PER_MONTH = Decimal(730)
USAGE_KEYS = ("bucket_storage_gb", "internet_egress_gb", "nat_processed_gb")


@dataclass(frozen=True)
class Price:
    """A unit price with provenance."""

    usd: Decimal
    source: str
    date: str


@lru_cache(maxsize=1)
def _tables() -> dict:
    return yaml.safe_load((DATA_DIR / "prices.yaml").read_text())


def price(cloud: str, key: str, region: str) -> Price | None:
    """Unit price of ``key`` (e.g. ``ebs_gp3_per_gb_month``) in ``region``, or None if not in the table."""
    doc = _tables()
    table = doc[cloud][key]
    value = table.get("all", table.get("regions", {}).get(region))
    if value is None:
        return None
    return Price(usd=Decimal(str(value)), source=table["source"], date=str(doc["date"]))


def price_cap(cloud: str, key: str) -> Decimal | None:
    """An hourly cap on a price (Cloud NAT per-VM charge), if the table has one."""
    cap = _tables()[cloud][key].get("cap_per_hour")
    return None if cap is None else Decimal(str(cap))


class UsageError(GpuinfraError):
    """A usage file is unreadable or has unknown keys / negative values."""


@lru_cache(maxsize=1)
def _defaults() -> dict:
    return yaml.safe_load((DATA_DIR / "usage_defaults.yaml").read_text())


def usage_for(profile: str | None, usage_file: Path | None = None) -> dict[str, Decimal]:
    """Usage of one run: the profile's defaults, overridden by ``usage_file`` (YAML mapping).

    Raises:
        UsageError: the file is unreadable, not a mapping, has unknown keys or negative values.
    """
    usage = {k: Decimal(str(v)) for k, v in _defaults().get(profile or "", _defaults()["dev"]).items()}
    if usage_file is not None:
        try:
            doc = yaml.safe_load(Path(usage_file).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"cannot read usage file {usage_file}: {exc}") from None
        if not isinstance(doc, dict):
            raise UsageError(f"usage file {usage_file} must be a mapping of {', '.join(USAGE_KEYS)}")
        for key, value in doc.items():
            if key not in USAGE_KEYS:
                raise UsageError(f"unknown usage key {key!r} in {usage_file}; allowed: {', '.join(USAGE_KEYS)}")
            try:
                number = Decimal(str(value))
            except Exception:
                raise UsageError(f"usage {key} in {usage_file} must be a number, got {value!r}") from None
            if number < 0:
                raise UsageError(f"usage {key} in {usage_file} must be >= 0, got {value}")
            usage[key] = number
    return usage
