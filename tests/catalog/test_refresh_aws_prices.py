"""`catalog refresh --cloud aws` prices the non-compute tables from the Price List API: real boto3
against moto (EC2) and a stand-in of the GetProducts endpoint that honours the filters it is sent.

The shipped book has no NAT data price in eu-north-1 (docs/prices.md lists the gap), so the
default 8xH100 spot stack there has no total until a refresh reads one.
"""

from __future__ import annotations

import copy
import json
import shutil
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from gpuinfra.catalog.prices import REFRESHED_PRICES_FILE, price
from gpuinfra.catalog.refresh_aws_prices import GET_PRODUCTS_DOC, QUERIES
from gpuinfra.catalog.store import PACKAGE_DATA_DIR
from gpuinfra.errors import CatalogError
from gpuinfra.services.catalog_refresh import refresh_catalog
from tests.catalog.price_list_standin import PriceListStandIn
from tests.catalog.test_refresh import _factory

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


def _products() -> list[dict]:
    tables = json.loads((FIXTURES / "aws_pricing_price_tables.json").read_text())["products"]
    compute = json.loads((FIXTURES / "aws_pricing_get_products_us-east-1.json").read_text())["PriceList"]
    return tables + [json.loads(text) for text in compute]


def _refresh(moto_url, products, out: Path, regions, **standin):
    with PriceListStandIn(products, **standin) as price_list:
        result = refresh_catalog(
            ["aws"], out_dir=out, regions=regions, aws_factory=_factory(moto_url, price_list.url), now=NOW
        )
    return result, [json.loads(body or b"{}") for *_, body in price_list.requests]


def _refreshed(out: Path) -> dict:
    return yaml.safe_load((out / REFRESHED_PRICES_FILE).read_text())["aws"]


def _usage(product: dict) -> str:
    return product["product"]["attributes"].get("usagetype", "")


def test_refresh_reads_every_table_of_a_gpu_region(moto_url, tmp_path):
    result, requests = _refresh(moto_url, _products(), tmp_path, ["eu-north-1"])
    # every table's query names the region, its service and its filters
    for query in QUERIES:
        assert any(
            r["ServiceCode"] == query.service_code
            and {"Type": "TERM_MATCH", "Field": query.region_field, "Value": "eu-north-1"} in r["Filters"]
            and all({"Type": "TERM_MATCH", "Field": f, "Value": v} in r["Filters"] for f, v in query.filters)
            for r in requests
        ), query.key
    tables = _refreshed(tmp_path)
    assert sorted(tables) == sorted(q.key for q in QUERIES)
    values = {key: Decimal(str(t["prices"][0]["regions"]["eu-north-1"])) for key, t in tables.items()}
    # NAT data: the NatGateway-Bytes product, not the Regional NAT gateway's 0.092 beside it
    assert values["nat_gateway_per_gb"] == Decimal("0.046")
    # gp3 throughput: 42.8032 per GiBps-mo / 1024 = the shipped 0.0418 per MiB/s-month
    assert values["ebs_gp3_throughput_per_mibps_month"] == Decimal("0.0418")
    # tiered: S3 Standard's first 50 TB (not 0.022 / 0.021), egress's first 10 TB (not 0.085 ...)
    assert values["s3_standard_per_gb_month"] == Decimal("0.023")
    assert values["internet_egress_per_gb"] == Decimal("0.09")
    # one price to every destination region (two in the stand-in), not CloudFront's or the internet's
    assert values["inter_region_transfer_per_gb"] == Decimal("0.02")
    # per request x 1,000,000; arm64 duration's first tier
    assert values["lambda_requests_per_million"] == Decimal("0.2")
    assert values["lambda_duration_arm_per_gb_second"] == Decimal("0.0000133334")
    assert values["ec2_m7g_large_per_hour"] == Decimal("0.0867")
    group = tables["nat_gateway_per_gb"]["prices"][0]
    assert group["source"] == f"{GET_PRODUCTS_DOC} (AWS Price List GetProducts via gpuinfra catalog refresh, AmazonEC2)"
    assert group["date"] == "2026-11-20"  # the products' publicationDate, not the refresh day
    assert "AWSDataTransfer" in tables["internet_egress_per_gb"]["prices"][0]["source"]
    assert (
        f"  aws prices: {len(QUERIES)} of {len(QUERIES)} region x table pairs (regions with a GPU offer)"
        in result.summary_lines()
    )
    assert not [w for w in result.warnings if w.startswith("aws price")]


