"""Every committed stack file in stacks/ loads, previews offline, passes every rule that
`gpuinfra preview` checks (facts still current included) and prices (they cannot rot)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from gpuinfra.catalog.prices import usage_for
from gpuinfra.catalog.store import load_catalog
from gpuinfra.cost.estimate import estimate
from gpuinfra.preview import run_preview
from gpuinfra.rules import verify_stack
from gpuinfra.stackfile import provider_config, read_stack_spec

ROOT = Path(__file__).resolve().parent.parent
STACKS = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))


def test_there_are_example_stacks():
    assert {"example-p5-2nodes", "example-a3mega-2nodes", "example-4xa100"} <= set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_example_stack_previews_and_prices(stack):
    spec = read_stack_spec(ROOT, stack)
    result = run_preview(spec, provider_config(spec))
    assert result.resources and result.resources[0].parent is None
    verify_stack(spec, result.resources, load_catalog())
    est = estimate(
        result.resources, load_catalog(), spec.region, usage_for(spec.profile.name), Decimal(str(spec.run_hours))
    )
    compute = [line for line in est.lines if line.component.startswith(("Instance usage", "Machine (", "GPUs ("))]
    assert compute and all(line.unit_price_usd is not None for line in compute)
    assert est.not_priced == []
