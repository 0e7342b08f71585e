"""A3 High (GPUDirect-TCPX) through a bake: the kernel TCPX needs is in no public image, so the
bake starts from the user's own image, and a cluster from that bake gets GPUDirect even under a
profile that requires it (rule fabric-installable-at-boot)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuinfra.bake.preview import check_bake, run_bake_preview
from gpuinfra.stackfile import read_stack_spec
from tests.bake.conftest import GCP_BASE, NGC
from tests.blueprints.helpers import preview

OWN = "projects/my-proj-123/global/images/ubuntu-2204-gcp-tcpx-nvidia-570-v1"
BUILT = "projects/my-proj-123/global/images/gpuinfra-bake-a3-highgpu-8g-20261123t000000z"


def _bake(run_cli, project: Path, base: str):
    return run_cli(
        "image",
        "bake",
        "--cloud",
        "gcp",
        "--family",
        "a3-highgpu-8g",
        "--gcp-project",
        "my-proj-123",
        "--base-image",
        base,
        "--container-base",
        NGC,
        "--project-dir",
        str(project),
    )


def _new(run_cli, project: Path, name: str, *extra: str):
    return run_cli(
        "new",
        "--instance-type",
        "a3-highgpu-8g",
        "--nodes",
        "2",
        "--profile",
        "llm-pretrain",
        "--strict",
        "--name",
        name,
        "--gcp-project",
        "my-proj-123",
        "--project-dir",
        str(project),
        *extra,
    )


def test_a_public_base_image_is_refused_with_the_reason(run_cli, tmp_path):
    result = _bake(run_cli, tmp_path, GCP_BASE)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "needs the linux-gcp-tcpx kernel, which no public image carries" in result.stderr
    assert not (tmp_path / "stacks").exists()


def test_without_a_bake_a_profile_requiring_gpudirect_is_refused(run_cli, tmp_path):
    result = _new(run_cli, tmp_path, "plain")
    assert result.exit_code == 4  # no offer (gpuinfra/errors.py NO_OFFER)
    assert "a3-highgpu-8g's tcpx fabric cannot be installed at boot (rule fabric-installable-at-boot)" in result.stderr


def test_a_cluster_from_the_bake_gets_gpudirect_tcpx(run_cli, tmp_path):
    made = _bake(run_cli, tmp_path, OWN)
    assert made.exit_code == 0, made.stderr
    from gpuinfra.bake.stack import read_bake

    bake = read_bake(tmp_path, "bake-a3-highgpu-8g")
    assert bake.manifest.fabric == "tcpx" and bake.manifest.base_image == OWN
    assert check_bake(run_bake_preview(bake).resources) == []
    assert (
        run_cli("image", "record", "bake-a3-highgpu-8g", "--image-id", BUILT, "--project-dir", str(tmp_path)).exit_code
        == 0
    )

    result = _new(run_cli, tmp_path, "tcpx", "--image", "baked:bake-a3-highgpu-8g")
    assert result.exit_code == 0, result.stderr
    config = yaml.safe_load((tmp_path / "stacks" / "Pulumi.tcpx.yaml").read_text())["config"]
    cluster = config["gpuinfra:cluster"]
    assert cluster["gcp_image"] == BUILT and cluster["profile"]["high_bandwidth_networking"] == "required"
    assert config["gpuinfra:image"]["manifest"]["fabric"] == "tcpx"
    # the nodes get the host gVNIC plus A3 High's 4 GPU gVNICs (cluster-toolkit gpu_direct.tf: 4)
    spec = read_stack_spec(tmp_path, "tcpx")
    template = preview(spec).of_type("gcp:compute/instanceTemplate:InstanceTemplate")[0].inputs
    assert [nic.get("nicType") for nic in template["networkInterfaces"]] == ["GVNIC"] * 5
