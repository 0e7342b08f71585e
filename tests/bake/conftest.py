"""Shared bake fixtures: the p5 and a3-megagpu-8g bakes of the issue."""

from __future__ import annotations

import pytest

from gpuinfra.bake.plan import BakeRequest, plan_bake
from gpuinfra.catalog.store import load_catalog

NGC = "nvcr.io/nvidia/pytorch:25.01-py3@sha256:" + "a" * 64
AMI = "ami-0123456789abcdef0"
GCP_BASE = "projects/deeplearning-platform-release/global/images/common-cu128-ubuntu-2204-nvidia-570-v20251020"
DLVM_FAMILY = "common-cu128-ubuntu-2204-nvidia-570"


def aws_request(**changes) -> BakeRequest:
    return BakeRequest(
        **{"cloud": "aws", "family": "p5", "region": "us-east-1", "base_image": AMI, "container_base": NGC, **changes}
    )


def gcp_request(**changes) -> BakeRequest:
    return BakeRequest(
        **{
            "cloud": "gcp",
            "family": "a3-megagpu-8g",
            "region": "us-central1",
            "base_image": GCP_BASE,
            "container_base": NGC,
            "gcp_project": "gpuinfra-test-1",
            **changes,
        }
    )


@pytest.fixture(scope="session")
def p5_bake():
    return plan_bake(aws_request(), load_catalog().facts, DLVM_FAMILY)


@pytest.fixture(scope="session")
def a3mega_bake():
    return plan_bake(gcp_request(), load_catalog().facts, DLVM_FAMILY)
