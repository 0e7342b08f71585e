"""gpuinfra.bake.cost: an AWS bake priced from sourced unit prices; an unpriced line fails closed
(the GCP bake: tests/bake/test_gcp_bake_cost.py)."""

from __future__ import annotations

import json
from decimal import Decimal

from gpuinfra.bake.cost import bake_cost, bake_cost_lines
from gpuinfra.bake.preview import run_bake_preview
from tests.bake.conftest import AMI, NGC


def test_p5_bake_in_us_east_1(p5_bake):
    lines = {ln.component: ln for ln in bake_cost_lines(p5_bake)}
    # external facts: AWS Price List us-east-1 m7i.large $0.1008/h, EBS Standard snapshots
    # $0.05/GB-month (SKU 7U7TWP44UP36AT3R), ECR private storage $0.10/GB-month
    assert lines["build instances (m7i.large)"].unit_price_usd == Decimal("0.1008")
    assert lines["AMI snapshot"].unit_price_usd == Decimal("0.05")
    assert lines["ECR container"].unit_price_usd == Decimal("0.10")
    # aws.amazon.com/vpc/pricing, us-east-1: NAT gateway $0.045 per hour and $0.045 per GB
    # processed; a public IPv4 address (the gateway's Elastic IP) $0.005 per hour, in use or idle
    # a partial NAT gateway-hour bills as a full one (aws.amazon.com/vpc/pricing): 2.5 h -> 3
    assert lines["NAT gateway (during the build)"].usd == Decimal(3) * Decimal("0.045")
    assert lines["NAT gateway Elastic IP (during the build)"].usd == Decimal("2.5") * Decimal("0.005")
    assert lines["NAT gateway data processed"].usd == 30 * Decimal("0.045")  # nvcr.io pull + ECR push
    # a month is 730 hours (AWS pricing calculator); the gateway bills while the bake stack exists
    assert lines["NAT gateway while the bake stack exists"].usd == 730 * Decimal("0.045")
    assert lines["NAT gateway Elastic IP while the bake stack exists"].usd == 730 * Decimal("0.005")
    doc = bake_cost(p5_bake)
    assert doc["once_usd"] == "1.75"  # 2.5 h x ($0.1008 + $0.005) + 3 h x $0.045 + 30 GB x $0.045 = $1.7495
    assert doc["monthly_usd"] == "6.50"  # 100 GB x $0.05 + 15 GB x $0.10
    assert doc["stack_monthly_usd"] == "36.50"  # 730 h x ($0.045 + $0.005)
    assert doc["price_not_found"] == []


def test_the_bake_no_longer_pays_for_a_build_instance_address(p5_bake):
    """No line prices a public address on the build instance: it has none (private subnet)."""
    components = [ln.component for ln in bake_cost_lines(p5_bake)]
    assert not [c for c in components if "build instance public" in c]
    addresses = [ln for ln in bake_cost_lines(p5_bake) if ln.unit == "address-hours"]
    assert all(ln.component.startswith("NAT gateway Elastic IP") for ln in addresses)


def test_every_nat_gateway_and_address_of_the_preview_is_priced(p5_bake):
    """The cost covers what the stack creates: one address-hour line per Elastic IP and one
    gateway-hour line per NAT gateway, for the build and for the stack's life."""
    preview = run_bake_preview(p5_bake)
    gateways, eips = preview.of_type("aws:ec2/natGateway:NatGateway"), preview.of_type("aws:ec2/eip:Eip")
    assert len(gateways) == len(eips) == 1
    for when in ("once", "stack"):
        lines = [ln for ln in bake_cost_lines(p5_bake) if ln.when == when]
        assert len([ln for ln in lines if ln.unit == "gateway-hours"]) == len(gateways)
        assert len([ln for ln in lines if ln.unit == "address-hours"]) == len(eips)


def test_region_without_prices_gives_no_total(p5_bake):
    doc = bake_cost(p5_bake.model_copy(update={"region": "eu-north-1"}))
    assert doc["once_usd"] is None and doc["monthly_usd"] is None
    # NAT data processing and snapshot storage have no eu-north-1 price in prices.yaml
    assert len(doc["price_not_found"]) == 2
    assert any("nat_gateway_per_gb" in missing for missing in doc["price_not_found"])


def test_an_unpriced_nat_gateway_hour_leaves_the_stack_total_out(p5_bake):
    """ap-east-1 has no NAT gateway hour price in prices.yaml: no stack total, never $0."""
    doc = bake_cost(p5_bake.model_copy(update={"region": "ap-east-1"}))
    assert doc["stack_monthly_usd"] is None
    stack_lines = [ln for ln in doc["lines"] if ln["when"] == "stack"]
    assert [ln["usd"] for ln in stack_lines if ln["unit"] == "gateway-hours"] == [None]


def test_image_cost_cli_shows_the_stack_line_and_says_to_destroy(run_cli, tmp_path):
    made = run_cli(
        "image", "bake", "--cloud", "aws", "--family", "p5", "--base-image", AMI, "--container-base", NGC,
        "--project-dir", str(tmp_path),
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    assert "gpuinfra down bake-p5" in made.stdout
    result = run_cli("image", "cost", "bake-p5", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert "cost stack: NAT gateway while the bake stack exists: 730 gateway-hours -> $32.85" in result.stdout
    assert "cost: $1.75 per bake, $6.50 per month while the image is kept" in result.stdout
    assert "cost: $36.50 per month while the bake stack exists: `gpuinfra down` it" in result.stdout
    doc = json.loads(run_cli("image", "cost", "bake-p5", "--json", "--project-dir", str(tmp_path)).stdout)
    assert (doc["once_usd"], doc["monthly_usd"], doc["stack_monthly_usd"]) == ("1.75", "6.50", "36.50")
