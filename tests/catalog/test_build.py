"""The shipped catalog is exactly what the build makes from the snapshot, and the build handles
the snapshot's known defects on purpose (data/snapshot/README.md)."""

from __future__ import annotations

import csv
from decimal import Decimal

import pytest

from gpuinfra.catalog.build import build_from_snapshot, is_local_zone, write_catalog
from gpuinfra.catalog.gates import MIN_FRACTION_OF_REFERENCE, reference_prices
from gpuinfra.catalog.model import parse_price
from gpuinfra.catalog.store import PACKAGE_DATA_DIR, load_catalog
from tests.conftest import SNAPSHOT_DIR

CYCLENERD = "Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml@dac31281"


@pytest.fixture(scope="module")
def built():
    return build_from_snapshot(SNAPSHOT_DIR)


def test_shipped_catalog_equals_a_fresh_build(built, tmp_path):
    offers, facts, meta, _ = built
    write_catalog(tmp_path, offers, facts, meta)
    for name in ("offers.csv", "instance_types.json", "catalog.json"):
        assert (tmp_path / name).read_text() == (PACKAGE_DATA_DIR / name).read_text(), name


def _snapshot_rows(name):
    with open(SNAPSHOT_DIR / name, newline="") as f:
        return list(csv.DictReader(f))


def _gcp(itype, zone):
    return next(o for o in load_catalog().offers if o.instance_type == itype and o.zone == zone)


def test_every_gcp_on_demand_row_cites_its_source_and_date():
    rows = _snapshot_rows("gcp_on_demand.csv")
    assert len(rows) == 844  # 524 A2/A3 rows + 320 G2 rows of pricing.yml generated 2026-08-20
    assert all(
        r["source_ref"].startswith(CYCLENERD + " compute.instance." + r["machine_type"] + ".cost." + r["region"])
        and r["source_date"] == "2026-08-20"
        for r in rows
    )


def test_gcp_on_demand_is_the_billed_machine_price_not_a_dws_sku():
    # a2-highgpu-4g us-central1: 4 x 3.673385 (A2 on-demand, cloud.google.com/compute/vm-instance-pricing)
    assert _gcp("a2-highgpu-4g", "us-central1-a").on_demand_price_per_hour_usd == Decimal("14.69354")
    # europe-west4: the real on-demand ($3.747972 per a2-highgpu-1g); the snapshot's
    # DWS GPU row (1.61365 per GPU-hour) made it $9.71 for 4 GPUs
    assert _gcp("a2-highgpu-1g", "europe-west4-a").on_demand_price_per_hour_usd == Decimal("3.74797")
    assert _gcp("a2-highgpu-4g", "europe-west4-a").on_demand_price_per_hour_usd == Decimal("14.99189")
    # a3-highgpu-8g us-central1: 88.49 = vCPU + memory + 8 H100 (87.8325) + 16 x 375 GiB of
    # bundled Local SSD at $0.08/GiB-month / 730 h (GCP bills bundled Local SSD with the machine)
    a3 = _gcp("a3-highgpu-8g", "us-central1-a").on_demand_price_per_hour_usd
    assert a3 == Decimal("88.49000")
    assert (a3 - Decimal(6000) * Decimal("0.08") / 730).quantize(Decimal("0.0001")) == Decimal("87.8325")


def test_no_gcp_on_demand_offer_below_0_8x_its_us_central1_price(built):
    catalog = load_catalog()
    ref = reference_prices(catalog.offers)
    gcp = [o for o in catalog.offers if o.cloud == "gcp" and o.on_demand_price_per_hour_usd is not None]
    checked = [o for o in gcp if (o.instance_type, o.gpu, o.gpu_count) in ref]
    assert len(checked) > 500
    low = [
        o
        for o in checked
        if o.on_demand_price_per_hour_usd < MIN_FRACTION_OF_REFERENCE * ref[(o.instance_type, o.gpu, o.gpu_count)]
    ]
    assert low == []
    dropped = built[3].dropped["gcp on-demand price without a cited source (on-demand dropped)"]
    print(f"GCP on-demand prices dropped for want of a cited source: {dropped}")
    assert (
        dropped
        == catalog.meta["dropped_on_build"]["gcp on-demand price without a cited source (on-demand dropped)"]
        == 25
    )


