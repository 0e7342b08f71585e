"""The catalog gates refuse the snapshot's known defects (DWS-as-on-demand, spot above
on-demand, zero prices), and a catalog that fails them is never written."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuinfra.catalog.build import write_catalog
from gpuinfra.catalog.gates import gate_failures
from gpuinfra.catalog.model import Offer
from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import CatalogGateError


def _offer(cloud="gcp", itype="a2-highgpu-4g", region="us-central1", od="14.69354", spot="7.22", zone=None):
    return Offer(
        cloud=cloud,
        instance_type=itype,
        gpu="A100",
        gpu_count=4,
        vcpus=48,
        memory_gib=340,
        region=region,
        zone=zone or f"{region}-a",
        on_demand_price_per_hour_usd=None if od is None else Decimal(od),
        spot_price_per_hour_usd=None if spot is None else Decimal(spot),
        price_source="all:test",
    )


def test_the_snapshots_dws_price_fails_the_us_central1_gate():
    # europe-west4 a2-highgpu-4g as the old snapshot had it: host 3.25624 + 4 x 1.61365 (DWS) = 9.71
    failures = gate_failures([_offer(), _offer(region="europe-west4", od="9.71084", spot="5.95")])
    assert failures == [
        "gcp-on-demand-vs-us-central1: gcp a2-highgpu-4g 4xA100 europe-west4-a on-demand "
        "9.71084 < 0.8 x 14.69354 (us-central1 or the median region)"
    ]
    # 0.8 x 14.69354 = 11.754832: just above passes
    assert gate_failures([_offer(), _offer(region="europe-west4", od="11.75484", spot="5.95")]) == []


def test_gcp_on_demand_below_its_spot_fails():
    assert gate_failures([_offer(od="14.69354", spot="15")])[0].startswith("gcp-on-demand-not-below-spot:")


def test_aws_spot_above_on_demand_fails_and_equal_passes():
    above = _offer(cloud="aws", itype="p4d.24xlarge", region="us-east-1", od="21.95764", spot="22", zone="use1-az1")
    equal = _offer(
        cloud="aws", itype="p4d.24xlarge", region="us-east-1", od="21.95764", spot="21.95764", zone="use1-az2"
    )
    assert [f.split(":")[0] for f in gate_failures([above, equal])] == ["aws-spot-not-above-on-demand"]


def test_a_machine_without_a_us_central1_price_is_gated_on_its_median_region():
    # a3-megagpu-8g on-demand as Cyclenerd pricing.yml @dac31281 (2026-08-20) lists it: no
    # us-central1 row; us-east4 92.93759, us-east5 94.06664, europe-west1 102.19465
    rows = [
        _offer(itype="a3-megagpu-8g", region="us-east4", od="92.93759", spot="17.48883"),
        _offer(itype="a3-megagpu-8g", region="us-east5", od="94.06664", spot="20.78479"),
        _offer(itype="a3-megagpu-8g", region="europe-west1", od="102.19465", spot="23.61153"),
    ]
    assert gate_failures(rows) == []
    # a DWS-like price at half the median (94.06664) is caught: 47.0 < 0.8 x 94.06664 = 75.253312
    dws = _offer(itype="a3-megagpu-8g", region="us-west4", od="47.0", spot="17")
    failures = gate_failures([*rows, dws])
    # the median of 4 regions (47.0, 92.93759, 94.06664, 102.19465) is 93.502115
    assert failures == [
        "gcp-on-demand-vs-us-central1: gcp a3-megagpu-8g 4xA100 us-west4-a on-demand 47.0 < "
        "0.8 x 93.502115 (us-central1 or the median region)"
    ]


def test_aws_spot_below_a_tenth_of_on_demand_fails():
    # AWS sells spot "at up to a 90% discount" (aws.amazon.com/ec2/spot/): p4d.24xlarge
    # on-demand 21.95764 -> the floor is 2.195764
    def aws(spot, zone="use1-az1"):
        return _offer(cloud="aws", itype="p4d.24xlarge", region="us-east-1", od="21.95764", spot=spot, zone=zone)

    low = gate_failures([aws("2.1")])
    assert low == [
        "aws-spot-not-below-10-percent-of-on-demand: aws p4d.24xlarge 4xA100 use1-az1 spot 2.1 < "
        "0.1 x on-demand 21.95764"
    ]
    # 11% of on-demand (the snapshot's use1-az1 2.4655) passes; 4-decimal rounding under the floor passes
    assert gate_failures([aws("2.4655"), aws("2.1957", zone="use1-az2")]) == []


def test_the_build_drops_aws_spot_below_the_floor_and_counts_it():
    from gpuinfra.catalog.build import BuildReport, normalize_aws

    def row(spot):
        return {
            "InstanceType": "p4d.24xlarge", "AcceleratorName": "A100", "AcceleratorCount": "8", "vCPUs": "96",
            "MemoryGiB": "1152", "GpuInfo": "", "Price": "21.95764", "SpotPrice": spot, "Region": "us-east-1",
            "AvailabilityZone": "use1-az1",
        }  # fmt: skip

    report = BuildReport()
    kept = normalize_aws([row("2.0"), row("2.4655")], report)
    assert [o.spot_price_per_hour_usd for o in kept] == [None, Decimal("2.4655")]
    assert report.dropped == {"aws spot price below 10% of on-demand, AWS's largest spot discount (spot dropped)": 1}


@pytest.mark.parametrize("field", ["od", "spot"])
def test_zero_price_fails(field):
    kwargs = {"od": "14.69354", "spot": "7.22", field: "0"}
    assert any(f.startswith("price-positive:") for f in gate_failures([_offer(**kwargs)]))


def test_failing_catalog_is_not_written(tmp_path):
    catalog = load_catalog()
    bad = list(catalog.offers) + [_offer(region="europe-west4", od="9.71084", spot="5.95")]
    with pytest.raises(CatalogGateError, match="gcp-on-demand-vs-us-central1"):
        write_catalog(tmp_path, bad, list(catalog.facts.values()), dict(catalog.meta))
    assert list(tmp_path.iterdir()) == []


def test_shipped_catalog_passes_every_gate():
    assert gate_failures(load_catalog().offers) == []


def test_the_old_snapshots_on_demand_fails_against_the_cited_us_central1_prices():
    # the old build priced GCP on-demand as host row + GPU row of gcp_vms.csv; in us-central1
    # a3-highgpu-8g came to $43.07 (DWS GPU SKU). Against itself it passed; against the shipped
    # catalog's cited us-central1 price ($88.49) it fails.
    import csv

    from gpuinfra.catalog.gates import reference_prices
    from tests.conftest import SNAPSHOT_DIR

    with open(SNAPSHOT_DIR / "gcp_vms.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    host = next(r for r in rows if r["InstanceType"] == "a3-highgpu-8g" and r["AvailabilityZone"] == "us-central1-a")
    gpu = next(
        r
        for r in rows
        if not r["InstanceType"]
        and r["AcceleratorName"] == "H100"
        and r["AcceleratorCount"] == "8"
        and r["AvailabilityZone"] == "us-central1-a"
    )
    old = Decimal(host["Price"]) + Decimal(gpu["Price"])
    assert old.quantize(Decimal("0.01")) == Decimal("43.07")
    offer = Offer(
        cloud="gcp",
        instance_type="a3-highgpu-8g",
        gpu="H100",
        gpu_count=8,
        vcpus=208,
        memory_gib=1872,
        region="us-central1",
        zone="us-central1-a",
        on_demand_price_per_hour_usd=old,
        spot_price_per_hour_usd=None,
        price_source="all:test",
    )
    assert gate_failures([offer]) == []  # a price cannot be checked against itself
    failures = gate_failures([offer], reference_prices(load_catalog().offers))
    assert len(failures) == 1 and failures[0].startswith(
        "gcp-on-demand-vs-us-central1: gcp a3-highgpu-8g 8xH100 us-central1-a"
    )
