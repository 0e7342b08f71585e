"""Data locality: the data set's region and size (S3 through moto, Cloud Storage through a local
server speaking its JSON API, both with the real clients), transfer prices and the run ranking."""

from __future__ import annotations

import json
from decimal import Decimal

import boto3
import pytest

from gpuinfra.datasource import parse_size_gb, resolve_data_set
from gpuinfra.errors import DataSourceError
from gpuinfra.locality import quote_transfer
from gpuinfra.spec import DataSource as DataSet
from tests.replay_server import ReplayServer


@pytest.mark.parametrize(
    ("text", "gb"),
    [("2TB", Decimal(2000)), ("750", Decimal(750)), ("500GiB", Decimal("536.870912")), ("1.5 tb", Decimal("1500.0"))],
)
def test_sizes_are_decimal_gb(text, gb):
    assert parse_size_gb(text) == gb


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"uri": None, "region": None, "size": "2TB"}, "--data-size needs --data or --data-region"),
        ({"uri": None, "region": "us-east-1", "size": None}, "--data-region needs --data-size"),
        ({"uri": None, "region": "mars-1", "size": "1TB"}, "is not an AWS region"),
        (
            {"uri": "ftp://x/y", "region": None, "size": "1TB"},
            r"must be s3://bucket\[/prefix\] or gs://bucket\[/prefix\]",
        ),
        ({"uri": "s3://bucket", "region": "us-central1", "size": "1TB"}, "is not a aws region"),
        ({"uri": None, "region": "us-east-1", "size": "lots"}, "is not a size"),
    ],
)
def test_bad_data_options(kwargs, message):
    with pytest.raises(DataSourceError, match=message):
        resolve_data_set(**kwargs)


