"""``gpuinfra run`` / ``logs`` / ``jobs`` / ``cancel``: a training job on a stack's nodes,
delivered through the stack bucket (docs/run.md)."""

from __future__ import annotations

import inspect
from pathlib import Path

import typer

from gpuinfra.cli import options
from gpuinfra.cli.new import new as new_command

#: ``new``'s parameters that ``run`` has itself, with run's meaning: ``--image`` is the job's
#: container image in ``run`` (new's ``--image baked:NAME`` -- boot a baked image -- is reached by
#: ``gpuinfra new ... --image baked:NAME`` then ``gpuinfra run STACK``); ``--project-dir`` and
#: ``--json`` are shared and mean the same. Every other parameter of ``new`` is one of run's
#: options as ``new`` defines it (:data:`NEW_OPTIONS`): one definition, no second list.
RUN_OWN = frozenset({"image", "project_dir", "as_json"})
#: ``new``'s options that ``run --gpus`` takes and hands to ``new``: parameter name -> parameter
#: (its typer.Option default: flags, help, default), read from new's own signature.
NEW_OPTIONS = {
    name: param.replace(kind=inspect.Parameter.KEYWORD_ONLY)
    for name, param in inspect.signature(new_command, eval_str=True).parameters.items()
    if name not in RUN_OWN
}


#: The options that ask ``new`` for a cluster (``new`` takes any one of them): given one, ``run``
#: writes the stack first; without one, new's options are refused.
REQUEST_OPTIONS = ("gpus", "instance_type", "model", "params")


def new_flag(name: str) -> str:
    """The command-line flag of new's parameter ``name`` (its first declaration, ``--gpus``)."""
    return NEW_OPTIONS[name].default.param_decls[0]


Keep = typer.Option(False, "--keep", help="Keep the cluster when the job is over (default: `down`, data kept).")


def _stack_store(stack: str, project_dir: Path):
    """(stack spec, the stack's bucket store, bucket URL) of a deployed stack.

    Raises:
        SpecError: no stack file, or the stack is not up (no ``bucket_name`` output).
    """
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra import lifecycle
    from gpuinfra.errors import SpecError
    from gpuinfra.services import jobs
    from gpuinfra.stackfile import read_stack_spec

    spec = read_stack_spec(project_dir, stack)
    lifecycle.check_credentials(spec.cloud)
    bucket = lifecycle.make_backend().outputs(project_dir, stack).get("bucket_name")
    if not bucket:
        raise SpecError(
            f"stack {stack!r} is not up (no bucket_name output): `gpuinfra run {stack} -- CMD` brings it up"
        )
    return spec, jobs.store_for(spec.cloud, bucket)


