"""``gpuinfra status --html FILE``: one self-contained page (plotly.js inlined, no network) with
the last hour's GPU utilization and the cost over the cluster's life.

Charts are plotly figures (plotly.com/python/interactive-html-export: ``to_html`` with
``include_plotlyjs=True`` inlines the library; later figures on the page reuse it with
``include_plotlyjs=False``). The cost chart is the cost so far at each hour since the first
node launched (per-node price x node-hours, :func:`gpuinfra.monitoring.status.costs`' rule)
and, dashed, its projection to the TTL with the nodes running now.
"""

from __future__ import annotations

import html
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from gpuinfra.fsutil import atomic_write_text
from gpuinfra.monitoring.render import summary_lines
from gpuinfra.monitoring.status import ClusterStatus

#: ``id`` of each chart's ``<div>`` (tests look for them after the page's scripts ran).
UTILIZATION_DIV = "gpuinfra-utilization"
COST_DIV = "gpuinfra-cost"


def utilization_figure(status: ClusterStatus):
    """Per-GPU utilization (one line each) and the busiest GPU, last hour, 0-100 %."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for g in status.gpus:
        points = [(t, v) for s in status.series if (s.node_id, s.gpu) == (g.node_id, g.gpu) for t, v in s.utilization]
        fig.add_trace(
            go.Scatter(
                x=[t for t, _ in points],
                y=[v for _, v in points],
                mode="lines",
                name=f"{g.node_id} GPU {g.gpu}",
                line={"width": 1},
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[t for t, _, _ in status.timeline],
            y=[p for _, _, p in status.timeline],
            mode="lines",
            name="busiest GPU",
            line={"width": 3, "color": "black"},
        )
    )
    fig.add_hline(
        y=status.idle_threshold_percent,
        line_dash="dot",
        annotation_text=f"idle threshold {status.idle_threshold_percent}%",
    )
    fig.update_layout(
        title="GPU utilization, last hour (%)",
        yaxis={"range": [0, 100], "title": "%"},
        xaxis={"title": "UTC"},
        height=420,
    )
    return fig


def cost_points(status: ClusterStatus, steps: int = 48) -> tuple[list, list, list, list]:
    """(times, USD) so far -- from the first launch to now -- and (times, USD) projected to the
    TTL; empty without a price or a launched node."""
    rate = status.price_per_node_hour_usd
    now = status.now
    billed = [(n.billed_interval(now), n.will_bill) for n in status.nodes]
    runs = [
        (interval[0], interval[1], open_ended)
        for interval, open_ended in billed
        if interval is not None and (interval[1] > interval[0] or open_ended)
    ]
    if rate is None or not runs:
        return [], [], [], []

    def cost_at(t) -> float:
        hours = sum(
            max(0.0, ((t if open_ended and t > now else min(t, end)) - start).total_seconds() / 3600)
            for start, end, open_ended in runs
        )
        return float(rate * Decimal(str(hours)))

    first, end = min(start for start, _, _ in runs), max(status.expires_at, now)
    span = max((now - first) / steps, timedelta(seconds=1))
    past = [first + span * i for i in range(steps)] + [now]
    ahead = [now + (end - now) / steps * i for i in range(steps + 1)]
    return past, [cost_at(t) for t in past], ahead, [cost_at(t) for t in ahead]


def cost_figure(status: ClusterStatus):
    """Cost so far and its projection to the TTL (USD)."""
    import plotly.graph_objects as go

    past, spent, ahead, projected = cost_points(status)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=past, y=spent, mode="lines", name="cost so far", line={"width": 3}))
    fig.add_trace(go.Scatter(x=ahead, y=projected, mode="lines", name="projected to the TTL", line={"dash": "dash"}))
    fig.update_layout(title="Cost (USD)", yaxis={"title": "USD"}, xaxis={"title": "UTC"}, height=420)
    return fig


def report_html(status: ClusterStatus) -> str:
    """The whole page (UTF-8 HTML with plotly.js inlined once)."""
    util = utilization_figure(status).to_html(full_html=False, include_plotlyjs=True, div_id=UTILIZATION_DIV)
    cost = cost_figure(status).to_html(full_html=False, include_plotlyjs=False, div_id=COST_DIV)
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(status))
    title = html.escape(f"gpuinfra status: {status.stack}")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>'
        f'<body style="font-family: sans-serif"><h1>{title}</h1><ul>{summary}</ul>{util}{cost}</body></html>\n'
    )


def write_report(status: ClusterStatus, path: Path) -> None:
    """Write :func:`report_html` to ``path`` atomically (nothing half-written).

    Raises:
        OSError: the folder cannot be written.
    """
    atomic_write_text(Path(path), report_html(status))
