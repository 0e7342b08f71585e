"""Refreshed price tables: a refresh adds or replaces regions, table by table, and nothing else.

The shipped book has no NAT data price in eu-north-1 (docs/prices.md lists the gap) and
prices us-east-1 at $0.045/GB (AmazonEC2 offer 20260831181331). These tests write refreshed
tables into a catalog folder in use and read the prices back through :func:`price`.
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
    price_book,
    shipped_price_book,
    write_refreshed_prices,
)
from gpuinfra.errors import CatalogError

SOURCE = "https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html"


def _nat_table(regions: dict[str, str], unit: str = "USD per GB") -> PriceTable:
    group = PriceGroup(source=SOURCE, date="2026-11-27", regions={r: Decimal(v) for r, v in regions.items()})
    return PriceTable(unit=unit, what="NAT gateway data processed", prices=[group])


@pytest.fixture
def catalog_in_use(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(tmp_path))
    (tmp_path / "catalog.json").write_text(json.dumps({"schema_version": 1}))
    return tmp_path


def test_a_refreshed_region_fills_a_gap_and_replaces_a_shipped_price(catalog_in_use):
    assert price("aws", "nat_gateway_per_gb", "eu-north-1") is None
    assert price("aws", "nat_gateway_per_gb", "us-east-1").usd == Decimal("0.045")
    write_refreshed_prices(
        catalog_in_use, "aws", {"nat_gateway_per_gb": _nat_table({"eu-north-1": "0.046", "us-east-1": "0.044"})}
    )
    fresh = price("aws", "nat_gateway_per_gb", "eu-north-1")
    assert (fresh.usd, fresh.source, fresh.date) == (Decimal("0.046"), SOURCE, "2026-11-27")
    assert price("aws", "nat_gateway_per_gb", "us-east-1").usd == Decimal("0.044")
    # regions the refresh did not price keep their shipped price and source
    eu_west_2 = price("aws", "nat_gateway_per_gb", "eu-west-2")
    assert (eu_west_2.usd, eu_west_2.date) == (Decimal("0.05"), "2026-09-04")
    # other tables are untouched
    assert price_book().aws["nat_gateway_per_hour"] == shipped_price_book().aws["nat_gateway_per_hour"]


def test_refreshed_prices_in_a_folder_not_in_use_change_nothing(tmp_path):
    write_refreshed_prices(tmp_path, "aws", {"nat_gateway_per_gb": _nat_table({"eu-north-1": "0.046"})})
    assert price("aws", "nat_gateway_per_gb", "eu-north-1") is None


def test_a_refresh_of_one_cloud_keeps_the_other_clouds_tables(catalog_in_use):
    write_refreshed_prices(catalog_in_use, "aws", {"nat_gateway_per_gb": _nat_table({"eu-north-1": "0.046"})})
    gcs = PriceTable(
        unit=shipped_price_book().gcp["gcs_standard_per_gb_month"].unit,
        what="Cloud Storage Standard",
        prices=[PriceGroup(source=SOURCE, date="2026-11-27", regions={"us-central1": Decimal("0.021")})],
    )
    write_refreshed_prices(catalog_in_use, "gcp", {"gcs_standard_per_gb_month": gcs})
    assert price("aws", "nat_gateway_per_gb", "eu-north-1").usd == Decimal("0.046")
    assert price("gcp", "gcs_standard_per_gb_month", "us-central1").usd == Decimal("0.021")
    # a second AWS refresh replaces the AWS part as a whole
    write_refreshed_prices(catalog_in_use, "aws", {"nat_gateway_per_gb": _nat_table({"us-west-1": "0.045"})})
    assert price("aws", "nat_gateway_per_gb", "eu-north-1") is None
    assert price("aws", "nat_gateway_per_gb", "us-west-1").usd == Decimal("0.045")
    assert price("gcp", "gcs_standard_per_gb_month", "us-central1").usd == Decimal("0.021")


def test_a_table_whose_unit_changed_is_ignored_on_read_and_refused_on_write(catalog_in_use):
    with pytest.raises(ValueError, match="unit"):
        write_refreshed_prices(
            catalog_in_use, "aws", {"nat_gateway_per_gb": _nat_table({"eu-north-1": "46"}, unit="USD per TB")}
        )
    with pytest.raises(ValueError, match="does not match"):
        write_refreshed_prices(catalog_in_use, "aws", {"no_such_table": _nat_table({"eu-north-1": "0.046"})})
    assert not (catalog_in_use / REFRESHED_PRICES_FILE).exists()
    # a file from another version whose unit differs
    doc = {
        "schema_version": 2,
        "aws": {
            "nat_gateway_per_gb": _nat_table({"eu-north-1": "46"}, unit="USD per TB").model_dump(
                mode="json", exclude_none=True
            )
        },
    }
    (catalog_in_use / REFRESHED_PRICES_FILE).write_text(yaml.safe_dump(doc))
    assert price("aws", "nat_gateway_per_gb", "eu-north-1") is None


@pytest.mark.parametrize(
    "text",
    [
        "schema_version: 2\naws: {nat_gateway_per_gb: {unit: USD per GB, what: x, prices: [{source: 'https://x', date: '2026-11-27', all: 0.04}]}}\n",
        "schema_version: 2\naws: {nat_gateway_per_gb: {unit: USD per GB, what: x, prices: [{source: 'https://x', date: '2026-11-27', regions: {eu-north-1: 0}}]}}\n",
        "schema_version: 3\n",
        "aws: [\n",
    ],
    ids=["all-group", "zero-price", "schema", "not-yaml"],
)
def test_an_unreadable_refreshed_file_is_one_clear_error(catalog_in_use, text):
    (catalog_in_use / REFRESHED_PRICES_FILE).write_text(text)
    with pytest.raises(CatalogError, match=r"refreshed prices .* unreadable .*catalog refresh"):
        price("aws", "nat_gateway_per_gb", "eu-north-1")
