"""``gpuinfra image bake|record`` and ``gpuinfra new --image baked:<name>``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.bake.conftest import AMI, GCP_BASE, NGC

BUILT = "ami-0fedcba9876543210"


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.exists() else {}


def _bake(run_cli, project: Path, *extra: str):
    return run_cli(
        "image",
        "bake",
        "--cloud",
        "aws",
        "--family",
        "p5",
        "--base-image",
        AMI,
        "--container-base",
        NGC,
        "--project-dir",
        str(project),
        *extra,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (("--family", "p9"), "unknown aws family 'p9'"),
        (("--base-arch", "arm64"), "is arm64, but aws family p5 (p5.48xlarge) is x86_64"),
        (("--container-base", "nvcr.io/nvidia/pytorch:25.01-py3"), "has no digest"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(run_cli, tmp_path, args, message):
    before = _files(tmp_path)
    result = _bake(run_cli, tmp_path, *args)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and message in result.stderr
    assert _files(tmp_path) == before


def test_cluster_records_the_bake_and_never_drifts(run_cli, tmp_path):
    assert _bake(run_cli, tmp_path).exit_code == 0
    bake_file = tmp_path / "stacks" / "Pulumi.bake-p5.yaml"
    assert (
        yaml.safe_load(bake_file.read_text())["config"]["gpuinfra:bake"]["manifest"]["efa_installer_version"]
        == "1.43.2"
    )
    new = (
        "new",
        "--instance-type",
        "p5.48xlarge",
        "--image",
        "baked:bake-p5",
        "--name",
        "c1",
        "--project-dir",
        str(tmp_path),
    )
    refused = run_cli(*new)
    assert refused.exit_code == 2 and "has no image id yet" in refused.stderr
    assert not (tmp_path / "stacks" / "Pulumi.c1.yaml").exists()
    assert run_cli("image", "record", "bake-p5", "--image-id", BUILT, "--project-dir", str(tmp_path)).exit_code == 0
    assert run_cli(*new).exit_code == 0
    cluster_file = tmp_path / "stacks" / "Pulumi.c1.yaml"
    config = yaml.safe_load(cluster_file.read_text())["config"]
    assert config["gpuinfra:cluster"]["ami_id"] == BUILT
    assert config["gpuinfra:image"]["image_id"] == BUILT
    assert config["gpuinfra:image"]["manifest"]["base_image"] == AMI
    written = cluster_file.read_text()
    # a new bake result changes the bake's file, never the cluster's; `new` again needs --force
    assert (
        run_cli(
            "image", "record", "bake-p5", "--image-id", "ami-0aaaaaaaaaaaaaaaa", "--project-dir", str(tmp_path)
        ).exit_code
        == 0
    )
    assert cluster_file.read_text() == written
    assert run_cli(*new).exit_code == 5
    assert run_cli(*new, "--force").exit_code == 0
    assert yaml.safe_load(cluster_file.read_text())["config"]["gpuinfra:cluster"]["ami_id"] == "ami-0aaaaaaaaaaaaaaaa"


def test_image_of_another_cloud_is_refused(run_cli, tmp_path):
    assert _bake(run_cli, tmp_path).exit_code == 0
    result = run_cli(
        "image", "record", "bake-p5", "--image-id", "projects/my-proj-1/global/images/x", "--project-dir", str(tmp_path)
    )
    assert result.exit_code == 2 and "is not a aws image id" in result.stderr


def test_image_cost_exit_4_when_a_price_is_missing(run_cli, tmp_path):
    gcp = (
        "image",
        "bake",
        "--cloud",
        "gcp",
        "--family",
        "a3-megagpu-8g",
        "--gcp-project",
        "my-proj-123",
        "--region",
        "europe-west4",
        "--base-image",
        GCP_BASE,
        "--container-base",
        NGC,
        "--project-dir",
        str(tmp_path),
    )
    assert run_cli(*gcp).exit_code == 0
    result = run_cli("image", "cost", "bake-a3-megagpu-8g", "--project-dir", str(tmp_path))
    assert result.exit_code == 4 and "gce_custom_image_storage_per_gib_month in europe-west4" in result.stderr
    assert _bake(run_cli, tmp_path).exit_code == 0
    assert run_cli("image", "cost", "bake-p5", "--project-dir", str(tmp_path)).exit_code == 0


def test_gcp_cluster_from_a_bake_takes_its_cloud_type_and_image(run_cli, tmp_path):
    image = "projects/my-proj-123/global/images/gpuinfra-bake-a3-megagpu-8g-20261123t000000z"
    assert (
        run_cli(
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
            "--region",
            "asia-northeast1",  # a region the catalog prices a3-megagpu-8g on demand in
            "--project-dir",
            str(tmp_path),
        ).exit_code
        == 0
    )
    listed = run_cli("image", "ls", "--project-dir", str(tmp_path))
    assert "bake-a3-megagpu-8g  gcp a3-megagpu-8g (tcpxo)  not built yet" in listed.stdout
    assert (
        run_cli("image", "record", "bake-a3-megagpu-8g", "--image-id", image, "--project-dir", str(tmp_path)).exit_code
        == 0
    )
    # no --cloud, no --instance-type: the bake's cloud and its one machine type
    result = run_cli(
        "new",
        "--image",
        "baked:bake-a3-megagpu-8g",
        "--name",
        "g1",
        "--gcp-project",
        "my-proj-123",
        "--project-dir",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.stderr
    config = yaml.safe_load((tmp_path / "stacks" / "Pulumi.g1.yaml").read_text())["config"]
    assert config["gpuinfra:cluster"]["instance_type"] == "a3-megagpu-8g"
    assert config["gpuinfra:cluster"]["gcp_image"] == image
    assert config["gpuinfra:image"]["manifest"]["fabric"] == "tcpxo"
    # no --region: the bake's; the container the bake pulled onto the image under its reference;
    # the node service account may read the bake's repository only
    cluster = config["gpuinfra:cluster"]
    assert cluster["region"] == "asia-northeast1"
    assert cluster["profile"]["container_image"] == NGC
    assert cluster["baked_image"] == {
        "bake": "bake-a3-megagpu-8g",
        "region": "asia-northeast1",
        "root_snapshot_gib": 200,
        "container_repository": "projects/my-proj-123/locations/asia-northeast1/repositories/gpuinfra-bake-a3-megagpu-8g",
    }
    elsewhere = run_cli(
        "new",
        "--image",
        "baked:bake-a3-megagpu-8g",
        "--region",
        "asia-southeast1",
        "--name",
        "g3",
        "--gcp-project",
        "my-proj-123",
        "--project-dir",
        str(tmp_path),
    )
    assert elsewhere.exit_code == 2 and elsewhere.stderr == (
        "error: bake 'bake-a3-megagpu-8g' is in asia-northeast1, this cluster is in asia-southeast1: pass "
        "--region asia-northeast1, or bake again with --region asia-southeast1\n"
    )
    assert not (tmp_path / "stacks" / "Pulumi.g3.yaml").exists()
    other = run_cli(
        "new",
        "--instance-type",
        "a3-highgpu-8g",
        "--image",
        "baked:bake-a3-megagpu-8g",
        "--name",
        "g2",
        "--gcp-project",
        "my-proj-123",
        "--project-dir",
        str(tmp_path),
    )
    assert other.exit_code == 2 and "pass --instance-type a3-megagpu-8g" in other.stderr


def test_record_refuses_a_container_tag_when_the_bake_pins(run_cli, tmp_path):
    assert _bake(run_cli, tmp_path).exit_code == 0
    before = (tmp_path / "stacks" / "Pulumi.bake-p5.yaml").read_text()
    result = run_cli(
        "image",
        "record",
        "bake-p5",
        "--image-id",
        BUILT,
        "--container-image",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpuinfra/bake-p5:1.0.0-1",
        "--project-dir",
        str(tmp_path),
    )
    assert result.exit_code == 2 and "has no digest" in result.stderr
    assert (tmp_path / "stacks" / "Pulumi.bake-p5.yaml").read_text() == before


def test_ls_lists_clusters_not_bakes(run_cli, tmp_path):
    """A bake stack has no nodes, TTL or $/h: `gpuinfra ls` leaves it out (not "invalid"),
    `gpuinfra image ls` lists it."""
    assert _bake(run_cli, tmp_path).exit_code == 0
    assert run_cli("new", "--gpus", "1xL4", "--name", "dev1", "--project-dir", str(tmp_path)).exit_code == 0
    rows = {r["stack"]: r for r in json.loads(run_cli("ls", "--json", "--project-dir", str(tmp_path)).stdout)}
    assert list(rows) == ["dev1"] and rows["dev1"]["invalid"] is None


ECR_CONTAINER = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpuinfra/bake-g5@sha256:" + "b" * 64


def _g5_bake(run_cli, project: Path) -> None:
    """A g5 bake in us-east-1 with a recorded AMI and ECR container (its recipe's root: 200 GiB)."""
    made = _bake(run_cli, project, "--family", "g5", "--name", "bake-g5")
    assert made.exit_code == 0, made.stderr
    recorded = run_cli(
        "image",
        "record",
        "bake-g5",
        "--image-id",
        BUILT,
        "--container-image",
        ECR_CONTAINER,
        "--project-dir",
        str(project),
    )
    assert recorded.exit_code == 0, recorded.stderr


def _new_g5(run_cli, project: Path, *extra: str):
    return run_cli(
        "new",
        "--image",
        "baked:bake-g5",
        "--instance-type",
        "g5.xlarge",
        "--profile",
        "dev",
        "--name",
        "g5baked",
        "--project-dir",
        str(project),
        *extra,
    )


def test_a_bake_from_another_region_is_refused_with_one_line(run_cli, tmp_path):
    _g5_bake(run_cli, tmp_path)
    result = _new_g5(run_cli, tmp_path, "--region", "us-west-2")
    assert result.exit_code == 2
    assert result.stderr == (
        "error: bake 'bake-g5' is in us-east-1, this cluster is in us-west-2: pass --region us-east-1, "
        "or bake again with --region us-west-2\n"
    )
    assert not (tmp_path / "stacks" / "Pulumi.g5baked.yaml").exists()


def test_a_cluster_from_a_bake_never_asks_for_a_root_smaller_than_the_snapshot(run_cli, tmp_path):
    # the dev profile asks for 150 GiB; the bake's AMI has a 200 GiB root snapshot, and EC2 refuses
    # "Volume of size 150GB is smaller than snapshot ..., expect size >= 200GB"
    _g5_bake(run_cli, tmp_path)
    result = _new_g5(run_cli, tmp_path)
    assert result.exit_code == 0, result.stderr
    cluster = yaml.safe_load((tmp_path / "stacks" / "Pulumi.g5baked.yaml").read_text())["config"]["gpuinfra:cluster"]
    assert cluster["region"] == "us-east-1"
    assert cluster["profile"]["root_disk_gib"] == 200
    assert cluster["profile"]["container_image"] == ECR_CONTAINER
    assert cluster["baked_image"] == {
        "bake": "bake-g5",
        "region": "us-east-1",
        "root_snapshot_gib": 200,
        "container_repository": "arn:aws:ecr:us-east-1:123456789012:repository/gpuinfra/bake-g5",
    }


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda c: c["profile"].update(root_disk_gib=150),
            "baked-image: profile.root_disk_gib is 150 GiB, smaller than bake 'bake-g5''s root snapshot of 200 GiB "
            "(the cloud refuses the disk); set it to at least 200",
        ),
        (
            lambda c: c.update(region="us-west-2", zone="usw2-az1"),
            "baked-image: bake 'bake-g5' is in us-east-1, the cluster in us-west-2: the image cannot be used there; "
            "write the stack again with `gpuinfra new --image baked:bake-g5 --region us-east-1`",
        ),
    ],
)
def test_preview_refuses_a_hand_edited_baked_stack(run_cli, tmp_path, edit, message):
    _g5_bake(run_cli, tmp_path)
    assert _new_g5(run_cli, tmp_path).exit_code == 0
    path = tmp_path / "stacks" / "Pulumi.g5baked.yaml"
    doc = yaml.safe_load(path.read_text())
    edit(doc["config"]["gpuinfra:cluster"])
    if doc["config"]["gpuinfra:cluster"]["region"] != "us-east-1":
        doc["config"]["aws:region"] = "us-west-2"
    path.write_text(yaml.safe_dump(doc))
    result = run_cli("preview", "g5baked", "--project-dir", str(tmp_path))
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr


def test_the_default_profile_container_bakes_without_turning_pinning_off(run_cli, tmp_path):
    result = run_cli(
        "image", "bake", "--cloud", "aws", "--family", "p5", "--base-image", AMI, "--project-dir", str(tmp_path)
    )
    assert result.exit_code == 0, result.stderr
    manifest = yaml.safe_load((tmp_path / "stacks" / "Pulumi.bake-p5.yaml").read_text())["config"]["gpuinfra:bake"][
        "manifest"
    ]
    assert manifest["container_pinned"] is True
    assert manifest["container_base"] == (
        "nvcr.io/nvidia/pytorch:25.01-py3@sha256:96990c82825613c3bdeebb66675c7c91b0123f64a5895623316dc5b824e0d7a9"
    )
