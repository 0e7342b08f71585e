"""A refusal names what was given and what is allowed, and points the right way: the nearest GPU
by name, the clouds' real node limits, the variable a bad value came from, the type that has the
GPUs asked for."""

from __future__ import annotations

import json

import pytest


def _refused(result, code: int, *parts: str) -> None:
    assert result.exit_code == code, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for part in parts:
        assert part in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("gpu", "suggestion"),
    [
        ("B100", "Did you mean B200?"),  # not V100: B200 is the B-series GPU sold
        ("A100-160GB", "Did you mean A100-80GB or A100?"),
        ("H1OO", "Did you mean H100?"),
        ("L40", "Did you mean L40S or L4?"),
    ],
)
def test_an_unknown_gpu_suggests_the_same_family(run_cli, gpu, suggestion):
    _refused(run_cli("offers", "--gpus", f"4x{gpu}"), 2, f"unknown GPU '{gpu}'. {suggestion} Known GPUs: B200")


def test_a_gpu_name_like_none_suggests_nothing(run_cli):
    result = run_cli("offers", "--gpus", "4xX9")
    _refused(result, 2, "unknown GPU 'X9'. Known GPUs:")
    assert "Did you mean" not in result.stderr


def test_nodes_over_every_clouds_limit_names_the_real_limits(run_cli):
    # EC2 instant fleet MinTargetCapacity: maximum 1000; a zonal MIG: 1,000 VMs by default
    _refused(
        run_cli("offers", "--gpus", "4xA100", "--nodes", "99999999999999999999999"),
        2,
        "--nodes must be a whole number from 1 to 1,000 (aws: 1,000 instances in one all-or-nothing instant "
        "EC2 Fleet (MinTargetCapacity); gcp: 1,000 VMs in one zonal managed instance group)",
    )


def test_new_with_a_method_typo(run_cli, tmp_path):
    _refused(
        run_cli("new", "--name", "mo9", "--params", "7B", "--method", "sing", "--project-dir", str(tmp_path)),
        2,
        "--method must be one of pretrain, full, lora, qlora, inference, got 'sing'",
    )
    assert not (tmp_path / "stacks").exists()


def test_an_instance_type_too_small_for_the_gpus_points_at_the_types_that_have_them(run_cli, tmp_path):
    result = run_cli(
        "new", "--instance-type", "a2-highgpu-4g", "--gpus", "8xA100", "--name", "fl7", "--project-dir", str(tmp_path)
    )
    # a2-highgpu-8g (GCP) and p4d.24xlarge (AWS) carry 8 A100s
    _refused(result, 4, "8xA100 per node needs another type (a2-highgpu-8g, a2-megagpu-16g, p4d.24xlarge)")
    assert "No A100 machine has 8 GPUs per node" not in result.stderr


def test_a_data_uri_with_a_bucket_name_too_short(run_cli):
    # S3 bucket names are 3-63 characters (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)
    result = run_cli(
        "offers", "--gpus", "4xA100", "--data", "s3://b/p", "--data-region", "us-east-1", "--data-size", "1TB"
    )
    _refused(result, 2, "--data 's3://b/p': bucket name 'b' is not a bucket name: use 3-63")


def test_a_bad_project_from_the_environment_names_the_variable(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "Bad Id")
    result = run_cli("new", "--gpus", "4xA100", "--name", "gp3", "--project-dir", str(tmp_path))
    _refused(result, 2, "$GOOGLE_CLOUD_PROJECT (no --gcp-project given) 'Bad Id' is not a GCP project ID")
    assert not (tmp_path / "stacks").exists()
    # a flag given on the command line wins over the variable and is checked as the flag
    result = run_cli(
        "new", "--gpus", "4xA100", "--name", "gp3", "--gcp-project", "Also Bad", "--project-dir", str(tmp_path)
    )
    _refused(result, 2, "--gcp-project 'Also Bad' is not a GCP project ID")


@pytest.mark.parametrize("rate", ["nan", "inf", "-1", "0", "2"])
def test_size_refuses_an_interruption_rate_that_is_not_a_rate(run_cli, rate):
    _refused(
        run_cli("size", "--params", "7B", "--spot", "--interruption-rate", rate),
        2,
        "--interruption-rate must be a number above 0 and at most 1 interruptions per node-hour",
    )


def test_size_of_a_shape_no_machine_has_recommends_one_that_exists(run_cli):
    result = run_cli("size", "--params", "7B", "--gpus", "9xH100", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["offer_note"].startswith("no machine carries 9xH100 per node")
    assert doc["recommendation"]["gpus"] != "9xH100" and "--gpus 9xH100" not in doc["next_command"]
    # the command it suggests plans
    assert doc["next_command"].startswith("gpuinfra new ")


def test_size_of_a_shape_new_rounds_up_is_kept(run_cli):
    # 3xA100-80GB: `new` takes a 4-GPU machine (round-up within 2x), so the configuration stands
    doc = json.loads(run_cli("size", "--params", "1B", "--gpus", "3xA100-80GB", "--json").stdout)
    assert doc["offer_note"] is None and doc["recommendation"]["gpus"] == "3xA100-80GB"


@pytest.mark.parametrize("command", [("up",), ("down", "--yes")])
def test_up_or_down_of_a_stack_that_does_not_exist_says_so_before_anything_about_pulumi(
    run_cli, tmp_path, monkeypatch, command
):
    # even where the Pulumi CLI is missing (exit 6 otherwise), the first thing wrong is the name
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert run_cli("new", "--gpus", "1xL4", "--name", "real", "--project-dir", str(tmp_path)).exit_code == 0
    result = run_cli(command[0], "nonexistent", *command[1:], "--project-dir", str(tmp_path))
    _refused(result, 2, "no stack 'nonexistent'", "Stacks in", "real")
    assert "Pulumi CLI" not in result.stderr


@pytest.mark.parametrize("command", [("ls",), ("image", "ls"), ("reap", "--expired", "--dry-run")])
def test_listing_a_project_dir_that_is_not_there_is_refused_not_zero_stacks(run_cli, tmp_path, command):
    _refused(
        run_cli(*command, "--project-dir", str(tmp_path / "nope")),
        2,
        f"--project-dir {tmp_path / 'nope'} does not exist",
    )
    (tmp_path / "stacks").write_text("a file where the folder belongs")
    _refused(run_cli(*command, "--project-dir", str(tmp_path)), 2, f"{tmp_path / 'stacks'} is a file, not a folder")


@pytest.mark.parametrize(
    "command", [("new", "--gpus", "4xA100", "--name", "lp"), ("ls",), ("cost", "x"), ("preview", "x")]
)
def test_a_project_dir_longer_than_the_file_system_takes(run_cli, tmp_path, command):
    deep = tmp_path.joinpath(*["d" * 200] * 25)  # about 5,000 characters: over Linux's PATH_MAX of 4,096
    _refused(run_cli(*command, "--project-dir", str(deep)), 2, "cannot be used: File name too long")
    assert list(tmp_path.iterdir()) == []


def test_spot_with_another_market_is_refused_not_silently_spot(run_cli):
    _refused(
        run_cli("offers", "--gpus", "4xA100", "--spot", "--market", "on-demand"),
        2,
        "--spot contradicts --market on-demand: give one of them",
    )
    both = run_cli("offers", "--gpus", "4xA100", "--spot", "--market", "spot", "--json")
    alone = run_cli("offers", "--gpus", "4xA100", "--spot", "--json")
    assert both.exit_code == 0 and json.loads(both.stdout) == json.loads(alone.stdout)
