"""Every AWS region with a GPU offer has every non-compute price the stacks ask for.

The regions come from the shipped offer list (offers.csv, AWS, local zones left out); the tables
are the ``aws`` price keys the cost code itself asks for (found in its source, so a new price key
is covered without editing this file). A pair no dated public source prices is listed in
``UNPRICED`` with the reason; such a pair fails closed (the cost exits 4 with "price not found"),
and docs/prices.md names the same gaps. The GCP boot disk of every GCP offer is checked the same
way (``GCP_UNPRICED_BOOT_DISKS``).

The complete-total checks compare a few lines against figures read from a source other than the
one the table cites (named next to each figure).
"""

from __future__ import annotations

import csv
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from gpuinfra.catalog.prices import DATA_DIR, PriceBook, price, price_book
from gpuinfra.catalog.store import load_catalog
from gpuinfra.cost.estimate import GCP_BOOT_DISK_PRICE_KEYS
from gpuinfra.plan.gcp import boot_disk_type

ROOT = Path(__file__).resolve().parents[1]

# The code that turns a stack or an image bake into cost lines.
PRICED_BY = [
    "gpuinfra/cost/estimate.py",
    "gpuinfra/cost/monitoring.py",
    "gpuinfra/bake/cost.py",
    "gpuinfra/locality.py",
]

# (table, regions) no dated public source found on 2026-11-27 prices; never filled from another region.
UNPRICED: dict[str, set[str]] = {
    # the extract (cloudkeep-io/ebs-pricing, 2022-02-10, its last commit) predates both regions;
    # on 2026-11-27 no EUS2- / MEC1-EBS:VolumeUsage.gp3 rate was found in public repositories
    # (the usage types appear only in example Cost Explorer tables, without a rate); the third
    # search found a dated eu-south-2 storage rate only (no IOPS or throughput rate)
    "ebs_gp3_per_gb_month": {"me-central-1"},
    "ebs_gp3_iops_per_month": {"eu-south-2", "me-central-1"},
    "ebs_gp3_throughput_per_mibps_month": {"eu-south-2", "me-central-1"},
    # the AmazonEC2 extract (togen, offer 20260904231117) has no Hong Kong or Jakarta row;
    # APE1- / APS4-NatGateway-Hours appear in no other stored file with a rate (2026-11-27)
    "nat_gateway_per_hour": {"ap-east-1", "ap-southeast-3"},
    # no multi-region extract of <region>-NatGateway-Bytes was found; priced only where one
    # dated figure per region was (us-east-1, us-east-2, us-west-2, ca-central-1, eu-west-1, eu-west-2,
    # eu-west-3, eu-central-1, ap-northeast-1, ap-northeast-2, ap-southeast-1). Searched 2026-11-27:
    # togen's aws.json (all 4 stored versions trim the AmazonEC2 offer to NatGateway-Hours),
    # QuinnyPig/aws-price-watcher (its vpc/ec2 pricing-page feeds carry no NAT gateway rate),
    # Infracost goldens (us-east-1 and sa-east-1 only), the usage type of each region across public
    # repositories (bills and Cost Explorer tables without a rate), and per-region tables (undated,
    # or contradicting the Price List's hour rates); a third search the same day (per-region Price
    # List snapshots committed by cost tools, offer-file extracts with their publication dates, the
    # region prefixes of the usage type) found the four it added and nothing dated for these
    "nat_gateway_per_gb": {
        "af-south-1",
        "ap-east-1",
        "ap-northeast-3",
        "ap-south-1",
        "ap-southeast-2",
        "ap-southeast-3",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "me-central-1",
        "me-south-1",
        "us-west-1",
    },  # fmt: skip
    # inter-region rates depend on the destination; only the two cited source->destination
    # figures are in the table (used by the data-locality ranking, not by a stack's cost)
    "inter_region_transfer_per_gb": {
        "af-south-1",
        "ap-east-1",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-northeast-3",
        "ap-south-1",
        "ap-southeast-1",
        "ap-southeast-2",
        "ap-southeast-3",
        "ca-central-1",
        "eu-central-1",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "eu-west-1",
        "eu-west-3",
        "me-central-1",
        "me-south-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
    },  # fmt: skip
    # image bakes only: the pricing-page feed (aws-price-watcher, 2025-06-13) has no row here
    "ec2_m7i_large_per_hour": {"af-south-1", "ap-east-1", "ap-northeast-3", "eu-south-1", "me-central-1", "me-south-1"},
    "ec2_m7g_large_per_hour": {"eu-south-1"},
    # image bakes only: no multi-region extract of <region>-EBS:SnapshotUsage was found
    "ebs_snapshot_standard_per_gb_month": {
        "af-south-1",
        "ap-east-1",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-northeast-3",
        "ap-south-1",
        "ap-southeast-1",
        "ap-southeast-2",
        "ap-southeast-3",
        "ca-central-1",
        "eu-central-1",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
        "me-central-1",
        "me-south-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
    },  # fmt: skip
}


