"""``gpuinfra up`` / ``down`` / ``ls`` / ``reap``: stack lifecycle with live progress."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import typer

from gpuinfra.cli import options
from gpuinfra.cli.tables import Col
from gpuinfra.plan.formation import (
    DEFAULT_CAPACITY_TIMEOUT_SECONDS,
    MAX_CAPACITY_TIMEOUT_SECONDS,
    MIN_CAPACITY_TIMEOUT_SECONDS,
)


def _progress():
    """An Automation API event printer: one line per resource step, diagnostics, summary."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import stdout_console

    out = stdout_console()

    def on_event(event) -> None:
        pre = getattr(event, "resource_pre_event", None)
        done = getattr(event, "res_outputs_event", None)
        diag = getattr(event, "diagnostic_event", None)
        if pre is not None and pre.metadata.op != "same":
            out.print(f"  {pre.metadata.op:>8} {pre.metadata.type} {pre.metadata.urn.split('::')[-1]} ...")
        elif done is not None and done.metadata.op != "same":
            out.print(f"  {done.metadata.op:>8} {done.metadata.type} {done.metadata.urn.split('::')[-1]} done")
        elif diag is not None and diag.severity in ("error", "warning"):
            out.print(f"  {diag.severity}: {diag.message.strip()}")

    return on_event


def _backend():
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra import lifecycle

    return lifecycle.make_backend()


def up(
    stack: str = typer.Argument(..., help="Stack name (a cluster, or an image bake from `gpuinfra image bake`)."),
    replace_nodes: bool = typer.Option(
        False,
        "--replace-nodes",
        help="Allow an update that replaces the running nodes (ends training on them; the new nodes are a new "
        "deployment, with their own health results and ranks).",
    ),
    fallback: bool = typer.Option(
        False,
        "--fallback",
        help="Try the stack's fallback ladder (`gpuinfra new --fallback N`) in order: a rung whose quota preflight "
        "finds a shortfall or its type not offered is skipped; a rung the cloud cannot launch in full is destroyed "
        "again and the next is tried; any other failure stops with its own exit code. The rung that formed is "
        "printed and recorded in ladders/<stack>.yaml. None formed: exit 7 if any was out of capacity, else 9 "
        "(quota), else 4. Without a ladder: a plain up.",
    ),
    max_price_per_hour: float | None = typer.Option(
        None,
        "--max-price-per-hour",
        help="Budget in USD per hour for the whole stack: the ladder stops at the first rung whose $/h (its "
        "preview priced from the catalog now) is over it or unknown; exit 2 when that is the first.",
        show_default=False,
    ),
    capacity_timeout: int | None = typer.Option(
        None,
        "--capacity-timeout",
        help="Seconds `up` waits for every node of a GCP STANDARD / SPOT cluster (one all-or-nothing bulk insert: "
        "what was made is deleted) or flex-start cluster (its resize request: cancelled) before it exits 7 "
        "(no capacity; --fallback then tries the next rung). "
        f"{MIN_CAPACITY_TIMEOUT_SECONDS} to {MAX_CAPACITY_TIMEOUT_SECONDS}; default {DEFAULT_CAPACITY_TIMEOUT_SECONDS}.",
        show_default=False,
    ),
    project_dir: Path = options.ProjectDir,
) -> None:
    """Create or update the stack (`pulumi up` through the Automation API); a bake stack builds and records its image."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.bake.deploy import is_bake_stack
    from gpuinfra.cli.console import note, stdout_console
    from gpuinfra.lifecycle import check_capacity_timeout, check_credentials, deploy
    from gpuinfra.stackfile import read_stack_spec

    if capacity_timeout is not None:
        check_capacity_timeout(capacity_timeout)  # bad input first: nothing read or started

    if is_bake_stack(Path(project_dir), stack):
        if fallback or max_price_per_hour is not None:
            from gpuinfra.errors import RequestError  # imported on use: CLI start-up time

            raise RequestError(
                f"--fallback and --max-price-per-hour are for cluster stacks; {stack!r} is an image bake"
            )
        _up_bake(stack, replace_nodes, Path(project_dir))
        return
    spec = read_stack_spec(project_dir, stack)  # first: "no stack X" comes before anything about Pulumi
    spec.check_block_started(datetime.now(UTC))  # a Capacity Block takes instances from its start only
    if fallback or max_price_per_hour is not None:
        _up_ladder(stack, replace_nodes, fallback, max_price_per_hour, Path(project_dir), capacity_timeout)
        return
    backend = _backend()
    check_credentials(spec.cloud)
    out = stdout_console()
    out.print(
        f"up {stack}: {spec.nodes} x {spec.instance_type} in {spec.zone} (ends itself at {spec.expires_at:%Y-%m-%d %H:%M} UTC)"
    )
    changes = deploy(
        backend,
        Path(project_dir),
        spec,
        _progress(),
        replace_nodes=replace_nodes,
        notes=note,
        capacity_timeout_seconds=capacity_timeout,
    )
    out.print(f"done: {changes}")


def _up_ladder(
    stack: str,
    replace_nodes: bool,
    fallback: bool,
    max_price_per_hour: float | None,
    project_dir: Path,
    capacity_timeout: int | None = None,
) -> None:
    """``up --fallback`` / ``up --max-price-per-hour`` (:func:`gpuinfra.services.ladder.form_first_rung`)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import note, stdout_console
    from gpuinfra.services.ladder import form_first_rung

    budget = None if max_price_per_hour is None else Decimal(str(max_price_per_hour))
    backend = _backend()
    out = stdout_console()
    formed = form_first_rung(
        backend,
        project_dir,
        stack,
        _progress(),
        lambda line: out.print(line, soft_wrap=True, markup=False),
        fallback=fallback,
        max_price_per_hour_usd=budget,
        replace_nodes=replace_nodes,
        notes=note,
        capacity_timeout_seconds=capacity_timeout,
    )
    out.print(f"formed rung {formed.index}: {formed.stack}", markup=False)
    out.print(f"done: {formed.changes}")
    if formed.index:
        out.print(f"next: the cluster is stack {formed.stack}: `gpuinfra down {formed.stack}` ends it", markup=False)


