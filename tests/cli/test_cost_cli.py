"""`gpuinfra cost`: priced lines of the offline plan, totals, budget gate, diff, --from-preview."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import yaml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _new(run_cli, tmp_path, *args):
    result = run_cli("new", *args, "--project-dir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["stack"]


def _cost(run_cli, tmp_path, *args):
    result = run_cli("cost", *args, "--project-dir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _component(doc, prefix):
    lines = [line for line in doc["lines"] if line["component"].startswith(prefix)]
    assert len(lines) == 1, [line["component"] for line in doc["lines"]]
    return lines[0]


def test_gcp_4xa100_compute_is_the_cited_on_demand_price(run_cli, tmp_path):
    stack = _new(run_cli, tmp_path, "--gpus", "4xA100", "--cloud", "gcp", "--region", "us-central1", "--profile", "dev")
    doc = _cost(run_cli, tmp_path, stack)
    machine = _component(doc, "Instance usage (on-demand, a2-highgpu-4g")
    # 4 x 3.673385: Cyclenerd pricing.yml generated 2026-08-20, compute.instance.a2-highgpu-4g.cost.us-central1.hour
    assert Decimal(machine["unit_price_usd"]) == Decimal("14.69354") and machine["quantity"] == "1.000000"
    assert "a2-highgpu-4g: 4x A100, 48 vCPU, 340 GiB" in machine["component"]
    assert machine["price_date"].startswith("2026-08-20 (on-demand); 2026-07-30 (spot")


def test_two_node_p4d_doubles_compute(run_cli, tmp_path):
    one = _cost(run_cli, tmp_path, _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "one"))
    two = _cost(
        run_cli, tmp_path, _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "two")
    )
    a, b = _component(one, "Instance usage"), _component(two, "Instance usage")
    assert a["unit_price_usd"] == b["unit_price_usd"] == "21.957640"
    assert Decimal(b["hourly_usd"]) == 2 * Decimal(a["hourly_usd"])


def test_gp3_root_disk_price_per_hour(run_cli, tmp_path):
    stack = _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "disk")
    path = tmp_path / "stacks" / "Pulumi.disk.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["profile"]["root_disk_gib"] = 100  # explicit config wins
    path.write_text(yaml.safe_dump(doc))
    line = _component(_cost(run_cli, tmp_path, stack), "EBS gp3 root volume")
    assert Decimal(line["hourly_usd"]) == (Decimal(100) * Decimal("0.08") / 730).quantize(Decimal("0.000001"))
    assert "jcode-desktop" in line["price_source"] and line["price_date"] == "2026-09-01"  # the Price List term date


def test_json_totals_are_the_sum_of_lines_and_schema(run_cli, tmp_path):
    doc = _cost(run_cli, tmp_path, _new(run_cli, tmp_path, "--gpus", "8xH100", "--nodes", "2", "--cloud", "aws"))
    assert (
        doc["schema_version"] == "3"
        and doc["currency"] == "USD"
        and doc["catalog_date"] == "undated (imported 2026-11-22); spot ranges 2025-11-30"
    )
    for key in ("hourly_usd", "run_usd", "hours", "lines"):
        assert key in doc
    priced = [line for line in doc["lines"] if line["hourly_usd"] is not None]
    assert Decimal(doc["hourly_usd"]) == sum(Decimal(line["hourly_usd"]) for line in priced)
    assert Decimal(doc["run_usd"]) == sum(Decimal(line["run_usd"]) for line in priced)
    assert abs(Decimal(doc["run_usd"]) - Decimal(doc["hourly_usd"]) * Decimal(doc["hours"])) < Decimal("0.001")
    assert all(
        {"resource", "component", "unit", "quantity", "unit_price_usd", "hourly_usd"} <= set(line)
        for line in doc["lines"]
    )
    assert all(isinstance(line["hourly_usd"], (str, type(None))) for line in doc["lines"])  # money as decimal strings
    inter_zone = _component(doc, "Inter-zone data transfer")
    assert inter_zone["quantity"] == "0.000000" and "one zone" in inter_zone["note"]


def test_budget_gate_exits_3(run_cli, tmp_path):
    stack = _new(run_cli, tmp_path, "--gpus", "1xL4", "--profile", "dev")
    result = run_cli("cost", stack, "--budget", "1", "--project-dir", str(tmp_path))
    assert result.exit_code == 3 and result.stderr.startswith("error: run total $")
    assert run_cli("cost", stack, "--budget", "100000", "--project-dir", str(tmp_path)).exit_code == 0


def test_hours_spot_and_usage_override(run_cli, tmp_path):
    stack = _new(run_cli, tmp_path, "--gpus", "8xH100", "--cloud", "gcp", "--name", "h")
    base = _cost(run_cli, tmp_path, stack, "--hours", "10")
    assert base["hours"] == "10" and abs(Decimal(base["run_usd"]) - Decimal(base["hourly_usd"]) * 10) < Decimal(
        "0.0001"
    )
    spot = _cost(run_cli, tmp_path, stack, "--spot")
    assert spot["pricing"] == "spot" and Decimal(spot["hourly_usd"]) < Decimal(base["hourly_usd"])
    assert Decimal(spot["spot_savings_percent"]) > 0
    usage = tmp_path / "usage.yaml"
    usage.write_text("bucket_storage_gb: 0\ninternet_egress_gb: 0\nnat_processed_gb: 0\n")
    zero = _cost(run_cli, tmp_path, stack, "--usage", str(usage))
    used = [line for line in zero["lines"] if line["usage_based"]]
    nat = [line for line in used if line["component"].startswith("Cloud NAT data processed")]
    assert all(line["hourly_usd"] in ("0.000000", None) for line in used if line not in nat)
    # with no usage the NAT still carries each node's 15 GB container pull from nvcr.io
    assert [line["component"] for line in nat] == [
        "Cloud NAT data processed (0 GB fetched + 1 x 15 GB container pulls + 0 GB egress from the nodes)"
    ]
    assert Decimal(nat[0]["hourly_usd"]) == (Decimal(15) * Decimal("0.045") / 24).quantize(Decimal("0.000001"))
    usage.write_text("gpu_hours: 3\n")
    bad = run_cli("cost", stack, "--usage", str(usage), "--project-dir", str(tmp_path))
    assert bad.exit_code == 2 and "unknown usage key 'gpu_hours'" in bad.stderr


def test_price_not_found_is_counted_not_zero(run_cli, tmp_path):
    stack = _new(run_cli, tmp_path, "--instance-type", "p5.48xlarge", "--nodes", "2", "--name", "cb")
    path = tmp_path / "stacks" / "Pulumi.cb.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"].update(
        capacity_reservation_id="cr-0123456789abcdef0", capacity_block=True, capacity_reservation_instance_count=2
    )
    path.write_text(yaml.safe_dump(doc))
    priced = run_cli("cost", stack, "--project-dir", str(tmp_path), "--json")
    assert priced.exit_code == 4  # the JSON document is still printed, with the unpriced line
    cost = json.loads(priced.stdout)
    compute = _component(cost, "Instance usage")
    assert compute["unit_price_usd"] is None and compute["hourly_usd"] is None
    assert len(cost["price_not_found"]) == 1 and "Capacity Block" in cost["price_not_found"][0]
    result = run_cli("cost", stack, "--project-dir", str(tmp_path))
    assert "1 line(s) with no price (so no total)" in result.stdout and "not found" in result.stdout
    assert "total: incomplete: 1 line without a price" in result.stdout
    # money fails closed: no total passes for one, and no budget passes it
    assert result.exit_code == 4
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: price-known: no price for cb-fleet")
    budget = run_cli("cost", stack, "--budget", "100000", "--project-dir", str(tmp_path))
    assert budget.exit_code == 4 and "Capacity Block prices are set per reservation" in budget.stderr


def test_stack_moved_to_a_zone_without_a_price_fails_closed(run_cli, tmp_path):
    stack = _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "moved")
    path = tmp_path / "stacks" / "Pulumi.moved.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["zone"] = "use1-az9"  # no p4d offer in the catalog there
    path.write_text(yaml.safe_dump(doc))
    for extra in ([], ["--budget", "100000"], ["--json"]):
        result = run_cli("cost", stack, *extra, "--project-dir", str(tmp_path))
        assert result.exit_code == 4, (extra, result.stderr)
        assert "price-known: no price for moved-fleet: Instance usage (on-demand, p4d.24xlarge)" in result.stderr
    nan = run_cli("cost", stack, "--budget", "nan", "--project-dir", str(tmp_path))
    assert nan.exit_code == 2 and "--budget must be a number" in nan.stderr


def test_cost_diff(run_cli, tmp_path):
    a = _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "a")
    b = _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--nodes", "3", "--name", "b")
    doc = json.loads(run_cli("cost", "diff", a, b, "--project-dir", str(tmp_path), "--json").stdout)
    changed = {(r["change"], r["component"].split(" (")[0]) for r in doc["rows"]}
    assert ("~", "Instance usage") in changed and ("~", "EBS gp3 root volume") in changed
    assert doc["schema_version"] == "3" and (doc["before"], doc["after"]) == ("a", "b")
    assert Decimal(doc["hourly_change_usd"]) > 2 * Decimal("21.95764")
    assert Decimal(doc["hourly_change_usd"]) == Decimal(doc["after_hourly_usd"]) - Decimal(doc["before_hourly_usd"])
    assert Decimal(doc["run_change_usd"]) == Decimal(doc["after_run_usd"]) - Decimal(doc["before_run_usd"])
    text = run_cli("cost", "diff", a, b, "--project-dir", str(tmp_path)).stdout
    assert "cost diff a -> b" in text and " ~ fleet: Instance usage (on-demand, p4d.24xlarge)" in text


def test_from_preview_prices_a_pulumi_preview_document(run_cli, tmp_path):
    result = run_cli(
        "cost",
        "p4d-team",
        "--from-preview",
        str(FIXTURES / "pulumi_preview_p4d.json"),
        "--hours",
        "24",
        "--project-dir",
        str(tmp_path),
        "--json",
    )
    # the SageMaker domain has no cost model: the lines are printed, but no total passes (exit 4)
    assert result.exit_code == 4 and "p4d-team-extra (aws:sagemaker/domain:Domain" in result.stderr
    doc = json.loads(result.stdout)
    assert doc["stack"] == "p4d-team" and doc["hours"] == "24"
    compute = _component(doc, "Instance usage")
    assert compute["quantity"] == "2.000000" and compute["unit_price_usd"] == "21.957640"  # use1-az4 on-demand
    disk = _component(doc, "EBS gp3 root volume")
    assert Decimal(disk["hourly_usd"]) == (Decimal(100) * 2 * Decimal("0.08") / 730).quantize(Decimal("0.000001"))
    assert _component(doc, "NAT gateway")["unit_price_usd"] == "0.045000"
    assert doc["not_priced"] == [
        {
            "resource": "p4d-team-extra",
            "resource_type": "aws:sagemaker/domain:Domain",
            "reason": "no cost model for this resource type",
        }
    ]
    assert "p4d-team-old-eip" not in json.dumps(doc)  # deleted resources are not priced


def test_bad_preview_file(run_cli, tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    result = run_cli("cost", "x", "--from-preview", str(bad), "--project-dir", str(tmp_path))
    assert result.exit_code == 2 and "has no 'steps' list" in result.stderr


def test_cost_diff_matches_roles_of_hyphenated_stack_names(run_cli, tmp_path):
    a = _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--name", "run-a")
    b = _new(run_cli, tmp_path, "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "my-run-b")
    doc = json.loads(run_cli("cost", "diff", a, b, "--project-dir", str(tmp_path), "--json").stdout)
    assert {r["change"] for r in doc["rows"]} == {"~"}  # same roles on both sides: nothing added or removed
    assert {r["resource"] for r in doc["rows"]} >= {"fleet", "lt"}


def test_gcp_stack_moved_to_a_zone_without_an_on_demand_price_fails_closed(run_cli, tmp_path):
    stack = _new(run_cli, tmp_path, "--instance-type", "a3-megagpu-8g", "--name", "mega")
    path = tmp_path / "stacks" / "Pulumi.mega.yaml"
    doc = yaml.safe_load(path.read_text())
    # pricing.yml gives a3-megagpu-8g no us-central1 price (on-demand of 2026-08-20, spot of
    # 2026-07-30): the catalog has no offer there
    doc["config"]["gpuinfra:cluster"].update(zone="us-central1-a", region="us-central1")
    doc["config"]["gcp:zone"], doc["config"]["gcp:region"] = "us-central1-a", "us-central1"
    path.write_text(yaml.safe_dump(doc))
    for extra in ([], ["--budget", "100000"]):
        result = run_cli("cost", stack, *extra, "--project-dir", str(tmp_path))
        assert result.exit_code == 4, (extra, result.stderr)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "no catalog offer for a3-megagpu-8g in us-central1-a" in errors[0]
        # the one other line names where the same type has a complete total (`cost` looks at the stack's type only)
        (other,) = [line for line in result.stderr.splitlines() if not line.startswith("error:")]
        assert other.startswith("note: complete total in ") and "(a3-megagpu-8g on-demand in " in other


def test_cost_help_shows_the_stack_options_and_the_diff_sub_command(run_cli):
    top = run_cli("cost", "--help")
    assert top.exit_code == 0
    assert "Usage: gpuinfra cost [OPTIONS] {STACK} | COMMAND [ARGS]..." in top.stdout
    assert "--from-preview" in top.stdout and "--budget" in top.stdout and "diff" in top.stdout
    sub = run_cli("cost", "diff", "--help")
    assert sub.exit_code == 0 and "Usage: gpuinfra cost diff [OPTIONS] {STACK_A} {STACK_B}" in sub.stdout
    assert "--budget" not in sub.stdout
    stack = run_cli("cost", "somestack", "--help")
    assert stack.exit_code == 0 and "Usage: gpuinfra cost [OPTIONS] {STACK}" in stack.stdout


def test_cost_options_may_come_before_the_stack_and_a_stack_may_be_called_stack(run_cli, tmp_path):
    _new(run_cli, tmp_path, "--gpus", "1xL4", "--profile", "dev", "--name", "stack")
    result = run_cli("cost", "--json", "--project-dir", str(tmp_path), "stack")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["stack"] == "stack"


def test_cost_diff_needs_two_stacks_and_diff_is_no_stack_name(run_cli, tmp_path):
    result = run_cli("cost", "diff", "a", "--project-dir", str(tmp_path))
    assert result.exit_code == 2 and "Missing argument 'STACK_B'" in result.stderr
    refused = run_cli("new", "--gpus", "1xL4", "--name", "diff", "--project-dir", str(tmp_path))
    assert refused.exit_code == 2
    assert refused.stderr == (
        "error: stack name 'diff' is reserved (`gpuinfra cost diff` is a sub-command); choose another --name\n"
    )


def test_cost_spot_gcp_expected_cost_with_rework_and_assumed_rate(run_cli, tmp_path):
    args = ("--gpus", "8xH100", "--cloud", "gcp", "--zone", "us-central1-a", "--spot", "--hours", "10")
    assert run_cli("new", *args, "--name", "g8", "--project-dir", str(tmp_path)).exit_code == 0
    spot = _cost(run_cli, tmp_path, "g8")["spot"]
    # pricing.yml @fd66b26 (generated 2026-07-30) a3-highgpu-8g us-central1 hour_spot 50.6095408219178
    assert (spot["spot_price_per_node_hour_usd"], spot["spot_price_date"]) == ("50.609540", "2026-07-30")
    assert (
        spot["interruption_rate_assumed"]
        and "GCP publishes no Spot VM interruption rate" in spot["interruption_rate_source"]
    )
    assert spot["checkpoint_interval_assumed"] and "no maximum price" in spot["max_price"]
    # 0.05 interruptions/node-h x 1 node x 10 h = 0.5; each redoes half a 60 min interval: 0.25 h
    assert (spot["expected_interruptions"], spot["expected_redone_hours"]) == ("0.5000", "0.2500")
    assert Decimal(spot["expected_compute_run_usd_with_rework"]) == (Decimal("50.60954") * Decimal("10.25")).quantize(
        Decimal("0.000001")
    )
    # on-demand: pricing.yml @dac31281 (2026-08-20) a3-highgpu-8g us-central1 hour 88.49
    assert Decimal(spot["on_demand_compute_run_usd"]) == Decimal("884.9")
    text = run_cli("cost", "g8", "--project-dir", str(tmp_path)).stdout
    assert "spot $50.61/node-h, dated 2026-07-30; max price: none: GCP Spot VMs take no maximum price" in text
    # "spot saves" from the dated price: (88.49 - 50.60954) / 88.49 = 42.8%
    assert "spot saves 42.8% on compute" in text


def test_cost_spot_aws_uses_the_advisor_band_and_flags_no_discount(run_cli, tmp_path):
    args = ("--gpus", "8xH100", "--cloud", "aws", "--region", "us-east-1", "--spot", "--hours", "100")
    assert run_cli("new", *args, "--name", "p5", "--project-dir", str(tmp_path)).exit_code == 0
    spot = _cost(run_cli, tmp_path, "p5")["spot"]
    # tsaol/aws-gpu gpu_instances_raw.json @2d0108c (2025-11-30): p5.48xlarge us-east-1
    # spot_max 52.0766, spot_min 13.2182, pct_interrupt "5-10%" -> 0.10 / 730 per node-hour
    assert spot["spot_price_per_node_hour_usd"] == "52.076600"
    assert (spot["spot_price_min_per_node_hour_usd"], spot["spot_price_date"]) == ("13.218200", "2025-11-30")
    assert Decimal(spot["interruptions_per_node_hour"]) == (Decimal("0.10") / 730).quantize(Decimal("0.0000001"))
    assert not spot["interruption_rate_assumed"]
    assert spot["spot_not_discounted"] is False