# (GCP boot disk type, regions of the GCP offers that boot from it) without a dated price in the
# SHIPPED book: none. pd-balanced comes from Cyclenerd pricing.yml; Hyperdisk Balanced (capacity,
# IOPS, throughput) from a dated dump of the Compute Engine Billing Catalog (2026-04-30).
GCP_UNPRICED_BOOT_DISKS: dict[str, set[str]] = {}
#: The 13 regions of the A3 Ultra / A4 offers, which boot from Hyperdisk Balanced.
HYPERDISK_BALANCED_REGIONS = {
    "asia-northeast1",
    "asia-south1",
    "asia-southeast1",
    "europe-north1",
    "europe-west1",
    "europe-west4",
    "us-central1",
    "us-east1",
    "us-east4",
    "us-south1",
    "us-west1",
    "us-west2",
    "us-west3",
}  # fmt: skip


def gpu_regions() -> set[str]:
    """AWS regions with at least one GPU offer in the shipped offer list (local zones left out)."""
    with (DATA_DIR / "offers.csv").open() as fh:
        return {row["region"] for row in csv.DictReader(fh) if row["cloud"] == "aws" and row["local_zone"] != "1"}


def stack_tables(book: PriceBook) -> set[str]:
    """The ``aws`` price keys named in the code that prices stacks and bakes."""
    text = "\n".join((ROOT / path).read_text() for path in PRICED_BY)
    return {key for key in re.findall(r'"([a-z0-9_]+)"', text) if key in book.aws}


def missing_pairs(book: PriceBook, regions: set[str], tables: set[str]) -> dict[str, set[str]]:
    """{table: regions without a price} over ``regions`` x ``tables``."""
    missing = {t: {r for r in regions if book.aws[t].lookup(r) is None} for t in tables}
    return {t: rs for t, rs in missing.items() if rs}


def test_the_offer_list_and_the_code_give_the_expected_scope():
    book = price_book()
    regions, tables = gpu_regions(), stack_tables(book)
    # 23 regions sell a GPU instance in the shipped list; a stack or bake prices 22 AWS tables (2 of them the
    # Spot replacement function's Lambda requests and duration, 2 the job log's CloudWatch Logs ingestion and storage)
    assert len(regions) == 23 and {"us-east-2", "eu-west-2", "ap-southeast-3", "me-central-1"} <= regions
    assert "nat_gateway_per_gb" in tables and "cloudwatch_custom_metric_per_month" in tables
    assert len(tables) == 22 and {"lambda_requests_per_million", "lambda_duration_arm_per_gb_second"} <= tables


def test_every_gpu_region_has_every_price_but_the_listed_gaps():
    book = price_book()
    missing = missing_pairs(book, gpu_regions(), stack_tables(book))
    assert missing == UNPRICED
    priced = len(gpu_regions()) * len(stack_tables(book)) - sum(len(rs) for rs in missing.values())
    assert priced == 437  # of 506; 92 of 414 before the regional tables were filled


def gcp_boot_disk_gaps(book: PriceBook) -> dict[str, set[str]]:
    """{boot disk type: regions without its price} over the GCP offers, each with the boot disk its
    plan chooses (:func:`gpuinfra.plan.gcp.boot_disk_type`)."""
    catalog, gaps = load_catalog(), {}
    with (DATA_DIR / "offers.csv").open() as fh:
        for row in csv.DictReader(fh):
            if row["cloud"] != "gcp":
                continue
            dtype = boot_disk_type(catalog.fact("gcp", row["instance_type"]))
            key = GCP_BOOT_DISK_PRICE_KEYS.get(dtype)
            if key is None or book.gcp[key].lookup(row["region"]) is None:
                gaps.setdefault(dtype, set()).add(row["region"])
    return gaps


