"""Load the catalog: offers, instance facts, GPU models and metadata.

Where the catalog comes from, first match wins:

1. ``$GPUINFRA_CATALOG_DIR`` when set;
2. ``$XDG_DATA_HOME/gpuinfra/catalog`` (default ``~/.local/share/gpuinfra/catalog``) when
   ``gpuinfra catalog refresh`` has written one there;
3. the snapshot shipped inside the package (``gpuinfra/catalog/data``).

Loading reads two small files (offers with the standard library; facts through the pydantic
model), so ``gpuinfra offers`` stays well under a second as a whole process.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

from gpuinfra.catalog.commitments import Commitments, read_commitments
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.gpus import GpuModel, load_gpu_models  # noqa: F401  (re-export)
from gpuinfra.catalog.model import CATALOG_SCHEMA_VERSION, Offer
from gpuinfra.errors import CatalogError

PACKAGE_DATA_DIR = Path(__file__).parent / "data"


@lru_cache(maxsize=1)
def load_gcp_curated_facts() -> dict:
    """The curated GCP machine-family facts (``gcp_machine_facts.json``, sources inside)."""
    return json.loads((PACKAGE_DATA_DIR / "gcp_machine_facts.json").read_text())


def user_catalog_dir() -> Path:
    """Where ``gpuinfra catalog refresh`` writes by default."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpuinfra" / "catalog"


def catalog_dir() -> Path:
    """The catalog folder in use (see module docstring for the order)."""
    explicit = os.environ.get("GPUINFRA_CATALOG_DIR")
    if explicit:
        return Path(explicit)
    user = user_catalog_dir()
    if (user / "catalog.json").is_file():
        return user
    return PACKAGE_DATA_DIR


@dataclass(frozen=True)
class Catalog:
    """Offers plus facts plus provenance, as loaded from one catalog folder.

    Attributes:
        offers: every offer, both clouds, local zones included.
        facts: instance facts by ``(cloud, instance_type)``.
        meta: ``catalog.json`` (``catalog_date``, ``sources`` per cloud).
        path: the folder it was read from.
    """

    offers: tuple[Offer, ...]
    facts: dict[tuple[str, str], InstanceFacts]
    meta: dict
    path: Path

    @property
    def commitments(self) -> Commitments:
        """1-year / 3-year committed rates (:mod:`gpuinfra.catalog.commitments`): the folder's
        ``commitments.csv``, else the one shipped with gpuinfra (``catalog refresh`` does not
        rebuild them). Read on first use.

        Raises:
            CatalogError: the file is malformed.
        """
        return _load_commitments(self.path)

    @property
    def catalog_date(self) -> str:
        """Snapshot date (``YYYY-MM-DD``) shown next to every price."""
        return str(self.meta.get("catalog_date", "unknown"))

    def date_for(self, cloud: str) -> str:
        """Snapshot date of one cloud's prices (a refresh may update one cloud only)."""
        return str(self.meta.get("sources", {}).get(cloud, {}).get("date", self.catalog_date))

    def fact(self, cloud: str, instance_type: str) -> InstanceFacts | None:
        """Facts of a type, or None when the catalog has none."""
        return self.facts.get((cloud, instance_type))

    def find_offer(
        self,
        cloud: str,
        instance_type: str | None,
        zone: str | None,
        gpu: str | None = None,
        gpu_count: int | None = None,
    ) -> Offer | None:
        """The offer of ``instance_type`` in ``zone`` (with ``gpu`` x ``gpu_count`` when given), or None."""
        for offer in self.offers:
            if (
                offer.cloud == cloud
                and offer.instance_type == instance_type
                and offer.zone == zone
                and (gpu is None or (offer.gpu == gpu and offer.gpu_count == gpu_count))
            ):
                return offer
        return None

    def node_hour_price_usd(self, spec) -> Decimal | None:
        """One node-hour of a stack's instance type in its zone and market, from this catalog
        (never from the stack file's recorded price, which anyone may edit): what ``ls`` and
        ``status`` price node-hours with, the offer ``cost`` prices compute from.

        Args:
            spec: a :class:`gpuinfra.spec.ClusterSpec` (``cloud``, ``instance_type``, ``zone``,
                ``gpu``, ``gpu_count``, ``spot``, ``capacity_block``).

        Returns:
            USD per node-hour; None when there is no such offer or no price in the stack's market
            (a Capacity Block's price is set per reservation: always None).
        """
        if spec.capacity_block:
            return None
        offer = self.find_offer(spec.cloud, spec.instance_type, spec.zone, spec.gpu, spec.gpu_count)
        return None if offer is None else offer.price_per_hour_usd(spec.market)

    def regions(self, cloud: str | None = None) -> list[str]:
        """Sorted regions with at least one offer (of ``cloud`` when given)."""
        return sorted({o.region for o in self.offers if cloud in (None, o.cloud)})

    def zones(self, cloud: str | None = None, region: str | None = None) -> list[str]:
        """Sorted zones with at least one offer, filtered by cloud and region when given."""
        return sorted({o.zone for o in self.offers if cloud in (None, o.cloud) and region in (None, o.region)})

    def instance_types(self, cloud: str | None = None) -> list[str]:
        """Sorted instance/machine types with at least one offer."""
        return sorted({o.instance_type for o in self.offers if cloud in (None, o.cloud)})

    def summary(self) -> dict:
        """What ``gpuinfra catalog show --json`` prints: ``{"path", "catalog_date", "sources"
        (per cloud: prices, date ...), "offers" (count per cloud), "instance_types" (count per
        cloud), "gpus" (sorted GPU names), "commitment_sources" (source key -> market, source,
        date: :mod:`gpuinfra.catalog.commitments`)}``."""
        from collections import Counter

        counts = Counter(o.cloud for o in self.offers)
        return {
            "path": str(self.path),
            "catalog_date": self.catalog_date,
            "sources": self.meta.get("sources", {}),
            "offers": dict(counts),
            "instance_types": {c: len(self.instance_types(c)) for c in sorted(counts)},
            "gpus": sorted({o.gpu for o in self.offers}),
            "commitment_sources": dict(self.commitments.sources),
        }


