"""``gpuinfra run STACK -- CMD``: up if needed, the health verdict, the job, its logs, the end.

1. ``up`` when the stack has no ``bucket_name`` output yet (:func:`gpuinfra.lifecycle.deploy`:
   up's checks and guards); a stack with a fallback ladder (``new --fallback N``, or ``run --gpus
   ... --fallback N``) forms through it as ``up --fallback`` does
   (:func:`gpuinfra.services.ladder.form_first_rung`, with the budget the ladder recorded), and
   the run goes on on the rung that formed;
2. wait for the health verdict (unless the profile's gate is ``off``): every node's result in
   the bucket passed (:mod:`gpuinfra.services.health_report`); a failed node stops the run (exit 8)
   when the gate is ``enforce``, and is a warning when it is ``report``;
3. the job spec into the bucket (:mod:`gpuinfra.services.jobs`), then every node's log lines
   (``[rank-N] ...``) under a status line until the job is over; Ctrl-C detaches (the run goes on
   and the nodes still end themselves when it is over);
4. the exit status, where checkpoints and outputs are, the run's cost from the catalog's price
   (from ``run``'s start: ``up`` and the health wait bill too),
   then ``down`` (data kept) unless ``keep``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path

from gpuinfra import lifecycle
from gpuinfra.agent.job import JobSpec, job_prefix, secret_command
from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import HealthGateError, RequestError, SpecError
from gpuinfra.plan.fabric import CLUSTER_ENV_WAIT_SECONDS
from gpuinfra.plan.naming import stack_id
from gpuinfra.services import jobs
from gpuinfra.services.health_report import locate_results, read_health
from gpuinfra.stackfile import read_stack_spec

#: Default bound of the wait for the health verdict: the nodes' own bound for the ranks and the
#: gate -- a first boot builds the image.
HEALTH_WAIT_SECONDS = CLUSTER_ENV_WAIT_SECONDS


@dataclass(frozen=True)
class RunResult:
    """How a run ended: ``view`` (None when detached before the end), ``detached``, the seconds
    since ``run`` started (its ``up`` and the health wait included: the nodes bill through them;
    a stack that was up before is counted from then on), the cost line, where data is and whether the stack was destroyed."""

    spec: JobSpec
    view: jobs.JobView | None
    detached: bool
    seconds: float
    cost: str
    checkpoints_url: str
    outputs_url: str
    destroyed: bool
    stack: str = ""


def check_job_fits(job: JobSpec, spec) -> None:
    """Refuse a job that stack ``spec`` (a :class:`gpuinfra.spec.ClusterSpec`) could not run:
    ``min_nodes`` above its nodes, or a secret outside the names its nodes may read (they are
    scoped to its stack id: :func:`gpuinfra.agent.job.secret_command`). Checked for every rung of
    a fallback ladder before any is brought up: the job runs on the rung that forms.

    Raises:
        RequestError: the job does not fit the stack.
    """
    if job.min_nodes > spec.nodes:
        raise RequestError(f"--min-nodes {job.min_nodes}: the stack has {spec.nodes} node(s) ({spec.stack})")
    for name in job.secrets.values():
        try:
            secret_command(spec.cloud, stack_id(spec), name)  # the names the nodes may read
        except ValueError as exc:
            raise RequestError(f"--secret: {exc}") from None


def hourly_usd(spec) -> Decimal | None:
    """The cluster's hourly compute price from the catalog (never the stack file's), or None."""
    per_node = load_catalog().node_hour_price_usd(spec)
    return None if per_node is None else per_node * spec.nodes


def wait_for_health(
    stack: str,
    project_dir: Path,
    url: str,
    say: Callable[[str], None],
    wait_seconds: float,
    poll_seconds: float,
    gate: str = "enforce",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Poll the nodes' health results until every node passed.

    Args:
        gate: the profile's ``health_gate``: ``enforce`` (a failed node stops the run) or
            ``report`` (a failed node is a warning and the job goes on, as ``gpuinfra-run`` on
            the nodes does: docs/health-gate.md).

    Raises:
        HealthGateError: a node failed (``enforce``), or no verdict within ``wait_seconds``.
    """
    location = locate_results(stack, project_dir, bucket=url)
    deadline, said = clock() + wait_seconds, ""
    while True:
        report = read_health(location)
        if report.passed:
            say("health gate: passed on every node")
            return
        if report.failed and gate == "report":
            say(f"health gate (report): {report.verdict().reason}; the job is submitted anyway")
            return
        if report.failed:
            raise HealthGateError(
                f"health gate: {report.verdict().reason}; the job was not submitted (gpuinfra check {stack})"
            )
        line = f"waiting for the health verdict: {len(report.nodes)}/{location.expected_nodes} nodes reported"
        if line != said:
            say(line)
            said = line
        if clock() >= deadline:
            raise HealthGateError(f"no health verdict after {wait_seconds:.0f} s: {report.verdict().reason}")
        sleep(poll_seconds)


