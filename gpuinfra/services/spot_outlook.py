"""Spot outlook of a stack for ``cost --spot``: the spot price with its date and range, an
interruption rate, and the expected cost of the run with the work redone after interruptions,
next to on-demand.

Interruption rate, per node-hour:

* AWS: the Spot Instance Advisor "frequency of interruption" band of the type and region
  (``<5%``, ``5-10%``, ``10-15%``, ``15-20%``, ``>20%`` of instances interrupted per month,
  aws.amazon.com/ec2/spot/instance-advisor/), as the dated catalog source carries it
  (``Offer.spot_interruption_band``). The band's upper edge over a 730-hour month is used
  (conservative); ``>20%`` has no upper edge, so it and a missing band take the assumption below.
* GCP publishes no interruption rate for Spot VMs (cloud.google.com/compute/docs/instances/spot
  says only that Compute Engine "might preempt Spot VMs at any time"): the assumption below,
  flagged ``assumed`` in the output.

Assumption: :data:`gpuinfra.sizing.checkpoint.DEFAULT_INTERRUPTIONS_PER_NODE_HOUR` (the rate the
checkpoint plan assumes when none is given; an input, not a fact).

Re-work: every interruption of any node stops the (synchronous) job; the work since the last
checkpoint is redone: on average half the checkpoint interval plus one checkpoint write
(``gpuinfra:checkpoint_plan`` of a stack sized from a model, :mod:`gpuinfra.sizing.checkpoint`).
A stack without a checkpoint plan assumes :data:`ASSUMED_CHECKPOINT_INTERVAL_MINUTES`
(flagged). Expected interruptions = rate x nodes x run hours; expected redone hours =
interruptions x redone hours each; expected spot cost = spot compute $/h x (run hours + redone
hours). The on-demand cost is the on-demand compute $/h x run hours.
"""

from __future__ import annotations

from decimal import Decimal

from gpuinfra.catalog.model import Offer
from gpuinfra.catalog.prices import HOURS_PER_MONTH
from gpuinfra.money import usd_json
from gpuinfra.sizing.checkpoint import DEFAULT_INTERRUPTIONS_PER_NODE_HOUR

#: Upper edge of each Spot Instance Advisor band, as a fraction of instances per month.
ADVISOR_BAND_UPPER: dict[str, Decimal] = {
    "<5%": Decimal("0.05"),
    "5-10%": Decimal("0.10"),
    "10-15%": Decimal("0.15"),
    "15-20%": Decimal("0.20"),
}

#: Checkpoint interval assumed for a stack without a checkpoint plan (an assumption, flagged).
ASSUMED_CHECKPOINT_INTERVAL_MINUTES = 60


def interruption_rate(offer: Offer) -> tuple[Decimal, str]:
    """(interruptions per node-hour, where the rate comes from) for ``offer`` (module docstring)."""
    upper = ADVISOR_BAND_UPPER.get(offer.spot_interruption_band)
    if offer.cloud == "aws" and upper is not None:
        return upper / HOURS_PER_MONTH, (
            f"AWS Spot Instance Advisor band {offer.spot_interruption_band} per month "
            f"(upper edge / 730 h; dated {offer.spot_price_date})"
        )
    why = (
        "GCP publishes no Spot VM interruption rate"
        if offer.cloud == "gcp"
        else f"AWS band {offer.spot_interruption_band or 'unknown'} has no upper edge"
    )
    return Decimal(str(DEFAULT_INTERRUPTIONS_PER_NODE_HOUR)), f"assumed ({why})"


def redone_hours_each(checkpoint_plan: dict | None) -> tuple[Decimal, Decimal, bool]:
    """Hours of work redone after one interruption (module docstring): half the checkpoint interval
    plus one checkpoint write.

    Args:
        checkpoint_plan: ``gpuinfra:checkpoint_plan`` / ``size --json`` ``checkpoint_plan``, or None.

    Returns:
        (redone hours, the interval in minutes, True when the interval is
        :data:`ASSUMED_CHECKPOINT_INTERVAL_MINUTES` for want of a plan).
    """
    interval = (checkpoint_plan or {}).get("interval_minutes")
    write_s = (checkpoint_plan or {}).get("upload_seconds") or 0
    assumed = interval is None
    interval_min = Decimal(str(ASSUMED_CHECKPOINT_INTERVAL_MINUTES if assumed else interval))
    return interval_min / 2 / 60 + Decimal(str(write_s)) / 3600, interval_min, assumed


