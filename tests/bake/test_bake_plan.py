"""gpuinfra.bake.plan: families, pinning and architecture checks (exit 2, one line)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import moto
import pytest

from gpuinfra.bake.plan import CATALOG_ARCHITECTURE, plan_bake
from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import BakeError, ExitCode
from gpuinfra.fabrics import TCPXO
from gpuinfra.plan import fabric, fabric_host
from tests.bake.conftest import DLVM_FAMILY, aws_request, gcp_request


def test_every_aws_catalog_type_is_x86_64_per_ec2_describe_instance_types():
    # external fact: ProcessorInfo.SupportedArchitectures in moto's bundled DescribeInstanceTypes data
    data = json.loads(
        gzip.decompress((Path(moto.__file__).parent / "ec2/resources/instance_types.json.gz").read_bytes())
    )
    aws_types = [t for (cloud, t) in load_catalog().facts if cloud == "aws" and t in data]
    assert len(aws_types) > 20
    for t in aws_types:
        assert data[t]["ProcessorInfo"]["SupportedArchitectures"] == [CATALOG_ARCHITECTURE], t
    assert data["m7i.large"]["ProcessorInfo"]["SupportedArchitectures"] == ["x86_64"]  # the AWS build types
    assert data["m7g.large"]["ProcessorInfo"]["SupportedArchitectures"] == ["arm64"]


def test_p5_manifest_pins_the_boot_paths_versions(p5_bake):
    m = p5_bake.manifest
    assert (m.fabric, m.architecture, m.driver_branch) == ("efa", "x86_64", "580")  # the DLAMI's branch
    assert set(m.instance_types) == {"p5.48xlarge", "p5.4xlarge"}
    assert (m.efa_installer_version, m.aws_ofi_nccl_version) == ("1.43.2", "1.16.3")
    assert m.efa_installer_version == fabric.EFA_INSTALLER_VERSION
    assert p5_bake.build_instance_type == "m7i.large" and p5_bake.stack == "bake-p5"
    tags = m.aws_tags()
    assert tags["gpuinfra:bake:efa_installer_version"] == "1.43.2"
    assert tags["gpuinfra:bake:sha256"] == m.sha256 and len(tags) <= 50
    assert all(len(k) <= 128 and len(v) <= 256 for k, v in tags.items())


def test_a3mega_manifest_has_the_tcpxo_host_pins(a3mega_bake):
    m = a3mega_bake.manifest
    assert m.fabric == "tcpxo"
    assert (
        m.rxdm_image
        == TCPXO.host.rxdm_image
        == "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.23"
    )
    assert m.dmabuf_import_helper_version == fabric_host.DMABUF_IMPORT_HELPER_VERSION == "1.1"
    labels = m.gcp_labels()
    # GCP label rules: <= 63 chars of [a-z0-9_-]
    assert all(len(v) <= 63 and all(c.isdigit() or c.islower() or c in "_-" for c in v) for v in labels.values())
    assert labels["gpuinfra-bake-dmabuf"] == "1_1" and labels["gpuinfra-bake-fabric"] == "tcpxo"
    assert a3mega_bake.zone == "us-central1-a" and a3mega_bake.build_instance_type == "n1-standard-8"


@pytest.mark.parametrize(
    "request_, message",
    [
        (aws_request(family="p9"), "unknown aws family 'p9'; known: "),  # unknown family
        (aws_request(base_architecture="arm64"), "is arm64, but aws family p5 (p5.48xlarge) is x86_64"),
        (gcp_request(base_image=gcp_request().base_image + "-arm64"), "is arm64, but gcp family"),
        (aws_request(container_base="nvcr.io/nvidia/pytorch:25.01-py3"), "has no digest; pin it as"),
        (aws_request(base_image="ami-latest"), "is not an AMI id"),
        (
            gcp_request(
                base_image="projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570"
            ),
            "is not a pinned GCP image",
        ),
        (gcp_request(driver_branch="550"), "carries NVIDIA 570, not the pinned branch 550"),
        (aws_request(base_image=None), "--base-image is required"),
    ],
)
def test_bad_input_is_one_line_exit_2(request_, message):
    with pytest.raises(BakeError) as caught:
        plan_bake(request_, load_catalog().facts, DLVM_FAMILY)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == ExitCode.BAD_INPUT == 2


def test_tag_without_digest_is_allowed_when_pinning_is_off():
    spec = plan_bake(
        aws_request(container_base="nvcr.io/nvidia/pytorch:25.01-py3", require_digest=False),
        load_catalog().facts,
        DLVM_FAMILY,
    )
    assert spec.manifest.container_pinned is False
