"""``gpuinfra status STACK``: nodes, per-GPU utilization now and over the last hour, cost so far
and projected to the TTL, time until the idle or TTL end.

Thin: reading is :mod:`gpuinfra.services.monitoring_sources`, the figures :mod:`gpuinfra.monitoring.status`,
the view :mod:`gpuinfra.monitoring.render` / :mod:`gpuinfra.monitoring.html`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gpuinfra.cli import options

Watch = typer.Option(False, "--watch", help="Refresh in place until Ctrl-C (live view).")
Interval = typer.Option(60, "--interval", min=10, max=3600, help="Seconds between --watch refreshes (10-3600).")
Html = typer.Option(
    None,
    "--html",
    help="Also write a self-contained HTML report (utilization and cost charts) to FILE.",
    show_default=False,
    dir_okay=False,
)


def status(
    stack: str = typer.Argument(..., help="Stack name."),
    watch: bool = Watch,
    interval: int = Interval,
    as_json: bool = options.Json,
    html: Path | None = Html,
    project_dir: Path = options.ProjectDir,
) -> None:
    """Show a deployed stack's nodes, GPU utilization (now, last-hour mean, a chart of the last hour) and cost so far.

    Exits 2 when the stack is not deployed, 6 without cloud credentials or permissions, 7 when the cloud API fails.
    With --watch, Ctrl-C exits 0; a failed refresh keeps the last view with one error line.
    """
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.errors import RequestError
    from gpuinfra.monitoring.render import renderable
    from gpuinfra.monitoring.render import watch as watch_loop
    from gpuinfra.services import monitoring_sources as sources

    if watch and (as_json or html):
        raise RequestError("--watch shows a live view: use --json or --html without it")
    spec, outputs = sources.locate(stack, project_dir)
    report = sources.collect(spec, outputs)
    if html is not None:
        _write_html(report, html)
    if as_json:
        print_json(report.to_dict())
        return
    out = stdout_console()
    if not watch:
        out.print(renderable(report))
        return
    from rich.live import Live

    try:
        with Live(renderable(report), console=out, refresh_per_second=1, screen=False) as live:
            watch_loop(
                lambda: sources.collect(spec, outputs),
                lambda r, error: live.update(renderable(r, error)),
                report,
                interval,
            )
    except KeyboardInterrupt:
        return


def _write_html(report, path: Path) -> None:
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.errors import ProjectDirError
    from gpuinfra.monitoring.html import write_report

    try:
        write_report(report, path)
    except OSError as exc:
        raise ProjectDirError(f"--html {path}: cannot write it ({exc.strerror or exc})") from None
