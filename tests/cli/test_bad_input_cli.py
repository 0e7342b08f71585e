"""Bad input gives one `error:` line naming what was wrong and what is allowed, the documented exit
code (never 1), and writes nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.bake.conftest import GCP_BASE, NGC


def _files(folder: Path) -> dict[str, float]:
    """Every file under ``folder`` with its modification time (to prove nothing was written)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.exists() else {}


def _refused(result, code: int, *parts: str) -> None:
    """Exit ``code``, exactly one line on stderr, ``error: `` first, every part in it."""
    assert result.exit_code == code, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for part in parts:
        assert part in result.stderr, result.stderr


@pytest.fixture
def stack(run_cli, tmp_path):
    """A project with one written stack ``t1`` (GCP 4xA100); returns the project folder."""
    result = run_cli("new", "--gpus", "4xA100", "--name", "t1", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    return tmp_path


def _edit(project: Path, name: str, change, as_name: str | None = None) -> None:
    """Apply ``change`` to the ``gpuinfra:cluster`` mapping of stack ``name`` (written as ``as_name``)."""
    path = project / "stacks" / f"Pulumi.{name}.yaml"
    doc = yaml.safe_load(path.read_text())
    change(doc["config"]["gpuinfra:cluster"])
    (project / "stacks" / f"Pulumi.{as_name or name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


# 1. cost --budget must be a finite number >= 0


@pytest.mark.parametrize("budget", ["nan", "inf", "-1"])
def test_cost_budget_that_is_not_an_amount(run_cli, stack, budget):
    before = _files(stack)
    result = run_cli("cost", "t1", "--budget", budget, "--project-dir", str(stack))
    _refused(result, 2, "--budget must be a number >= 0 (USD), got")
    assert result.stdout == "" and _files(stack) == before


# 2. a price in the stack file that is not a number


def test_a_price_that_is_not_a_number_is_refused_by_cost_and_preview_and_listed_by_ls(run_cli, stack):
    _edit(stack, "t1", lambda c: c["price"].update(on_demand_price_per_hour_usd="abc"))
    before = _files(stack)
    reason = (
        "gpuinfra:cluster.price.on_demand_price_per_hour_usd: not a price: 'abc'; use a decimal number of USD "
        "per node-hour above 0"
    )
    for command in ("cost", "preview"):
        _refused(run_cli(command, "t1", "--project-dir", str(stack)), 2, reason)
    listing = run_cli("ls", "--project-dir", str(stack))
    assert listing.exit_code == 0
    assert f"INVALID t1: {reason}" in listing.stdout and "1 stacks (1 invalid)" in listing.stdout
    (row,) = json.loads(run_cli("ls", "--json", "--project-dir", str(stack)).stdout)
    assert row["stack"] == "t1" and row["invalid"].startswith(reason) and row["cloud"] is None
    assert _files(stack) == before


# 3. a --project-dir that cannot be written: exit 2, nothing left behind


def test_a_stack_file_that_cannot_be_written_leaves_no_scaffold(run_cli, tmp_path, monkeypatch):
    from gpuinfra import fsutil

    real = fsutil.atomic_write_text

    def read_only_stacks(path, text, **kw):
        if Path(path).parent.name == "stacks":
            raise PermissionError(13, "Permission denied", str(Path(path).parent / ".Pulumi.tmp"))
        real(path, text, **kw)

    monkeypatch.setattr(fsutil, "atomic_write_text", read_only_stacks)
    project = tmp_path / "proj"
    result = run_cli("new", "--gpus", "4xA100", "--name", "t1", "--project-dir", str(project))
    _refused(
        result,
        2,
        f"cannot write {project}/stacks/Pulumi.t1.yaml: Permission denied; --project-dir {project} "
        "must be a folder you can write (nothing was written)",
    )
    assert not project.exists()  # Pulumi.yaml, program/ and the folders new made are gone again


def test_a_project_dir_whose_stacks_folder_is_a_file(run_cli, tmp_path):
    (tmp_path / "stacks").write_text("not a folder")
    before = _files(tmp_path)
    result = run_cli("new", "--gpus", "4xA100", "--name", "t1", "--project-dir", str(tmp_path))
    _refused(result, 2, f"cannot write {tmp_path}/stacks: Not a directory")
    assert _files(tmp_path) == before


def test_a_project_dir_that_is_a_file(run_cli, tmp_path):
    (tmp_path / "f").write_text("x")
    _refused(
        run_cli("new", "--gpus", "4xA100", "--project-dir", str(tmp_path / "f")),
        2,
        f"--project-dir {tmp_path / 'f'} is a file, not a folder",
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_project_dir(run_cli, tmp_path):
    tmp_path.chmod(0o555)
    try:
        result = run_cli("new", "--gpus", "4xA100", "--name", "t1", "--project-dir", str(tmp_path))
        _refused(result, 2, "Permission denied", "must be a folder you can write (nothing was written)")
        assert _files(tmp_path) == {}
    finally:
        tmp_path.chmod(0o755)


# 4. --spot and --on-demand together


def test_spot_and_on_demand_together(run_cli, tmp_path):
    result = run_cli("new", "--gpus", "4xA100", "--spot", "--on-demand", "--project-dir", str(tmp_path / "p"))
    _refused(
        result,
        2,
        "--spot and --on-demand exclude each other: give one of them, or neither for the profile's spot policy",
    )
    assert not (tmp_path / "p").exists()


def test_cost_spot_and_on_demand_together(run_cli, stack):
    _refused(
        run_cli("cost", "t1", "--spot", "--on-demand", "--project-dir", str(stack)),
        2,
        "--spot and --on-demand exclude each other",
        "or neither for the stack's own pricing",
    )


# 5. GCP project IDs


@pytest.mark.parametrize("project", ["My Project!", "my-proj-", "1project", "short", "a" * 31])
def test_new_refuses_a_gcp_project_that_is_not_a_project_id(run_cli, tmp_path, project):
    result = run_cli("new", "--gpus", "4xA100", "--gcp-project", project, "--project-dir", str(tmp_path / "p"))
    _refused(
        result,
        2,
        f"--gcp-project {project!r} is not a GCP project ID: use 6-30 lowercase letters, digits or "
        "'-', starting with a letter and not ending with '-'",
        "cloud.google.com/resource-manager/docs/creating-managing-projects",
    )
    assert not (tmp_path / "p").exists()


def test_a_valid_gcp_project_is_written(run_cli, tmp_path):
    assert (
        run_cli(
            "new", "--gpus", "4xA100", "--gcp-project", "tokyo-rain-123", "--name", "g", "--project-dir", str(tmp_path)
        ).exit_code
        == 0
    )
    assert (
        yaml.safe_load((tmp_path / "stacks" / "Pulumi.g.yaml").read_text())["config"]["gcp:project"] == "tokyo-rain-123"
    )


def test_catalog_refresh_refuses_a_gcp_project_that_is_not_a_project_id(run_cli, tmp_path):
    result = run_cli(
        "catalog", "refresh", "--cloud", "gcp", "--gcp-project", "My Project!", "--out", str(tmp_path / "c")
    )
    _refused(result, 2, "--gcp-project 'My Project!' is not a GCP project ID")
    assert not (tmp_path / "c").exists()


def test_a_stack_file_with_a_bad_gcp_project(run_cli, stack):
    _edit(stack, "t1", lambda c: c.update(gcp_project="My Project!"))
    _refused(
        run_cli("preview", "t1", "--project-dir", str(stack)),
        2,
        "gpuinfra:cluster.gcp_project: 'My Project!' is not a GCP project ID",
    )


# 6. stack names that cloud resource names cannot hold


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
@pytest.mark.parametrize("name", ["MyStack", "my_stack", "my.stack", "-stack", "stack-", "9lives", "a" * 28])
def test_new_refuses_a_stack_name_cloud_resources_cannot_carry(run_cli, tmp_path, cloud, name):
    result = run_cli("new", "--gpus", "4xA100", "--cloud", cloud, "--name", name, "--project-dir", str(tmp_path / "p"))
    _refused(
        result,
        2,
        f"invalid stack name {name!r}",
        "use 1-27 lowercase letters, digits or '-', starting with a letter and not ending with '-'",
        "the service account gi-<stack> on GCP, the S3 bucket prefix gpuinfra-<stack>- on AWS",
    )
    assert not (tmp_path / "p").exists()


def test_the_longest_stack_name_is_taken(run_cli, tmp_path):
    name = "a" + "-b" * 13  # 27 characters
    assert run_cli("new", "--gpus", "4xA100", "--name", name, "--project-dir", str(tmp_path)).exit_code == 0
    assert (tmp_path / "stacks" / f"Pulumi.{name}.yaml").is_file()


# 7. more nodes than one request on the cloud can start


def test_new_refuses_more_nodes_than_one_gcp_managed_instance_group_holds(run_cli, tmp_path):
    result = run_cli(
        "new", "--gpus", "8xH100", "--nodes", "2000", "--cloud", "gcp", "--project-dir", str(tmp_path / "p")
    )
    _refused(
        result,
        2,
        "--nodes 2000 is over the GCP limit of 1000 VMs in one zonal managed instance group "
        "(source: cloud.google.com/compute/docs/instance-groups/creating-groups-of-managed-instances"
        "#limitations); ask for at most 1000 nodes",
    )
    assert not (tmp_path / "p").exists()


def test_offers_take_each_clouds_limit_itself(run_cli):
    assert run_cli("offers", "--gpus", "1xL4", "--cloud", "gcp", "--nodes", "1000", "--json").exit_code == 0
    _refused(run_cli("offers", "--gpus", "1xL4", "--cloud", "gcp", "--nodes", "1001"), 2, "over the GCP limit of 1000")
    assert run_cli("offers", "--gpus", "8xA100", "--cloud", "aws", "--nodes", "1000", "--json").exit_code == 0


def test_new_refuses_more_nodes_than_one_instant_ec2_fleet_launches_at_once(run_cli, tmp_path):
    # MinTargetCapacity = nodes (all or nothing): "Maximum value of 1000. Supported only for fleets of
    # type instant." (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_OnDemandOptionsRequest.html)
    result = run_cli(
        "new", "--gpus", "8xA100", "--nodes", "2000", "--cloud", "aws", "--project-dir", str(tmp_path / "p")
    )
    _refused(
        result,
        2,
        "--nodes 2000 is over the AWS limit of 1000 instances in one all-or-nothing instant EC2 Fleet "
        "(MinTargetCapacity)",
    )
    assert not (tmp_path / "p").exists()


# 8. a stack file whose stack name is not its file name


def test_a_stack_file_named_for_another_stack(run_cli, stack):
    _edit(stack, "t1", lambda c: None, as_name="other")
    _refused(
        run_cli("cost", "other", "--project-dir", str(stack)),
        2,
        "holds stack 't1', not 'other'",
        "gpuinfra:cluster.stack must be 'other'",
        "Pulumi.t1.yaml",
    )
    rows = {r["stack"]: r for r in json.loads(run_cli("ls", "--json", "--project-dir", str(stack)).stdout)}
    assert rows["t1"]["invalid"] is None and "holds stack 't1', not 'other'" in rows["other"]["invalid"]


# 9. size where nothing fits


def test_size_where_nothing_fits_prints_the_breakdown_and_exits_4(run_cli):
    # selective: left to choose, full recompute holds 900B on 32 nodes of 8 x A100-80GB (tp 2)
    result = run_cli("size", "--params", "900B", "--gpus", "1xT4", "--recompute", "selective")
    _refused(
        result,
        4,
        "no configuration in the catalog sold on-demand fits 900B params (full, bf16) with 10% memory headroom on up "
        "to 64 nodes; try --method lora or qlora, --recompute full, a shorter --seq",
    )
    # one GPU shards nothing: 4 B fp32 weights + 4 B gradients + 8 B AdamW state per parameter
    assert "1xT4 x 1 node(s): 14501.3 GiB per GPU of 14.8 GiB -> does NOT fit" in result.stdout
    assert "optimizer 6705.52" in result.stdout


def test_size_json_where_nothing_fits(run_cli):
    result = run_cli("size", "--params", "900B", "--gpus", "1xT4", "--recompute", "selective", "--json")
    _refused(result, 4, "no configuration in the catalog sold on-demand fits 900B params")
    doc = json.loads(result.stdout)
    assert doc["fits"] is False and doc["candidates"] == [] and doc["recommendation"] is None
    assert doc["breakdown"]["optimizer_gib"] == round(8 * 900e9 / 2**30, 3)


def test_new_sized_for_a_model_nothing_fits(run_cli, tmp_path):
    result = run_cli("new", "--params", "90000B", "--method", "qlora", "--project-dir", str(tmp_path / "p"))
    _refused(
        result,
        4,
        "no configuration in the catalog sold spot or on-demand fits 90000B params (qlora, bf16) "
        "with 10% memory headroom on one node",
    )
    assert not (tmp_path / "p").exists()


# 10. messages that name the real problem


def test_a_gcp_zone_with_cloud_aws(run_cli):
    _refused(
        run_cli("offers", "--gpus", "1xT4", "--cloud", "aws", "--zone", "us-central1-a"),
        2,
        "'us-central1-a' is a GCP zone, not an AWS one: use --cloud gcp (or drop --cloud); AWS zones are AZ IDs "
        "such as use1-az4",
    )


def test_an_aws_region_with_cloud_gcp(run_cli):
    _refused(
        run_cli("offers", "--gpus", "1xT4", "--cloud", "gcp", "--region", "us-east-1"),
        2,
        "'us-east-1' is an AWS region, not a GCP one: use --cloud aws (or drop --cloud)",
    )


def test_a_zone_of_another_region(run_cli):
    _refused(
        run_cli("offers", "--gpus", "1xT4", "--cloud", "gcp", "--region", "us-central1", "--zone", "europe-west4-a"),
        2,
        "zone 'europe-west4-a' is in europe-west4, not us-central1: use --region europe-west4 or drop --region.",
        "Zones in us-central1: us-central1-a",
    )


def test_profiles_dir_that_is_a_file(run_cli, tmp_path):
    (tmp_path / "f.yaml").write_text("dev: {}\n")
    for command in (["profiles"], ["new", "--gpus", "1xT4", "--project-dir", str(tmp_path / "p")]):
        _refused(
            run_cli(*command, "--profiles-dir", str(tmp_path / "f.yaml")),
            2,
            f"profiles folder {tmp_path / 'f.yaml'} (--profiles-dir) is a file, not a folder",
        )
    assert not (tmp_path / "p").exists()


def test_profiles_dir_from_the_environment_that_does_not_exist(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUINFRA_PROFILES_DIR", str(tmp_path / "none"))
    _refused(run_cli("profiles"), 2, f"profiles folder {tmp_path / 'none'} ($GPUINFRA_PROFILES_DIR) does not exist")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["offers", "--bogus"], "error: No such option: --bogus"),
        (["cost", "a", "b"], "error: Got unexpected extra argument(s) (b) (see `gpuinfra cost --help`)"),
        (["cost", "diff", "a"], "error: Missing argument 'STACK_B'."),
        (["new", "--nodes", "two"], "error: Invalid value for '--nodes'"),
    ],
)
def test_command_line_mistakes_are_one_line_too(run_cli, args, message):
    _refused(run_cli(*args), 2, message)


@pytest.mark.parametrize(
    "argv",
    [
        ("new", "--gpus", "4xA100", "--cloud", "gcp"),
        (
            "image",
            "bake",
            "--cloud",
            "gcp",
            "--family",
            "a3-megagpu-8g",
            "--gcp-project",
            "my-proj-123",
            "--base-image",
            GCP_BASE,
            "--container-base",
            NGC,
        ),
    ],
)
def test_a_stack_name_with_a_double_hyphen_is_refused(run_cli, tmp_path, argv):
    # a GCP bake's image names are gpuinfra-<name>--<time>: a name holding '--' could start
    # another bake's names (bake 'x' and bake 'x--y' would share the prefix gpuinfra-x--)
    result = run_cli(*argv, "--name", "exp--2", "--project-dir", str(tmp_path / "p"))
    _refused(result, 2, "invalid stack name 'exp--2': '--' is not allowed in a stack name")
    assert not (tmp_path / "p").exists()
