"""Fallback ladders: ``gpuinfra new --fallback N`` writes the chosen stack and N alternatives
from the same ranking, each checked like the first; ``gpuinfra up STACK --fallback`` forms the
first rung the cloud has capacity for.

Writing (:func:`write_ladder`): the first rung is what ``gpuinfra new`` would write
(:func:`gpuinfra.newstack.prepare_stack`, with its preflight); the alternatives come from the
offers that follow it in the planner's ranking (:func:`gpuinfra.planner.plan_alternatives`:
other zones, regions, the other cloud unless ``--cloud`` pins one, and the other market when
the flags and the profile allow both), one per capacity pool (cloud, region, zone, market),
spread (:func:`gpuinfra.planner.spread_alternatives`): at most one rung per (cloud, region,
market) until the ranking has no new one, then further zones, in ranking order. Each gets the user's settings and
passes every rule the first passes (:func:`gpuinfra.newstack.finish_plan`: the offline preview,
its cost, every cloud rule); one that fails is passed over, named with why, and the next offer
is tried. An offer over ``--max-price-per-hour`` is never written. Rung ``i`` > 0 is named
``<first>-fb<i>`` (:func:`rung_name`, checked as a new stack name). The stack files and the
ladder record are written all or nothing (:func:`gpuinfra.stackfile.write_stack_files`).

The record (:data:`LADDER_DIRNAME`/``<first>.yaml``, the one source of truth of a ladder): its
rungs in order, each with its place, market and prices (the compute $/h, the whole stack's
$/h and run total from its verified preview, and the change of both against the first, as
``gpuinfra cost diff FIRST RUNG`` totals them), ``created_at``, the budget, and once ``up
--fallback`` ran, which rung formed and what each rung tried answered.

Forming (:func:`form_first_rung`): each rung in order gets the quota and availability
preflight (:func:`gpuinfra.preflight.run_preflight`) before anything of it is created; a rung
it refuses (a quota shortfall, or the type not offered in its zone) is skipped with one line
naming it and the shortfall, since another region or market has its own quota. A rung that
passes goes through :func:`gpuinfra.lifecycle.deploy`, which is all or nothing per rung (a
rung the cloud cannot launch in full is destroyed again before the next is tried). Of the
launch failures only capacity (:class:`~gpuinfra.errors.CapacityError`, exit 7) moves on to
the next rung; any other failure (EC2's quota, invalid parameter or IAM refusal at launch
included) stops the ladder with its own error and exit code. When no rung forms the exit is
7 if any rung was out of capacity, else 9 if the preflight found a quota shortfall, else 4
(every rung not offered). With a budget, the ladder stops at the
first rung whose priced $/h (its offline preview priced from the catalog, never the price
written in a file) is over it or unknown. The API is small so that ``gpuinfra run`` can form
its cluster through the same ladder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from gpuinfra.cost.report import document_total
from gpuinfra.errors import (
    BakeError,
    CapacityError,
    FileExistsGpuinfraError,
    GpuinfraError,
    NoOfferError,
    NotOfferedError,
    QuotaError,
    RequestError,
    SpecError,
)
from gpuinfra.fsutil import atomic_write_text
from gpuinfra.lifecycle import Backend, check_credentials, deploy
from gpuinfra.money import Total, usd_json
from gpuinfra.newstack import NewStackRequest, NewStackResult, PreparedStack, finish_plan, prepare_stack
from gpuinfra.planner import Plan, placement_key, plan_alternatives, spread_alternatives
from gpuinfra.preflight import run_preflight
from gpuinfra.services.cost_document import stack_cost_document
from gpuinfra.spec import NEW_STACK_NAME_MAX, check_new_stack_name, check_stack_name
from gpuinfra.stackfile import WrittenFiles, check_stack_free, read_stack_spec, render_stack, write_stack_files
from gpuinfra.userfile import read_user_file
from gpuinfra.verify import VerifiedPreview

#: Folder of the project that holds the ladder records, ``<first stack>.yaml`` each.
LADDER_DIRNAME = "ladders"
#: Rung ``i`` > 0 of ladder ``NAME`` is the stack ``NAME-fb<i>``.
FALLBACK_SUFFIX = "-fb"
#: Version of the record's layout (:meth:`Ladder.to_json`).
LADDER_SCHEMA_VERSION = 1
#: ``new --fallback`` stops looking after passing over this many offers (each costs an offline preview).
MAX_PASSED_OVER = 12
#: ``new --fallback N`` takes N from 0 to this: each alternative is one more stack file to review
#: and one more offline preview for ``new`` to run (docs/capacity.md). ``new --help`` states the
#: same bound (a test holds them together).
MAX_FALLBACK_ALTERNATIVES = 10


def rung_name(first: str, index: int) -> str:
    """The stack name of rung ``index`` of ladder ``first``: ``first`` itself for 0, else
    ``<first>-fb<index>``.

    Raises:
        SpecError: the name is no valid new stack name (too long for ``first``: the message
            says how long ``--name`` may be).
    """
    if index == 0:
        return first
    name = f"{first}{FALLBACK_SUFFIX}{index}"
    try:
        return check_new_stack_name(name)
    except SpecError as exc:
        room = NEW_STACK_NAME_MAX - len(f"{FALLBACK_SUFFIX}{index}")
        raise SpecError(
            f"{exc}; fallback rungs add '{FALLBACK_SUFFIX}<n>': use a --name of at most {room} characters"
        ) from None


def ladder_path(project_dir: Path, first: str) -> Path:
    """``<project_dir>/ladders/<first>.yaml``."""
    return Path(project_dir) / LADDER_DIRNAME / f"{check_stack_name(first)}.yaml"


@dataclass(frozen=True)
class Rung:
    """One stack of a ladder.

    Attributes:
        stack: its stack name.
        cloud, region, zone, instance_type: where it runs.
        market: ``on-demand`` or ``spot``.
        compute_price_per_hour_usd: the nodes' $/h (all nodes; catalog price of the offer).
        hourly: the whole stack's $/h from its verified preview (incomplete when a line has no price).
        run: the whole stack's run total for its run hours.
        hourly_change, run_change: ``hourly`` / ``run`` minus the first rung's (``cost diff`` totals).
    """

    stack: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    compute_price_per_hour_usd: Decimal | None
    hourly: Total
    run: Total
    hourly_change: Total
    run_change: Total

    def to_json(self) -> dict[str, Any]:
        """The rung in the record and in ``new --json`` (USD as :func:`gpuinfra.money.usd_json` strings,
        null when incomplete)."""
        return {
            "stack": self.stack,
            "cloud": self.cloud,
            "region": self.region,
            "zone": self.zone,
            "instance_type": self.instance_type,
            "market": self.market,
            "compute_price_per_hour_usd": usd_json(self.compute_price_per_hour_usd),
            "hourly_usd": self.hourly.json(),
            "run_usd": self.run.json(),
            "lines_without_price": self.hourly.missing,
            "hourly_change_usd": self.hourly_change.json(),
            "run_change_usd": self.run_change.json(),
        }

    @classmethod
    def from_json(cls, value: Any, where: str) -> Rung:
        """A rung read back from a record.

        Raises:
            SpecError: not a rung (one line naming the file and the field).
        """
        if not isinstance(value, dict):
            raise SpecError(f"{where}: each rung must be a mapping")
        try:
            missing = int(value.get("lines_without_price") or 0)
            compute = value.get("compute_price_per_hour_usd")
            return cls(
                stack=check_stack_name(value["stack"]),
                cloud=str(value["cloud"]),
                region=str(value["region"]),
                zone=str(value["zone"]),
                instance_type=str(value["instance_type"]),
                market=str(value["market"]),
                compute_price_per_hour_usd=None if compute is None else Decimal(str(compute)),
                hourly=Total.from_json(value.get("hourly_usd"), missing),
                run=Total.from_json(value.get("run_usd"), missing),
                hourly_change=Total.from_json(value.get("hourly_change_usd"), missing),
                run_change=Total.from_json(value.get("run_change_usd"), missing),
            )
        except (KeyError, TypeError, ArithmeticError, ValueError) as exc:
            raise SpecError(f"{where}: a rung is not readable ({type(exc).__name__}: {exc})") from None

    @property
    def place(self) -> str:
        """``aws us-east-1 use1-az2 p5.48xlarge on-demand``."""
        return f"{self.cloud} {self.region} {self.zone} {self.instance_type} {self.market}"


@dataclass(frozen=True)
class Ladder:
    """A fallback ladder: its rungs in the order ``up --fallback`` tries them.

    Attributes:
        first: the first rung's stack name (the record's file name).
        created_at: when ``new --fallback`` wrote it (UTC).
        max_price_per_hour_usd: the ``--max-price-per-hour`` it was written under, or None.
        rungs: the rungs, first one first.
        formed: which rung the last ``up --fallback`` formed (``{"stack", "rung", "at"}``), or None.
        attempts: what each rung the last ``up --fallback`` tried answered (``{"stack", "outcome", "at"}``).
    """

    first: str
    created_at: datetime
    max_price_per_hour_usd: Decimal | None
    rungs: tuple[Rung, ...]
    formed: dict[str, Any] | None = None
    attempts: tuple[dict[str, Any], ...] = ()

    @property
    def stacks(self) -> list[str]:
        """The rungs' stack names, in order."""
        return [r.stack for r in self.rungs]

    def to_json(self) -> dict[str, Any]:
        """The record (module docstring); also the ``ladder`` of ``new --json``."""
        return {
            "schema_version": LADDER_SCHEMA_VERSION,
            "first": self.first,
            "created_at": self.created_at.isoformat(),
            "max_price_per_hour_usd": usd_json(self.max_price_per_hour_usd),
            "rungs": [r.to_json() for r in self.rungs],
            "formed": self.formed,
            "attempts": list(self.attempts),
        }

    def text(self) -> str:
        """The record's file text."""
        head = (
            f"# Fallback ladder of stack {self.first}, written by `gpuinfra new --fallback`.\n"
            f"# `gpuinfra up {self.first} --fallback` tries the rungs in this order: a rung the quota\n"
            "# preflight refuses is skipped; at launch only a capacity failure moves on to the next.\n"
            "# The prices are as written: `up` prices each rung again.\n"
        )
        return head + yaml.safe_dump(self.to_json(), sort_keys=False, width=100)


