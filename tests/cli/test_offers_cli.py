"""`gpuinfra offers` through the real entry point."""

from __future__ import annotations

import csv
import json
from decimal import Decimal

import pytest

from tests.conftest import SNAPSHOT_DIR

REQUIRED_KEYS = {
    "cloud",
    "region",
    "zone",
    "instance_type",
    "gpu",
    "gpu_count",
    "nodes",
    "price_per_hour_usd",
    "on_demand_price_per_hour_usd",
    "spot_price_per_hour_usd",
}


def _cited_on_demand(machine_type, region):
    with open(SNAPSHOT_DIR / "gcp_on_demand.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["machine_type"] == machine_type and r["region"] == region)
    return Decimal(row["price_per_hour_usd"]).quantize(Decimal("0.00001"))


def test_gcp_4xa100_first_offer_is_the_real_on_demand_price(run_cli):
    result = run_cli("offers", "--gpus", "4xA100", "--cloud", "gcp", "--json", "--limit", "0")
    assert result.exit_code == 0, result.stderr
    offers = json.loads(result.stdout)
    assert all(set(o) >= REQUIRED_KEYS for o in offers)
    first = offers[0]
    assert (first["instance_type"], first["region"], first["price_per_hour_usd"]) == (
        "a2-highgpu-4g",
        "us-central1",
        "14.693540",
    )
    assert first["price_per_gpu_hour_usd"] == "3.673385"  # 14.69354 / 4 GPUs, USD as a 6-place decimal string
    assert first["market"] == "on-demand" and first["catalog_date"].startswith(
        "2026-08-20 (on-demand); 2026-07-30 (spot"
    )
    assert first["price_source"] == "on-demand:cyclenerd-2026-08-20;spot:cyclenerd-2026-07-30-spot"
    a2 = [o for o in offers if o["instance_type"] == "a2-highgpu-4g"]
    assert len(a2) == 19
    for o in a2:
        assert Decimal(o["price_per_hour_usd"]) == _cited_on_demand("a2-highgpu-4g", o["region"])
    # no A100 offer below the real on-demand price: the old snapshot's DWS-priced europe-west4 at $9.71 is gone
    prices = [Decimal(o["price_per_hour_usd"]) for o in offers]
    assert min(prices) == Decimal("14.69354")
    assert prices == sorted(prices)


def test_json_totals_are_for_all_nodes(run_cli):
    one = json.loads(run_cli("offers", "--gpus", "8xH100", "--cloud", "aws", "--json").stdout)[0]
    two = json.loads(run_cli("offers", "--gpus", "8xH100", "--cloud", "aws", "--nodes", "2", "--json").stdout)[0]
    assert two["instance_type"] == one["instance_type"] == "p5.48xlarge"
    assert Decimal(two["price_per_hour_usd"]) == 2 * Decimal(one["price_per_hour_usd"])
    assert two["nodes"] == 2 and two["efa_interfaces"] == 32


def test_json_spot_price_null_when_none(run_cli):
    offers = json.loads(run_cli("offers", "--instance-type", "p5.4xlarge", "--json").stdout)
    no_spot = [o for o in offers if o["spot_price_per_hour_usd"] is None]
    # the snapshot has 17 p5.4xlarge rows without a spot price; 3 (ap-south-1, eu-west-2) get
    # one from the dated regional range (data/snapshot/aws_spot_range.csv)
    assert len(no_spot) == 14
    assert all(Decimal(o["on_demand_price_per_hour_usd"]) > 0 for o in no_spot)


def test_aws_table_puts_p4d_first_with_round_up_note(run_cli):
    result = run_cli("offers", "--gpus", "4xA100", "--cloud", "aws")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert (
        "offers for 4xA100 (on-demand, prices from catalog undated (imported 2026-11-22); spot ranges 2025-11-30)"
        in result.stdout
    )
    first_row = next(line for line in lines if "p4d.24xlarge" in line)
    assert "8xA100 *" in first_row and "4 EFA" in first_row and "8x931 GiB" in first_row
    assert "* round-up: p4d.24xlarge has 8xA100 per node; you asked for 4 (rounded up)" in result.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--gpus", "3xH100", "--cloud", "aws"], 4, "error: no offer on aws fits 3xH100 per node"),
        (["--gpus", "4xZ100"], 2, "error: unknown GPU 'Z100'. Did you mean V100?"),
        (
            ["--gpus", "4xA100", "--nodes", "0"],
            2,
            "error: --nodes must be a whole number from 1 to 1,000 (aws: 1,000 instances",
        ),
        (["--gpus", "4xA100", "--region", "mars-1"], 2, "error: unknown region 'mars-1'."),
        (["--gpus", "4x"], 2, "error: malformed GPU spec '4x'"),
        (["--gpus", "x4"], 2, "error: malformed GPU spec 'x4'"),
        (["--gpus", "A100:-1"], 2, "error: GPU count in 'A100:-1' must be from 1 to 64 per node, got -1"),
        ([], 2, "error: give --gpus (e.g. 4xA100) or --instance-type"),
    ],
)
def test_bad_input_one_line_no_traceback(run_cli, args, code, message):
    result = run_cli("offers", *args)
    assert result.exit_code == code
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_instance_type_alone_implies_its_gpus(run_cli):
    offers = json.loads(run_cli("offers", "--instance-type", "a3-megagpu-8g", "--json").stdout)
    assert {(o["gpu"], o["gpu_count"], o["instance_type"]) for o in offers} == {("H100", 8, "a3-megagpu-8g")}
    assert all(o["gpu_nics"] == 8 for o in offers)


