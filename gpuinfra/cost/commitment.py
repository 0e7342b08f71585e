"""What an on-demand stack's compute would cost under a 1-year or 3-year commitment.

A commitment is billed for every hour of its term whether the nodes run or not (AWS Savings
Plans and Reserved Instances: docs.aws.amazon.com/savingsplans/latest/userguide/
what-is-savings-plans.html; GCP committed use discounts: cloud.google.com/compute/docs/
instances/signing-up-committed-use-discounts). So for one node:

* obligation = committed rate x term hours (8,760 for 1 year, 26,280 for 3 years);
* break-even = obligation / on-demand rate: the on-demand hours over the term above which the
  commitment is cheaper; per year that is committed rate x 8,760 / on-demand rate (the same
  fraction of the year, committed / on-demand, for either term).

The view is the run's node-hours at the committed rate next to the on-demand figure. Only an
on-demand plan gets it (the nodes a commitment covers are on-demand VMs: ``cost --on-demand``
shows it for a spot plan). A term without a cited price is "not priced", never zero.

JSON (the ``commitments`` object of a cost document, :func:`commitments_json`): ``{"applies",
"reason", "on_demand_per_node_hour_usd", "nodes", "hours", "terms": [{"market", "priced",
"reason", "commitment", "per_node_hour_usd", "run_compute_usd", "on_demand_run_compute_usd",
"term_hours", "obligation_per_node_usd", "obligation_usd", "break_even_hours",
"break_even_hours_per_year", "break_even_formula", "source", "source_field", "source_date"}]}``;
money as :func:`gpuinfra.money.usd_json` strings, hours as strings rounded to 0.1 h.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from gpuinfra.catalog.commitments import COMMITMENT_MARKETS, TERM_HOURS
from gpuinfra.catalog.store import Catalog
from gpuinfra.money import usd_json

#: Hours in a year of a commitment term (365 x 24).
HOURS_PER_YEAR = TERM_HOURS["commit-1y"]

BREAK_EVEN_FORMULA = (
    "break_even_hours = per_node_hour_usd x term_hours / on-demand per-node-hour price (the obligation is paid "
    "whether the nodes run or not: docs.aws.amazon.com/savingsplans/latest/userguide/what-is-savings-plans.html, "
    "cloud.google.com/compute/docs/instances/signing-up-committed-use-discounts)"
)
_HOURS_Q = Decimal("0.1")


def commitments_json(catalog: Catalog, facts, hours: Decimal, market: str) -> dict[str, Any]:
    """The commitment view of a priced plan (module docstring).

    Args:
        catalog: the catalog (offers and :attr:`Catalog.commitments`).
        facts: :class:`gpuinfra.cost.estimate.ClusterFacts` of the plan (cloud, type, zone,
            GPUs, nodes).
        hours: run hours.
        market: the market compute is priced in (``on-demand`` gets the view).
    """
    offer = catalog.find_offer(facts.cloud, facts.instance_type, facts.zone, facts.gpu, facts.gpu_count)
    on_demand = None if offer is None else offer.on_demand_price_per_hour_usd
    doc: dict[str, Any] = {
        "applies": False,
        "reason": "",
        "on_demand_per_node_hour_usd": usd_json(on_demand),
        "nodes": facts.nodes,
        "hours": format(hours.normalize(), "f"),
        "terms": [],
    }
    if market != "on-demand":
        doc["reason"] = (
            f"priced as {market}: a commitment covers on-demand VMs (`gpuinfra cost STACK --on-demand` shows it)"
        )
        return doc
    if offer is None or on_demand is None or on_demand <= 0:
        doc["reason"] = f"no on-demand price for {facts.instance_type} in {facts.zone}: nothing to compare with"
        return doc
    doc["applies"] = True
    for term in COMMITMENT_MARKETS:
        doc["terms"].append(_term(catalog, offer, term, on_demand, facts.nodes, hours))
    return doc


def _term(catalog: Catalog, offer, term: str, on_demand: Decimal, nodes: int, hours: Decimal) -> dict[str, Any]:
    c = catalog.commitments.price(offer.cloud, offer.instance_type, offer.region, term)
    term_hours = TERM_HOURS[term]
    if c is None:
        return {
            "market": term,
            "priced": False,
            "reason": f"no {term} price for {offer.instance_type} in {offer.region} in the cited sources",
            "term_hours": term_hours,
            "per_node_hour_usd": None,
            "run_compute_usd": None,
            "obligation_usd": None,
            "break_even_hours_per_year": None,
        }
    src = catalog.commitments.source_of(c)
    break_even = c.obligation_usd / on_demand
    return {
        "market": term,
        "priced": True,
        "reason": "",
        "commitment": src["market"],
        "per_node_hour_usd": usd_json(c.price_per_hour_usd),
        "run_compute_usd": usd_json(c.price_per_hour_usd * nodes * hours),
        "on_demand_run_compute_usd": usd_json(on_demand * nodes * hours),
        "term_hours": term_hours,
        "obligation_per_node_usd": usd_json(c.obligation_usd),
        "obligation_usd": usd_json(c.obligation_usd * nodes),
        "break_even_hours": str(break_even.quantize(_HOURS_Q)),
        "break_even_hours_per_year": str((break_even * HOURS_PER_YEAR / term_hours).quantize(_HOURS_Q)),
        "break_even_formula": BREAK_EVEN_FORMULA,
        "source": src["source"],
        "source_field": c.source.split(":", 1)[1],
        "source_date": src["date"],
    }