def test_machines_without_a_cited_on_demand_price_have_none():
    catalog = load_catalog()
    for itype in ("a3-ultragpu-8g", "a4-highgpu-8g"):  # sold as spot / flex-start / reservation only
        offers = [o for o in catalog.offers if o.instance_type == itype]
        assert offers and all(o.on_demand_price_per_hour_usd is None for o in offers)
        assert all(o.spot_price_per_hour_usd is not None for o in offers)
    # pricing.yml lists a3-megagpu-8g in 9 regions, not us-central1 (neither on-demand on
    # 2026-08-20 nor spot on 2026-07-30): no price in any market, so no offer there
    assert not any(o.instance_type == "a3-megagpu-8g" and o.region == "us-central1" for o in catalog.offers)
    assert _gcp("a3-megagpu-8g", "us-east4-a").on_demand_price_per_hour_usd is not None


#: ``hour_spot`` figures as printed in Cyclenerd's pricing.yml @fd66b26 (generated
#: 2026-07-30), compute.instance.<type>.cost.<region>; the a3 figures include 16 x 375 GiB
#: of bundled Local SSD at the Spot rate (its build/pricing.pl adds it).
PRICING_YML_2026_07_30_HOUR_SPOT = {
    ("a3-highgpu-8g", "us-central1-a"): "50.6095408219178",
    ("a3-highgpu-8g", "europe-north1-c"): "10.2054766027397",
    ("a3-highgpu-1g", "us-central1-a"): "6.32619260273973",
    ("a3-megagpu-8g", "us-east4-a"): "23.2752366027397",
    ("a2-highgpu-4g", "us-central1-a"): "7.71208",
    ("a2-highgpu-1g", "us-west1-b"): "1.92802",
    ("g2-standard-4", "us-west1-a"): "0.397336",
}


@pytest.mark.parametrize(("itype", "zone"), sorted(PRICING_YML_2026_07_30_HOUR_SPOT))
def test_gcp_spot_is_the_dated_pricing_yml_hour_spot(itype, zone):
    offer = _gcp(itype, zone)
    expected = Decimal(PRICING_YML_2026_07_30_HOUR_SPOT[(itype, zone)]).quantize(Decimal("0.00001"))
    assert offer.spot_price_per_hour_usd == expected
    assert offer.spot_price_date == "2026-07-30"
    assert "spot:cyclenerd-2026-07-30-spot" in offer.price_source


def test_gcp_spot_rows_cite_their_source_and_agree_with_month_spot():
    rows = _snapshot_rows("gcp_spot.csv")
    assert len(rows) == 844
    for r in rows:
        assert r["source_ref"] == (
            "Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml@fd66b26ff84fee5cdd94f341ea89206e76c06b99"
            f" compute.instance.{r['machine_type']}.cost.{r['region']}.hour_spot"
        )
        assert r["source_date"] == "2026-07-30"
        # the file's two independently rounded figures: hour_spot x 730 = month_spot
        assert abs(Decimal(r["spot_price_per_hour_usd"]) * 730 - Decimal(r["spot_price_per_month_usd"])) < Decimal(
            "0.01"
        )


def test_gcp_spot_of_a_priced_type_never_falls_back_to_the_undated_rows(built):
    # types the dated file prices take spot only from it; in a region it lacks, no spot price
    dated = {r["machine_type"] for r in _snapshot_rows("gcp_spot.csv")}
    for o in load_catalog().offers:
        if o.cloud == "gcp" and o.instance_type in dated and o.spot_price_per_hour_usd is not None:
            assert o.spot_price_date == "2026-07-30", o
    assert built[3].dropped["gcp spot price without a dated source for the region (spot dropped)"] == 5


def test_gcp_spot_of_n1_attached_gpus_is_host_row_plus_gpu_row_undated():
    gcp = _snapshot_rows("gcp_vms.csv")
    host = next(r for r in gcp if r["InstanceType"] == "n1-standard-8" and r["AvailabilityZone"] == "us-central1-a")
    gpu = next(
        r
        for r in gcp
        if not r["InstanceType"]
        and r["AcceleratorName"] == "T4"
        and r["AcceleratorCount"] == "1"
        and r["AvailabilityZone"] == "us-central1-a"
    )
    t4 = next(
        o
        for o in load_catalog().offers
        if o.instance_type == "n1-standard-8" and o.gpu == "T4" and o.gpu_count == 1 and o.zone == "us-central1-a"
    )
    assert t4.spot_price_per_hour_usd == Decimal(host["SpotPrice"]) + Decimal(gpu["SpotPrice"])
    assert t4.spot_price_date == "undated (imported 2026-11-22)"