def test_every_gcp_boot_disk_has_a_price_but_the_listed_gaps():
    # pd-balanced boots the 30 regions of the other GCP offers and is priced in all of them
    assert gcp_boot_disk_gaps(price_book()) == GCP_UNPRICED_BOOT_DISKS


HYPERDISK_KEYS = (
    "hyperdisk_balanced_per_gib_month",
    "hyperdisk_balanced_iops_per_month",
    "hyperdisk_balanced_throughput_per_mibps_month",
)


def test_hyperdisk_balanced_is_priced_in_every_region_of_its_offers():
    # capacity, IOPS and throughput: the line needs all three wherever the excess is above 0
    book = price_book()
    assert all(
        book.gcp[key].lookup(region) is not None for key in HYPERDISK_KEYS for region in HYPERDISK_BALANCED_REGIONS
    )
    # the Billing Catalog's "Hyperdisk Balanced Capacity / IOPS / Throughput in Iowa" and "... in
    # Eemshaven" SKUs (83FF-9C17-D184, 3EEB-E1E6-C521, 9F5F-0236-9C17; 429B-C30E-15FB,
    # D461-1F2D-5DD1, 398A-C0EE-5BC2), as the dump of 2026-04-30 gives them
    for region, values in (("us-central1", ("0.08", "0.005", "0.04")), ("europe-west4", ("0.084", "0.005", "0.042"))):
        got = tuple(price("gcp", key, region) for key in HYPERDISK_KEYS)
        assert tuple(p.usd for p in got) == tuple(Decimal(v) for v in values)
        assert all(p.date == "2026-04-30" and "6F81-5844-456A" in p.source for p in got)


def test_a_gcp_boot_disk_region_dropped_is_reported():
    doc = yaml.safe_load((DATA_DIR / "prices.yaml").read_text())
    for group in doc["gcp"]["pd_balanced_per_gb_month"]["prices"]:
        (group.get("regions") or {}).pop("us-east4", None)
    for group in doc["gcp"]["hyperdisk_balanced_per_gib_month"]["prices"]:
        (group.get("regions") or {}).pop("us-south1", None)
    gaps = gcp_boot_disk_gaps(PriceBook.model_validate(doc))
    assert gaps == {"pd-balanced": {"us-east4"}, "hyperdisk-balanced": {"us-south1"}}


def test_a_region_dropped_from_a_table_is_reported():
    doc = yaml.safe_load((DATA_DIR / "prices.yaml").read_text())
    for group in doc["aws"]["scheduler_per_million_invocations"]["prices"]:
        (group.get("regions") or {}).pop("us-east-2", None)
    book = PriceBook.model_validate(doc)
    missing = missing_pairs(book, gpu_regions(), stack_tables(book))
    assert missing["scheduler_per_million_invocations"] == {"us-east-2"}


def test_no_price_is_copied_from_another_region():
    # regions that really differ keep their own figure (the AWS Price List values, not us-east-1's)
    assert price("aws", "scheduler_per_million_invocations", "ap-northeast-1").usd == Decimal("1.25")
    assert price("aws", "scheduler_per_million_invocations", "ap-southeast-3").usd == Decimal("2.25")
    assert price("aws", "s3_standard_per_gb_month", "af-south-1").usd == Decimal("0.0274")
    assert price("aws", "internet_egress_per_gb", "af-south-1").usd == Decimal("0.154")
    assert price("aws", "ebs_gp3_per_gb_month", "af-south-1").usd == Decimal("0.1047")
    # eu-south-2's own gp3 rate, neither eu-south-1's 0.0924 nor us-east-1's 0.08
    assert price("aws", "ebs_gp3_per_gb_month", "eu-south-2").usd == Decimal("0.088")
    assert price("aws", "ebs_gp3_iops_per_month", "eu-south-2") is None  # no dated IOPS rate found
    assert price("aws", "nat_gateway_per_hour", "sa-east-1") is None  # no GPU offer there, not filled
    # NAT data processed: each region's own Price List rate, not us-east-1's $0.045 (the hour rates of
    # the same regions in togen's AmazonEC2 offer 20260904231117 are 0.048, 0.062 and 0.059 too)
    assert price("aws", "nat_gateway_per_gb", "eu-west-1").usd == Decimal("0.048")
    assert price("aws", "nat_gateway_per_gb", "ap-northeast-1").usd == Decimal("0.062")
    assert price("aws", "nat_gateway_per_gb", "ap-northeast-2").usd == Decimal("0.059")
    # eu-central-1, eu-west-3, ca-central-1: their hour rates in togen's offer 20260904231117 are 0.052, 0.05, 0.05
    assert price("aws", "nat_gateway_per_gb", "eu-central-1").usd == Decimal("0.052")
    assert price("aws", "nat_gateway_per_gb", "eu-west-3").usd == Decimal("0.05")
    assert price("aws", "nat_gateway_per_gb", "ca-central-1").usd == Decimal("0.05")
    # no dated figure found: not filled from its hour rate (0.046) nor from a neighbour
    assert price("aws", "nat_gateway_per_gb", "eu-north-1") is None


