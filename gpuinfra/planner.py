"""Plan a cluster: GPU request + profile + filters -> the best offer and a cluster spec.

This is what ``gpuinfra new`` runs before it writes anything. Rules on top of
:func:`gpuinfra.offers.find_offers`:

* Spot: ``--spot`` / ``--on-demand`` win; otherwise a profile whose spot policy is
  ``preferred`` takes spot when a spot offer fits, else on-demand. A profile that forbids
  spot rejects ``--spot``.
* Multi-node clusters (nodes > 1) under a profile with ``placement: required`` only take
  types that support cluster/compact placement (docs/sources/cluster-facts.md section 6 items 1-3). A
  profile with ``high_bandwidth_networking: required`` only takes types with EFA or GPU NICs
  (items 5, 8), whatever the node count (the blueprints refuse such a type as well).
* ``scratch.required`` only takes types whose local NVMe can hold ``scratch.min_gib``: AWS
  instance store; GCP bundled local SSD, or an allowed attach count that is large enough
  (:class:`~gpuinfra.catalog.facts_model.LocalSsdFacts`).
* The type must be sold the way the cluster is bought: on-demand or spot
  (``InstanceFacts.provisioning_models``; e.g. a3-highgpu-1g/2g/4g are Spot/Flex-start only),
  which :func:`gpuinfra.offers.find_offers` already enforces.
* An instance type the user names (``--instance-type``, or a capacity reservation's type) wins
  over the profile: each profile setting it misses (:func:`profile_shortfalls`: placement,
  scratch, EFA/GPU NICs required -- or preferred for several nodes) becomes one warning, and
  the stack records a required setting relaxed to what the type can do (e.g. ``scratch.min_gib``
  lowered to the type's local NVMe), so the blueprint builds it. With ``strict`` (the library
  default) a missed *required* setting refuses the type instead (exit 4), as it refuses a type
  the planner picks itself; ``gpuinfra new --strict`` also sets ``warnings_are_errors``, so any
  missed setting, a preferred one included, refuses it. The clouds' own rules (sold in the
  market, offered in the zone, node limits, NIC layout) are never waived.

All decisions read :class:`~gpuinfra.catalog.facts_model.InstanceFacts`, never a name prefix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from gpuinfra.capacity import CapacityReservation
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.gpus import gpu_model
from gpuinfra.catalog.store import Catalog
from gpuinfra.errors import NoOfferError, RequestError, SpecError
from gpuinfra.locality import cheapest_gpu_note, rank_runs
from gpuinfra.offers import OfferQuery, RankedOffer, find_offers, sold_as
from gpuinfra.offers import gpu_request as offer_gpu_request
from gpuinfra.profiles import Profile
from gpuinfra.requests import GpuRequest
from gpuinfra.rules.spec_rules import rule_error, type_fabric_blocker
from gpuinfra.spec import (
    CAPACITY_BLOCK_END_MARGIN,
    ClusterSpec,
    DataSource,
    NetworkSettings,
    PriceSnapshot,
    check_gcp_project_id,
    check_new_stack_name,
    check_run_hours,
    format_validation_error,
)


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked ``gpuinfra new`` for (CLI flags, already typed).

    Attributes:
        gpus: GPU spec (``4xA100``) or None when ``instance_type`` names the type.
        nodes: node count.
        cloud, region, zone, instance_type: filters (None = any).
        spot: True/False when given explicitly, None to follow the profile.
        hours: run hours for the cost projection (None = profile default).
        name: stack name (None = derived from the offer).
        gcp_project: GCP project id for ``gcp:project`` (optional).
        include_local_zones: allow AWS Local Zones.
        capacity_reservation: an EC2 capacity reservation / Capacity Block read from EC2
            (:func:`gpuinfra.capacity.describe_capacity_reservation`): the plan takes its type,
            AZ and region, and at most its available instances.
        max_price_per_hour_usd: the stack's budget (``--max-price-per-hour``), recorded in the
            spec; ``new`` refuses the stack when its priced $/h is over it.
        data: the training data set (:func:`gpuinfra.datasource.resolve_data_set`): offers are
            then chosen by run cost (compute x run hours + moving the data once,
            :mod:`gpuinfra.locality`) and the spec records it.
        strict: an explicit ``instance_type`` must meet every setting the profile requires, as
            a type the planner picks does (refused otherwise); False (``gpuinfra new`` without
            ``--strict``): it is kept, with one warning per unmet setting (module docstring).
        warnings_are_errors: an explicit ``instance_type`` that misses any profile setting, one
            it only prefers included, is refused (``gpuinfra new --strict``: every warning the
            stack would be written with becomes a refusal).
        flex_start: GCP flex-start (``gpuinfra new --flex-start``): offers of types sold
            flex-start, ranked by their flex-start price where the catalog has one, else (the
            spec then has no price: its cost is incomplete) by their spot, then on-demand price.
        image_fabric: the GPU fabric the node image already carries (a bake's manifest
            ``fabric``, ``gpuinfra new --image baked:<name>``), e.g. ``tcpx``: a type whose fabric
            cannot be installed at boot (rule fabric-installable-at-boot) has it working when it
            equals the type's ``nic_layout``. None: the public DLAMI / DLVM.
    """

    gpus: str | None
    nodes: int = 1
    cloud: str | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    spot: bool | None = None
    hours: float | None = None
    name: str | None = None
    gcp_project: str | None = None
    include_local_zones: bool = False
    capacity_reservation: CapacityReservation | None = None
    max_price_per_hour_usd: float | None = None
    data: DataSource | None = None
    strict: bool = True
    warnings_are_errors: bool = False
    image_fabric: str | None = None
    flex_start: bool = False


