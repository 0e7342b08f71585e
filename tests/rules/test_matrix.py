"""The conformance matrix: every type in the catalog x every built-in profile x {on-demand,
spot} x {1, 2, 64 nodes} either conforms -- the blueprint plan passes every plan rule, the type
is offered in the zone and the facts are current -- or is refused at ``new`` with one line naming
a rule. No Pulumi: :func:`gpuinfra.rules.check_plan` runs the same rule predicates as the preview
checks.

Full offline Pulumi previews (:func:`gpuinfra.preview.run_preview` + :func:`check_preview`,
provider values included) run once per equivalence class of the matrix: cloud x fabric family
of the type x fabric the plan builds x market x {1, N nodes}, the representative being the first
conforming case of the class in sorted order.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import GpuinfraError
from gpuinfra.plan.cluster import cloud_plan
from gpuinfra.planner import PlanRequest, plan_cluster
from gpuinfra.preview import run_preview
from gpuinfra.profiles import load_profiles
from gpuinfra.rules import RULES, check_facts_current, check_offered_in_zone, check_plan, check_preview
from gpuinfra.stackfile import provider_config
from tests.conftest import SUMMARY_LINES

NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
NODES = (1, 2, 64)
CLOUDS = ("aws", "gcp")
_RULE_NAMED = re.compile(r"\b(" + "|".join(re.escape(r) for r in sorted(RULES, key=len, reverse=True)) + r")\b")


@dataclass(frozen=True)
class Case:
    """One matrix case and what came of it.

    Attributes:
        cloud, instance_type, profile, spot, nodes: the case (``gpuinfra new`` arguments).
        refused_by: the rule a refusal names ("?" when it names none); None when planned.
        failure: why the case fails the matrix ("" when it does not).
        spec, plan: the spec and blueprint plan of a planned case (None when refused).
    """

    cloud: str
    instance_type: str
    profile: str
    spot: bool
    nodes: int
    refused_by: str | None = None
    failure: str = ""
    spec: Any = None
    plan: Any = None

    def __str__(self) -> str:
        return f"{self.instance_type} {self.profile} {'spot' if self.spot else 'on-demand'} x{self.nodes}"


def _gpus_for(catalog, cloud: str, itype: str) -> str | None:
    """N1 hosts take attached GPUs: the smallest shape the catalog offers on the host."""
    fact = catalog.fact(cloud, itype)
    if not fact.guest_accelerators:
        return None
    count, gpu = min({(o.gpu_count, o.gpu) for o in catalog.offers if o.instance_type == itype})
    return f"{count}x{gpu}"


def _run_case(catalog, cloud: str, itype: str, gpus: str | None, profile, spot: bool, nodes: int) -> Case:
    """Plan one case and judge it with the plan rules and the stack-level rules."""
    case = Case(cloud, itype, profile.name, spot, nodes)
    request = PlanRequest(gpus=gpus, instance_type=itype, cloud=cloud, nodes=nodes, spot=spot, name="m")
    try:
        spec = plan_cluster(catalog, request, profile, NOW).spec
        plan = cloud_plan(spec)
    except GpuinfraError as exc:
        rule = _RULE_NAMED.search(str(exc))
        failure = "" if rule and len(str(exc).splitlines()) == 1 else f"{case}: refused without naming a rule: {exc}"
        return replace(case, refused_by=rule.group(1) if rule else "?", failure=failure)
    found = check_plan(spec, plan) + check_offered_in_zone(spec, catalog) + check_facts_current(spec, catalog)
    failure = f"{case}: " + "; ".join(v.line() for v in found) if found else ""
    return replace(case, failure=failure, spec=spec, plan=plan)


@pytest.fixture(scope="module")
def matrix() -> dict[str, Any]:
    """Every case of the matrix, planned once for this module (no Pulumi)."""
    catalog = load_catalog()
    profiles = load_profiles()
    types = sorted({(o.cloud, o.instance_type) for o in catalog.offers if not o.local_zone})
    cases = [
        _run_case(catalog, cloud, itype, _gpus_for(catalog, cloud, itype), profile, spot, nodes)
        for cloud, itype in types
        for profile in sorted(profiles.values(), key=lambda p: p.name)
        for spot in (False, True)
        for nodes in NODES
    ]
    return {"catalog": catalog, "types": types, "profiles": profiles, "cases": cases}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_every_case_of_the_cloud_conforms_or_is_refused_by_rule(matrix, cloud):
    failures = [c.failure for c in matrix["cases"] if c.cloud == cloud and c.failure]
    assert not failures, "\n".join(failures[:30])


def test_matrix_size_and_counts(matrix):
    types, profiles, cases = matrix["types"], matrix["profiles"], matrix["cases"]
    outcomes = Counter("refused" if c.refused_by else "with violations" if c.failure else "previewed" for c in cases)
    refusals = Counter(c.refused_by for c in cases if c.refused_by)
    total = len(types) * len(profiles) * 2 * len(NODES)
    summary = (
        f"conformance matrix (plans): {len(types)} types x {len(profiles)} profiles x 2 markets x "
        f"{len(NODES)} sizes = {total} cases; {outcomes['previewed']} planned with 0 violations, "
        f"{outcomes['with violations']} with violations, {outcomes['refused']} refused at new "
        f"({', '.join(f'{r} {n}' for r, n in refusals.most_common())})"
    )
    print(summary)
    SUMMARY_LINES.append(summary)
    assert len(cases) == total
    assert not [c.failure for c in cases if c.failure]
    assert outcomes["previewed"] + outcomes["refused"] == total  # every case is one or the other
    assert outcomes["previewed"] > total // 4  # the matrix is not vacuous


def preview_class(case: Case) -> tuple:
    """The equivalence class of a planned case for the full preview: cloud, the type's fabric
    family (``InstanceFacts.nic_layout``), the fabric the plan builds (AWS: EFA with one or
    several network cards, or plain ENA; GCP: the plan's ``nic_layout``), the market, and one
    node or several (placement policies, bulk mode and formation watchdog differ)."""
    plan = case.plan
    if case.cloud == "aws":
        fabric = "ena" if not plan.efa_count else "efa" if len(plan.interfaces) == 1 else "efa-multi-card"
    else:
        fabric = plan.nic_layout
    return (case.cloud, case.spec.facts.nic_layout, fabric, "spot" if case.spot else "on-demand", case.nodes > 1)


def representatives(cases: list[Case]) -> dict[tuple, Case]:
    """Class -> its first conforming case in (cloud, type, profile, market, nodes) order."""
    chosen: dict[tuple, Case] = {}
    for case in sorted(
        (c for c in cases if c.plan is not None and not c.failure),
        key=lambda c: (c.cloud, c.instance_type, c.profile, c.spot, c.nodes),
    ):
        chosen.setdefault(preview_class(case), case)
    return chosen


def test_one_full_preview_per_equivalence_class(matrix):
    chosen = representatives(matrix["cases"])
    catalog = matrix["catalog"]
    families = {(cloud, catalog.fact(cloud, itype).nic_layout) for cloud, itype in matrix["types"]}
    assert {(key[0], key[1]) for key in chosen} == families  # every fabric family of the catalog is previewed
    disagreements = []
    for key, case in sorted(chosen.items(), key=lambda item: str(item[0])):
        resources = run_preview(case.spec, provider_config(case.spec)).resources
        on_graph = [v.line() for v in check_preview(case.spec, resources)]
        on_plan = [v.line() for v in check_plan(case.spec, case.plan)]
        if on_graph or on_plan:
            disagreements.append(f"{key} {case}: preview {on_graph}; plan {on_plan}")
    summary = (
        f"conformance matrix (previews): {len(chosen)} equivalence classes covering "
        f"{len(families)} fabric families, {len(chosen)} full offline previews"
    )
    print(summary)
    SUMMARY_LINES.append(summary)
    assert not disagreements, "\n".join(disagreements)
