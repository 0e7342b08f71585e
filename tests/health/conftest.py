"""Recorded command outputs for the health gate (tests/fixtures/health/, each with a .source file),
and stack specs built the way `gpuinfra new` builds them."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "health"
CREATED = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


def fixture_text(name: str) -> str:
    """The text of one recorded output."""
    return (FIXTURES / name).read_text()


@lru_cache(maxsize=64)
def plan_for(
    instance_type: str, nodes: int = 2, profile: str = "llm-finetune", stack: str = "train", gpus: str | None = None
):
    """The plan `gpuinfra new --instance-type T --nodes N --profile P --name STACK` makes (the real
    planner; the cloud is the one whose catalog has the type)."""
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.planner import PlanRequest, plan_cluster
    from gpuinfra.profiles import get_profile

    catalog = load_catalog()
    cloud = next(c for (c, t) in catalog.facts if t == instance_type)
    request = PlanRequest(gpus=gpus, instance_type=instance_type, nodes=nodes, cloud=cloud, spot=False, name=stack)
    return plan_cluster(catalog, request, get_profile(profile), CREATED)


def spec_for(
    instance_type: str, nodes: int = 2, profile: str = "llm-finetune", stack: str = "train", gpus: str | None = None
):
    """The spec of :func:`plan_for`."""
    return plan_for(instance_type, nodes, profile, stack, gpus).spec


@pytest.fixture
def recorded():
    return fixture_text