@lru_cache(maxsize=4)
def _load(path: Path) -> Catalog:
    try:
        meta = json.loads((path / "catalog.json").read_text())
        if meta.get("schema_version") != CATALOG_SCHEMA_VERSION:
            raise CatalogError(
                f"catalog folder {path} has schema version {meta.get('schema_version')!r}; this gpuinfra reads "
                f"version {CATALOG_SCHEMA_VERSION}: run `gpuinfra catalog refresh` again (it starts from the "
                "catalog shipped with gpuinfra) or delete that folder"
            )
        with open(path / "offers.csv", newline="") as f:
            offers = tuple(Offer.from_row(row) for row in csv.DictReader(f))
        facts_doc = json.loads((path / "instance_types.json").read_text())
        facts = {(d["cloud"], d["instance_type"]): InstanceFacts.from_dict(d) for d in facts_doc["instance_types"]}
    except FileNotFoundError as exc:
        raise CatalogError(
            f"catalog folder {path} is incomplete: {Path(exc.filename).name} is missing "
            "(run `gpuinfra catalog refresh` or unset GPUINFRA_CATALOG_DIR)"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CatalogError(f"catalog folder {path} is corrupt: {exc}") from None
    return Catalog(offers=offers, facts=facts, meta=meta, path=path)


@lru_cache(maxsize=4)
def _load_commitments(path: Path) -> Commitments:
    folder = path if (path / "commitments.csv").is_file() else PACKAGE_DATA_DIR
    try:
        return read_commitments(folder)
    except (ValueError, KeyError, OSError) as exc:
        raise CatalogError(f"commitment prices in {folder} are corrupt: {exc}") from None


def load_catalog(path: Path | None = None) -> Catalog:
    """Load (and cache) the catalog.

    Args:
        path: a catalog folder; default :func:`catalog_dir`.

    Raises:
        CatalogError: files missing, corrupt, or of another schema version.
    """
    return _load(Path(path) if path is not None else catalog_dir())