def _write_stack(project_dir: Path, new_args: dict) -> None:
    """``gpuinfra new`` with ``new_args`` (flag -> value; True: a bare flag), through the command
    line itself, so its checks, messages and exit codes are new's own.

    Raises:
        GpuinfraError: whatever ``new`` refuses (exit code kept).
    """
    # imported on use: CLI start-up time; gpuinfra.cli imports this module (app is defined there)
    import click

    # imported on use: gpuinfra.cli imports this module at start-up, so app exists only by now
    from gpuinfra.cli import app
    from gpuinfra.errors import ExitCode, GpuinfraError  # imported on use: CLI start-up time

    argv = ["new", "--project-dir", str(project_dir)]
    for flag, value in new_args.items():
        if value is True:
            argv.append(flag)
        elif value is not None and value is not False:  # a 0 the user gave goes to new (0 == False)
            argv += [flag, str(value)]
    try:
        code = app(args=argv, prog_name="gpuinfra", standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    if code not in (None, 0):
        error = GpuinfraError(f"gpuinfra {' '.join(argv)} failed; nothing was deployed")
        error.exit_code = ExitCode(code)
        raise error


def run(
    ctx: typer.Context,
    stack: str | None = typer.Argument(
        None, help="Stack name (brought up first when it is not); with --gpus there is none.", show_default=False
    ),
    command: list[str] | None = typer.Argument(None, help="After `--`: the command torchrun starts on every node."),
    image: str = typer.Option("", "--image", help="Container image (default: the profile's)."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE given to the job (repeat)."),
    secret: list[str] = typer.Option(
        [],
        "--secret",
        help="KEY=NAME: the job gets KEY from secret NAME, read on the node; ID is the stack id, STACK-SUFFIX "
        "(AWS: SSM parameter /gpuinfra/ID/job/... or Secrets Manager gpuinfra/ID/job/...; GCP: Secret Manager "
        "gpuinfra-ID_...).",
    ),
    restart: str = typer.Option("on-failure", "--restart", help="on-failure | never."),
    max_restarts: int = typer.Option(3, "--max-restarts", help="Restarts of the job before it counts as failed."),
    min_nodes: int = typer.Option(0, "--min-nodes", help="torchrun --nnodes MIN (0: every node of the stack)."),
    nproc_per_node: int = typer.Option(0, "--nproc-per-node", help="Processes per node (0: one per GPU)."),
    workdir: str = typer.Option("", "--workdir", help="The job's folder on the node (default: the scratch mount)."),
    keep: bool = Keep,
    health_wait_seconds: int | None = typer.Option(
        None,
        "--health-wait-seconds",
        help="Bound of the wait for the health verdict (default: the nodes' own bound for the ranks and the gate).",
        show_default=False,
    ),
    capacity_timeout: int | None = typer.Option(
        None,
        "--capacity-timeout",
        help="As `up --capacity-timeout`: seconds the `up` that run does waits for every node of a GCP STANDARD / SPOT "
        "or flex-start cluster before it reports no capacity (exit 7).",
        show_default=False,
    ),
    project_dir: Path = options.ProjectDir,
    as_json: bool = options.Json,
    **new_options,
) -> None:
    """Run CMD on every node of STACK (`gpuinfra run STACK -- python train.py`, or `gpuinfra run --gpus 4xA100 --name NAME -- CMD`, with any of new's options, to write the stack first as `gpuinfra new` would; --image stays the job's container image): up if needed, wait for the health verdict, stream the rank-prefixed logs, then `down` (data kept) unless --keep. Ctrl-C detaches; the run goes on."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import note, print_json, stdout_console
    from gpuinfra.cli.lifecycle import _progress
    from gpuinfra.errors import OperationError, RequestError
    from gpuinfra.services import jobs
    from gpuinfra.services.run import run as run_job

    if capacity_timeout is not None:
        from gpuinfra.lifecycle import check_capacity_timeout  # imported on use: CLI start-up time

        check_capacity_timeout(capacity_timeout)  # bad input: refused before a stack is written
    words = [w for w in [stack, *(command or [])] if w is not None]
    # only what the command line gave goes to `new` (its defaults and variables stay new's own)
    new_args = {
        new_flag(key): value
        for key, value in new_options.items()
        if getattr(ctx.get_parameter_source(key), "name", "") == "COMMANDLINE"
    }
    requested = any(new_flag(key) in new_args for key in REQUEST_OPTIONS)
    name = new_options.get("name")
    if not requested:
        given = list(new_args)
        if given:
            raise RequestError(
                f"{', '.join(given)}: only with --gpus (or --instance-type, --model, --params), which writes the "
                "stack first"
            )
        stack, words = (words[0] if words else None), words[1:]
        if stack is None:
            raise RequestError("give STACK -- CMD, or --gpus SPEC --name NAME -- CMD")
    elif name is None:
        raise RequestError("--gpus needs --name NAME: the stack run writes, ups and runs")
    if not words:
        raise RequestError("no command: give it after `--`, e.g. gpuinfra run STACK -- python train.py")
    fields = {
        "image": image,
        "env": jobs.parse_env(env, "--env"),
        "secrets": jobs.parse_env(secret, "--secret"),
        "restart": restart,
        "max_restarts": max_restarts,
        "min_nodes": min_nodes,
        "nproc_per_node": nproc_per_node,
        "workdir": workdir,
    }
    out = stdout_console()
    status = {"line": ""}

    def say(line: str) -> None:
        (note if as_json else lambda t: out.print(t, soft_wrap=True, markup=False))(line)

    def on_status(line: str) -> None:
        if line != status["line"]:
            status["line"] = line
            note(line)  # stderr: the log on stdout stays clean

    if requested:
        # the job's own input is checked before a stack file is written
        jobs.make_spec(words, **fields)
        _write_stack(Path(project_dir), new_args)
        stack = name
    assert stack is not None  # checked above: STACK, or --gpus with --name
    result = run_job(
        Path(project_dir),
        stack,
        fields,
        words,
        keep=keep,
        say=say,
        on_line=(lambda line: None) if as_json else (lambda line: out.print(line, soft_wrap=True, markup=False)),
        on_status=on_status,
        on_event=_progress(),
        health_wait_seconds=health_wait_seconds,
        capacity_timeout_seconds=capacity_timeout,
    )
    stack = result.stack or stack  # a ladder's rung that formed
    if result.detached:
        say(f"detached; job {result.spec.id} goes on: `gpuinfra logs {stack} -f`, `gpuinfra cancel {stack}`")
        return
    view = result.view
    assert view is not None  # not detached: the job is over
    lines = [
        f"job {view.spec.id} {view.state}, exit status {view.exit_code}, {view.restart_count} restart(s)",
        f"checkpoints: {result.checkpoints_url}",
        f"outputs: {result.outputs_url}",
        f"cost: {result.cost} for {result.seconds / 60:.0f} min (compute, catalog price)",
        "cluster: destroyed, bucket kept" if result.destroyed else f"cluster: kept (--keep): `gpuinfra down {stack}`",
    ]
    if as_json:
        print_json(
            {
                **view.to_json(),
                "checkpoints": result.checkpoints_url,
                "outputs": result.outputs_url,
                "destroyed": result.destroyed,
                "seconds": round(result.seconds),
                "cost": result.cost,
            }
        )
    else:
        for line in lines:
            say(line)
    if view.state != "succeeded":
        raise OperationError(f"job {view.spec.id} {view.state} (exit status {view.exit_code})")


# run's options are its own and every one of new's (NEW_OPTIONS): Typer reads the signature
setattr(  # noqa: B010  (a function's __signature__ is what inspect.signature, so Typer, reads)
    run,
    "__signature__",
    inspect.signature(run, eval_str=True).replace(
        parameters=[
            *(p for p in inspect.signature(run, eval_str=True).parameters.values() if p.kind != p.VAR_KEYWORD),
            *NEW_OPTIONS.values(),
        ]
    ),
)


def logs(
    stack: str = typer.Argument(..., help="Stack name."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job is over (Ctrl-C stops)."),
    project_dir: Path = options.ProjectDir,
    as_json: bool = options.Json,
) -> None:
    """Print the current job's rank-prefixed log (every node's chunks from the bucket)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.errors import SpecError
    from gpuinfra.services import jobs

    _, store = _stack_store(stack, Path(project_dir))
    spec = jobs.current_spec(store, stack)
    if spec is None:
        raise SpecError(f"stack {stack!r} has no job: `gpuinfra run {stack} -- CMD`")
    out = stdout_console()
    if as_json:
        print_json({"job": spec.id, "lines": jobs.new_log_lines(store, stack, spec.id, set())})
        return
    if not follow:
        for line in jobs.new_log_lines(store, stack, spec.id, set()):
            out.print(line, soft_wrap=True, markup=False)
        return
    try:
        jobs.follow(store, stack, spec, lambda line: out.print(line, soft_wrap=True, markup=False))
    except KeyboardInterrupt:
        out.print(f"detached; job {spec.id} goes on", markup=False)


def jobs_(
    stack: str = typer.Argument(..., help="Stack name."),
    project_dir: Path = options.ProjectDir,
    as_json: bool = options.Json,
) -> None:
    """List the stack's current job: state, exit status, restarts (with cause and step) and each node's progress."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.services import jobs

    _, store = _stack_store(stack, Path(project_dir))
    spec = jobs.current_spec(store, stack)
    views = [] if spec is None else [jobs.read_view(store, stack, spec)]
    if as_json:
        print_json([v.to_json() for v in views])
        return
    out = stdout_console()
    if not views:
        out.print(f"{stack}: no job", markup=False)
    for v in views:
        out.print(
            f"{v.spec.id} {v.state} exit={v.exit_code} restarts={v.restart_count} submitted={v.spec.submitted_at}: "
            f"{' '.join(v.spec.argv)}",
            markup=False,
        )
        for part, s in sorted(v.statuses.items()):
            out.print(f"  {part} {s.get('node', '')}: {s.get('state')} progress={s.get('progress', {})}", markup=False)
        for r in v.restarts:
            out.print(f"  restart on {r['part']} at {r['at']}: {r['cause']} (step {r.get('step')})", markup=False)


def cancel(
    stack: str = typer.Argument(..., help="Stack name."),
    keep: bool = Keep,
    project_dir: Path = options.ProjectDir,
) -> None:
    """Stop the stack's job (the nodes sync their checkpoints and end themselves), wait for the nodes' final.json (at most `down`'s sync wait), then `down` (data kept) unless --keep. Without a job: nothing is destroyed."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra import lifecycle
    from gpuinfra.cli.console import stdout_console
    from gpuinfra.cli.lifecycle import _progress
    from gpuinfra.services import jobs

    spec, store = _stack_store(stack, Path(project_dir))
    job = jobs.cancel(store, stack)
    out = stdout_console()
    if job is None:
        out.print(f"{stack}: no job to cancel; the stack stays up (`gpuinfra down {stack}` destroys it)", markup=False)
        return
    out.print(f"job {job.id}: cancel requested", markup=False)
    if not keep:
        out.print(
            f"waiting up to {jobs.CANCEL_WAIT_SECONDS} s for the nodes' final.json (outputs upload first), then down",
            markup=False,
        )
        view = jobs.wait_until_over(store, stack, job)
        running = jobs.still_running(view)
        if view.final is not None and not running:
            out.print(f"job over: {view.state}", markup=False)
        else:
            missing = "no final.json" if view.final is None else "final.json written"
            out.print(
                f"{missing} after {jobs.CANCEL_WAIT_SECONDS} s (still running: {', '.join(running) or 'none'}); "
                "down goes on: outputs still uploading are cut short",
                markup=False,
            )
        lifecycle.destroy_cluster(
            lifecycle.make_backend(), Path(project_dir), spec, _progress(), lambda line: out.print(line, markup=False)
        )
        out.print(f"down {stack}: destroyed, the bucket and its data are kept", markup=False)
