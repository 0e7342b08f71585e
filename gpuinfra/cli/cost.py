"""``gpuinfra cost``: priced resource breakdown of a stack before `pulumi up`; ``cost diff``."""

from __future__ import annotations

from decimal import Decimal
import math
from pathlib import Path
from typing import Optional

import typer

from gpuinfra.cli import options


def cost_document(stack: str | None, project_dir: Path, hours: float | None, market: str | None,
                  usage_file: Path | None, from_preview: Path | None) -> dict:
    """Run the estimate for a stack (offline preview) or a `pulumi preview --json` file."""
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.cost.estimate import estimate, read_cluster_facts
    from gpuinfra.cost.prices import usage_for
    from gpuinfra.cost.report import to_json
    from gpuinfra.errors import RequestError

    if hours is not None and not 0 < hours <= 87600:
        raise RequestError(f"--hours must be more than 0 and at most 87600, got {hours}")
    catalog = load_catalog()
    data = None
    if from_preview is not None:
        from gpuinfra.cost.pulumi_preview import read_pulumi_preview
        from gpuinfra.profiles import get_profile

        resources, config, name = read_pulumi_preview(from_preview)
        region = config.get("aws:region") or config.get("gcp:region")
        stack = stack or name
        profile = read_cluster_facts(resources, region).profile
        if hours:
            run_hours = Decimal(str(hours))
        else:
            run_hours = Decimal(str(get_profile(profile).default_run_hours)) if profile else Decimal(24)
    else:
        from gpuinfra.preview import run_preview_cached
        from gpuinfra.stackfile import provider_config, read_stack_spec

        spec = read_stack_spec(project_dir, stack)
        result = run_preview_cached(spec, provider_config(spec))
        resources = result.resources
        region = spec.region
        run_hours = Decimal(str(hours if hours is not None else spec.run_hours))
        profile = spec.profile.name
        data = spec.data
    est = estimate(resources, catalog, region, usage_for(profile, usage_file), run_hours, market, data)
    chosen = market or est.facts.market
    return to_json(est, stack or "", run_hours, catalog.date_for(est.facts.cloud), chosen)


def print_cost_table(doc: dict) -> None:
    """Render a cost document as a table grouped by resource, then totals and warnings."""
    from rich import box
    from rich.table import Table

    from gpuinfra.cli.console import stdout_console

    out = stdout_console()
    table = Table(box=box.SIMPLE_HEAD, title=f"cost of {doc['stack']} ({doc['pricing']}, {doc['hours']} h run, "
                                             f"catalog {doc['catalog_date']})", title_justify="left")
    for header, justify in [("resource / component", "left"), ("qty/h", "right"), ("unit", "left"),
                            ("unit price", "right"), ("$/h", "right"), ("run $", "right"), ("price source, date", "left")]:
        table.add_column(header, justify=justify)
    current = None
    for line in doc["lines"]:
        if line["resource"] != current:
            current = line["resource"]
            table.add_row(f"[bold]{current}[/bold]", "", "", "", "", "", "")
        mark = "*" if line["usage_based"] else ""
        table.add_row(
            f"  {line['component']}{mark}", _num(line["quantity"]), line["unit"],
            "not found" if line["unit_price_usd"] is None else f"${Decimal(line['unit_price_usd']):,.6g}",
            "-" if line["hourly_usd"] is None else f"${Decimal(line['hourly_usd']):,.4f}",
            "-" if line["run_usd"] is None else f"${Decimal(line['run_usd']):,.2f}",
            ", ".join(x for x in (line["price_source"].split(" (")[0], line["price_date"], line["note"]) if x),
        )
    out.print(table)
    out.print(f"total: ${Decimal(doc['hourly_usd']):,.2f}/h, ${Decimal(doc['run_usd']):,.2f} for {doc['hours']} h "
              f"(* usage-based: profile defaults or --usage)")
    out.print(f"warning: left running for 30 days this costs ${Decimal(doc['monthly_usd_if_left_running']):,.2f}")
    if doc["spot_savings_percent"] is not None:
        verb = "saves" if doc["pricing"] == "spot" else "would save"
        out.print(f"spot {verb} {doc['spot_savings_percent']}% on compute; spot nodes can be interrupted "
                  "(2 min notice on AWS, 30 s on GCP): checkpoint often")
    if doc["price_not_found"]:
        out.print(f"{len(doc['price_not_found'])} line(s) with no price (not counted in the total): "
                  + "; ".join(doc["price_not_found"]))
    if doc["not_priced"]:
        out.print(f"{len(doc['not_priced'])} resource(s) not priced: " + ", ".join(n["resource"] for n in doc["not_priced"]))
    out.print(f"{len(doc['free_resources'])} resources have no charge of their own")


