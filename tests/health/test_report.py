"""read_health against moto S3 on 127.0.0.1, the GCS path with a stand-in client, the stack's
verdict (missing and stale results) and locate_results (where to read, what counts)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from gpuinfra import lifecycle
from gpuinfra.errors import MissingDependencyError, RequestError, SpecError
from gpuinfra.health.gate import GateOutputs, health_key
from gpuinfra.lifecycle import StackStatus
from gpuinfra.services.health_report import HealthReport, ResultsLocation, evaluate, locate_results, read_health
from tests.health.conftest import fixture_text as t
from tests.health.conftest import plan_for, spec_for
from tests.health.test_gate import _p4d_outputs

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
DEPLOYED = NOW - timedelta(minutes=30)


def node_doc(node: str, stack: str = "train", checked_at: datetime = NOW, nodes: int = 2, **changes) -> str:
    return evaluate(
        spec_for("p4d.24xlarge", nodes, stack=stack), _p4d_outputs(**changes), node=node, checked_at=checked_at
    ).to_json()


def where(bucket: str, cloud: str = "aws", nodes: int = 2, since: datetime | None = DEPLOYED) -> ResultsLocation:
    return ResultsLocation(cloud, bucket, "train", nodes, since, "test")


@pytest.fixture
def s3(moto_url, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    return boto3.client("s3", region_name="us-east-1", endpoint_url=moto_url)


def _put(s3, bucket: str, docs: dict[str, str | bytes]) -> None:
    s3.create_bucket(Bucket=bucket)
    for key, body in docs.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)


def test_reads_every_node_and_reports_unreadable_ones(s3):
    _put(
        s3,
        "health-read",
        {
            health_key("train", "i-0b"): node_doc("i-0b", fabric_manager="failed"),
            health_key("train", "i-0a"): node_doc("i-0a"),
            health_key("train", "i-0c"): b"{not json",
            health_key("train", "i-0d"): node_doc("i-0d", stack="other"),
            health_key("train", "i-0f"): node_doc("i-0f", nodes=4),
            health_key("other", "i-0e"): node_doc("i-0e", stack="other"),
            "health/train/notes.txt": b"ignored",
        },
    )
    report = read_health(where("health-read"), client=s3)
    assert [n.node for n in report.nodes] == ["i-0a", "i-0b"]
    assert [n.passed for n in report.nodes] == [True, False]
    assert [(i.key, i.reason.split(":")[0]) for i in report.invalid] == [
        ("health/train/i-0c.json", "Expecting property name enclosed in double quotes"),
        ("health/train/i-0d.json", "written for stack 'other'"),
        ("health/train/i-0f.json", "written for a 4-node cluster, the stack has 2"),
    ]
    assert not report.passed and report.location.prefix == "health/train/"


def test_a_missing_node_fails_the_stack(s3):
    """One node of two wrote a passing result: the stack has not passed."""
    _put(s3, "health-missing", {health_key("train", "i-0a"): node_doc("i-0a")})
    report = read_health(where("health-missing"), client=s3)
    assert [n.passed for n in report.nodes] == [True] and report.missing == 1
    assert report.verdict().passed is False
    assert report.verdict().reason == "1 of 2 nodes have no current result"
    s3.put_object(Bucket="health-missing", Key=health_key("train", "i-0b"), Body=node_doc("i-0b"))
    both = read_health(where("health-missing"), client=s3)
    assert both.verdict().passed and both.verdict().reason is None and both.missing == 0


def test_results_from_before_the_deployment_are_stale(s3):
    """The bucket outlives `gpuinfra down`: last deployment's passing results do not count."""
    before = DEPLOYED - timedelta(days=2)
    _put(
        s3,
        "health-stale",
        {
            health_key("train", "i-0a"): node_doc("i-0a", checked_at=before),
            health_key("train", "i-0b"): node_doc("i-0b", checked_at=before),
            health_key("train", "i-0c"): node_doc("i-0c"),
        },
    )
    report = read_health(where("health-stale"), client=s3)
    assert [n.node for n in report.stale] == ["i-0a", "i-0b"] and [n.node for n in report.nodes] == ["i-0c"]
    assert report.verdict().reason == (
        "1 of 2 nodes have no current result (2 stale result(s) from before 2026-11-30T11:30:00+00:00 ignored)"
    )
    doc = report.to_dict()
    assert doc["stale"] == [
        {"node": "i-0a", "checked_at": "2026-11-28T11:30:00+00:00"},
        {"node": "i-0b", "checked_at": "2026-11-28T11:30:00+00:00"},
    ]
    assert (doc["expected_nodes"], doc["missing"], doc["since"], doc["passed"]) == (
        2,
        1,
        "2026-11-30T11:30:00+00:00",
        False,
    )
    # without a deployment time every result counts: what the gate did before, for every stack
    assert len(read_health(where("health-stale", since=None), client=s3).nodes) == 3


