"""Tables fit the terminal: at 80 and 200 columns every command's table keeps the documented
columns (docs/cli-output.md, "Table widths"), no line is longer than the width, and no cell,
a price least of all, is cut with an ellipsis; ``--wide`` shows every column."""

from __future__ import annotations

import json
import os
import re

import pytest

ELLIPSIS = "\u2026"

OFFER_HEADERS = [
    "cloud",
    "region",
    "zone",
    "instance",
    "GPUs",
    "vCPU",
    "RAM GiB",
    "market",
    "$/h",
    "$/GPU-h",
    "other markets $/h",
    "EFA/NICs",
    "NVMe",
]


def _headers(stdout: str) -> list[str]:
    """The column headers of the first table in ``stdout``: the line above a SIMPLE_HEAD rule
    (``───``), or the ``┃``-separated line of a heavy-head box."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("┃"):
            return [cell.strip() for cell in line.strip().strip("┃").split("┃")]
        if line.strip().startswith("───") and i:
            return re.split(r"\s{2,}", lines[i - 1].strip())
    raise AssertionError(f"no table header in:\n{stdout}")


def _fits(stdout: str, width: int) -> None:
    too_long = [line for line in stdout.splitlines() if len(line) > width]
    assert not too_long, f"{len(too_long)} lines over {width} columns, e.g. {too_long[0]!r}"
    assert ELLIPSIS not in stdout


@pytest.fixture
def columns(monkeypatch):
    def _set(width: int) -> None:
        monkeypatch.setenv("COLUMNS", str(width))

    return _set


def test_offers_at_80_columns_keeps_full_prices_gpu_type_and_zone(run_cli, columns):
    columns(80)
    result = run_cli("offers", "--gpus", "8xH100", "--limit", "5")
    assert result.exit_code == 0, result.stderr
    _fits(result.stdout, 80)
    assert _headers(result.stdout) == ["cloud", "region", "zone", "instance", "GPUs", "$/h", "$/GPU-h"]
    assert "not shown at 80 columns: vCPU, RAM GiB, market, other markets $/h, EFA/NICs, NVMe" in " ".join(
        result.stdout.split()
    )
    # the JSON's prices, to the cent, are in the table: p5.48xlarge us-east-1 on-demand $55.04/h
    # (catalog; aws.amazon.com/ec2/pricing/on-demand)
    ranked = json.loads(run_cli("offers", "--gpus", "8xH100", "--limit", "5", "--json").stdout)
    for offer, row in zip(ranked, [line for line in result.stdout.splitlines() if offer_row(line)], strict=True):
        assert f"${float(offer['price_per_hour_usd']):,.2f}" in row.split()
        assert offer["zone"] in row.split() and offer["instance_type"] in row.split()


def offer_row(line: str) -> bool:
    return bool(re.match(r"\s+(aws|gcp)\s", line))


def test_offers_at_200_columns_shows_every_column(run_cli, columns):
    columns(200)
    result = run_cli("offers", "--gpus", "8xH100", "--limit", "5")
    assert result.exit_code == 0, result.stderr
    _fits(result.stdout, 200)
    assert _headers(result.stdout) == OFFER_HEADERS
    assert "not shown" not in result.stdout


def test_wide_shows_every_column_at_80(run_cli, columns):
    columns(80)
    result = run_cli("offers", "--gpus", "8xH100", "--limit", "5", "--wide")
    assert result.exit_code == 0, result.stderr
    assert _headers(result.stdout) == OFFER_HEADERS
    assert ELLIPSIS not in result.stdout and "not shown" not in result.stdout


def test_piped_output_without_columns_is_80_wide(run_cli, monkeypatch):
    monkeypatch.delenv("COLUMNS")

    def not_a_terminal(fd=None):
        raise OSError("not a terminal")

    monkeypatch.setattr(os, "get_terminal_size", not_a_terminal)
    result = run_cli("offers", "--gpus", "8xH100", "--limit", "5")
    assert result.exit_code == 0, result.stderr
    table = [line for line in result.stdout.splitlines() if "─" in line or line.startswith(("cloud", "aws", "gcp"))]
    _fits("\n".join(table), 80)
    assert _headers(result.stdout) == ["cloud", "region", "zone", "instance", "GPUs", "$/h", "$/GPU-h"]


def test_piped_text_lines_are_not_wrapped(run_cli, monkeypatch):
    """Piped output without $COLUMNS: a message longer than 80 columns stays one line (grep, logs)."""
    monkeypatch.delenv("COLUMNS")

    def not_a_terminal(fd=None):
        raise OSError("not a terminal")

    monkeypatch.setattr(os, "get_terminal_size", not_a_terminal)
    result = run_cli("size", "--params", "7B", "--gpus", "1xH100")
    long_lines = [line for line in result.stdout.splitlines() if len(line) > 80]
    assert any(line.startswith("7B params (7.00B params), full,") and "seq 2048" in line for line in long_lines), (
        result.stdout
    )


@pytest.mark.parametrize(
    ("width", "headers"),
    [
        (80, ["location", "instance", "spot $/h", "spot date", "od $/h"]),
        (200, ["location", "instance", "spot $/h", "range $/h", "spot date", "od $/h", "intr/mo"]),
    ],
)
def test_spot_table(run_cli, columns, width, headers):
    columns(width)
    result = run_cli("offers", "--gpus", "8xH100", "--spot", "--limit", "0")
    assert result.exit_code == 0, result.stderr
    _fits(result.stdout, width)
    assert _headers(result.stdout) == headers


@pytest.mark.parametrize(
    ("width", "headers"),
    [
        (80, ["resource / component", "$/h", "run $", "price source, date"]),
        (200, ["resource / component", "qty/h", "unit", "unit price", "$/h", "run $", "price source, date"]),
    ],
)
def test_cost_table_wraps_names_and_sources_instead_of_cutting_them(run_cli, columns, tmp_path, width, headers):
    assert run_cli("new", "--gpus", "4xA100", "--cloud", "gcp", "--project-dir", str(tmp_path)).exit_code == 0
    columns(width)
    result = run_cli("cost", "gcp-4xa100", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    table = result.stdout.split("\ntotal: ")[0]
    _fits(table, width)
    assert _headers(result.stdout) == headers
    # a2-highgpu-4g us-central1-a on-demand: $14.6935/h (Cyclenerd pricing.yml, catalog 2026-08-20)
    assert "$14.6935" in table
    # a source URL is folded over lines, never cut: its pieces joined give it back whole
    joined = "".join(table.split())
    assert "github.com/Cyclenerd/google-cloud-pricing-cost-calculator" in joined


@pytest.mark.parametrize(
    ("width", "headers"),
    [
        (80, ["stack", "cloud", "GPUs", "expires", "compute $/h"]),
        (200, ["stack", "cloud", "GPUs", "nodes", "age", "expires", "deployed", "compute $/h", "compute so far"]),
    ],
)
def test_ls(run_cli, columns, tmp_path, width, headers):
    assert run_cli("new", "--gpus", "4xA100", "--cloud", "gcp", "--project-dir", str(tmp_path)).exit_code == 0
    (tmp_path / "stacks" / "Pulumi.broken.yaml").write_bytes(b"\x00\xff binary")
    columns(width)
    result = run_cli("ls", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    _fits(result.stdout.split("\nINVALID ")[0], width)
    assert _headers(result.stdout) == headers
    assert any(line.split("│")[1:3] == [" broken     ", " INVALID "] for line in result.stdout.splitlines())
    assert "$14.69" in result.stdout  # a2-highgpu-4g on-demand, never cut


@pytest.mark.parametrize(
    ("width", "headers"),
    [
        (80, ["profile", "idle / TTL", "description"]),
        (
            200,
            [
                "profile",
                "placement",
                "fast network",
                "scratch",
                "spot",
                "idle / TTL",
                "root disk",
                "run h",
                "description",
            ],
        ),
    ],
)
def test_profiles(run_cli, columns, width, headers):
    columns(width)
    result = run_cli("profiles")
    assert result.exit_code == 0, result.stderr
    _fits(result.stdout, width)
    assert _headers(result.stdout) == headers


@pytest.mark.parametrize("width", [80, 200])
def test_size_catalog_and_image_ls_fit(run_cli, columns, tmp_path, width):
    columns(width)
    for args in (
        ("size", "--model", "llama-3.1-8b", "--method", "lora"),
        ("catalog", "show"),
        ("image", "ls", "--project-dir", str(tmp_path)),
    ):
        result = run_cli(*args)
        assert result.exit_code == 0, (args, result.stderr)
        _fits(result.stdout, width)


def test_status_tables_keep_whole_node_ids_at_80_columns(columns):
    """``gpuinfra status``'s tables wrap headers and GPU names, never an instance id."""
    from datetime import UTC, datetime, timedelta
    from decimal import Decimal

    from gpuinfra.cli.console import stdout_console
    from gpuinfra.monitoring.render import renderable
    from gpuinfra.monitoring.status import ClusterStatus, GpuStatus, Node

    columns(80)
    now = datetime(2026, 11, 27, 4, 0, tzinfo=UTC)
    ids = ["i-0123456789abcdef0", "i-0fedcba9876543210"]  # EC2 ids: i- and 17 hex digits
    status = ClusterStatus(
        stack="watch",
        cloud="aws",
        now=now,
        nodes=[Node(node_id, "running", now - timedelta(hours=1)) for node_id in ids],
        gpus=[
            GpuStatus(node_id, f"NVIDIA H100 80GB HBM3 #{g}", 100.0, 55.3, 79.8) for node_id in ids for g in range(8)
        ],
        timeline=[],
        price_per_node_hour_usd=Decimal("55.04"),
        cost_so_far_usd=Decimal("110.08"),
        projected_to_ttl_usd=None,
        expires_at=now + timedelta(hours=24),
        idle_threshold_percent=5,
        idle_since=None,
        idle_ends_at=None,
        monitoring=True,
    )
    console = stdout_console()
    with console.capture() as captured:
        console.print(renderable(status))
    text = captured.get()
    _fits(text, 80)
    rows = [line for line in text.splitlines() if line.startswith("│ i-")]
    assert len(rows) == 2 + 16 and {row.split()[1] for row in rows} == set(ids)
