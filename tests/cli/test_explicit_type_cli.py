"""`new --instance-type`: the user's type wins over the profile's settings, one warning per
missed setting; `--strict` refuses it instead."""

from __future__ import annotations

import json

import yaml


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning: profile")]


def test_g5_xlarge_is_written_with_a_warning_per_missed_setting(run_cli, tmp_path):
    result = run_cli(
        "new",
        "--instance-type",
        "g5.xlarge",
        "--cloud",
        "aws",
        "--nodes",
        "2",
        "--name",
        "g5",
        "--project-dir",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.stderr
    assert _warnings(result.stderr) == [
        "warning: profile 'llm-finetune' prefers EFA or GPUDirect NICs between its 2 nodes (rule high-bandwidth-nics), "
        "but g5.xlarge has none; the nodes use plain networking (--strict refuses instead)",
        "warning: profile 'llm-finetune' wants at least 500 GiB local NVMe scratch (rule scratch-capacity), but "
        "g5.xlarge has 232 GiB; the stack records scratch.min_gib: 232 (all it has) (--strict refuses instead)",
    ]
    cluster = yaml.safe_load((tmp_path / "stacks" / "Pulumi.g5.yaml").read_text())["config"]["gpuinfra:cluster"]
    assert cluster["instance_type"] == "g5.xlarge" and cluster["nodes"] == 2
    assert cluster["profile"]["name"] == "llm-finetune" and cluster["profile"]["scratch"] == {
        "required": True,
        "min_gib": 232,
    }
    assert run_cli("preview", "g5", "--project-dir", str(tmp_path)).exit_code == 0  # the relaxed stack conforms


def test_strict_refuses_g5_xlarge_and_writes_nothing(run_cli, tmp_path):
    result = run_cli(
        "new",
        "--instance-type",
        "g5.xlarge",
        "--cloud",
        "aws",
        "--nodes",
        "2",
        "--strict",
        "--project-dir",
        str(tmp_path / "p"),
    )
    assert result.exit_code == 4 and result.stderr.count("\n") == 1
    assert result.stderr == (
        "error: g5.xlarge does not suit profile 'llm-finetune', which asks for EFA or GPUDirect NICs between its 2 "
        "nodes (rule high-bandwidth-nics), but g5.xlarge has none; at least 500 GiB local NVMe scratch "
        "(rule scratch-capacity), but g5.xlarge has 232 GiB; pick another --profile or type, or drop --strict to "
        "write the stack with warnings\n"
    )
    assert not (tmp_path / "p").exists()


def test_an_n1_host_named_with_gpus_gets_no_placement(run_cli, tmp_path):
    result = run_cli(
        "new",
        "--gpus",
        "1xT4",
        "--instance-type",
        "n1-standard-8",
        "--nodes",
        "2",
        "--name",
        "n1",
        "--project-dir",
        str(tmp_path),
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert _warnings(result.stderr)[0] == (
        "warning: profile 'llm-finetune' wants cluster/compact placement or a workload policy (rule "
        "gcp-placement-supported / aws-placement-group), but n1-standard-8 has none (N1 hosts never do); the stack "
        "records placement: none and its 2 nodes are not placed close together (--strict refuses instead)"
    )
    assert json.loads(result.stdout)["warnings"] == [w.removeprefix("warning: ") for w in _warnings(result.stderr)]
    cluster = yaml.safe_load((tmp_path / "stacks" / "Pulumi.n1.yaml").read_text())["config"]["gpuinfra:cluster"]
    assert cluster["profile"]["placement"] == "none"


def test_a_required_fast_network_is_relaxed_for_a_named_type(run_cli, tmp_path):
    result = run_cli(
        "new",
        "--instance-type",
        "g5.xlarge",
        "--cloud",
        "aws",
        "--profile",
        "llm-pretrain",
        "--name",
        "p",
        "--project-dir",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.stderr
    assert (
        "warning: profile 'llm-pretrain' wants EFA or GPUDirect NICs (rule high-bandwidth-nics), but g5.xlarge has "
        "none; the stack records high_bandwidth_networking: preferred and the nodes use plain networking "
        "(--strict refuses instead)"
    ) in _warnings(result.stderr)
    cluster = yaml.safe_load((tmp_path / "stacks" / "Pulumi.p.yaml").read_text())["config"]["gpuinfra:cluster"]
    assert cluster["profile"]["high_bandwidth_networking"] == "preferred"


def test_a_type_that_suits_the_profile_gets_no_warning(run_cli, tmp_path):
    result = run_cli("new", "--instance-type", "p4d.24xlarge", "--nodes", "2", "--project-dir", str(tmp_path))
    assert result.exit_code == 0 and _warnings(result.stderr) == []


def test_the_planner_still_filters_types_it_picks_itself(run_cli, tmp_path):
    # no --instance-type: the profile's requirements choose among the offers, without warnings;
    # g5.xlarge and g5.2xlarge are cheaper but have less than 500 GiB of local NVMe
    result = run_cli(
        "new", "--gpus", "1xA10G", "--nodes", "2", "--cloud", "aws", "--project-dir", str(tmp_path), "--json"
    )
    assert result.exit_code == 0 and _warnings(result.stderr) == []
    assert json.loads(result.stdout)["instance_type"] == "g5.4xlarge"