def read_ladder(project_dir: Path, first: str) -> Ladder | None:
    """The ladder record of stack ``first``, or None when it has none.

    Raises:
        SpecError: the record is not readable, is of another stack, or its first rung is not ``first``.
    """
    path = ladder_path(project_dir, first)
    if not path.exists() and not path.is_symlink():
        return None
    doc = read_user_file(path, kind="ladder record", error=SpecError, root=Path(project_dir))
    if doc.get("schema_version") != LADDER_SCHEMA_VERSION:
        raise SpecError(f"{path}: schema_version must be {LADDER_SCHEMA_VERSION}, got {doc.get('schema_version')!r}")
    rungs = doc.get("rungs")
    if not isinstance(rungs, list) or not rungs:
        raise SpecError(f"{path}: 'rungs' must be a non-empty list")
    ladder_rungs = tuple(Rung.from_json(r, str(path)) for r in rungs)
    if doc.get("first") != first or ladder_rungs[0].stack != first:
        raise SpecError(f"{path}: a ladder record of stack {first!r} must name it as 'first' and as its first rung")
    budget = doc.get("max_price_per_hour_usd")
    try:
        created_at = datetime.fromisoformat(str(doc.get("created_at")))
    except ValueError:
        raise SpecError(f"{path}: created_at is not an ISO 8601 time") from None
    formed = doc.get("formed")
    attempts = doc.get("attempts") or []
    return Ladder(
        first=first,
        created_at=created_at,
        max_price_per_hour_usd=None if budget is None else Decimal(str(budget)),
        rungs=ladder_rungs,
        formed=formed if isinstance(formed, dict) else None,
        attempts=tuple(a for a in attempts if isinstance(a, dict)) if isinstance(attempts, list) else (),
    )