def test_limit_and_spot(run_cli):
    offers = json.loads(run_cli("offers", "--gpus", "8xH100", "--spot", "--limit", "3", "--json").stdout)
    assert len(offers) == 3
    assert all(o["market"] == "spot" and o["price_per_hour_usd"] == o["spot_price_per_hour_usd"] for o in offers)
    same = json.loads(run_cli("offers", "--gpus", "8xH100", "--market", "spot", "--limit", "3", "--json").stdout)
    assert same == offers


def test_market_column_and_other_markets(run_cli):
    result = run_cli("offers", "--gpus", "4xA100", "--cloud", "gcp", "--market", "flex", "--limit", "3")
    assert result.exit_code == 4  # no flex price: the on-demand table shows the other markets
    result = run_cli("offers", "--gpus", "4xA100", "--cloud", "gcp", "--limit", "3")
    row = next(line for line in result.stdout.splitlines() if "a2-highgpu-4g" in line)
    assert " on-demand " in row and "spot $" in row and "flex -" in row


def test_spot_table_dates_every_price_and_shows_ranges_in_100_columns(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    result = run_cli("offers", "--gpus", "8xH100", "--spot", "--limit", "0")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 100
    # p5.48xlarge us-east-1: Vantage extract of 2025-11-30 (tsaol/aws-gpu gpu_instances_raw.json
    # @2d0108c), spot_min 13.2182, spot_max 52.0766, pct_interrupt 5-10%; on-demand 55.04
    row = next(line for line in lines if "us-east-1/use1-az2" in line)
    assert row.split() == [
        "aws",
        "us-east-1/use1-az2",
        "p5.48xlarge",
        "$52.08",
        "13.22-52.08",
        "2025-11-30",
        "$55.04",
        "5-10%",
    ]
    # a3-highgpu-8g us-central1: pricing.yml @fd66b26 (2026-07-30) hour_spot 50.6095408219178
    row = next(line for line in lines if "us-central1-a" in line and "a3-highgpu-8g" in line)
    assert row.split() == ["gcp", "us-central1-a", "a3-highgpu-8g", "$50.61", "-", "2026-07-30", "$88.49", "-"]
    assert "no maximum price on GCP" in result.stdout


def test_spot_json_carries_date_range_and_band(run_cli):
    offers = json.loads(
        run_cli("offers", "--gpus", "8xH100", "--spot", "--region", "us-east-1", "--nodes", "2", "--json").stdout
    )
    p5 = next(o for o in offers if o["instance_type"] == "p5.48xlarge")
    assert (p5["spot_price_date"], p5["spot_interruption_band"]) == ("2025-11-30", "5-10%")
    # totals for the 2 nodes, like every price in the JSON
    assert (p5["spot_price_min_per_hour_usd"], p5["spot_price_max_per_hour_usd"]) == ("26.436400", "104.153200")
    assert p5["spot_price_per_hour_usd"] == "104.153200"


def test_flex_market_without_prices_exits_4_naming_why(run_cli):
    result = run_cli("offers", "--gpus", "8xH100", "--cloud", "gcp", "--market", "flex")
    assert result.exit_code == 4
    assert result.stderr.startswith("error: price-known: no flex-start price for 8xH100 on gcp")
    assert "catalog refresh --cloud gcp" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_types_not_sold_on_demand_are_not_offered_on_demand(run_cli):
    result = run_cli("offers", "--gpus", "8xH200", "--cloud", "gcp")
    assert result.exit_code == 4
    assert "provisioning-model-offered: a3-ultragpu-8g is not sold on demand" in result.stderr
    spot = json.loads(run_cli("offers", "--gpus", "8xH200", "--cloud", "gcp", "--market", "spot", "--json").stdout)
    assert {o["instance_type"] for o in spot} == {"a3-ultragpu-8g"}
    one = run_cli("offers", "--gpus", "1xH100", "--cloud", "gcp")
    assert one.exit_code == 4 and "a3-highgpu-1g, a3-highgpu-2g are not sold on demand" in one.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--market", "reserved"],
            "error: unknown --market 'reserved'; choose one of: on-demand, spot, flex, commit-1y, commit-3y",
        ),
        (["--market", "flex", "--spot"], "error: --spot contradicts --market flex: give one of them"),
    ],
)
def test_bad_market_is_exit_2(run_cli, args, message):
    result = run_cli("offers", "--gpus", "4xA100", *args)
    assert result.exit_code == 2 and result.stderr.strip() == message


def test_flex_market_on_both_clouds_names_the_missing_price_not_aws(run_cli):
    result = run_cli("offers", "--gpus", "8xH100", "--market", "flex")
    assert result.exit_code == 4
    assert result.stderr.startswith("error: price-known: no flex-start price for 8xH100")
    assert "p5.48xlarge" in result.stderr  # listed among the shapes, not blamed as "not sold"


def test_hours_without_data_is_refused(run_cli):
    result = run_cli("offers", "--gpus", "4xA100", "--hours", "24")
    assert result.exit_code == 2 and "--hours goes with --data" in result.stderr