def test_verdict_messages():
    loc = where("b")
    passed = HealthReport(loc, (), (), ())
    assert passed.verdict().reason == (
        "no health results under s3://b/health/train/ yet: each node writes its result "
        "there after its boot checks; run this again when the nodes are up"
    )
    import json

    from gpuinfra.health.gate import NodeHealth

    bad = NodeHealth.from_dict(json.loads(node_doc("i-0b", fabric_manager="failed")))
    assert HealthReport(loc, (bad,), (), ()).verdict().reason == (
        "1 of 1 nodes failed the health gate or have an unreadable result: i-0b; 1 of 2 nodes have no current result"
    )


def test_empty_prefix_and_missing_bucket(s3):
    s3.create_bucket(Bucket="health-empty")
    report = read_health(where("health-empty"), client=s3)
    assert (report.nodes, report.invalid, report.passed) == ((), (), False)
    with pytest.raises(SpecError, match="bucket health-nope does not exist"):
        read_health(where("health-nope"), client=s3)


def test_gcs_path_with_a_stand_in_client():
    class Blob:
        def __init__(self, name, body):
            self.name, self.body = name, body

        def download_as_bytes(self):
            return self.body

    class Client:
        def list_blobs(self, bucket, prefix):
            assert (bucket, prefix) == ("gcs-bucket", "health/train/")
            return [
                Blob("health/train/vm-2.json", node_doc("vm-2").encode()),
                Blob("health/train/vm-1.json", node_doc("vm-1").encode()),
            ]

    report = read_health(where("gcs-bucket", cloud="gcp"), client=Client())
    assert [n.node for n in report.nodes] == ["vm-1", "vm-2"] and report.passed
    assert report.location.url == "gs://gcs-bucket/health/train/"


def test_gcs_without_the_library_says_what_to_install(monkeypatch):
    import google.cloud

    monkeypatch.setitem(sys.modules, "google.cloud.storage", None)
    monkeypatch.delattr(google.cloud, "storage", raising=False)
    with pytest.raises(MissingDependencyError, match="reading a GCS bucket needs google-cloud-storage"):
        read_health(where("gcs-bucket", cloud="gcp"))


def test_gcs_without_credentials_is_exit_6(monkeypatch, tmp_path):
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setattr(
        "google.auth._cloud_sdk.get_application_default_credentials_path", lambda: str(tmp_path / "none.json")
    )
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no metadata server here
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    with pytest.raises(MissingDependencyError, match="no GCP credentials found") as caught:
        read_health(where("gcs-bucket", cloud="gcp"))
    assert caught.value.exit_code == 6


def test_outputs_default_to_nothing():
    assert GateOutputs() == GateOutputs(None, None, None, None, None, None)
    assert t("fi_info_p4d_awsdocs.txt").startswith("provider: efa")