@dataclass(frozen=True)
class WrittenLadder:
    """What :func:`write_ladder` wrote.

    Attributes:
        first: the first rung, as ``gpuinfra new`` reports it.
        ladder: the record written.
        record_file: its path.
        stack_files: every rung's stack file, in order.
        verified: every rung's verified preview, in order.
        passed_over: one line per offer of the ranking not written, with why.
        asked: how many alternatives were asked for.
    """

    first: NewStackResult
    ladder: Ladder
    record_file: Path
    stack_files: tuple[Path, ...]
    verified: tuple[VerifiedPreview, ...]
    passed_over: tuple[str, ...] = field(default=())
    asked: int = 0

    def to_json(self) -> dict[str, Any]:
        """The ``ladder`` block of ``gpuinfra new --fallback --json``: the record, its path, the
        stack files and what was passed over."""
        return {
            **self.ladder.to_json(),
            "record_file": str(self.record_file),
            "stack_files": [str(p) for p in self.stack_files],
            "asked": self.asked,
            "passed_over": list(self.passed_over),
        }


def _rung(plan: Plan, verified: VerifiedPreview, first: VerifiedPreview | None) -> Rung:
    """The record's rung of a finished, verified plan; ``first``: the first rung's preview (None
    for the first rung itself)."""
    spec = plan.spec
    hourly, run = document_total(verified.cost, "hourly_usd"), document_total(verified.cost, "run_usd")
    base = verified if first is None else first
    return Rung(
        stack=spec.stack,
        cloud=spec.cloud,
        region=spec.region,
        zone=spec.zone,
        instance_type=spec.instance_type,
        market=placement_key(spec)[3],
        compute_price_per_hour_usd=plan.offer.price_per_hour_usd,
        hourly=hourly,
        run=run,
        hourly_change=hourly - document_total(base.cost, "hourly_usd"),
        run_change=run - document_total(base.cost, "run_usd"),
    )


