"""The ``gpuinfra new`` service: a GPU request (or a model to size for) becomes a verified,
written stack file.

Steps of :func:`create_stack`: resolve the workload profile (with ``--model``/``--params``, the
method's), read a capacity reservation and locate the data set when asked, plan the cheapest
fitting offer (:func:`gpuinfra.planner.plan_cluster`; with a model, the configurations that hold
it in the stack's cloud, region and markets, and the cheapest plan among them: :func:`_plan_sized`),
run the real program offline over the spec as validation (:func:`gpuinfra.verify.verify_spec`: previewed, priced,
every cloud rule checked) and only then write ``stacks/Pulumi.<stack>.yaml``. Nothing is
written when any step refuses.

Names: a ``--name`` a stack file of the project folder already has is refused before anything
else (exit 5, unless ``--force``). The stack gets a random ``name_suffix``
(:func:`gpuinfra.spec.new_name_suffix`; ``--force`` keeps the replaced file's) that every fixed
cloud name of the stack carries (:mod:`gpuinfra.plan.naming`). With AWS credentials, ``new``
also asks the Resource Groups Tagging API whether the region already has resources tagged
``gpuinfra:stack=<name>`` (another folder's or another user's stack of that name) and warns:
the two stacks stay apart, but ``gpuinfra:stack`` cost reports and tag searches would mix them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuinfra import capacity
from gpuinfra.bake.stack import apply_baked_image, baked_image_targets
from gpuinfra.catalog.prices import usage_for
from gpuinfra.catalog.store import Catalog, load_catalog
from gpuinfra.cost.alternative import PricedAlternative, fully_priced_alternative
from gpuinfra.credentials import check_gcp_credentials_configured, gcp_credentials
from gpuinfra.datasource import resolve_data_set
from gpuinfra.errors import (
    GpuinfraError,
    NoOfferError,
    NotOfferedError,
    QuotaError,
    RequestError,
    RuleViolationError,
    SizingError,
)
from gpuinfra.money import usd_json
from gpuinfra.offers import OfferScope, RankedOffer
from gpuinfra.plan.naming import AWS_STACK_ID_TAG, GCP_STACK_ID_LABEL, stack_id
from gpuinfra.plan.tags import gcp_labels
from gpuinfra.planner import Plan, PlanRequest, markets_tried, plan_alternatives, plan_cluster
from gpuinfra.preflight import run_preflight
from gpuinfra.preview import run_preview_cached
from gpuinfra.profiles import DEFAULT_PROFILE, Profile, get_profile
from gpuinfra.sizing.recommend import PROFILE_FOR_METHOD, Candidate
from gpuinfra.sizing.report import StackSizing, size_for_stack
from gpuinfra.sizing.supply import fast_types
from gpuinfra.spec import ClusterSpec, NetworkSettings, new_name_suffix
from gpuinfra.stackfile import (
    WrittenFiles,
    check_stack_free,
    provider_config,
    purchased_block_price,
    recorded_name_suffix,
    write_stack,
)
from gpuinfra.verify import VerifiedPreview, verify_spec


@dataclass(frozen=True)
class NewStackRequest:
    """What ``gpuinfra new`` was asked for (its options, typed; None = not given).

    Attributes:
        plan: the planner's part (:class:`gpuinfra.planner.PlanRequest`: ``gpus``, ``nodes``,
            filters, ``spot``, ``hours``, ``name``, ``max_price_per_hour_usd``, ``gcp_project``,
            ``strict``). Its ``gpus`` / ``nodes`` are replaced by the sizing when ``model`` or
            ``params`` is given; its ``capacity_reservation`` and ``data`` are filled from the
            fields below.
        profile: workload profile name (default: the method's with ``model``/``params``, else
            :data:`gpuinfra.profiles.DEFAULT_PROFILE`).
        model, params, method: size the cluster for a model (``llama-3.1-8b``) or a parameter
            count (``7B``) and a method (``pretrain``/``full``/``lora``/``qlora``/``inference``;
            default ``full``) instead of ``plan.gpus``.
        capacity_reservation: AWS ``cr-...`` id, read from EC2 in ``plan.region`` (needs credentials).
        data, data_region, data_size: the training data set (``s3://``/``gs://`` URI, region,
            size such as ``2TB``); offers are then ranked by run cost with moving the data.
        profiles_dir: folder of user profile YAML files.
        image: ``baked:<name>``: boot a bake's image (:func:`gpuinfra.bake.stack.baked_image`);
            the stack records its id and manifest.
        ssh_cidr: AWS: allow SSH (TCP 22) from this IPv4 block (``network.ssh_cidr``).
        allow_world_ssh: with ``ssh_cidr``: it may be open to the world
            (``network.allow_world_ssh``, else such a block is refused).
        spot_max_price_usd: AWS spot: the fleet's maximum price per instance-hour
            (``spot_max_price_per_hour_usd`` of the spec, :func:`with_spot_max_price`); None:
            the budgeted spot price.
    """

    plan: PlanRequest
    profile: str | None = None
    model: str | None = None
    params: str | None = None
    method: str | None = None
    capacity_reservation: str | None = None
    data: str | None = None
    data_region: str | None = None
    data_size: str | None = None
    profiles_dir: Path | None = None
    image: str | None = None
    ssh_cidr: str | None = None
    allow_world_ssh: bool = False
    spot_max_price_usd: Decimal | None = None


@dataclass(frozen=True)
class NewStackResult:
    """A written stack: its plan, files, verified preview and (with a model) its sizing.

    Attributes:
        plan: the spec, the chosen offer, warnings and notes.
        written: the stack file and any scaffolded project files.
        verified: the offline preview that passed every rule, with its cost summary.
        sizing: how a model was sized into the GPU request; None for ``gpus``/``instance_type``.
        preflight: the quota preflight's note lines (:func:`gpuinfra.preflight.run_preflight`;
            one line saying it did not run when no credentials are found).
        alternative: when the total is incomplete and the request fixed no region or zone, the
            cheapest offer of the same request whose region prices every line
            (:func:`priced_alternative`); else None.
    """

    plan: Plan
    written: WrittenFiles
    verified: VerifiedPreview
    sizing: StackSizing | None = None
    preflight: tuple[str, ...] = ()
    alternative: PricedAlternative | None = None

    @property
    def pricing(self) -> str:
        """``spot``, ``on-demand`` or ``flex-start`` (:attr:`gpuinfra.spec.ClusterSpec.market`)."""
        return self.plan.spec.market

    def to_json(self) -> dict[str, Any]:
        """The ``gpuinfra new --json`` document (USD as :func:`gpuinfra.money.usd_json` strings;
        ``cost`` is the verified preview's cost summary)."""
        spec, offer = self.plan.spec, self.plan.offer
        return {
            "stack": spec.stack,
            "stack_file": str(self.written.stack_file),
            "scaffolded": [str(p) for p in self.written.scaffolded],
            "cloud": spec.cloud,
            "region": spec.region,
            "zone": spec.zone,
            "instance_type": spec.instance_type,
            "gpu": spec.gpu,
            "gpu_count": spec.gpu_count,
            "nodes": spec.nodes,
            "pricing": self.pricing,
            "profile": spec.profile.name,
            "round_up": offer.round_up,
            # compute only (the nodes' instance-hours); every line's total is under "cost"
            "compute_price_per_hour_usd": usd_json(self.plan.compute_price_per_hour_usd),
            "run_hours": spec.run_hours,
            "compute_run_cost_usd": usd_json(self.plan.run_cost_usd),
            "catalog_date": self.plan.catalog_date,
            "expires_at": spec.expires_at.isoformat(),
            "next": f"gpuinfra up {spec.stack}",
            "resources": len(self.verified.preview.resources),
            "cost": self.verified.cost,
            "data": None if spec.data is None else spec.data.model_dump(mode="json"),
            "locality_note": self.plan.locality_note or None,
            "spot": None
            if not spec.spot
            else {
                "spot_price_per_node_hour_usd": usd_json(offer.offer.spot_price_per_hour_usd),
                "spot_price_date": offer.offer.spot_price_date or None,
                "spot_price_min_per_node_hour_usd": usd_json(offer.offer.spot_price_min_per_hour_usd),
                "spot_price_max_per_node_hour_usd": usd_json(offer.offer.spot_price_max_per_hour_usd),
                "spot_not_discounted": offer.offer.spot_not_discounted,
                "fleet_max_price_per_instance_hour_usd": usd_json(spec.spot_max_price_per_hour_usd),
            },
            "warnings": list(self.plan.warnings),
            "sizing": None if self.sizing is None else self.sizing.to_json(),
            "fully_priced_alternative": None if self.alternative is None else self.alternative.to_json(),
        }


@dataclass(frozen=True)
class PreparedStack:
    """A stack planned and verified, not yet written (:func:`prepare_stack`).

    Attributes:
        plan, verified, sizing: as in :class:`NewStackResult`.
        image_config: ``gpuinfra:image`` of a baked image, or None.
        checkpoint_plan: ``gpuinfra:checkpoint_plan`` of a spot stack sized from a model, or None.
        planned: the planner request ``plan`` came from (with a model: the sized GPUs and nodes).
        profile: the resolved workload profile.
        catalog: the catalog it was planned and verified with.
        now: its creation time (UTC).
        preflight: the quota preflight's note lines for ``plan`` (:func:`gpuinfra.preflight.run_preflight`).
        alternative: as in :class:`NewStackResult`.
    """

    plan: Plan
    verified: VerifiedPreview
    sizing: StackSizing | None
    image_config: dict | None
    checkpoint_plan: dict | None
    planned: PlanRequest
    profile: Profile
    catalog: Catalog
    now: datetime
    preflight: tuple[str, ...] = ()
    alternative: PricedAlternative | None = None


def create_stack(
    request: NewStackRequest, project_dir: Path, force: bool = False, now: datetime | None = None
) -> NewStackResult:
    """Plan, verify and write the stack for ``request`` (module docstring).

    Args:
        request: the options.
        project_dir: the Pulumi project folder; ``stacks/`` is created, and ``Pulumi.yaml`` +
            ``program/`` are scaffolded when it has no project yet.
        force: replace an existing stack file.
        now: creation time, UTC (the start of the TTL; default: now).

    Raises:
        RequestError: contradicting options (``--model`` with ``--gpus``, ``--method`` alone,
            ``--capacity-reservation`` without ``--region``) or a bad value.
        SizingError, ProfileError, DataSourceError, CatalogError, SpecError: bad input (exit 2).
        RuleViolationError: the verified preview breaks a cloud rule (exit 2).
        NoOfferError: nothing fits (exit 4).
        MissingDependencyError: a lookup (reservation, bucket) needs credentials (exit 6).
        FileExistsGpuinfraError: the stack file exists and not ``force`` (exit 5; checked first when
            ``--name`` is given, so nothing is planned or asked of a cloud).
        ProjectDirError: ``project_dir`` cannot be written (exit 2).
        QuotaError: with credentials, the quota preflight found a shortfall (exit 9; nothing written).
        NotOfferedError: with credentials, the zone does not offer the type (exit 4; nothing written).
    """
    ready = prepare_stack(request, project_dir, force, now)
    written = write_stack(
        ready.plan, project_dir, force=force, image_config=ready.image_config, checkpoint_plan=ready.checkpoint_plan
    )
    return NewStackResult(ready.plan, written, ready.verified, ready.sizing, ready.preflight, ready.alternative)


def prepare_stack(
    request: NewStackRequest,
    project_dir: Path,
    force: bool = False,
    now: datetime | None = None,
    preflight_refuses: bool = True,
) -> PreparedStack:
    """Everything :func:`create_stack` does but the write: plan, :func:`finish_plan`, then the
    quota preflight of the plan (:func:`gpuinfra.preflight.run_preflight`, when credentials are
    found). ``new --fallback`` runs it for the chosen stack only; each alternative is preflighted
    by ``up --fallback`` when it is tried.

    Args:
        preflight_refuses: a shortfall raises (a plain ``new``); False: it becomes a note line
            starting ``refused:`` and the stack is prepared anyway (``new --fallback N``, N >= 1:
            ``up --fallback`` skips a refused rung when it still falls short then).

    Raises:
        as :func:`create_stack`, but nothing is written.
    """
    planned, profile = request.plan, request.profile
    if planned.name and not force:  # before any planning or cloud call: one clear refusal, nothing written
        check_stack_free(project_dir, planned.name)
    sized = bool(request.model or request.params)
    if sized:
        if planned.gpus or planned.instance_type or request.capacity_reservation:
            raise RequestError(
                "give either --model/--params (sized for you) or --gpus/--instance-type/"
                "--capacity-reservation, not both"
            )

        method = request.method or "full"
        if method not in PROFILE_FOR_METHOD:
            raise SizingError(f"--method must be one of {', '.join(PROFILE_FOR_METHOD)}, got {method!r}")
        profile = profile or PROFILE_FOR_METHOD[method]
    elif request.method:
        raise RequestError("--method goes with --model or --params")
    resolved = get_profile(profile or DEFAULT_PROFILE, request.profiles_dir)
    if request.image:  # a baked image decides the cloud, and the type when it was baked for one
        cloud, types, fabric, region = baked_image_targets(project_dir, request.image)
        planned = replace(
            planned,
            cloud=planned.cloud or cloud,
            region=planned.region or region,
            image_fabric=fabric,
            instance_type=planned.instance_type or (types[0] if len(types) == 1 else None),
        )
    catalog = load_catalog()
    if request.capacity_reservation:
        if not planned.region:
            raise RequestError("--capacity-reservation needs --region (EC2 reads reservations per region)")
        reservation = capacity.describe_capacity_reservation(request.capacity_reservation, planned.region)
        if reservation.capacity_block:  # its upfront fee, for the cost (None: the total stays incomplete)
            # the fee `gpuinfra plan --buy` bought it at, else a fresh quote of the same block
            bought = purchased_block_price(project_dir, reservation)
            reservation = replace(reservation, upfront_price=bought or capacity.quote_capacity_block(reservation))
        planned = replace(planned, capacity_reservation=reservation)
    planned = replace(planned, data=resolve_data_set(request.data, request.data_region, request.data_size))
    now = now or datetime.now(UTC)
    sizing = None
    if sized:
        plan, sizing, planned = _plan_sized(catalog, request, planned, resolved, now)
    else:
        plan = plan_cluster(catalog, planned, resolved, now)
    checkpoint = None
    if sizing is not None and sizing.checkpoint_plan is not None:  # spot: the checkpoint plan goes into the stack file
        checkpoint = sizing.checkpoint_plan.to_json()
    plan, image_config = settle_plan(plan, request, project_dir, force)
    pinned = planned.region is not None or planned.zone is not None
    try:
        verified = verify_spec(plan.spec, catalog)  # refuses before anything is written
    except RuleViolationError as exc:
        note = None if pinned else _unpriced_budget_note(exc, catalog, planned, resolved, now, plan)
        if note is None:
            raise
        raise RuleViolationError([*exc.violations, note]) from None
    try:
        preflight = run_preflight(plan.spec, catalog)  # quotas and offerings, when credentials are found
    except (QuotaError, NotOfferedError) as exc:
        if preflight_refuses:
            raise
        preflight = [f"refused (exit {int(exc.exit_code)}): {line}" for line in str(exc).splitlines()]
    alternative = None
    if verified.cost["lines_without_price"] and not pinned:
        alternative = priced_alternative(catalog, planned, resolved, now, plan, verified.preview.resources)
    return PreparedStack(
        plan, verified, sizing, image_config, checkpoint, planned, resolved, catalog, now, tuple(preflight), alternative
    )


def priced_alternative(
    catalog: Catalog,
    planned: PlanRequest,
    profile: Profile,
    now: datetime,
    plan: Plan,
    resources: list,
    max_hourly_usd: Decimal | None = None,
) -> PricedAlternative | None:
    """The cheapest offer of ``plan``'s request, in its market and cloud, whose region prices
    every line of the stack (:func:`gpuinfra.cost.alternative.fully_priced_alternative` over
    :func:`gpuinfra.planner.plan_alternatives`' ranking), priced for the stack's run hours,
    usage and data set; None when none is. No second preview runs: the stack's own resources
    are priced again per region (a few milliseconds each); a candidate of another instance type
    gets its own offline preview (at most :data:`gpuinfra.cost.alternative.MAX_PREVIEWS`).

    Args:
        planned, profile, now: what ``plan`` was planned from.
        plan, resources: the finished plan and its previewed resources (its total incomplete).
        max_hourly_usd: pass over an alternative whose whole $/h is above it (the budget).
    """
    spec = plan.spec
    plans: dict[int, Plan] = {}

    def candidates() -> Iterator[RankedOffer]:
        for alt in plan_alternatives(catalog, planned, profile, now, plan):
            if alt.spec.market == spec.market:
                plans[id(alt.offer)] = alt
                yield alt.offer

    def preview(offer: RankedOffer) -> list | None:
        """The resources of the candidate's own stack (another instance type), or None."""
        alt = plans[id(offer)].spec.model_copy(update={"name_suffix": spec.name_suffix})
        try:
            return run_preview_cached(alt, provider_config(alt)).resources
        except GpuinfraError:  # the blueprint refuses it: no alternative to name
            return None

    return fully_priced_alternative(
        resources,
        candidates(),
        catalog,
        usage_for(spec.profile.name),
        Decimal(str(spec.run_hours)),
        spec.market,
        spec.data,
        max_hourly_usd,
        preview,
    )


@dataclass(frozen=True)
class AlternativeNote:
    """One line added to a refusal (anything with ``line()`` goes into a :class:`RuleViolationError`)."""

    text: str

    def line(self) -> str:
        """The text itself: it names no broken rule."""
        return self.text


def _unpriced_budget_note(
    exc: RuleViolationError, catalog: Catalog, planned: PlanRequest, profile: Profile, now: datetime, plan: Plan
) -> AlternativeNote | None:
    """When the only refusal is ``budget-max-price`` for lines without a price (no budget passes
    an incomplete total), the cheapest fully priced alternative within the budget
    (:func:`priced_alternative`) as one line; else None. Its resources are the refused preview's,
    read back from the preview cache (:func:`gpuinfra.preview.run_preview_cached`)."""
    budget = plan.spec.max_price_per_hour_usd
    rules = {getattr(v, "rule", None) for v in exc.violations}
    if budget is None or rules != {"budget-max-price"}:
        return None
    if not all(getattr(v, "message", "").startswith("no price for ") for v in exc.violations):
        return None  # over the budget with a complete total: the budget speaks for itself
    resources = run_preview_cached(plan.spec, provider_config(plan.spec)).resources
    alt = priced_alternative(catalog, planned, profile, now, plan, resources, Decimal(budget))
    if alt is None:
        return None
    where = alt.offer.offer
    return AlternativeNote(
        f"complete total within the budget in {where.region}: ${alt.hourly_usd:,.2f}/h in all "
        f"(${alt.compute_price_per_hour_usd:,.2f}/h compute, {where.instance_type} {alt.market} in {where.zone}), "
        f"${alt.run_usd:,.2f} for the {plan.spec.run_hours:g} h run; rerun with --region {where.region}"
    )


def finish_plan(
    plan: Plan, request: NewStackRequest, project_dir: Path, catalog: Catalog, force: bool = False
) -> tuple[Plan, VerifiedPreview, dict | None]:
    """The user's settings a planned offer gets before it is written -- SSH access
    (:func:`with_ssh_access`), the fleet's spot maximum price (:func:`with_spot_max_price`), a
    baked image (:func:`gpuinfra.bake.stack.apply_baked_image`), a new ``name_suffix`` (``force``:
    the replaced file's) and the warning about a same-named stack in the cloud
    (:func:`cloud_stack_warning`) -- then the check of every cloud rule
    (:func:`gpuinfra.verify.verify_spec`). ``gpuinfra new`` runs it on its plan, and
    ``new --fallback`` on each rung of the ladder.

    Returns:
        The finished plan, its verified preview and ``gpuinfra:image`` (None without an image).

    Raises:
        RequestError: a setting the plan's cloud or market does not take (exit 2).
        BakeError: the baked image does not suit the plan (exit 2).
        RuleViolationError, SpecError: the verified preview breaks a cloud rule (exit 2).
    """
    plan, image_config = settle_plan(plan, request, project_dir, force)
    verified = verify_spec(plan.spec, catalog)  # refuses before anything is written
    return plan, verified, image_config


def settle_plan(
    plan: Plan, request: NewStackRequest, project_dir: Path, force: bool = False
) -> tuple[Plan, dict | None]:
    """:func:`finish_plan` without the check of the cloud rules: the finished plan and
    ``gpuinfra:image`` (None without an image).

    Raises:
        RequestError, BakeError: as :func:`finish_plan`.
    """
    if request.ssh_cidr or request.allow_world_ssh:
        plan = with_ssh_access(plan, request.ssh_cidr, request.allow_world_ssh)
    plan = with_spot_max_price(plan, request.spot_max_price_usd)
    image_config = None
    if request.image:  # a baked image: its id goes into the spec, its manifest next to it
        plan, image_config = apply_baked_image(plan, project_dir, request.image)
    suffix = (recorded_name_suffix(project_dir, plan.spec.stack) if force else None) or new_name_suffix()
    plan = replace(plan, spec=plan.spec.model_copy(update={"name_suffix": suffix}))
    elsewhere = cloud_stack_warning(plan.spec)
    if elsewhere:
        plan = replace(plan, warnings=(*plan.warnings, elsewhere))
    return plan, image_config


def with_spot_max_price(plan: Plan, requested_usd: Decimal | None) -> Plan:
    """``plan`` with the AWS fleet's maximum spot price per instance-hour in its spec.

    Default: the offer's catalog spot price per node-hour, the price the budget and the cost
    estimate use, so the bill never exceeds its basis (EC2 Fleet ``MaxPrice`` /
    ``MaxTotalPrice``: docs.aws.amazon.com/AWSEC2/latest/APIReference/API_SpotOptionsRequest.html).
    GCP Spot VMs take no maximum price (cloud.google.com/compute/docs/instances/spot): the
    spec keeps None there.

    Args:
        requested_usd: ``--spot-max-price``: USD per instance-hour, or None for the default.

    Raises:
        RequestError: ``requested_usd`` on a non-spot or GCP stack, not positive, or above the
            offer's on-demand price (exit 2).
    """
    spec, offer = plan.spec, plan.offer.offer
    if not (spec.spot and spec.cloud == "aws"):
        if requested_usd is not None:
            raise RequestError("--spot-max-price goes with an AWS spot stack (--spot; GCP Spot VMs have no max price)")
        return plan
    price = requested_usd if requested_usd is not None else offer.spot_price_per_hour_usd
    on_demand = offer.on_demand_price_per_hour_usd
    if price is None:
        return plan  # no spot price: the stack is unpriced and fails closed elsewhere
    if not price.is_finite() or price <= 0:
        raise RequestError(f"--spot-max-price must be a positive USD amount per instance-hour, got {price}")
    if on_demand is not None and price > on_demand:
        raise RequestError(
            f"--spot-max-price {price.normalize():f} is above the on-demand price {on_demand.normalize():f} of "
            f"{offer.instance_type}: "
            "take on-demand instead"
        )
    return replace(plan, spec=spec.model_copy(update={"spot_max_price_per_hour_usd": price}))


def with_ssh_access(plan: Plan, ssh_cidr: str | None, allow_world_ssh: bool) -> Plan:
    """``plan`` with ``network.ssh_cidr`` (and ``network.allow_world_ssh``) set in its spec.

    Raises:
        RequestError: a GCP stack (its nodes are reached over IAP), ``--allow-world-ssh``
            without ``--ssh-cidr``, or a block the spec refuses (not IPv4, open to the world
            without ``--allow-world-ssh``: :class:`gpuinfra.spec.NetworkSettings`); exit 2.
    """
    spec = plan.spec
    if spec.cloud != "aws":
        raise RequestError("--ssh-cidr and --allow-world-ssh are AWS settings; GCP nodes are reached over IAP")
    if not ssh_cidr:
        raise RequestError("--allow-world-ssh goes with --ssh-cidr (the block that may be open to the world)")
    network = {**spec.network.model_dump(), "ssh_cidr": ssh_cidr, "allow_world_ssh": allow_world_ssh or None}
    try:
        checked = NetworkSettings.model_validate(network)
    except ValidationError as exc:
        raise RequestError(f"--ssh-cidr: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    return replace(plan, spec=type(spec).model_validate({**spec.model_dump(), "network": checked}))


def _plan_sized(
    catalog: Catalog, request: NewStackRequest, planned: PlanRequest, profile: Profile, now: datetime
) -> tuple[Plan, StackSizing, PlanRequest]:
    """Size the model in the stack's scope (cloud, region, zone, type, the baked image's fabric
    and the markets the planner tries, :func:`gpuinfra.planner.markets_tried`), then plan the
    fitting configurations best first and keep the cheapest plan: the planner may round a
    configuration up or take another type of the same GPUs, so configurations are planned until
    the next one's own price is no lower than the cheapest plan so far. A configuration the
    planner refuses (profile needs, node limits ...) or whose compute price is over
    ``--max-price-per-hour`` is passed over. A configuration sharded over several nodes is
    planned only on types with a high-bandwidth GPU network
    (:func:`gpuinfra.sizing.supply.fast_types`), with the profile's required settings enforced.

    Returns:
        The plan, its sizing, and the planner request it was planned from (the sized GPUs and
        nodes; a fallback ladder ranks its alternatives from it).

    Raises:
        NoOfferError: nothing in the scope fits, or every configuration that does was passed
            over (the first three are named with why).
    """
    scope = OfferScope(
        cloud=planned.cloud,
        region=planned.region,
        zone=planned.zone,
        instance_type=planned.instance_type,
        markets=markets_tried(planned.spot, profile),
        include_local_zones=planned.include_local_zones,
        image_fabric=planned.image_fabric,
    )
    sizing = size_for_stack(request.model, request.params, request.method, catalog, scope, command="new")
    budget = planned.max_price_per_hour_usd
    refused: list[tuple[Candidate, str]] = []
    best: tuple[Plan, Candidate, PlanRequest] | None = None
    for candidate in sizing.candidates:
        price = candidate.price_per_hour_usd
        if best is not None and price is not None and price >= best[0].offer.price_per_hour_usd:
            break  # every later configuration costs at least this much
        sized = replace(planned, gpus=candidate.spec, nodes=candidate.nodes)
        # sharded over nodes: only types with EFA / GPUDirect, each held to the profile as the planner holds it
        types = (
            fast_types(catalog, candidate.gpu, candidate.gpus_per_node, scope)
            if sizing.request.sharded and candidate.nodes > 1 and not planned.instance_type
            else [None]
        )
        for instance_type in types:
            where = f"{candidate.spec} x {candidate.nodes} node(s){' as ' + instance_type if instance_type else ''}"
            used = replace(sized, instance_type=instance_type, strict=True) if instance_type else sized
            try:
                plan = plan_cluster(catalog, used, profile, now)
            except NoOfferError as exc:  # the planner's advice (--strict, another type) is not the user's to take here
                refused.append((candidate, f"{where}: {exc.reason}"))
                continue
            price = plan.offer.price_per_hour_usd
            if budget is not None and price > Decimal(str(budget)):
                refused.append(
                    (
                        candidate,
                        f"{where}: {plan.offer.offer.instance_type} costs ${price:.2f}/h, over "
                        f"--max-price-per-hour {budget:g}",
                    )
                )
            elif best is None or price < best[0].offer.price_per_hour_usd:
                best = (plan, candidate, used)
            break
    if best is None:
        raise NoOfferError(
            f"{len(refused)} configuration(s) fit {sizing.request.shape.name} ({sizing.request.method}) "
            f"but none can be planned with profile {profile.name!r}: "
            f"{'; '.join(why for _, why in refused[:3])}"
        )
    plan, candidate, used = best
    passed_over = tuple(why for refused_candidate, why in refused if refused_candidate is not candidate)
    return (
        plan,
        sizing.planned(candidate, passed_over, catalog, plan.spec.cloud, plan.spec.instance_type, plan.spec.spot),
        used,
    )


def cloud_stack_warning(spec: ClusterSpec, tagging=None) -> str:
    """A warning when the cloud already has resources of a stack named ``spec.stack`` (written
    from another project folder or by someone else), else "".

    Only when credentials are found. AWS: Resource Groups Tagging API ``GetResources``
    with ``TagFilters=[{Key: gpuinfra:stack, Values: [<stack>]}]`` in the stack's region
    (docs.aws.amazon.com/resourcegroupstagging/latest/APIReference/API_GetResources.html; the
    caller needs ``tag:GetResources``), leaving out the stack's own (its ``gpuinfra:stack-id``,
    after ``new --force`` of a deployed stack). Any error (no permission, no network) gives "": the check
    only warns, it never stops ``new``. GCP (:func:`gcp_stack_warning`): the project's VMs
    labelled ``gpuinfra-stack=<stack>`` (a label search over every resource type would need
    Cloud Asset Inventory; a stack's VMs are what costs money).

    Args:
        spec: the new stack (its ``name_suffix`` already drawn).
        tagging: a ``resourcegroupstaggingapi`` client (tests); default: one from the default
            credential chain, with 5 s timeouts and no retries.
    """
    if spec.cloud == "gcp":
        return gcp_stack_warning(spec)
    try:
        if tagging is None:
            import boto3
            from botocore.config import Config

            session = boto3.Session()
            if session.get_credentials() is None:
                return ""
            tagging = session.client(
                "resourcegroupstaggingapi",
                region_name=spec.region,
                config=Config(connect_timeout=5, read_timeout=5, retries={"max_attempts": 1}),
            )
        found = tagging.get_resources(
            TagFilters=[{"Key": "gpuinfra:stack", "Values": [spec.stack]}], ResourcesPerPage=50
        ).get("ResourceTagMappingList", [])
    except Exception:  # noqa: BLE001 - a warning only: no credentials, permission or network is no reason to stop
        return ""
    own = stack_id(spec)  # `new --force` of a deployed stack: its own resources are no other stack's
    found = [r for r in found if {t.get("Key"): t.get("Value") for t in r.get("Tags", [])}.get(AWS_STACK_ID_TAG) != own]
    if not found:
        return ""
    return (
        f"{spec.region} already has {len(found)}{'+' if len(found) >= 50 else ''} resource(s) of a stack named "
        f"{spec.stack!r} (tag gpuinfra:stack, e.g. {found[0].get('ResourceARN', '?')}), written from another "
        f"project folder or by someone else; this stack's cloud names carry its own suffix "
        f"({spec.stack}-{spec.name_suffix}) so the two stay apart, but pick another --name to tell them apart in "
        "the console and cost reports"
    )


def gcp_stack_warning(spec: ClusterSpec, session=None, compute_api: str = "https://compute.googleapis.com") -> str:
    """The GCP side of :func:`cloud_stack_warning`: a warning when the project already has VMs of a
    stack named ``spec.stack`` (not this one's ``gpuinfra-stack-id``), else "".

    One Compute ``instances.aggregatedList`` over all zones,
    ``GET {compute_api}/compute/v1/projects/{project}/aggregated/instances`` with
    ``filter=labels.gpuinfra-stack = "<label value>"`` (the label :func:`gpuinfra.plan.tags.gcp_labels`
    puts on every resource; VMs get it from their template) and ``maxResults=50``; the answer's
    ``items`` maps ``zones/<zone>`` to ``{"instances": [...]}`` or a ``warning``
    (cloud.google.com/compute/docs/reference/rest/v1/instances/aggregatedList; the caller needs
    ``compute.instances.list``). Only when Application Default Credentials are found; any error
    (no credentials, permission, network, an unexpected answer) gives "": it never stops ``new``.

    Args:
        spec: the new GCP stack; its project is ``gcp_project`` or the credentials' project.
        session: a ``requests``-like session (tests); default: google-auth's ``AuthorizedSession``.
        compute_api: the Compute REST root (tests point it at a local fake).
    """
    labels = gcp_labels(spec)
    project = spec.gcp_project
    try:
        if session is None:
            check_gcp_credentials_configured()  # a file check: no metadata-server probe off GCP
            from google.auth.transport.requests import AuthorizedSession

            credentials, default_project = gcp_credentials()
            project = project or default_project
            session = AuthorizedSession(credentials)
        if not project:
            return ""
        response = session.get(
            f"{compute_api}/compute/v1/projects/{project}/aggregated/instances",
            params={"filter": f'labels.gpuinfra-stack = "{labels["gpuinfra-stack"]}"', "maxResults": 50},
            timeout=5,
        )
        if response.status_code != 200:
            return ""
        zones = response.json().get("items", {})
        found = [vm for scope in zones.values() for vm in scope.get("instances", [])]
    except Exception:  # noqa: BLE001 - a warning only: no credentials, permission or network is no reason to stop
        return ""
    own = labels[GCP_STACK_ID_LABEL]  # `new --force` of a deployed stack: its own VMs are no other stack's
    found = [vm for vm in found if (vm.get("labels") or {}).get(GCP_STACK_ID_LABEL) != own]
    if not found:
        return ""
    return (
        f"project {project} already has {len(found)}{'+' if len(found) >= 50 else ''} VM(s) of a stack named "
        f"{spec.stack!r} (label gpuinfra-stack, e.g. {found[0].get('name', '?')}), written from another "
        f"project folder or by someone else; this stack's cloud names carry its own suffix "
        f"({spec.stack}-{spec.name_suffix}) so the two stay apart, but pick another --name to tell them apart in "
        "the console and cost reports"
    )