@dataclass(frozen=True)
class Plan:
    """The outcome: the spec to write, the chosen offer and what it costs.

    Attributes:
        locality_note: with a data set, a sentence when the cheapest GPU offer is not the
            cheapest run (:func:`gpuinfra.locality.cheapest_gpu_note`), else "".
        warnings: one line per profile setting an explicit instance type misses (the spec
            records it relaxed); empty otherwise.
    """

    spec: ClusterSpec
    offer: RankedOffer
    catalog_date: str
    spot_from_profile: bool
    locality_note: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def compute_price_per_hour_usd(self) -> Decimal | None:
        """$/h of all nodes in the stack's market (:attr:`ClusterSpec.market`); None where the
        catalog has no price there (a flex-start offer ranked by another market's price)."""
        return self.offer.market_price_per_hour_usd(self.spec.market)

    @property
    def run_cost_usd(self) -> Decimal | None:
        """Projected cost of the run: $/h for all nodes x run hours (None: unpriced)."""
        price = self.compute_price_per_hour_usd
        return None if price is None else price * Decimal(str(self.spec.run_hours))


def scratch_capable(fact: InstanceFacts | None, min_gib: int) -> bool:
    """True when the type can give ``min_gib`` of local NVMe scratch (see module docstring)."""
    if fact is None:
        return False
    if fact.local_ssd.bundled_count:
        return fact.local_ssd.total_gib >= min_gib
    return fact.local_ssd.smallest_attach_count(min_gib) is not None


def max_scratch_gib(fact: InstanceFacts) -> float:
    """The most local NVMe the type can give, in GiB (bundled, or the largest attach count)."""
    lssd = fact.local_ssd
    return lssd.total_gib if lssd.bundled_count else max(lssd.attach_counts, default=0) * lssd.size_gib


@dataclass(frozen=True)
class Shortfall:
    """One profile setting an instance type does not meet.

    Attributes:
        need: what the profile asks for, with its rule ("at least 500 GiB local NVMe scratch
            (rule scratch-capacity)").
        has: what the type has instead ("g5.xlarge has 232 GiB").
        required: the profile requires it (offers the planner picks must meet it); False: the
            profile only prefers it.
        relaxed: the profile fields a stack records instead when the type is kept anyway
            (empty: nothing to change, the blueprint already does without).
        recorded: the same in words, for the warning.
    """

    need: str
    has: str
    required: bool
    relaxed: dict[str, Any] = field(default_factory=dict)
    recorded: str = ""

    def warning(self, profile: Profile) -> str:
        """The ``warning:`` line (without the prefix) when an explicit type is kept."""
        verb = "wants" if self.required else "prefers"
        return (
            f"profile {profile.name!r} {verb} {self.need}, but {self.has}; {self.recorded} (--strict refuses instead)"
        )


