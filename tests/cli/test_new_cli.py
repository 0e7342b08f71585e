"""`gpuinfra new` writes a reviewable stack file, and writes nothing on bad input."""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from gpuinfra.stackfile import read_stack_spec
from tests.conftest import gpuinfra_exe


def test_new_writes_stack_and_scaffold(run_cli, tmp_path):
    result = run_cli("new", "--gpus", "4xA100", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    stack = tmp_path / "stacks" / "Pulumi.gcp-4xa100.yaml"
    assert stack.is_file()
    assert (tmp_path / "Pulumi.yaml").is_file() and (tmp_path / "program" / "__main__.py").is_file()
    project = yaml.safe_load((tmp_path / "Pulumi.yaml").read_text())
    assert project["runtime"]["name"] == "python" and project["stackConfigDir"] == "stacks"
    doc = yaml.safe_load(stack.read_text())
    cluster = doc["config"]["gpuinfra:cluster"]
    assert (cluster["cloud"], cluster["instance_type"], cluster["gpu"], cluster["gpu_count"], cluster["nodes"]) == (
        "gcp",
        "a2-highgpu-4g",
        "A100",
        4,
        1,
    )
    # the cheapest real on-demand 4xA100 (not europe-west4 at a DWS flex-start price posing as on-demand)
    assert doc["config"]["gcp:zone"] == cluster["zone"] == "us-central1-a"
    assert cluster["profile"]["name"] == "llm-finetune" and cluster["profile"]["ttl_hours"] == 72
    assert cluster["price"] == {
        "on_demand_price_per_hour_usd": "14.69354",
        "spot_price_per_hour_usd": "7.71208",  # pricing.yml @fd66b26 (2026-07-30) hour_spot
        "catalog_date": "2026-08-20 (on-demand); 2026-07-30 (spot; N1-attached, A3 Ultra, A4 spot undated (imported 2026-11-22))",
    }
    spec = read_stack_spec(tmp_path, "gcp-4xa100")
    assert spec.instance_type == "a2-highgpu-4g" and spec.run_hours == 24
    # 4 local SSDs (a2-highgpu-4g takes 4 or 8: cloud.google.com/compute/docs/disks/local-ssd
    # #choose_number_local_ssds) at $0.08/GiB-month in us-central1: 1500 GiB / 730 h x 0.08 = $0.1644/h
    # + GPU monitoring (one alert condition at $1.50/month and the agent's series: tests/monitoring)
    # + noncurrent checkpoint versions, at most the 500 GB bucket once more: 500 x $0.020 / 730 = $0.0137/h
    # + Cloud NAT data: the node's 15 GB container pull and its 20 GB egress (no external IP on GCP)
    #   on top of the 100 GB fetched: 35 GB x $0.045 = $1.575 more a run
    assert "compute: $14.69/h ($3.673/GPU-h); all 23 resources: $15.28/h, $366.66 for a 24 h run" in result.stdout
    assert "next: gpuinfra preview gcp-4xa100   then   gpuinfra up gcp-4xa100" in result.stdout
    assert "catalog 2026-08-20 (on-demand); 2026-07-30 (spot" in stack.read_text()
    # the header points at gpuinfra's own up/down (they check TTL, formation and sync checkpoints);
    # plain Pulumi is named only as the path that skips those
    header = [line for line in stack.read_text().splitlines() if line.startswith("#")]
    assert any(line.startswith("#                 gpuinfra up gcp-4xa100 ") for line in header)
    assert any(line.startswith("# Destroy after training: gpuinfra down gcp-4xa100 ") for line in header)
    assert [line for line in header if "pulumi up" in line or "pulumi destroy" in line] == [
        "# `pulumi up` / `pulumi destroy -s gcp-4xa100` work too but skip those checks and the sync."
    ]


def test_new_never_overwrites_without_force(run_cli, tmp_path):
    assert run_cli("new", "--gpus", "1xL4", "--name", "dev1", "--project-dir", str(tmp_path)).exit_code == 0
    path = tmp_path / "stacks" / "Pulumi.dev1.yaml"
    before = path.read_text()
    again = run_cli("new", "--gpus", "8xH100", "--name", "dev1", "--project-dir", str(tmp_path))
    assert again.exit_code == 5 and "already exists; pass --force" in again.stderr
    assert path.read_text() == before
    forced = run_cli("new", "--gpus", "8xH100", "--name", "dev1", "--project-dir", str(tmp_path), "--force")
    assert forced.exit_code == 0
    assert read_stack_spec(tmp_path, "dev1").gpu == "H100"


def test_new_aws_round_up_and_instance_type(run_cli, tmp_path):
    result = run_cli("new", "--gpus", "4xA100", "--cloud", "aws", "--project-dir", str(tmp_path), "--json")
    data = json.loads(result.stdout)
    # 31 + the TTL backstop (scheduler role, its policy, the schedule) + the node bundle object + GPU monitoring
    # (component, agent config parameter, dashboard, idle alarm, SNS topic, the nodes' PutMetricData policy)
    # + the nodes' job-secrets policy (`gpuinfra run --secret`)
    assert data["resources"] == 42
    assert data["compute_price_per_hour_usd"] == "21.957640" and Decimal(data["cost"]["hourly_usd"]) > Decimal(
        "21.957640"
    )
    assert data["compute_run_cost_usd"] == "526.983360"  # 24 h of the llm-finetune profile x $21.95764/h
    assert data["instance_type"] == "p4d.24xlarge" and data["round_up"] is True and data["gpu_count"] == 8
    assert data["next"] == f"gpuinfra up {data['stack']}"
    doc = yaml.safe_load(Path(data["stack_file"]).read_text())
    assert doc["config"]["aws:region"] == "us-east-1"
    by_type = json.loads(
        run_cli(
            "new",
            "--instance-type",
            "p5.48xlarge",
            "--nodes",
            "2",
            "--name",
            "p5x2",
            "--project-dir",
            str(tmp_path),
            "--json",
        ).stdout
    )
    assert (by_type["gpu"], by_type["gpu_count"], by_type["nodes"]) == ("H100", 8, 2)
    assert by_type["compute_price_per_hour_usd"] == "110.080000"  # 2 x $55.04/h, USD as a 6-place decimal string


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--gpus", "3xH100", "--cloud", "aws"], 4, "error: no offer on aws fits 3xH100"),
        (["--gpus", "4xZ100"], 2, "error: unknown GPU 'Z100'"),
        (["--gpus", "4xA100", "--nodes", "0"], 2, "error: --nodes must be a whole number"),
        (["--gpus", "4xA100", "--region", "mars-1"], 2, "error: unknown region 'mars-1'"),
        (["--gpus", "4x"], 2, "error: malformed GPU spec '4x'"),
        (["--gpus", "x4"], 2, "error: malformed GPU spec 'x4'"),
        (["--gpus", "A100:-1"], 2, "error: GPU count in 'A100:-1'"),
        (["--gpus", "4xA100", "--name", "bad/name"], 2, "error: invalid stack name 'bad/name'"),
        (["--gpus", "4xA100", "--profile", "nope"], 2, "error: unknown profile 'nope'; known profiles: cv-train, dev"),
        (
            ["--gpus", "8xH100", "--profile", "inference", "--spot"],
            2,
            "error: profile-spot-policy: profile 'inference' forbids spot",
        ),
        (["--gpus", "4xA100", "--hours", "0"], 2, "error: --hours must be at least 1 minute"),
    ],
)
def test_new_bad_input_writes_nothing(run_cli, tmp_path, args, code, message):
    result = run_cli("new", *args, "--project-dir", str(tmp_path / "proj"))
    assert result.exit_code == code
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert not (tmp_path / "proj").exists()


