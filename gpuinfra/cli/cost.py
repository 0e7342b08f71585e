"""``gpuinfra cost STACK``: priced resource breakdown of a stack before `pulumi up`;
``gpuinfra cost diff STACK_A STACK_B``: what changes between two stacks.

One Typer group (:class:`~gpuinfra.cli.groups.DefaultCommandGroup`): ``diff`` is a sub-command,
anything else is a stack name for the hidden default command ``stack``. The documents come from
:mod:`gpuinfra.services.cost_document`; this module parses options and renders.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import typer

from gpuinfra.cli import options
from gpuinfra.cli.groups import DefaultCommand, DefaultCommandGroup
from gpuinfra.cli.tables import Col


class _CostGroup(DefaultCommandGroup):
    default_command = "stack"


app = typer.Typer(
    cls=_CostGroup,
    help="Price every resource of STACK before `pulumi up` (exit 3 over --budget, 4 when a price is "
    "missing); `gpuinfra cost diff STACK_A STACK_B` compares two stacks.",
    no_args_is_help=True,
)

Hours = typer.Option(None, "--hours", help="Run hours (default: the stack's run_hours).", show_default=False)
Spot = typer.Option(False, "--spot", help="Price compute as spot (default: as planned).")
OnDemand = typer.Option(False, "--on-demand", help="Price compute as on-demand (default: as planned).")
Usage = typer.Option(
    None, "--usage", help="Usage YAML: bucket_storage_gb, internet_egress_gb, nat_processed_gb.", show_default=False
)


#: The cost table's columns; ``drop``: the order they go when the terminal is narrow
#: (:mod:`gpuinfra.cli.tables`). Component names and sources wrap instead of being cut.
COST_COLUMNS = (
    Col("resource / component", fold=True, fold_min=24),
    Col("qty/h", "right", drop=2),
    Col("unit", drop=1),
    Col("unit price", "right", drop=3),
    Col("$/h", "right"),
    Col("run $", "right"),
    Col("price source, date", fold=True, fold_min=24, drop=4),
)


def print_cost_table(doc: dict, wide: bool = False) -> None:
    """Render a cost document as a table grouped by resource, then totals and warnings;
    ``wide``: every column, unwrapped."""
    from rich import box

    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import stdout_console
    from gpuinfra.cli.tables import dropped_note, print_table
    from gpuinfra.cost.report import document_total

    out = stdout_console()
    rows: list[tuple[str, ...]] = []
    current = None
    for line in doc["lines"]:
        if line["resource"] != current:
            current = line["resource"]
            rows.append((f"[bold]{current}[/bold]", "", "", "", "", "", ""))
        mark = "*" if line["usage_based"] else ""
        rows.append(
            (
                f"  {line['component']}{mark}",
                _num(line["quantity"]),
                line["unit"],
                "not found" if line["unit_price_usd"] is None else f"${Decimal(line['unit_price_usd']):,.6g}",
                "-" if line["hourly_usd"] is None else f"${Decimal(line['hourly_usd']):,.4f}",
                "-" if line["run_usd"] is None else f"${Decimal(line['run_usd']):,.2f}",
                ", ".join(x for x in (line["price_source"].split(" (")[0], line["price_date"], line["note"]) if x),
            )
        )
    shown = print_table(
        out,
        COST_COLUMNS,
        rows,
        wide=wide,
        box=box.SIMPLE_HEAD,
        title=f"cost of {doc['stack']} ({doc['pricing']}, {doc['hours']} h run, catalog {doc['catalog_date']})",
        title_justify="left",
    )
    hidden = dropped_note(COST_COLUMNS, shown)
    if hidden:
        out.print(hidden, markup=False)
    hourly, run = document_total(doc, "hourly_usd"), document_total(doc, "run_usd")
    if hourly.complete:
        out.print(
            f"total: {hourly.text(suffix='/h')}, {run.text()} for {doc['hours']} h "
            f"(* usage-based: profile defaults or --usage)"
        )
        out.print(
            f"warning: left running for 30 days this costs {document_total(doc, 'monthly_if_left_running_usd').text()}"
        )
    else:
        out.print(f"total: {hourly.text()} (* usage-based: profile defaults or --usage)")
    if doc["spot_savings_percent"] is not None:
        verb = "saves" if doc["pricing"] == "spot" else "would save"
        out.print(
            f"spot {verb} {doc['spot_savings_percent']}% on compute; spot nodes can be interrupted "
            "(2 min notice on AWS, 30 s on GCP): checkpoint often"
        )
    if doc.get("spot"):
        # imported on use: CLI start-up time (only the command that runs loads its library modules)
        from gpuinfra.services.spot_outlook import spot_outlook_lines

        for text in spot_outlook_lines(doc["spot"]):
            out.print(text)
    if doc.get("commitments"):
        for text in commitment_lines(doc["commitments"]):
            out.print(text)
    if doc["price_not_found"]:
        out.print(
            f"{len(doc['price_not_found'])} line(s) with no price (so no total): " + "; ".join(doc["price_not_found"])
        )
    if doc["not_priced"]:
        out.print(
            f"{len(doc['not_priced'])} resource(s) not priced: " + ", ".join(n["resource"] for n in doc["not_priced"])
        )
    out.print(f"{len(doc['free_resources'])} resources have no charge of their own")
    for text in left_after_down_text(doc["left_after_down"]):
        out.print(text, soft_wrap=True, markup=False)


def left_after_down_text(block: dict) -> list[str]:
    """The "left after down" lines of a cost document's ``left_after_down`` block: one per kept
    charge (``$/month``, unit price, source, note), then the monthly total or, when a line has no
    price, ``incomplete: N lines without a price``."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.money import Total

    total = Total.from_json(block["monthly_usd"], block["lines_without_price"])
    if "error" in block:
        return [f"left after down, per month: unknown ({block['error']})"]
    if not block["lines"]:
        return ["left after down: nothing (the bucket is deleted with the stack)"]
    if all(line["component"].startswith("Soft-deleted") for line in block["lines"]):
        rows = [f"left after down, per month: {total.text(suffix='/month')} (the bucket is deleted with the stack)"]
    else:
        rows = [f"left after down, per month: {total.text(suffix='/month')}"]
    for line in block["lines"]:
        amount = "not found" if line["monthly_usd"] is None else f"${Decimal(line['monthly_usd']):,.2f}/month"
        unit = (
            ""
            if line["unit_price_usd"] is None
            else f" at ${Decimal(line['unit_price_usd']).normalize():f}/{line['unit']}"
        )
        where = ", ".join(x for x in (line["price_source"].split(" (")[0], line["price_date"], line["note"]) if x)
        rows.append(f"  {line['resource']}: {line['component']}: {amount}{unit} ({where})")
    return rows


