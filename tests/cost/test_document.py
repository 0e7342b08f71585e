"""gpuinfra.services.cost_document: the service under `gpuinfra cost` and `gpuinfra cost diff`."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from gpuinfra.cost.report import diff_json
from gpuinfra.errors import BudgetExceededError, PriceMissingError, ProfileError, RequestError
from gpuinfra.newstack import NewStackRequest, create_stack
from gpuinfra.planner import PlanRequest
from gpuinfra.services.cost_document import (
    check_budget,
    check_diff_totals,
    check_hours,
    check_totals,
    cost_diff_document,
    preview_file_cost_document,
    pricing_market,
    profile_run_hours,
    stack_cost_document,
)

NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture
def p4d_project(tmp_path):
    """Stacks `one` (1 x p4d.24xlarge) and `two` (2 x) in us-east-1, profile llm-finetune (24 h)."""
    create_stack(NewStackRequest(PlanRequest(None, instance_type="p4d.24xlarge", name="one")), tmp_path, now=NOW)
    create_stack(
        NewStackRequest(PlanRequest(None, nodes=2, instance_type="p4d.24xlarge", name="two")), tmp_path, now=NOW
    )
    return tmp_path


def test_hours_and_budget_checks():
    assert check_hours(None) is None and check_hours(10.0) == Decimal("10.0") and check_hours(8760) == Decimal(8760)
    # one minute, the billing minimum of EC2 (60 s) and Compute Engine (1 min), is the shortest run
    assert check_hours(1 / 60) == Decimal(str(1 / 60))
    for bad in (0, -1, 8760.5, 87600, 1e-9, 1e-300, 0.016, float("nan"), float("inf"), 1e308):
        with pytest.raises(RequestError, match=r"--hours must be at least 1 minute .* at most 8760 \(one year\)"):
            check_hours(bad)
    assert check_budget(None) is None and check_budget(0) == Decimal(0) and check_budget(12.5) == Decimal("12.5")
    for bad in (float("nan"), float("inf"), -0.01):
        with pytest.raises(RequestError, match="--budget must be a number >= 0"):
            check_budget(bad)


def test_pricing_market():
    assert [pricing_market(False, False), pricing_market(True, False), pricing_market(False, True)] == [
        None,
        "spot",
        "on-demand",
    ]
    with pytest.raises(RequestError, match="--spot and --on-demand exclude each other"):
        pricing_market(True, True)


def test_profile_run_hours():
    assert profile_run_hours("llm-pretrain") == Decimal(168)
    assert profile_run_hours("dev") == Decimal(4)
    assert profile_run_hours(None) == Decimal(24)  # no profile tag: the fallback
    assert profile_run_hours("dev", Decimal(7)) == Decimal(7)  # given hours win
    with pytest.raises(ProfileError, match="unknown profile 'nope'"):
        profile_run_hours("nope")


def test_stack_cost_document_exact_totals(p4d_project):
    doc = stack_cost_document("one", p4d_project)
    assert (doc["schema_version"], doc["stack"], doc["pricing"], doc["hours"]) == ("3", "one", "on-demand", "24")
    # GPU monitoring adds $0.022107/h to the p4d: 42 custom metrics x $0.30 / 730 h, the dashboard
    # $3 / 730 h, one alarm metric $0.10 / 730 h, 60 PutMetricData an hour at $0.01 per 1,000;
    # the versioned bucket's noncurrent versions at most the 500 GB it holds: 500 x $0.023 / 730 h;
    # NAT data: 100 GB fetched + 15 GB container pull + the 20 GB egress of the node (no public IP)
    # = 135 GB x $0.045 = $6.075 a run. Left running 30 days counts transfer once (egress 20 x $0.09
    # + NAT $6.075 = $7.875), not 30 times
    assert (doc["hourly_usd"], doc["run_usd"], doc["monthly_if_left_running_usd"]) == (
        "22.411296",
        "537.871117",
        "15907.758486",
    )
    spot = stack_cost_document("one", p4d_project, hours=10, market="spot")
    # compute at p4d.24xlarge us-east-1 spot_max 9.1506 (tsaol/aws-gpu gpu_instances_raw.json
    # @2d0108c, 2025-11-30) + the same $0.913031/h of other lines
    assert (spot["pricing"], spot["hours"], spot["hourly_usd"], spot["run_usd"]) == (
        "spot",
        "10",
        "10.063631",
        "100.636316",
    )
    check_totals(doc, Decimal(538))  # every line priced, under budget: passes
    with pytest.raises(BudgetExceededError, match=r"^run total \$537.87 exceeds the budget \$537.00$"):
        check_totals(doc, Decimal(537))


def test_check_totals_fails_closed_before_the_budget():
    doc = {
        "price_not_found": ["x-fleet: Instance usage (capacity block)"],
        "run_usd": "1.000000",
        "not_priced": [{"resource": "x-extra", "resource_type": "aws:sagemaker/domain:Domain", "reason": "no model"}],
    }
    with pytest.raises(PriceMissingError) as info:
        check_totals(doc, Decimal(1000))
    assert info.value.missing == [
        "x-fleet: Instance usage (capacity block)",
        "x-extra (aws:sagemaker/domain:Domain: no model)",
    ]


def test_preview_file_document_takes_the_files_stack_and_hours():
    doc = preview_file_cost_document(FIXTURES / "pulumi_preview_p4d.json", hours=24)
    assert (doc["stack"], doc["hours"]) == ("p4d-team", "24")
    compute = next(line for line in doc["lines"] if line["component"].startswith("Instance usage"))
    assert (compute["quantity"], compute["unit_price_usd"]) == ("2.000000", "21.957640")
    assert preview_file_cost_document(FIXTURES / "pulumi_preview_p4d.json", stack="mine")["stack"] == "mine"


def test_cost_diff_document(p4d_project):
    doc = cost_diff_document("one", "two", p4d_project)
    assert {k: v for k, v in doc.items() if k != "rows"} == {
        "schema_version": "3",
        "before": "one",
        "after": "two",
        "before_hourly_usd": "22.411296",
        "after_hourly_usd": "44.433963",
        "before_run_usd": "537.871117",
        "after_run_usd": "1066.415110",
        "hourly_change_usd": "22.022667",
        "run_change_usd": "528.543993",
        "before_price_not_found": [],
        "after_price_not_found": [],
    }
    fleet = next(row for row in doc["rows"] if row["resource"] == "fleet")
    assert fleet == {
        "change": "~",
        "resource": "fleet",
        "component": "Instance usage (on-demand, p4d.24xlarge)",
        "before_hourly_usd": "21.957640",
        "after_hourly_usd": "43.915280",
    }


def _doc(stack, hourly, *lines):
    return {
        "stack": stack,
        "hourly_usd": hourly,
        "run_usd": str(Decimal(hourly) * 10),
        "lines": [{"resource": f"{stack}-{r}", "component": c, "hourly_usd": h} for r, c, h in lines],
        "price_not_found": [],
        "not_priced": [],
        "lines_without_price": 0,
    }


def test_diff_json_of_small_documents():
    before = _doc(
        "a", "3.000000", ("fleet", "Instance usage (on-demand, x)", "2.000000"), ("ip", "Public IPv4", "1.000000")
    )
    after = _doc(
        "b", "2.500000", ("fleet", "Instance usage (on-demand, x)", "2.000000"), ("nat", "NAT gateway", "0.500000")
    )
    doc = diff_json(before, after)
    assert (doc["hourly_change_usd"], doc["run_change_usd"]) == ("-0.500000", "-5.000000")
    assert doc["rows"] == [
        {
            "change": "-",
            "resource": "ip",
            "component": "Public IPv4",
            "before_hourly_usd": "1.000000",
            "after_hourly_usd": None,
        },
        {
            "change": "+",
            "resource": "nat",
            "component": "NAT gateway",
            "before_hourly_usd": None,
            "after_hourly_usd": "0.500000",
        },
    ]


def test_diff_json_with_an_incomplete_side_has_no_change():
    """One side's NAT line has no price: its total is null, and so is every change (no saving
    is computed against a partial sum), with the line named on its side."""
    before = _doc("a", "3.000000", ("fleet", "Instance usage (on-demand, x)", "2.000000"))
    after = _doc("b", "2.000000", ("fleet", "Instance usage (on-demand, x)", "2.000000"), ("nat", "NAT gateway", None))
    after.update(
        hourly_usd=None, run_usd=None, price_not_found=["b-nat: NAT gateway (no price)"], lines_without_price=1
    )
    doc = diff_json(before, after)
    assert (doc["hourly_change_usd"], doc["run_change_usd"], doc["after_hourly_usd"]) == (None, None, None)
    assert (doc["before_price_not_found"], doc["after_price_not_found"]) == ([], ["b-nat: NAT gateway (no price)"])
    with pytest.raises(PriceMissingError, match="no price for b: b-nat: NAT gateway"):
        check_diff_totals(doc)
