"""Commitment prices (1-year / 3-year): built from the trimmed, dated upstream extracts, equal to
figures quoted independently of the build, and failing closed where a source has no rate."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal

import pytest
import yaml

from gpuinfra.catalog.commitments import (
    build_commitments,
    commitments_csv,
    read_commitments,
    trim_aws,
    trim_gcp,
    write_commitments,
)
from gpuinfra.catalog.store import PACKAGE_DATA_DIR, load_catalog
from tests.conftest import SNAPSHOT_DIR


@pytest.fixture(scope="module")
def table():
    return read_commitments(PACKAGE_DATA_DIR)


def test_shipped_commitments_equal_a_fresh_build(tmp_path):
    write_commitments(tmp_path, SNAPSHOT_DIR)
    for name in ("commitments.csv", "commitments.json"):
        assert (tmp_path / name).read_text() == (PACKAGE_DATA_DIR / name).read_text(), name


def test_a3_highgpu_8g_us_central1_cud_is_the_monthly_figure_over_730_hours(table):
    # pricing.yml @fd66b26 (generated 2026-07-30): month_1y 44810.08066464, month_3y 28370.99821392;
    # the price audit quotes "$44,810/month" and "$28,371" for the same keys
    one = table.price("gcp", "a3-highgpu-8g", "us-central1", "commit-1y")
    three = table.price("gcp", "a3-highgpu-8g", "us-central1", "commit-3y")
    assert one.price_per_hour_usd == Decimal("61.38367")  # 44810.08066464 / 730
    assert three.price_per_hour_usd == Decimal("38.86438")  # 28370.99821392 / 730
    assert round(one.price_per_hour_usd * 730) == 44810 and round(three.price_per_hour_usd * 730) == 28371
    assert table.source_of(one)["date"] == "2026-07-30"
    assert "fd66b26ff84fee5cdd94f341ea89206e76c06b99" in table.source_of(one)["source"]


def test_aws_standard_reserved_no_upfront_rates_of_the_dated_vantage_extract(table):
    # the price audit, from the same extract (2025-11-30): p5.48xlarge us-east-1 3-yr standard no-upfront
    # RI $23.78/h; p4d.24xlarge 1-yr no-upfront $13.92/h
    assert table.price("aws", "p5.48xlarge", "us-east-1", "commit-3y").price_per_hour_usd == Decimal("23.77728")
    assert table.price("aws", "p4d.24xlarge", "us-east-1", "commit-1y").price_per_hour_usd == Decimal("13.92109")
    assert table.price("aws", "p4d.24xlarge", "us-east-1", "commit-3y").price_per_hour_usd == Decimal("9.37422")
    # the extract lists only convertible 1-year RIs for p5.48xlarge in us-east-1: unpriced, never guessed
    assert table.price("aws", "p5.48xlarge", "us-east-1", "commit-1y") is None
    assert table.source_of(table.price("aws", "p5.48xlarge", "us-east-1", "commit-3y"))["date"] == "2025-11-30"


def test_n1_hosts_have_no_commitment_price_their_attached_gpus_are_not_in_it(table):
    assert not [k for k in table.prices if k[1].startswith("n1-")]


def test_every_commitment_discounts_the_same_on_demand_price_the_catalog_has(table):
    # the sources' own on-demand rate must equal the catalog's for the (type, region): a commitment
    # keyed to the wrong region or taken from another date would show here
    on_demand = {
        (o.cloud, o.instance_type, o.region): o.on_demand_price_per_hour_usd
        for o in load_catalog(PACKAGE_DATA_DIR).offers
        if o.on_demand_price_per_hour_usd is not None
    }
    compared = 0
    for (cloud, itype, region, _), c in table.prices.items():
        if (cloud, itype, region) in on_demand:
            assert c.source_on_demand_per_hour_usd == on_demand[(cloud, itype, region)], (itype, region)
            compared += 1
        assert 0 < c.price_per_hour_usd < c.source_on_demand_per_hour_usd, (itype, region, c.market)
    assert compared > 1000


def test_a_row_without_provenance_or_price_is_refused(tmp_path):
    prices = build_commitments(SNAPSHOT_DIR)[:2]
    (tmp_path / "commitments.json").write_text(json.dumps({"sources": {}}))
    (tmp_path / "commitments.csv").write_text(commitments_csv(prices))
    with pytest.raises(ValueError, match="without provenance"):
        read_commitments(tmp_path)
    (tmp_path / "commitments.csv").write_text(
        commitments_csv(prices).replace(prices[0].to_row()["price_per_hour_usd"], "0", 1)
    )
    with pytest.raises(ValueError, match="positive price"):
        read_commitments(tmp_path)
    assert read_commitments(tmp_path / "absent").prices == {}


def test_trim_keeps_the_standard_no_upfront_rates_and_bundled_gpu_machines_only():
    raw = [
        {
            "instance_type": "p4d.24xlarge",
            "pricing": {
                "us-east-1": {
                    "linux": {
                        "ondemand": "21.957642",
                        "reserved": {"yrTerm1Convertible.noUpfront": "16.7", "yrTerm1Standard.noUpfront": "13.921094"},
                    }
                },
                "eu-west-1": {"linux": {"ondemand": "24.1", "reserved": {"yrTerm1Convertible.noUpfront": "17"}}},
            },
        },
        {"instance_type": "m5.large", "pricing": {"us-east-1": {"linux": {"ondemand": "0.096"}}}},
    ]
    aws = trim_aws(raw, ["p4d.24xlarge"], "src", "2025-11-30")
    assert aws["prices"] == {
        "p4d.24xlarge": {"us-east-1": {"ondemand": "21.957642", "yrTerm1Standard.noUpfront": "13.921094"}}
    }
    pricing = yaml.safe_load(
        "about: {generated: Thu Jul 30 06:13:17 2026}\n"
        "compute: {instance: {"
        "a3-highgpu-8g: {cost: {us-central1: {hour: 88.4899999025753, month_1y: 44810.08066464}}},"
        "n1-standard-8: {cost: {us-central1: {hour: 0.38, month_1y: 170.0}}}}}"
    )
    gcp = trim_gcp(pricing, "src")
    assert gcp["_date"] == "2026-07-30" and list(gcp["prices"]) == ["a3-highgpu-8g"]
    assert gcp["prices"]["a3-highgpu-8g"]["us-central1"] == {"hour": "88.4899999025753", "month_1y": "44810.08066464"}


@pytest.mark.parametrize(
    ("machine", "region", "market", "month_usd"),
    [
        # pricing.yml @dac31281 (2026-08-20, the commit the GCP on-demand prices cite), read from the
        # stored public file: the A3 CUDs did not change between 2026-07-30 and 2026-08-20
        ("a3-highgpu-8g", "us-central1", "commit-1y", "44810.08066464"),
        ("a3-highgpu-8g", "us-east4", "commit-1y", "44840.32514976"),
        ("a3-megagpu-8g", "us-east4", "commit-1y", "46678.66370976"),
        ("a3-megagpu-8g", "us-east4", "commit-3y", "29555.25790768"),
        ("a3-highgpu-8g", "europe-west4", "commit-3y", "36078.20074112"),
    ],
)
def test_gcp_cud_equals_the_later_release_the_on_demand_prices_cite(table, machine, region, market, month_usd):
    price = table.price("gcp", machine, region, market).price_per_hour_usd
    assert price == (Decimal(month_usd) / 730).quantize(Decimal("0.00001"))


def test_a_refreshed_catalog_folder_without_commitments_uses_the_shipped_table(tmp_path):
    for name in ("offers.csv", "instance_types.json", "catalog.json"):
        shutil.copy(PACKAGE_DATA_DIR / name, tmp_path / name)
    refreshed = load_catalog(tmp_path)
    price = refreshed.commitments.price("gcp", "a3-highgpu-8g", "us-central1", "commit-1y")
    assert price is not None and price.price_per_hour_usd == Decimal("61.38367")