def test_n1_gpu_on_demand_is_host_row_plus_gpu_row():
    gcp = _snapshot_rows("gcp_vms.csv")
    host = next(r for r in gcp if r["InstanceType"] == "n1-standard-8" and r["AvailabilityZone"] == "us-central1-a")
    gpu = next(
        r
        for r in gcp
        if not r["InstanceType"]
        and r["AcceleratorName"] == "T4"
        and r["AcceleratorCount"] == "1"
        and r["AvailabilityZone"] == "us-central1-a"
    )
    t4 = next(
        o
        for o in load_catalog().offers
        if o.instance_type == "n1-standard-8" and o.gpu == "T4" and o.gpu_count == 1 and o.zone == "us-central1-a"
    )
    assert t4.on_demand_price_per_hour_usd == Decimal(host["Price"]) + Decimal(gpu["Price"])
    assert Decimal(gpu["Price"]) == Decimal("0.35")  # T4 on-demand per GPU-hour, us-central1
    assert t4.price_source == "on-demand:skypilot-v8-gcp;spot:skypilot-v8-gcp"


def test_missing_price_is_not_offered_never_zero():
    p5e = [o for o in load_catalog().offers if o.instance_type == "p5e.48xlarge"]
    assert p5e, "p5e rows carry spot prices and must stay in the catalog"
    assert all(o.on_demand_price_per_hour_usd is None for o in p5e)  # Capacity Blocks only
    assert all(o.spot_price_per_hour_usd is not None and o.spot_price_per_hour_usd > 0 for o in p5e)
    no_spot_rows = [r for r in _snapshot_rows("aws_vms.csv") if not r["SpotPrice"]]
    neither = [r for r in no_spot_rows if not r["Price"]]
    assert (len(no_spot_rows), len(neither)) == (43, 5)  # 5 p5e rows carry no price at all
    above = [
        r
        for r in _snapshot_rows("aws_vms.csv")
        if r["SpotPrice"] and r["Price"] and Decimal(r["SpotPrice"]) > Decimal(r["Price"]) > 0
    ]
    assert len(above) == 16  # spot above on-demand: the spot price is dropped
    # a dated regional spot range gives a spot price to rows the snapshot left without one
    ranged = {(r["instance_type"], r["region"]) for r in _snapshot_rows("aws_spot_range.csv")}
    unranged = [r for r in no_spot_rows + above if (r["InstanceType"], r["Region"]) not in ranged]
    catalog_no_spot = [o for o in load_catalog().offers if o.cloud == "aws" and o.spot_price_per_hour_usd is None]
    # nothing to rent in a price-less row: dropped, not $0
    assert len(catalog_no_spot) == len([r for r in unranged if r["Price"]]) == 20
    assert all(o.on_demand_price_per_hour_usd > 0 for o in catalog_no_spot)


def test_spot_equal_to_on_demand_is_flagged_and_never_above():
    offers = load_catalog().offers
    flagged = [o for o in offers if o.spot_not_discounted]
    assert flagged and all(o.spot_price_per_hour_usd == o.on_demand_price_per_hour_usd for o in flagged)
    assert not any(
        o.spot_price_per_hour_usd > o.on_demand_price_per_hour_usd
        for o in offers
        if o.spot_price_per_hour_usd is not None and o.on_demand_price_per_hour_usd is not None
    )


def test_every_offer_names_sources_that_the_catalog_describes():
    catalog = load_catalog()
    described = catalog.meta["price_sources"]
    assert set(described) == {
        "skypilot-v8-aws",
        "skypilot-v8-gcp",
        "cyclenerd-2026-08-20",
        "cyclenerd-2026-07-30-spot",
        "vantage-2025-11-30-spot",
    }
    assert described["cyclenerd-2026-08-20"]["date"].startswith("2026-08-20")
    from gpuinfra.catalog.model import price_source_keys

    assert all(price_source_keys(o.price_source) <= set(described) and o.price_source for o in catalog.offers)


@pytest.mark.parametrize(
    ("zone_id", "local"),
    [
        ("use1-az1", False),
        ("usw2-az4", False),
        ("apse3-az3", False),
        ("usw2-lax1-az1", True),
        ("use1-atl2-az1", True),
        ("use1-wl1-bos-wlz1", True),
    ],
)
def test_local_zone_detection(zone_id, local):
    assert is_local_zone(zone_id) is local


def test_local_zone_rows_are_kept_and_marked():
    local = {o.zone for o in load_catalog().offers if o.local_zone}
    assert local == {"usw2-lax1-az1", "usw2-lax1-az2", "use1-atl2-az1"}