def refuse_a_second_job(store: jobs.JobStore, stack: str, deployment: str) -> None:
    """Refuse a job for a deployment that already has one: its nodes end themselves once a job is
    over, and a node that finds the spec changed under its running job stops that job as
    cancelled and ends (:mod:`gpuinfra.agent.job`), so the new job would never start. A job of an
    earlier deployment (the bucket outlives ``down``) is no obstacle: the new nodes ignore it.

    Raises:
        SpecError: the current job is this deployment's (or either has no deployment id), with
            what to do instead.
    """
    current = jobs.current_spec(store, stack)
    if current is None or (current.deployment and deployment and current.deployment != deployment):
        return
    if jobs.read_view(store, stack, current).final is None and not current.cancel:
        raise SpecError(
            f"job {current.id} is still running on {stack}: `gpuinfra logs {stack} -f` follows it, "
            f"`gpuinfra cancel {stack}` ends it and the cluster"
        )
    raise SpecError(
        f"job {current.id} is over on {stack} and its nodes ended themselves: "
        f"`gpuinfra down {stack}`, then run again (a new deployment runs the new job)"
    )


def run(
    project_dir: Path,
    stack: str,
    job_fields: dict,
    argv: list[str],
    *,
    keep: bool,
    say: Callable[[str], None],
    on_line: Callable[[str], None],
    on_status: Callable[[str], None],
    on_event: Callable[[object], None],
    health_wait_seconds: float | None = None,
    poll_seconds: float = 5.0,
    store: jobs.JobStore | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    capacity_timeout_seconds: int | None = None,
) -> RunResult:
    """The whole run (module docstring).

    Args:
        job_fields: :class:`JobSpec` fields besides ``id`` / ``argv`` (image, env, secrets, restart ...).
        on_line: prints one log line; on_status: shows the status line; on_event: the
            Automation API event printer of ``up`` / ``down``.
        health_wait_seconds: bound of the wait for the health verdict (None: :data:`HEALTH_WAIT_SECONDS`).
        store: the bucket (default: the stack's, through the cloud SDK).
        capacity_timeout_seconds: the ``up`` it runs: as :func:`gpuinfra.lifecycle.deploy`.

    Raises:
        RequestError: a job field a node could not run; SpecError: as ``up`` / ``down``, or the
            deployment already had a job (:func:`refuse_a_second_job`); MissingDependencyError,
            OperationError: as ``up`` / ``down``; HealthGateError: the gate failed (nothing submitted).
    """
    started = clock()
    spec = read_stack_spec(project_dir, stack)
    job = jobs.make_spec(argv, **job_fields)  # checked before anything is deployed
    check_job_fits(job, spec)
    backend = lifecycle.make_backend()
    lifecycle.check_credentials(spec.cloud)
    outputs = backend.outputs(project_dir, stack)
    if not outputs.get("bucket_name"):
        # imported on use: a ladder's planning modules load only when a stack is brought up
        from gpuinfra.services.ladder import form_first_rung, read_ladder

        ladder = read_ladder(project_dir, stack)
        for rung in ladder.stacks[1:] if ladder else []:  # the job runs on whichever rung forms
            check_job_fits(job, read_stack_spec(project_dir, rung))
        if ladder is None:
            say(f"run {stack}: the stack is not up; up {stack} first")
            lifecycle.deploy(backend, project_dir, spec, on_event, capacity_timeout_seconds=capacity_timeout_seconds)
        else:
            say(f"run {stack}: the stack is not up; forming its fallback ladder ({len(ladder.stacks)} rungs)")
            formed = form_first_rung(
                backend,
                project_dir,
                stack,
                on_event,
                say,
                max_price_per_hour_usd=ladder.max_price_per_hour_usd,
                capacity_timeout_seconds=capacity_timeout_seconds,
            )
            if formed.stack != stack:
                say(f"run: rung {formed.index} formed; the job runs on {formed.stack}")
            stack = formed.stack
        outputs = backend.outputs(project_dir, stack)
        spec = read_stack_spec(project_dir, stack)  # the new deployment id (and the rung's own nodes)
    bucket = outputs["bucket_name"]
    scheme = "s3" if spec.cloud == "aws" else "gs"
    store = store or jobs.store_for(spec.cloud, bucket)
    refuse_a_second_job(store, stack, spec.deployment_id or "")
    job = replace(job, deployment=spec.deployment_id or "")
    if spec.profile.health_gate != "off":
        wait_for_health(
            stack,
            project_dir,
            f"{scheme}://{bucket}",
            say,
            HEALTH_WAIT_SECONDS if health_wait_seconds is None else health_wait_seconds,
            poll_seconds,
            spec.profile.health_gate,
            clock,
            sleep,
        )
    jobs.submit(store, stack, job)
    say(f"job {job.id} submitted: {' '.join(job.argv)}")
    price = hourly_usd(spec)
    view, detached = None, False
    try:
        view = jobs.follow(
            store,
            stack,
            job,
            on_line,
            lambda v: on_status(jobs.status_line(v, spec.nodes, clock() - started, price)),
            poll_seconds,
            sleep,
        )
    except KeyboardInterrupt:
        detached = True
    seconds = clock() - started
    destroyed = False
    if view is not None and not keep:
        say(f"job over ({view.state}): down {stack}, the bucket and its data are kept")
        lifecycle.destroy_cluster(backend, project_dir, spec, on_event, say)
        destroyed = True
    return RunResult(
        job,
        view,
        detached,
        seconds,
        jobs.cost_text(price, seconds).replace(" so far", ""),
        f"{scheme}://{bucket}/checkpoints/{stack}/",
        f"{scheme}://{bucket}/{job_prefix(stack, job.id)}/outputs/",
        destroyed,
        stack,
    )
