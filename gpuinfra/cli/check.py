"""``gpuinfra check STACK``: the boot health gate's results of every node of a stack."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gpuinfra.cli import options

#: Table columns per check (:data:`gpuinfra.health.gate.CHECKS`), the busbw one aside.
_COLUMNS = {"gpu_count": "GPUs", "ecc": "ECC", "nvlink": "NVLink", "fabric_manager": "fabric mgr",
            "efa_devices": "EFA", "gpudirect_plugin": "GPUDirect", "allreduce_correct": "all-reduce ok"}
_MARK = {True: "pass", False: "FAIL", None: "-"}

Bucket = typer.Option(
    None, "--bucket",
    help="Read the results from this bucket instead of the stack's Pulumi output bucket_name: s3://NAME or gs://NAME "
         "(a bare NAME takes the cloud from the stack file).", show_default=False,
)


def _where(stack: str, bucket: Optional[str], project_dir: Path) -> tuple[str, str]:
    """(cloud, bucket name) from ``--bucket`` or the stack file and its Pulumi outputs."""
    from gpuinfra.errors import GpuinfraError, RequestError
    from gpuinfra.stackfile import read_stack_spec

    if bucket and "://" in bucket:
        scheme, _, name = bucket.partition("://")
        name = name.rstrip("/")
        if scheme not in ("s3", "gs") or not name or "/" in name:
            raise RequestError(f"--bucket {bucket!r}: give s3://NAME, gs://NAME or a bare NAME (no path)")
        return {"s3": "aws", "gs": "gcp"}[scheme], name
    cloud = read_stack_spec(project_dir, stack).cloud
    if bucket:
        return cloud, bucket
    from gpuinfra import lifecycle

    backend = lifecycle.make_backend()
    lifecycle.check_credentials(cloud)
    name = backend.outputs(Path(project_dir), stack).get("bucket_name")
    if not name:
        raise GpuinfraError(f"stack {stack!r} has no bucket_name output (is it deployed? `gpuinfra up {stack}`); "
                            "or give --bucket")
    return cloud, name


def _busbw(node) -> str:
    result = node.check("allreduce_busbw")
    if result is None or result.expected is None:
        return "-"
    measured = "?" if result.measured is None else f"{result.measured:.2f}"
    return f"{measured} / {result.expected:.2f}"


def _print_table(stack: str, url: str, report) -> None:
    """The per-node table, then one line per failed check or unreadable result, then a count."""
    from rich.table import Table

    from gpuinfra.cli.console import stdout_console

    out = stdout_console()
    out.print(f"health gate of stack {stack}: {url} ({len(report.nodes)} nodes)", markup=False, soft_wrap=True)
    if report.nodes:
        table = Table()
        for header in ("node", "type", "checked at", *_COLUMNS.values(), "busbw GB/s (measured / expected)", "result"):
            table.add_column(header)
        for node in report.nodes:
            marks = [_MARK[c.passed] if (c := node.check(key)) else "?" for key in _COLUMNS]
            table.add_row(node.node, node.instance_type, node.checked_at, *marks, _busbw(node),
                          "PASS" if node.passed else "FAIL")
        out.print(table)
    for node in report.nodes:
        for result in node.failed:
            out.print(f"FAIL {node.node} {result.name}: {result.detail}", soft_wrap=True, markup=False)
    for bad in report.invalid:
        out.print(f"INVALID {bad.key}: {bad.reason}", soft_wrap=True, markup=False)
    unreadable = f"; {len(report.invalid)} result(s) unreadable" if report.invalid else ""
    out.print(f"{sum(n.passed for n in report.nodes)} of {len(report.nodes)} nodes passed{unreadable}", markup=False)


def check(
    stack: str = typer.Argument(..., help="Stack name."),
    bucket: Optional[str] = Bucket,
    as_json: bool = options.Json,
    project_dir: Path = options.ProjectDir,
) -> None:
    """Show each node's boot health gate: pass/fail per check, all-reduce bus bandwidth measured vs expected (GB/s).

    Exits 8 when a node failed, a result is unreadable, or no node has written one yet.
    """
    from gpuinfra.cli.console import print_json
    from gpuinfra.errors import HealthGateError
    from gpuinfra.health.gate import SCHEMA_VERSION
    from gpuinfra.health.report import read_health
    from gpuinfra.lifecycle import check_credentials
    from gpuinfra.spec import check_stack_name

    check_stack_name(stack)
    cloud, name = _where(stack, bucket, project_dir)
    check_credentials(cloud)
    report = read_health(cloud, name, stack)
    url = f"{'s3' if cloud == 'aws' else 'gs'}://{name}/{report.prefix}"
    if as_json:
        print_json({"schema_version": SCHEMA_VERSION, "stack": stack, "results": url, "passed": report.passed,
                    "nodes": [n.to_dict() for n in report.nodes],
                    "invalid": [{"key": i.key, "reason": i.reason} for i in report.invalid]})
    elif report.nodes or report.invalid:
        _print_table(stack, url, report)
    if not report.nodes and not report.invalid:
        raise HealthGateError(f"no health results under {url} yet: each node writes its result there after its boot "
                              "checks; run this again when the nodes are up")
    if not report.passed:
        failed = [n.node for n in report.nodes if not n.passed] + [i.key for i in report.invalid]
        raise HealthGateError(f"{len(failed)} of {len(report.nodes) + len(report.invalid)} nodes failed the health "
                              f"gate or have an unreadable result: {', '.join(failed)}")