def test_float_noise_is_rounded_away():
    assert parse_price("21.957642") == parse_price("21.95764") == Decimal("21.95764")
    assert parse_price("") is None and parse_price(None) is None


def test_n1_guest_accelerators_respect_host_limits():
    # T4 x1 allows at most 48 vCPUs / 312 GB (cloud.google.com/compute/docs/gpus#n1-gpus)
    t4 = {o.instance_type for o in load_catalog().offers if o.gpu == "T4" and o.gpu_count == 1 and o.cloud == "gcp"}
    assert t4 == {"n1-standard-4", "n1-standard-8", "n1-standard-16", "n1-standard-32", "n1-highmem-8", "n1-highmem-16"}
    v100_1 = {
        o.instance_type for o in load_catalog().offers if o.gpu == "V100" and o.gpu_count == 1 and o.cloud == "gcp"
    }
    assert v100_1 == {"n1-standard-4", "n1-standard-8", "n1-highmem-8"}  # <= 12 vCPUs, <= 78 GB
    assert all(
        o.accelerator_type == "nvidia-tesla-t4" for o in load_catalog().offers if o.gpu == "T4" and o.cloud == "gcp"
    )


def test_memory_variants_are_distinct_models():
    catalog = load_catalog()
    p4de = {o.gpu for o in catalog.offers if o.instance_type == "p4de.24xlarge"}
    p4d = {o.gpu for o in catalog.offers if o.instance_type == "p4d.24xlarge"}
    assert p4de == {"A100-80GB"} and p4d == {"A100"}
    assert {o.gpu for o in catalog.offers if o.instance_type == "p3dn.24xlarge"} == {"V100-32GB"}
    mega = {(o.gpu, o.accelerator_type) for o in catalog.offers if o.instance_type == "a3-megagpu-8g"}
    assert mega == {("H100", "nvidia-h100-mega-80gb")}


#: Linux spot_min / spot_avg / spot_max and pct_interrupt as printed in tsaol/aws-gpu
#: data/gpu_instances_raw.json @2d0108c (Vantage extract, 2025-11-30), pricing.us-east-1.linux.
GPU_INSTANCES_RAW_2025_11_30_US_EAST_1 = {
    "p5.48xlarge": ("13.2182", "28.106467", "52.0766", "5-10%"),
    "p4d.24xlarge": ("8.0468", "8.59075", "9.1506", ">20%"),
    "p5en.48xlarge": ("17.1932", "17.50195", "17.8107", "10-15%"),
    "g5.xlarge": ("0.3837", "0.39388", "0.4034", ">20%"),
}


@pytest.mark.parametrize("itype", sorted(GPU_INSTANCES_RAW_2025_11_30_US_EAST_1))
def test_aws_spot_budgets_on_the_dated_regional_maximum(itype):
    lo, _avg, hi, band = GPU_INSTANCES_RAW_2025_11_30_US_EAST_1[itype]
    offers = [o for o in load_catalog().offers if o.instance_type == itype and o.region == "us-east-1"]
    assert offers
    for o in offers:  # every AZ of the region: the one regional range, dated
        assert o.spot_price_per_hour_usd == Decimal(hi)
        assert (o.spot_price_min_per_hour_usd, o.spot_price_max_per_hour_usd) == (Decimal(lo), Decimal(hi))
        assert o.spot_price_date == "2025-11-30"
        assert o.spot_interruption_band == band
        assert o.price_source == "on-demand:skypilot-v8-aws;spot:vantage-2025-11-30-spot"


def test_aws_snapshot_spot_outside_the_dated_range_is_counted(built):
    # the snapshot's p4d use1-az1 spot (2.4655) is 69% below the dated minimum 8.0468
    row = next(
        r
        for r in _snapshot_rows("aws_vms.csv")
        if r["InstanceType"] == "p4d.24xlarge" and r["AvailabilityZone"] == "use1-az1"
    )
    assert Decimal(row["SpotPrice"]) < Decimal("8.0468")
    assert built[3].dropped["aws undated spot price outside the dated regional range (replaced)"] > 0


def test_aws_spot_without_a_dated_range_keeps_the_snapshot_point_undated():
    ranged = {(r["instance_type"], r["region"]) for r in _snapshot_rows("aws_spot_range.csv")}
    undated = [
        o
        for o in load_catalog().offers
        if o.cloud == "aws" and o.spot_price_per_hour_usd is not None and (o.instance_type, o.region) not in ranged
    ]
    assert undated
    assert all(
        o.spot_price_date == "undated (imported 2026-11-22)" and o.spot_price_max_per_hour_usd is None for o in undated
    )