def _up_bake(stack: str, replace_nodes: bool, project_dir: Path) -> None:
    """``up`` of an image bake (:func:`gpuinfra.bake.deploy.deploy_bake`)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.bake.deploy import deploy_bake
    from gpuinfra.bake.stack import read_bake
    from gpuinfra.cli.console import stdout_console
    from gpuinfra.errors import RequestError
    from gpuinfra.lifecycle import check_credentials

    if replace_nodes:
        raise RequestError(
            f"--replace-nodes is for cluster stacks; {stack!r} is an image bake (no nodes): run `gpuinfra up {stack}`"
        )
    spec = read_bake(project_dir, stack)
    backend = _backend()
    check_credentials(spec.cloud)
    m = spec.manifest
    work = (
        "Image Builder's build instance builds the container, then the AMI; this waits for both"
        if spec.cloud == "aws"
        else "creates the Cloud Build trigger, then starts a build"
    )
    out = stdout_console()
    out.print(f"up {stack}: image bake of {m.cloud} {m.family} ({m.fabric}) in {spec.region}; {work}", markup=False)
    result = deploy_bake(backend, project_dir, spec, _progress())
    out.print(f"done: {result.changes}")
    for line in result.lines:
        out.print(line, soft_wrap=True, markup=False)


def down(
    stack: str = typer.Argument(..., help="Stack name."),
    delete_data: bool = typer.Option(
        False, "--delete-data", help="Also delete the stack's bucket(s) and everything in them (after the destroy)."
    ),
    yes: bool = typer.Option(False, "--yes", help="Do not ask before deleting a non-empty bucket."),
    sync_timeout_seconds: int = options.SyncTimeoutSeconds,
    project_dir: Path = options.ProjectDir,
) -> None:
    """Destroy the cluster after asking its nodes to sync their checkpoints; the bucket and its data are kept unless --delete-data, and what they cost per month is printed. A bake stack keeps its image."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.bake.deploy import is_bake_stack
    from gpuinfra.cli.console import stdout_console
    from gpuinfra.lifecycle import check_credentials, destroy_cluster
    from gpuinfra.stackfile import read_stack_spec

    if is_bake_stack(Path(project_dir), stack):
        _down_bake(stack, delete_data, Path(project_dir))
        return
    spec = read_stack_spec(project_dir, stack)  # first: "no stack X" comes before anything about Pulumi
    backend = _backend()
    check_credentials(spec.cloud)
    out = stdout_console()
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.cost import left_after_down_text
    from gpuinfra.services.cost_document import left_after_down_block

    kept = left_after_down_block(stack, Path(project_dir), delete_data or spec.delete_bucket_on_destroy)

    def say(line: str) -> None:
        out.print(line, soft_wrap=True, markup=False)

    if not delete_data:
        say(
            f"down {stack}: destroying the cluster; the stack file sets delete_bucket_on_destroy: true, so "
            "the bucket and its data are deleted with it"
            if spec.delete_bucket_on_destroy
            else f"down {stack}: destroying the cluster; the bucket and its data are kept"
        )
    changes = destroy_cluster(
        backend,
        Path(project_dir),
        spec,
        _progress(),
        say,
        delete_data=delete_data,
        confirm=lambda question: yes or (sys.stdin.isatty() and typer.confirm(question)),
        sync_timeout_seconds=sync_timeout_seconds,
    )
    out.print(f"done: {changes}")
    for line in left_after_down_text(kept):
        out.print(line, soft_wrap=True, markup=False)


