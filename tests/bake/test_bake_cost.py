"""gpuinfra.bake.cost: an AWS bake priced from sourced unit prices; an unpriced line fails closed
(the GCP bake: tests/bake/test_gcp_bake_cost.py)."""

from __future__ import annotations

from decimal import Decimal

from gpuinfra.bake.cost import bake_cost, bake_cost_lines


def test_p5_bake_in_us_east_1(p5_bake):
    lines = {ln.component: ln for ln in bake_cost_lines(p5_bake)}
    # external facts: AWS Price List us-east-1 m7i.large $0.1008/h, EBS Standard snapshots
    # $0.05/GB-month (SKU 7U7TWP44UP36AT3R), ECR private storage $0.10/GB-month
    assert lines["build instances (m7i.large)"].unit_price_usd == Decimal("0.1008")
    assert lines["AMI snapshot"].unit_price_usd == Decimal("0.05")
    assert lines["ECR container"].unit_price_usd == Decimal("0.10")
    # public IPv4 $0.005 per address-hour, in use or idle (aws.amazon.com/vpc/pricing)
    assert lines["build instance public IPv4"].usd == Decimal("2.5") * Decimal("0.005")
    doc = bake_cost(p5_bake)
    assert doc["once_usd"] == "0.26"  # 2.5 instance-hours x ($0.1008 + $0.005)
    assert doc["monthly_usd"] == "6.50"  # 100 GB x $0.05 + 15 GB x $0.10
    assert doc["price_not_found"] == []


def test_region_without_prices_gives_no_total(p5_bake):
    doc = bake_cost(p5_bake.model_copy(update={"region": "eu-west-1"}))
    assert doc["once_usd"] is None and doc["monthly_usd"] is None
    assert len(doc["price_not_found"]) == 3
