"""`gpuinfra catalog refresh`: EC2 against moto served on 127.0.0.1, the Price List API and the
GCP APIs against fixture responses served on 127.0.0.1, all through the real clients."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import boto3
import pytest

from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import CatalogError, MissingDependencyError
from gpuinfra.services.catalog_refresh import refresh_catalog
from tests.conftest import without_aws_credentials
from tests.replay_server import ReplayServer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _fixture(name):
    data = json.loads((FIXTURES / name).read_text())
    data.pop("_about", None)
    return data


@pytest.fixture
def moto_server(moto_url):
    return moto_url


@pytest.fixture
def aws_env(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def _factory(moto_url, pricing_url):
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing")

    def client(service, region):
        return session.client(
            service, region_name=region, endpoint_url=pricing_url if service == "pricing" else moto_url
        )

    return client


def test_aws_refresh_against_moto_and_price_list(moto_server, aws_env, tmp_path):
    pricing = {"FormatVersion": "aws_v1", **_fixture("aws_pricing_get_products_us-east-1.json")}
    with ReplayServer([("POST", "/", "AWSPriceListService.GetProducts", pricing)]) as price_list:
        result = refresh_catalog(
            ["aws"], out_dir=tmp_path, regions=["us-east-1"], aws_factory=_factory(moto_server, price_list.url), now=NOW
        )
        targets = [r[2] for r in price_list.requests]
    # the GPU on-demand query first, then one per non-compute price table (test_refresh_aws_prices.py)
    assert set(targets) == {"AWSPriceListService.GetProducts"}
    body = json.loads(price_list.requests[0][3])
    assert body["ServiceCode"] == "AmazonEC2"
    assert {"Type": "TERM_MATCH", "Field": "regionCode", "Value": "us-east-1"} in body["Filters"]
    catalog = load_catalog(tmp_path)
    aws = [o for o in catalog.offers if o.cloud == "aws"]
    assert result.counts["aws"] == len(aws) > 0
    assert {o.region for o in aws} == {"us-east-1"}
    p4d = [o for o in aws if o.instance_type == "p4d.24xlarge"]
    # moto offers p4d in every us-east-1 AZ ID; on-demand from the Price List fixture
    assert {o.zone for o in p4d} >= {"use1-az1", "use1-az2"}
    assert all(
        o.on_demand_price_per_hour_usd == Decimal("21.95764") and o.gpu == "A100" and o.gpu_count == 8 for o in p4d
    )
    # spot from DescribeSpotPriceHistory: moto answers 0.00001 for every type, below 10% of the
    # p4d's on-demand price (AWS sells spot at up to 90% off): dropped, never kept
    assert all(o.spot_price_per_hour_usd is None for o in p4d)
    # types without a Price List entry keep their spot price and have no on-demand price (never $0)
    g6 = [o for o in aws if o.instance_type == "g6.xlarge"]
    assert g6 and all(o.on_demand_price_per_hour_usd is None for o in g6)
    assert all(o.spot_price_per_hour_usd == Decimal("0.00001") for o in g6)
    # facts come from DescribeInstanceTypes and match the shipped ones
    shipped = load_catalog()
    for itype in ("p4d.24xlarge", "p5.48xlarge", "g5.xlarge", "p5en.48xlarge"):
        fresh, old = catalog.fact("aws", itype), shipped.fact("aws", itype)
        assert (fresh.max_efa_interfaces, fresh.network_cards, fresh.local_ssd.bundled_count) == (
            old.max_efa_interfaces,
            old.network_cards,
            old.local_ssd.bundled_count,
        )
    # the GCP part of the shipped catalog is kept, with its own date
    assert sum(o.cloud == "gcp" for o in catalog.offers) == sum(o.cloud == "gcp" for o in shipped.offers)
    assert catalog.date_for("aws") == "2026-11-22"
    assert catalog.meta["sources"]["gcp"]["date"].startswith("2026-08-20 (on-demand); 2026-07-30 (spot")
    assert "Price List" in catalog.meta["sources"]["aws"]["prices"]


def test_refreshed_catalog_is_used_by_offers(moto_server, aws_env, tmp_path, monkeypatch, run_cli):
    pricing = {"FormatVersion": "aws_v1", **_fixture("aws_pricing_get_products_us-east-1.json")}
    with ReplayServer([("POST", "/", "AWSPriceListService.GetProducts", pricing)]) as price_list:
        refresh_catalog(
            ["aws"], out_dir=tmp_path, regions=["us-east-1"], aws_factory=_factory(moto_server, price_list.url), now=NOW
        )
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(tmp_path))
    result = run_cli("offers", "--gpus", "1xL4", "--cloud", "aws", "--spot", "--json")
    assert result.exit_code == 0, result.stderr
    offers = json.loads(result.stdout)
    assert {o["region"] for o in offers} == {"us-east-1"}
    # the moto spot price of a type without an on-demand price, USD as a 6-place string
    assert offers[0]["spot_price_per_hour_usd"] == "0.000010"


def _gcp_clients(url):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    from gpuinfra.services.catalog_refresh import gcp_clients

    return gcp_clients(
        credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=url), transport="rest"
    )


def _gcp_routes(skus=None):
    """Billing Catalog and Compute routes of the GCP fixtures (``skus``: a modified SKU list)."""
    return [
        ("GET", "/v1/services/6F81-5844-456A/skus", None, skus or _fixture("gcp_billing_skus.json")),
        ("GET", "/compute/v1/projects/demo-project/aggregated/machineTypes", None, _fixture("gcp_machine_types.json")),
        (
            "GET",
            "/compute/v1/projects/demo-project/aggregated/acceleratorTypes",
            None,
            _fixture("gcp_accelerator_types.json"),
        ),
    ]


def test_gcp_refresh_against_billing_and_compute_fixtures(tmp_path):
    routes = _gcp_routes()
    with ReplayServer(routes) as server:
        result = refresh_catalog(
            ["gcp"], out_dir=tmp_path, gcp_project="demo-project", gcp=_gcp_clients(server.url), now=NOW
        )
        paths = sorted(p.split("?")[0] for _, p, _, _ in server.requests)
    assert paths == [
        "/compute/v1/projects/demo-project/aggregated/acceleratorTypes",
        "/compute/v1/projects/demo-project/aggregated/machineTypes",
        "/v1/services/6F81-5844-456A/skus",
    ]
    catalog = load_catalog(tmp_path)
    gcp = {(o.instance_type, o.gpu, o.gpu_count, o.zone): o for o in catalog.offers if o.cloud == "gcp"}
    q = Decimal("0.00001")
    a2 = gcp[("a2-highgpu-4g", "A100", 4, "us-central1-a")]
    # on-demand: "running in" SKUs only; the DWS SKUs (usage type OnDemand too) never price it
    on_demand = Decimal("48") * Decimal("0.031611") + Decimal("340") * Decimal("0.004237") + 4 * Decimal("2.933908")
    assert a2.on_demand_price_per_hour_usd == on_demand.quantize(q) == Decimal("14.69354")
    spot = Decimal("48") * Decimal("0.009483") + Decimal("340") * Decimal("0.001271") + 4 * Decimal("1.4341")
    assert a2.spot_price_per_hour_usd == spot.quantize(q)
    # flex-start: the DWS core, RAM and GPU SKUs, its own market
    flex = Decimal("48") * Decimal("0.015806") + Decimal("340") * Decimal("0.002119") + 4 * Decimal("1.3497")
    assert a2.flex_start_price_per_hour_usd == flex.quantize(q)
    assert a2.price_source == "all:gcp-billing-catalog" and "gcp-billing-catalog" in catalog.meta["price_sources"]
    # A3 Mega priced from the "H100 Mega 80GB GPU" wording, plus 16 x 375 GiB bundled Local SSD at $0.08/GiB-month
    mega = gcp[("a3-megagpu-8g", "H100", 8, "us-central1-a")]
    expected = (
        Decimal("208") * Decimal("0.02908")
        + Decimal("1872") * Decimal("0.003897")
        + 8 * Decimal("11.06")
        + Decimal("6000") * Decimal("0.08") / 730
    )
    assert mega.on_demand_price_per_hour_usd == expected.quantize(q)
    assert mega.spot_price_per_hour_usd is None  # no spot A3Mega/H100 Mega SKU in the fixture: not priced, not $0
    # A4: B200 billed per "(1 gpu slice)"; 32 x 375 GiB bundled Local SSD at the on-demand and Spot VM rates
    a4 = gcp[("a4-highgpu-8g", "B200", 8, "us-central1-a")]
    od = (
        Decimal("224") * Decimal("0.028")
        + Decimal("3968") * Decimal("0.00375")
        + 8 * Decimal("10.5")
        + Decimal("12000") * Decimal("0.08") / 730
    )
    sp = (
        Decimal("224") * Decimal("0.009")
        + Decimal("3968") * Decimal("0.0012")
        + 8 * Decimal("4.2")
        + Decimal("12000") * Decimal("0.048") / 730
    )
    assert (a4.on_demand_price_per_hour_usd, a4.spot_price_per_hour_usd) == (od.quantize(q), sp.quantize(q))
    assert "e2-standard-4" not in {k[0] for k in gcp}  # not a GPU family
    # N1 + T4 only where the accelerator is offered (us-central1-a), within host limits
    t4 = sorted((k[0], k[2]) for k in gcp if k[1] == "T4")
    assert t4 == [("n1-standard-8", 1), ("n1-standard-8", 2), ("n1-standard-8", 4), ("n1-standard-96", 4)]
    t4_1 = gcp[("n1-standard-8", "T4", 1, "us-central1-a")]
    assert t4_1.spot_price_per_hour_usd is None  # no spot N1 core/RAM SKU in the fixture: not priced, not $0
    assert t4_1.flex_start_price_per_hour_usd is None
    assert t4_1.accelerator_type == "nvidia-tesla-t4"
    assert result.counts["gcp"] == len(gcp)
    assert all(o.cloud == "aws" for o in catalog.offers if o.instance_type.startswith("p4d"))


@pytest.mark.parametrize(
    ("description", "usage", "expected"),
    [
        (
            "Nvidia Tesla A100 GPU running in Americas",
            "OnDemand",
            ("on-demand", "nvidia tesla a100 gpu running in americas"),
        ),
        (
            "Nvidia Tesla A100 GPU attached to DWS Defined Duration VMs running in Americas",
            "OnDemand",
            ("flex-start", "nvidia tesla a100 gpu running in americas"),
        ),
        (
            "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Warsaw",
            "Preemptible",
            ("spot", "nvidia tesla t4 gpu running in warsaw"),
        ),
        (
            "Spot Preemptible A2 Instance Core running in Americas",
            "Preemptible",
            ("spot", "a2 instance core running in americas"),
        ),
        (
            "Nvidia B200 (1 gpu slice) running in Americas",
            "OnDemand",
            ("on-demand", "nvidia b200 gpu running in americas"),
        ),
        (
            "Nvidia B200 (1 gpu slice) attached to Spot Preemptible VMs running in Americas",
            "Preemptible",
            ("spot", "nvidia b200 gpu running in americas"),
        ),
        ("Commitment v1: A2 Cpu in Americas for 1 Year", "Commit1Yr", None),
        ("Nvidia H100 80GB GPU running in Americas with calendar mode", "OnDemand", None),
        ("Flex-start Nvidia H100 80GB GPU running in Americas", "OnDemand", None),
    ],
)
def test_sku_market_classification(description, usage, expected):
    from gpuinfra.catalog.refresh_gcp import classify_sku

    assert classify_sku(description, usage) == expected


@pytest.mark.parametrize(
    ("text", "accelerator"),
    [
        ("nvidia h100 80gb gpu running in americas", "nvidia-h100-80gb"),
        ("nvidia h100 80gb mega gpu running in americas", "nvidia-h100-mega-80gb"),
        ("nvidia h100 mega 80gb gpu running in americas", "nvidia-h100-mega-80gb"),
        ("nvidia h100 80gb plus gpu running in americas", "nvidia-h100-mega-80gb"),
        ("nvidia tesla a100 gpu running in americas", "nvidia-tesla-a100"),
        ("nvidia tesla a100 80gb gpu running in americas", "nvidia-a100-80gb"),
        ("nvidia b200 gpu running in americas", "nvidia-b200"),
    ],
)
def test_gpu_sku_patterns_match_one_accelerator(text, accelerator):
    import re

    from gpuinfra.catalog.refresh_gcp import GPU_SKU_PATTERNS

    assert [a for a, pattern in GPU_SKU_PATTERNS.items() if re.search(pattern, text)] == [accelerator]


def test_refresh_that_fails_a_gate_writes_nothing(tmp_path):
    skus = _fixture("gcp_billing_skus.json")
    for sku in skus["skus"]:  # the on-demand A100 SKU at the DWS price: 8.36 vs 14.69354 in the current catalog
        if sku["description"] == "Nvidia Tesla A100 GPU running in Americas":
            sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"] = {
                "currencyCode": "USD",
                "units": "1",
                "nanos": 349700000,
            }
    routes = _gcp_routes(skus)
    with (
        ReplayServer(routes) as server,
        pytest.raises(CatalogError, match="gcp-on-demand-vs-us-central1: gcp a2-highgpu-4g 4xA100 us-central1-a"),
    ):
        refresh_catalog(["gcp"], out_dir=tmp_path, gcp_project="demo-project", gcp=_gcp_clients(server.url), now=NOW)
    assert list(tmp_path.iterdir()) == []


def test_refresh_without_credentials_is_a_clear_error(monkeypatch, tmp_path):
    without_aws_credentials(monkeypatch, tmp_path)
    with pytest.raises(MissingDependencyError, match="no AWS credentials found"):
        refresh_catalog(["aws"])


def test_refresh_cli_exit_code_without_credentials(monkeypatch, run_cli, tmp_path):
    without_aws_credentials(monkeypatch, tmp_path)
    result = run_cli("catalog", "refresh", "--cloud", "aws")
    assert result.exit_code == 6 and result.stderr.startswith("error: no AWS credentials found")


def test_gcp_refresh_needs_a_project():
    with pytest.raises(CatalogError, match="needs --gcp-project"):
        refresh_catalog(["gcp"])


def test_accept_price_cuts_gates_against_the_fresh_prices_only(tmp_path):
    skus = _fixture("gcp_billing_skus.json")
    for sku in skus["skus"]:  # a real 55% cut of the A100 price would fail the default gate
        if sku["description"] == "Nvidia Tesla A100 GPU running in Americas":
            sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"] = {
                "currencyCode": "USD",
                "units": "1",
                "nanos": 349700000,
            }
    routes = _gcp_routes(skus)
    with ReplayServer(routes) as server:
        refresh_catalog(
            ["gcp"],
            out_dir=tmp_path,
            gcp_project="demo-project",
            gcp=_gcp_clients(server.url),
            now=NOW,
            accept_price_cuts=True,
        )
    a2 = next(o for o in load_catalog(tmp_path).offers if o.instance_type == "a2-highgpu-4g")
    assert a2.on_demand_price_per_hour_usd == (
        48 * Decimal("0.031611") + 340 * Decimal("0.004237") + 4 * Decimal("1.3497")
    ).quantize(Decimal("0.00001"))


def test_an_older_user_catalog_is_a_clear_error_and_refresh_starts_over(tmp_path, monkeypatch, run_cli):
    (tmp_path / "catalog.json").write_text(json.dumps({"schema_version": 2}))
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(tmp_path))
    result = run_cli("offers", "--gpus", "4xA100")
    assert result.exit_code == 2 and "has schema version 2; this gpuinfra reads version 3" in result.stderr
    routes = _gcp_routes()
    out = tmp_path / "new"
    with ReplayServer(routes) as server:
        refresh_catalog(["gcp"], out_dir=out, gcp_project="demo-project", gcp=_gcp_clients(server.url), now=NOW)
    assert load_catalog(out).meta["schema_version"] == 3


def test_spot_window_reads_the_history_between_start_and_end_and_keeps_min_max_latest():
    # real boto3 with botocore's Stubber: the request must carry StartTime = now - 30 days and
    # EndTime = now (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html)
    from datetime import timedelta

    from botocore.stub import Stubber

    from gpuinfra.catalog.refresh_aws import spot_windows

    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    history = [
        ("p5.48xlarge", "us-east-1a", "31.5", NOW - timedelta(days=20)),
        ("p5.48xlarge", "us-east-1a", "52.0766", NOW - timedelta(days=9)),
        ("p5.48xlarge", "us-east-1a", "13.2182", NOW - timedelta(days=1)),
        ("p5.48xlarge", "us-east-1b", "28.1", NOW - timedelta(days=2)),
    ]
    with Stubber(ec2) as stub:
        stub.add_response(
            "describe_spot_price_history",
            {
                "SpotPriceHistory": [
                    {
                        "InstanceType": t,
                        "AvailabilityZone": z,
                        "SpotPrice": p,
                        "Timestamp": ts,
                        "ProductDescription": "Linux/UNIX",
                    }
                    for t, z, p, ts in history
                ]
            },
            {
                "InstanceTypes": ["p5.48xlarge"],
                "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                "StartTime": NOW - timedelta(days=30),
                "EndTime": NOW,
            },
        )
        windows = spot_windows(ec2, ["p5.48xlarge"], NOW)
        stub.assert_no_pending_responses()
    a = windows[("p5.48xlarge", "us-east-1a")]
    assert (a.min_usd, a.max_usd, a.latest_usd) == (Decimal("13.2182"), Decimal("52.0766"), Decimal("13.2182"))
    b = windows[("p5.48xlarge", "us-east-1b")]
    assert (b.min_usd, b.max_usd, b.latest_usd) == (Decimal("28.1"), Decimal("28.1"), Decimal("28.1"))