def profile_shortfalls(
    fact: InstanceFacts, profile: Profile, nodes: int, image_fabric: str | None = None
) -> list[Shortfall]:
    """The profile settings ``fact``'s type misses for a cluster of ``nodes`` (see the module
    docstring; rules in :data:`gpuinfra.rules.RULES`); ``image_fabric``: the fabric the node
    image carries (:attr:`PlanRequest.image_fabric`)."""
    itype = fact.instance_type
    found = []
    if nodes > 1 and profile.placement == "required" and not fact.placement.any:
        found.append(
            Shortfall(
                "cluster/compact placement or a workload policy (rule gcp-placement-supported / aws-placement-group)",
                f"{itype} has none (N1 hosts never do)" if fact.guest_accelerators else f"{itype} has none",
                True,
                {"placement": "none"},
                f"the stack records placement: none and its {nodes} nodes are not placed close together",
            )
        )
    # a fabric that cannot be installed at boot (A3 High's TCPX) is no usable fabric on gpuinfra's
    # images, unless a baked image already carries it
    blocked = type_fabric_blocker(fact, image_fabric)
    has = (
        f"{itype}'s {fact.nic_layout} fabric cannot be installed at boot (rule fabric-installable-at-boot)"
        if blocked
        else f"{itype} has none"
    )
    if (fact.gpu_nic_count == 0 or blocked) and profile.high_bandwidth_networking == "required":
        found.append(
            Shortfall(
                "EFA or GPUDirect NICs (rule high-bandwidth-nics)",
                has,
                True,
                {"high_bandwidth_networking": "preferred"},
                "the stack records high_bandwidth_networking: preferred and the nodes use plain networking",
            )
        )
    elif (fact.gpu_nic_count == 0 or blocked) and profile.high_bandwidth_networking == "preferred" and nodes > 1:
        found.append(
            Shortfall(
                f"EFA or GPUDirect NICs between its {nodes} nodes (rule high-bandwidth-nics)",
                has,
                False,
                {},
                "the nodes use plain networking",
            )
        )
    if profile.scratch.required and not scratch_capable(fact, profile.scratch.min_gib):
        found.append(_scratch_shortfall(fact, profile))
    return found


def _scratch_shortfall(fact: InstanceFacts, profile: Profile) -> Shortfall:
    """Too little local NVMe: the stack keeps all the type has (``scratch.min_gib`` lowered to
    it, so GCP attaches the most local SSD it takes), or none (``scratch.required: false``)."""
    has = int(max_scratch_gib(fact))
    need = f"at least {profile.scratch.min_gib} GiB local NVMe scratch (rule scratch-capacity)"
    if has:
        return Shortfall(
            need,
            f"{fact.instance_type} has {has} GiB",
            True,
            {"scratch": profile.scratch.model_copy(update={"min_gib": has})},
            f"the stack records scratch.min_gib: {has} (all it has)",
        )
    return Shortfall(
        need,
        f"{fact.instance_type} has no local NVMe",
        True,
        {"scratch": profile.scratch.model_copy(update={"required": False})},
        "the stack records scratch.required: false",
    )


def relax_profile(profile: Profile, shortfalls: list[Shortfall]) -> Profile:
    """``profile`` with each shortfall's setting relaxed to what the type can do."""
    updates: dict[str, Any] = {}
    for shortfall in shortfalls:
        updates.update(shortfall.relaxed)
    return profile.model_copy(update=updates) if updates else profile