def _costed(run_cli, project: Path, name: str) -> dict:
    result = run_cli("cost", name, "--json", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["price_not_found"] == [] and doc["run_usd"] is not None
    return doc


def _nat_data(doc: dict) -> dict:
    (line,) = [x for x in doc["lines"] if x["component"].startswith("NAT data processed")]
    return line


def test_refreshed_folder_gives_an_eu_north_1_p5_stack_a_total(moto_url, tmp_path, monkeypatch, run_cli):
    project = tmp_path / "project"
    # the default spot pick, made with the shipped catalog: no total without a NAT data price
    made = run_cli("new", "--gpus", "8xH100", "--cloud", "aws", "--spot", "--project-dir", str(project))
    assert made.exit_code == 0, made.stderr
    assert "(aws eu-north-1), spot" in made.stdout
    assert "(no NAT gateway price for eu-north-1); `gpuinfra catalog refresh --cloud aws` reads it" in made.stderr
    before = run_cli("cost", "aws-8xh100", "--project-dir", str(project))
    assert before.exit_code == 4
    assert "`gpuinfra catalog refresh --cloud aws` reads it from the AWS Price List" in before.stderr + before.stdout

    refreshed = tmp_path / "refreshed"
    _refresh(moto_url, _products(), refreshed, ["eu-north-1"])
    # the whole refreshed folder in use (XDG): on-demand p5 from the Price List stand-in, tables too
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    shutil.copytree(refreshed, tmp_path / "xdg" / "gpuinfra" / "catalog")
    made = run_cli(
        "new",
        "--gpus",
        "8xH100",
        "--cloud",
        "aws",
        "--region",
        "eu-north-1",
        "--name",
        "od",
        "--project-dir",
        str(project),
    )
    assert made.exit_code == 0, made.stderr
    doc = _costed(run_cli, project, "od")
    assert Decimal(_nat_data(doc)["unit_price_usd"]) == Decimal("0.046")
    assert _nat_data(doc)["price_source"].startswith(GET_PRODUCTS_DOC)

    # moto's spot history answers $0.00001 for every type (dropped below 10% of on-demand), so the
    # spot stack is costed on the shipped offers with the refreshed tables beside them
    spot_folder = tmp_path / "spot-catalog"
    shutil.copytree(PACKAGE_DATA_DIR, spot_folder)
    shutil.copy(refreshed / REFRESHED_PRICES_FILE, spot_folder / REFRESHED_PRICES_FILE)
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(spot_folder))
    doc = _costed(run_cli, project, "aws-8xh100")
    assert doc["pricing"] == "spot" and Decimal(doc["run_usd"]) > 0
    assert _nat_data(doc)["price_date"] == "2026-11-20"


def _fault_products() -> list[dict]:
    """eu-north-1's products, plus us-west-2 copies with one fault per table."""
    base = _products()
    by_usage = {_usage(p).removeprefix("EUN1-"): p for p in base if _usage(p).startswith("EUN1-")}

    def west(usage: str) -> dict:
        p = copy.deepcopy(by_usage[usage])
        attributes = p["product"]["attributes"]
        attributes["usagetype"] = "USW2-" + usage
        attributes["regionCode" if "regionCode" in attributes else "fromRegionCode"] = "us-west-2"
        return p

    def dimension(p: dict) -> dict:
        (term,) = p["terms"]["OnDemand"].values()
        return next(iter(term["priceDimensions"].values()))

    tiered = west("NatGateway-Bytes")  # a tier where the table has one flat price
    first = dimension(tiered)
    (term,) = tiered["terms"]["OnDemand"].values()
    term["priceDimensions"]["next"] = {**first, "beginRange": "10240", "endRange": "Inf"}
    first["endRange"] = "10240"
    zero = west("NatGateway-Hours")
    dimension(zero)["pricePerUnit"]["USD"] = "0.0000000000"
    one, two = west("EBS:VolumeUsage.gp3"), west("EBS:VolumeUsage.gp3")
    dimension(two)["pricePerUnit"]["USD"] = "0.0800000000"
    hourly = west("EBS:VolumeP-IOPS.gp3")
    dimension(hourly)["unit"] = "IOPS-Hrs"
    # two destinations, two prices: the table's one price per source region is ambiguous
    to_ireland, to_virginia = west("EU-AWS-Out-Bytes"), west("USE1-AWS-Out-Bytes")
    dimension(to_virginia)["pricePerUnit"]["USD"] = "0.0100000000"
    # no other us-west-2 product: its other tables are a missing region
    return base + [tiered, zero, one, two, hourly, to_ireland, to_virginia]


