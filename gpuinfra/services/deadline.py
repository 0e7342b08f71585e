"""``gpuinfra plan``: every way to get the GPUs for a run by a deadline, priced side by side.

For a run of ``nodes`` x ``gpus`` for ``run_hours`` that must end by ``by``, one plan per way to
buy and cloud (the cheapest offer of that way in the scope), each with its start, expected finish,
total cost and risk:

* **on-demand now** (catalog on-demand price x nodes x hours). Risk: capacity is not guaranteed;
  a launch can fail with ``InsufficientInstanceCapacity`` (docs.aws.amazon.com/AWSEC2/latest/
  UserGuide/troubleshooting-launch.html) or ``ZONE_RESOURCE_POOL_EXHAUSTED``
  (cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability).
* **spot now**: the interruption rate of :func:`gpuinfra.services.spot_outlook.interruption_rate`
  (AWS Spot Instance Advisor band, or the stated assumption) and the re-work per interruption of
  :func:`gpuinfra.services.spot_outlook.redone_hours_each` (half the checkpoint interval plus one
  write), plus a restart (:data:`ASSUMED_RESTART_MINUTES`, an assumption, or ``--restart-minutes``).
  Model: interruptions are Poisson with mean ``rate x nodes x run hours``; each one costs
  ``c`` = restart + re-work hours. Expected finish = now + run hours + mean x c; expected cost = spot
  $/node-h x nodes x (run hours + mean x c); the probability of missing the deadline is
  P(N > floor(slack / c)), slack = hours until ``by`` - run hours (1 when the slack is negative).
* **AWS Capacity Block** (:func:`gpuinfra.capacity.capacity_block_offerings`, credentials needed):
  the offerings for the shortest block that holds the run (:func:`gpuinfra.capacity.
  capacity_block_duration_hours`) that start now or later and end by ``by``; cost = the upfront
  fee. Risk: paid up front, and "You can't modify or cancel a Capacity Block"
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-release.html); instances end
  at the block's end (EC2 begins 30 minutes before it).
* **GCP flex-start** (catalog flex-start / DWS price x nodes x hours): queued; a request waits
  "in a queue for up to two hours" and fails if no capacity is found
  (cloud.google.com/blog/products/compute/introducing-flex-start-vms-for-the-compute-engine-instance-api);
  VMs run "for a maximum of seven days" (cloud.google.com/compute/docs/instances/about-flex-start-vms).
  The expected finish assumes the longest wait; it is a bound, never a promise of a start.
* **GCP calendar-mode future reservation**: reserved resources for "a duration of up to 90 days"
  at a start date you request; Google Cloud approves or declines the request
  (cloud.google.com/compute/docs/instances/future-reservations-calendar-mode-overview); priced at
  the DWS price ("create a future reservation request in calendar mode to still benefit from DWS
  discounts", about-flex-start-vms) for the whole reserved window (whole hours).
* **reservations you hold**: AWS ODCRs and Capacity Blocks (``DescribeCapacityReservations``),
  GCP reservations (``reservations.aggregatedList``) of a fitting type with room for ``nodes``.
  An ODCR and a GCP reservation are billed at the on-demand rate whether used or not
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-pricing-billing.html;
  cloud.google.com/compute/docs/instances/reservations-overview), so the run costs its on-demand
  price (a calendar-mode one: the DWS price); a Capacity Block is already paid: $0 more.

Order: plans that meet the deadline, are fully priced and within ``budget_usd`` first, cheapest
first; then the rest, each marked (``misses deadline``, ``over budget``, ``unpriced``). Money fails
closed (:class:`gpuinfra.money.Total`): a plan without a price is never $0 and never ranked as
cheap. Without credentials the options that need them are named in ``not_seen``, one line each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gpuinfra.capacity import (
    capacity_block_duration_hours,
    capacity_block_offerings,
    held_capacity_reservations,
    held_gcp_reservations,
)
from gpuinfra.catalog.model import Offer
from gpuinfra.catalog.store import Catalog
from gpuinfra.credentials import aws_session, check_gcp_credentials_configured, gcp_credentials
from gpuinfra.errors import GpuinfraError, MissingDependencyError, NoOfferError, RequestError, SizingError
from gpuinfra.money import Total, usd_json
from gpuinfra.offers import OfferQuery, OfferScope, RankedOffer, find_offers, sold_as
from gpuinfra.plan.flex_start import FLEX_START_MAX_TTL_HOURS
from gpuinfra.plan.purchase import CALENDAR_MAX_VMS
from gpuinfra.requests import parse_gpu_spec
from gpuinfra.services.spot_outlook import interruption_rate, redone_hours_each
from gpuinfra.sizing import DEFAULT_HEADROOM_FRACTION
from gpuinfra.sizing.recommend import nothing_fits, sizing_request
from gpuinfra.sizing.report import size_document
from gpuinfra.spec import CAPACITY_BLOCK_TERMINATION_LEAD

#: Minutes to get a node back and resume after a spot interruption (replacement launch, boot,
#: checkpoint restore). An assumption, not a published number: shown as such; ``--restart-minutes``.
ASSUMED_RESTART_MINUTES = 15
#: Longest a flex-start request waits in the queue: "persist in a queue for up to two hours"
#: (cloud.google.com/blog/products/compute/introducing-flex-start-vms-for-the-compute-engine-instance-api).
FLEX_START_MAX_WAIT = timedelta(hours=2)
#: Longest a flex-start VM runs: "a maximum of seven days"
#: (cloud.google.com/compute/docs/instances/about-flex-start-vms), in hours.
FLEX_START_MAX_RUN_HOURS = FLEX_START_MAX_TTL_HOURS
#: Longest calendar-mode future reservation: "a duration of up to 90 days"
#: (cloud.google.com/compute/docs/instances/future-reservations-calendar-mode-overview).
CALENDAR_MAX_HOURS = 90 * 24
#: Shortest calendar-mode window: "You can reserve resources for a period between 1 and 90 days"
#: (cloud.google.com/compute/docs/instances/create-future-reservations-calendar-mode, Limitations);
#: a shorter run still reserves, and pays for, one day.
CALENDAR_MIN_HOURS = 24

#: The ways to buy a plan names (``way`` in the document), in the module docstring's order.
WAYS = ("on-demand", "spot", "capacity-block", "flex-start", "calendar-reservation", "held-reservation")


@dataclass(frozen=True)
class DeadlineRequest:
    """What ``gpuinfra plan`` plans for.

    Attributes:
        gpus: GPUs per node (``8xH100``); nodes: node count.
        run_hours: hours the run needs on those nodes (> 0).
        by: the deadline (UTC); now: the planning time (UTC).
        budget_usd: most the run may cost, or None.
        cloud / region: scope (None: both clouds, every region).
        checkpoint_plan: the sizing checkpoint plan (``interval_minutes``, ``upload_seconds``) or None.
        restart_minutes: minutes per spot interruption to get going again; None: the assumption.
    """

    gpus: str
    nodes: int
    run_hours: Decimal
    by: datetime
    now: datetime
    budget_usd: Decimal | None = None
    cloud: str | None = None
    region: str | None = None
    checkpoint_plan: dict | None = None
    restart_minutes: Decimal | None = None


@dataclass(frozen=True)
class BuyPlan:
    """One way to buy the run (module docstring).

    Attributes:
        way: one of :data:`WAYS`; cloud, region, zone, instance_type, nodes: where and what.
        start: when the run starts (UTC), None when it is for you to choose (calendar mode).
        finish: expected finish (UTC), None when it is for you to choose.
        total: the cost of the run (fails closed); upfront: paid before the start, not refundable.
        risk: the risk in words, with its source.
        meets_deadline: the expected finish is by the deadline (calendar mode: a window that ends
            by it can still be requested).
        miss_probability: spot only: P(missing the deadline) under the Poisson model.
        offering_id / reservation_id: the Capacity Block offering, or the held reservation.
        window_end: the end of a Capacity Block, held reservation or calendar-mode window (UTC).
        window_start: the start of a Capacity Block or of the calendar-mode window (the latest
            start that ends by the deadline), else None.
        price_source: where the price comes from.
    """

    way: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    nodes: int
    start: datetime | None
    finish: datetime | None
    total: Total
    risk: str
    meets_deadline: bool
    price_source: str
    upfront: bool = False
    miss_probability: float | None = None
    offering_id: str | None = None
    reservation_id: str | None = None
    window_end: datetime | None = None
    start_text: str = ""
    window_start: datetime | None = None
    marks: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """JSON view: times ISO 8601 UTC, money as :func:`gpuinfra.money.usd_json`."""
        return {
            "way": self.way,
            "cloud": self.cloud,
            "region": self.region,
            "zone": self.zone,
            "instance_type": self.instance_type,
            "nodes": self.nodes,
            "start": _iso(self.start),
            "start_text": self.start_text,
            "finish": _iso(self.finish),
            "compute_cost_usd": self.total.json(),
            "lines_without_price": self.total.missing,
            "upfront": self.upfront,
            "meets_deadline": self.meets_deadline,
            "miss_probability": None if self.miss_probability is None else round(self.miss_probability, 4),
            "risk": self.risk,
            "price_source": self.price_source,
            "offering_id": self.offering_id,
            "reservation_id": self.reservation_id,
            "window_start": _iso(self.window_start),
            "window_end": _iso(self.window_end),
            "marks": list(self.marks),
        }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sized_run(
    model: str,
    method: str,
    tokens: str,
    cloud: str | None,
    region: str | None,
    catalog: Catalog,
    now: datetime | None = None,
    by: datetime | None = None,
) -> tuple[str, int, Decimal, dict | None, dict]:
    """The configuration and hours of ``model`` trained with ``method`` on ``tokens``: the
    cheapest candidate of ``gpuinfra size`` (:func:`gpuinfra.sizing.report.size_document`,
    on-demand prices in the scope, ranked by the cost to finish) whose training hours fit
    between ``now`` and the deadline ``by`` (either None, or none fits: the cheapest), and the
    spot checkpoint plan of that configuration.

    Returns:
        (GPUs per node, nodes, run hours, checkpoint plan or None, what was sized, for the document).

    Raises:
        SizingError: a bad model, method or token count, or an inference method (no run length).
        NoOfferError: nothing in the scope fits the model.
    """
    req = sizing_request(
        model, None, method, 2048, 1, "bf16", None, None, tokens, None, "none", None, DEFAULT_HEADROOM_FRACTION, False
    )
    if req.method == "inference" or not req.tokens:
        raise SizingError("gpuinfra plan --model needs a training --method and --tokens (a run length)")
    scope = OfferScope(cloud=cloud, region=region)
    doc = size_document(req, catalog=catalog, scope=scope)
    timed = [c for c in doc["candidates"] if c.get("training_hours")]
    left_hours = None if now is None or by is None else Decimal((by - now).total_seconds()) / 3600
    in_time = [c for c in timed if left_hours is not None and Decimal(str(c["training_hours"])) <= left_hours]
    best = (in_time or timed or [None])[0]
    if best is None:
        raise nothing_fits(req, scope, catalog)
    spot = size_document(req, best["gpus"], best["nodes"], catalog=catalog, spot=True, scope=scope)
    hours = Decimal(str(best["training_hours"])).quantize(Decimal("0.01"), rounding=ROUND_CEILING)
    chosen = (
        "the cheapest configuration that finishes by the deadline"
        if in_time
        else "the cheapest configuration to finish (none finishes by the deadline)"
        if left_hours is not None
        else "the cheapest configuration to finish"
    )
    sized = {
        "model": doc["model"]["name"],
        "method": req.method,
        "tokens": req.tokens,
        "candidate": best,
        "chosen": chosen,
    }
    return best["gpus"], int(best["nodes"]), hours, spot.get("checkpoint_plan"), sized


def utc_now() -> datetime:
    """The planning time: now, in UTC (one function, so tests can set the clock)."""
    return datetime.now(UTC)


def parse_deadline(text: str, now: datetime) -> datetime:
    """``--by``: ``YYYY-MM-DD`` (00:00 UTC that day: the conservative reading) or an ISO 8601 time
    (``2026-12-20T18:00Z``; without an offset, UTC).

    Raises:
        RequestError: not a date or time, or not after ``now``.
    """
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise RequestError(f"--by {text!r} is not a date (2026-12-20) or a UTC time (2026-12-20T18:00Z)") from None
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if value <= now:
        raise RequestError(f"--by {text!r} is not in the future (now {now:%Y-%m-%d %H:%M} UTC)")
    return value


def check_run_source(gpus: str | None, hours: float | None, model: str | None, tokens: str | None) -> None:
    """Exactly one of ``--gpus`` with ``--hours`` or ``--model`` with ``--tokens``.

    Raises:
        RequestError: neither, both, or one half of a pair.
    """
    by_model, by_gpus = model is not None, gpus is not None or hours is not None
    if by_model == by_gpus:
        raise RequestError("give either --model M --method X --tokens T, or --gpus SPEC --nodes N --hours H")
    if by_model and not tokens:
        raise RequestError("--model needs --tokens (the run length comes from the tokens)")
    if by_gpus and (gpus is None or hours is None):
        raise RequestError("--gpus needs --hours, and --hours needs --gpus")


def check_budget(budget: float | None) -> Decimal | None:
    """``--budget`` in USD as a Decimal (None stays None).

    Raises:
        RequestError: not a finite number above 0.
    """
    if budget is None:
        return None
    if not math.isfinite(budget) or budget <= 0:
        raise RequestError(f"--budget must be a number of USD above 0, got {budget}")
    return Decimal(str(budget))


def check_restart_minutes(minutes: float | None) -> Decimal | None:
    """``--restart-minutes`` as a Decimal (None: :data:`ASSUMED_RESTART_MINUTES` is used).

    Raises:
        RequestError: not a finite number from 0 to 1440 (a day).
    """
    if minutes is None:
        return None
    if not math.isfinite(minutes) or not 0 <= minutes <= 1440:
        raise RequestError(f"--restart-minutes must be from 0 to 1440, got {minutes}")
    return Decimal(str(minutes))


def poisson_tail(mean: float, k: int) -> float:
    """P(N > k) for N ~ Poisson(``mean``); 1 for k < 0."""
    if k < 0:
        return 1.0
    term = cdf = math.exp(-mean)
    for i in range(1, k + 1):
        term *= mean / i
        cdf += term
    return max(0.0, 1.0 - cdf)


def _hours(delta: timedelta) -> Decimal:
    return Decimal(str(delta.total_seconds())) / 3600


def _after(start: datetime, hours: Decimal) -> datetime:
    return start + timedelta(seconds=float(hours * 3600))


def _cheapest(catalog: Catalog, req: DeadlineRequest, market: str) -> dict[str, RankedOffer]:
    """The cheapest offer per cloud in ``market`` (none for a cloud without one)."""
    try:
        ranked = find_offers(
            catalog, OfferQuery(parse_gpu_spec(req.gpus, req.nodes), cloud=req.cloud, region=req.region, market=market)
        )
    except NoOfferError:
        return {}
    best: dict[str, RankedOffer] = {}
    for r in ranked:
        best.setdefault(r.offer.cloud, r)
    return best


def _where(r: RankedOffer) -> dict[str, Any]:
    o = r.offer
    return {"cloud": o.cloud, "region": o.region, "zone": o.zone, "instance_type": o.instance_type, "nodes": r.nodes}


def _source(catalog: Catalog, offer: Offer) -> str:
    return f"catalog {catalog.date_for(offer.cloud)} ({offer.price_source or 'no source'})"


def on_demand_plans(catalog: Catalog, req: DeadlineRequest) -> list[BuyPlan]:
    """On-demand now, per cloud (module docstring)."""
    plans = []
    for cloud, r in _cheapest(catalog, req, "on-demand").items():
        why = (
            "InsufficientInstanceCapacity, docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html"
            if cloud == "aws"
            else "ZONE_RESOURCE_POOL_EXHAUSTED, cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability"
        )
        finish = _after(req.now, req.run_hours)
        plans.append(
            BuyPlan(
                way="on-demand",
                **_where(r),
                start=req.now,
                start_text="now",
                finish=finish,
                total=Total.of([r.price_per_hour_usd * req.run_hours]),
                risk=f"capacity not guaranteed: the launch can fail ({why})",
                meets_deadline=finish <= req.by,
                price_source=_source(catalog, r.offer),
            )
        )
    return plans


def spot_plans(catalog: Catalog, req: DeadlineRequest) -> list[BuyPlan]:
    """Spot now, per cloud, with expected re-work and the probability of missing the deadline."""
    plans = []
    restart_min = Decimal(ASSUMED_RESTART_MINUTES) if req.restart_minutes is None else req.restart_minutes
    for _cloud, r in _cheapest(catalog, req, "spot").items():
        rate, rate_source = interruption_rate(r.offer)
        redone_each_h, interval_min, assumed_interval = redone_hours_each(req.checkpoint_plan)
        each_h = redone_each_h + restart_min / 60
        mean = rate * req.nodes * req.run_hours
        extra_h = mean * each_h
        finish = _after(req.now, req.run_hours + extra_h)
        slack_h = _hours(req.by - req.now) - req.run_hours
        k = -1 if slack_h < 0 else math.floor(slack_h / each_h)
        miss = poisson_tail(float(mean), k)
        spot = r.offer.spot_price_per_hour_usd
        total = Total.of([None if spot is None else spot * req.nodes * (req.run_hours + extra_h)])
        assumed = [
            *(["interval assumed: no checkpoint plan"] if assumed_interval else []),
            *(["restart assumed"] if req.restart_minutes is None else []),
        ]
        risk = (
            f"interruptions: Poisson, {rate.quantize(Decimal('0.0000001'))}/node-h ({rate_source}), "
            f"expected {mean.quantize(Decimal('0.01'))}, each costing {restart_min} min restart + "
            f"{(redone_each_h * 60).quantize(Decimal('0.1'))} min re-work (checkpoint every {interval_min} min"
            + (f"; {', '.join(assumed)}" if assumed else "")
            + f"); P(miss deadline) {miss:.3f}"
        )
        plans.append(
            BuyPlan(
                way="spot",
                **_where(r),
                start=req.now,
                start_text="now",
                finish=finish,
                total=total,
                risk=risk,
                meets_deadline=finish <= req.by,
                price_source=f"catalog spot {r.offer.spot_price_date or 'undated'}",
                miss_probability=miss,
            )
        )
    return plans


def _flex_offers(catalog: Catalog, req: DeadlineRequest) -> dict[str, tuple[RankedOffer, bool]]:
    """GCP offer for flex-start / calendar mode: the cheapest priced in DWS, else (unpriced) the
    cheapest on-demand offer whose type is sold flex-start; ``(offer, priced)``."""
    if req.cloud == "aws":
        return {}
    priced = _cheapest(catalog, req, "flex-start").get("gcp")
    if priced is not None:
        return {"gcp": (priced, True)}
    try:
        ranked = find_offers(
            catalog, OfferQuery(parse_gpu_spec(req.gpus, req.nodes), cloud="gcp", region=req.region, market="on-demand")
        )
    except (NoOfferError, GpuinfraError):
        ranked = []
    for r in ranked:
        if sold_as(catalog, r.offer, "flex-start"):
            return {"gcp": (r, False)}
    return {}


def flex_start_plans(catalog: Catalog, req: DeadlineRequest) -> list[BuyPlan]:
    """GCP flex-start (DWS) now: queued start, at most seven days of run."""
    plans = []
    for r, priced in _flex_offers(catalog, req).values():
        price = r.market_price_per_hour_usd("flex-start") if priced else None
        finish = _after(req.now + FLEX_START_MAX_WAIT, req.run_hours)
        too_long = req.run_hours > FLEX_START_MAX_RUN_HOURS
        risk = (
            "queued: starts when Compute Engine finds the capacity, waiting up to 2 h, or the request fails "
            "(cloud.google.com/blog/products/compute/introducing-flex-start-vms-for-the-compute-engine-instance-api); "
            "the finish assumes the longest wait"
        )
        if too_long:
            risk += f"; the run is longer than flex-start's {FLEX_START_MAX_RUN_HOURS} h maximum (about-flex-start-vms)"
        plans.append(
            BuyPlan(
                way="flex-start",
                **_where(r),
                start=None,
                start_text="queued, within 2 h",
                finish=finish,
                total=Total.of([None if price is None else price * req.run_hours]),
                risk=risk,
                meets_deadline=finish <= req.by and not too_long,
                price_source=_source(catalog, r.offer)
                if priced
                else "no DWS price in the catalog: `gpuinfra catalog refresh --cloud gcp` reads them",
            )
        )
    return plans


def calendar_plans(catalog: Catalog, req: DeadlineRequest) -> list[BuyPlan]:
    """GCP calendar-mode future reservation: a window you request, ending by the deadline."""
    plans = []
    for r, priced in _flex_offers(catalog, req).values():
        reserved_h = max(req.run_hours.to_integral_value(rounding=ROUND_CEILING), Decimal(CALENDAR_MIN_HOURS))
        price = r.market_price_per_hour_usd("flex-start") if priced else None
        latest = req.by - timedelta(hours=int(reserved_h))
        fits = latest >= req.now and reserved_h <= CALENDAR_MAX_HOURS and req.nodes <= CALENDAR_MAX_VMS
        plans.append(
            BuyPlan(
                way="calendar-reservation",
                **_where(r),
                start=None,
                start_text=f"a window you request, starting by {latest:%Y-%m-%d %H:%M} UTC",
                finish=None,
                total=Total.of([None if price is None else price * reserved_h]),
                risk=(
                    f"Google Cloud approves or declines the request; the whole {reserved_h} h window is billed, "
                    "at most 90 days (cloud.google.com/compute/docs/instances/future-reservations-calendar-mode-overview)"
                    + (
                        ""
                        if req.nodes <= CALENDAR_MAX_VMS
                        else f"; one request holds at most {CALENDAR_MAX_VMS} VMs, this run needs {req.nodes}"
                    )
                ),
                meets_deadline=fits,
                window_start=latest,
                window_end=req.by,
                price_source=(_source(catalog, r.offer) + ", DWS price")
                if priced
                else "no DWS price in the catalog: `gpuinfra catalog refresh --cloud gcp` reads them",
            )
        )
    return plans


def capacity_block_plans(
    catalog: Catalog, req: DeadlineRequest, client_factory: Callable[[str, str], Any]
) -> tuple[list[BuyPlan], list[str]]:
    """AWS Capacity Block offerings that hold the run and end by the deadline; (plans, notes)."""
    if req.cloud == "gcp":
        return [], []
    aws = [r for r in _offers_any(catalog, req) if r.offer.cloud == "aws"]
    if not aws:
        return [], []
    try:
        duration = capacity_block_duration_hours(req.run_hours)
    except RequestError as exc:
        return [], [f"AWS Capacity Blocks: {exc}"]
    types = sorted({r.offer.instance_type for r in aws})
    regions = [req.region] if req.region else sorted({r.offer.region for r in aws})
    plans, notes = [], []
    for region in regions:
        for itype in types:
            try:
                offers = capacity_block_offerings(itype, req.nodes, duration, req.now, req.by, region, client_factory)
            except RequestError as exc:
                notes.append(f"AWS Capacity Blocks {itype} in {region}: {exc}")
                continue
            for o in offers:
                finish = _after(o.start, req.run_hours)
                usable_end = o.end - CAPACITY_BLOCK_TERMINATION_LEAD
                plans.append(
                    BuyPlan(
                        way="capacity-block",
                        cloud="aws",
                        region=region,
                        zone=o.availability_zone,
                        instance_type=itype,
                        nodes=req.nodes,
                        start=o.start,
                        start_text=f"{o.start:%Y-%m-%d %H:%M} UTC",
                        finish=finish,
                        total=Total.of([o.upfront_usd]),
                        upfront=True,
                        risk=(
                            f"{o.duration_hours} h block ending {o.end:%Y-%m-%d %H:%M} UTC, paid up front; it cannot be "
                            "modified or cancelled (docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-release.html) "
                            "and EC2 ends its instances from 30 min before the end"
                        ),
                        meets_deadline=finish <= req.by and finish <= usable_end,
                        price_source=f"EC2 DescribeCapacityBlockOfferings {o.offering_id}, read {req.now:%Y-%m-%d}",
                        offering_id=o.offering_id,
                        window_start=o.start,
                        window_end=o.end,
                    )
                )
    return plans, notes


def _offers_any(catalog: Catalog, req: DeadlineRequest) -> list[RankedOffer]:
    try:
        return find_offers(catalog, OfferQuery(parse_gpu_spec(req.gpus, req.nodes), cloud=req.cloud, region=req.region))
    except NoOfferError:
        return []


def held_aws_plans(
    catalog: Catalog, req: DeadlineRequest, client_factory: Callable[[str, str], Any]
) -> tuple[list[BuyPlan], list[str]]:
    """Reservations the AWS account holds that can take the run; (plans, notes)."""
    if req.cloud == "gcp":
        return [], []
    aws = [r for r in _offers_any(catalog, req) if r.offer.cloud == "aws"]
    types = sorted({r.offer.instance_type for r in aws})
    regions = [req.region] if req.region else sorted({r.offer.region for r in aws})
    plans, notes = [], []
    for region in regions if types else []:
        try:
            held = held_capacity_reservations(region, types, client_factory)
        except RequestError as exc:
            notes.append(f"AWS reservations in {region}: {exc}")
            continue
        for cr in held:
            if cr.available_instance_count < req.nodes:
                continue
            start = max(req.now, cr.start_date or req.now)
            finish = _after(start, req.run_hours)
            end = cr.end_date
            usable_end = (
                None if end is None else end - (CAPACITY_BLOCK_TERMINATION_LEAD if cr.capacity_block else timedelta())
            )
            offer = catalog.find_offer("aws", cr.instance_type, cr.zone_id)
            od = None if offer is None else offer.on_demand_price_per_hour_usd
            total = (
                Total.of([Decimal(0)])
                if cr.capacity_block
                else Total.of([None if od is None else od * req.nodes * req.run_hours])
            )
            plans.append(
                BuyPlan(
                    way="held-reservation",
                    cloud="aws",
                    region=region,
                    zone=cr.zone_id,
                    instance_type=cr.instance_type,
                    nodes=req.nodes,
                    start=start,
                    start_text="now" if start == req.now else f"{start:%Y-%m-%d %H:%M} UTC",
                    finish=finish,
                    total=total,
                    risk=(
                        "Capacity Block already paid: nothing more to pay"
                        if cr.capacity_block
                        else "On-Demand Capacity Reservation: billed at the on-demand rate whether used or not "
                        "(docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-pricing-billing.html)"
                    )
                    + ("" if end is None else f"; ends {end:%Y-%m-%d %H:%M} UTC"),
                    meets_deadline=finish <= req.by and (usable_end is None or finish <= usable_end),
                    price_source="paid already"
                    if cr.capacity_block
                    else f"catalog {catalog.date_for('aws')} on-demand",
                    reservation_id=cr.reservation_id,
                    window_end=end,
                )
            )
    return plans, notes


def held_gcp_plans(
    catalog: Catalog, req: DeadlineRequest, project: str, session: Any, compute_api: str
) -> tuple[list[BuyPlan], list[str]]:
    """Reservations the GCP project holds with room for the run; (plans, notes)."""
    if req.cloud == "aws":
        return [], []
    gcp = {r.offer.instance_type: r for r in _offers_any(catalog, req) if r.offer.cloud == "gcp"}
    try:
        held = held_gcp_reservations(project, session, compute_api)
    except RequestError as exc:
        return [], [f"GCP reservations in {project}: {exc}"]
    plans = []
    for res in held:
        if res.machine_type not in gcp or res.count - res.in_use < req.nodes:
            continue
        if req.region and not res.zone.startswith(req.region + "-"):
            continue
        offer = catalog.find_offer("gcp", res.machine_type, res.zone) or gcp[res.machine_type].offer
        hourly = offer.flex_start_price_per_hour_usd if res.calendar else offer.on_demand_price_per_hour_usd
        finish = _after(req.now, req.run_hours)
        plans.append(
            BuyPlan(
                way="held-reservation",
                cloud="gcp",
                region=res.zone.rsplit("-", 1)[0],
                zone=res.zone,
                instance_type=res.machine_type,
                nodes=req.nodes,
                start=req.now,
                start_text="now",
                finish=finish,
                total=Total.of([None if hourly is None else hourly * req.nodes * req.run_hours]),
                risk=(
                    "reservation billed whether used or not (cloud.google.com/compute/docs/instances/reservations-overview)"
                    + ("" if res.end is None else f"; deleted at {res.end:%Y-%m-%d %H:%M} UTC")
                ),
                meets_deadline=finish <= req.by and (res.end is None or finish <= res.end),
                price_source=f"catalog {catalog.date_for('gcp')} " + ("DWS" if res.calendar else "on-demand"),
                reservation_id=res.name,
                window_end=res.end,
            )
        )
    return plans, []


def rank_plans(plans: list[BuyPlan], budget_usd: Decimal | None) -> list[BuyPlan]:
    """Mark and order ``plans`` (module docstring): good ones cheapest first, then the rest."""
    marked = []
    for p in plans:
        marks = []
        if not p.meets_deadline:
            marks.append("misses deadline")
        if p.total.amount_usd is None:
            marks.append("unpriced")
        elif budget_usd is not None and p.total.amount_usd > budget_usd:
            marks.append("over budget")
        marked.append(replace(p, marks=tuple(marks)))
    far = datetime.max.replace(tzinfo=UTC)
    return sorted(
        marked,
        key=lambda p: (
            bool(p.marks),
            p.total.amount_usd is None,
            p.total.amount_usd or Decimal(0),
            p.finish or far,
            p.way,
            p.cloud,
            p.zone,
        ),
    )


def deadline_document(
    catalog: Catalog,
    req: DeadlineRequest,
    aws_client_factory: Callable[[str, str], Any] | None = None,
    gcp_session: Any = None,
    gcp_project: str | None = None,
    compute_api: str = "https://compute.googleapis.com",
    sized: dict | None = None,
) -> dict[str, Any]:
    """The plans for ``req`` (module docstring) as a JSON-ready document.

    Args:
        catalog: prices and offers.
        req: the run and its deadline.
        aws_client_factory: ``(service, region) -> boto3 client``; None: the default credential
            chain, and without credentials the AWS options that need them are listed in ``not_seen``.
        gcp_session / gcp_project: an ``AuthorizedSession``-like session and project; None:
            Application Default Credentials, else listed in ``not_seen``.
        compute_api: the Compute REST root (tests point it at a local stand-in).
        sized: the sizing that gave the hours (``gpuinfra plan --model``), shown as is.

    Raises:
        RequestError / CatalogError: a bad GPU spec, region or cloud.
    """
    parse_gpu_spec(req.gpus, req.nodes)
    plans = on_demand_plans(catalog, req) + spot_plans(catalog, req)
    plans += flex_start_plans(catalog, req) + calendar_plans(catalog, req)
    not_seen: list[str] = []
    notes: list[str] = []
    if req.cloud != "gcp":
        factory = aws_client_factory
        if factory is None:
            try:
                factory = default_aws_client_factory()
            except MissingDependencyError:
                factory = None
        if factory is None:
            not_seen += [
                "AWS Capacity Blocks (DescribeCapacityBlockOfferings): no AWS credentials",
                "AWS reservations you hold (DescribeCapacityReservations): no AWS credentials",
            ]
        else:
            for what, lookup in (("AWS Capacity Blocks", capacity_block_plans), ("AWS reservations", held_aws_plans)):
                try:
                    more, why = lookup(catalog, req, factory)
                except MissingDependencyError as exc:
                    more, why = [], [f"{what}: {exc}"]
                plans += more
                notes += why
    if req.cloud != "aws":
        session, project = gcp_session, gcp_project
        if session is None:
            session, project = _gcp_session(project)
        if session is None or not project:
            not_seen.append("GCP reservations you hold (reservations.aggregatedList): no GCP credentials or project")
        else:
            try:
                more, why = held_gcp_plans(catalog, req, project, session, compute_api)
            except MissingDependencyError as exc:
                more, why = [], [f"GCP reservations in {project}: {exc}"]
            plans += more
            notes += why
    ranked = rank_plans(plans, req.budget_usd)
    return {
        "gpus": req.gpus,
        "nodes": req.nodes,
        "run_hours": str(req.run_hours),
        "by": _iso(req.by),
        "now": _iso(req.now),
        "budget_usd": usd_json(req.budget_usd),
        "scope": {"cloud": req.cloud, "region": req.region},
        "catalog_date": catalog.catalog_date,
        "sized": sized,
        "plans": [p.to_json() for p in ranked],
        "meets_deadline": sum(1 for p in ranked if not p.marks),
        "not_seen": not_seen,
        "notes": notes,
    }


def default_aws_client_factory() -> Callable[[str, str], Any]:
    """boto3 clients from the default credential chain with short timeouts and few retries (one
    plan asks EC2 in every region that has the type: an unreachable endpoint must not stall it).

    Raises:
        MissingDependencyError: no AWS credentials are configured.
    """
    from botocore.config import Config  # botocore: only once credentials were found

    session = aws_session()
    config = Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 2, "mode": "standard"})
    return lambda service, region: session.client(service, region_name=region, config=config)


def _gcp_session(project: str | None) -> tuple[Any, str | None]:
    """google-auth's ``AuthorizedSession`` and project from Application Default Credentials, or
    (None, None) when none are configured (a file check first: no metadata-server probe off GCP)."""
    try:
        check_gcp_credentials_configured()
        from google.auth.transport.requests import AuthorizedSession  # google-auth: only with credentials

        credentials, default_project = gcp_credentials()
        return AuthorizedSession(credentials), project or default_project
    except (MissingDependencyError, ImportError):
        return None, None


def plan_lines(doc: dict[str, Any]) -> list[str]:
    """The text of :func:`deadline_document` for ``gpuinfra plan``."""
    lines = [
        f"{doc['nodes']} x {doc['gpus']} for {Decimal(doc['run_hours']):.1f} h, by {doc['by']} "
        f"(catalog {doc['catalog_date']}"
        + ("" if doc["budget_usd"] is None else f", budget ${Decimal(doc['budget_usd']):,.2f}")
        + "); compute and Capacity Block fees only: the stack's storage, network and bucket come on top "
        "(`gpuinfra cost` after `gpuinfra new`):"
    ]
    if not doc["plans"]:
        lines.append("  no way to buy fits this request in the scope")
    for i, p in enumerate(doc["plans"], 1):
        total = Total.from_json(p["compute_cost_usd"], p["lines_without_price"]).text()
        finish = p["finish"] or "-"
        marks = f"  [{', '.join(p['marks'])}]" if p["marks"] else ""
        ident = p["offering_id"] or p["reservation_id"]
        lines.append(
            f"{i:>2}. {p['way']:<20} {p['cloud']} {p['region']} {p['zone']} {p['instance_type']} x{p['nodes']}"
            + (f" ({ident})" if ident else "")
            + f": start {p['start_text']}, finish {finish}, compute {total}{' up front' if p['upfront'] else ''}{marks}"
        )
        lines.append(f"      risk: {p['risk']}")
        lines.append(f"      price: {p['price_source']}")
    for line in doc["not_seen"]:
        lines.append(f"not seen: {line}")
    for line in doc["notes"]:
        lines.append(f"note: {line}")
    return lines