def _profile_filter(
    catalog: Catalog, offers: list[RankedOffer], profile: Profile, nodes: int, image_fabric: str | None = None
) -> tuple[list[RankedOffer], list[str]]:
    """The offers whose type meets every required profile setting, and the settings that
    removed the others (in :func:`profile_shortfalls` order)."""
    reasons: list[str] = []
    kept = [r for r in offers if catalog.fact(r.offer.cloud, r.offer.instance_type) is not None]
    if len(kept) < len(offers):
        reasons.append("known hardware facts (rule nic-layout-matches-facts)")
    result = []
    for r in kept:
        fact = catalog.fact(r.offer.cloud, r.offer.instance_type)
        assert fact is not None  # kept
        missed = [s.need for s in profile_shortfalls(fact, profile, nodes, image_fabric) if s.required]
        reasons += [need for need in missed if need not in reasons]
        if not missed:
            result.append(r)
    return result, reasons


def _keep_explicit_type(
    catalog: Catalog,
    ranked: list[RankedOffer],
    kept: list[RankedOffer],
    profile: Profile,
    nodes: int,
    strict: bool,
    warnings_are_errors: bool = False,
    image_fabric: str | None = None,
) -> tuple[list[RankedOffer], Profile, tuple[str, ...]]:
    """The offers of the one type the user named, the profile the stack records and the
    warnings: every offer is kept and each missed setting relaxed and warned about, unless
    ``strict`` (then a missed required setting refuses the type, as the planner would) or
    ``warnings_are_errors`` (then any missed setting does).

    Raises:
        NoOfferError: the type misses a setting that refuses it (each named with its rule).
    """
    offer = ranked[0].offer
    fact = catalog.fact(offer.cloud, offer.instance_type)
    if fact is None:  # no facts, no blueprint: refused as the planner refuses it
        return kept, profile, ()
    shortfalls = profile_shortfalls(fact, profile, nodes, image_fabric)
    refused = shortfalls if warnings_are_errors else [s for s in shortfalls if s.required and strict]
    if refused:
        missed = "; ".join(f"{s.need}, but {s.has}" for s in refused)
        raise NoOfferError(
            f"{offer.instance_type} does not suit profile {profile.name!r}, which asks for {missed}",
            "pick another --profile or type, or drop --strict to write the stack with warnings",
        )
    waived = [s for s in shortfalls if s not in refused]
    return ranked, relax_profile(profile, waived), tuple(s.warning(profile) for s in waived)


def default_stack_name(offer: RankedOffer) -> str:
    """``<cloud>-<count>x<gpu>[-<nodes>n]`` in lower case, e.g. ``gcp-4xa100``."""
    name = f"{offer.offer.cloud}-{offer.requested_gpu_count}x{offer.offer.gpu}".lower()
    return name if offer.nodes == 1 else f"{name}-{offer.nodes}n"


def plan_cluster(catalog: Catalog, request: PlanRequest, profile: Profile, now: datetime) -> Plan:
    """Choose the best offer for ``request`` under ``profile`` and build the cluster spec.

    Args:
        catalog: loaded catalog.
        request: typed CLI input.
        profile: the resolved profile.
        now: creation time (UTC), the start of the TTL.

    Raises:
        RequestError: bad GPU spec, or neither ``gpus`` nor ``instance_type``, or spot
            against a profile that forbids it, or more nodes than one request on the cloud
            starts (:func:`gpuinfra.offers.node_limit`).
        CatalogError: unknown cloud/region/zone/type.
        NoOfferError: nothing fits (also after the profile's requirements; with ``strict``, an
            explicit type that misses one).
        SpecError: a stack name cloud resources cannot carry, or a GCP project that is not a
            project ID.
    """
    request, gpu_request = _prepared(catalog, request, profile)
    if request.flex_start:
        return _flex_start_plan(catalog, request, profile, gpu_request, now)
    spot_from_profile = request.spot is None and profile.spot.policy == "preferred"
    last_error: NoOfferError | None = None
    for market in markets_tried(request.spot, profile):
        try:
            kept, recorded, warnings = _market_offers(catalog, request, profile, gpu_request, market)
        except NoOfferError as exc:
            last_error = exc
            continue
        best, note = _best_run(kept, request, recorded) if request.data is not None else (kept[0], "")
        return _build_plan(
            catalog, request, recorded, best, now, spot_from_profile and market == "spot", note, warnings
        )
    assert last_error is not None
    raise last_error