def write_ladder(
    request: NewStackRequest,
    project_dir: Path,
    alternatives: int,
    force: bool = False,
    now: datetime | None = None,
) -> WrittenLadder:
    """``gpuinfra new --fallback N``: plan and verify the stack ``new`` would write and up to
    ``alternatives`` more from the same ranking, then write every stack file and the ladder
    record, all or nothing (module docstring).

    Args:
        request: ``new``'s options (the budget is ``request.plan.max_price_per_hour_usd``).
        project_dir: the Pulumi project folder.
        alternatives: N, how many alternatives to write (0: the first rung and a record only).
        force: replace existing stack files and record.
        now: creation time, UTC (default: now).

    Returns:
        What was written; fewer than N alternatives when the ranking has no more that pass
        (``passed_over`` says why each offer was left out).

    Raises:
        RequestError: ``alternatives`` < 0 or > :data:`MAX_FALLBACK_ALTERNATIVES` (exit 2).
        FileExistsGpuinfraError: a rung's stack file or the record exists and not ``force`` (exit 5).
        SpecError: a rung name longer than a stack name may be (exit 2).
        as :func:`gpuinfra.newstack.create_stack` for the first rung; nothing is written then.
    """
    if not 0 <= alternatives <= MAX_FALLBACK_ALTERNATIVES:
        raise RequestError(f"--fallback takes 0 to {MAX_FALLBACK_ALTERNATIVES} alternatives, got {alternatives}")
    given = request.plan.name
    if given:  # before any planning: every name the ladder takes
        for index in range(alternatives + 1):
            name = rung_name(given, index)
            if not force:
                check_stack_free(project_dir, name)
        _check_record_free(project_dir, given, force)
    # with alternatives, rung 0's preflight shortfall is a note: the ladder exists to move past it
    ready = prepare_stack(request, project_dir, force, now, preflight_refuses=alternatives == 0)
    first = ready.plan.spec.stack
    names = [rung_name(first, index) for index in range(alternatives + 1)]
    if not given:  # the names are known now
        for name in names:
            if not force:
                check_stack_free(project_dir, name)
        _check_record_free(project_dir, first, force)
    budget = request.plan.max_price_per_hour_usd
    plans = [ready.plan]
    verified = [ready.verified]
    images = [ready.image_config]
    rungs = [_rung(ready.plan, ready.verified, None)]
    passed_over: list[str] = []
    over_budget: set[str] = set()
    if alternatives:
        candidates: list[Plan] = []
        for plan in plan_alternatives(ready.catalog, ready.planned, ready.profile, ready.now, ready.plan):
            offer = plan.offer
            if offer.market in over_budget:
                continue
            if budget is not None and offer.price_per_hour_usd > Decimal(str(budget)):
                # each market is ranked cheapest first: the rest of it is over the budget too
                over_budget.add(offer.market)
                passed_over.append(
                    f"{_where(plan)} and every later {offer.market} offer: compute ${offer.price_per_hour_usd:,.2f}/h "
                    f"is over --max-price-per-hour {budget:g}"
                )
                continue
            candidates.append(plan)
        for finished, checked, image in _checked_spread(
            request, project_dir, ready, candidates, names, force, passed_over
        ):
            plans.append(finished)
            verified.append(checked)
            images.append(image)
            rungs.append(_rung(finished, checked, ready.verified))
    ladder = Ladder(
        first=first,
        created_at=ready.now.replace(microsecond=0),
        max_price_per_hour_usd=None if budget is None else Decimal(str(budget)),
        rungs=tuple(rungs),
    )
    record = ladder_path(project_dir, first)
    texts = [
        (
            plan.spec.stack,
            render_stack(
                plan,
                image_config=image,
                # spot checkpoint advice holds for the first rung's cloud and market only
                checkpoint_plan=ready.checkpoint_plan if _same_market(plan, ready.plan) else None,
            ),
        )
        for plan, image in zip(plans, images, strict=True)
    ]
    written = write_stack_files(texts, project_dir, force=force, also={record: ladder.text()})
    result = NewStackResult(
        ready.plan,
        WrittenFiles(written.stack_file, written.scaffolded),
        ready.verified,
        ready.sizing,
        ready.preflight,
        ready.alternative,
    )
    return WrittenLadder(result, ladder, record, written.stack_files, tuple(verified), tuple(passed_over), alternatives)