def commitment_lines(view: dict) -> list[str]:
    """The text of a cost document's ``commitments`` object (gpuinfra/cost/commitment.py)."""
    if not view["applies"]:
        return [f"commitments: not shown ({view['reason']})"]
    lines = [
        f"commitments ({view['nodes']} node(s), {view['hours']} h; the nodes stay on-demand VMs, a commitment "
        "is paid every hour of its term, used or not):"
    ]
    for t in view["terms"]:
        if not t["priced"]:
            lines.append(f"  {t['market']}: not priced ({t['reason']})")
            continue
        lines.append(
            f"  {t['market']}: ${Decimal(t['per_node_hour_usd']):,.4f}/node-h -> this run's compute "
            f"${Decimal(t['run_compute_usd']):,.2f} (on-demand ${Decimal(t['on_demand_run_compute_usd']):,.2f}); "
            f"obligation ${Decimal(t['obligation_usd']):,.2f} over {t['term_hours']:,} h; cheaper than on-demand "
            f"above {Decimal(t['break_even_hours_per_year']):,} on-demand h/year per node "
            f"({t['commitment']}, {t['source_date']})"
        )
    return lines


def _num(text: str) -> str:
    value = Decimal(text)
    return f"{value:.4f}".rstrip("0").rstrip(".") if value else "0"