#: Markets whose price ranks flex-start offers when the catalog prices none in flex-start: the
#: ranking only picks the zone; the stack then records no price (its cost stays incomplete).
FLEX_START_RANKING_MARKETS = ("flex-start", "spot", "on-demand")


def _flex_start_plan(
    catalog: Catalog, request: PlanRequest, profile: Profile, gpu_request: GpuRequest, now: datetime
) -> Plan:
    """The plan of ``new --flex-start``: the cheapest offer sold flex-start
    (:data:`FLEX_START_RANKING_MARKETS` order for the ranking), as a GCP flex-start spec.

    Raises:
        RequestError: ``--flex-start`` with ``--spot``/``--on-demand``, a capacity reservation or
            ``--cloud aws`` (flex-start is a GCP market).
        NoOfferError: no fitting type is sold flex-start (as :func:`plan_cluster`).
    """
    if request.spot is not None or request.capacity_reservation is not None or request.cloud == "aws":
        raise RequestError(
            "--flex-start is GCP's flex-start market (Dynamic Workload Scheduler): it excludes --spot, "
            "--on-demand, --capacity-reservation and --cloud aws"
        )
    request = replace(request, cloud="gcp")
    last_error: NoOfferError | None = None
    for market in FLEX_START_RANKING_MARKETS:
        try:
            kept, recorded, warnings = _market_offers(catalog, request, profile, gpu_request, market)
        except NoOfferError as exc:
            last_error = exc
            continue
        kept = [r for r in kept if sold_as(catalog, r.offer, "flex-start")]
        if kept:
            best, note = _best_run(kept, request, recorded) if request.data is not None else (kept[0], "")
            return _build_plan(catalog, request, recorded, best, now, False, note, warnings)
    assert last_error is not None
    raise last_error


def _prepared(catalog: Catalog, request: PlanRequest, profile: Profile) -> tuple[PlanRequest, GpuRequest]:
    """The checks :func:`plan_cluster` makes before ranking, the request narrowed to a capacity
    reservation, and the parsed GPU request (raises as :func:`plan_cluster`)."""
    if request.name is not None:
        check_new_stack_name(request.name)
    if request.gcp_project is not None and request.cloud != "aws":
        check_gcp_project_id(request.gcp_project)
    if request.capacity_reservation is not None:
        request = _with_reservation(request)
    check_run_hours(request.hours)
    gpu_request = offer_gpu_request(catalog, request.gpus, request.instance_type, request.cloud, request.nodes)
    if request.spot and profile.spot.policy == "forbidden":
        raise RequestError(
            f"profile-spot-policy: profile {profile.name!r} forbids spot capacity; "
            "drop --spot or pick another --profile"
        )
    return request, gpu_request


def _market_offers(
    catalog: Catalog, request: PlanRequest, profile: Profile, gpu_request: GpuRequest, market: str
) -> tuple[list[RankedOffer], Profile, tuple[str, ...]]:
    """The offers of ``market`` the profile takes, cheapest first (:func:`gpuinfra.offers.find_offers`
    order), with the profile the stack records and its warnings (an explicit type's relaxed
    settings).

    Raises:
        NoOfferError: nothing fits in ``market``, or nothing the profile takes.
    """
    query = OfferQuery(
        request=gpu_request,
        cloud=request.cloud,
        region=request.region,
        zone=request.zone,
        instance_type=request.instance_type,
        market=market,
        include_local_zones=request.include_local_zones,
    )
    ranked = find_offers(catalog, query)
    kept, reasons = _profile_filter(catalog, ranked, profile, gpu_request.nodes, request.image_fabric)
    recorded, warnings = profile, tuple[str, ...]()
    if request.instance_type:  # the user's choice: every offer is of this one type
        kept, recorded, warnings = _keep_explicit_type(
            catalog,
            ranked,
            kept,
            profile,
            gpu_request.nodes,
            request.strict,
            request.warnings_are_errors,
            request.image_fabric,
        )
    if not kept:
        raise NoOfferError(
            f"{len(ranked)} offers carry {gpu_request}, but profile {profile.name!r} needs "
            f"{' and '.join(reasons)} and none of them has it",
            "pick another --profile or type",
        )
    return kept, recorded, warnings