def _where(plan: Plan) -> str:
    """``aws us-east-1 use1-az2 p5.48xlarge on-demand``: an offer in a passed-over line."""
    return " ".join(placement_key(plan.spec)[:3]) + f" {plan.offer.offer.instance_type} {plan.offer.market}"


def _checked_spread(
    request: NewStackRequest,
    project_dir: Path,
    ready: PreparedStack,
    candidates: list[Plan],
    names: list[str],
    force: bool,
    passed_over: list[str],
) -> list[tuple[Plan, VerifiedPreview, dict | None]]:
    """The alternatives of the ladder, finished and checked under their rung names, in rung order.

    The picks are :func:`gpuinfra.planner.spread_alternatives` of ``candidates``: at most one
    rung per (cloud, region, market) until the ranking has no new one, then further zones,
    in ranking order. A pick that fails :func:`gpuinfra.newstack.finish_plan` is passed over
    (a line in ``passed_over``) and the picks are made again without it, so the next offer of
    its region can take its place; a rung whose name changed is checked again under the new
    one. After :data:`MAX_PASSED_OVER` failed picks the rungs checked so far are kept.
    """
    wanted = len(names) - 1
    done: dict[tuple[int, str], tuple[Plan, VerifiedPreview, dict | None]] = {}
    failed = 0
    while True:
        rungs: list[tuple[Plan, VerifiedPreview, dict | None]] = []
        for index, plan in enumerate(spread_alternatives(ready.plan, candidates, wanted), start=1):
            key = (id(plan), names[index])
            if key not in done:
                spec = type(plan.spec).model_validate({**plan.spec.model_dump(), "stack": names[index]})
                try:
                    done[key] = finish_plan(replace(plan, spec=spec), request, project_dir, ready.catalog, force=force)
                except (SpecError, NoOfferError, RequestError, BakeError) as exc:
                    passed_over.append(f"{_where(plan)}: {str(exc).splitlines()[0]}")
                    candidates = [c for c in candidates if c is not plan]
                    failed += 1
                    break
            rungs.append(done[key])
        else:
            return rungs
        if failed >= MAX_PASSED_OVER:
            return rungs


def _same_market(plan: Plan, first: Plan) -> bool:
    """True when ``plan`` runs on ``first``'s cloud in its market (its spot notice is the same)."""
    return (plan.spec.cloud, plan.spec.spot) == (first.spec.cloud, first.spec.spot)


def _check_record_free(project_dir: Path, first: str, force: bool) -> None:
    """Refuse to replace a ladder record without ``force`` (exit 5)."""
    path = ladder_path(project_dir, first)
    if path.exists() and not force:
        raise FileExistsGpuinfraError(f"ladder record {path} already exists; pass --force to replace it")


