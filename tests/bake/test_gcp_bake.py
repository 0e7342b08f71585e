"""The GCP bake stack: Cloud Build + Packer resources under the offline preview, the rendered
Packer template parses (python-hcl2), every provisioned script passes shellcheck."""

from __future__ import annotations

import subprocess

import hcl2
import pytest

from gpuinfra.bake.preview import check_bake, run_bake_preview
from gpuinfra.bake.render import PACKER_IMAGE, packer_build
from gpuinfra.plan.fabric_host import HOST_SCRIPT_PATH
from tests.bake.conftest import GCP_BASE
from tests.blueprints.helpers import need_tool

HOST = "us-central1-docker.pkg.dev"


@pytest.fixture(scope="module")
def preview(a3mega_bake):
    return run_bake_preview(a3mega_bake)


@pytest.fixture(scope="module")
def build(a3mega_bake):
    return packer_build(a3mega_bake, "gb-x@p.iam.gserviceaccount.com", f"{HOST}/p/r/train:abc", HOST)


def test_exact_resources_and_zero_violations(preview):
    types = sorted(r.type for r in preview.resources)
    assert types.count("gcp:projects/iAMMember:IAMMember") == 3
    assert types.count("gcp:cloudbuild/trigger:Trigger") == 1
    assert types.count("gcp:artifactregistry/repository:Repository") == 1
    assert types.count("gcp:storage/bucketObject:BucketObject") == 6
    assert {r.inputs["role"] for r in preview.of_type("gcp:projects/iAMMember:IAMMember")} == {
        "roles/compute.instanceAdmin.v1",
        "roles/iam.serviceAccountUser",
        "roles/logging.logWriter",
    }
    repo = preview.of_type("gcp:artifactregistry/repository:Repository")[0].inputs
    assert repo["format"] == "DOCKER" and repo["dockerConfig"]["immutableTags"] is True
    assert check_bake(preview.resources) == []


def test_trigger_runs_pinned_packer(preview):
    build = preview.of_type("gcp:cloudbuild/trigger:Trigger")[0].inputs["build"]
    assert [s["id"] for s in build["steps"]] == ["fetch", "pull", "tag", "push", "init", "build"]
    assert build["steps"][-1]["name"] == PACKER_IMAGE == "hashicorp/packer:1.11.2"


def _plain(value):
    """python-hcl2 8 keeps HCL string quotes ('"x"'): strip them, recursively."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value[1:-1] if isinstance(value, str) and len(value) > 1 and value[0] == value[-1] == '"' else value


def test_packer_template_parses(build):
    doc = _plain(hcl2.loads(build.template))
    assert doc["packer"][0]["required_plugins"][0]["googlecompute"]["source"] == "github.com/hashicorp/googlecompute"
    source = doc["source"][0]["googlecompute"]["gpuinfra"]
    assert source["source_image"] == GCP_BASE.rsplit("/", 1)[1]
    assert source["source_image_project_id"] == ["deeplearning-platform-release"]
    assert source["machine_type"] == "n1-standard-8" and source["disk_size"] == 200
    assert source["on_host_maintenance"] == "MIGRATE"  # no GPU on the build VM (Cluster Toolkit's default)
    assert source["image_storage_locations"] == ["us-central1"]  # where prices.yaml prices it
    assert source["image_labels"]["gpuinfra-bake-fabric"] == "tcpxo"
    scripts = [p["shell"]["script"] for p in doc["build"][0]["provisioner"] if "shell" in p]
    assert scripts == ["install-host.sh", "pull-container.sh", "write-manifest.sh", "check-image.sh"]
    assert f"{HOST_SCRIPT_PATH} --bake" in build.files["install-host.sh"]


@pytest.mark.tools
def test_every_script_passes_shellcheck(build, tmp_path):
    shellcheck = need_tool("shellcheck")
    for name, text in build.files.items():
        path = tmp_path / name
        path.write_text(text)
        result = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, name + result.stdout