def placement_key(spec: ClusterSpec) -> tuple[str, str, str, str]:
    """``(cloud, region, zone, market)`` of a stack: where its capacity comes from. A fallback
    ladder's rungs differ in it (:func:`plan_alternatives`), so a stockout of one capacity pool
    is never retried as the next rung."""
    return (spec.cloud, spec.region, spec.zone, spec.market)


def plan_alternatives(
    catalog: Catalog, request: PlanRequest, profile: Profile, now: datetime, first: Plan
) -> Iterator[Plan]:
    """Plans for the offers that follow ``first`` in the ranking :func:`plan_cluster` chose it
    from: the markets of :func:`markets_tried` in order (``--spot`` / ``--on-demand`` alone; spot
    then on-demand for a profile that prefers spot), each market's offers cheapest first (by run
    cost with a data set, :func:`gpuinfra.locality.rank_runs`), over every zone, region and
    cloud the request's filters allow. Only the first offer of each :func:`placement_key` is
    planned, and none of ``first``'s. The plans are named like ``first`` (the caller renames
    them) and are not yet checked against the cloud rules (:func:`gpuinfra.verify.verify_spec`).

    Args:
        request, profile, now: what ``first`` was planned from (``plan_cluster``'s arguments).
        first: the plan :func:`plan_cluster` returned.

    Raises:
        as :func:`plan_cluster` for the request itself; a market with no offer is passed over.
    """
    request, gpu_request = _prepared(catalog, replace(request, name=first.spec.stack), profile)
    seen = {placement_key(first.spec)}
    spot_from_profile = request.spot is None and profile.spot.policy == "preferred"
    if request.flex_start:  # flex-start rungs: other GCP zones and regions sold flex-start
        request = replace(request, cloud="gcp")
    markets = FLEX_START_RANKING_MARKETS if request.flex_start else markets_tried(request.spot, profile)
    for market in markets:
        try:
            kept, recorded, warnings = _market_offers(catalog, request, profile, gpu_request, market)
        except NoOfferError:
            continue
        if request.flex_start:
            kept = [r for r in kept if sold_as(catalog, r.offer, "flex-start")]
        if request.data is not None:
            hours = Decimal(str(request.hours if request.hours is not None else recorded.default_run_hours))
            kept = [run.ranked for run in rank_runs(kept, request.data, hours) if run.run_usd is not None]
        for ranked in kept:
            key = (
                ranked.offer.cloud,
                ranked.offer.region,
                ranked.offer.zone,
                "flex-start" if request.flex_start else ranked.market,
            )
            if key in seen:
                continue
            seen.add(key)
            yield _build_plan(
                catalog, request, recorded, ranked, now, spot_from_profile and market == "spot", "", warnings
            )


def region_key(spec: ClusterSpec) -> tuple[str, str, str]:
    """``(cloud, region, market)`` of a stack: :func:`placement_key` without the zone. A stockout
    of a large GPU type is often region-wide, and a quota is per region and market (EC2 Service
    Quotas are regional; Compute Engine's GPU quotas are per region, one for on-demand and one
    ``PREEMPTIBLE_`` for Spot: docs/capacity.md), so a ladder spreads over these first
    (:func:`spread_alternatives`)."""
    cloud, region, _zone, market = placement_key(spec)
    return (cloud, region, market)


