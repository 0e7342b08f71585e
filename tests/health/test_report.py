"""read_health against moto S3 on 127.0.0.1, and the GCS path with a stand-in client."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import boto3
import pytest

from gpuinfra.errors import GpuinfraError, MissingDependencyError
from gpuinfra.health.gate import GateOutputs, health_key
from gpuinfra.health.report import read_health
from tests.health.conftest import fixture_text as t
from tests.health.test_gate import _p4d_outputs

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def node_doc(node: str, stack: str = "train", **changes) -> str:
    from gpuinfra.health.report import evaluate

    return evaluate("p4d.24xlarge", _p4d_outputs(**changes), nodes=2, stack=stack, node=node, checked_at=NOW).to_json()


@pytest.fixture
def s3(moto_url, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    return boto3.client("s3", region_name="us-east-1", endpoint_url=moto_url)


def test_reads_every_node_and_reports_unreadable_ones(s3):
    s3.create_bucket(Bucket="health-read")
    s3.put_object(Bucket="health-read", Key=health_key("train", "i-0b"), Body=node_doc("i-0b", fabric_manager="failed"))
    s3.put_object(Bucket="health-read", Key=health_key("train", "i-0a"), Body=node_doc("i-0a"))
    s3.put_object(Bucket="health-read", Key=health_key("train", "i-0c"), Body=b"{not json")
    s3.put_object(Bucket="health-read", Key=health_key("train", "i-0d"), Body=node_doc("i-0d", stack="other"))
    s3.put_object(Bucket="health-read", Key=health_key("other", "i-0e"), Body=node_doc("i-0e", stack="other"))
    s3.put_object(Bucket="health-read", Key="health/train/notes.txt", Body=b"ignored")
    report = read_health("aws", "health-read", "train", client=s3)
    assert [n.node for n in report.nodes] == ["i-0a", "i-0b"]
    assert [n.passed for n in report.nodes] == [True, False]
    assert [(i.key, i.reason.split(":")[0]) for i in report.invalid] == [
        ("health/train/i-0c.json", "Expecting property name enclosed in double quotes"),
        ("health/train/i-0d.json", "written for stack 'other'")]
    assert not report.passed and report.prefix == "health/train/"


def test_empty_prefix_and_missing_bucket(s3):
    s3.create_bucket(Bucket="health-empty")
    report = read_health("aws", "health-empty", "train", client=s3)
    assert (report.nodes, report.invalid, report.passed) == ((), (), False)
    with pytest.raises(GpuinfraError, match="bucket health-nope does not exist"):
        read_health("aws", "health-nope", "train", client=s3)


def test_gcs_path_with_a_stand_in_client():
    class Blob:
        def __init__(self, name, body):
            self.name, self.body = name, body

        def download_as_bytes(self):
            return self.body

    class Client:
        def list_blobs(self, bucket, prefix):
            assert (bucket, prefix) == ("gcs-bucket", "health/train/")
            return [Blob("health/train/vm-2.json", node_doc("vm-2").encode()),
                    Blob("health/train/vm-1.json", node_doc("vm-1").encode())]

    report = read_health("gcp", "gcs-bucket", "train", client=Client())
    assert [n.node for n in report.nodes] == ["vm-1", "vm-2"] and report.passed


def test_gcs_without_the_library_says_what_to_install(monkeypatch):
    import google.cloud

    monkeypatch.setitem(sys.modules, "google.cloud.storage", None)
    monkeypatch.delattr(google.cloud, "storage", raising=False)
    with pytest.raises(MissingDependencyError, match="reading a GCS bucket needs google-cloud-storage"):
        read_health("gcp", "gcs-bucket", "train")


def test_gcs_without_credentials_is_exit_6(monkeypatch, tmp_path):
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setattr("google.auth._cloud_sdk.get_application_default_credentials_path",
                        lambda: str(tmp_path / "none.json"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no metadata server here
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    with pytest.raises(MissingDependencyError, match="no GCP credentials found") as caught:
        read_health("gcp", "gcs-bucket", "train")
    assert caught.value.exit_code == 6


def test_outputs_default_to_nothing():
    assert GateOutputs() == GateOutputs(None, None, None, None, None, None)
    assert t("fi_info_p4d_awsdocs.txt").startswith("provider: efa")
