"""Offer ranking on the shipped catalog and on small synthetic catalogs."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from gpuinfra.catalog.model import Offer
from gpuinfra.catalog.store import Catalog, load_catalog
from gpuinfra.errors import CatalogError, NoOfferError, RequestError
from gpuinfra.offers import OfferQuery, find_offers, gpu_request
from gpuinfra.requests import parse_gpu_spec


def _offer(itype, gpu, count, price, zone="z1", spot=None, cloud="aws", region="r1", local=False):
    return Offer(
        cloud=cloud,
        instance_type=itype,
        gpu=gpu,
        gpu_count=count,
        vcpus=8,
        memory_gib=64,
        region=region,
        zone=zone,
        on_demand_price_per_hour_usd=Decimal(price),
        spot_price_per_hour_usd=None if spot is None else Decimal(spot),
        local_zone=local,
    )


def _catalog(*offers):
    return Catalog(offers=tuple(offers), facts={}, meta={"catalog_date": "2026-01-01"}, path=Path("."))


def test_exact_count_ranks_first_at_equal_price():
    cat = _catalog(_offer("big", "A100", 8, "10"), _offer("exact", "A100", 4, "10"), _offer("cheap", "A100", 8, "9"))
    ranked = find_offers(cat, OfferQuery(parse_gpu_spec("4xA100")))
    assert [r.offer.instance_type for r in ranked] == ["cheap", "exact", "big"]
    assert [r.round_up for r in ranked] == [True, False, True]


def test_round_up_above_twice_the_request_is_not_a_fit():
    cat = _catalog(_offer("one", "H100", 1, "5"), _offer("eight", "H100", 8, "40"))
    with pytest.raises(NoOfferError, match=r"1 per node: one; 8 per node: eight .*--gpus 8xH100"):
        find_offers(cat, OfferQuery(parse_gpu_spec("3xH100")))
    assert [r.offer.instance_type for r in find_offers(cat, OfferQuery(parse_gpu_spec("4xH100")))] == ["eight"]


def test_other_gpu_model_never_substitutes():
    cat = _catalog(_offer("a80", "A100-80GB", 4, "1"))
    with pytest.raises(NoOfferError, match="no offer has A100"):
        find_offers(cat, OfferQuery(parse_gpu_spec("4xA100")))


def test_nodes_multiply_price_and_spot_uses_spot_column():
    cat = _catalog(_offer("t", "A100", 4, "10", spot="3"), _offer("u", "A100", 4, "8"))
    on_demand = find_offers(cat, OfferQuery(parse_gpu_spec("4xA100", nodes=3)))
    assert [(r.offer.instance_type, r.price_per_hour_usd) for r in on_demand] == [
        ("u", Decimal("24")),
        ("t", Decimal("30")),
    ]
    spot = find_offers(cat, OfferQuery(parse_gpu_spec("4xA100", nodes=3), market="spot"))
    assert [(r.offer.instance_type, r.price_per_hour_usd) for r in spot] == [("t", Decimal("9"))]  # u has no spot price
    assert spot[0].price_per_gpu_hour_usd == Decimal("0.75")


def test_local_zones_only_when_asked():
    cat = _catalog(_offer("t", "A100", 4, "10"), _offer("t", "A100", 4, "1", zone="usw2-lax1-az1", local=True))
    assert [r.offer.zone for r in find_offers(cat, OfferQuery(parse_gpu_spec("4xA100")))] == ["z1"]
    asked = find_offers(cat, OfferQuery(parse_gpu_spec("4xA100"), include_local_zones=True))
    assert [r.offer.zone for r in asked] == ["usw2-lax1-az1", "z1"]
    named = find_offers(cat, OfferQuery(parse_gpu_spec("4xA100"), zone="usw2-lax1-az1"))
    assert [r.offer.zone for r in named] == ["usw2-lax1-az1"]


def test_aws_4xa100_is_p4d_rounded_up_and_cheapest_first():
    ranked = find_offers(load_catalog(), OfferQuery(parse_gpu_spec("4xA100"), cloud="aws"))
    assert {r.offer.instance_type for r in ranked} == {"p4d.24xlarge"}
    first = ranked[0]
    assert first.round_up and first.offer.gpu_count == 8
    assert first.round_up_note == "p4d.24xlarge has 8xA100 per node; you asked for 4 (rounded up)"
    prices = [r.price_per_hour_usd for r in ranked]
    assert prices == sorted(prices)
    assert first.price_per_hour_usd == Decimal("21.95764")  # us-east-1, after float-noise rounding


def test_gcp_4xa100_is_priced_at_the_cited_on_demand_price():
    ranked = find_offers(load_catalog(), OfferQuery(parse_gpu_spec("4xA100"), cloud="gcp"))
    assert {r.offer.instance_type for r in ranked} == {"a2-highgpu-4g", "a2-highgpu-8g"}  # 8 <= 2 x 4
    first = ranked[0]
    assert (first.offer.instance_type, first.offer.region, first.price_per_hour_usd) == (
        "a2-highgpu-4g",
        "us-central1",
        Decimal("14.69354"),
    )  # 4 x 3.673385 (pricing.yml 2026-08-20)
    assert not first.round_up


def test_p5e_has_no_on_demand_offer_but_spot_ones():
    catalog = load_catalog()
    on_demand = find_offers(catalog, OfferQuery(parse_gpu_spec("8xH200"), cloud="aws"))
    assert {r.offer.instance_type for r in on_demand} == {"p5en.48xlarge"}
    spot = find_offers(catalog, OfferQuery(parse_gpu_spec("8xH200"), cloud="aws", market="spot"))
    assert "p5e.48xlarge" in {r.offer.instance_type for r in spot}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (dict(region="mars-1"), "unknown region 'mars-1'. Known regions: af-south-1"),
        (dict(cloud="azure"), "unknown cloud 'azure'; choose one of: aws, gcp"),
        (dict(cloud="gcp", region="us-central1", zone="us-central1-q"), "unknown zone 'us-central1-q' in us-central1."),
        (dict(zone="us-east-1a"), "is an AWS AZ *name*"),
        (dict(instance_type="p4d.24xlarg"), "unknown instance type 'p4d.24xlarg'. Did you mean p4d.24xlarge"),
    ],
)
def test_unknown_locations(query, message):
    with pytest.raises(CatalogError) as info:
        find_offers(load_catalog(), OfferQuery(parse_gpu_spec("4xA100"), **query))
    assert message in str(info.value)


def test_instance_type_with_other_gpu_explains():
    with pytest.raises(NoOfferError, match="p4d.24xlarge carries 8xA100, not H100"):
        find_offers(load_catalog(), OfferQuery(parse_gpu_spec("8xH100"), instance_type="p4d.24xlarge"))


def test_gpu_request_from_gpus_or_instance_type():
    cat = _catalog(_offer("p4d.24xlarge", "A100", 8, "21.95764"))
    assert gpu_request(cat, "4xA100", None, None, 2) == parse_gpu_spec("4xA100", 2)
    assert gpu_request(cat, None, "p4d.24xlarge", None, 3) == parse_gpu_spec("8xA100", 3)
    with pytest.raises(RequestError, match=r"^give --gpus \(e.g. 4xA100\) or --instance-type \(e.g. p4d.24xlarge\)$"):
        gpu_request(cat, None, None, None, 1)
    with pytest.raises(RequestError, match="--nodes must be a whole number from 1 to 1,000 .*, got 0"):
        gpu_request(cat, None, "p4d.24xlarge", None, 0)