def spread_alternatives(first: Plan, ranked: list[Plan], count: int) -> list[Plan]:
    """The ``count`` alternatives of a fallback ladder, picked from ``ranked``
    (:func:`plan_alternatives` order) so that they spread: each pick is the best-ranked plan of
    the :func:`region_key` (cloud, region, market) that has the fewest rungs so far, ``first``'s
    included. So no (cloud, region, market) gets a second rung (another zone) while one the
    ranking offers has none, nor a third before every one has two. The picks are returned in
    ``ranked`` order (the ranking's price order among the chosen rungs).

    Args:
        first: rung 0 (:func:`plan_cluster`'s choice).
        ranked: candidate plans in ranking order, one per :func:`placement_key`, none of ``first``'s.
        count: how many to pick (fewer when ``ranked`` has fewer).

    Returns:
        The picked plans, a sub-sequence of ``ranked``.
    """
    rungs = {region_key(first.spec): 1}
    picked: set[int] = set()
    for _ in range(min(count, len(ranked))):
        index = min(
            (i for i in range(len(ranked)) if i not in picked),
            key=lambda i: (rungs.get(region_key(ranked[i].spec), 0), i),
        )
        picked.add(index)
        key = region_key(ranked[index].spec)
        rungs[key] = rungs.get(key, 0) + 1
    return [ranked[i] for i in sorted(picked)]


def markets_tried(spot: bool | None, profile: Profile) -> tuple[str, ...]:
    """The markets :func:`plan_cluster` tries, in order: ``--spot`` / ``--on-demand`` alone when
    given (``spot`` True / False); otherwise spot then on-demand when the profile's spot policy
    is ``preferred``, else on-demand."""
    if spot is None and profile.spot.policy == "preferred":
        return ("spot", "on-demand")
    return ("spot",) if spot else ("on-demand",)


def _best_run(kept: list[RankedOffer], request: PlanRequest, profile: Profile) -> tuple[RankedOffer, str]:
    """The offer with the cheapest run for the request's data set, and the locality note.

    Raises:
        NoOfferError: ``price-known``: no offer has a priced route for the data (never free).
    """
    hours = Decimal(str(request.hours if request.hours is not None else profile.default_run_hours))
    assert request.data is not None  # called only for a request with a data set
    runs = rank_runs(kept, request.data, hours)
    if runs[0].run_usd is None:
        raise NoOfferError(
            f"price-known: no transfer price for {request.data.describe()} to any of "
            f"{len(runs)} offers (first: {runs[0].transfer.route})"
        )
    return runs[0].ranked, cheapest_gpu_note(runs) or ""


def _with_reservation(request: PlanRequest) -> PlanRequest:
    """The request narrowed to what the capacity reservation holds.

    Raises:
        RequestError: a flag that contradicts the reservation (another cloud, type, zone,
            region, or spot).
        RuleViolationError: ``aws-capacity-reservation``: more nodes than it has available.
    """
    cr = request.capacity_reservation
    assert cr is not None  # called only for a request with a reservation
    for flag, given, reserved in (
        ("--cloud", request.cloud, "aws"),
        ("--instance-type", request.instance_type, cr.instance_type),
        ("--zone", request.zone, cr.zone_id),
        ("--region", request.region, cr.region),
    ):
        if given not in (None, reserved):
            raise RequestError(f"{flag} {given} contradicts capacity reservation {cr.reservation_id} ({reserved})")
    if request.spot:
        raise RequestError(f"capacity reservation {cr.reservation_id} is not spot capacity; drop --spot")
    if request.nodes > cr.available_instance_count:
        raise rule_error(
            "aws-capacity-reservation",
            "",
            f"nodes={request.nodes} but {cr.reservation_id} has {cr.available_instance_count} of "
            f"{cr.total_instance_count} instances available",
        )
    return replace(request, cloud="aws", region=cr.region, zone=cr.zone_id, instance_type=cr.instance_type, spot=False)


def _build_plan(
    catalog: Catalog,
    request: PlanRequest,
    profile: Profile,
    best: RankedOffer,
    now: datetime,
    spot_from_profile: bool,
    locality_note: str = "",
    warnings: tuple[str, ...] = (),
) -> Plan:
    offer = best.offer
    try:
        spec = _make_spec(catalog, request, profile, best, now)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, "gpuinfra:cluster")) from None
    return Plan(
        spec=spec,
        offer=best,
        catalog_date=catalog.date_for(offer.cloud),
        spot_from_profile=spot_from_profile,
        locality_note=locality_note,
        warnings=warnings,
    )