def test_ambiguous_answers_leave_the_pair_unpriced_with_a_warning(moto_url, tmp_path, monkeypatch):
    result, _ = _refresh(moto_url, _fault_products(), tmp_path, ["eu-north-1", "us-west-2"])
    warnings = {w.split(" left unpriced: ")[0]: w.split(" left unpriced: ")[1] for w in result.warnings}
    assert warnings["aws price nat_gateway_per_gb in us-west-2"] == "first tier ends at 10240, expected Inf"
    assert warnings["aws price nat_gateway_per_hour in us-west-2"] == "price '0.0000000000' is not above zero"
    assert warnings["aws price ebs_gp3_per_gb_month in us-west-2"] == "different prices: 0.08, 0.0836"
    assert warnings["aws price ebs_gp3_iops_per_month in us-west-2"] == "unit 'IOPS-Hrs', expected 'IOPS-Mo'"
    assert warnings["aws price inter_region_transfer_per_gb in us-west-2"] == "different prices: 0.01, 0.02"
    assert warnings["aws price s3_standard_per_gb_month in us-west-2"] == (
        "no AmazonS3 product with usage type TimedStorage-ByteHrs in us-west-2"
    )
    assert len([w for w in warnings if w.endswith("in us-west-2")]) == len(QUERIES)
    n = len(QUERIES)
    assert f"  aws prices: {n} of {2 * n} region x table pairs (regions with a GPU offer)" in result.summary_lines()
    assert all("us-west-2" not in t["prices"][0]["regions"] for t in _refreshed(tmp_path).values())
    # in use, an unpriced pair keeps its shipped price (or none), never $0
    unpriced = [
        ("aws", key, "us-west-2") for key in ("nat_gateway_per_hour", "nat_gateway_per_gb", "s3_standard_per_gb_month")
    ]
    shipped = [price(*pair) for pair in unpriced]
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(tmp_path))
    assert [price(*pair) for pair in unpriced] == shipped
    assert price("aws", "nat_gateway_per_hour", "us-west-2").source.startswith("https://github.com/mooncitizen/togen")
    assert price("aws", "nat_gateway_per_gb", "eu-north-1").usd == Decimal("0.046")


def test_a_price_list_error_writes_nothing(moto_url, tmp_path):
    # compute prices answer; the S3 table's query is refused (a documented GetProducts error)
    with pytest.raises(CatalogError, match="AWS refresh failed: .*AccessDeniedException"):
        _refresh(
            moto_url,
            _products(),
            tmp_path,
            ["eu-north-1"],
            error=(400, "AccessDeniedException"),
            error_service="AmazonS3",
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("missing", "advice"),
    [
        # an AWS region's table gap: the refresh reads it
        ("c-nat-gw: NAT data processed (no NAT gateway price for eu-north-1)", True),
        ("c-fleet: EBS gp3 storage (no gp3 price for me-central-1)", True),
        # a GCP region (no "-<digit>" at the end) and an AWS compute gap are not Price List tables
        ("c-nat: Cloud NAT data processed (no NAT price for europe-north1)", False),
        ("c-fleet: Instance usage (on-demand, p4d.24xlarge) (no catalog offer for p4d.24xlarge in use1-az9)", False),
    ],
)
def test_the_missing_price_advice_names_the_refresh_for_aws_table_gaps_only(missing, advice):
    from gpuinfra.cost.report import AWS_PRICE_REFRESH_HINT, fill_advice

    assert fill_advice({"price_not_found": [missing]}) == (AWS_PRICE_REFRESH_HINT if advice else "")
