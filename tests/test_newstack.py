"""gpuinfra.newstack.create_stack, called directly (the service under `gpuinfra new`)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from gpuinfra.errors import RequestError, RuleViolationError, SpecError
from gpuinfra.newstack import NewStackRequest, create_stack
from gpuinfra.planner import PlanRequest
from gpuinfra.stackfile import read_stack_spec

NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


def test_gcp_4xa100_dev_stack_is_planned_verified_and_written(tmp_path):
    result = create_stack(
        NewStackRequest(PlanRequest("4xA100", cloud="gcp", region="us-central1"), profile="dev"), tmp_path, now=NOW
    )
    doc = result.to_json()
    assert (doc["stack"], doc["instance_type"], doc["zone"], doc["pricing"]) == (
        "gcp-4xa100",
        "a2-highgpu-4g",
        "us-central1-a",
        "on-demand",
    )
    # 14.69354 $/h (Cyclenerd pricing.yml 2026-08-20) x the dev profile's 4 h
    assert (doc["compute_price_per_hour_usd"], doc["run_hours"], doc["compute_run_cost_usd"]) == (
        "14.693540",
        4.0,
        "58.774160",
    )
    # 14 + the node bundle object + GPU monitoring (component, dashboard, alert policy, metricWriter binding)
    # + the nodes' bucket bindings: read, create (not the bundle), overwrite (not the bundle or checkpoint data)
    # + the all-or-nothing bulk insert of the nodes (blueprints/gcp/bulk_insert.py)
    # + the nodes' job-secret reader binding (conditioned on this stack's secrets)
    assert doc["resources"] == 23 and doc["expires_at"] == "2026-11-22T13:00:00+00:00"  # dev: 12 h TTL
    # + $0.00505/h of GPU monitoring (alert condition and agent series; tests/monitoring pins the parts)
    # + noncurrent checkpoint versions (dev allows spot: versioned), at most the 20 GB bucket once
    #   more: 20 x $0.020 / 730 = $0.000548/h
    # + Cloud NAT data: 20 GB fetched + 1 node x 15 GB container pull + the 5 GB egress (GCP nodes
    #   have no external IP, so it leaves through the NAT) = 40 GB x $0.045 / 4 h = $0.45/h
    # left running 30 days: transfer (egress 5 GB x $0.12, NAT $1.80) counted once, not 30 times
    # after down: the kept 20 GB at $0.020/GB-month (cloud.google.com/storage/pricing) and at most
    # as much in versions for 7 days + 7 days soft-deleted: 0.40 + 0.40 x 336 / 730
    kept = doc["cost"].pop("left_after_down")
    assert (kept["monthly_usd"], kept["lines_without_price"]) == ("0.584110", 0)
    assert doc["cost"] == {
        "hourly_usd": "15.326634",
        "run_usd": "61.306533",
        "hours": "4",
        "pricing": "on-demand",
        "catalog_date": "2026-08-20 (on-demand); 2026-07-30 (spot; N1-attached, A3 Ultra, A4 spot undated (imported 2026-11-22))",
        "price_not_found": [],
        "not_priced": [],
        "lines_without_price": 0,
        "monthly_if_left_running_usd": "10605.575908",
    }
    assert doc["sizing"] is None and doc["warnings"] == [] and doc["stack_file"] == str(result.written.stack_file)
    assert read_stack_spec(tmp_path, "gcp-4xa100").instance_type == "a2-highgpu-4g"


def test_model_is_sized_into_a_gpu_request_and_the_methods_profile(tmp_path):
    result = create_stack(
        NewStackRequest(PlanRequest(None, name="q"), model="llama-3.1-8b", method="qlora"), tmp_path, now=NOW
    )
    assert (result.sizing.gpus, result.sizing.nodes, result.sizing.profile) == ("1xL4", 1, "qlora-finetune")
    assert result.plan.spec.profile.name == "qlora-finetune" and result.plan.spec.gpu == "L4"
    assert result.to_json()["sizing"]["method"] == "qlora"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            NewStackRequest(PlanRequest("1xL4"), model="llama-3.1-8b"),
            "give either --model/--params (sized for you) or --gpus",
        ),
        (NewStackRequest(PlanRequest("1xL4"), method="lora"), "--method goes with --model or --params"),
        (
            NewStackRequest(
                PlanRequest(None, instance_type="p5.48xlarge"), capacity_reservation="cr-0123456789abcdef0"
            ),
            "--capacity-reservation needs --region",
        ),
    ],
)
def test_contradicting_options_write_nothing(tmp_path, request_, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        create_stack(request_, tmp_path, now=NOW)
    assert not (tmp_path / "stacks").exists()


def test_a_stack_over_its_budget_is_refused_before_it_is_written(tmp_path):
    with pytest.raises(RuleViolationError, match="^budget-max-price: the stack costs \\$15.33/h"):
        create_stack(
            NewStackRequest(
                PlanRequest("4xA100", cloud="gcp", region="us-central1", max_price_per_hour_usd=15.0), profile="dev"
            ),
            tmp_path,
            now=NOW,
        )
    assert not (tmp_path / "stacks").exists()


def test_diff_is_a_reserved_stack_name(tmp_path):
    with pytest.raises(SpecError, match="stack name 'diff' is reserved \\(`gpuinfra cost diff` is a sub-command\\)"):
        create_stack(NewStackRequest(PlanRequest("1xL4", name="diff")), tmp_path, now=NOW)


def test_a_spot_stack_sized_from_a_model_records_its_checkpoint_plan(tmp_path):
    """A spot stack carries the checkpoint plan of `size --spot` (AWS notice 120 s);
    an on-demand one does not."""
    import yaml

    spot = create_stack(
        NewStackRequest(PlanRequest(None, name="sp", spot=True), model="llama-3.1-8b", method="lora"), tmp_path, now=NOW
    )
    doc = yaml.safe_load(spot.written.stack_file.read_text())["config"]
    plan = doc["gpuinfra:checkpoint_plan"]
    assert plan == spot.sizing.to_json()["checkpoint_plan"] and plan["notice_seconds"] in (120, 30)
    assert plan["fits_notice"] is True and plan["interruptions_per_node_hour"] == 0.05
    on_demand = create_stack(
        NewStackRequest(PlanRequest(None, name="od"), model="llama-3.1-8b", method="full"), tmp_path, now=NOW
    )
    assert "gpuinfra:checkpoint_plan" not in yaml.safe_load(on_demand.written.stack_file.read_text())["config"]
