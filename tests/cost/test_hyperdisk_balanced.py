"""The Hyperdisk Balanced boot disk line: capacity, plus provisioned IOPS above 3,000 and throughput
above 140 MiB/s, which the volume includes at no extra charge
(cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced, "Baseline performance").

Most tests price us-central1 through a refreshed price file in the catalog folder in use, which
replaces the shipped price (the figures equal the Billing Catalog's for Iowa); the last one reads
the shipped book.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from gpuinfra.catalog.prices import PriceGroup, PriceTable, shipped_price_book, write_refreshed_prices
from gpuinfra.cost.estimate import ClusterFacts, _gcp_template_disks

SOURCE = "https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list"
FIGURES = {
    "hyperdisk_balanced_per_gib_month": "0.08",
    "hyperdisk_balanced_iops_per_month": "0.005",
    "hyperdisk_balanced_throughput_per_mibps_month": "0.04",
}


@pytest.fixture
def priced(tmp_path, monkeypatch):
    """us-central1 priced for the three Hyperdisk Balanced tables (the given ones only)."""
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(tmp_path))
    (tmp_path / "catalog.json").write_text(json.dumps({"schema_version": 1}))

    def _price(keys=tuple(FIGURES)):
        book = shipped_price_book().gcp
        tables = {
            key: PriceTable(
                unit=book[key].unit,
                what=book[key].what,
                prices=[PriceGroup(source=SOURCE, date="2026-11-27", regions={"us-central1": Decimal(FIGURES[key])})],
            )
            for key in keys
        }
        write_refreshed_prices(tmp_path, "gcp", tables)

    return _price


def _lines(disk: dict, nodes: int = 2):
    facts = ClusterFacts(cloud="gcp", region="us-central1", nodes=nodes)
    lines = _gcp_template_disks(
        "t", "gcp:compute/instanceTemplate:InstanceTemplate", {"disks": [disk]}, facts, None, "spot"
    )
    return {line.component: line for line in lines}


def _disk(**extra) -> dict:
    return {"boot": True, "diskType": "hyperdisk-balanced", "diskSizeGb": 200, **extra}


def test_provisioned_at_the_free_performance_costs_its_capacity_only(priced):
    priced()
    lines = _lines(_disk(provisionedIops=3000, provisionedThroughput=140))
    (line,) = lines.values()
    assert line.component == "hyperdisk-balanced boot disk (200 GiB x 2 nodes)"
    assert (line.unit_price_usd, line.hourly_quantity) == (Decimal("0.08"), Decimal(400) / 730)


def test_performance_above_the_free_part_is_billed_per_unit_month(priced):
    priced()
    lines = _lines(_disk(provisionedIops=5000, provisionedThroughput=290))
    iops = lines["hyperdisk-balanced IOPS above 3,000"]
    tput = lines["hyperdisk-balanced throughput (MiB/s) above 140"]
    # 2,000 IOPS and 150 MiB/s above the free part, on each of 2 nodes, per hour of a 730-hour month
    assert (iops.unit_price_usd, iops.hourly_quantity) == (Decimal("0.005"), Decimal(4000) / 730)
    assert (tput.unit_price_usd, tput.hourly_quantity) == (Decimal("0.04"), Decimal(300) / 730)


def test_a_needed_part_without_a_price_leaves_its_line_unpriced(priced, monkeypatch):
    import gpuinfra.cost.estimate as estimate

    priced()
    real = estimate.price
    monkeypatch.setattr(
        estimate,
        "price",
        lambda cloud, key, region: None if key == "hyperdisk_balanced_iops_per_month" else real(cloud, key, region),
    )
    lines = _lines(_disk(provisionedIops=5000, provisionedThroughput=140))
    assert lines["hyperdisk-balanced IOPS above 3,000"].unit_price_usd is None
    assert lines["hyperdisk-balanced boot disk (200 GiB x 2 nodes)"].unit_price_usd == Decimal("0.08")


def test_performance_left_to_gcp_defaults_is_not_priced(priced):
    priced()
    lines = _lines(_disk())
    unpriced = {c: line.source for c, line in lines.items() if line.unit_price_usd is None}
    assert unpriced == {
        "hyperdisk-balanced IOPS, GCP default": "no provisioned IOPS: GCP's default is not priced",
        "hyperdisk-balanced throughput (MiB/s), GCP default": (
            "no provisioned throughput (MiB/s): GCP's default is not priced"
        ),
    }


def test_the_shipped_book_prices_the_boot_disk_from_the_billing_catalog_dump():
    # "Hyperdisk Balanced Capacity in Iowa" (SKU 83FF-9C17-D184): $0.08 per GiB-month in the dump
    # of the Compute Engine Billing Catalog of 2026-04-30
    (line,) = _lines(_disk(provisionedIops=3000, provisionedThroughput=140)).values()
    assert line.unit_price_usd == Decimal("0.08") and line.price_date == "2026-04-30"
    assert "6F81-5844-456A" in line.source
