"""gpuinfra.offer_search: the service under `gpuinfra offers`."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import RequestError
from gpuinfra.offer_search import market_option, offer_json, run_json, search_offers


@pytest.mark.parametrize(
    ("market", "spot", "chosen"),
    [
        ("on-demand", False, "on-demand"),
        (None, False, "on-demand"),
        (None, True, "spot"),
        ("spot", True, "spot"),
        ("spot", False, "spot"),
        ("flex", False, "flex-start"),
    ],
)
def test_market_option(market, spot, chosen):
    assert market_option(market, spot) == chosen


@pytest.mark.parametrize(
    ("market", "spot", "message"),
    [
        ("reserved", False, "unknown --market 'reserved'; choose one of: on-demand, spot, flex, commit-1y, commit-3y"),
        ("flex", True, "--spot contradicts --market flex"),
        # both given and saying different things: refused, never silently spot
        ("on-demand", True, "--spot contradicts --market on-demand: give one of them"),
    ],
)
def test_market_option_refuses(market, spot, message):
    with pytest.raises(RequestError, match=message):
        market_option(market, spot)


def test_cheapest_gcp_4xa100_and_its_json():
    catalog = load_catalog()
    found = search_offers(catalog, gpus="4xA100", cloud="gcp")
    assert found.runs is None and found.query.market == "on-demand"
    doc = offer_json(found.ranked[0], catalog)
    assert (doc["instance_type"], doc["region"], doc["zone"]) == ("a2-highgpu-4g", "us-central1", "us-central1-a")
    assert (
        doc["price_per_hour_usd"],
        doc["price_per_gpu_hour_usd"],
        doc["on_demand_price_per_hour_usd"],
        doc["spot_price_per_hour_usd"],
        doc["flex_start_price_per_hour_usd"],
    ) == ("14.693540", "3.673385", "14.693540", "7.712080", None)  # spot: pricing.yml @fd66b26 hour_spot


def test_instance_type_alone_gives_the_request():
    found = search_offers(load_catalog(), instance_type="p4d.24xlarge", nodes=2)
    assert (found.query.request.gpu, found.query.request.gpu_count, found.query.request.nodes) == ("A100", 8, 2)
    assert found.ranked[0].price_per_hour_usd == 2 * Decimal("21.95764")


def test_data_ranks_runs_and_needs_hours():
    catalog = load_catalog()
    found = search_offers(catalog, gpus="4xA100", data_region="us-east-1", data_size="50TB", hours=24)
    assert found.hours == Decimal(24) and found.data.location == "us-east-1"
    doc = run_json(found.runs[0], catalog)
    assert (doc["instance_type"], doc["hours"], doc["compute_usd"], doc["data_transfer_usd"], doc["run_usd"]) == (
        "p4d.24xlarge",
        24.0,
        "526.983360",
        "0.000000",
        "526.983360",
    )
    with pytest.raises(RequestError, match="--data needs --hours, at least 1 minute and at most 8760"):
        search_offers(catalog, gpus="4xA100", data_region="us-east-1", data_size="50TB")
    with pytest.raises(RequestError, match="--hours goes with --data or --data-region"):
        search_offers(catalog, gpus="4xA100", hours=24)
