"""Terminal view of a :class:`~gpuinfra.monitoring.status.ClusterStatus` (rich renderables,
used by the one-shot print and by ``--watch``'s live view).

The utilization chart is a sparkline: one block character per minute of the last hour, its
height the busiest GPU's utilization in that minute (eight levels, U+2581..U+2588).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from gpuinfra.errors import OperationError
from gpuinfra.money import incomplete_text
from gpuinfra.monitoring.status import ClusterStatus

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], top: float = 100.0) -> str:
    """One character per value in ``0..top`` (``None`` -> space)."""
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        else:
            out.append(BLOCKS[min(len(BLOCKS) - 1, max(0, int(v / top * len(BLOCKS))))])
    return "".join(out)


def minute_values(status: ClusterStatus, minutes: int = 60) -> list[float | None]:
    """Busiest-GPU utilization for each of the last ``minutes`` minutes (None: no sample)."""
    peaks = {t: peak for t, _mean, peak in status.timeline}
    last = status.now.replace(second=0, microsecond=0)
    return [peaks.get(last - timedelta(minutes=minutes - 1 - i)) for i in range(minutes)]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _usd(value, at_least=None) -> str:
    if value is not None:
        return f"${value:,.2f}"
    if at_least is not None:
        return f"unknown, at least ${at_least:,.2f} (see the notes)"
    return incomplete_text(1)  # the one line status prices, node-hours, has no catalog price


def _left(until: datetime, now: datetime) -> str:
    seconds = int((until - now).total_seconds())
    if seconds <= 0:
        return "passed"
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h {rest // 60:02d} min"


def summary_lines(status: ClusterStatus) -> list[str]:
    """The text lines above and below the tables (cost, TTL, idle, notes)."""
    now = status.now
    lines = [
        f"stack {status.stack} ({status.cloud}) at {now:%Y-%m-%d %H:%M} UTC: "
        f"{sum(n.billed for n in status.nodes)} of {len(status.nodes)} nodes running"
    ]
    rate = status.price_per_node_hour_usd
    lines.append(
        # compute only: the nodes' billed hours at the catalog's node-hour price (`gpuinfra cost`
        # prices disks, NAT, storage and transfer)
        f"compute cost so far {_usd(status.cost_so_far_usd, status.cost_so_far_at_least_usd)}"
        + (f" at ${rate:,.4f} per node-hour" if rate is not None else "")
        + f"; projected to the TTL {_usd(status.projected_to_ttl_usd, status.projected_to_ttl_at_least_usd)}"
    )
    lines.append(f"TTL ends {status.expires_at:%Y-%m-%d %H:%M} UTC (in {_left(status.expires_at, now)})")
    if status.idle_since is not None and status.idle_ends_at is not None:
        lines.append(
            f"IDLE: every GPU under {status.idle_threshold_percent}% since {status.idle_since:%H:%M} UTC; "
            f"the node agent ends the cluster at {status.idle_ends_at:%H:%M} UTC "
            f"(in {_left(status.idle_ends_at, now)})"
        )
    elif status.timeline:
        lines.append(f"busy: a GPU is at or above the idle threshold of {status.idle_threshold_percent}%")
    return lines + [f"note: {n}" for n in status.notes]


def renderable(status: ClusterStatus, error: str | None = None):
    """A rich ``Group``: summary, nodes, GPUs, the last hour's sparkline; ``error``: one line
    saying the latest refresh failed (the figures are then the previous ones)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = summary_lines(status)
    parts: list = [Text(head[0])]
    nodes = Table(title="nodes", title_justify="left")
    # a node id is never cut ("i-0123…"): the other columns wrap to fit the terminal instead
    for column in ("node", "state", "launched (UTC)"):
        nodes.add_column(column, no_wrap=column == "node")
    for n in status.nodes:
        nodes.add_row(n.node_id, n.state, f"{n.launched_at:%Y-%m-%d %H:%M}" if n.launched_at else "-")
    parts.append(nodes)
    if status.gpus:
        gpus = Table(title="GPUs", title_justify="left")
        for column in ("node", "GPU", "util % now", "util % 1 h mean", "memory GiB now"):
            gpus.add_column(
                column, justify="right" if "%" in column or "GiB" in column else "left", no_wrap=column == "node"
            )
        for g in status.gpus:
            gpus.add_row(
                g.node_id, g.gpu, _pct(g.utilization_now), _pct(g.utilization_hour_mean), _pct(g.memory_used_gib_now)
            )
        parts.append(gpus)
        parts.append(Text(f"cluster GPU utilization, last hour mean {_pct(status.cluster_utilization_hour_mean)}%"))
        parts.append(Text(f"busiest GPU per minute, last 60 min: |{sparkline(minute_values(status))}| 0-100%"))
    parts += [Text(line) for line in head[1:]]
    if error:
        parts.append(Text(f"refresh failed, showing the view of {status.now:%H:%M:%S} UTC: {error}", style="red"))
    return Group(*parts)


def pause(seconds: float) -> None:
    """Wait between ``--watch`` refreshes (tests replace it)."""
    time.sleep(seconds)


def watch(
    collect: Callable[[], ClusterStatus],
    show: Callable[[ClusterStatus, str | None], None],
    last: ClusterStatus,
    interval_s: float,
) -> None:
    """Refresh until interrupted: every ``interval_s`` seconds ``show(collect(), None)``; when a
    refresh fails with a transient cloud error (:class:`gpuinfra.errors.OperationError`),
    ``show(last, message)`` keeps the previous figures with one error line. Other errors
    (credentials, permissions) propagate. Returns only by an exception (Ctrl-C:
    ``KeyboardInterrupt``)."""
    while True:
        pause(interval_s)
        try:
            last, error = collect(), None
        except OperationError as exc:
            error = str(exc)
        show(last, error)