@app.command("stack", hidden=True, cls=DefaultCommand)
def cost(
    stack: str = typer.Argument(
        ..., metavar="STACK", help="Stack name (stacks/Pulumi.<stack>.yaml).", show_default=False
    ),
    hours: float | None = Hours,
    spot: bool = Spot,
    on_demand: bool = OnDemand,
    usage: Path | None = Usage,
    from_preview: Path | None = typer.Option(
        None,
        "--from-preview",
        help="Price a `pulumi preview --json` file instead of the offline preview.",
        show_default=False,
    ),
    budget: float | None = typer.Option(
        None, "--budget", help="Exit with code 3 when the run total exceeds this many USD.", show_default=False
    ),
    project_dir: Path = options.ProjectDir,
    as_json: bool = options.Json,
    wide: bool = options.Wide,
) -> None:
    """Price every resource of a stack before `pulumi up` (exit 3 over --budget)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import note, print_json, usd
    from gpuinfra.services.cost_document import (
        check_budget,
        check_totals,
        preview_file_cost_document,
        pricing_market,
        stack_cost_document,
        stack_priced_alternative,
    )

    market = pricing_market(spot, on_demand)
    budget_usd = check_budget(budget)
    if from_preview is not None:
        doc = preview_file_cost_document(from_preview, stack, hours, market, usage)
    else:
        doc = stack_cost_document(stack, project_dir, hours, market, usage)
    if as_json:
        print_json(doc)
    else:
        print_cost_table(doc, wide)
    alt = None if from_preview is not None else stack_priced_alternative(stack, project_dir, doc, usage)
    if alt is not None:
        where = alt.offer.offer
        note(
            f"note: complete total in {where.region}: {usd(alt.compute_price_per_hour_usd)}/h compute, "
            f"{usd(alt.run_usd)} for the {alt.hours:g} h run ({where.instance_type} {alt.market} in {where.zone}); "
            f"`gpuinfra new` with --region {where.region} writes this request there"
        )
    check_totals(doc, budget_usd)  # after the document: its unpriced lines are what the error names


@app.command("diff")
def diff(
    before: str = typer.Argument(..., metavar="STACK_A", help="Stack before the change.", show_default=False),
    after: str = typer.Argument(..., metavar="STACK_B", help="Stack after the change.", show_default=False),
    hours: float | None = Hours,
    spot: bool = Spot,
    on_demand: bool = OnDemand,
    usage: Path | None = Usage,
    project_dir: Path = options.ProjectDir,
    as_json: bool = options.Json,
) -> None:
    """Compare two stacks: + / ~ / - per resource, and the change in $/h and run total."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.money import Total
    from gpuinfra.services.cost_document import check_diff_totals, cost_diff_document, pricing_market

    doc = cost_diff_document(before, after, project_dir, hours, pricing_market(spot, on_demand), usage)
    if as_json:
        print_json(doc)
        check_diff_totals(doc)  # after the document: its unpriced lines are what the error names
        return
    out = stdout_console()
    out.print(f"cost diff {before} -> {after}   (+ added, ~ changed, - removed)")
    for r in doc["rows"]:
        before_text = "-" if r["before_hourly_usd"] is None else f"${Decimal(r['before_hourly_usd']):,.4f}/h"
        after_text = "-" if r["after_hourly_usd"] is None else f"${Decimal(r['after_hourly_usd']):,.4f}/h"
        out.print(f" {r['change']} {r['resource']}: {r['component']}  {before_text} -> {after_text}")
    sides = {side: len(doc[f"{side}_price_not_found"]) for side in ("before", "after")}
    hourly = {side: Total.from_json(doc[f"{side}_hourly_usd"], sides[side]) for side in sides}
    change = {key: Total.from_json(doc[f"{key}_change_usd"], sum(sides.values())) for key in ("hourly", "run")}
    out.print(
        f"change: {change['hourly'].text(suffix='/h', signed=True)} "
        f"({hourly['before'].text()} -> {hourly['after'].text()}); "
        f"run total {change['run'].text(signed=True)}"
    )
    check_diff_totals(doc)  # after the text: its unpriced lines are what the error names
