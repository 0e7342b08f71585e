"""`gpuinfra offers` through the real entry point."""

from __future__ import annotations

import csv
import json
from decimal import Decimal

import pytest

from tests.conftest import SNAPSHOT_DIR

REQUIRED_KEYS = {"cloud", "region", "zone", "instance_type", "gpu", "gpu_count", "nodes", "price_per_hour_usd",
                 "on_demand_price_per_hour_usd", "spot_price_per_hour_usd"}


def _snapshot_price(instance_type, gpu, count, zone, column="Price"):
    with open(SNAPSHOT_DIR / "gcp_vms.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    host = next(r for r in rows if r["InstanceType"] == instance_type and r["AvailabilityZone"] == zone)
    acc = next(r for r in rows if not r["InstanceType"] and r["AcceleratorName"] == gpu
               and r["AcceleratorCount"] == str(count) and r["AvailabilityZone"] == zone)
    return Decimal(host[column]) + Decimal(acc[column])


def test_json_gcp_a2_prices_equal_host_plus_gpu_rows(run_cli):
    result = run_cli("offers", "--gpus", "4xA100", "--json")
    assert result.exit_code == 0, result.stderr
    offers = json.loads(result.stdout)
    assert all(REQUIRED_KEYS <= set(o) for o in offers)
    a2 = [o for o in offers if o["instance_type"] == "a2-highgpu-4g"]
    assert len(a2) == 19
    for o in a2:
        expected = _snapshot_price("a2-highgpu-4g", "A100", 4, o["zone"])
        assert Decimal(str(o["price_per_hour_usd"])) == expected
        assert Decimal(str(o["host_price_per_hour_usd"])) + Decimal(str(o["accelerator_price_per_hour_usd"])) == expected
        assert o["nodes"] == 1 and o["pricing"] == "on-demand" and o["catalog_date"] == "2026-11-22"
    prices = [o["price_per_hour_usd"] for o in offers]
    assert prices == sorted(prices)


def test_json_totals_are_for_all_nodes(run_cli):
    one = json.loads(run_cli("offers", "--gpus", "8xH100", "--cloud", "aws", "--json").stdout)[0]
    two = json.loads(run_cli("offers", "--gpus", "8xH100", "--cloud", "aws", "--nodes", "2", "--json").stdout)[0]
    assert two["instance_type"] == one["instance_type"] == "p5.48xlarge"
    assert Decimal(str(two["price_per_hour_usd"])) == 2 * Decimal(str(one["price_per_hour_usd"]))
    assert two["nodes"] == 2 and two["efa_interfaces"] == 32


def test_json_spot_price_null_when_none(run_cli):
    offers = json.loads(run_cli("offers", "--instance-type", "p5.4xlarge", "--json").stdout)
    no_spot = [o for o in offers if o["spot_price_per_hour_usd"] is None]
    assert len(no_spot) == 17  # the snapshot has 17 p5.4xlarge rows without a spot price
    assert all(o["on_demand_price_per_hour_usd"] > 0 for o in no_spot)


def test_aws_table_puts_p4d_first_with_round_up_note(run_cli):
    result = run_cli("offers", "--gpus", "4xA100", "--cloud", "aws")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert "offers for 4xA100 (on-demand, prices from catalog 2026-11-22)" in lines[0]
    first_row = next(line for line in lines if "p4d.24xlarge" in line)
    assert "8xA100 *" in first_row and "4 EFA" in first_row and "8x931 GiB" in first_row
    assert "* round-up: p4d.24xlarge has 8xA100 per node; you asked for 4 (rounded up)" in result.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--gpus", "3xH100", "--cloud", "aws"], 4, "error: no offer on aws fits 3xH100 per node"),
        (["--gpus", "4xZ100"], 2, "error: unknown GPU 'Z100'. Did you mean V100?"),
        (["--gpus", "4xA100", "--nodes", "0"], 2, "error: --nodes must be a whole number from 1 to 4096, got 0"),
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
    assert all(o["pricing"] == "spot" and o["price_per_hour_usd"] == o["spot_price_per_hour_usd"] for o in offers)
