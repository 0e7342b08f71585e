"""The quota and availability preflight of `new` / `up`: EC2 and CloudWatch on moto served on
127.0.0.1, Service Quotas and the Compute Engine REST API as local stand-ins answering in the
APIs' documented shapes, all through the real boto3 / google-cloud-compute clients."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
import yaml

from gpuinfra import preflight
from gpuinfra.errors import ExitCode, NotOfferedError, QuotaError
from tests.blueprints.helpers import make_spec
from tests.replay_server import ReplayServer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
P_ON_DEMAND_DIMENSIONS = {"Class": "P/OnDemand", "Resource": "vCPU", "Service": "EC2", "Type": "Resource"}
P4D_VCPUS = 96  # p4d.24xlarge: 96 vCPUs (the catalog's figure; EC2 DescribeInstanceTypes DefaultVCpus)


def _quotas(p_on_demand: float, p_spot: float = 0.0) -> dict:
    text = (FIXTURES / "service_quotas_ec2.json").read_text()
    data = json.loads(text.replace('"VALUE_P_ON_DEMAND"', str(p_on_demand)).replace('"VALUE_P_SPOT"', str(p_spot)))
    data.pop("_about")
    return data


@pytest.fixture
def aws(moto_url, monkeypatch):
    """Real preflight checks; EC2 / CloudWatch on moto with 96 P on-demand vCPUs in use; returns a
    function that starts the Service Quotas stand-in with given quota values."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setattr(preflight, "CHECKS", {"aws": preflight.check_aws, "gcp": preflight.check_gcp})
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
    cloudwatch = session.client("cloudwatch", region_name="us-east-1", endpoint_url=moto_url)
    cloudwatch.put_metric_data(  # a running p4d.24xlarge: the quota's usage in flight
        Namespace="AWS/Usage",
        MetricData=[
            {
                "MetricName": "ResourceCount",
                "Dimensions": [{"Name": k, "Value": v} for k, v in P_ON_DEMAND_DIMENSIONS.items()],
                "Value": float(P4D_VCPUS),
                "Timestamp": datetime.now(UTC) - timedelta(minutes=2),
            }
        ],
    )
    servers = []

    def start(p_on_demand: float, p_spot: float = 0.0) -> ReplayServer:
        server = ReplayServer(
            [("POST", "/", "ServiceQuotasV20190624.ListServiceQuotas", _quotas(p_on_demand, p_spot))]
        ).__enter__()
        servers.append(server)
        monkeypatch.setattr(
            preflight,
            "make_aws_clients",
            lambda region: (
                session.client("service-quotas", region_name=region, endpoint_url=server.url),
                session.client("ec2", region_name=region, endpoint_url=moto_url),
                session.client("cloudwatch", region_name=region, endpoint_url=moto_url),
            ),
        )
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def test_aws_shortfall_names_the_quota_needed_in_use_granted_and_the_request(aws):
    server = aws(p_on_demand=192)
    spec = make_spec("p4d.24xlarge", nodes=2, region="us-east-1", zone="use1-az1")
    with pytest.raises(QuotaError) as raised:
        preflight.run_preflight(spec)
    # 2 x 96 vCPUs needed, 96 already running, 192 granted: 288 > 192
    assert str(raised.value) == (
        "quota Running On-Demand P instances (L-417A185B) in us-east-1: the cluster needs 192 vCPUs "
        "(2 x p4d.24xlarge x 96), 96 in use, 192 granted; ask for at least 288: aws service-quotas "
        "request-service-quota-increase --service-code ec2 --quota-code L-417A185B --desired-value 288 "
        "--region us-east-1"
    )
    assert raised.value.exit_code == ExitCode.QUOTA_EXCEEDED == 9
    assert [r[2] for r in server.requests] == ["ServiceQuotasV20190624.ListServiceQuotas"]


def test_aws_enough_quota_passes_with_notes(aws):
    aws(p_on_demand=288)  # exactly in use + needed
    spec = make_spec("p4d.24xlarge", nodes=2, region="us-east-1", zone="use1-az1")
    assert preflight.run_preflight(spec) == [
        "EC2 offers p4d.24xlarge in use1-az1",
        "quota Running On-Demand P instances (L-417A185B): 96 in use + 192 vCPUs (2 x p4d.24xlarge x 96) "
        "needed <= 288 granted",
    ]


