"""Non-compute price tables (``data/prices.yaml``) and usage defaults (``data/usage_defaults.yaml``).

``prices.yaml`` is typed (:class:`PriceBook`): every table has a unit and a description, and
every price group inside it names the source it was read from and that source's own date.
A region missing from a table yields None ("price not found"), never zero.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from gpuinfra.errors import UsageError
from gpuinfra.userfile import read_user_file

DATA_DIR = Path(__file__).parent / "data"
#: Infracost/AWS/GCP convention: a month is 730 hours.
HOURS_PER_MONTH = Decimal(730)
USAGE_KEYS = ("bucket_storage_gb", "internet_egress_gb", "nat_processed_gb")
#: Largest usage quantity a usage file may give, in GB: 10^9 GB is an exabyte, beyond any one
#: training run, and keeps every product with a price exact in Decimal arithmetic.
MAX_USAGE_QUANTITY = 1_000_000_000
#: GB one node pulls from nvcr.io at boot: the compressed layers of the NGC PyTorch container
#: (registries store and send compressed layers; ``aws ecr describe-images`` ``imageSizeInBytes``
#: of the baked copy). Every node pulls it, so the NAT data it causes scales with the nodes; the
#: bake's registry copy (:mod:`gpuinfra.bake.cost`) is the same layers.
CONTAINER_PULL_GB = Decimal(15)


@dataclass(frozen=True)
class Price:
    """A unit price with provenance (``source``: page or file read; ``date``: its date)."""

    usd: Decimal
    source: str
    date: str


class PriceGroup(BaseModel):
    """Prices read from one source: per region, or one value for every region (``all``).

    ``date`` is the source's own date (its generation date, the Price List offer's effective
    date); ``null`` when the page read states none (shown as "undated").

    Raises (on load):
        pydantic.ValidationError: neither or both of ``regions``/``all``, or a value <= 0.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    date: dt.date | None
    regions: dict[str, Decimal] | None = None
    all: Decimal | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> PriceGroup:
        if (self.regions is None) == (self.all is None):
            raise ValueError(f"give exactly one of regions / all (source {self.source})")
        values = list((self.regions or {}).values()) + ([self.all] if self.all is not None else [])
        if any(v <= 0 for v in values):
            raise ValueError(f"prices must be > 0 (source {self.source}); leave a free item out of the table")
        return self

    @field_validator("source")
    @classmethod
    def _source_is_a_page(cls, value: str) -> str:
        if not value.startswith(("https://", "github.com/")):
            raise ValueError(f"source must be a URL or a github.com path, got {value!r}")
        return value


class PriceTable(BaseModel):
    """One priced item (``pd_balanced_per_gb_month``) over one or more source groups."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: str
    what: str
    prices: list[PriceGroup]
    cap_per_hour: Decimal | None = None

    @model_validator(mode="after")
    def _regions_once(self) -> PriceTable:
        seen: set[str] = set()
        for group in self.prices:
            for region in group.regions or {}:
                if region in seen:
                    raise ValueError(f"region {region} appears in two groups of {self.what!r}")
                seen.add(region)
        if sum(g.all is not None for g in self.prices) > 1:
            raise ValueError(f"{self.what!r} has two 'all' groups")
        return self

    def lookup(self, region: str | None) -> tuple[Decimal, PriceGroup] | None:
        """(value, group) for ``region``; a per-region value wins over ``all``; None if absent."""
        for group in self.prices:
            if group.regions and region in group.regions:
                return group.regions[region], group
        for group in self.prices:
            if group.all is not None:
                return group.all, group
        return None


class PriceBook(BaseModel):
    """The whole ``prices.yaml``: tables per cloud, plus cross-cloud transfer tables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[2]
    aws: dict[str, PriceTable]
    gcp: dict[str, PriceTable]
    inter_zone: dict[str, PriceTable]


@lru_cache(maxsize=1)
def price_book() -> PriceBook:
    """The validated price tables (cached)."""
    return PriceBook.model_validate(yaml.safe_load((DATA_DIR / "prices.yaml").read_text()))


def _table(cloud: str, key: str) -> PriceTable:
    return getattr(price_book(), cloud)[key]


def price(cloud: str, key: str, region: str | None) -> Price | None:
    """Unit price of ``key`` (e.g. ``ebs_gp3_per_gb_month``) in ``region``, or None if not in the table.

    Raises:
        KeyError: ``key`` is not a table of ``cloud`` (a programming error).
    """
    found = _table(cloud, key).lookup(region)
    if found is None:
        return None
    value, group = found
    return Price(usd=value, source=group.source, date=group.date.isoformat() if group.date else "undated")


def region_prices(cloud: str, key: str) -> dict[str, Decimal]:
    """Every per-region value of one table (``all`` groups excluded)."""
    out: dict[str, Decimal] = {}
    for group in _table(cloud, key).prices:
        out.update(group.regions or {})
    return out


def price_cap(cloud: str, key: str) -> Decimal | None:
    """An hourly cap on a price (Cloud NAT per-VM charge), if the table has one."""
    return _table(cloud, key).cap_per_hour


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
        doc = read_user_file(Path(usage_file), kind="usage file", error=UsageError, empty={})
        for key, value in doc.items():
            if key not in USAGE_KEYS:
                raise UsageError(f"unknown usage key {key!r} in {usage_file}; allowed: {', '.join(USAGE_KEYS)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UsageError(f"usage {key} in {usage_file} must be a number, got {value!r}")
            if not 0 <= value <= MAX_USAGE_QUANTITY:
                raise UsageError(f"usage {key} in {usage_file} must be from 0 to {MAX_USAGE_QUANTITY:,}, got {value}")
            usage[key] = Decimal(str(value))
    return usage
