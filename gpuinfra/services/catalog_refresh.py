"""``gpuinfra catalog refresh``: rebuild offers and facts from the clouds' APIs.

The refreshed cloud replaces its part of the current catalog; the other cloud's part is kept
as it is (with its own date). An AWS refresh also reads the non-compute price tables of every
region with a GPU offer from the Price List (:mod:`gpuinfra.catalog.refresh_aws_prices`); a GCP
refresh reads the disk and Local SSD price tables from the same SKU list as the machine prices
(:func:`gpuinfra.catalog.refresh_gcp.parse_price_skus`). Both are written as
:data:`gpuinfra.catalog.prices.REFRESHED_PRICES_FILE` after the catalog passed its gates, so a
gate that fails writes neither. The result is written atomically to the user catalog folder (or
``--out``), which :func:`gpuinfra.catalog.store.catalog_dir` then prefers over the shipped
snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gpuinfra.catalog.build import write_catalog
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.gates import reference_prices
from gpuinfra.catalog.model import Offer, price_source_keys
from gpuinfra.catalog.prices import PriceTable, write_refreshed_prices
from gpuinfra.catalog.refresh_aws import PRICING_REGION, fetch_aws
from gpuinfra.catalog.refresh_aws_prices import fetch_aws_prices, price_tables
from gpuinfra.catalog.refresh_gcp import RefreshedPriceTables, fetch_gcp
from gpuinfra.catalog.store import (
    PACKAGE_DATA_DIR,
    _load,
    load_catalog,
    load_gcp_curated_facts,
    load_gpu_models,
    user_catalog_dir,
)
from gpuinfra.credentials import aws_client_factory, gcp_credentials
from gpuinfra.errors import CatalogError, MissingDependencyError
from gpuinfra.spec import check_gcp_project_id


@dataclass
class RefreshResult:
    """What a refresh wrote."""

    out_dir: Path
    counts: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: one line per cloud whose non-compute price tables were refreshed
    price_lines: list[str] = field(default_factory=list)

    def summary_lines(self) -> list[str]:
        """Human-readable summary."""
        lines = [f"wrote catalog to {self.out_dir}"]
        lines += [f"  {cloud}: {n} offers" for cloud, n in sorted(self.counts.items())]
        lines += [f"  {line}" for line in self.price_lines]
        lines += [f"  warning: {w}" for w in self.warnings]
        return lines


def gcp_clients(credentials=None, client_options=None, transport: str | None = None):
    """(billing, machine types, accelerator types) clients.

    Raises:
        MissingDependencyError: the google-cloud clients are not installed, or no credentials.
    """
    try:
        from google.cloud import billing_v1, compute_v1
    except ImportError:
        raise MissingDependencyError(
            "GCP refresh needs the google-cloud clients: pip install 'gpuinfra[gcp-refresh]'"
        ) from None
    if credentials is None:
        credentials, _ = gcp_credentials()
    kwargs = {"credentials": credentials, "client_options": client_options}
    if transport:
        kwargs["transport"] = transport
    return (
        billing_v1.CloudCatalogClient(**kwargs),
        compute_v1.MachineTypesClient(**kwargs),
        compute_v1.AcceleratorTypesClient(**kwargs),
    )


def refresh_catalog(
    clouds: list[str],
    out_dir: Path | None = None,
    regions: list[str] | None = None,
    gcp_project: str | None = None,
    aws_factory=None,
    gcp=None,
    now: datetime | None = None,
    accept_price_cuts: bool = False,
) -> RefreshResult:
    """Fetch the clouds' catalogs (and AWS's non-compute price tables) and write a merged catalog folder.

    Args:
        clouds: subset of ``["aws", "gcp"]``.
        out_dir: destination (default: :func:`user_catalog_dir`).
        regions: restrict to these regions (default: all).
        gcp_project: project ID for the Compute calls (required for GCP).
        aws_factory: boto3 client factory (default: :func:`gpuinfra.credentials.aws_client_factory`).
        gcp: (billing, machine types, accelerator types) clients (default: :func:`gcp_clients`).
        now: timestamp of the refresh (UTC).
        accept_price_cuts: gate GCP on-demand prices against the fresh us-central1 prices only
            (default: against the higher of those and the shipped catalog's, so a discounted
            SKU cannot vouch for itself).

    Raises:
        CatalogError: unknown cloud, API failure, or an empty result.
        SpecError: ``gcp_project`` is not a GCP project ID.
        CatalogGateError: the result fails a sanity gate (:mod:`gpuinfra.catalog.gates`);
            nothing is written.
        MissingDependencyError: missing credentials or client libraries.
    """
    for cloud in clouds:
        if cloud not in ("aws", "gcp"):
            raise CatalogError(f"unknown cloud {cloud!r}; choose aws or gcp")
    if "gcp" in clouds and not gcp_project:
        raise CatalogError("GCP refresh needs --gcp-project (or GOOGLE_CLOUD_PROJECT) for the Compute API")
    if "gcp" in clouds:
        assert gcp_project is not None  # required above
        check_gcp_project_id(gcp_project)
    now = now or datetime.now(UTC)
    try:
        current = load_catalog()
    except CatalogError:  # an unreadable or older user catalog: start from the shipped one
        current = load_catalog(PACKAGE_DATA_DIR)
    offers: dict[str, list[Offer]] = {c: [o for o in current.offers if o.cloud == c] for c in ("aws", "gcp")}
    facts: dict[str, list[InstanceFacts]] = {
        c: [f for f in current.facts.values() if f.cloud == c] for c in ("aws", "gcp")
    }
    meta = dict(current.meta)
    sources = dict(meta.get("sources", {}))
    price_sources = dict(meta.get("price_sources", {}))
    # the GCP gate compares with us-central1: the higher of the shipped (cited, gated) catalog's
    # price and the fresh one, so a refresh limited to other regions is checked too, and a fresh
    # us-central1 price from a discounted SKU cannot vouch for itself
    previous = {} if accept_price_cuts else reference_prices(load_catalog(PACKAGE_DATA_DIR).offers)
    result = RefreshResult(out_dir=Path(out_dir) if out_dir else user_catalog_dir())
    gcp_prices: RefreshedPriceTables | None = None
    date = now.strftime("%Y-%m-%d")
    aws_prices: dict[str, PriceTable] | None = None
    if "aws" in clouds:
        from botocore.exceptions import BotoCoreError, ClientError

        factory = aws_factory or aws_client_factory()
        try:
            offers["aws"], facts["aws"] = fetch_aws(factory, regions, now)
            # the non-compute tables of every region with a GPU offer (of those asked for)
            price_report = fetch_aws_prices(
                factory("pricing", PRICING_REGION), sorted({o.region for o in offers["aws"]})
            )
        except (BotoCoreError, ClientError) as exc:
            raise CatalogError(f"AWS refresh failed: {exc}") from None
        aws_prices = price_tables(price_report, date)  # validated before anything is written
        result.price_lines.append(
            f"aws prices: {price_report.priced} of {price_report.pairs} region x table pairs (regions with a GPU offer)"
        )
        result.warnings += [
            f"aws price {key} in {region} left unpriced: {why}"
            for (region, key), why in sorted(price_report.unpriced.items())
        ]
        sources["aws"] = {
            "prices": "EC2 DescribeSpotPriceHistory + Price List GetProducts (gpuinfra catalog refresh)",
            "date": date,
            "facts": "EC2 DescribeInstanceTypes",
        }
        price_sources["aws-price-list-and-spot-history"] = {
            "what": "AWS on-demand (Price List GetProducts) and latest spot price per AZ (DescribeSpotPriceHistory)",
            "source": "AWS APIs, gpuinfra catalog refresh",
            "date": date,
        }
    if "gcp" in clouds:
        from google.api_core.exceptions import GoogleAPIError

        billing, machine_types, accelerator_types = gcp or gcp_clients()
        assert gcp_project is not None  # required above
        try:
            offers["gcp"], facts["gcp"], report = fetch_gcp(
                billing,
                machine_types,
                accelerator_types,
                gcp_project,
                regions,
                load_gcp_curated_facts(),
                load_gpu_models(),
                date=date,
            )
        except GoogleAPIError as exc:
            raise CatalogError(f"GCP refresh failed: {exc}") from None
        result.warnings += [f"no host price SKU for {x}; left out" for x in sorted(report.missing_host_skus)]
        result.warnings += [f"no GPU price SKU for {x}; left out" for x in sorted(report.missing_gpu_skus)]
        gcp_prices = report.price_tables
        result.warnings += gcp_prices.warnings
        priced, pairs = gcp_prices.priced_pairs({o.region for o in offers["gcp"]})
        result.price_lines.append(f"gcp prices: {priced} of {pairs} region x table pairs (regions with a GPU offer)")
        sources["gcp"] = {
            "prices": "Cloud Billing Catalog services/6F81-5844-456A/skus (gpuinfra catalog refresh)",
            "date": date,
            "facts": "Compute machineTypes.aggregatedList + gcp_machine_facts.json",
        }
        price_sources["gcp-billing-catalog"] = {
            "what": "GCP on-demand, spot and flex-start (DWS) per machine: core + RAM + GPU + bundled Local SSD SKUs",
            "source": "Cloud Billing Catalog services/6F81-5844-456A/skus, gpuinfra catalog refresh",
            "date": date,
        }
    for cloud in clouds:
        if not offers[cloud]:
            raise CatalogError(f"{cloud} refresh returned no GPU offers; the catalog was not changed")
    all_offers = offers["aws"] + offers["gcp"]
    used = set().union(*(price_source_keys(o.price_source) for o in all_offers))
    meta.update(
        catalog_date=date,
        sources=sources,
        built_by="gpuinfra catalog refresh",
        price_sources={k: v for k, v in price_sources.items() if k in used},
    )
    meta.pop("dropped_on_build", None)
    all_facts = sorted(facts["aws"] + facts["gcp"], key=lambda f: (f.cloud, f.instance_type))
    fresh = reference_prices(all_offers)
    reference = {
        k: max(v for v in (previous.get(k), fresh.get(k)) if v is not None) for k in previous.keys() | fresh.keys()
    }
    write_catalog(result.out_dir, all_offers, all_facts, meta, reference)
    # after the catalog passed its gates (a failing gate writes neither); the cloud not refreshed
    # keeps the refreshed prices of the folder its offers were kept from
    keep_from = current.path
    for cloud, tables in (("gcp", None if gcp_prices is None else gcp_prices.tables), ("aws", aws_prices)):
        if tables is not None:
            write_refreshed_prices(result.out_dir, cloud, tables, keep_from)
            keep_from = result.out_dir
    _load.cache_clear()
    result.counts = {c: len(offers[c]) for c in ("aws", "gcp")}
    return result
