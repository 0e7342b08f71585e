"""`gpuinfra catalog refresh --cloud gcp` reads the disk and Local SSD price tables from the same
Billing Catalog SKU list as the machine prices, through the real google-cloud-billing client
against the SKU fixtures served on 127.0.0.1 (tests/fixtures/gcp_billing_skus.json plus
gcp_billing_disk_skus.json, whose ``_about`` cites the public SKU shapes).

The shipped book prices Hyperdisk Balanced from a dated dump of the Billing Catalog
(docs/prices.md); a refresh replaces that price in the regions it reads. A SKU that cannot be read
as one price for one region leaves that region out of the refreshed tables with a warning, never a
guess: the shipped price (or none) stays.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
import yaml

from gpuinfra.catalog.prices import (
    REFRESHED_PRICES_FILE,
    PriceGroup,
    PriceTable,
    price,
    shipped_price_book,
    write_refreshed_prices,
)
from gpuinfra.services.catalog_refresh import refresh_catalog
from tests.catalog.test_refresh import NOW, _fixture, _gcp_clients, _gcp_routes
from tests.replay_server import ReplayServer

HYPERDISK = "hyperdisk_balanced_per_gib_month"
SOURCE = "https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html"


def _skus(change=None) -> dict:
    """The machine SKUs plus the disk SKUs; ``change(disk_skus)`` edits the disk SKUs first."""
    skus = _fixture("gcp_billing_skus.json")
    disks = _fixture("gcp_billing_disk_skus.json")["skus"]
    if change:
        change(disks)
    skus["skus"] = skus["skus"] + disks
    return skus


def _routes(skus: dict) -> list:
    """The GCP fixture routes, with the A4 machine type offered in us-central1-b too (the zone
    the shipped catalog plans an A4 Spot node in)."""
    routes = _gcp_routes(skus)
    machine_types = _fixture("gcp_machine_types.json")
    a4 = next(m for m in machine_types["items"]["zones/us-central1-a"]["machineTypes"] if m["name"] == "a4-highgpu-8g")
    machine_types["items"]["zones/us-central1-b"]["machineTypes"].append(dict(a4, zone="us-central1-b"))
    return [route if "machineTypes" not in route[1] else (*route[:3], machine_types) for route in routes]


def _sku(skus: list, description: str) -> dict:
    return next(s for s in skus if s["description"] == description)


def _refresh(tmp_path, skus):
    with ReplayServer(_routes(skus)) as server:
        result = refresh_catalog(
            ["gcp"], out_dir=tmp_path, gcp_project="demo-project", gcp=_gcp_clients(server.url), now=NOW
        )
        sku_calls = [p for _, p, _, _ in server.requests if "/skus" in p]
    assert len(sku_calls) == 1  # one SKU list for the machines and the price tables
    return result


def test_a4_boot_disk_price_shipped_then_replaced_by_a_refresh_through_the_cli(tmp_path, monkeypatch, run_cli):
    project, catalog = tmp_path / "project", tmp_path / "catalog"
    created = run_cli(
        "new", "--instance-type", "a4-highgpu-8g", "--cloud", "gcp", "--spot",
        "--project-dir", str(project), "--name", "a4",
    )  # fmt: skip
    assert created.exit_code == 0, created.stderr
    before = run_cli("cost", "a4", "--json", "--project-dir", str(project))
    assert before.exit_code == 0, before.stderr
    (shipped,) = [line for line in json.loads(before.stdout)["lines"] if "hyperdisk-balanced" in line["component"]]
    # "Hyperdisk Balanced Capacity in Iowa": $0.08 per GiB-month in the dump of 2026-04-30
    assert (shipped["unit_price_usd"], shipped["price_date"]) == ("0.080000", "2026-04-30")

    def raised(disks):  # the fresh Catalog says $0.085: the refresh must replace the shipped price
        rate = _sku(disks, "Hyperdisk Balanced Capacity in Iowa")["pricingInfo"][0]["pricingExpression"]
        rate["tieredRates"][0]["unitPrice"]["nanos"] = 85000000

    with ReplayServer(_routes(_skus(raised))) as server:
        clients = _gcp_clients(server.url)  # the real clients, sent to the stand-in instead of Google
        monkeypatch.setattr("gpuinfra.services.catalog_refresh.gcp_clients", lambda *a, **k: clients)
        refreshed = run_cli(
            "catalog", "refresh", "--cloud", "gcp", "--gcp-project", "demo-project", "--out", str(catalog)
        )
    assert refreshed.exit_code == 0, refreshed.stderr
    # the fixtures have GPU offers in us-central1 only; all six tables are priced there
    assert "gcp prices: 6 of 6 region x table pairs" in refreshed.stdout
    assert "warning" not in refreshed.stdout  # the regional, storage-pool and HA SKUs are other products

    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(catalog))
    after = run_cli("cost", "a4", "--json", "--project-dir", str(project))
    assert after.exit_code == 0, after.stderr
    doc = json.loads(after.stdout)
    assert doc["price_not_found"] == [] and doc["hourly_usd"] is not None
    boot = [line for line in doc["lines"] if "hyperdisk-balanced" in line["component"]]
    # provisioned at the free 3,000 IOPS and 140 MiB/s: the capacity line only,
    # 200 GiB x $0.085 per GiB-month (SKU H001-0000-0001) / 730 h = $0.0232876.../h
    assert [line["component"] for line in boot] == ["hyperdisk-balanced boot disk (200 GiB x 1 nodes)"]
    assert boot[0]["unit_price_usd"] == "0.085000"
    assert boot[0]["hourly_usd"] == "0.023288"
    # dated the refresh day, as the refreshed machine prices (the Catalog states no date)
    assert "SKU H001-0000-0001" in boot[0]["price_source"] and boot[0]["price_date"] == doc["catalog_date"]


def test_refreshed_tables_cover_each_region_once_in_the_table_unit(tmp_path, monkeypatch):
    def per_hour(disks):  # a capacity SKU billed per GiB-hour: x 730 to the table's GiB-month
        sku = _sku(disks, "Balanced PD Capacity in Iowa")
        sku["pricingInfo"][0]["pricingExpression"]["usageUnit"] = "GiBy.h"
        sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]["nanos"] = 137000

    result = _refresh(tmp_path, _skus(per_hour))
    assert result.warnings == []
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(tmp_path))
    assert price("gcp", "pd_balanced_per_gb_month", "us-central1").usd == Decimal("0.000137") * 730
    assert price("gcp", "hyperdisk_balanced_iops_per_month", "us-central1").usd == Decimal("0.005")
    assert price("gcp", "hyperdisk_balanced_throughput_per_mibps_month", "us-central1").usd == Decimal("0.04")
    assert price("gcp", "local_ssd_spot_per_gb_month", "us-central1").usd == Decimal("0.048")
    # regions the refresh did not price keep the shipped price (the Billing Catalog dump's for
    # Hyperdisk Balanced: "... Capacity in Northern Virginia" $0.08)
    assert price("gcp", "pd_balanced_per_gb_month", "us-east4").usd == Decimal("0.11")
    assert (price("gcp", HYPERDISK, "us-east4").usd, price("gcp", HYPERDISK, "us-east4").date) == (
        Decimal("0.08"),
        "2026-04-30",
    )


def _duplicate(disks):
    twin = dict(_sku(disks, "Hyperdisk Balanced Capacity in Iowa"), skuId="H001-0000-0099")
    disks.append(twin)


def _zero(disks):
    rate = _sku(disks, "Hyperdisk Balanced Capacity in Iowa")["pricingInfo"][0]["pricingExpression"]
    rate["tieredRates"][0]["unitPrice"]["nanos"] = 0


def _unknown_unit(disks):
    _sku(disks, "Hyperdisk Balanced Capacity in Iowa")["pricingInfo"][0]["pricingExpression"]["usageUnit"] = "TiBy.mo"


@pytest.mark.parametrize(
    ("change", "warning"),
    [
        (
            _duplicate,
            "2 SKUs (H001-0000-0001, H001-0000-0099) match hyperdisk_balanced_per_gib_month in us-central1; "
            "left unpriced",
        ),
        (_zero, "SKU H001-0000-0001 (Hyperdisk Balanced Capacity in Iowa): price 0; "),
        (_unknown_unit, "SKU H001-0000-0001 (Hyperdisk Balanced Capacity in Iowa): unknown usage unit 'TiBy.mo'; "),
    ],
    ids=["two-skus-one-region", "zero-price", "unknown-unit"],
)
def test_a_sku_that_is_not_one_price_leaves_the_region_unpriced_with_a_warning(tmp_path, monkeypatch, change, warning):
    result = _refresh(tmp_path, _skus(change))
    assert [w for w in result.warnings if w.startswith(warning)], result.warnings
    assert "gcp prices: 5 of 6 region x table pairs (regions with a GPU offer)" in result.summary_lines()[3]
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(tmp_path))
    refreshed = yaml.safe_load((tmp_path / REFRESHED_PRICES_FILE).read_text())["gcp"]
    assert all(
        "us-central1" not in (g.get("regions") or {}) for g in refreshed.get(HYPERDISK, {"prices": []})["prices"]
    )
    # never $0, never the other SKU's price: the shipped price stays
    assert price("gcp", HYPERDISK, "us-central1").date == "2026-04-30"
    assert price("gcp", "hyperdisk_balanced_iops_per_month", "us-central1").usd == Decimal("0.005")


def test_a_refresh_into_another_folder_keeps_the_other_clouds_refreshed_prices(tmp_path, monkeypatch):
    # the catalog in use has refreshed AWS prices (a NAT data price for eu-north-1, which the
    # shipped book lacks); a GCP refresh with --out keeps that catalog's AWS offers, so it keeps
    # its AWS prices too: the new folder, once in use, prices eu-north-1 as the old one did
    in_use, out = tmp_path / "in-use", tmp_path / "out"
    _refresh(in_use, _skus())
    nat = PriceTable(
        unit=shipped_price_book().aws["nat_gateway_per_gb"].unit,
        what="NAT gateway data processed",
        prices=[PriceGroup(source=SOURCE, date="2026-11-27", regions={"eu-north-1": Decimal("0.046")})],
    )
    write_refreshed_prices(in_use, "aws", {"nat_gateway_per_gb": nat})
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(in_use))
    assert price("aws", "nat_gateway_per_gb", "eu-north-1").usd == Decimal("0.046")
    _refresh(out, _skus())
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(out))
    assert price("aws", "nat_gateway_per_gb", "eu-north-1").usd == Decimal("0.046")
    assert price("gcp", HYPERDISK, "us-central1").source.startswith("https://cloud.google.com/billing")
