"""`gpuinfra status --html`: the page opened in a real headless Chromium (Debian package, installed
by .ci/run); after plotly.js ran, both charts exist as SVG with one line per GPU plus the busiest
GPU, and the cost chart with its two lines. Skips locally without Chromium; fails in CI."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from gpuinfra.monitoring.html import COST_DIV, UTILIZATION_DIV, write_report
from gpuinfra.monitoring.status import GpuSeries, Node, build_status
from tests.blueprints.helpers import make_spec, need_tool

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    return need_tool("chromium")  # skips locally, fails in CI


def _status():
    spec = make_spec("p4d.24xlarge", nodes=2)
    points = tuple((NOW - timedelta(minutes=59 - i), float(i % 100)) for i in range(60))
    series = [GpuSeries(f"i-{n}", str(g), points) for n in (1, 2) for g in (0, 1)]
    nodes = [Node("i-1", "running", NOW - timedelta(hours=3)), Node("i-2", "running", NOW - timedelta(hours=2))]
    return build_status(spec, nodes, series, NOW, True)


def section(dom: str, div_id: str) -> str:
    start = dom.index(f'id="{div_id}"')
    following = [dom.find(f'id="{other}"', start + 1) for other in (UTILIZATION_DIV, COST_DIV)]
    ends = [i for i in following if i > start]
    return dom[start : min(ends)] if ends else dom[start:]


@pytest.mark.tools
def test_report_charts_render_in_headless_chromium(tmp_path):
    browser = chromium()
    page = tmp_path / "status.html"
    write_report(_status(), page)
    raw = page.read_text()
    assert raw.count('class="main-svg"') == 0  # the charts are drawn by plotly.js in the browser
    assert re.search(r"<script[^>]*\ssrc=", raw) is None  # self-contained: plotly.js is inlined
    result = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=15000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    dom = result.stdout
    assert result.returncode == 0 and "</html>" in dom, result.stderr[-2000:]
    util, cost = section(dom, UTILIZATION_DIV), section(dom, COST_DIV)
    assert 'class="main-svg"' in util and 'class="main-svg"' in cost
    # 4 GPUs + the busiest-GPU line; the cost chart: so far + projected
    assert len(re.findall(r'class="trace scatter', util)) == 5
    assert len(re.findall(r'class="trace scatter', cost)) == 2
    assert "GPU utilization, last hour (%)" in util and "Cost (USD)" in cost
