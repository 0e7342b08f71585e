"""The ``gpuinfra cost`` service: the priced cost document of a stack (or of a
``pulumi preview --json`` file), the run hours it is priced for, the diff of two stacks, and the
checks that fail a total closed.

The documents are :mod:`gpuinfra.cost.report`'s (``to_json`` / ``diff_json``): USD amounts as
:func:`gpuinfra.money.usd_json` strings. Nothing here prints; the CLI renders the documents.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from decimal import Decimal
from itertools import chain
from pathlib import Path

from gpuinfra.catalog.prices import Price, usage_for
from gpuinfra.catalog.store import Catalog, load_catalog
from gpuinfra.cost.after_down import kept_json, left_after_down
from gpuinfra.cost.alternative import PricedAlternative, fully_priced_alternative
from gpuinfra.cost.commitment import commitments_json
from gpuinfra.cost.estimate import capacity_block_price, estimate, read_cluster_facts
from gpuinfra.cost.pulumi_preview import read_pulumi_preview
from gpuinfra.cost.report import diff_json, fill_advice, to_json, unpriced_lines
from gpuinfra.errors import BudgetExceededError, GpuinfraError, PreviewFileError, PriceMissingError, RequestError
from gpuinfra.planner import PlanRequest, plan_alternatives, plan_cluster
from gpuinfra.preview import run_preview_cached
from gpuinfra.profiles import get_profile
from gpuinfra.requests import spot_choice
from gpuinfra.services.spot_outlook import spot_outlook
from gpuinfra.spec import check_run_hours
from gpuinfra.stackfile import provider_config, read_stack_config, read_stack_spec

#: Run hours of a preview file whose workload profile is unknown (no ``gpuinfra:profile`` tag).
FALLBACK_RUN_HOURS = Decimal(24)


def check_hours(hours: float | None) -> Decimal | None:
    """``--hours`` as a Decimal (None stays None: the stack's or profile's own run hours); the
    one validator of ``new`` and ``cost`` (:func:`gpuinfra.spec.check_run_hours`).

    Raises:
        RequestError: not from one minute (the billing minimum) to one year.
    """
    return check_run_hours(hours)


def check_budget(budget: float | None) -> Decimal | None:
    """``--budget`` (USD for the whole run) as a Decimal; None when not given.

    Raises:
        RequestError: not a finite number >= 0.
    """
    if budget is None:
        return None
    if not (math.isfinite(budget) and budget >= 0):
        raise RequestError(f"--budget must be a number >= 0 (USD), got {budget}")
    return Decimal(str(budget))


def pricing_market(spot: bool, on_demand: bool) -> str | None:
    """The market ``--spot`` / ``--on-demand`` ask to price compute in: ``"spot"``,
    ``"on-demand"``, or None for the stack's own pricing.

    Raises:
        RequestError: both flags given.
    """
    chosen = spot_choice(spot, on_demand, default="the stack's own pricing")
    return None if chosen is None else ("spot" if chosen else "on-demand")


def profile_run_hours(profile: str | None, hours: Decimal | None = None) -> Decimal:
    """Run hours of a cost estimate without a stack file: ``hours`` when given, else the
    profile's ``default_run_hours``, else :data:`FALLBACK_RUN_HOURS` (no profile known).

    Raises:
        ProfileError: ``profile`` names no known profile.
    """
    if hours is not None:
        return hours
    if not profile:
        return FALLBACK_RUN_HOURS

    return Decimal(str(get_profile(profile).default_run_hours))


def stack_cost_document(
    stack: str,
    project_dir: Path,
    hours: float | None = None,
    market: str | None = None,
    usage_file: Path | None = None,
    catalog: Catalog | None = None,
) -> dict:
    """The cost document of ``stacks/Pulumi.<stack>.yaml``, priced over its offline preview.

    Args:
        stack: stack name.
        project_dir: the Pulumi project folder (``stacks/`` lives there).
        hours: run hours (default: the stack's ``run_hours``).
        market: ``"spot"`` / ``"on-demand"`` to price compute in that market (default: the
            stack's own pricing).
        usage_file: usage YAML overriding the profile's usage defaults (bucket GB, egress GB ...).
        catalog: the catalog to price compute from (default: the one in use).

    Raises:
        RequestError: bad ``hours``.
        SpecError: no such stack, or its file is invalid.
        UsageError: a bad usage file.
    """
    run_hours = check_hours(hours)
    spec = read_stack_spec(project_dir, stack)
    result = run_preview_cached(spec, provider_config(spec))
    doc = _document(
        result.resources,
        stack,
        spec.region,
        spec.profile.name,
        run_hours if run_hours is not None else Decimal(str(spec.run_hours)),
        market,
        usage_file,
        spec.data,
        catalog,
        capacity_block_price(spec),
    )
    if doc["pricing"] == "spot" and not spec.capacity_block:
        offer = (catalog or load_catalog()).find_offer(
            spec.cloud, spec.instance_type, spec.zone, spec.gpu, spec.gpu_count
        )
        if offer is not None:
            plan = read_stack_config(project_dir, stack).get("gpuinfra:checkpoint_plan")
            doc["spot"] = spot_outlook(
                offer, spec.nodes, Decimal(doc["hours"]), plan if isinstance(plan, dict) else None
            )
    return doc


def preview_file_cost_document(
    path: Path,
    stack: str | None = None,
    hours: float | None = None,
    market: str | None = None,
    usage_file: Path | None = None,
    catalog: Catalog | None = None,
) -> dict:
    """The cost document of a ``pulumi preview --json`` file (what Pulumi itself plans).

    Args:
        path: the preview file.
        stack: the name to put in the document (default: the stack the file names).
        hours: run hours (default: :func:`profile_run_hours` of the cluster's profile tag).
        market, usage_file, catalog: as in :func:`stack_cost_document`.

    Raises:
        RequestError: bad ``hours``.
        PreviewFileError: the file is not preview JSON.
        UsageError: a bad usage file.
    """
    run_hours = check_hours(hours)
    resources, config, name = read_pulumi_preview(path)
    region = config.get("aws:region") or config.get("gcp:region")
    try:
        profile = read_cluster_facts(resources, region).profile
        doc = _document(
            resources,
            stack or name,
            region,
            profile,
            profile_run_hours(profile, run_hours),
            market,
            usage_file,
            None,
            catalog,
        )
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, ArithmeticError) as exc:
        # the estimate reads resource inputs of the shapes Pulumi writes; another shape in a
        # hand-made or damaged file is the file's fault, said in one line
        raise PreviewFileError(
            f"preview file {path}: a resource input has a shape `pulumi preview --json` does not write "
            f"({type(exc).__name__}: {exc})"
        ) from None
    negative = [line for line in doc["lines"] if line["quantity"] is not None and Decimal(line["quantity"]) < 0]
    if negative:
        raise PreviewFileError(
            f"preview file {path}: {negative[0]['resource']} {negative[0]['component']} has a negative quantity "
            f"({negative[0]['quantity']}): node counts and sizes are whole positive numbers"
        )
    return doc


def _document(
    resources: list,
    stack: str,
    region: str | None,
    profile: str | None,
    run_hours: Decimal,
    market: str | None,
    usage_file: Path | None,
    data,
    catalog: Catalog | None,
    block_price: Price | None = None,
) -> dict:
    catalog = catalog or load_catalog()
    est = estimate(resources, catalog, region, usage_for(profile, usage_file), run_hours, market, data, block_price)
    priced_as = market or est.facts.market
    doc = to_json(est, stack or "", run_hours, catalog.date_for(est.facts.cloud), priced_as)
    doc["commitments"] = commitments_json(catalog, est.facts, run_hours, priced_as)
    return doc


#: Markets a stack's cost document is priced in that the planner ranks offers in (a Capacity
#: Block is priced per reservation: it has no alternative).
RANKED_MARKETS = ("on-demand", "spot", "flex-start")


def stack_priced_alternative(
    stack: str, project_dir: Path, doc: dict, usage_file: Path | None = None, catalog: Catalog | None = None
) -> PricedAlternative | None:
    """For a stack whose cost document has a line without a price: the cheapest offer of the same
    request (its GPUs per node, nodes, cloud, profile and data set, in the document's market)
    whose region prices every line (:func:`gpuinfra.cost.alternative.fully_priced_alternative`
    over the planner's ranking), priced like ``doc`` (its hours and usage); None when the
    document is complete, the stack holds a capacity reservation, or no offer is fully priced.
    The stack file does not say whether its region was chosen on purpose: the caller only names
    the alternative.

    Args:
        stack, project_dir, usage_file, catalog: as in :func:`stack_cost_document`.
        doc: the stack's :func:`stack_cost_document`.
    """
    market = doc["pricing"]
    if not unpriced_lines(doc) or market not in RANKED_MARKETS:
        return None
    spec = read_stack_spec(project_dir, stack)
    if spec.capacity_reservation_id:
        return None
    catalog = catalog or load_catalog()
    hours = Decimal(doc["hours"])
    request = PlanRequest(
        gpus=f"{spec.gpu_count}x{spec.gpu}",
        nodes=spec.nodes,
        cloud=spec.cloud,
        spot=None if market == "flex-start" else market == "spot",
        hours=float(hours),
        data=spec.data,
        flex_start=market == "flex-start",
    )
    resources = run_preview_cached(spec, provider_config(spec)).resources
    now = datetime.now(UTC)
    try:
        first = plan_cluster(catalog, request, spec.profile, now)
        plans = chain([first], plan_alternatives(catalog, request, spec.profile, now, first))
        candidates = (plan.offer for plan in plans if plan.spec.market == market)
        return fully_priced_alternative(
            resources, candidates, catalog, usage_for(spec.profile.name, usage_file), hours, market, spec.data
        )
    except GpuinfraError:  # the request no longer plans (the catalog changed): nothing to name
        return None


def check_totals(doc: dict, budget_usd: Decimal | None = None) -> None:
    """Refuse a cost document whose total is not a total, or is over the budget.

    Args:
        doc: a cost document (:func:`stack_cost_document`).
        budget_usd: the run's budget in USD (:func:`check_budget`), or None.

    Raises:
        PriceMissingError: a line has no price or a resource has no cost model (exit 4): money
            fails closed, so an unpriced line is never $0 and no budget passes it.
        BudgetExceededError: ``run_usd`` is over ``budget_usd`` (exit 3).
    """
    unpriced = unpriced_lines(doc)
    if unpriced:
        raise PriceMissingError(unpriced, fill_advice(doc))
    if budget_usd is not None and Decimal(doc["run_usd"]) > budget_usd:
        raise BudgetExceededError(Decimal(doc["run_usd"]), budget_usd)


def cost_diff_document(
    before: str,
    after: str,
    project_dir: Path,
    hours: float | None = None,
    market: str | None = None,
    usage_file: Path | None = None,
) -> dict:
    """Price two stacks alike and compare them (``gpuinfra cost diff``).

    Args:
        before, after: stack names.
        project_dir, hours, market, usage_file: as in :func:`stack_cost_document`, for both.

    Returns:
        The :func:`gpuinfra.cost.report.diff_json` document (null totals and changes when a
        side has a line without a price: :func:`check_diff_totals` refuses it).

    Raises:
        as :func:`stack_cost_document`.
    """
    catalog = load_catalog()
    return diff_json(
        stack_cost_document(before, project_dir, hours, market, usage_file, catalog),
        stack_cost_document(after, project_dir, hours, market, usage_file, catalog),
    )


def check_diff_totals(doc: dict) -> None:
    """Refuse a ``cost diff`` document when either side has a line without a price: its change
    would compare a partial sum with a total (a move into an unpriced zone is no saving).

    Args:
        doc: a :func:`cost_diff_document`.

    Raises:
        PriceMissingError: a side has a line without a price (exit 4); the message names each
            line with its side's stack.
    """
    unpriced = [f"{doc[side]}: {line}" for side in ("before", "after") for line in doc[f"{side}_price_not_found"]]
    if unpriced:
        raise PriceMissingError(unpriced)


def left_after_down_block(stack: str, project_dir: Path, delete_data: bool = False) -> dict:
    """What ``gpuinfra down STACK`` leaves behind, per month: the ``left_after_down`` block of
    the stack's cost document (:mod:`gpuinfra.cost.after_down`); with ``delete_data`` only what
    outlives the bucket's delete (GCS soft-deleted objects).

    Args:
        stack: stack name; project_dir: the Pulumi project folder.
        delete_data: ``down --delete-data`` (nothing is kept).

    Returns:
        ``{"monthly_usd", "lines_without_price", "lines"}`` (``monthly_usd`` null when a line
        has no price); when the stack cannot be priced at all (its file or preview fails), an
        incomplete block with ``"error"`` saying why: ``down`` is never stopped by its price.
    """
    try:
        if not delete_data:
            return stack_cost_document(stack, project_dir)["left_after_down"]
        spec = read_stack_spec(project_dir, stack)
        resources = run_preview_cached(spec, provider_config(spec)).resources
        stored_gb = usage_for(spec.profile.name)["bucket_storage_gb"]
        return kept_json(left_after_down(resources, spec.region, stored_gb, delete_data=True))
    except GpuinfraError as exc:
        return {"monthly_usd": None, "lines_without_price": 1, "lines": [], "error": str(exc)}
