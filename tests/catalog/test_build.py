"""The shipped catalog is exactly what the build makes from the snapshot, and the build handles
the snapshot's known defects on purpose."""

from __future__ import annotations

import csv
from decimal import Decimal

import pytest

from gpuinfra.catalog.build import build_from_snapshot, is_local_zone, write_catalog
from gpuinfra.catalog.model import parse_price
from gpuinfra.catalog.store import PACKAGE_DATA_DIR, load_catalog
from tests.conftest import SNAPSHOT_DIR


@pytest.fixture(scope="module")
def built():
    return build_from_snapshot(SNAPSHOT_DIR)


def test_shipped_catalog_equals_a_fresh_build(built, tmp_path):
    offers, facts, meta = built
    write_catalog(tmp_path, offers, facts, meta)
    for name in ("offers.csv", "instance_types.json", "catalog.json"):
        assert (tmp_path / name).read_text() == (PACKAGE_DATA_DIR / name).read_text(), name


def _snapshot_rows(name):
    with open(SNAPSHOT_DIR / name, newline="") as f:
        return list(csv.DictReader(f))


def test_gcp_machine_price_is_host_row_plus_gpu_row_of_the_same_zone():
    gcp = _snapshot_rows("gcp_vms.csv")
    host = {r["AvailabilityZone"]: r for r in gcp if r["InstanceType"] == "a2-highgpu-4g"}
    gpu = {r["AvailabilityZone"]: r for r in gcp if r["AcceleratorName"] == "A100" and r["AcceleratorCount"] == "4" and not r["InstanceType"]}
    offers = [o for o in load_catalog().offers if o.instance_type == "a2-highgpu-4g"]
    assert len(offers) == len(set(host) & set(gpu)) == 19
    for o in offers:
        assert o.on_demand_price_per_hour_usd == Decimal(host[o.zone]["Price"]) + Decimal(gpu[o.zone]["Price"])
        assert o.host_on_demand_price_per_hour_usd == Decimal(host[o.zone]["Price"])
        assert o.accelerator_on_demand_price_per_hour_usd == Decimal(gpu[o.zone]["Price"])
    central = next(o for o in offers if o.zone == "us-central1-a")
    assert central.on_demand_price_per_hour_usd == Decimal("14.69354")  # 2.95791 + 11.73563


def test_missing_price_is_not_offered_never_zero():
    p5e = [o for o in load_catalog().offers if o.instance_type == "p5e.48xlarge"]
    assert p5e, "p5e rows carry spot prices and must stay in the catalog"
    assert all(o.on_demand_price_per_hour_usd is None for o in p5e)  # Capacity Blocks only
    assert all(o.spot_price_per_hour_usd is not None and o.spot_price_per_hour_usd > 0 for o in p5e)
    no_spot_rows = [r for r in _snapshot_rows("aws_vms.csv") if not r["SpotPrice"]]
    neither = [r for r in no_spot_rows if not r["Price"]]
    assert (len(no_spot_rows), len(neither)) == (43, 5)  # 5 p5e rows carry no price at all
    catalog_no_spot = [o for o in load_catalog().offers if o.cloud == "aws" and o.spot_price_per_hour_usd is None]
    assert len(catalog_no_spot) == 38  # nothing to rent in the 5 price-less rows: dropped, not $0
    assert all(o.on_demand_price_per_hour_usd > 0 for o in catalog_no_spot)


def test_a4_bundle_with_zero_host_price_is_priced_by_its_gpu_row():
    a4 = [o for o in load_catalog().offers if o.instance_type == "a4-highgpu-8g"]
    assert a4
    for o in a4:
        assert o.host_on_demand_price_per_hour_usd == 0
        assert o.on_demand_price_per_hour_usd == o.accelerator_on_demand_price_per_hour_usd > 0


def test_spot_not_below_on_demand_is_flagged():
    flagged = [o for o in load_catalog().offers if o.spot_not_discounted]
    assert flagged
    # GCP A100-80GB GPU rows with spot above on-demand flag their a2-ultragpu offers even
    # though the host part makes the machine total look discounted
    ultra = [o for o in flagged if o.instance_type.startswith("a2-ultragpu")]
    assert {(o.gpu_count, o.zone) for o in ultra} >= {(1, "us-central1-a"), (2, "europe-west4-a")}
    assert all(o.accelerator_spot_price_per_hour_usd >= o.accelerator_on_demand_price_per_hour_usd for o in ultra)
    aws_flagged = [o for o in flagged if o.cloud == "aws"]
    assert aws_flagged and all(o.spot_price_per_hour_usd >= o.on_demand_price_per_hour_usd for o in aws_flagged)


@pytest.mark.parametrize(
    ("zone_id", "local"),
    [("use1-az1", False), ("usw2-az4", False), ("apse3-az3", False), ("usw2-lax1-az1", True),
     ("use1-atl2-az1", True), ("use1-wl1-bos-wlz1", True)],
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
    v100_1 = {o.instance_type for o in load_catalog().offers if o.gpu == "V100" and o.gpu_count == 1 and o.cloud == "gcp"}
    assert v100_1 == {"n1-standard-4", "n1-standard-8", "n1-highmem-8"}  # <= 12 vCPUs, <= 78 GB
    assert all(o.accelerator_type == "nvidia-tesla-t4" for o in load_catalog().offers if o.gpu == "T4" and o.cloud == "gcp")


def test_memory_variants_are_distinct_models():
    catalog = load_catalog()
    p4de = {o.gpu for o in catalog.offers if o.instance_type == "p4de.24xlarge"}
    p4d = {o.gpu for o in catalog.offers if o.instance_type == "p4d.24xlarge"}
    assert p4de == {"A100-80GB"} and p4d == {"A100"}
    assert {o.gpu for o in catalog.offers if o.instance_type == "p3dn.24xlarge"} == {"V100-32GB"}
    mega = {(o.gpu, o.accelerator_type) for o in catalog.offers if o.instance_type == "a3-megagpu-8g"}
    assert mega == {("H100", "nvidia-h100-mega-80gb")}
