"""Non-compute price tables (``data/prices.yaml``) and usage defaults (``data/usage_defaults.yaml``).

``prices.yaml`` is typed (:class:`PriceBook`): every table has a unit and a description, and
every price group inside it names the source it was read from and that source's own date.
A region missing from a table yields None ("price not found"), never zero.

``gpuinfra catalog refresh`` may add refreshed tables read from the clouds' own price APIs: it
writes them as :data:`REFRESHED_PRICES_FILE` into the catalog folder it writes, and when that
folder is the one in use (:func:`gpuinfra.catalog.store.catalog_dir`) a refreshed region's price
replaces the shipped one for that region, table by table (:func:`merge_refreshed`). Regions the
refresh did not price keep the shipped price, so a refresh never removes a price.
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

from gpuinfra.catalog.store import catalog_dir
from gpuinfra.errors import CatalogError, UsageError
from gpuinfra.fsutil import atomic_write_text
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
#: Provisioned performance a Hyperdisk Balanced volume includes at no extra charge; IOPS and
#: throughput provisioned above these are billed ("Hyperdisk Balanced volumes include, at no extra
#: charge, up to 3,000 IOPS and 140 MiB/s of throughput",
#: cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced, "Baseline performance").
#: The GCP boot disk provisions exactly these (blueprints/gcp/nodes.py), so it costs its capacity
#: only. Compute Engine accepts them for a boot disk: 3,000 is the lowest IOPS of Hyperdisk
#: Balanced (3,000-160,000: github.com/cloudpilot-ai/karpenter-provider-gcp pull 210), and
#: Google's own end-to-end-tested example provisions a Hyperdisk Balanced boot disk at
#: ``provisioned_iops = 3000``, ``provisioned_throughput = 140``
#: (GoogleCloudPlatform/cloud-foundation-fabric modules/compute-vm/README.md @7f9c29c4,
#: "tftest inventory=disk-hyperdisk-cust-performance.yaml e2e").
HYPERDISK_BALANCED_FREE_IOPS = 3000
HYPERDISK_BALANCED_FREE_THROUGHPUT_MIBPS = 140


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


#: Name of the refreshed price tables in a catalog folder (written by ``gpuinfra catalog refresh``).
REFRESHED_PRICES_FILE = "prices_refreshed.yaml"


class RefreshedPrices(BaseModel):
    """Price tables read from a cloud's price API by ``catalog refresh`` (per region only).

    Each table carries the shipped table's ``unit`` so a file written by another gpuinfra
    version whose unit differs is ignored rather than misread.

    Raises (on load):
        pydantic.ValidationError: an ``all`` group (a refresh prices regions one by one), or any
            :class:`PriceTable` / :class:`PriceGroup` error.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[2]
    aws: dict[str, PriceTable] = {}
    gcp: dict[str, PriceTable] = {}

    @model_validator(mode="after")
    def _regions_only(self) -> RefreshedPrices:
        for tables in (self.aws, self.gcp):
            for key, table in tables.items():
                if any(group.all is not None for group in table.prices):
                    raise ValueError(f"refreshed table {key} has an 'all' group; a refresh prices regions")
        return self


def merge_refreshed(book: PriceBook, refreshed: RefreshedPrices) -> PriceBook:
    """``book`` with the refreshed groups first and their regions removed from the shipped groups.

    A refreshed table whose key the book lacks, or whose ``unit`` differs from the book's, is
    skipped (a file from another gpuinfra version). A shipped group left with no region is dropped.
    """
    clouds: dict[str, dict[str, PriceTable]] = {}
    for cloud in ("aws", "gcp"):
        tables = dict(getattr(book, cloud))
        for key, fresh in getattr(refreshed, cloud).items():
            shipped = tables.get(key)
            if shipped is None or shipped.unit != fresh.unit:
                continue
            taken = {region for group in fresh.prices for region in group.regions or {}}
            kept = []
            for group in shipped.prices:
                if group.regions is None:
                    kept.append(group)
                    continue
                left = {r: v for r, v in group.regions.items() if r not in taken}
                if left:
                    kept.append(group.model_copy(update={"regions": left}))
            tables[key] = shipped.model_copy(update={"prices": list(fresh.prices) + kept})
        clouds[cloud] = tables
    return book.model_copy(update=clouds)


@lru_cache(maxsize=1)
def shipped_price_book() -> PriceBook:
    """The validated price tables shipped in the package (cached)."""
    return PriceBook.model_validate(yaml.safe_load((DATA_DIR / "prices.yaml").read_text()))


def refreshed_prices_path() -> Path:
    """Where the refreshed tables of the catalog folder in use are (the file may not exist)."""
    return catalog_dir() / REFRESHED_PRICES_FILE


@lru_cache(maxsize=4)
def _book_with(path: str, mtime_ns: int) -> PriceBook:
    try:
        refreshed = RefreshedPrices.model_validate(yaml.safe_load(Path(path).read_text()))
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise CatalogError(
            f"refreshed prices {path} are unreadable ({str(exc).splitlines()[0]}); "
            "run `gpuinfra catalog refresh` again or delete that file"
        ) from None
    return merge_refreshed(shipped_price_book(), refreshed)


def price_book() -> PriceBook:
    """The price tables in use: the shipped ones, with refreshed regions from the catalog folder
    in use when ``catalog refresh`` wrote some (cached per file and modification time).

    Raises:
        CatalogError: the refreshed prices file exists but is unreadable or malformed.
    """
    path = refreshed_prices_path()
    try:
        mtime_ns = path.stat().st_mtime_ns
    except OSError:
        return shipped_price_book()
    return _book_with(str(path), mtime_ns)


def write_refreshed_prices(
    out_dir: Path, cloud: str, tables: dict[str, PriceTable], keep_from: Path | None = None
) -> Path:
    """Write ``cloud``'s refreshed tables into ``out_dir``, keeping the other cloud's part.

    Args:
        out_dir: the catalog folder ``catalog refresh`` writes.
        cloud: ``"aws"`` or ``"gcp"``; its previous refreshed tables are replaced as a whole.
        tables: table key (a key of the shipped book) -> table with per-region groups only.
        keep_from: the catalog folder whose refreshed file gives the other cloud's part (default
            ``out_dir``): the folder the refresh kept the other cloud's offers from, so a refresh
            written elsewhere (``--out``) keeps that cloud's refreshed prices with its offers.

    Returns:
        The path written (atomically).

    Raises:
        ValueError: a key the shipped book lacks, a unit that differs from the shipped one, or
            an invalid table (a programming error in the refresh).
    """
    shipped = getattr(shipped_price_book(), cloud)
    for key, table in tables.items():
        if key not in shipped or shipped[key].unit != table.unit:
            raise ValueError(f"refreshed {cloud} table {key!r} does not match a shipped table and unit")
    path = Path(out_dir) / REFRESHED_PRICES_FILE
    kept = Path(keep_from if keep_from is not None else out_dir) / REFRESHED_PRICES_FILE
    previous: dict = {"schema_version": 2}
    if kept.is_file():
        try:
            previous = RefreshedPrices.model_validate(yaml.safe_load(kept.read_text())).model_dump(mode="json")
        except (OSError, yaml.YAMLError, ValueError):
            previous = {"schema_version": 2}
    previous[cloud] = {key: table.model_dump(mode="json", exclude_none=True) for key, table in sorted(tables.items())}
    doc = RefreshedPrices.model_validate(previous)  # validate before anything is written
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(doc.model_dump(mode="json", exclude_none=True), sort_keys=False))
    _book_with.cache_clear()
    return path


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