def spot_outlook(offer: Offer, nodes: int, run_hours: Decimal, checkpoint_plan: dict | None) -> dict:
    """The ``spot`` object of the ``cost --spot`` document (module docstring).

    Args:
        offer: the stack's catalog offer (per node-hour prices).
        nodes: nodes in the stack.
        run_hours: the run length priced.
        checkpoint_plan: ``gpuinfra:checkpoint_plan`` of the stack file, or None.

    Returns:
        JSON-ready dict; money as :func:`gpuinfra.money.usd_json`, null when a price is missing.
    """
    rate, rate_source = interruption_rate(offer)
    redone_each_h, interval_min, assumed_interval = redone_hours_each(checkpoint_plan)
    expected = rate * nodes * run_hours
    redone_h = expected * redone_each_h
    spot, od = offer.spot_price_per_hour_usd, offer.on_demand_price_per_hour_usd
    spot_run = None if spot is None else spot * nodes * (run_hours + redone_h)
    od_run = None if od is None else od * nodes * run_hours
    q = Decimal("0.0001")
    return {
        "spot_price_per_node_hour_usd": usd_json(spot),
        "spot_price_date": offer.spot_price_date or None,
        "spot_price_min_per_node_hour_usd": usd_json(offer.spot_price_min_per_hour_usd),
        "spot_price_max_per_node_hour_usd": usd_json(offer.spot_price_max_per_hour_usd),
        "spot_not_discounted": offer.spot_not_discounted,
        "interruptions_per_node_hour": str(rate.quantize(Decimal("0.0000001"))),
        "interruption_rate_source": rate_source,
        "interruption_rate_assumed": rate_source.startswith("assumed"),
        "checkpoint_interval_minutes": str(interval_min),
        "checkpoint_interval_assumed": assumed_interval,
        "expected_interruptions": str(expected.quantize(q)),
        "expected_redone_hours": str(redone_h.quantize(q)),
        "expected_compute_run_usd_with_rework": usd_json(spot_run),
        "on_demand_compute_run_usd": usd_json(od_run),
        "max_price": "AWS fleet MaxPrice = the spot price above"
        if offer.cloud == "aws"
        else "none: GCP Spot VMs take no maximum price",
    }


def spot_outlook_lines(doc: dict) -> list[str]:
    """The text lines of :func:`spot_outlook` for ``cost``."""
    if doc["spot_price_per_node_hour_usd"] is None:
        return ["spot: no spot price in the catalog"]
    rng = (
        f" (window {Decimal(doc['spot_price_min_per_node_hour_usd']):,.2f}-"
        f"{Decimal(doc['spot_price_max_per_node_hour_usd']):,.2f})"
        if doc["spot_price_max_per_node_hour_usd"] is not None
        else ""
    )
    lines = [
        f"spot ${Decimal(doc['spot_price_per_node_hour_usd']):,.2f}/node-h, dated {doc['spot_price_date']}{rng}; "
        f"max price: {doc['max_price']}",
        f"interruptions: {doc['interruptions_per_node_hour']}/node-h ({doc['interruption_rate_source']}); "
        f"checkpoint every {doc['checkpoint_interval_minutes']} min"
        + (" (assumed: no checkpoint plan)" if doc["checkpoint_interval_assumed"] else ""),
    ]
    spot_run, od_run = doc["expected_compute_run_usd_with_rework"], doc["on_demand_compute_run_usd"]
    lines.append(
        f"expected compute with re-work: ${Decimal(spot_run):,.2f} "
        f"({doc['expected_interruptions']} interruptions, {doc['expected_redone_hours']} h redone) vs on-demand "
        + ("unpriced" if od_run is None else f"${Decimal(od_run):,.2f}")
    )
    if doc["spot_not_discounted"]:
        lines.append("! spot is not below on-demand here: no saving")
    return lines