def test_profile_multi_node_requirements_filter_offers(run_cli, tmp_path):
    # llm-pretrain needs EFA/GPU NICs for 2 nodes: 1xT4 offers (N1 / g4dn.xlarge ...) cannot do it
    result = run_cli(
        "new", "--gpus", "1xT4", "--nodes", "2", "--profile", "llm-pretrain", "--project-dir", str(tmp_path)
    )
    assert result.exit_code == 4
    assert "profile 'llm-pretrain' needs" in result.stderr and "EFA or GPUDirect NICs" in result.stderr
    ok = json.loads(
        run_cli(
            "new",
            "--gpus",
            "8xH100",
            "--nodes",
            "2",
            "--profile",
            "llm-pretrain",
            "--project-dir",
            str(tmp_path),
            "--json",
        ).stdout
    )
    assert ok["instance_type"] in {"p5.48xlarge", "a3-highgpu-8g", "a3-megagpu-8g"}


def test_spot_preferred_profile_takes_spot(run_cli, tmp_path):
    data = json.loads(
        run_cli("new", "--gpus", "1xL4", "--profile", "qlora-finetune", "--project-dir", str(tmp_path), "--json").stdout
    )
    assert data["pricing"] == "spot"
    data = json.loads(
        run_cli(
            "new",
            "--gpus",
            "1xL4",
            "--profile",
            "qlora-finetune",
            "--on-demand",
            "--name",
            "od",
            "--project-dir",
            str(tmp_path),
            "--json",
        ).stdout
    )
    assert data["pricing"] == "on-demand"


def test_readme_main_command_as_a_whole_process(tmp_path):
    proc = subprocess.run(
        [*gpuinfra_exe(), "new", "--gpus", "4xA100"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "stacks" / "Pulumi.gcp-4xa100.yaml").is_file()


def test_a_spec_the_blueprint_rejects_is_never_written(run_cli, tmp_path, monkeypatch):
    from gpuinfra.profiles import load_profiles

    broken = {
        **load_profiles()["dev"].model_dump(),
        "image": {"aws_dlami_type": "no-such-dlami", "gcp_image_family": "x-family"},
    }
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "p.yaml").write_text(
        yaml.safe_dump({"dev": {k: v for k, v in broken.items() if k != "name"}})
    )
    result = run_cli(
        "new",
        "--instance-type",
        "g5.xlarge",
        "--profile",
        "dev",
        "--profiles-dir",
        str(tmp_path / "profiles"),
        "--project-dir",
        str(tmp_path / "proj"),
    )
    assert (
        result.exit_code == 2 and "DLAMI parameter /aws/service/deeplearning/ami/x86_64/no-such-dlami" in result.stderr
    )
    assert not (tmp_path / "proj").exists()
