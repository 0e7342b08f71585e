"""The conformance matrix: every type in the catalog x every built-in profile x {on-demand,
spot} x {1, 2, 64 nodes} either previews with zero rule violations (provider values included)
or is refused at ``new`` with one line naming a rule."""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, UTC

from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import GpuinfraError
from gpuinfra.planner import PlanRequest, plan_cluster
from gpuinfra.preview import run_preview
from gpuinfra.profiles import load_profiles
from gpuinfra.rules import RULES, check_facts_current, check_offered_in_zone, check_preview
from gpuinfra.stackfile import provider_config
from tests.conftest import SUMMARY_LINES

NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
NODES = (1, 2, 64)
_RULE_NAMED = re.compile(r"\b(" + "|".join(re.escape(r) for r in sorted(RULES, key=len, reverse=True)) + r")\b")


def _gpus_for(catalog, cloud: str, itype: str) -> str | None:
    """N1 hosts take attached GPUs: the smallest shape the catalog offers on the host."""
    fact = catalog.fact(cloud, itype)
    if not fact.guest_accelerators:
        return None
    count, gpu = min({(o.gpu_count, o.gpu) for o in catalog.offers if o.instance_type == itype})
    return f"{count}x{gpu}"


def test_every_type_profile_market_and_size_conforms_or_is_refused_by_rule():
    catalog = load_catalog()
    profiles = load_profiles()
    types = sorted({(o.cloud, o.instance_type) for o in catalog.offers if not o.local_zone})
    outcomes: Counter = Counter()
    refusals: Counter = Counter()
    failures: list[str] = []
    for cloud, itype in types:
        gpus = _gpus_for(catalog, cloud, itype)
        for profile in profiles.values():
            for spot in (False, True):
                for nodes in NODES:
                    case = f"{itype} {profile.name} {'spot' if spot else 'on-demand'} x{nodes}"
                    request = PlanRequest(gpus=gpus, instance_type=itype, cloud=cloud, nodes=nodes, spot=spot, name="m")
                    try:
                        spec = plan_cluster(catalog, request, profile, NOW).spec
                        resources = run_preview(spec, provider_config(spec)).resources
                    except GpuinfraError as exc:
                        lines = str(exc).splitlines()
                        rule = _RULE_NAMED.search(str(exc))
                        if rule is None or len(lines) != 1:
                            failures.append(f"{case}: refused without naming a rule: {exc}")
                        refusals[rule.group(1) if rule else "?"] += 1
                        outcomes["refused"] += 1
                        continue
                    found = check_preview(spec, resources) + check_offered_in_zone(spec, catalog) + \
                        check_facts_current(spec, catalog)
                    if found:
                        failures.append(f"{case}: " + "; ".join(v.line() for v in found))
                    outcomes["with violations" if found else "previewed"] += 1
    total = len(types) * len(profiles) * 2 * len(NODES)
    summary = (f"conformance matrix: {len(types)} types x {len(profiles)} profiles x 2 markets x {len(NODES)} sizes "
               f"= {total} cases; {outcomes['previewed']} previewed with 0 violations, "
               f"{outcomes['with violations']} with violations, {outcomes['refused']} refused at new "
               f"({', '.join(f'{r} {n}' for r, n in refusals.most_common())})")
    print(summary)
    SUMMARY_LINES.append(summary)
    assert not failures, "\n".join(failures[:30])
    assert outcomes["previewed"] + outcomes["refused"] == total  # every case is one or the other
    assert outcomes["previewed"] > total // 4  # the matrix is not vacuous
