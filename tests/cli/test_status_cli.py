"""`gpuinfra status STACK`: EC2 instances and CloudWatch metrics from moto on 127.0.0.1 (AWS),
Compute and Cloud Monitoring answered by a local server through Google's real clients (GCP);
exact utilization means and cost so far from the stack file's catalog price and the launch
times; one line and exit 6 without credentials, exit 2 for a stack that is not deployed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import boto3
import pytest
import yaml

from gpuinfra import lifecycle
from gpuinfra.services import monitoring_sources as sources
from gpuinfra.stackfile import read_stack_spec
from tests.conftest import without_aws_credentials
from tests.replay_server import ReplayServer


class Backend:
    """Pulumi outputs of a deployed stack (the Automation API boundary)."""

    def __init__(self, outputs):
        self.given = outputs

    def outputs(self, project_dir, stack):
        if self.given is None:
            raise lifecycle.SpecError(
                f"stack {stack!r} is not deployed (no Pulumi state); run `gpuinfra up {stack}` first"
            )
        return self.given


@pytest.fixture
def aws_env(moto_url, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    return moto_url


@pytest.fixture
def aws_project(run_cli, tmp_path):
    assert (
        run_cli(
            "new", "--instance-type", "p5.48xlarge", "--nodes", "2", "--name", "watch", "--project-dir", str(tmp_path)
        ).exit_code
        == 0
    )
    return tmp_path


def _stack_id(project) -> str:
    """``watch-<suffix>``: the stack id `new` gave stack ``watch`` (tag ``gpuinfra:stack-id``,
    namespace ``gpuinfra/<stack id>``); status lists instances by it."""
    return f"watch-{read_stack_spec(project, 'watch').name_suffix}"


def _launch(moto_url, stack: str, count: int) -> list[tuple[str, datetime]]:
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_url)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    made = ec2.run_instances(
        ImageId=image,
        MinCount=count,
        MaxCount=count,
        InstanceType="p5.48xlarge",
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [{"Key": "gpuinfra:stack", "Value": "watch"}, {"Key": "gpuinfra:stack-id", "Value": stack}],
            }
        ],
    )
    return sorted((i["InstanceId"], i["LaunchTime"]) for i in made["Instances"])


def _put(
    moto_url, namespace: str, instance: str, index: str, start: datetime, values: list[float], memory_mib: float
) -> None:
    cw = boto3.client("cloudwatch", region_name="us-east-1", endpoint_url=moto_url)
    dims = [
        {"Name": "InstanceId", "Value": instance},
        {"Name": "index", "Value": index},
        {"Name": "name", "Value": "NVIDIA H100 80GB HBM3"},
    ]
    data = [
        {
            "MetricName": "nvidia_smi_utilization_gpu",
            "Dimensions": dims,
            "Timestamp": start + timedelta(minutes=i),
            "Value": v,
        }
        for i, v in enumerate(values)
    ]
    data += [
        {
            "MetricName": "nvidia_smi_memory_used",
            "Dimensions": dims,
            "Timestamp": start + timedelta(minutes=i),
            "Value": memory_mib,
        }
        for i in range(len(values))
    ]
    for chunk in range(0, len(data), 20):
        cw.put_metric_data(Namespace=namespace, MetricData=data[chunk : chunk + 20])


def test_aws_status_reads_moto_and_computes_exact_figures(run_cli, aws_env, aws_project, monkeypatch):
    stack = "watch"
    (i1, launched), (i2, launched2) = _launch(aws_env, _stack_id(aws_project), 2)
    now = launched.astimezone(UTC).replace(microsecond=0) + timedelta(minutes=90)
    start = now.replace(second=0) - timedelta(minutes=59)
    namespace = f"gpuinfra/{_stack_id(aws_project)}"
    # each node bills from its own LaunchTime (moto may give the two a second apart)
    node_hours = sum(Decimal(str((now - t).total_seconds())) / 3600 for t in (launched, launched2))
    # i1 GPU 0: 60 minutes at 90 % -> mean 90; GPU 1: 30 min at 0 then 30 min at 80 -> mean 40
    _put(aws_env, namespace, i1, "0", start, [90.0] * 60, 40960.0)
    _put(aws_env, namespace, i1, "1", start, [0.0] * 30 + [80.0] * 30, 1024.0)
    # i2 GPU 0: the last 10 minutes under the idle threshold (5 %), busy before
    _put(aws_env, namespace, i2, "0", start, [50.0] * 50 + [1.0] * 10, 512.0)
    monkeypatch.setattr(lifecycle, "make_backend", lambda: Backend({"monitoring_namespace": namespace}))
    monkeypatch.setattr(sources, "utc_now", lambda: now)
    result = run_cli("status", stack, "--json", "--project-dir", str(aws_project))
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    gpus = {(g["node"], g["gpu"]): g for g in doc["gpus"]}
    assert gpus[(i1, "0")]["utilization_percent_hour_mean"] == 90.0
    assert gpus[(i1, "1")]["utilization_percent_hour_mean"] == 40.0
    assert gpus[(i2, "0")]["utilization_percent_hour_mean"] == 41.83  # (50 x 50 + 1 x 10) / 60
    assert gpus[(i1, "0")]["utilization_percent_now"] == 90.0 and gpus[(i2, "0")]["utilization_percent_now"] == 1.0
    assert gpus[(i1, "0")]["memory_used_gib_now"] == 40.0  # 40960 MiB
    assert doc["utilization_percent_hour_mean"] == 57.28  # (90 + 40 + 41.8333) / 3
    # cost: the stack file's on-demand p5.48xlarge price (the catalog's) x about 1.5 h x 2 nodes
    spec = read_stack_spec(aws_project, stack)
    per_node = Decimal(spec.price.on_demand_price_per_hour_usd)
    assert Decimal(doc["price_per_node_hour_usd"]) == per_node
    assert abs(node_hours - 3) < Decimal("0.001")
    assert Decimal(doc["cost_so_far_usd"]) == (per_node * node_hours).quantize(Decimal("0.01"))
    hours_left = Decimal(int((spec.expires_at - now).total_seconds())) / 3600
    assert Decimal(doc["projected_to_ttl_usd"]) == (per_node * node_hours + per_node * 2 * hours_left).quantize(
        Decimal("0.01")
    )
    assert [n["state"] for n in doc["nodes"]] == ["running", "running"]
    # every GPU under 5 % only in the last minute? no: i1 GPU 0 is at 90 %, so the cluster is busy
    assert doc["idle_since"] is None


def test_aws_idle_cluster_and_table_and_html(run_cli, aws_env, aws_project, monkeypatch, tmp_path):
    stack = "watch"
    (i1, launched), (i2, _) = _launch(aws_env, _stack_id(aws_project), 2)
    namespace = "gpuinfra/idle-test"
    now = launched.astimezone(UTC).replace(microsecond=0) + timedelta(minutes=70)
    start = now.replace(second=0) - timedelta(minutes=59)
    _put(aws_env, namespace, i1, "0", start, [60.0] * 40 + [2.0] * 20, 100.0)
    _put(aws_env, namespace, i2, "0", start, [70.0] * 45 + [0.0] * 15, 100.0)
    monkeypatch.setattr(lifecycle, "make_backend", lambda: Backend({"monitoring_namespace": namespace}))
    monkeypatch.setattr(sources, "utc_now", lambda: now)
    page = tmp_path / "report.html"
    result = run_cli("status", stack, "--html", str(page), "--project-dir", str(aws_project))
    assert result.exit_code == 0, result.stderr
    idle_since = start + timedelta(minutes=45)  # the last minute any GPU was >= 5 % is minute 44
    spec = read_stack_spec(aws_project, stack)
    ends = idle_since + timedelta(minutes=spec.profile.idle_timeout_minutes)
    assert (
        f"IDLE: every GPU under 5% since {idle_since:%H:%M} UTC; the node agent ends the cluster at {ends:%H:%M} UTC"
    ) in result.stdout
    assert "busiest GPU per minute, last 60 min: |" in result.stdout
    assert page.read_text().startswith("<!DOCTYPE html>") and 'id="gpuinfra-utilization"' in page.read_text()


def test_no_aws_credentials_is_exit_6_in_one_line(run_cli, aws_project, monkeypatch, tmp_path):
    without_aws_credentials(monkeypatch, tmp_path)
    result = run_cli("status", "watch", "--project-dir", str(aws_project))
    assert (result.exit_code, result.stdout) == (6, "")
    assert result.stderr == (
        "error: no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
        "AWS_SECRET_ACCESS_KEY (`aws configure`)\n"
    )


def test_stack_not_deployed_is_exit_2_in_one_line(run_cli, aws_env, aws_project, monkeypatch):
    monkeypatch.setattr(lifecycle, "make_backend", lambda: Backend(None))
    result = run_cli("status", "watch", "--project-dir", str(aws_project))
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "error: stack 'watch' is not deployed (no Pulumi state); run `gpuinfra up watch` first\n"
    monkeypatch.setattr(lifecycle, "make_backend", lambda: Backend({}))
    result = run_cli("status", "watch", "--project-dir", str(aws_project))
    assert (result.exit_code, result.stderr) == (
        2,
        "error: stack 'watch' is not deployed (its Pulumi state has no outputs); run `gpuinfra up watch`\n",
    )


def test_no_stack_file_and_watch_with_json_are_exit_2(run_cli, tmp_path):
    result = run_cli("status", "nothing", "--project-dir", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: no stack file for 'nothing' ({tmp_path}/stacks/Pulumi.nothing.yaml); write one "
        "with `gpuinfra new` or give --project-dir\n"
    )
    result = run_cli("status", "nothing", "--watch", "--json", "--project-dir", str(tmp_path))
    assert (result.exit_code, result.stderr) == (
        2,
        "error: --watch shows a live view: use --json or --html without it\n",
    )


# ------------------------------------------------------------------------------------- GCP
def _ts(metric: str, instance_id: str, gpu: str, start: datetime, values: list[float], extra_labels=None) -> dict:
    """A TimeSeries as projects.timeSeries.list returns it (points newest first)."""
    points = [
        {
            "interval": {
                "startTime": (start + timedelta(minutes=i - 1)).isoformat().replace("+00:00", "Z"),
                "endTime": (start + timedelta(minutes=i)).isoformat().replace("+00:00", "Z"),
            },
            "value": {"doubleValue": v},
        }
        for i, v in enumerate(values)
    ]
    return {
        "metric": {"type": metric, "labels": {"gpu_number": gpu, **(extra_labels or {})}},
        "resource": {"type": "gce_instance", "labels": {"instance_id": instance_id, "zone": "us-central1-a"}},
        "metricKind": "GAUGE",
        "valueType": "DOUBLE",
        "points": list(reversed(points)),
    }


def test_gcp_status_through_the_real_clients(run_cli, tmp_path, monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession
    from google.cloud import compute_v1

    assert (
        run_cli(
            "new",
            "--instance-type",
            "a3-megagpu-8g",
            "--nodes",
            "1",
            "--name",
            "gwatch",
            "--gcp-project",
            "proj-1",
            "--project-dir",
            str(tmp_path),
        ).exit_code
        == 0
    )
    spec = read_stack_spec(tmp_path, "gwatch")
    now = datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)
    start = now.replace(second=0) - timedelta(minutes=59)
    launched = now - timedelta(hours=2, minutes=15)
    instances = {
        "items": [
            {
                "id": "111",
                "name": "gwatch-abcd",
                "status": "RUNNING",
                "creationTimestamp": (launched - timedelta(minutes=1)).isoformat(),
                "lastStartTimestamp": launched.isoformat(),
            }
        ]
    }
    util = {
        "timeSeries": [
            _ts("agent.googleapis.com/gpu/utilization", "111", "0", start, [30.0] * 30 + [60.0] * 30),
            _ts("agent.googleapis.com/gpu/utilization", "111", "1", start, [100.0] * 60),
        ]
    }
    memory = {
        "timeSeries": [
            _ts(
                "agent.googleapis.com/gpu/memory/bytes_used",
                "111",
                "0",
                start,
                [float(8 * 1024**3)] * 60,
                {"memory_state": "used"},
            )
        ]
    }
    with ReplayServer(
        [
            ("GET", f"/compute/v1/projects/proj-1/zones/{spec.zone}/instances", None, instances),
            (
                "GET",
                "/v3/projects/proj-1/timeSeries?filter=metric.type+%3D+%22agent.googleapis.com%2Fgpu%2Futilization",
                None,
                util,
            ),
            (
                "GET",
                "/v3/projects/proj-1/timeSeries?filter=metric.type+%3D+%22agent.googleapis.com%2Fgpu%2Fmemory",
                None,
                memory,
            ),
        ]
    ) as server:
        options = {"api_endpoint": server.url}
        clients = (
            compute_v1.InstancesClient(credentials=AnonymousCredentials(), client_options=options),
            AuthorizedSession(AnonymousCredentials()),
            server.url,
        )
        monkeypatch.setattr(sources, "make_gcp_clients", lambda: clients)
        monkeypatch.setattr(lifecycle, "check_credentials", lambda cloud: None)
        monkeypatch.setattr(
            lifecycle,
            "make_backend",
            lambda: Backend({"monitoring_project": "proj-1", "monitoring_dashboard": "projects/1/dashboards/d"}),
        )
        monkeypatch.setattr(sources, "utc_now", lambda: now)
        result = run_cli("status", "gwatch", "--json", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [
        (g["node"], g["gpu"], g["utilization_percent_hour_mean"], g["utilization_percent_now"]) for g in doc["gpus"]
    ] == [("gwatch-abcd", "0", 45.0, 60.0), ("gwatch-abcd", "1", 100.0, 100.0)]
    assert doc["gpus"][0]["memory_used_gib_now"] == 8.0
    per_node = Decimal(spec.price.on_demand_price_per_hour_usd)
    assert Decimal(doc["cost_so_far_usd"]) == (per_node * Decimal("2.25")).quantize(Decimal("0.01"))
    assert doc["nodes"] == [
        {
            "id": "gwatch-abcd",
            "state": "RUNNING",
            "launched_at": launched.isoformat().replace("+00:00", "Z"),
            "ended_at": None,
        }
    ]
    sent = [path for method, path, _, _ in server.requests if "/timeSeries" in path]
    assert any("resource.labels.instance_id+%3D+one_of%28%22111%22%29" in p for p in sent)
    assert any("aggregation.perSeriesAligner=ALIGN_MEAN" in p and "aggregation.alignmentPeriod=60s" in p for p in sent)
    compute = [path for _, path, _, _ in server.requests if "/instances" in path][0]
    # the stack's own VMs: its unique stack-id label, not the name every stack called gwatch shares
    assert "labels.gpuinfra-stack-id" in compute.replace("%2D", "-")


# ------------------------------------------------------------------------------ --watch, errors
class _Stop(Exception):
    pass


def test_watch_keeps_the_last_view_on_a_failed_refresh_and_ctrl_c_exits_0(run_cli, aws_env, aws_project, monkeypatch):
    from gpuinfra.errors import OperationError
    from gpuinfra.monitoring import render

    stack = "watch"
    (i1, launched), _ = _launch(aws_env, _stack_id(aws_project), 2)
    now = launched.astimezone(UTC).replace(microsecond=0) + timedelta(minutes=30)
    _put(
        aws_env,
        f"gpuinfra/{_stack_id(aws_project)}",
        i1,
        "0",
        now.replace(second=0) - timedelta(minutes=9),
        [77.0] * 10,
        100.0,
    )
    monkeypatch.setattr(
        lifecycle, "make_backend", lambda: Backend({"monitoring_namespace": f"gpuinfra/{_stack_id(aws_project)}"})
    )
    monkeypatch.setattr(sources, "utc_now", lambda: now)
    real_collect, calls, pauses = sources.collect, [], []

    def collect(spec, outputs):
        calls.append(1)
        if len(calls) == 2:  # the first refresh: a transient cloud error
            raise OperationError("reading stack 'watch' from AWS failed: InternalFailure")
        return real_collect(spec, outputs)

    def pause(seconds):
        pauses.append(seconds)
        if len(pauses) == 3:
            raise KeyboardInterrupt  # Ctrl-C during the third wait

    real_renderable, views = render.renderable, []

    def renderable(status, error=None):
        views.append((status, error))
        return real_renderable(status, error)

    monkeypatch.setattr(sources, "collect", collect)
    monkeypatch.setattr(render, "pause", pause)
    monkeypatch.setattr(render, "renderable", renderable)
    result = run_cli("status", stack, "--watch", "--interval", "10", "--project-dir", str(aws_project))
    assert (result.exit_code, result.stderr) == (0, "")
    assert pauses == [10, 10, 10] and len(calls) == 3  # first view, failed refresh, good refresh
    (first, no_error), (kept, error), (fresh, cleared) = views
    assert kept is first and (no_error, cleared) == (None, None) and fresh is not first
    assert error == "reading stack 'watch' from AWS failed: InternalFailure"
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(real_renderable(kept, error))
    assert "refresh failed, showing the view of " + f"{now:%H:%M:%S} UTC: {error}" in console.export_text()
    assert "Traceback" not in result.stdout


class _FailingClient:
    def __init__(self, code, status):
        from botocore.exceptions import ClientError

        self.error = ClientError(
            {"Error": {"Code": code, "Message": "no"}, "ResponseMetadata": {"HTTPStatusCode": status}},
            "DescribeInstances",
        )

    def get_paginator(self, name):
        raise self.error


@pytest.mark.parametrize(
    "code, status, exit_code, text",
    [
        (
            "UnauthorizedOperation",
            403,
            6,
            "error: cannot read stack 'watch' in us-east-1: UnauthorizedOperation; check the "
            "AWS credentials and their ec2:DescribeInstances",
        ),
        ("AccessDenied", 403, 6, "error: cannot read stack 'watch' in us-east-1: AccessDenied;"),
        ("InternalError", 500, 7, "error: reading stack 'watch' from AWS failed: InternalError\n"),
    ],
)
def test_aws_denied_is_exit_6_and_a_cloud_500_is_exit_7(
    run_cli, aws_env, aws_project, monkeypatch, code, status, exit_code, text
):
    monkeypatch.setattr(lifecycle, "make_backend", lambda: Backend({"monitoring_namespace": "gpuinfra/watch"}))
    monkeypatch.setattr(boto3, "client", lambda *a, **k: _FailingClient(code, status))
    result = run_cli("status", "watch", "--project-dir", str(aws_project))
    assert (result.exit_code, result.stdout) == (exit_code, "")
    assert result.stderr.startswith(text) and result.stderr.count("\n") == 1


def test_gcp_without_credentials_is_exit_6_in_one_line(run_cli, tmp_path, monkeypatch):
    assert (
        run_cli(
            "new",
            "--instance-type",
            "a3-megagpu-8g",
            "--nodes",
            "1",
            "--name",
            "gwatch",
            "--gcp-project",
            "proj-1",
            "--project-dir",
            str(tmp_path),
        ).exit_code
        == 0
    )
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setattr(lifecycle, "make_backend", lambda: Backend({"monitoring_project": "proj-1"}))
    result = run_cli("status", "gwatch", "--project-dir", str(tmp_path))
    assert (result.exit_code, result.stdout) == (6, "")
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "credentials" in result.stderr.lower()


def test_gcp_server_error_is_exit_7_and_forbidden_exit_6(run_cli, tmp_path, monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession
    from google.cloud import compute_v1

    assert (
        run_cli(
            "new",
            "--instance-type",
            "a3-megagpu-8g",
            "--nodes",
            "1",
            "--name",
            "gwatch",
            "--gcp-project",
            "proj-1",
            "--project-dir",
            str(tmp_path),
        ).exit_code
        == 0
    )
    spec = read_stack_spec(tmp_path, "gwatch")
    monkeypatch.setattr(lifecycle, "check_credentials", lambda cloud: None)
    monkeypatch.setattr(lifecycle, "make_backend", lambda: Backend({"monitoring_project": "proj-1"}))
    for status, exit_code in ((500, 7), (403, 6)):
        error = {"error": {"code": status, "message": "boom", "errors": [{"message": "boom", "reason": "x"}]}}
        with ReplayServer(
            [("GET", f"/compute/v1/projects/proj-1/zones/{spec.zone}/instances", None, (status, error))]
        ) as server:
            clients = (
                compute_v1.InstancesClient(
                    credentials=AnonymousCredentials(), client_options={"api_endpoint": server.url}
                ),
                AuthorizedSession(AnonymousCredentials()),
                server.url,
            )
            monkeypatch.setattr(sources, "make_gcp_clients", lambda clients=clients: clients)
            result = run_cli("status", "gwatch", "--project-dir", str(tmp_path))
        assert (result.exit_code, result.stdout) == (exit_code, ""), result.stderr
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_status_prices_from_the_catalog_and_says_incomplete_without_a_price(run_cli, aws_env, aws_project, monkeypatch):
    """A hand-edited price in the stack file is not used: the node-hour is the catalog's
    p5.48xlarge on-demand price in us-east-1, $55.04 (https://aws.amazon.com/ec2/pricing/on-demand/);
    moved by hand into a zone with no offer, the stack has no price: null in JSON, "incomplete"
    in the text, never $0."""
    (_i1, launched), _ = _launch(aws_env, _stack_id(aws_project), 2)
    now = launched.astimezone(UTC).replace(microsecond=0) + timedelta(minutes=30)
    namespace = f"gpuinfra/{_stack_id(aws_project)}"
    monkeypatch.setattr(lifecycle, "make_backend", lambda: Backend({"monitoring_namespace": namespace}))
    monkeypatch.setattr(sources, "utc_now", lambda: now)
    path = aws_project / "stacks" / "Pulumi.watch.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["price"]["on_demand_price_per_hour_usd"] = "0.01"
    path.write_text(yaml.safe_dump(doc))
    edited = json.loads(run_cli("status", "watch", "--json", "--project-dir", str(aws_project)).stdout)
    assert edited["price_per_node_hour_usd"] == "55.040000" and Decimal(edited["cost_so_far_usd"]) > 50
    doc["config"]["gpuinfra:cluster"]["zone"] = "use1-az9"  # no p5 offer there
    path.write_text(yaml.safe_dump(doc))
    moved = run_cli("status", "watch", "--json", "--project-dir", str(aws_project))
    assert moved.exit_code == 0, moved.stderr
    figures = json.loads(moved.stdout)
    assert [k for k in ("price_per_node_hour_usd", "cost_so_far_usd", "projected_to_ttl_usd") if figures[k]] == []
    text = run_cli("status", "watch", "--project-dir", str(aws_project)).stdout
    cost_line = next(line for line in text.splitlines() if "cost so far" in line)
    assert "cost so far incomplete: 1 line without a price" in cost_line and "$" not in cost_line