def _cost(run_cli, tmp_path, region: str) -> dict:
    name = f"p5-{region}"
    created = run_cli(
        "new", "--gpus", "8xH100", "--cloud", "aws", "--region", region, "--project-dir", str(tmp_path), "--name", name
    )
    assert created.exit_code == 0, created.stderr
    result = run_cli("cost", name, "--json", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _unit(doc: dict, component: str) -> Decimal:
    (line,) = [line for line in doc["lines"] if line["component"].split(" (")[0] == component]
    return Decimal(line["unit_price_usd"])


@pytest.mark.parametrize("region", ["us-east-2", "eu-west-2", "us-west-2", "ca-central-1"])
def test_a_p5_stack_gets_a_complete_total(run_cli, tmp_path, region):
    doc = _cost(run_cli, tmp_path, region)
    assert doc["price_not_found"] == [] and doc["lines_without_price"] == 0
    assert doc["run_usd"] is not None and Decimal(doc["run_usd"]) > 0
    if region == "us-west-2":
        # dragoncoil2609/tf4-cdo04-repo docs/vpce_vs_nat_cost_notes.md @fc2d8088 (2026-06-25): "AWS Pricing
        # API" for AmazonEC2, US West (Oregon): "USW2-NatGateway-Hours | $0.045 / NAT Gateway-hour",
        # "USW2-NatGateway-Bytes | $0.045 / GB processed"
        assert _unit(doc, "NAT gateway") == Decimal("0.045")
        assert _unit(doc, "NAT data processed") == Decimal("0.045")
    elif region == "eu-west-2":
        # S3 price feed (StephenWetzel/aws_s3_pricing_scraper outputs, 2024-09-25): "EU (London),eu-west-2,0.024"
        assert _unit(doc, "S3 Standard storage") == Decimal("0.024")
        # QuinnyPig/aws-price-watcher processed/datatransfer.json (2025-06): first 10 TB out, EU (London) 0.09
        assert _unit(doc, "Internet egress") == Decimal("0.09")
    elif region == "us-east-2":
        # rajesh.medampudi.com/blog/aws-nat-gateway-hidden-tax: "In us-east-1 (N. Virginia) and us-east-2
        # (Ohio) this is $0.045 per NAT Gateway-hour"; hub.pointfive.co (CER-0325): "$0.045/GB in US East Ohio"
        assert _unit(doc, "NAT gateway") == Decimal("0.045")
        assert _unit(doc, "NAT data processed") == Decimal("0.045")
        # QuinnyPig/aws-price-watcher processed/s3.json (2025-06): "Standard Storage First 50 TB per GB Mo",
        # US East (Ohio) 0.023; processed/datatransfer.json: first 10 TB out, US East (Ohio) 0.09
        assert _unit(doc, "S3 Standard storage") == Decimal("0.023")
        assert _unit(doc, "Internet egress") == Decimal("0.09")


def test_a_p4d_stack_in_eu_central_1_gets_a_complete_total(run_cli, tmp_path):
    # p4d has several network interfaces (EFA), so its nodes leave through a NAT gateway
    args = ("--project-dir", str(tmp_path))
    created = run_cli("new", "--gpus", "8xA100", "--cloud", "aws", "--region", "eu-central-1", "--name", "a", *args)
    assert created.exit_code == 0, created.stderr
    result = run_cli("cost", "a", "--json", *args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["price_not_found"] == [] and doc["lines_without_price"] == 0
    # hamza-sweidan/aws-platform-terraform docs/decisions/0001-no-nat-gateway.md @5aa9034f (dated 2026-09-23):
    # "$0.052/GB through NAT (eu-central-1)", "2 NAT gateways × $0.052 = $0.104/h"
    assert _unit(doc, "NAT data processed") == Decimal("0.052")
    assert _unit(doc, "NAT gateway") == Decimal("0.052")
