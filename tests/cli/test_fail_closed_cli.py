"""Money fails closed in every command that shows a total: with one line's price missing (a price
table entry taken away, or a stack moved by hand into a zone the catalog has no offer in), no
total is a number -- ``null`` in JSON, "incomplete: N lines without a price" in the text -- and
``cost diff`` exits 4 (README "Exit codes": a price the total needs is missing)."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
import yaml

from gpuinfra.cost import estimate

#: The per-GB-month price of the EBS gp3 root volume every AWS node has
#: (https://aws.amazon.com/ebs/pricing/: gp3 storage is billed per GB-month).
GP3 = ("aws", "ebs_gp3_per_gb_month")
TOTAL_KEYS = ("hourly_usd", "run_usd", "monthly_if_left_running_usd")


@pytest.fixture
def no_gp3_price(monkeypatch):
    """The price table without its gp3 storage price (every region): one line per AWS node loses its price."""
    real = estimate.price

    def price(cloud, key, region):
        return None if (cloud, key) == GP3 else real(cloud, key, region)

    monkeypatch.setattr(estimate, "price", price)


def _new(run_cli, project, *args):
    result = run_cli("new", *args, "--project-dir", str(project), "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _incomplete(text: str) -> int:
    """N of the one "incomplete: N line(s) without a price" the text must hold; no $ total next to it."""
    found = re.findall(r"incomplete: (\d+) lines? without a price", text)
    assert found, text
    return int(found[0])


def _move_zone(project, stack: str, zone: str) -> None:
    path = project / "stacks" / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["zone"] = zone
    path.write_text(yaml.safe_dump(doc))


def test_new_with_an_unpriced_line_has_null_totals_and_says_incomplete(run_cli, tmp_path, no_gp3_price):
    doc = _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "gap")
    cost = doc["cost"]
    assert [k for k in TOTAL_KEYS if cost[k] is not None] == []
    assert cost["lines_without_price"] == len(cost["price_not_found"]) >= 1
    assert any("EBS gp3" in line for line in cost["price_not_found"])
    text = run_cli("new", "--instance-type", "p4d.24xlarge", "--name", "gap2", "--project-dir", str(tmp_path))
    assert text.exit_code == 0, text.stderr
    line = next(x for x in text.stdout.splitlines() if "resources:" in x)
    assert _incomplete(line) >= 1 and "for a" not in line  # no run total printed
    assert "30 days left running would cost incomplete:" in text.stdout


def test_preview_with_an_unpriced_line_has_null_totals_and_says_incomplete(run_cli, tmp_path, no_gp3_price):
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "gap")
    doc = json.loads(run_cli("preview", "gap", "--project-dir", str(tmp_path), "--json").stdout)
    assert [k for k in TOTAL_KEYS if doc["cost"][k] is not None] == []
    text = run_cli("preview", "gap", "--project-dir", str(tmp_path))
    assert text.exit_code == 0, text.stderr
    cost_line = next(x for x in text.stdout.splitlines() if x.startswith("cost: "))
    assert _incomplete(cost_line) == doc["cost"]["lines_without_price"] and "$" not in cost_line
    assert "EBS gp3" in text.stdout  # the warning names the line


def test_preview_of_a_fully_priced_stack_still_shows_the_total(run_cli, tmp_path):
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "ok")
    doc = json.loads(run_cli("preview", "ok", "--project-dir", str(tmp_path), "--json").stdout)
    assert doc["cost"]["lines_without_price"] == 0 and Decimal(doc["cost"]["hourly_usd"]) > Decimal("21.95764")
    assert "incomplete" not in run_cli("preview", "ok", "--project-dir", str(tmp_path)).stdout


def test_cost_with_an_unpriced_line_has_null_totals_and_exits_4(run_cli, tmp_path, no_gp3_price):
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "gap")
    result = run_cli("cost", "gap", "--project-dir", str(tmp_path), "--json")
    assert result.exit_code == 4
    doc = json.loads(result.stdout)
    assert [k for k in TOTAL_KEYS if doc[k] is not None] == []
    gp3 = [line for line in doc["lines"] if line["component"].startswith("EBS gp3")]
    assert gp3 and all(line["hourly_usd"] is None for line in gp3)
    assert doc["lines_without_price"] == len(doc["price_not_found"]) == len(gp3)
    text = run_cli("cost", "gap", "--project-dir", str(tmp_path))
    assert text.exit_code == 4
    total = next(x for x in text.stdout.splitlines() if x.startswith("total: "))
    assert _incomplete(total) == len(gp3) and "$" not in total
    assert "left running for 30 days this costs" not in text.stdout


def test_cost_diff_with_an_incomplete_side_exits_4_with_null_changes(run_cli, tmp_path):
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "ok")
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "moved")
    _move_zone(tmp_path, "moved", "use1-az9")  # no p4d offer there: the compute line has no price
    for before, after in (("ok", "moved"), ("moved", "ok")):
        result = run_cli("cost", "diff", before, after, "--project-dir", str(tmp_path), "--json")
        assert result.exit_code == 4, result.stderr
        assert "price-known: no price for moved: moved-fleet: Instance usage" in result.stderr
        doc = json.loads(result.stdout)
        assert (doc["hourly_change_usd"], doc["run_change_usd"]) == (None, None)
        side = "after" if after == "moved" else "before"
        assert (doc[f"{side}_hourly_usd"], doc[f"{side}_run_usd"]) == (None, None)
        assert len(doc[f"{side}_price_not_found"]) == 1
        text = run_cli("cost", "diff", before, after, "--project-dir", str(tmp_path))
        assert text.exit_code == 4
        change = next(x for x in text.stdout.splitlines() if x.startswith("change: "))
        assert change.count("incomplete: 1 line without a price") == 3  # $/h change, one side, run change
        assert "-$" not in change and "+$" not in change


def test_cost_diff_with_an_injected_missing_price_on_both_sides_exits_4(run_cli, tmp_path, no_gp3_price):
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "a")
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "b")
    result = run_cli("cost", "diff", "a", "b", "--project-dir", str(tmp_path), "--json")
    assert result.exit_code == 4
    doc = json.loads(result.stdout)
    assert [k for k in doc if k.endswith("_usd") and doc[k] is not None] == []
    assert "incomplete:" in run_cli("cost", "diff", "a", "b", "--project-dir", str(tmp_path)).stdout


def test_cost_diff_of_two_complete_stacks_still_exits_0(run_cli, tmp_path):
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "a")
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "b")
    result = run_cli("cost", "diff", "a", "b", "--project-dir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["before_price_not_found"] == doc["after_price_not_found"] == []
    # one more p4d.24xlarge node: at least its on-demand price, $21.95764/h in us-east-1
    # (https://aws.amazon.com/ec2/pricing/on-demand/, as the catalog has it)
    assert Decimal(doc["hourly_change_usd"]) > Decimal("21.95764")


def test_ls_prices_from_the_catalog_not_the_stack_file_and_fails_closed(run_cli, tmp_path, monkeypatch):
    from gpuinfra.cli import lifecycle as cli_lifecycle
    from gpuinfra.errors import MissingDependencyError

    def no_backend():
        raise MissingDependencyError("no Pulumi here")

    monkeypatch.setattr(cli_lifecycle, "_backend", no_backend)
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "edited")
    _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "moved")
    path = tmp_path / "stacks" / "Pulumi.edited.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["price"]["on_demand_price_per_hour_usd"] = "0.01"  # hand-edited
    path.write_text(yaml.safe_dump(doc))
    _move_zone(tmp_path, "moved", "use1-az9")
    rows = {r["stack"]: r for r in json.loads(run_cli("ls", "--project-dir", str(tmp_path), "--json").stdout)}
    # 2 x p4d.24xlarge on-demand in us-east-1, $21.95764/h each: what `cost` prices the nodes at
    cost = json.loads(run_cli("cost", "edited", "--project-dir", str(tmp_path), "--json").stdout)
    compute = next(line for line in cost["lines"] if line["component"].startswith("Instance usage"))
    assert rows["edited"]["compute_price_per_hour_usd"] == compute["hourly_usd"] == "43.915280"
    assert rows["moved"]["compute_price_per_hour_usd"] is None and rows["moved"]["compute_cost_so_far_usd"] is None
    text = run_cli("ls", "--project-dir", str(tmp_path)).stdout
    assert "$0.01" not in text and "$43.92" in text
    moved = next(x for x in text.splitlines() if x.strip().startswith("moved") or "│ moved" in x)
    assert "incomplete" in moved
