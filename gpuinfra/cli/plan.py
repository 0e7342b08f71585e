"""``gpuinfra plan``: every way to buy the GPUs for a run by a deadline, priced side by side
(:mod:`gpuinfra.services.deadline` does the work; this module parses and prints)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import typer

from gpuinfra.cli import options


def plan(
    by: str = typer.Option(..., "--by", help="Deadline: 2026-12-20 (00:00 UTC that day) or 2026-12-20T18:00Z."),
    gpus: str | None = typer.Option(
        None, "--gpus", help="GPUs per node: 8xH100 ... (with --hours).", show_default=False
    ),
    nodes: int = options.Nodes,
    hours: float | None = typer.Option(None, "--hours", help="Run hours (with --gpus).", show_default=False),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Size the run for this model (with --method and --tokens) instead of --gpus/--hours.",
        show_default=False,
    ),
    method: str = typer.Option("full", "--method", help="With --model: pretrain | full | lora | qlora."),
    tokens: str | None = typer.Option(
        None, "--tokens", help="With --model: training tokens, e.g. 500B.", show_default=False
    ),
    budget: float | None = typer.Option(
        None, "--budget", help="Most the run's compute may cost in USD; plans over it are marked.", show_default=False
    ),
    cloud: str | None = options.Cloud,
    region: str | None = options.Region,
    restart_minutes: float | None = typer.Option(
        None,
        "--restart-minutes",
        help="Spot: minutes to resume after an interruption (default: an assumption, 15).",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    buy: int | None = typer.Option(
        None, "--buy", help="Write the purchase stack of plan N (an AWS Capacity Block) as listed.", show_default=False
    ),
    confirm_non_refundable: str | None = typer.Option(
        None,
        "--confirm-non-refundable",
        help="With --buy: the Capacity Block's upfront fee in USD, paid up front and never refunded.",
        show_default=False,
    ),
    name: str = typer.Option(
        "deadline", "--name", help="With --buy: the cluster stack's name; the purchase stack is <name>-block."
    ),
    gcp_project: str | None = typer.Option(
        None,
        "--gcp-project",
        help="GCP project: its reservations are listed, and a calendar-mode request is made in it "
        "(default: the credentials' project).",
        show_default=False,
    ),
    project_dir: Path = options.ProjectDir,
    force: bool = typer.Option(False, "--force", help="With --buy: replace an existing purchase stack file."),
) -> None:
    """Plan a run by a deadline: on-demand, spot, AWS Capacity Blocks, GCP flex-start, calendar-mode
    reservations and reservations you hold, with start, finish, total and risk, cheapest that meets it first."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.services import purchase
    from gpuinfra.services.deadline import (
        DeadlineRequest,
        check_budget,
        check_restart_minutes,
        check_run_source,
        deadline_document,
        parse_deadline,
        plan_lines,
        sized_run,
        utc_now,
    )
    from gpuinfra.spec import check_gcp_project_id, check_new_stack_name, check_run_hours

    now = utc_now()
    deadline = parse_deadline(by, now)
    check_run_source(gpus, hours, model, tokens)
    catalog = load_catalog()
    checkpoint, sized = None, None
    run_hours: Decimal | None
    if model:
        assert tokens is not None
        gpus, nodes, run_hours, checkpoint, sized = sized_run(
            model, method, tokens, cloud, region, catalog, now=now, by=deadline
        )
    else:
        run_hours = check_run_hours(hours)
    assert gpus is not None and run_hours is not None
    req = DeadlineRequest(
        gpus=gpus,
        nodes=nodes,
        run_hours=run_hours,
        by=deadline,
        now=now,
        budget_usd=check_budget(budget),
        cloud=cloud,
        region=region,
        checkpoint_plan=checkpoint,
        restart_minutes=check_restart_minutes(restart_minutes),
    )
    if gcp_project is not None:
        check_gcp_project_id(gcp_project)
    doc = deadline_document(catalog, req, gcp_project=gcp_project, sized=sized)
    if buy is not None:
        check_new_stack_name(name)
        path, spec = purchase.buy(doc, buy, confirm_non_refundable, name, project_dir, force, gcp_project)
        out = stdout_console()
        what = f"Capacity Block {spec.offering_id}" if spec.kind == "capacity-block" else "calendar-mode request"
        out.print(
            f"wrote {path}: {what}, {spec.instance_count} x {spec.instance_type} in {spec.availability_zone}, "
            f"{spec.start:%Y-%m-%d %H:%M} to {spec.end:%Y-%m-%d %H:%M} UTC, ${Decimal(spec.upfront_usd):,.2f}; "
            "previewed offline with 0 rule violations",
            markup=False,
        )
        for line in purchase.next_steps(spec, project_dir):
            out.print(line, markup=False)
        return
    if as_json:
        print_json(doc)
        return
    out = stdout_console()
    for line in plan_lines(doc):
        out.print(line, markup=False)
