"""`gpuinfra check STACK`: node results read from moto S3 on 127.0.0.1, printed per node, exit 8
when a node failed or no result exists yet, exit 6 without credentials."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import boto3
import pytest

from gpuinfra import lifecycle
from gpuinfra.health.gate import health_key
from gpuinfra.health.report import evaluate
from tests.health.test_gate import _p4d_outputs


NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def node_doc(node: str, **changes) -> str:
    return evaluate("p4d.24xlarge", _p4d_outputs(**changes), nodes=2, stack="train", node=node,
                    checked_at=NOW).to_json()


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
    result = run_cli("check", "train", "--bucket", url)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "health gate of stack train: s3://check-pass/health/train/ (2 nodes)"
    assert lines[-1] == "2 of 2 nodes passed"
    rows = [line for line in lines if line.startswith("│ i-0")]
    assert len(rows) == 2
    assert all("78.33 / 77.35" in row and row.rstrip(" │").endswith("PASS") for row in rows)
    assert result.stderr == ""


def test_a_failed_node_is_named_with_its_checks_and_exits_8(run_cli, s3):
    url = _bucket(s3, "check-fail", {
        "i-0a": node_doc("i-0a"),
        "i-0b": node_doc("i-0b", fabric_manager="failed\n",
                         fi_info=(_p4d_outputs().fi_info.rsplit("provider: efa", 1)[0])),
    })
    result = run_cli("check", "train", "--bucket", url)
    assert result.exit_code == 8
    lines = result.stdout.splitlines()
    assert "FAIL i-0b fabric_manager: nvidia-fabricmanager is failed" in lines
    assert "FAIL i-0b efa_devices: 3 of 4 EFA devices (efa_0, efa_1, efa_2)" in lines
    assert lines[-1] == "1 of 2 nodes passed"
    assert result.stderr == "error: 1 of 2 nodes failed the health gate or have an unreadable result: i-0b\n"


def test_low_bandwidth_shows_measured_vs_expected(run_cli, s3):
    from tests.health.conftest import fixture_text

    low = evaluate("p5.48xlarge", _p4d_outputs(all_reduce=fixture_text("all_reduce_p5_2node_lowbw_derived.txt"),
                                               fi_info=None), nodes=2, stack="train", node="i-0c", checked_at=NOW)
    url = _bucket(s3, "check-low", {"i-0c": low.to_json()})
    result = run_cli("check", "train", "--bucket", url)
    assert result.exit_code == 8
    assert any("301.44 / 437.79" in line and "FAIL" in line for line in result.stdout.splitlines())
    assert ("FAIL i-0c allreduce_busbw: 301.44 GB/s at 2147483648 B, needs >= 0.8 x 437.79 = 350.23 GB/s "
            "(inter-node baseline)") in result.stdout.splitlines()


def test_unreadable_result_is_listed_and_fails(run_cli, s3):
    url = _bucket(s3, "check-invalid", {"i-0a": node_doc("i-0a"), "i-0z": b'{"schema_version": "9"}'})
    result = run_cli("check", "train", "--bucket", url)
    assert result.exit_code == 8
    lines = result.stdout.splitlines()
    assert "INVALID health/train/i-0z.json: schema_version '9', this gpuinfra reads '1'" in lines
    assert lines[-1] == "1 of 1 nodes passed; 1 result(s) unreadable"
    assert result.stderr == ("error: 1 of 2 nodes failed the health gate or have an unreadable result: "
                             "health/train/i-0z.json\n")


def test_no_results_yet_is_a_different_message(run_cli, s3):
    url = _bucket(s3, "check-empty", {})
    result = run_cli("check", "train", "--bucket", url)
    assert result.exit_code == 8 and result.stdout == ""
    assert result.stderr == ("error: no health results under s3://check-empty/health/train/ yet: each node writes its "
                             "result there after its boot checks; run this again when the nodes are up\n")


def test_json_output(run_cli, s3):
    url = _bucket(s3, "check-json", {"i-0a": node_doc("i-0a"), "i-0b": node_doc("i-0b", fabric_manager="failed")})
    result = run_cli("check", "train", "--bucket", url, "--json")
    assert result.exit_code == 8
    doc = json.loads(result.stdout)
    assert list(doc) == ["schema_version", "stack", "results", "passed", "nodes", "invalid"]
    assert (doc["schema_version"], doc["stack"], doc["results"], doc["passed"]) == (
        "1", "train", "s3://check-json/health/train/", False)
    assert [(n["node"], n["passed"]) for n in doc["nodes"]] == [("i-0a", True), ("i-0b", False)]
    busbw = next(c for c in doc["nodes"][0]["checks"] if c["name"] == "allreduce_busbw")
    assert (busbw["measured"], busbw["expected"], busbw["passed"]) == (78.33, 77.35, True)
    assert doc["invalid"] == [] and "$" not in result.stdout and "usd" not in result.stdout.lower()
    assert result.stderr.startswith("error: 1 of 2 nodes failed the health gate")


def test_no_credentials_is_exit_6_in_one_line(run_cli, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    result = run_cli("check", "train", "--bucket", "s3://check-nocreds")
    assert result.exit_code == 6 and result.stdout == ""
    assert result.stderr == ("error: no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
                             "AWS_SECRET_ACCESS_KEY (`aws configure`)\n")


@pytest.fixture
def project(run_cli, tmp_path):
    assert run_cli("new", "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "train",
                   "--project-dir", str(tmp_path)).exit_code == 0
    return tmp_path


class Outputs:
    def __init__(self, outputs):
        self.outputs_given, self.calls = outputs, []

    def outputs(self, project_dir, stack):
        self.calls.append(("outputs", stack))
        return self.outputs_given


def test_bucket_from_the_stacks_pulumi_outputs(run_cli, s3, project, monkeypatch):
    _bucket(s3, "check-train-outputs", {"i-0a": node_doc("i-0a")})
    backend = Outputs({"bucket_name": "check-train-outputs"})
    monkeypatch.setattr(lifecycle, "make_backend", lambda: backend)
    result = run_cli("check", "train", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert backend.calls == [("outputs", "train")]
    assert result.stdout.splitlines()[0] == "health gate of stack train: s3://check-train-outputs/health/train/ (1 nodes)"
    # a bare --bucket name takes the cloud from the stack file; Pulumi is not asked
    backend.calls.clear()
    assert run_cli("check", "train", "--bucket", "check-train-outputs", "--project-dir", str(project)).exit_code == 0
    assert backend.calls == []


def test_stack_without_bucket_output(run_cli, s3, project, monkeypatch):
    monkeypatch.setattr(lifecycle, "make_backend", lambda: Outputs({}))
    result = run_cli("check", "train", "--project-dir", str(project))
    assert result.exit_code == 2
    assert result.stderr == ("error: stack 'train' has no bucket_name output (is it deployed? `gpuinfra up train`); "
                             "or give --bucket\n")


@pytest.mark.parametrize("args, message", [
    (["train", "--bucket", "ftp://x"], "error: --bucket 'ftp://x': give s3://NAME, gs://NAME or a bare NAME (no path)\n"),
    (["train", "--bucket", "s3://x/health"],
     "error: --bucket 's3://x/health': give s3://NAME, gs://NAME or a bare NAME (no path)\n"),
    (["bad/name", "--bucket", "s3://x"],
     "error: invalid stack name 'bad/name': use 1-100 letters, digits, '-', '_' or '.' (Pulumi's stack-name rule)\n"),
])
def test_bad_input_is_exit_2(run_cli, args, message):
    result = run_cli("check", *args)
    assert (result.exit_code, result.stderr) == (2, message)


def test_without_pulumi_cli_and_without_bucket(run_cli, project, monkeypatch):
    monkeypatch.setenv("PATH", str(project))  # no `pulumi` anywhere
    result = run_cli("check", "train", "--project-dir", str(project))
    assert result.exit_code == 6 and result.stderr == f"error: {lifecycle.PULUMI_INSTALL_HINT}\n"
