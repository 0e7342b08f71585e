"""``gpuinfra check STACK``: the boot health gate's results of every node of a stack.

Thin: where to read, what counts and the decision are :mod:`gpuinfra.services.health_report`'s
(:func:`~gpuinfra.services.health_report.locate_results`, :meth:`~gpuinfra.services.health_report.HealthReport.verdict`);
this module prints.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gpuinfra.cli import options
from gpuinfra.cli.tables import Col

#: Table columns per check (:data:`gpuinfra.health.gate.CHECKS`), the busbw one aside.
_COLUMNS = {
    "gpu_count": "GPUs",
    "ecc": "ECC",
    "nvlink": "NVLink",
    "fabric_manager": "fabric mgr",
    "efa_devices": "EFA",
    "gpudirect_plugin": "GPUDirect",
    "allreduce_ranks": "ranks",
    "allreduce_complete": "run done",
    "allreduce_correct": "all-reduce ok",
}
_MARK = {True: "pass", False: "FAIL", None: "-"}

Bucket = typer.Option(
    None,
    "--bucket",
    help="Read the results from this bucket instead of the stack's Pulumi output bucket_name: s3://NAME or gs://NAME "
    "(a bare NAME takes the cloud from the stack file).",
    show_default=False,
)
Nodes = typer.Option(
    None,
    "--nodes",
    min=1,
    help="Nodes that must each have a passing result; needed only without the stack file (with it: its nodes).",
    show_default=False,
)
Since = typer.Option(
    None,
    "--since",
    help="Count only results checked at or after this ISO 8601 time (no zone: UTC); default: the stack's last Pulumi "
    "update. Older results are from an earlier deployment and listed as stale.",
    show_default=False,
)


def _busbw(node) -> str:
    result = node.check("allreduce_busbw")
    if result is None or result.expected is None:
        return "-"
    measured = "?" if result.measured is None else f"{result.measured:.2f}"
    return f"{measured} / {result.expected:.2f}"


#: The health table's columns; ``drop``: the order they go when the terminal is narrow
#: (:mod:`gpuinfra.cli.tables`): the per-check marks go (a failed check is also a FAIL line below),
#: node, bus bandwidth and result stay.
CHECK_COLUMNS = (
    Col("node"),
    Col("type", drop=2),
    Col("checked at", drop=1),
    *(Col(header, drop=3 + i) for i, header in enumerate(_COLUMNS.values())),
    Col("busbw GB/s (measured / expected)", fold=True, fold_min=15),
    Col("result"),
)


def _print_table(report, wide: bool = False) -> None:
    """The per-node table, then one line per failed check, unreadable, stale or missing result,
    then a count; ``wide``: every column."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import stdout_console
    from gpuinfra.cli.tables import dropped_note, print_table

    out = stdout_console()
    loc = report.location
    since = f"; results before {loc.since_iso} ({loc.since_source}) are stale" if loc.since else ""
    out.print(
        f"health gate of stack {loc.stack}: {loc.url} ({len(report.nodes)} of {loc.expected_nodes} nodes "
        f"reported{since})",
        markup=False,
        soft_wrap=True,
    )
    if report.nodes:
        rows = []
        for node in report.nodes:
            marks = [_MARK[c.passed] if (c := node.check(key)) else "?" for key in _COLUMNS]
            rows.append((node.node, node.instance_type, node.checked_at, *marks, _busbw(node), node.verdict))
        shown = print_table(out, CHECK_COLUMNS, rows, wide=wide)
        hidden = dropped_note(CHECK_COLUMNS, shown)
        if hidden:
            out.print(hidden, markup=False)
    for node in report.nodes:
        for result in node.failed:
            out.print(f"FAIL {node.node} {result.name}: {result.detail}", soft_wrap=True, markup=False)
    for node in report.pending:
        out.print(
            f"PENDING {node.node}: local checks passed; the cluster all-reduce has not run yet",
            soft_wrap=True,
            markup=False,
        )
    for bad in report.invalid:
        out.print(f"INVALID {bad.key}: {bad.reason}", soft_wrap=True, markup=False)
    for old in report.stale:
        out.print(
            f"STALE {old.node}: checked at {old.checked_at}, before this deployment; ignored",
            soft_wrap=True,
            markup=False,
        )
    if report.missing:
        out.print(f"MISSING {report.missing} of {loc.expected_nodes} nodes have no current result", markup=False)
    unreadable = f"; {len(report.invalid)} result(s) unreadable" if report.invalid else ""
    passed = sum(n.verdict == "PASS" for n in report.nodes)
    out.print(f"{passed} of {loc.expected_nodes} nodes passed{unreadable}", markup=False)


def check(
    stack: str = typer.Argument(..., help="Stack name."),
    bucket: str | None = Bucket,
    nodes: int | None = Nodes,
    since: str | None = Since,
    as_json: bool = options.Json,
    project_dir: Path = options.ProjectDir,
    wide: bool = options.Wide,
) -> None:
    """Show each node's boot health gate: pass/fail per check, all-reduce bus bandwidth measured vs expected (GB/s).

    Exits 8 when a node failed, a result is unreadable, or a node has no result from this deployment yet.
    """
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import print_json
    from gpuinfra.errors import HealthGateError
    from gpuinfra.services.health_report import locate_results, read_health

    report = read_health(locate_results(stack, project_dir, bucket=bucket, nodes=nodes, since=since))
    if as_json:
        print_json(report.to_dict())
    elif report.nodes or report.invalid or report.stale:
        _print_table(report, wide)
    verdict = report.verdict()
    if not verdict.passed:
        raise HealthGateError(verdict.reason)
