"""`gpuinfra catalog refresh`: EC2 against moto served on 127.0.0.1, the Price List API and the
GCP APIs against fixture responses served on 127.0.0.1, all through the real clients."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import boto3
import pytest

from gpuinfra.catalog.refresh import refresh_catalog
from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import CatalogError, MissingDependencyError
from tests.replay_server import ReplayServer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


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
        return session.client(service, region_name=region, endpoint_url=pricing_url if service == "pricing" else moto_url)

    return client


def test_aws_refresh_against_moto_and_price_list(moto_server, aws_env, tmp_path):
    pricing = {"FormatVersion": "aws_v1", **_fixture("aws_pricing_get_products_us-east-1.json")}
    with ReplayServer([("POST", "/", "AWSPriceListService.GetProducts", pricing)]) as price_list:
        result = refresh_catalog(["aws"], out_dir=tmp_path, regions=["us-east-1"],
                                 aws_factory=_factory(moto_server, price_list.url), now=NOW)
        targets = [r[2] for r in price_list.requests]
    assert targets == ["AWSPriceListService.GetProducts"]
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
    assert all(o.on_demand_price_per_hour_usd == Decimal("21.95764") and o.gpu == "A100" and o.gpu_count == 8 for o in p4d)
    # spot from DescribeSpotPriceHistory (moto answers 0.00001 for every type)
    assert all(o.spot_price_per_hour_usd == Decimal("0.00001") for o in p4d)
    # types without a Price List entry keep their spot price and have no on-demand price (never $0)
    g6 = [o for o in aws if o.instance_type == "g6.xlarge"]
    assert g6 and all(o.on_demand_price_per_hour_usd is None for o in g6)
    # facts come from DescribeInstanceTypes and match the shipped ones
    shipped = load_catalog()
    for itype in ("p4d.24xlarge", "p5.48xlarge", "g5.xlarge", "p5en.48xlarge"):
        fresh, old = catalog.fact("aws", itype), shipped.fact("aws", itype)
        assert (fresh.max_efa_interfaces, fresh.network_cards, fresh.local_ssd.bundled_count) == (
            old.max_efa_interfaces, old.network_cards, old.local_ssd.bundled_count)
    # the GCP part of the shipped catalog is kept, with its own date
    assert sum(o.cloud == "gcp" for o in catalog.offers) == sum(o.cloud == "gcp" for o in shipped.offers)
    assert catalog.date_for("aws") == "2026-11-22" and catalog.meta["sources"]["gcp"]["date"] == "2026-11-22"
    assert "Price List" in catalog.meta["sources"]["aws"]["prices"]


def test_refreshed_catalog_is_used_by_offers(moto_server, aws_env, tmp_path, monkeypatch, run_cli):
    pricing = {"FormatVersion": "aws_v1", **_fixture("aws_pricing_get_products_us-east-1.json")}
    with ReplayServer([("POST", "/", "AWSPriceListService.GetProducts", pricing)]) as price_list:
        refresh_catalog(["aws"], out_dir=tmp_path, regions=["us-east-1"],
                        aws_factory=_factory(moto_server, price_list.url), now=NOW)
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(tmp_path))
    result = run_cli("offers", "--gpus", "8xH100", "--cloud", "aws", "--spot", "--json")
    assert result.exit_code == 0, result.stderr
    offers = json.loads(result.stdout)
    assert {o["region"] for o in offers} == {"us-east-1"}
    assert offers[0]["spot_price_per_hour_usd"] == 0.00001


def _gcp_clients(url):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    from gpuinfra.catalog.refresh import gcp_clients

    return gcp_clients(credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=url), transport="rest")


def test_gcp_refresh_against_billing_and_compute_fixtures(tmp_path):
    routes = [
        ("GET", "/v1/services/6F81-5844-456A/skus", None, _fixture("gcp_billing_skus.json")),
        ("GET", "/compute/v1/projects/demo-project/aggregated/machineTypes", None, _fixture("gcp_machine_types.json")),
        ("GET", "/compute/v1/projects/demo-project/aggregated/acceleratorTypes", None, _fixture("gcp_accelerator_types.json")),
    ]
    with ReplayServer(routes) as server:
        result = refresh_catalog(["gcp"], out_dir=tmp_path, gcp_project="demo-project", gcp=_gcp_clients(server.url), now=NOW)
        paths = sorted(p.split("?")[0] for _, p, _, _ in server.requests)
    assert paths == ["/compute/v1/projects/demo-project/aggregated/acceleratorTypes",
                     "/compute/v1/projects/demo-project/aggregated/machineTypes",
                     "/v1/services/6F81-5844-456A/skus"]
    catalog = load_catalog(tmp_path)
    gcp = {(o.instance_type, o.gpu, o.gpu_count, o.zone): o for o in catalog.offers if o.cloud == "gcp"}
    a2 = gcp[("a2-highgpu-4g", "A100", 4, "us-central1-a")]
    host = Decimal("48") * Decimal("0.031611") + Decimal("340") * Decimal("0.004237")
    gpu = (4 * Decimal("2.933908")).quantize(Decimal("0.00001"))  # 11.73563, the snapshot's GPU row
    assert a2.host_on_demand_price_per_hour_usd == host.quantize(Decimal("0.00001"))
    assert a2.accelerator_on_demand_price_per_hour_usd == gpu
    assert a2.on_demand_price_per_hour_usd == a2.host_on_demand_price_per_hour_usd + gpu
    spot_host = Decimal("48") * Decimal("0.009483") + Decimal("340") * Decimal("0.001271")
    assert a2.spot_price_per_hour_usd == spot_host.quantize(Decimal("0.00001")) + 4 * Decimal("1.4341")
    assert "e2-standard-4" not in {k[0] for k in gcp}  # not a GPU family
    # N1 + T4 only where the accelerator is offered (us-central1-a), within host limits
    t4 = sorted((k[0], k[2]) for k in gcp if k[1] == "T4")
    assert t4 == [("n1-standard-8", 1), ("n1-standard-8", 2), ("n1-standard-8", 4), ("n1-standard-96", 4)]
    t4_1 = gcp[("n1-standard-8", "T4", 1, "us-central1-a")]
    assert t4_1.spot_price_per_hour_usd is None  # no spot N1 core/RAM SKU in the fixture: not priced, not $0
    assert t4_1.accelerator_type == "nvidia-tesla-t4"
    assert result.counts["gcp"] == len(gcp)
    assert all(o.cloud == "aws" for o in catalog.offers if o.instance_type.startswith("p4d"))


def test_refresh_without_credentials_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(MissingDependencyError, match="no AWS credentials found"):
        refresh_catalog(["aws"])


def test_refresh_cli_exit_code_without_credentials(monkeypatch, run_cli):
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = run_cli("catalog", "refresh", "--cloud", "aws")
    assert result.exit_code == 6 and result.stderr.startswith("error: no AWS credentials found")


def test_gcp_refresh_needs_a_project():
    with pytest.raises(CatalogError, match="needs --gcp-project"):
        refresh_catalog(["gcp"])