def test_s3_bucket_region_and_prefix_size_from_moto(moto_url):
    s3 = boto3.client(
        "s3",
        region_name="us-west-2",
        endpoint_url=moto_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket="train-data", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    s3.put_object(Bucket="train-data", Key="shards/a", Body=b"x" * 3000)
    s3.put_object(Bucket="train-data", Key="shards/b", Body=b"x" * 2000)
    s3.put_object(Bucket="train-data", Key="other/c", Body=b"x" * 7000)
    data = resolve_data_set("s3://train-data/shards/", None, None, s3_client=s3)
    assert data == DataSet(
        cloud="aws", location="us-west-2", size_gb=Decimal("0.000005"), uri="s3://train-data/shards/"
    )
    # --data-size skips the listing, the region still comes from S3
    assert resolve_data_set("s3://train-data/shards/", None, "2TB", s3_client=s3).size_gb == 2000
    with pytest.raises(DataSourceError, match="s3://missing-bucket: 404"):
        resolve_data_set("s3://missing-bucket/x", None, None, s3_client=s3)


def test_gcs_bucket_location_and_size_through_the_json_api(monkeypatch):
    routes = [
        (
            "GET",
            "/storage/v1/b/ds-bucket/o",
            None,
            {
                "kind": "storage#objects",
                "items": [
                    {"kind": "storage#object", "name": "tok/0", "bucket": "ds-bucket", "size": "1500000000"},
                    {"kind": "storage#object", "name": "tok/1", "bucket": "ds-bucket", "size": "500000000"},
                ],
            },
        ),
        (
            "GET",
            "/storage/v1/b/ds-bucket",
            None,
            {"kind": "storage#bucket", "name": "ds-bucket", "location": "US-CENTRAL1", "locationType": "region"},
        ),
    ]
    with ReplayServer(routes) as server:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
        data = resolve_data_set("gs://ds-bucket/tok", None, None)
        paths = [p for _, p, _, _ in server.requests]
    assert data == DataSet(cloud="gcp", location="us-central1", size_gb=Decimal(2), uri="gs://ds-bucket/tok")
    assert any(p.startswith("/storage/v1/b/ds-bucket/o?") and "prefix=tok" in p for p in paths)


def test_data_region_and_size_given_need_no_lookup_and_no_credentials(monkeypatch, tmp_path):
    """--data with --data-region and --data-size: nothing to look up, so no client is made (before,
    an S3 client was built anyway and the command exited 6 without credentials)."""
    from tests.conftest import without_aws_credentials

    without_aws_credentials(monkeypatch, tmp_path)
    data = resolve_data_set("s3://my-bucket/data", "eu-west-1", "2TB")
    assert (data.cloud, data.location, data.size_gb, data.uri) == (
        "aws",
        "eu-west-1",
        Decimal("2000"),
        "s3://my-bucket/data",
    )


def test_transfer_prices_by_route():
    two_tb_s3 = DataSet(cloud="aws", location="us-east-1", size_gb=Decimal(2000))
    assert quote_transfer(two_tb_s3, "aws", "us-east-1").usd == 0  # same region: free
    # inter-region out of us-east-1: $0.02/GB (AWSDataTransfer offer 20260831121448)
    assert quote_transfer(two_tb_s3, "aws", "us-west-2").usd == Decimal("40.00")
    # to GCP: internet egress from us-east-1, first 10 TB $0.09/GB
    assert quote_transfer(two_tb_s3, "gcp", "us-central1").usd == Decimal("180.00")
    gcs = DataSet(cloud="gcp", location="us-central1", size_gb=Decimal(2000))
    # Cloud Storage download to AWS us-east-1: $0.12/GiB worldwide excluding Asia & Australia;
    # 2000 GB = 1862.645 GiB
    assert quote_transfer(gcs, "aws", "us-east-1").usd.quantize(Decimal("0.000001")) == Decimal("223.517418")
    assert quote_transfer(gcs, "aws", "ap-southeast-2").usd is None  # Australia: no price read, never free
    assert quote_transfer(gcs, "gcp", "europe-west4").usd is None  # GCS inter-region: unknown, never free


def _stack_doc(tmp_path, name):
    import yaml

    return yaml.safe_load((tmp_path / "stacks" / f"Pulumi.{name}.yaml").read_text())["config"]["gpuinfra:cluster"]


def test_offers_with_data_say_when_the_cheapest_gpu_is_not_the_cheapest_run(run_cli):
    # 4xA100: GCP us-central1 a2-highgpu-4g $14.69/h is the cheapest GPU; 50 TB in s3 us-east-1
    # cost $4,500 to move there, more than the $7.26/h difference over 24 h
    result = run_cli(
        "offers",
        "--gpus",
        "4xA100",
        "--data-region",
        "us-east-1",
        "--data-size",
        "50TB",
        "--hours",
        "24",
        "--json",
        "--limit",
        "0",
    )
    assert result.exit_code == 0, result.stderr
    runs = json.loads(result.stdout)
    first = runs[0]
    assert (first["cloud"], first["region"], first["instance_type"]) == ("aws", "us-east-1", "p4d.24xlarge")
    assert (
        first["data_transfer_usd"] == "0.000000" and first["run_usd"] == first["compute_usd"] == "526.983360"
    )  # 24 x 21.95764
    gcp = next(r for r in runs if r["cloud"] == "gcp" and r["region"] == "us-central1")
    assert gcp["data_transfer_usd"] == "4500.000000" and gcp["run_usd"] == "4852.644960"  # 24 x 14.69354 + 4500
    table = run_cli("offers", "--gpus", "4xA100", "--data-region", "us-east-1", "--data-size", "50TB", "--hours", "24")
    assert "is not the cheapest run" in table.stdout and "a2-highgpu-4g" in table.stdout
    # a small data set moves cheaply: the cheapest GPU is the cheapest run again
    small = json.loads(
        run_cli(
            "offers",
            "--gpus",
            "4xA100",
            "--data-region",
            "us-east-1",
            "--data-size",
            "100GB",
            "--hours",
            "24",
            "--json",
        ).stdout
    )
    assert small[0]["instance_type"] == "a2-highgpu-4g" and small[0]["data_transfer_usd"] == "9.000000"


def test_offers_with_data_needs_hours(run_cli):
    result = run_cli("offers", "--gpus", "4xA100", "--data-region", "us-east-1", "--data-size", "1TB")
    assert result.exit_code == 2 and "--data needs --hours" in result.stderr


def test_new_with_data_picks_the_cheapest_run_and_cost_moves_the_data_once(run_cli, tmp_path):
    result = run_cli(
        "new",
        "--gpus",
        "4xA100",
        "--data-region",
        "us-east-1",
        "--data-size",
        "50TB",
        "--hours",
        "24",
        "--project-dir",
        str(tmp_path),
        "--name",
        "near",
    )
    assert result.exit_code == 0, result.stderr
    cluster = _stack_doc(tmp_path, "near")
    assert (cluster["cloud"], cluster["region"]) == ("aws", "us-east-1")
    assert cluster["data"] == {"cloud": "aws", "location": "us-east-1", "size_gb": "50000", "uri": ""}
    assert "is not the cheapest run" in result.stdout
    far = run_cli(
        "new",
        "--gpus",
        "4xA100",
        "--cloud",
        "gcp",
        "--data-region",
        "us-east-1",
        "--data-size",
        "50TB",
        "--hours",
        "24",
        "--project-dir",
        str(tmp_path),
        "--name",
        "far",
    )
    assert far.exit_code == 0, far.stderr
    doc = json.loads(run_cli("cost", "far", "--json", "--project-dir", str(tmp_path)).stdout)
    line = next(x for x in doc["lines"] if x["component"].startswith("Data set transfer"))
    # 50,000 GB x $0.09 over 24 h
    assert Decimal(line["unit_price_usd"]) == Decimal("0.09") and Decimal(line["run_usd"]) == Decimal("4500")
