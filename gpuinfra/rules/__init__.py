"""Cloud-rule conformance: named rules with sources, checked over an offline preview.

* :mod:`gpuinfra.rules.spec_rules` -- the one registry of rule names and source pages, and the
  error that refuses a spec (exit 2, one line per violation).
* :mod:`gpuinfra.rules.aws`, :mod:`gpuinfra.rules.gcp` -- checks over a preview's resources.
* :mod:`gpuinfra.rules.provider_values` -- every documented enum input holds one of the
  provider SDK's valid values (read from the installed pulumi-aws / pulumi-gcp).
* :mod:`gpuinfra.rules.plan_rules` -- :func:`check_plan`: the same rule predicates over the
  blueprint planner's typed plan, with no Pulumi (which rules stay preview-only, and why, is
  listed there).

``gpuinfra preview`` and ``gpuinfra new`` run :func:`check_preview` and refuse on any
violation; the CrossGuard policy pack in ``policy/`` runs :func:`check_graph` on
``pulumi preview``'s resources.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.gpus import load_gpu_models
from gpuinfra.cost.report import cost_summary, unpriced_lines
from gpuinfra.errors import RuleViolationError
from gpuinfra.rules import aws, gcp
from gpuinfra.rules.model import ResourceGraph, Violation
from gpuinfra.rules.node_values import check_node_values
from gpuinfra.rules.plan_rules import check_plan
from gpuinfra.rules.provider_values import check_provider_values
from gpuinfra.rules.spec_rules import RULES, violation

__all__ = [
    "RULES",
    "RuleViolationError",
    "Violation",
    "ResourceGraph",
    "check_graph",
    "check_preview",
    "check_offered_in_zone",
    "check_budget",
    "verify_stack",
    "check_plan",
]


def check_graph(
    graph: ResourceGraph,
    facts: Mapping[str, InstanceFacts],
    provider_values: bool = True,
    provider_verdict: list[Violation] | None = None,
) -> list[Violation]:
    """All rules of the graph's cloud(s) over ``graph``.

    Args:
        graph: the stack's resources (provider wire format, camelCase inputs).
        facts: instance / machine type -> facts (the spec's own, or the catalog's).
        provider_values: also check documented enum values against the installed SDKs.
        provider_verdict: :func:`check_provider_values` of this very graph, computed before
            (the preview cache keeps it): used instead of checking again, which imports the SDKs.

    Returns:
        Violations, sorted by rule and resource; empty when the stack conforms.
    """
    clouds = {r.type.split(":", 1)[0] for r in graph}
    found: list[Violation] = []
    if "aws" in clouds:
        for check in aws.CHECKS:
            found += check(graph, facts)
    if "gcp" in clouds:
        for check in gcp.CHECKS:
            found += check(graph, facts)
    found += check_node_values(graph, facts)
    if provider_values:
        found += check_provider_values(graph) if provider_verdict is None else provider_verdict
    return sorted(set(found), key=lambda v: (v.rule, v.resource, v.message))


def check_preview(
    spec: Any, resources: Iterable[Any], provider_values: bool = True, provider_verdict: list[Violation] | None = None
) -> list[Violation]:
    """Rules over an offline preview of ``spec``, with the facts the spec carries.

    Args:
        spec: the :class:`~gpuinfra.spec.ClusterSpec` the preview ran.
        resources: the preview's :class:`~gpuinfra.preview.ResourceRecord` list.
        provider_values, provider_verdict: see :func:`check_graph`.
    """
    return check_graph(
        ResourceGraph.from_records(resources), {spec.instance_type: spec.facts}, provider_values, provider_verdict
    )


def check_offered_in_zone(spec: Any, catalog: Any) -> list[Violation]:
    """``offered-in-zone``: the catalog has an offer of the spec's type in its zone (skipped
    when the catalog does not know the type at all, e.g. a newer type than the catalog)."""
    regions = {o.region for o in catalog.offers if o.cloud == spec.cloud}
    if regions and spec.region not in regions:
        return [
            violation(
                "offered-in-zone",
                "",
                f"region {spec.region!r} has no {spec.cloud.upper()} GPU offer in the catalog (an unknown or mistyped region)",
            )
        ]
    zone_regions = {o.region for o in catalog.offers if o.cloud == spec.cloud and o.zone == spec.zone}
    if zone_regions and spec.region not in zone_regions:
        return [
            violation(
                "offered-in-zone",
                "",
                f"zone {spec.zone} is in {', '.join(sorted(zone_regions))}, not in the stack's region {spec.region}",
            )
        ]
    zones = {o.zone for o in catalog.offers if o.cloud == spec.cloud and o.instance_type == spec.instance_type}
    if zones and spec.zone not in zones:
        near = sorted(z for z in zones if z.startswith(spec.region) or spec.cloud == "aws")[:6]
        return [
            violation(
                "offered-in-zone",
                "",
                f"{spec.instance_type} is not offered in {spec.zone}; it is in {', '.join(near) or 'other regions'}",
            )
        ]
    return []


def check_facts_current(spec: Any, catalog: Any) -> list[Violation]:
    """``facts-current``: the facts in the stack file equal the catalog's facts of the type
    (skipped when the catalog does not know the type)."""
    found = []
    gpu = next((m for m in load_gpu_models() if m.name == spec.gpu), None)
    if gpu is not None and gpu != spec.gpu_facts:
        # a fact the stack file does not record (written before the fact was added) is not an edit
        fields = sorted(
            k
            for k in type(gpu).model_fields
            if getattr(spec.gpu_facts, k, None) is not None
            and getattr(gpu, k) != getattr(spec.gpu_facts, k)
            and not k.endswith("source")
        )
        if fields:
            found.append(
                violation(
                    "facts-current",
                    "",
                    f"the stack's gpu_facts of {spec.gpu} differ from the catalog's in {', '.join(fields)}; "
                    "write the stack again (`gpuinfra new ... --force`)",
                )
            )
    current = catalog.fact(spec.cloud, spec.instance_type)
    if current is None or current == spec.facts:
        return found
    recorded, now = spec.facts.to_dict(), current.to_dict()
    fields = sorted(k for k in now if now[k] != recorded.get(k) and k != "sources")
    if not fields:
        return found
    return found + [
        violation(
            "facts-current",
            "",
            f"the stack's facts of {spec.instance_type} differ from the catalog's "
            f"in {', '.join(fields)}; write the stack again (`gpuinfra new ... --force`)",
        )
    ]


def check_budget(spec: Any, resources: Iterable[Any], summary: dict | None = None) -> list[Violation]:
    """``budget-max-price``: with ``spec.max_price_per_hour_usd`` set, the cost preview's $/h is
    within it and no line lacks a price (a missing price is never $0).

    Args:
        summary: :func:`gpuinfra.cost.report.cost_summary` of ``resources`` when the caller has
            it already (computed here otherwise).
    """
    from decimal import Decimal

    limit = getattr(spec, "max_price_per_hour_usd", None)
    if limit is None:
        return []
    if summary is None:
        summary = cost_summary(spec, list(resources))
    missing = unpriced_lines(summary)
    if missing or summary["hourly_usd"] is None:
        return [
            violation("budget-max-price", "", f"no price for {line}; a missing price is never $0") for line in missing
        ]
    hourly = Decimal(summary["hourly_usd"])
    if hourly > limit:
        return [
            violation(
                "budget-max-price",
                "",
                f"the stack costs ${hourly:.2f}/h, over its max_price_per_hour_usd ${limit:.2f}/h",
            )
        ]
    return []


def verify_stack(
    spec: Any,
    resources: Iterable[Any],
    catalog: Any | None = None,
    summary: dict | None = None,
    provider_verdict: list[Violation] | None = None,
) -> None:
    """Refuse a previewed stack that breaks any rule (what ``preview`` and ``new`` run).

    Args:
        spec: the stack's :class:`~gpuinfra.spec.ClusterSpec`.
        resources: its offline preview's resource records.
        catalog: the loaded catalog for ``offered-in-zone`` (skipped when None).
        summary: the stack's cost summary, if the caller has it (see :func:`check_budget`).
        provider_verdict: the cached ``provider-valid-values`` verdict (see :func:`check_graph`).

    Raises:
        RuleViolationError: one line per violation, each naming its rule and source (exit 2).
    """
    resources = list(resources)
    found = check_preview(spec, resources, provider_verdict=provider_verdict) + check_budget(spec, resources, summary)
    if catalog is not None:
        found = check_facts_current(spec, catalog) + check_offered_in_zone(spec, catalog) + found
    if found:
        raise RuleViolationError(found)