# ------------------------------------------------------------------------------ locate_results
class Backend:
    """Stands in for the Pulumi backend: outputs and stack statuses."""

    def __init__(self, outputs=None, statuses=()):
        self.outputs_given, self.statuses, self.calls = outputs or {}, list(statuses), []

    def outputs(self, project_dir, stack):
        self.calls.append(("outputs", stack))
        return self.outputs_given

    def list_stacks(self, project_dir):
        self.calls.append(("list_stacks",))
        return self.statuses


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project with the stack file of 2 x p4d.24xlarge `train`; credentials checks counted."""
    from gpuinfra.stackfile import write_stack

    write_stack(plan_for("p4d.24xlarge"), tmp_path)
    checked = []
    monkeypatch.setattr(lifecycle, "check_credentials", lambda cloud: checked.append(cloud))
    return tmp_path, checked


def _backend(monkeypatch, backend):
    monkeypatch.setattr(lifecycle, "make_backend", lambda: backend)
    return backend


def test_location_from_the_stack_file_and_pulumi(project, monkeypatch):
    path, checked = project
    backend = _backend(
        monkeypatch,
        Backend(
            {"bucket_name": "b-1"}, [StackStatus("other", False, NOW, 3), StackStatus("train", False, DEPLOYED, 40)]
        ),
    )
    loc = locate_results("train", path)
    assert (loc.cloud, loc.bucket, loc.expected_nodes, loc.since) == ("aws", "b-1", 2, DEPLOYED)
    assert loc.since_source == "the stack's last Pulumi update" and loc.url == "s3://b-1/health/train/"
    assert checked == ["aws"]  # once
    assert backend.calls == [("outputs", "train"), ("list_stacks",)]
    # --since wins over the Pulumi update time; --bucket over the output
    loc = locate_results("train", path, bucket="b-2", since="2026-11-29T08:00:00")
    assert (loc.bucket, loc.since, loc.since_source) == ("b-2", datetime(2026, 11, 29, 8, tzinfo=UTC), "--since")


def test_location_without_a_stack_file_needs_bucket_scheme_nodes_and_since(tmp_path, monkeypatch):
    checked = []
    monkeypatch.setattr(lifecycle, "check_credentials", lambda cloud: checked.append(cloud))

    def no_pulumi():
        raise MissingDependencyError(lifecycle.PULUMI_INSTALL_HINT)

    monkeypatch.setattr(lifecycle, "make_backend", no_pulumi)
    loc = locate_results("train", tmp_path, bucket="gs://g-1/", nodes=3, since="2026-11-30T11:00:00Z")
    assert (loc.cloud, loc.bucket, loc.expected_nodes) == ("gcp", "g-1", 3) and checked == ["gcp"]
    for kwargs in (dict(bucket="g-1", nodes=3), dict(bucket="gs://g-1"), dict(nodes=3)):
        with pytest.raises(
            RequestError, match="no stack file for 'train'.*give --bucket s3://NAME or gs://NAME and --nodes N"
        ):
            locate_results("train", tmp_path, **kwargs)
    with pytest.raises(MissingDependencyError, match="or give --since TIME"):
        locate_results("train", tmp_path, bucket="gs://g-1", nodes=3)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(bucket="gs://b"), RequestError, "--bucket 'gs://b' is a GCS bucket, but stack 'train' is on aws"),
        (dict(nodes=3), RequestError, "--nodes 3, but the stack file of 'train' says nodes: 2"),
        (dict(since="yesterday"), RequestError, "--since 'yesterday': give an ISO 8601 time"),
        (dict(bucket="s3://a/b"), RequestError, "--bucket 's3://a/b': give s3://NAME, gs://NAME or a bare NAME"),
    ],
)
def test_location_refuses_contradictions(project, monkeypatch, kwargs, error, message):
    _backend(monkeypatch, Backend({"bucket_name": "b-1"}, [StackStatus("train", False, DEPLOYED, 40)]))
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        locate_results("train", project[0], **kwargs)


def test_location_needs_a_deployment_time(project, monkeypatch):
    _backend(monkeypatch, Backend({"bucket_name": "b-1"}, [StackStatus("train", True, None, None)]))
    with pytest.raises(SpecError, match="stack 'train' has no finished Pulumi update.*give --since TIME"):
        locate_results("train", project[0])
    _backend(monkeypatch, Backend({}, []))
    with pytest.raises(SpecError, match="stack 'train' has no bucket_name output") as caught:
        locate_results("train", project[0])
    assert caught.value.exit_code == 2


def test_results_of_an_earlier_deployment_are_stale(s3):
    """`gpuinfra check` after `up --replace-nodes` (same stack file, same bucket): the replaced
    nodes' passing results, checked after the last update started, do not pass the new ones."""
    import json
    from dataclasses import replace

    from gpuinfra.health.gate import NodeHealth

    def doc(node, deployment):
        health = NodeHealth.from_dict(json.loads(node_doc(node)))
        return replace(health, deployment=deployment).to_json()

    _put(
        s3,
        "health-deployment",
        {
            health_key("train", "i-0a"): doc("i-0a", "0a0a0a0a0a0a"),
            health_key("train", "i-0b"): doc("i-0b", "0a0a0a0a0a0a"),
            health_key("train", "i-1a"): doc("i-1a", "0b0b0b0b0b0b"),
        },
    )
    location = replace(where("health-deployment"), deployment="0b0b0b0b0b0b")
    report = read_health(location, client=s3)
    assert [n.node for n in report.nodes] == ["i-1a"] and [n.node for n in report.stale] == ["i-0a", "i-0b"]
    assert report.verdict().passed is False