def _down_bake(stack: str, delete_data: bool, project_dir: Path) -> None:
    """``down`` of an image bake (:func:`gpuinfra.bake.deploy.destroy_bake`)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.bake.deploy import destroy_bake
    from gpuinfra.bake.stack import read_bake
    from gpuinfra.cli.console import stdout_console
    from gpuinfra.errors import RequestError
    from gpuinfra.lifecycle import check_credentials

    if delete_data:
        raise RequestError(
            f"--delete-data is for cluster stacks (their data bucket); {stack!r} is an image bake, which "
            f"has none; nothing was destroyed: run `gpuinfra down {stack}`"
        )
    spec = read_bake(project_dir, stack)
    backend = _backend()
    check_credentials(spec.cloud)
    out = stdout_console()
    out.print(f"down {stack}: destroying the bake's build resources; its image is kept", markup=False)
    result = destroy_bake(backend, project_dir, spec, _progress())
    out.print(f"done: {result.changes}")
    for line in result.lines:
        out.print(line, soft_wrap=True, markup=False)


#: ``ls`` table columns; ``drop``: the order they go when the terminal is narrow
#: (:mod:`gpuinfra.cli.tables`); ``cloud`` stays: it says ``INVALID`` for an unreadable file.
LS_COLUMNS = (
    Col("stack"),
    Col("cloud"),
    Col("GPUs"),
    Col("nodes", drop=3),
    Col("age", drop=2),
    Col("expires"),
    Col("deployed", drop=4),
    Col("compute $/h"),
    Col("compute so far", drop=5),
    Col("catalog", drop=1),
)


def ls(project_dir: Path = options.ProjectDir, as_json: bool = options.Json, wide: bool = options.Wide) -> None:
    """List stacks: cloud, GPUs, nodes, age, expiry, compute $/h and compute cost so far; unreadable stack files as invalid."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import note, print_json, stdout_console
    from gpuinfra.errors import MissingDependencyError
    from gpuinfra.lifecycle import list_stacks
    from gpuinfra.stackfile import check_project_to_list

    check_project_to_list(Path(project_dir))
    try:
        backend = _backend()
    except MissingDependencyError as exc:
        backend = None
        note(f"note: {exc}; deployment status unknown")
    listing = list_stacks(Path(project_dir), backend)
    rows = listing.rows
    if as_json:
        print_json([r.to_json() for r in rows] + [bad.to_json() for bad in listing.invalid])
        return
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.tables import dropped_note, print_table

    invalid = f" ({len(listing.invalid)} invalid)" if listing.invalid else ""
    table_rows: list[tuple[str, ...]] = []
    for r in rows:
        age = (r.now - r.spec.created_at).total_seconds() / 3600
        table_rows.append(
            (
                r.spec.stack,
                r.spec.cloud,
                f"{r.spec.gpu_count}x{r.spec.gpu}",
                str(r.spec.nodes),
                f"{age:.1f} h",
                ("EXPIRED " if r.expired else "") + f"{r.spec.expires_at:%Y-%m-%d %H:%M}",
                {True: "yes", False: "no", None: "?"}[r.deployed],
                r.price_text(),
                r.cost_so_far_text(),
                r.catalog_date,
            )
        )
    for bad in listing.invalid:
        table_rows.append((bad.name, "INVALID", *["-"] * 8))
    out = stdout_console()
    shown = print_table(
        out,
        LS_COLUMNS,
        table_rows,
        wide=wide,
        title=f"{len(rows) + len(listing.invalid)} stacks{invalid} in {Path(project_dir).resolve() / 'stacks'}",
        title_justify="left",
    )
    hidden = dropped_note(LS_COLUMNS, shown)
    if hidden:
        out.print(hidden, markup=False)
    for bad in listing.invalid:
        out.print(f"INVALID {bad.name}: {bad.reason}", soft_wrap=True, markup=False)