def test_aws_spot_reads_the_spot_quota(aws):
    aws(p_on_demand=10_000, p_spot=96)
    spec = make_spec("p4d.24xlarge", nodes=2, spot=True, region="us-east-1", zone="use1-az1")
    with pytest.raises(QuotaError, match=r"^quota All P Spot Instance Requests \(L-7212CCBC\) .* needs 192 vCPUs"):
        preflight.run_preflight(spec)


def test_aws_type_not_offered_in_the_zone_is_refused(aws):
    aws(p_on_demand=10_000)
    # moto's offerings (from EC2): g6e.xlarge in use1-az1/2/4/6, not use1-az3
    spec = make_spec("g6e.xlarge", profile="dev", region="us-east-1", zone="use1-az3")
    with pytest.raises(NotOfferedError, match="EC2 does not offer g6e.xlarge in use1-az3") as raised:
        preflight.run_preflight(spec)
    assert raised.value.exit_code == 4


def test_aws_reservation_skips_the_vcpu_quota(aws):
    server = aws(p_on_demand=0)
    spec = make_spec("p4d.24xlarge", nodes=2, region="us-east-1", zone="use1-az1").model_copy(
        update={"capacity_reservation_id": "cr-0123456789abcdef0"}
    )
    notes = preflight.run_preflight(spec)
    assert notes[-1] == "vCPU quota not checked: the nodes launch into cr-0123456789abcdef0"
    assert server.requests == []


def test_an_unreachable_quota_api_is_a_note_not_a_refusal(aws, monkeypatch, moto_url):
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
    dead = "http://127.0.0.1:9"  # nothing listens on the discard port
    monkeypatch.setattr(
        preflight,
        "make_aws_clients",
        lambda region: (
            session.client("service-quotas", region_name=region, endpoint_url=dead),
            session.client("ec2", region_name=region, endpoint_url=moto_url),
            session.client("cloudwatch", region_name=region, endpoint_url=moto_url),
        ),
    )
    notes = preflight.run_preflight(make_spec("p4d.24xlarge", nodes=2, region="us-east-1", zone="use1-az1"))
    assert notes[0] == "EC2 offers p4d.24xlarge in use1-az1"
    assert notes[1].startswith("vCPU quota not checked: Could not connect to the endpoint URL")


@pytest.mark.parametrize(
    ("instance_type", "spot", "names", "expected"),
    [
        # the most specific family wins where the API lists a split quota (EC2 User Guide,
        # using-spot-limits.html: "All P4, P3 and P2 Spot Instance Requests", "All P5 Spot ...")
        (
            "p5.48xlarge",
            True,
            [
                "All P Spot Instance Requests",
                "All P5 Spot Instance Requests",
                "All P4, P3 and P2 Spot Instance Requests",
            ],
            "All P5 Spot Instance Requests",
        ),
        (
            "p4d.24xlarge",
            True,
            ["All P5 Spot Instance Requests", "All P4, P3 and P2 Spot Instance Requests"],
            "All P4, P3 and P2 Spot Instance Requests",
        ),
        ("p6-b200.48xlarge", False, ["Running On-Demand P instances"], "Running On-Demand P instances"),
        (
            "g6e.xlarge",
            False,
            ["Running On-Demand P instances", "Running On-Demand G and VT instances"],
            "Running On-Demand G and VT instances",
        ),
        ("g6e.xlarge", True, ["Running On-Demand G and VT instances"], None),  # on-demand quota never answers spot
        ("p50.xlarge", True, ["All P5 Spot Instance Requests"], None),  # P5 is not P50
        (
            "m7i.large",
            False,
            ["Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"],
            "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
        ),
    ],
)
def test_quota_is_chosen_by_family_and_market(instance_type, spot, names, expected):
    picked = preflight.pick_ec2_quota([{"QuotaName": n} for n in names], instance_type, spot)
    assert (picked or {}).get("QuotaName") == expected


# --- GCP: a Compute REST stand-in through google-cloud-compute -------------------------------


def _gcp_routes(spec, region_quotas, project_quotas, accelerator="nvidia-h100-80gb", offered=True):
    base = "/compute/v1/projects/demo-project"
    routes = [
        ("GET", f"{base}/regions/{spec.region}", None, {"name": spec.region, "quotas": region_quotas}),
    ]
    accelerator_type = {"kind": "compute#acceleratorType", "name": accelerator, "maximumCardsPerInstance": 8}
    missing = (404, '{"error": {"code": 404, "message": "The resource was not found", "status": "NOT_FOUND"}}')
    routes.insert(
        0,
        (
            "GET",
            f"{base}/zones/{spec.zone}/acceleratorTypes/{accelerator}",
            None,
            accelerator_type if offered else missing,
        ),
    )
    routes.append(("GET", base, None, {"name": "demo-project", "quotas": project_quotas}))
    return routes


