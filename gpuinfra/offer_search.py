"""The ``gpuinfra offers`` service: the options become a catalog query, offers are ranked (by
run cost when a data set is given), and each ranked offer has one JSON view.

JSON (``gpuinfra offers --json``, a list; USD as :func:`gpuinfra.money.usd_json` strings): one
:func:`offer_json` object per offer; with a data set, :func:`run_json` objects, which add the
run's ``hours``, ``compute_usd``, ``data_transfer_usd``, ``data_transfer_route``,
``data_transfer_price_per_gb_usd``, ``data_transfer_price_source`` and ``run_usd``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpuinfra.catalog.model import parse_market
from gpuinfra.catalog.store import Catalog
from gpuinfra.datasource import resolve_data_set
from gpuinfra.errors import RequestError
from gpuinfra.locality import RunCost, rank_runs
from gpuinfra.money import usd_json
from gpuinfra.offers import OfferQuery, RankedOffer, find_offers, gpu_request
from gpuinfra.spec import MAX_RUN_HOURS, DataSource, check_run_hours


def market_option(market: str | None, spot: bool) -> str:
    """The catalog market named by ``--market`` (and ``--spot``).

    Args:
        market: ``on-demand``, ``spot``, ``flex``, ``commit-1y`` or ``commit-3y`` (and the
            aliases :func:`parse_market` takes), or None for none given (on-demand).
        spot: ``--spot``, the same as ``--market spot``.

    Raises:
        RequestError: an unknown market, or ``--spot`` with a ``--market`` other than spot.
    """
    if market is None:
        return "spot" if spot else "on-demand"
    chosen = parse_market(market)
    if chosen is None:
        raise RequestError(f"unknown --market {market!r}; choose one of: on-demand, spot, flex, commit-1y, commit-3y")
    if spot and chosen != "spot":
        raise RequestError(f"--spot contradicts --market {market}: give one of them")
    return chosen


@dataclass(frozen=True)
class OfferSearch:
    """Ranked offers for a request.

    Attributes:
        query: what was asked of the catalog (request, filters, market).
        ranked: every fitting offer, cheapest $/h for all nodes first.
        data: the training data set, when one was given.
        hours: run length in hours (with ``data`` only).
        runs: with ``data``: the offers ranked by run cost (compute x hours + moving the data
            once; unknown transfer prices last), else None.
    """

    query: OfferQuery
    ranked: list[RankedOffer]
    data: DataSource | None = None
    hours: Decimal | None = None
    runs: list[RunCost] | None = None


def search_offers(
    catalog: Catalog,
    *,
    gpus: str | None = None,
    instance_type: str | None = None,
    nodes: int = 1,
    cloud: str | None = None,
    region: str | None = None,
    zone: str | None = None,
    market: str | None = None,
    spot: bool = False,
    include_local_zones: bool = False,
    data: str | None = None,
    data_region: str | None = None,
    data_size: str | None = None,
    hours: float | None = None,
) -> OfferSearch:
    """Rank every offer that fits ``gpus`` (or the GPUs of ``instance_type``) on ``nodes`` nodes.

    Args:
        catalog: the loaded catalog.
        gpus: GPUs per node (``4xA100``); or ``instance_type`` alone.
        instance_type: restrict to this type (and, without ``gpus``, take its GPUs).
        nodes: node count; prices are totals for all nodes.
        cloud, region, zone: filters (AWS zones are AZ IDs).
        market, spot: the market to rank by (:func:`market_option`).
        include_local_zones: also AWS Local Zones.
        data, data_region, data_size: the training data set (:func:`gpuinfra.datasource.resolve_data_set`).
        hours: run length in hours; needed with a data set (one minute to :data:`gpuinfra.spec.MAX_RUN_HOURS`), refused without.

    Raises:
        RequestError: bad or contradicting options.
        CatalogError: unknown cloud, region, zone or type.
        DataSourceError, MissingDependencyError: the data set cannot be resolved.
        NoOfferError: nothing fits (exit 4).
    """
    request = gpu_request(catalog, gpus, instance_type, cloud, nodes)
    query = OfferQuery(
        request=request,
        cloud=cloud,
        region=region,
        zone=zone,
        instance_type=instance_type,
        market=market_option(market, spot),
        include_local_zones=include_local_zones,
    )
    data_set = resolve_data_set(data, data_region, data_size)
    if data_set is None and hours is not None:
        raise RequestError("--hours goes with --data or --data-region (it sets the run length for the data transfer)")
    if data_set is not None and hours is None:
        raise RequestError(
            f"--data needs --hours, at least 1 minute and at most {MAX_RUN_HOURS}: the run length decides "
            "whether moving the data pays"
        )
    run_hours = check_run_hours(hours)
    ranked = find_offers(catalog, query)
    if data_set is None or run_hours is None:
        return OfferSearch(query, ranked)
    return OfferSearch(query, ranked, data_set, run_hours, rank_runs(ranked, data_set, run_hours))


def _times(value: Decimal | None, nodes: int) -> Decimal | None:
    return None if value is None else value * nodes


def offer_json(ranked: RankedOffer, catalog: Catalog) -> dict[str, Any]:
    """The JSON object of one ranked offer (stable keys, documented in docs/json-output.md; prices are
    totals for all nodes, null where the catalog has none)."""
    offer = ranked.offer
    fact = catalog.fact(offer.cloud, offer.instance_type)
    return {
        "cloud": offer.cloud,
        "region": offer.region,
        "zone": offer.zone,
        "instance_type": offer.instance_type,
        "gpu": offer.gpu,
        "gpu_count": offer.gpu_count,
        "requested_gpu_count": ranked.requested_gpu_count,
        "round_up": ranked.round_up,
        "gpu_memory_gib": offer.gpu_memory_gib,
        "vcpus": offer.vcpus,
        "memory_gib": offer.memory_gib,
        "nodes": ranked.nodes,
        "market": ranked.market,
        "price_per_hour_usd": usd_json(ranked.price_per_hour_usd),
        "price_per_gpu_hour_usd": usd_json(ranked.price_per_gpu_hour_usd),
        "on_demand_price_per_hour_usd": usd_json(ranked.market_price_per_hour_usd("on-demand")),
        "spot_price_per_hour_usd": usd_json(ranked.market_price_per_hour_usd("spot")),
        "flex_start_price_per_hour_usd": usd_json(ranked.market_price_per_hour_usd("flex-start")),
        "spot_not_discounted": offer.spot_not_discounted,
        "spot_price_date": offer.spot_price_date or None,
        "spot_price_min_per_hour_usd": usd_json(_times(offer.spot_price_min_per_hour_usd, ranked.nodes)),
        "spot_price_max_per_hour_usd": usd_json(_times(offer.spot_price_max_per_hour_usd, ranked.nodes)),
        "spot_interruption_band": offer.spot_interruption_band or None,
        "price_source": offer.price_source,
        "efa_interfaces": fact.max_efa_interfaces if fact else None,
        "gpu_nics": fact.gpu_nic_count if fact else None,
        "local_nvme_count": fact.local_ssd.bundled_count if fact else None,
        "local_nvme_size_gib": fact.local_ssd.size_gib if fact else None,
        "local_ssd_attach_counts": list(fact.local_ssd.attach_counts) if fact else None,
        "provisioning_models": list(fact.provisioning_models) if fact else None,
        "local_zone": offer.local_zone,
        "catalog_date": catalog.date_for(offer.cloud),
        "commitment": commitment_json(ranked, catalog),
    }


def commitment_json(ranked: RankedOffer, catalog: Catalog) -> dict[str, Any] | None:
    """The committed rate an offer is ranked by (``offers --market commit-1y|commit-3y``):
    ``{"market", "commitment", "price_per_node_hour_usd", "term_hours", "obligation_usd" (all
    nodes, whole term, paid used or not), "source", "source_field", "source_date"}``; None in
    the other markets."""
    c = ranked.commitment
    if c is None:
        return None
    src = catalog.commitments.source_of(c)
    return {
        "market": c.market,
        "commitment": src["market"],
        "price_per_node_hour_usd": usd_json(c.price_per_hour_usd),
        "term_hours": c.term_hours,
        "obligation_usd": usd_json(c.obligation_usd * ranked.nodes),
        "source": src["source"],
        "source_field": c.source.split(":", 1)[1],
        "source_date": src["date"],
    }


def run_json(run: RunCost, catalog: Catalog) -> dict[str, Any]:
    """:func:`offer_json` of the run's offer plus the run's cost with its data (module docstring)."""
    per_gb = run.transfer.price_per_gb
    return {
        **offer_json(run.ranked, catalog),
        "hours": float(run.hours),
        "compute_usd": usd_json(run.compute_usd),
        "data_transfer_usd": usd_json(run.transfer.usd),
        "data_transfer_route": run.transfer.route,
        # free (same region): 0, not null -- null means the price is unknown
        "data_transfer_price_per_gb_usd": (
            usd_json(Decimal(0)) if run.transfer.free else None if per_gb is None else usd_json(per_gb.usd)
        ),
        "data_transfer_price_source": None if per_gb is None else per_gb.source,
        "run_usd": usd_json(run.run_usd),
    }