def reap(
    expired: bool = typer.Option(False, "--expired", help="Destroy every deployed stack whose TTL has passed."),
    job_over: bool = typer.Option(
        False,
        "--job-over",
        help="Destroy every deployed stack whose `gpuinfra run` job is over (its nodes ended themselves; "
        "the laptop that ran it may be gone).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be destroyed."),
    sync_timeout_seconds: int = options.SyncTimeoutSeconds,
    project_dir: Path = options.ProjectDir,
) -> None:
    """Destroy expired stacks, or stacks whose job is over (data kept, nodes asked to sync first), e.g. from cron: `gpuinfra reap --expired --job-over`.

    Every expired stack is tried, then the results are listed; exit 7 when a destroy failed,
    2 when a stack file could not be read (its expiry is unknown).
    """
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import stdout_console
    from gpuinfra.errors import GpuinfraError, RequestError
    from gpuinfra.lifecycle import list_stacks, reap_error, reap_expired
    from gpuinfra.services.jobs import job_over as state_of_job
    from gpuinfra.stackfile import check_project_to_list

    if not expired and not job_over:
        raise RequestError("reap needs --expired and/or --job-over; add --dry-run to see the list first")
    check_project_to_list(Path(project_dir))
    backend = _backend()
    out = stdout_console()
    listing = list_stacks(Path(project_dir), backend)
    victims = listing.expired_deployed if expired else []
    why = {r.spec.stack: f"expired {r.spec.expires_at:%Y-%m-%d %H:%M} UTC" for r in victims}
    if job_over:
        for r in listing.rows:
            if r.deployed and r.spec.stack not in why:
                try:
                    state = state_of_job(backend, Path(project_dir), r.spec)
                except GpuinfraError as exc:
                    out.print(f"{r.spec.stack}: job state unknown, not reaped ({exc})", soft_wrap=True, markup=False)
                    continue
                if state is not None:
                    victims.append(r)
                    why[r.spec.stack] = f"job {state}"
    if not victims:
        out.print(
            "no deployed stack has expired" if not job_over else "no deployed stack has expired or a job that is over"
        )
    elif dry_run:
        for r in victims:
            out.print(f"would destroy {r.spec.stack} ({why[r.spec.stack]})")
    results = (
        []
        if dry_run
        else reap_expired(
            Path(project_dir),
            backend,
            victims,
            _progress(),
            on_start=lambda r: out.print(f"destroying {r.spec.stack} ({why[r.spec.stack]}); data kept"),
            say=lambda line: out.print(f"  {line}", soft_wrap=True, markup=False),
            sync_timeout_seconds=sync_timeout_seconds,
        )
    )
    for result in results:
        out.print(
            f"destroyed {result.stack}" if result.error is None else f"FAILED {result.stack}: {result.error}",
            soft_wrap=True,
            markup=False,
        )
    for bad in listing.invalid:
        out.print(f"INVALID {bad.name}: not checked ({bad.reason})", soft_wrap=True, markup=False)
    error = reap_error(results, listing.invalid)
    if error is not None:
        raise error