@pytest.fixture
def gcp(monkeypatch):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    monkeypatch.setattr(preflight, "CHECKS", {"aws": preflight.check_aws, "gcp": preflight.check_gcp})
    servers = []

    def start(routes) -> ReplayServer:
        server = ReplayServer(routes).__enter__()
        servers.append(server)
        kwargs = {
            "credentials": AnonymousCredentials(),
            "client_options": ClientOptions(api_endpoint=server.url),
            "transport": "rest",
        }
        monkeypatch.setattr(
            preflight,
            "make_gcp_clients",
            lambda project: (
                compute_v1.RegionsClient(**kwargs),
                compute_v1.ProjectsClient(**kwargs),
                compute_v1.AcceleratorTypesClient(**kwargs),
                project,
            ),
        )
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def _h100_spec(**kw):
    return make_spec("a3-highgpu-8g", nodes=2, cloud="gcp", gcp_project="demo-project", **kw)


def test_gcp_regional_gpu_shortfall_counts_usage_in_flight(gcp):
    spec = _h100_spec()
    server = gcp(
        _gcp_routes(
            spec,
            [{"metric": "NVIDIA_H100_GPUS", "limit": 16, "usage": 8}, {"metric": "CPUS", "limit": 96, "usage": 0}],
            [{"metric": "GPUS_ALL_REGIONS", "limit": 64, "usage": 8}],
        )
    )
    with pytest.raises(QuotaError) as raised:
        preflight.run_preflight(spec)
    assert str(raised.value) == (
        f"quota NVIDIA_H100_GPUS (NVIDIA_H100_GPUS) in region {spec.region}: the cluster needs 16 GPUs "
        "(2 x 8 nvidia-h100-80gb), 8 in use, 16 granted; ask for at least 24: "
        "https://console.cloud.google.com/iam-admin/quotas?project=demo-project (metric NVIDIA_H100_GPUS, ask for 24)"
    )
    paths = sorted(p.split("?")[0] for _, p, _, _ in server.requests)
    assert paths == [
        "/compute/v1/projects/demo-project",
        f"/compute/v1/projects/demo-project/regions/{spec.region}",
        f"/compute/v1/projects/demo-project/zones/{spec.zone}/acceleratorTypes/nvidia-h100-80gb",
    ]


def test_gcp_spot_uses_the_preemptible_quota_and_the_global_one(gcp):
    spec = _h100_spec(spot=True)
    gcp(
        _gcp_routes(
            spec,
            [
                {"metric": "NVIDIA_H100_GPUS", "limit": 0, "usage": 0},
                {"metric": "PREEMPTIBLE_NVIDIA_H100_GPUS", "limit": 64},
            ],
            [{"metric": "GPUS_ALL_REGIONS", "limit": 12, "usage": 0}],
        )
    )
    with pytest.raises(QuotaError) as raised:
        preflight.run_preflight(spec)
    # the on-demand quota of 0 is not the one a Spot VM uses; the project-wide 12 < 16 is short
    assert str(raised.value).startswith(
        "quota GPUS_ALL_REGIONS (GPUS_ALL_REGIONS) in global: the cluster needs 16 GPUs (2 x 8 nvidia-h100-80gb), "
        "0 in use, 12 granted"
    )


def test_gcp_enough_quota_passes(gcp):
    spec = _h100_spec()
    gcp(
        _gcp_routes(
            spec,
            [{"metric": "NVIDIA_H100_GPUS", "limit": 24, "usage": 8}],
            [{"metric": "GPUS_ALL_REGIONS", "limit": 24, "usage": 8}],
        )
    )
    assert preflight.run_preflight(spec) == [
        f"Compute Engine offers nvidia-h100-80gb in {spec.zone}",
        "quota NVIDIA_H100_GPUS (NVIDIA_H100_GPUS): 8 in use + 16 GPUs (2 x 8 nvidia-h100-80gb) needed <= 24 granted",
        "quota GPUS_ALL_REGIONS (GPUS_ALL_REGIONS): 8 in use + 16 GPUs (2 x 8 nvidia-h100-80gb) needed <= 24 granted",
    ]


def test_gcp_accelerator_not_in_the_zone_is_refused(gcp):
    spec = _h100_spec()
    gcp(_gcp_routes(spec, [], [], offered=False))  # acceleratorTypes.get answers 404
    with pytest.raises(NotOfferedError, match=f"does not offer nvidia-h100-80gb in {spec.zone}"):
        preflight.run_preflight(spec)


