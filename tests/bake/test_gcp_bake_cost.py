"""A GCP bake is fully priced from cited unit prices; a region without one still fails closed.

External facts (prices.yaml cites each):
* n1-standard-8 in us-central1: $0.38 per hour (Billing Catalog via SkyPilot catalog v8);
* Cloud Build e2-standard-2: $0.006 per build-minute (cloud.google.com/build/pricing);
* custom image storage, SKU "Storage Image", us-central1: $0.05 per GiB-month (infracost's
  compute_image golden file, Billing Catalog);
* Artifact Registry storage: $0.10 per GB-month above the free 0.5 GB, the same in every
  location (cloud.google.com/artifact-registry/pricing; infracost's golden file).
Quantities (gpuinfra/bake/cost.py): 1.0 Packer VM-hour, 75 build-minutes, 100 GiB of image,
15 GB of container.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from gpuinfra.bake.cost import bake_cost, bake_cost_lines
from tests.bake.conftest import GCP_BASE, NGC


def test_a3_mega_bake_in_us_central1_every_line_priced(a3mega_bake):
    lines = [
        (ln.component, ln.when, ln.unit, ln.quantity, ln.unit_price_usd, ln.usd) for ln in bake_cost_lines(a3mega_bake)
    ]
    assert lines == [
        ("Packer build VM (n1-standard-8)", "once", "instance-hours", Decimal("1.0"), Decimal("0.38"), Decimal("0.38")),
        ("Cloud Build", "once", "build-minutes", Decimal(75), Decimal("0.006"), Decimal("0.45")),
        # cloud.google.com/nat/pricing: $0.0014 per VM-hour (up to 32 VMs), $0.045 per GiB processed
        ("Cloud NAT (Packer VM)", "once", "VM-hours", Decimal("1.0"), Decimal("0.0014"), Decimal("0.0014")),
        ("Cloud NAT data", "once", "GiB", Decimal(15), Decimal("0.045"), Decimal("0.675")),
        # the NAT's automatically allocated address while the VM uses it: an in-use external IPv4
        # address, $0.005 per hour (cloud.google.com/vpc/network-pricing#ipaddress)
        ("Cloud NAT address (Packer VM)", "once", "address-hours", Decimal("1.0"), Decimal("0.005"), Decimal("0.005")),
        ("custom image storage", "monthly", "GiB-months", Decimal(100), Decimal("0.05"), Decimal("5.00")),
        ("Artifact Registry container", "monthly", "GB-months", Decimal(15), Decimal("0.10"), Decimal("1.50")),
    ]
    doc = bake_cost(a3mega_bake)
    # 1.0 h x $0.38 + 75 min x $0.006 + NAT 1.0 h x ($0.0014 + $0.005) + 15 GiB x $0.045 = $1.5114
    assert doc["once_usd"] == "1.51"
    assert doc["monthly_usd"] == "6.50"  # 100 GiB x $0.05 + 15 GB x $0.10 (free 0.5 GB not deducted)
    assert doc["stack_monthly_usd"] == "0.00"  # nothing bills by the hour between builds
    assert doc["price_not_found"] == []


def test_storage_prices_carry_their_sources(a3mega_bake):
    by_name = {line["component"]: line for line in bake_cost(a3mega_bake)["lines"]}
    image, registry = by_name["custom image storage"], by_name["Artifact Registry container"]
    assert "Storage Image" in image["source"] and "compute_image_test.golden" in image["source"]
    assert "cloud.google.com/artifact-registry/pricing" in registry["source"]
    assert image["date"] == registry["date"] == "2024-07-01"


def test_image_price_is_per_region_and_fails_closed_elsewhere(a3mega_bake):
    # europe-west4: the build VM ($0.41834/h) and both location-independent prices are known, the
    # image storage price is not read for that region, so the month has no total
    doc = bake_cost(a3mega_bake.model_copy(update={"region": "europe-west4", "zone": "europe-west4-a"}))
    assert doc["once_usd"] == "1.55"  # 1.0 h x $0.41834 + 75 min x $0.006 + $0.6814 NAT = $1.54974
    assert doc["monthly_usd"] is None
    assert [m.split(":")[0] for m in doc["price_not_found"]] == ["custom image storage"]
    registry = next(line for line in doc["lines"] if line["component"] == "Artifact Registry container")
    assert registry["usd"] == "1.50"


def _gcp_bake(run_cli, project, *extra):
    return run_cli(
        "image",
        "bake",
        "--cloud",
        "gcp",
        "--family",
        "a3-megagpu-8g",
        "--gcp-project",
        "my-proj-123",
        "--base-image",
        GCP_BASE,
        "--container-base",
        NGC,
        "--project-dir",
        str(project),
        *extra,
    )


def test_image_cost_cli_prints_the_totals_and_exits_0(run_cli, tmp_path):
    assert _gcp_bake(run_cli, tmp_path).exit_code == 0
    result = run_cli("image", "cost", "bake-a3-megagpu-8g", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert "custom image storage: 100 GiB-months -> $5.00" in result.stdout
    assert "Artifact Registry container: 15 GB-months -> $1.50" in result.stdout
    assert "cost: $1.51 per bake, $6.50 per month while the image is kept" in result.stdout
    doc = json.loads(run_cli("image", "cost", "bake-a3-megagpu-8g", "--json", "--project-dir", str(tmp_path)).stdout)
    assert (doc["once_usd"], doc["monthly_usd"], doc["price_not_found"]) == ("1.51", "6.50", [])


@pytest.mark.parametrize("region", ["europe-west4", "us-east4"])
def test_image_cost_cli_exit_4_in_a_region_without_an_image_price(run_cli, tmp_path, region):
    assert _gcp_bake(run_cli, tmp_path, "--region", region, "--name", "b1").exit_code == 0
    result = run_cli("image", "cost", "b1", "--project-dir", str(tmp_path))
    assert result.exit_code == 4
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert f"gce_custom_image_storage_per_gib_month in {region}" in result.stderr
    # the image storage line has no price: the monthly total is not a number
    assert "incomplete: 1 line without a price per month while the image is kept" in result.stdout
    assert (
        json.loads(run_cli("image", "cost", "b1", "--json", "--project-dir", str(tmp_path)).stdout)["monthly_usd"]
        is None
    )