@dataclass(frozen=True)
class FormedRung:
    """The rung :func:`form_first_rung` formed.

    Attributes:
        stack: its stack name.
        index: its place in the ladder (0: the first).
        changes: the ``up``'s change summary.
        attempts: what each rung tried answered, in order (``{"stack", "outcome", "at"}``).
    """

    stack: str
    index: int
    changes: dict
    attempts: tuple[dict[str, Any], ...]


def _priced_hourly(stack: str, project_dir: Path) -> Total:
    """The stack's whole $/h, its offline preview priced from the catalog now
    (:func:`gpuinfra.services.cost_document.stack_cost_document`)."""
    return document_total(stack_cost_document(stack, project_dir), "hourly_usd")


def form_first_rung(
    backend: Backend,
    project_dir: Path,
    first: str,
    on_event,
    say,
    *,
    fallback: bool = True,
    max_price_per_hour_usd: Decimal | None = None,
    replace_nodes: bool = False,
    now: datetime | None = None,
    notes: Callable[[str], None] | None = None,
    capacity_timeout_seconds: int | None = None,
) -> FormedRung:
    """``gpuinfra up FIRST --fallback``: deploy the ladder's rungs in order until one forms
    (module docstring), record which one in the ladder record, and return it.

    A rung that is already deployed is the ladder's cluster: it alone is updated (no other
    rung is created next to it). Without a record (or with ``fallback`` False) the ladder is
    ``first`` alone: a plain ``up``, whose errors come through unchanged.

    Args:
        backend: the Automation API boundary.
        first: the first rung's stack name.
        on_event: engine event callback (progress); say: prints one line.
        fallback: use the ladder record (False: ``first`` alone, with the budget check).
        max_price_per_hour_usd: stop at the first rung whose priced $/h is over this, or unknown.
        replace_nodes, now, capacity_timeout_seconds: as :func:`gpuinfra.lifecycle.deploy` (the
            capacity timeout bounds each rung's wait).
        notes: receives the preflight's note lines and the launch's relaunch notes (default: ``say``).

    Raises:
        CapacityError: no rung formed and at least one was out of capacity (exit 7; each rung's
            answer is named), or the budget stopped the ladder after rungs that were.
        QuotaError: no rung formed, none was out of capacity, and the preflight found a quota
            shortfall for at least one (exit 9); a plain ``up`` (one rung): its shortfall.
        NotOfferedError: no rung formed and the preflight found every rung tried not offered in
            its zone (exit 4).
        RequestError: a budget that is not a positive amount, the first rung is over the budget
            or unpriced, so nothing was tried, or several rungs are deployed (exit 2).
        SpecError: the record or a rung's stack file is not readable (exit 2).
        GpuinfraError: any other failure of a rung (its own exit code); the ladder stops there.
    """
    budget = max_price_per_hour_usd
    if budget is not None and (not budget.is_finite() or budget <= 0):
        raise RequestError(f"--max-price-per-hour must be a positive USD amount per hour, got {budget}")
    ladder = read_ladder(project_dir, first) if fallback else None
    if fallback and ladder is None:
        say(f"stack {first} has no fallback ladder ({ladder_path(project_dir, first)}): plain `up`")
    stacks = ladder.stacks if ladder else [first]
    specs = [read_stack_spec(project_dir, stack) for stack in stacks]  # every file readable before anything runs
    deployed = {s.name for s in backend.list_stacks(project_dir) if s.resource_count}
    live = [stack for stack in stacks if stack in deployed]
    if len(live) > 1:
        raise RequestError(
            f"rungs {', '.join(live)} of ladder {first} are all deployed: run `gpuinfra down` on all but one"
        )
    notes = notes or say
    attempts: list[dict[str, Any]] = []
    skipped: list[GpuinfraError] = []  # rungs the preflight refused
    out_of_capacity = False
    for index, (stack, spec) in enumerate(zip(stacks, specs, strict=True)):
        if live and stack != live[0]:
            continue
        if max_price_per_hour_usd is not None:
            hourly = _priced_hourly(stack, project_dir)
            if hourly.amount_usd is None or hourly.amount_usd > max_price_per_hour_usd:
                why = (
                    f"rung {index} {stack} costs {hourly.text(suffix='/h')}, over --max-price-per-hour "
                    f"{max_price_per_hour_usd:f}"
                    if hourly.amount_usd is not None
                    else f"rung {index} {stack} has no complete price ({hourly.text()}), so it is never within a budget"
                )
                if not attempts:
                    raise RequestError(f"{why}: nothing was tried")
                attempts.append({"stack": stack, "outcome": f"not tried: {why}", "at": _now(now)})
                say(f"{why}: the ladder stops here")
                break
        say(
            f"rung {index} {stack}: {spec.nodes} x {spec.instance_type} in {spec.zone} ({spec.cloud} {spec.region}, "
            f"{spec.market})" + (" (deployed: updating it)" if live else "")
        )
        try:
            check_credentials(spec.cloud)  # per rung: another cloud's only when its rung is tried
            if stack not in deployed:  # before anything of the rung is created
                for line in run_preflight(spec):
                    notes(f"{f'rung {index} {stack}: ' if len(stacks) > 1 else ''}preflight: {line}")
        except (QuotaError, NotOfferedError) as exc:  # nothing was created: another region or market may have it
            shortfall = "; ".join(str(exc).splitlines()) or type(exc).__name__
            attempts.append(
                {
                    "stack": stack,
                    "outcome": f"skipped by preflight (exit {int(exc.exit_code)}): {shortfall}",
                    "at": _now(now),
                }
            )
            if len(stacks) == 1:  # a plain `up`: its own error
                _record(project_dir, ladder, None, attempts)
                raise
            skipped.append(exc)
            say(f"rung {index} {stack}: skipped, {shortfall}")
            continue
        except GpuinfraError as exc:
            _stop(project_dir, ladder, attempts, stack, exc, now)
            raise
        try:
            changes = deploy(
                backend,
                project_dir,
                spec,
                on_event,
                replace_nodes=replace_nodes,
                now=now,
                notes=notes,
                preflight=False,
                capacity_timeout_seconds=capacity_timeout_seconds,
            )
        except CapacityError as exc:
            attempts.append({"stack": stack, "outcome": f"no capacity: {exc}", "at": _now(now)})
            if len(stacks) == 1 or live:  # a plain `up`, or the deployed rung: its own error
                _record(project_dir, ladder, None, attempts)
                raise
            out_of_capacity = True
            say(f"rung {index} {stack}: no capacity ({exc})")
            continue
        except GpuinfraError as exc:  # not capacity (a launch's quota, parameter or IAM error too): the ladder stops
            _stop(project_dir, ladder, attempts, stack, exc, now)
            raise
        attempts.append({"stack": stack, "outcome": "formed", "at": _now(now)})
        _record(project_dir, ladder, {"stack": stack, "rung": index, "at": _now(now)}, attempts)
        return FormedRung(stack, index, changes, tuple(attempts))
    _record(project_dir, ladder, None, attempts)
    tried = "; ".join(f"{a['stack']}: {a['outcome']}" for a in attempts)
    if out_of_capacity or not skipped:
        raise CapacityError(f"no rung of ladder {first} formed ({tried})")
    if any(isinstance(exc, QuotaError) for exc in skipped):
        raise QuotaError(f"no rung of ladder {first} formed: the preflight refused every rung tried ({tried})")
    raise NotOfferedError(f"no rung of ladder {first} formed: no zone tried offers its type ({tried})")


def _stop(
    project_dir: Path, ladder: Ladder | None, attempts: list[dict[str, Any]], stack: str, exc: GpuinfraError, now
) -> None:
    """Record a failure that stops the ladder (its exit code and first line)."""
    first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
    attempts.append({"stack": stack, "outcome": f"failed (exit {int(exc.exit_code)}): {first_line}", "at": _now(now)})
    _record(project_dir, ladder, None, attempts)


def _now(now: datetime | None) -> str:
    return (now or datetime.now(UTC)).replace(microsecond=0).isoformat()


def _record(project_dir: Path, ladder: Ladder | None, formed: dict | None, attempts: list[dict[str, Any]]) -> None:
    """Write the outcome of an ``up --fallback`` into the ladder record (atomically); nothing
    without a record."""
    if ladder is None:
        return
    updated = replace(ladder, formed=formed, attempts=tuple(attempts))
    atomic_write_text(ladder_path(project_dir, ladder.first), updated.text())
