"""The cheapest fully priced alternative of a stack whose total is incomplete.

A stack's total is incomplete when one of its lines has no price (:mod:`gpuinfra.cost.estimate`
fails closed): most often a non-compute table of the shipped price book that lacks the stack's
region (NAT data processed in eu-north-1, docs/prices.md "AWS regions with a GPU offer"). The
same request may be fully priced in another region. :func:`fully_priced_alternative` walks the
planner's ranking of that request (same GPUs, nodes, market and filters) and returns the first
offer, in ranking order, whose region prices every line of the stack.

The check needs no second Pulumi preview: the non-compute price tables are looked up per region,
so the stack's own previewed resources are priced again with the candidate's region
(:func:`gpuinfra.cost.estimate.estimate`, the same code and tables as ``gpuinfra cost``), and the
compute lines (:data:`~gpuinfra.cost.estimate.COMPUTE_TYPES`) take the candidate offer's catalog
price for its zone and market. Each region is priced once. A candidate of another instance type
may have other resources (and need other tables): its own stack is previewed through the
caller's ``preview``, for at most :data:`MAX_PREVIEWS` of them. Candidates of the other cloud
are passed over: pricing them would need the other cloud's preview.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from gpuinfra.catalog.store import Catalog
from gpuinfra.cost.estimate import CATALOG_SOURCE, COMPUTE_TYPES, Estimate, estimate, read_cluster_facts
from gpuinfra.cost.report import to_json
from gpuinfra.money import usd_json
from gpuinfra.offers import RankedOffer

#: Candidates of another instance type than the stack's whose own stack is previewed, at most
#: (one offline preview takes 0.1-0.2 s once the provider SDK is loaded); later ones are passed over.
MAX_PREVIEWS = 2


@dataclass(frozen=True)
class PricedAlternative:
    """An offer of the same request whose region prices every line of the stack.

    Attributes:
        offer: the ranked offer (its cloud, region, zone, type, nodes and per-node prices).
        market: the market priced (the stack's: ``spot``, ``on-demand`` or ``flex-start``).
        compute_price_per_hour_usd: USD per hour of all nodes' compute in ``market``.
        hourly_usd: USD per hour of every line of the stack priced in the offer's region.
        run_usd: USD of the whole run (``hours``), one-time lines (transfer) included.
        hours: the run length priced, in hours.
    """

    offer: RankedOffer
    market: str
    compute_price_per_hour_usd: Decimal
    hourly_usd: Decimal
    run_usd: Decimal
    hours: Decimal

    def to_json(self) -> dict[str, Any]:
        """``new --json`` ``fully_priced_alternative``: ``{"cloud", "region", "zone",
        "instance_type", "market", "compute_price_per_hour_usd", "hourly_usd", "run_hours",
        "run_usd"}`` (USD as :func:`gpuinfra.money.usd_json` strings)."""
        offer = self.offer.offer
        return {
            "cloud": offer.cloud,
            "region": offer.region,
            "zone": offer.zone,
            "instance_type": offer.instance_type,
            "market": self.market,
            "compute_price_per_hour_usd": usd_json(self.compute_price_per_hour_usd),
            "hourly_usd": usd_json(self.hourly_usd),
            "run_hours": float(self.hours),
            "run_usd": usd_json(self.run_usd),
        }


def fully_priced_alternative(
    resources: list,
    candidates: Iterable[RankedOffer],
    catalog: Catalog,
    usage: dict[str, Decimal],
    hours: Decimal,
    market: str,
    data=None,
    max_hourly_usd: Decimal | None = None,
    preview: Callable[[RankedOffer], list | None] | None = None,
) -> PricedAlternative | None:
    """The first of ``candidates`` whose region prices every line of the stack (module docstring).

    Args:
        resources: the stack's previewed resources (objects with ``type``, ``name``, ``inputs``),
            whose estimate in its own region has a line without a price.
        candidates: the other offers of the same request in the planner's ranking order
            (:func:`gpuinfra.planner.plan_alternatives`), cheapest first; lazily consumed.
        catalog: the instance catalog (compute prices of each candidate's zone).
        usage: the run's usage (:func:`gpuinfra.catalog.prices.usage_for`).
        hours: run length in hours.
        market: the stack's market; a candidate without a price in it is passed over.
        data: the stack's data set (:class:`gpuinfra.spec.DataSource`), moved to the candidate's region.
        max_hourly_usd: pass over a candidate whose whole $/h (every line) is above it (a budget).
        preview: the previewed resources of a candidate's own stack, for a candidate of another
            instance type than the stack's (its resources, and so the tables it needs, may
            differ: a GCP type with bundled or attached Local SSD, another boot disk); called for
            at most :data:`MAX_PREVIEWS` (type, region) pairs; it returns None when the candidate
            cannot be previewed. None: such candidates are passed over.

    Returns:
        The alternative, or None when no candidate of the stack's cloud has every price (a line
        with no cost model, or a table no region prices, leaves every candidate incomplete).
    """
    facts = read_cluster_facts(resources, None)
    estimates: dict[tuple[str, str], Estimate | None] = {}
    previews = 0
    for ranked in candidates:
        offer = ranked.offer
        per_node = offer.price_per_hour_usd(market)
        if per_node is None or offer.cloud != facts.cloud:
            continue
        key = (offer.region, offer.instance_type)
        if key not in estimates:
            own: list | None = resources
            if offer.instance_type != facts.instance_type:
                if preview is None or previews >= MAX_PREVIEWS:
                    continue
                previews += 1
                own = preview(ranked)
            estimates[key] = None if own is None else estimate(own, catalog, offer.region, usage, hours, market, data)
        est = estimates[key]
        if est is None or est.not_priced:
            continue
        source = f"{CATALOG_SOURCE} ({offer.cloud} {offer.zone})"
        lines = [
            replace(line, unit_price_usd=per_node, source=source) if line.resource_type in COMPUTE_TYPES else line
            for line in est.lines
        ]
        if any(line.unit_price_usd is None for line in lines):
            continue
        doc = to_json(replace(est, lines=lines), "", hours, catalog.date_for(offer.cloud), market)
        if max_hourly_usd is not None and Decimal(doc["hourly_usd"]) > max_hourly_usd:
            continue
        return PricedAlternative(
            offer=ranked,
            market=market,
            compute_price_per_hour_usd=per_node * ranked.nodes,
            hourly_usd=Decimal(doc["hourly_usd"]),
            run_usd=Decimal(doc["run_usd"]),
            hours=hours,
        )
    return None
