"""`offers --market commit-1y|commit-3y` and the commitment view of `cost`: committed rates from the
dated sources, obligation over the term, break-even hours, and "not priced" where no source has one."""

from __future__ import annotations

import json
from decimal import Decimal

# a3-highgpu-8g us-central1: pricing.yml @fd66b26 month_1y 44810.08066464 / 730 h; on-demand 88.49 (@dac31281)
A3_1Y = Decimal("61.38367")
A3_3Y = Decimal("38.86438")
A3_ON_DEMAND = Decimal("88.49")
# p5.48xlarge us-east-1, Vantage extract 2025-11-30: 3-yr standard no-upfront RI; on-demand 55.04
P5_3Y = Decimal("23.77728")


def _json(result):
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_offers_rank_by_the_committed_rate_with_source_and_date(run_cli):
    rows = _json(run_cli("offers", "--gpus", "8xH100", "--market", "commit-3y", "--cloud", "aws", "--json"))
    prices = [Decimal(r["price_per_hour_usd"]) for r in rows]
    assert prices == sorted(prices) and all(r["market"] == "commit-3y" for r in rows)
    first = rows[0]
    assert (first["instance_type"], first["region"]) == ("p5.48xlarge", "us-east-1")
    assert Decimal(first["price_per_hour_usd"]) == P5_3Y
    assert Decimal(first["on_demand_price_per_hour_usd"]) == Decimal("55.04")
    c = first["commitment"]
    assert c["source_date"] == "2025-11-30" and "tsaol/aws-gpu" in c["source"]
    assert c["commitment"].startswith("EC2 Standard Reserved Instance") and c["term_hours"] == 26280
    assert Decimal(c["obligation_usd"]) == P5_3Y * 26280
    plain = _json(run_cli("offers", "--gpus", "8xH100", "--json", "--limit", "1"))
    assert plain[0]["commitment"] is None


def test_offers_commit_1y_gcp_and_two_nodes_total(run_cli):
    rows = _json(
        run_cli("offers", "--gpus", "8xH100", "--nodes", "2", "--market", "commit-1y", "--cloud", "gcp", "--json")
    )
    first = rows[0]
    assert (first["instance_type"], first["region"]) == ("a3-highgpu-8g", "us-central1")
    assert Decimal(first["price_per_hour_usd"]) == 2 * A3_1Y
    assert first["commitment"]["source_date"] == "2026-07-30"
    assert Decimal(first["commitment"]["obligation_usd"]) == 2 * A3_1Y * 8760
    text = run_cli("offers", "--gpus", "8xH100", "--market", "commit-1y", "--cloud", "gcp")
    assert text.exit_code == 0 and "commitments of 2026-07-30" in text.stdout and "$61.38" in text.stdout


def test_offers_commitment_without_a_cited_rate_is_refused_not_zero(run_cli):
    result = run_cli("offers", "--gpus", "8xH100", "--market", "commit-1y", "--cloud", "aws", "--region", "us-east-1")
    assert result.exit_code == 4, result.stdout
    assert "no commit-1y price" in result.stderr and "Traceback" not in result.stderr


def test_offers_commitment_counts_only_types_sold_on_demand(run_cli):
    # a3-highgpu-1g has a CUD row in the source but is not sold on demand (spot / flex-start only)
    result = run_cli("offers", "--gpus", "1xH100", "--cloud", "gcp", "--market", "commit-1y", "--json")
    assert result.exit_code == 4
    assert "a3-highgpu-1g" in result.stderr and "not sold on demand" in result.stderr


def test_unknown_market_names_the_commitment_markets(run_cli):
    result = run_cli("offers", "--gpus", "8xH100", "--market", "reserved")
    assert result.exit_code == 2 and "commit-1y, commit-3y" in result.stderr


def _new(run_cli, tmp_path, *args):
    return _json(run_cli("new", *args, "--project-dir", str(tmp_path), "--json"))["stack"]


def test_cost_shows_the_run_under_each_commitment_obligation_and_break_even(run_cli, tmp_path):
    stack = _new(run_cli, tmp_path, "--gpus", "8xH100", "--cloud", "gcp", "--region", "us-central1", "--nodes", "2")
    doc = _json(run_cli("cost", stack, "--hours", "100", "--project-dir", str(tmp_path), "--json"))
    view = doc["commitments"]
    assert view["applies"] and view["nodes"] == 2 and Decimal(view["on_demand_per_node_hour_usd"]) == A3_ON_DEMAND
    one, three = view["terms"]
    assert (one["market"], three["market"]) == ("commit-1y", "commit-3y")
    assert Decimal(one["run_compute_usd"]) == A3_1Y * 2 * 100
    assert Decimal(one["on_demand_run_compute_usd"]) == A3_ON_DEMAND * 2 * 100
    assert Decimal(one["obligation_usd"]) == A3_1Y * 8760 * 2
    assert Decimal(three["obligation_per_node_usd"]) == A3_3Y * 26280
    # break-even: obligation / on-demand hourly; 61.38367 x 8760 / 88.49 = 6076.6 h a year;
    # 3 years: 38.86438 x 26280 / 88.49 = 11541.96 h, 3847.3 h a year
    assert one["break_even_hours"] == one["break_even_hours_per_year"] == "6076.6"
    assert three["break_even_hours"] == "11542.0" and three["break_even_hours_per_year"] == "3847.3"
    assert "what-is-savings-plans" in one["break_even_formula"]
    human = run_cli("cost", stack, "--project-dir", str(tmp_path))
    assert human.exit_code == 0
    assert "commit-1y: $61.3837/node-h" in human.stdout and "6,076.6 on-demand h/year" in human.stdout


def test_cost_commitment_without_a_rate_is_not_priced_and_spot_gets_no_view(run_cli, tmp_path):
    stack = _new(run_cli, tmp_path, "--instance-type", "p5.48xlarge", "--region", "us-east-1", "--name", "p5")
    doc = _json(run_cli("cost", stack, "--project-dir", str(tmp_path), "--json"))
    one, three = doc["commitments"]["terms"]
    assert not one["priced"] and one["run_compute_usd"] is None and one["obligation_usd"] is None
    assert three["priced"] and Decimal(three["per_node_hour_usd"]) == P5_3Y
    assert three["break_even_hours_per_year"] == str((P5_3Y * 8760 / Decimal("55.04")).quantize(Decimal("0.1")))
    human = run_cli("cost", stack, "--project-dir", str(tmp_path))
    assert "commit-1y: not priced" in human.stdout
    spot = _json(run_cli("cost", stack, "--spot", "--project-dir", str(tmp_path), "--json"))
    assert not spot["commitments"]["applies"] and spot["commitments"]["terms"] == []
    assert "--on-demand" in spot["commitments"]["reason"]


def test_cost_on_demand_view_of_a_spot_stack(run_cli, tmp_path):
    stack = _new(run_cli, tmp_path, "--gpus", "8xH100", "--cloud", "gcp", "--region", "us-central1", "--spot")
    doc = _json(run_cli("cost", stack, "--on-demand", "--project-dir", str(tmp_path), "--json"))
    assert doc["commitments"]["applies"] and Decimal(doc["commitments"]["terms"][0]["per_node_hour_usd"]) == A3_1Y


def test_catalog_show_names_the_commitment_sources_and_dates(run_cli):
    info = _json(run_cli("catalog", "show", "--json"))
    dates = sorted(s["date"] for s in info["commitment_sources"].values())
    assert dates == ["2025-11-30", "2026-07-30"]
    assert "commitments: EC2 Standard Reserved Instance" in run_cli("catalog", "show").stdout
