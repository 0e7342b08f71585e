"""The planner's alternatives for a fallback ladder (`plan_alternatives`): the same ranking as the
plan it follows, one offer per capacity pool, across clouds and markets only as the request allows."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice

from gpuinfra.catalog.store import load_catalog
from gpuinfra.offers import OfferQuery, find_offers, gpu_request
from gpuinfra.planner import (
    PlanRequest,
    placement_key,
    plan_alternatives,
    plan_cluster,
    region_key,
    spread_alternatives,
)
from gpuinfra.profiles import get_profile

NOW = datetime(2026, 11, 27, tzinfo=UTC)


def _ladder(request: PlanRequest, profile: str = "llm-finetune", count: int = 40):
    catalog, chosen = load_catalog(), get_profile(profile)
    first = plan_cluster(catalog, request, chosen, NOW)
    return first, list(islice(plan_alternatives(catalog, request, chosen, NOW, first), count))


def test_alternatives_follow_the_ranking_one_per_pool():
    request = PlanRequest(gpus="8xH100", nodes=2, spot=True)
    first, rest = _ladder(request)
    keys = [placement_key(p.spec) for p in (first, *rest)]
    assert len(keys) == len(set(keys))  # never the same cloud, region, zone and market twice
    prices = [p.offer.price_per_hour_usd for p in (first, *rest)]
    assert prices == sorted(prices)
    # the cheapest spot offer of every pool the catalog has, in its order: what find_offers ranks
    catalog = load_catalog()
    ranked = find_offers(catalog, OfferQuery(request=gpu_request(catalog, "8xH100", None, None, 2), market="spot"))
    pools = list(dict.fromkeys((r.offer.cloud, r.offer.region, r.offer.zone, "spot") for r in ranked))
    assert keys[:5] == pools[:5]
    assert {"aws", "gcp"} <= {k[0] for k in keys}  # the other cloud takes part when --cloud pins none


def test_a_pinned_cloud_and_market_stay_pinned():
    _, rest = _ladder(PlanRequest(gpus="8xH100", nodes=2, spot=True, cloud="aws"))
    assert rest and {placement_key(p.spec)[0] for p in rest} == {"aws"}
    assert {placement_key(p.spec)[3] for p in rest} == {"spot"}
    _, on_demand = _ladder(PlanRequest(gpus="8xH100", nodes=2, spot=False))
    assert {placement_key(p.spec)[3] for p in on_demand} == {"on-demand"}


def test_a_profile_that_prefers_spot_ranks_spot_pools_then_on_demand():
    first, rest = _ladder(PlanRequest(gpus="8xH100", nodes=2, region="us-east-1"), profile="lora-finetune")
    markets = [placement_key(p.spec)[3] for p in (first, *rest)]
    assert markets[0] == "spot" and "on-demand" in markets
    assert markets == sorted(markets, key=lambda m: m != "spot")  # every spot pool before any on-demand one
    assert all(p.spec.spot == (m == "spot") for p, m in zip((first, *rest), markets, strict=True))


def test_spread_takes_each_region_and_market_once_before_a_second_zone():
    first, rest = _ladder(PlanRequest(gpus="8xH100", nodes=2, cloud="aws", spot=False), count=200)
    regions = list(dict.fromkeys(region_key(p.spec) for p in (first, *rest)))
    assert len(regions) > 3  # the catalog offers on-demand 8xH100 pairs in several AWS regions
    picked = spread_alternatives(first, rest, len(regions))
    # one per other region, the best-ranked zone of each, then a second zone of rung 0's region
    firsts = {}
    for plan in rest:
        firsts.setdefault(region_key(plan.spec), plan)
    second_zone = next(p for p in rest if region_key(p.spec) == region_key(first.spec))
    expected = [*(firsts[key] for key in regions[1:]), second_zone]
    assert {id(p) for p in picked} == {id(p) for p in expected}
    assert [rest.index(p) for p in picked] == sorted(rest.index(p) for p in picked)  # ranking order kept
    assert picked[0].spec.zone == second_zone.spec.zone == "use1-az2"  # same price as rung 0, ranked first
    assert len({region_key(p.spec) for p in picked}) == len(regions)
    # a pinned region has no other: further zones in ranking order
    _, zones = _ladder(PlanRequest(gpus="8xH100", nodes=2, region="us-east-1", spot=False))
    assert spread_alternatives(first, zones, 2) == zones[:2]
