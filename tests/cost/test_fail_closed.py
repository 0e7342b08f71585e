"""Money fails closed and is priced for the market and run asked for: the market of ``cost
--spot`` reaches attached Local SSD, ``--hours`` is bounded by the billing minimum and one year,
and an unpriced line leaves every total of ``new`` / ``preview`` null with "incomplete" in its
place."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest


def _new(run_cli, tmp_path, name, *args):
    result = run_cli("new", *args, "--project-dir", str(tmp_path), "--name", name)
    assert result.exit_code == 0, result.stderr
    return result


def _cost(run_cli, tmp_path, name, *args):
    result = run_cli("cost", name, "--json", "--project-dir", str(tmp_path), *args)
    return result, json.loads(result.stdout) if result.stdout.strip() else None


def test_cost_spot_prices_attached_local_ssd_at_the_spot_rate(run_cli, tmp_path):
    # a2-highgpu-4g attaches 4 x 375 GiB Local SSD (not bundled). Cyclenerd pricing.yml
    # @dac31281 (2026-08-20), compute.storage.local.cost.us-central1: month 0.08, month_spot 0.048
    _new(run_cli, tmp_path, "a2", "--gpus", "4xA100", "--cloud", "gcp", "--region", "us-central1")
    for flag, rate in (("--on-demand", "0.08"), ("--spot", "0.048")):
        _, doc = _cost(run_cli, tmp_path, "a2", flag)
        ssd = next(line for line in doc["lines"] if line["component"].startswith("Local SSD"))
        assert Decimal(ssd["unit_price_usd"]) == Decimal(rate), flag
        # 1,500 GiB for 730 h a month: 1500 x 0.048 / 730 = $0.098630/h at the spot rate
        assert Decimal(ssd["hourly_usd"]) == (Decimal(1500) * Decimal(rate) / 730).quantize(Decimal("0.000001"))


@pytest.mark.parametrize("hours", ["1e-9", "1e-300", "0.01", "0", "nan", "inf", "8761", "87600"])
def test_hours_out_of_bounds_are_refused_by_new_and_cost(run_cli, tmp_path, hours):
    _new(run_cli, tmp_path, "ok", "--gpus", "4xA100", "--cloud", "gcp", "--region", "us-central1")
    result = run_cli("cost", "ok", "--hours", hours, "--project-dir", str(tmp_path))
    assert result.exit_code == 2 and "--hours must be at least 1 minute" in result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    result = run_cli("new", "--gpus", "4xA100", "--hours", hours, "--project-dir", str(tmp_path), "--name", "no")
    assert result.exit_code == 2 and "--hours must be at least 1 minute" in result.stderr


def test_one_minute_is_the_shortest_run(run_cli, tmp_path):
    _new(run_cli, tmp_path, "ok", "--gpus", "4xA100", "--cloud", "gcp", "--region", "us-central1")
    result, doc = _cost(run_cli, tmp_path, "ok", "--hours", str(1 / 60), "--on-demand")
    assert result.exit_code == 0, result.stderr
    compute = next(line for line in doc["lines"] if line["component"].startswith("Instance usage"))
    # a2-highgpu-4g us-central1 on-demand $14.69354/h for one minute
    assert Decimal(compute["run_usd"]) == (Decimal("14.69354") / 60).quantize(Decimal("0.000001"))


def test_new_and_preview_with_an_unpriced_line_have_null_totals(run_cli, tmp_path, monkeypatch):
    # 8 x H100 training in eu-north-1: no dated price for NAT gateway data processed there
    # (prices.yaml nat_gateway_per_gb), and the cluster's nodes reach the internet through one
    result = run_cli(
        "new", "--gpus", "8xH100", "--cloud", "aws", "--region", "eu-north-1",
        "--project-dir", str(tmp_path), "--name", "p5w", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    cost = doc["cost"]
    assert cost["hourly_usd"] is None and cost["run_usd"] is None and cost["monthly_if_left_running_usd"] is None
    assert cost["lines_without_price"] == 1
    text = run_cli(
        "new", "--gpus", "8xH100", "--cloud", "aws", "--region", "eu-north-1",
        "--project-dir", str(tmp_path), "--name", "p5t",
    )  # fmt: skip
    assert text.exit_code == 0
    assert "all 42 resources: incomplete: 1 line without a price" in text.stdout
    monkeypatch.chdir(tmp_path)
    preview = run_cli("preview", "p5w", "--json")
    assert preview.exit_code == 0, preview.stderr
    pcost = json.loads(preview.stdout)["cost"]
    assert pcost["hourly_usd"] is None and pcost["run_usd"] is None and pcost["lines_without_price"] == 1
    shown = run_cli("preview", "p5w")
    assert shown.exit_code == 0 and "cost: incomplete: 1 line without a price" in shown.stdout


def test_gcp_nat_data_counts_each_nodes_container_pull_and_the_nodes_egress(run_cli, tmp_path):
    # llm-finetune usage: 100 GB fetched, 20 GB egress; 2 nodes each pull the 15 GB NGC layers;
    # GCP nodes have no external IP, so their egress passes Cloud NAT too: 100 + 2 x 15 + 20 = 150 GB
    _new(
        run_cli, tmp_path, "two", "--gpus", "4xA100", "--cloud", "gcp", "--region", "us-central1", "--nodes", "2",
        "--profile", "llm-finetune", "--hours", "10",
    )  # fmt: skip
    _, doc = _cost(run_cli, tmp_path, "two")
    nat = next(line for line in doc["lines"] if line["component"].startswith("Cloud NAT data processed"))
    assert "(100 GB fetched + 2 x 15 GB container pulls + 20 GB egress from the nodes)" in nat["component"]
    # Cloud NAT data processing $0.045/GB (cloud.google.com/nat/pricing): 150 x 0.045 = $6.75 a run
    assert Decimal(nat["run_usd"]) == Decimal("6.750000") and nat["note"].startswith("once per run")
    # left running 30 days: the transfer lines count once, the recurring lines 720 h
    lines = doc["lines"]
    once = sum(Decimal(x["run_usd"]) for x in lines if x["note"].startswith("once per run"))
    recurring = sum(Decimal(x["hourly_usd"]) for x in lines if not x["note"].startswith("once per run"))
    # (the lines' hourly amounts are rounded to 6 places: x 720 they may differ by under a cent)
    assert abs(Decimal(doc["monthly_if_left_running_usd"]) - (recurring * 720 + once)) < Decimal("0.01")
    assert once == Decimal("9.150000")  # egress 20 GB x $0.12 (us-central1) + the NAT $6.75