# --- wired into `new` and `up` ---------------------------------------------------------------


class _RecordingBackend:
    """Records every call; a stack never deployed."""

    def __init__(self):
        self.calls = []

    def list_stacks(self, project_dir):
        self.calls.append("list_stacks")
        return []

    def up(self, project_dir, stack, on_event, replace_types=()):
        self.calls.append("up")
        return {"create": 30}

    def destroy(self, project_dir, stack, on_event):
        self.calls.append("destroy")
        return {}


def test_up_refuses_a_shortfall_before_anything_is_created(aws, run_cli, tmp_path, monkeypatch):
    from gpuinfra import lifecycle

    args = ("--instance-type", "p4d.24xlarge", "--nodes", "2", "--region", "us-east-1", "--name", "train")
    checks = preflight.CHECKS
    monkeypatch.setattr(preflight, "CHECKS", {"aws": lambda spec, catalog: [], "gcp": lambda spec, catalog: []})
    assert run_cli("new", *args, "--project-dir", str(tmp_path)).exit_code == 0
    monkeypatch.setattr(preflight, "CHECKS", checks)
    stack_file = tmp_path / "stacks" / "Pulumi.train.yaml"
    before = stack_file.read_text()
    zone = yaml.safe_load(before)["config"]["gpuinfra:cluster"]["zone"]
    aws(p_on_demand=192)
    backend = _RecordingBackend()
    monkeypatch.setattr(lifecycle, "make_backend", lambda: backend)
    result = run_cli("up", "train", "--project-dir", str(tmp_path))
    assert result.exit_code == 9
    assert result.stderr.startswith(
        "error: quota Running On-Demand P instances (L-417A185B) in us-east-1: the cluster needs 192 vCPUs"
    )
    assert backend.calls == ["list_stacks"]  # no `up`, no create
    assert stack_file.read_text() == before  # not even a deployment id written
    assert zone.startswith("use1-az")


def test_new_with_credentials_refuses_a_shortfall_and_writes_nothing(aws, run_cli, tmp_path):
    aws(p_on_demand=0)
    result = run_cli(
        "new",
        "--instance-type",
        "p4d.24xlarge",
        "--nodes",
        "2",
        "--region",
        "us-east-1",
        "--project-dir",
        str(tmp_path),
    )
    assert result.exit_code == 9, result.stderr
    assert "quota Running On-Demand P instances (L-417A185B)" in result.stderr
    assert not (tmp_path / "stacks").exists() or not list((tmp_path / "stacks").glob("Pulumi.*.yaml"))


def test_new_without_credentials_says_the_preflight_did_not_run(run_cli, tmp_path, monkeypatch):
    from tests.conftest import without_aws_credentials

    monkeypatch.setattr(preflight, "CHECKS", {"aws": preflight.check_aws, "gcp": preflight.check_gcp})
    without_aws_credentials(monkeypatch, tmp_path)
    result = run_cli(
        "new",
        "--instance-type",
        "p4d.24xlarge",
        "--nodes",
        "2",
        "--region",
        "us-east-1",
        "--project-dir",
        str(tmp_path),
    )
    assert result.exit_code == 0
    assert [line for line in result.stderr.splitlines() if line.startswith("preflight:")] == [
        "preflight: quota preflight not run: no AWS credentials found"
    ]


def test_gcp_unreachable_api_is_notes_not_a_refusal(monkeypatch):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    monkeypatch.setattr(preflight, "CHECKS", {"aws": preflight.check_aws, "gcp": preflight.check_gcp})
    kwargs = {
        "credentials": AnonymousCredentials(),
        "client_options": ClientOptions(api_endpoint="http://127.0.0.1:9"),  # nothing listens there
        "transport": "rest",
    }
    monkeypatch.setattr(
        preflight,
        "make_gcp_clients",
        lambda project: (
            compute_v1.RegionsClient(**kwargs),
            compute_v1.ProjectsClient(**kwargs),
            compute_v1.AcceleratorTypesClient(**kwargs),
            project,
        ),
    )
    notes = preflight.run_preflight(_h100_spec())
    assert [n.split(":")[0] for n in notes] == [
        f"accelerator in {_h100_spec().zone} not checked",
        "quota NVIDIA_H100_GPUS not checked",
        "quota GPUS_ALL_REGIONS not checked",
    ]
