"""`gpuinfra check STACK`: node results read from moto S3 on 127.0.0.1, printed per node, exit 8
when a node failed, a result is unreadable or a node has no current result, exit 6 without
credentials, exit 2 for contradicting input."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from gpuinfra import lifecycle
from gpuinfra.health.gate import decide, health_key
from gpuinfra.lifecycle import StackStatus
from gpuinfra.plan.health import expectations_for
from gpuinfra.services.health_report import evaluate
from tests.conftest import without_aws_credentials
from tests.health.conftest import fixture_text, spec_for
from tests.health.test_gate import _p4d_outputs

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SINCE = "2026-11-30T11:00:00Z"
#: Without a stack file: the cloud from the scheme, the node count and the deployment time given.
FLAGS = ("--nodes", "2", "--since", SINCE)


def node_doc(node: str, checked_at: datetime = NOW, **changes) -> str:
    return evaluate(spec_for("p4d.24xlarge"), _p4d_outputs(**changes), node=node, checked_at=checked_at).to_json()


@pytest.fixture
def s3(moto_url, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_url)
    return boto3.client("s3", region_name="us-east-1", endpoint_url=moto_url)


def _bucket(s3, name: str, docs: dict[str, str | bytes]) -> str:
    s3.create_bucket(Bucket=name)
    for node, body in docs.items():
        s3.put_object(Bucket=name, Key=health_key("train", node), Body=body)
    return f"s3://{name}"


def test_all_nodes_passed(run_cli, s3):
    url = _bucket(s3, "check-pass", {"i-0a": node_doc("i-0a"), "i-0b": node_doc("i-0b")})
    result = run_cli("check", "train", "--bucket", url, *FLAGS)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "health gate of stack train: s3://check-pass/health/train/ (2 of 2 nodes reported; results "
        "before 2026-11-30T11:00:00+00:00 (--since) are stale)"
    )
    assert lines[-1] == "2 of 2 nodes passed"
    rows = [line for line in lines if line.startswith("│ i-0")]
    assert len(rows) == 2
    assert all("444.02 / 77.35" in row and row.rstrip(" │").endswith("PASS") for row in rows)
    assert result.stderr == ""


def test_a_failed_node_is_named_with_its_checks_and_exits_8(run_cli, s3):
    url = _bucket(
        s3,
        "check-fail",
        {
            "i-0a": node_doc("i-0a"),
            "i-0b": node_doc(
                "i-0b", fabric_manager="failed\n", fi_info=(_p4d_outputs().fi_info.rsplit("provider: efa", 1)[0])
            ),
        },
    )
    result = run_cli("check", "train", "--bucket", url, *FLAGS)
    assert result.exit_code == 8
    lines = result.stdout.splitlines()
    assert "FAIL i-0b fabric_manager: nvidia-fabricmanager is failed" in lines
    assert "FAIL i-0b efa_devices: 3 of 4 EFA devices (efa_0, efa_1, efa_2)" in lines
    assert lines[-1] == "1 of 2 nodes passed"
    assert result.stderr == "error: 1 of 2 nodes failed the health gate or have an unreadable result: i-0b\n"


def test_a_missing_node_exits_8(run_cli, s3):
    """One passing result for a 2-node stack: not passed."""
    url = _bucket(s3, "check-missing", {"i-0a": node_doc("i-0a")})
    result = run_cli("check", "train", "--bucket", url, *FLAGS)
    assert result.exit_code == 8
    lines = result.stdout.splitlines()
    assert lines[-2:] == ["MISSING 1 of 2 nodes have no current result", "1 of 2 nodes passed"]
    assert result.stderr == "error: 1 of 2 nodes have no current result\n"


def test_results_of_an_earlier_deployment_are_stale_and_exit_8(run_cli, s3):
    old = NOW - timedelta(days=3)
    url = _bucket(
        s3, "check-stale", {"i-0a": node_doc("i-0a", checked_at=old), "i-0b": node_doc("i-0b", checked_at=old)}
    )
    result = run_cli("check", "train", "--bucket", url, *FLAGS)
    assert result.exit_code == 8
    lines = result.stdout.splitlines()
    assert "STALE i-0a: checked at 2026-11-27T12:00:00+00:00, before this deployment; ignored" in lines
    assert result.stderr == (
        "error: 2 of 2 nodes have no current result (2 stale result(s) from before 2026-11-30T11:00:00+00:00 ignored)\n"
    )
    # the same results count when the deployment is older
    assert run_cli("check", "train", "--bucket", url, "--nodes", "2", "--since", "2026-11-01").exit_code == 0


def test_low_bandwidth_shows_measured_vs_expected(run_cli, s3):
    low = evaluate(
        spec_for("p5.48xlarge"),
        _p4d_outputs(all_reduce=fixture_text("all_reduce_p5_2node_lowbw_derived.txt"), fi_info=None),
        node="i-0c",
        checked_at=NOW,
    )
    url = _bucket(s3, "check-low", {"i-0c": low.to_json()})
    result = run_cli("check", "train", "--bucket", url, "--nodes", "2", "--since", SINCE)
    assert result.exit_code == 8
    assert any("301.44 / 437.79" in line and "FAIL" in line for line in result.stdout.splitlines())
    assert (
        "FAIL i-0c allreduce_busbw: 301.44 GB/s at 2147483648 B, needs >= 0.8 x 437.79 = 350.23 GB/s (2-node baseline)"
    ) in result.stdout.splitlines()


def test_unreadable_result_is_listed_and_fails(run_cli, s3):
    url = _bucket(s3, "check-invalid", {"i-0a": node_doc("i-0a"), "i-0z": b'{"schema_version": "9"}'})
    result = run_cli("check", "train", "--bucket", url, *FLAGS)
    assert result.exit_code == 8
    lines = result.stdout.splitlines()
    assert "INVALID health/train/i-0z.json: schema_version '9', this gpuinfra reads '3'" in lines
    assert lines[-1] == "1 of 2 nodes passed; 1 result(s) unreadable"
    assert result.stderr == (
        "error: 1 of 2 nodes failed the health gate or have an unreadable result: "
        "health/train/i-0z.json; 1 of 2 nodes have no current result\n"
    )


def test_no_results_yet_is_a_different_message(run_cli, s3):
    url = _bucket(s3, "check-empty", {})
    result = run_cli("check", "train", "--bucket", url, *FLAGS)
    assert result.exit_code == 8 and result.stdout == ""
    assert result.stderr == (
        "error: no health results under s3://check-empty/health/train/ yet: each node writes its "
        "result there after its boot checks; run this again when the nodes are up\n"
    )


def test_json_output(run_cli, s3):
    url = _bucket(s3, "check-json", {"i-0a": node_doc("i-0a"), "i-0b": node_doc("i-0b", fabric_manager="failed")})
    result = run_cli("check", "train", "--bucket", url, *FLAGS, "--json")
    assert result.exit_code == 8
    doc = json.loads(result.stdout)
    assert list(doc) == [
        "schema_version",
        "stack",
        "results",
        "expected_nodes",
        "since",
        "since_source",
        "passed",
        "missing",
        "nodes",
        "stale",
        "invalid",
    ]
    assert (doc["schema_version"], doc["stack"], doc["results"], doc["passed"]) == (
        "3",
        "train",
        "s3://check-json/health/train/",
        False,
    )
    assert (doc["expected_nodes"], doc["since"], doc["since_source"], doc["missing"]) == (
        2,
        "2026-11-30T11:00:00+00:00",
        "--since",
        0,
    )
    assert [(n["node"], n["passed"]) for n in doc["nodes"]] == [("i-0a", True), ("i-0b", False)]
    busbw = next(c for c in doc["nodes"][0]["checks"] if c["name"] == "allreduce_busbw")
    assert (busbw["measured"], busbw["expected"], busbw["passed"]) == (444.02, 77.35, True)
    assert doc["invalid"] == [] and doc["stale"] == [] and "$" not in result.stdout
    assert result.stderr.startswith("error: 1 of 2 nodes failed the health gate")


def test_no_credentials_is_exit_6_in_one_line(run_cli, monkeypatch, tmp_path):
    without_aws_credentials(monkeypatch, tmp_path)
    result = run_cli("check", "train", "--bucket", "s3://check-nocreds", *FLAGS)
    assert result.exit_code == 6 and result.stdout == ""
    assert result.stderr == (
        "error: no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
        "AWS_SECRET_ACCESS_KEY (`aws configure`)\n"
    )


@pytest.fixture
def project(run_cli, tmp_path):
    assert (
        run_cli(
            "new", "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "train", "--project-dir", str(tmp_path)
        ).exit_code
        == 0
    )
    return tmp_path


class Backend:
    def __init__(self, outputs, last_update=NOW - timedelta(hours=1)):
        self.outputs_given, self.last_update, self.calls = outputs, last_update, []

    def outputs(self, project_dir, stack):
        self.calls.append(("outputs", stack))
        return self.outputs_given

    def list_stacks(self, project_dir):
        self.calls.append(("list_stacks",))
        return [StackStatus("train", False, self.last_update, 40)]


def test_bucket_and_deployment_time_from_the_stacks_pulumi_state(run_cli, s3, project, monkeypatch):
    _bucket(s3, "check-train-outputs", {"i-0a": node_doc("i-0a"), "i-0b": node_doc("i-0b")})
    backend = Backend({"bucket_name": "check-train-outputs"})
    monkeypatch.setattr(lifecycle, "make_backend", lambda: backend)
    checked = []
    real = lifecycle.check_credentials
    monkeypatch.setattr(lifecycle, "check_credentials", lambda cloud: (checked.append(cloud), real(cloud)))
    result = run_cli("check", "train", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert backend.calls == [("outputs", "train"), ("list_stacks",)] and checked == ["aws"]
    assert result.stdout.splitlines()[0] == (
        "health gate of stack train: s3://check-train-outputs/health/train/ (2 of 2 nodes reported; results before "
        "2026-11-30T11:00:00+00:00 (the stack's last Pulumi update) are stale)"
    )
    # a bare --bucket name takes the cloud from the stack file; Pulumi is asked only for the update time
    backend.calls.clear()
    assert run_cli("check", "train", "--bucket", "check-train-outputs", "--project-dir", str(project)).exit_code == 0
    assert backend.calls == [("list_stacks",)]
    # redeployed after the nodes checked: their results are stale
    backend.last_update = NOW + timedelta(minutes=5)
    result = run_cli("check", "train", "--project-dir", str(project))
    assert result.exit_code == 8 and "2 stale result(s)" in result.stderr


def test_stack_without_bucket_output(run_cli, s3, project, monkeypatch):
    monkeypatch.setattr(lifecycle, "make_backend", lambda: Backend({}))
    result = run_cli("check", "train", "--project-dir", str(project))
    assert result.exit_code == 2
    assert result.stderr == (
        "error: stack 'train' has no bucket_name output (is it deployed? `gpuinfra up train`); or give --bucket\n"
    )


def test_bucket_of_another_cloud_and_other_node_count_are_refused(run_cli, s3, project):
    result = run_cli("check", "train", "--bucket", "gs://x", "--project-dir", str(project))
    assert (result.exit_code, result.stderr) == (
        2,
        "error: --bucket 'gs://x' is a GCS bucket, but stack 'train' is on aws\n",
    )
    result = run_cli("check", "train", "--nodes", "3", "--project-dir", str(project))
    assert (result.exit_code, result.stderr) == (2, "error: --nodes 3, but the stack file of 'train' says nodes: 2\n")


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train", "--bucket", "ftp://x"],
            "error: --bucket 'ftp://x': give s3://NAME, gs://NAME or a bare NAME (no path)\n",
        ),
        (
            ["train", "--bucket", "s3://x/health"],
            "error: --bucket 's3://x/health': give s3://NAME, gs://NAME or a bare NAME (no path)\n",
        ),
        (
            ["bad/name", "--bucket", "s3://x"],
            "error: invalid stack name 'bad/name': use 1-100 letters, digits, '-', '_' or '.' (Pulumi's stack-name rule)\n",
        ),
        (
            ["train", "--bucket", "s3://x", "--nodes", "2", "--since", "soon"],
            "error: --since 'soon': give an ISO 8601 time such as 2026-11-30T12:00:00Z\n",
        ),
    ],
)
def test_bad_input_is_exit_2(run_cli, args, message):
    result = run_cli("check", *args)
    assert (result.exit_code, result.stderr) == (2, message)


def test_without_a_stack_file_nodes_are_needed(run_cli, tmp_path):
    result = run_cli("check", "train", "--bucket", "s3://x", "--project-dir", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: no stack file for 'train' ({tmp_path}/stacks/Pulumi.train.yaml): give --bucket "
        "s3://NAME or gs://NAME and --nodes N\n"
    )


def test_without_pulumi_cli_and_without_bucket(run_cli, project, monkeypatch):
    monkeypatch.setenv("PATH", str(project))  # no `pulumi` anywhere
    monkeypatch.setattr(lifecycle, "check_credentials", lambda cloud: None)
    result = run_cli("check", "train", "--project-dir", str(project))
    assert result.exit_code == 6 and result.stderr == f"error: {lifecycle.PULUMI_INSTALL_HINT}\n"
    result = run_cli("check", "train", "--bucket", "b", "--project-dir", str(project))
    assert result.exit_code == 6
    assert result.stderr == (
        f"error: {lifecycle.PULUMI_INSTALL_HINT}; or give --since TIME (the stack's deployment "
        "time) so that results of earlier deployments are not counted\n"
    )


def test_local_checks_only_are_pending_and_exit_8(run_cli, s3):
    """A node that passed its own checks but whose cluster all-reduce has not run is not healthy yet."""
    local = decide(
        expectations_for(spec_for("p4d.24xlarge")),
        _p4d_outputs(all_reduce=None),
        stack="train",
        node="i-0b",
        checked_at=NOW,
        stage="local",
        address="10.0.0.8",
    )
    url = _bucket(s3, "check-pending", {"i-0a": node_doc("i-0a"), "i-0b": local.to_json()})
    result = run_cli("check", "train", "--bucket", url, *FLAGS)
    assert result.exit_code == 8
    lines = result.stdout.splitlines()
    assert "PENDING i-0b: local checks passed; the cluster all-reduce has not run yet" in lines
    assert lines[-1] == "1 of 2 nodes passed"
    assert (
        result.stderr == "error: 1 node(s) passed their local checks but the cluster all-reduce has not run yet: i-0b\n"
    )