def _num(text: str) -> str:
    value = Decimal(text)
    return f"{value:.4f}".rstrip("0").rstrip(".") if value else "0"


def cost(
    args: list[str] = typer.Argument(..., help="STACK, or: diff STACK_A STACK_B", show_default=False),
    hours: Optional[float] = typer.Option(None, "--hours", help="Run hours (default: the stack's run_hours).", show_default=False),
    spot: bool = typer.Option(False, "--spot", help="Price compute as spot (default: as planned)."),
    on_demand: bool = typer.Option(False, "--on-demand", help="Price compute as on-demand (default: as planned)."),
    usage: Optional[Path] = typer.Option(None, "--usage", help="Usage YAML: bucket_storage_gb, internet_egress_gb, nat_processed_gb.", show_default=False),
    from_preview: Optional[Path] = typer.Option(None, "--from-preview", help="Price a `pulumi preview --json` file instead of the offline preview.", show_default=False),
    budget: Optional[float] = typer.Option(None, "--budget", help="Exit with code 3 when the run total exceeds this many USD.", show_default=False),
    project_dir: Path = options.ProjectDir,
    as_json: bool = options.Json,
) -> None:
    """Price every resource of a stack before `pulumi up` (exit 3 over --budget); `cost diff A B` compares two."""
    from gpuinfra.cli.console import print_json
    from gpuinfra.errors import ExitCode, PriceMissingError, RequestError
    from gpuinfra.requests import spot_choice

    chosen = spot_choice(spot, on_demand, default="the stack's own pricing")
    market = None if chosen is None else ("spot" if chosen else "on-demand")
    if args and args[0] == "diff":
        if len(args) != 3:
            raise RequestError("usage: gpuinfra cost diff STACK_A STACK_B")
        _diff(args[1], args[2], project_dir, hours, market, usage, as_json)
        return
    if len(args) != 1:
        raise RequestError("give one STACK (or: gpuinfra cost diff STACK_A STACK_B)")
    if budget is not None and not (math.isfinite(budget) and budget >= 0):
        raise RequestError(f"--budget must be a number >= 0 (USD), got {budget}")
    doc = cost_document(args[0], project_dir, hours, market, usage, from_preview)
    if as_json:
        print_json(doc)
    else:
        print_cost_table(doc)
    unpriced = doc["price_not_found"] + [f"{r['resource']} ({r['resource_type']}: {r['reason']})" for r in doc["not_priced"]]
    if unpriced:
        # money fails closed: an unpriced line is never $0, so the total is not a total
        raise PriceMissingError(unpriced)
    if budget is not None and Decimal(doc["run_usd"]) > Decimal(str(budget)):
        import sys

        sys.stderr.write(f"error: run total ${Decimal(doc['run_usd']):,.2f} exceeds the budget ${budget:,.2f}\n")
        raise typer.Exit(int(ExitCode.BUDGET_EXCEEDED))


def _diff(a: str, b: str, project_dir: Path, hours, market, usage, as_json: bool) -> None:
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.cost.report import diff

    before = cost_document(a, project_dir, hours, market, usage, None)
    after = cost_document(b, project_dir, hours, market, usage, None)
    rows, hourly_change, run_change = diff(before, after)
    if as_json:
        print_json({
            "schema_version": "1", "before": a, "after": b,
            "hourly_usd_change": str(hourly_change), "run_usd_change": str(run_change),
            "rows": [{"change": r.symbol, "resource": r.resource, "component": r.component,
                      "before_hourly_usd": None if r.before_hourly is None else str(r.before_hourly),
                      "after_hourly_usd": None if r.after_hourly is None else str(r.after_hourly)} for r in rows],
        })
        return
    out = stdout_console()
    out.print(f"cost diff {a} -> {b}   (+ added, ~ changed, - removed)")
    for r in rows:
        before_text = "-" if r.before_hourly is None else f"${r.before_hourly:,.4f}/h"
        after_text = "-" if r.after_hourly is None else f"${r.after_hourly:,.4f}/h"
        out.print(f" {r.symbol} {r.resource}: {r.component}  {before_text} -> {after_text}")
    out.print(f"change: {'+' if hourly_change >= 0 else '-'}${abs(hourly_change):,.2f}/h "
              f"(${Decimal(before['hourly_usd']):,.2f} -> ${Decimal(after['hourly_usd']):,.2f}); "
              f"run total {'+' if run_change >= 0 else '-'}${abs(run_change):,.2f}")