def _make_spec(
    catalog: Catalog, request: PlanRequest, profile: Profile, best: RankedOffer, now: datetime
) -> ClusterSpec:
    offer = best.offer
    return ClusterSpec(
        stack=request.name or default_stack_name(best),
        cloud=offer.cloud,
        region=offer.region,
        zone=offer.zone,
        instance_type=offer.instance_type,
        gpu=offer.gpu,
        gpu_count=offer.gpu_count,
        nodes=best.nodes,
        spot=best.spot and not request.flex_start,
        gcp_flex_start=request.flex_start,
        profile=_ttl_within_block(profile, request.capacity_reservation, now.replace(microsecond=0)),
        run_hours=request.hours if request.hours is not None else profile.default_run_hours,
        created_at=now.replace(microsecond=0),
        gcp_project=request.gcp_project if offer.cloud == "gcp" else None,
        # GCP nodes have no public IP: SSH goes through IAP TCP forwarding (OS Login decides who),
        # the counterpart of SSM Session Manager on AWS; without it the default cluster is unreachable.
        network=NetworkSettings(iap_ssh=offer.cloud == "gcp"),
        facts=catalog.fact(offer.cloud, offer.instance_type),
        **_reservation_fields(request.capacity_reservation),
        max_price_per_hour_usd=(
            None if request.max_price_per_hour_usd is None else Decimal(str(request.max_price_per_hour_usd))
        ),
        gpu_facts=gpu_model(offer.gpu),
        data=request.data,
        price=PriceSnapshot(
            on_demand_price_per_hour_usd=_money(offer.on_demand_price_per_hour_usd),
            spot_price_per_hour_usd=_money(offer.spot_price_per_hour_usd),
            flex_start_price_per_hour_usd=_money(offer.flex_start_price_per_hour_usd),
            catalog_date=catalog.date_for(offer.cloud),
        ),
    )


def _ttl_within_block(profile: Profile, cr: CapacityReservation | None, created_at: datetime) -> Profile:
    """``profile`` with its TTL cut to whole hours that end at least
    :data:`gpuinfra.spec.CAPACITY_BLOCK_END_MARGIN` before a Capacity Block's end (EC2 begins to
    end the block's instances 30 minutes before it; the agent then still has its sync bound).

    Raises:
        RequestError: the block ends too soon for a TTL of one hour.
    """
    if cr is None or not cr.capacity_block or cr.end_date is None:
        return profile
    usable = cr.end_date - CAPACITY_BLOCK_END_MARGIN - created_at
    hours = int(usable.total_seconds() // 3600)
    if hours < 1:
        raise RequestError(
            f"capacity block {cr.reservation_id} ends at {cr.end_date:%Y-%m-%d %H:%M} UTC: less than 1 h from now "
            f"once the nodes end {int(CAPACITY_BLOCK_END_MARGIN.total_seconds() // 60)} min before it (EC2 begins "
            "to end a block's instances 30 min before its end); use a block that ends later"
        )
    return profile if profile.ttl_hours <= hours else profile.model_copy(update={"ttl_hours": hours})


def _reservation_fields(cr: CapacityReservation | None) -> dict:
    if cr is None:
        return {}
    return {
        "capacity_block_end": cr.end_date if cr.capacity_block else None,
        "capacity_block_start": cr.start_date if cr.capacity_block else None,
        "capacity_reservation_id": cr.reservation_id,
        "capacity_reservation_instance_type": cr.instance_type,
        "capacity_reservation_zone": cr.zone_id,
        "capacity_reservation_instance_count": cr.available_instance_count,
        "capacity_reservation_placement_group": cr.placement_group,
        "capacity_block": cr.capacity_block,
        **(
            {
                "capacity_block_upfront_usd": _money(cr.upfront_price.upfront_usd),
                "capacity_block_price_source": cr.upfront_price.source,
                "capacity_block_price_date": cr.upfront_price.date,
            }
            if cr.capacity_block and cr.upfront_price is not None
            else {}
        ),
    }


def _money(value: Decimal | None) -> str | None:
    return None if value is None else format(value.normalize(), "f")
