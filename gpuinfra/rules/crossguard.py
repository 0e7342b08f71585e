"""The policy pack's validators: the same rule checks and the cost model, on CrossGuard's
``StackValidationArgs``.

``policy/__main__.py`` serves :func:`policies` (these two functions as
``pulumi_policy.StackValidationPolicy`` objects), so ``pulumi preview --policy-pack policy``
gives the verdicts of ``gpuinfra preview``.
They take plain arguments (objects with ``resource_type``, ``props``, ``urn``, ``name`` and
``provider``, as ``pulumi_policy.PolicyResource`` has them) so tests run them in-process.

During ``pulumi preview`` CrossGuard wraps ``props`` in a proxy that raises on values not known
yet (ids of resources still to be created). :func:`plain_props` copies props and puts
:data:`gpuinfra.rules.model.UNKNOWN` in their place, so the checks know the input is set and
skip what depends on its value (pulumi-policy ``proxy.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, cast

from gpuinfra.catalog.prices import usage_for
from gpuinfra.catalog.store import load_catalog
from gpuinfra.cost.estimate import estimate
from gpuinfra.rules import check_graph
from gpuinfra.rules.model import UNKNOWN, ResourceGraph
from gpuinfra.spec import AWS_BUDGET_TAG, AWS_RUN_HOURS_TAG, GCP_BUDGET_LABEL, GCP_RUN_HOURS_LABEL

#: pulumi-policy's unknown-value sentinels (pulumi_policy/proxy.py UNKNOWN_*_VALUE).
_UNKNOWN = frozenset(
    {
        "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7",
        "3eeb2bf0-c639-47a8-9e75-3b44932eb421",
        "04da6b54-80e4-46f7-96ec-b56ff0331ba9",
        "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2",
        "030794c1-ac77-496b-92df-f27374a8bd58",
        "e48ece36-62e2-4504-bad9-02848725956a",
        "dd056dcd-154b-4c76-9bd3-c8f88648b5ff",
    }
)

ReportViolation = Callable[..., None]


@dataclass
class _Record:
    type: str
    name: str
    inputs: dict
    parent: str | None = None


def plain_props(value: Any) -> Any:
    """``value`` as plain dicts/lists, unknown values replaced by ``UNKNOWN`` (see module docstring)."""
    if isinstance(value, Mapping):
        try:
            target = value["__target"]  # pulumi-policy's dict proxy hands out its target
        except (KeyError, TypeError):
            target = value
        return {k: plain_props(v) for k, v in dict(target).items()}
    if isinstance(value, (list, tuple)) or (
        hasattr(value, "__len__") and hasattr(value, "__getitem__") and not isinstance(value, (str, bytes))
    ):
        try:
            items = cast(Any, value)["__target"]  # list proxy (a list or tuple raises TypeError)
        except (KeyError, TypeError, IndexError):
            items = list(value)
        return [plain_props(v) for v in items]
    return UNKNOWN if _is_unknown(value) else value


def _is_unknown(value: Any) -> bool:
    return isinstance(value, str) and value in _UNKNOWN


def records(resources: Iterable[Any]) -> list[_Record]:
    """Policy resources as the records the rule checks and the cost model read."""
    return [
        _Record(r.resource_type, r.name, plain_props(r.props))
        for r in resources
        if not r.resource_type.startswith(("pulumi:", "gpuinfra:"))
    ]


def _urn(resources: Iterable[Any], name: str) -> str | None:
    return next((r.urn for r in resources if r.name == name), None)


def validate_conformance(args: Any, report_violation: ReportViolation) -> None:
    """Stack policy ``gpuinfra-cloud-rules``: every rule of :mod:`gpuinfra.rules`, with the
    node type's facts from the installed gpuinfra catalog.

    Args:
        args: ``pulumi_policy.StackValidationArgs`` (``resources``).
        report_violation: CrossGuard's callback ``(message, urn=None)``.
    """
    graph = ResourceGraph.from_records(records(args.resources))
    catalog = load_catalog()
    types = {str(r.inputs.get("instanceType") or r.inputs.get("machineType") or "") for r in graph}
    facts = {t: f for t in types for f in [catalog.fact("aws", t) or catalog.fact("gcp", t)] if f is not None}
    for found in check_graph(graph, facts):
        report_violation(found.line(), _urn(args.resources, found.resource))


def _region(args: Any, recs: list[_Record]) -> str | None:
    for r in args.resources:
        provider = getattr(r, "provider", None)
        region = plain_props(getattr(provider, "props", None) or {}).get("region") if provider else None
        if region:
            return str(region)

    zones = {o.zone: o.region for o in load_catalog().offers}
    for rec in recs:
        zone = rec.inputs.get("availabilityZoneId") or rec.inputs.get("zone")
        if zone in zones:
            return zones[zone]
    return None


def _stack_tag(recs: list[_Record], aws_key: str, gcp_key: str) -> str | None:
    """A gpuinfra tag (AWS) / label (GCP) the blueprints put on the stack's resources
    (gpuinfra/plan/tags.py), or None."""
    for rec in recs:
        for key, bag in ((aws_key, rec.inputs.get("tags")), (gcp_key, rec.inputs.get("labels"))):
            if isinstance(bag, dict) and bag.get(key) not in (None, UNKNOWN):
                return str(bag[key])
    return None


def _stack_budget(recs: list[_Record]) -> str | None:
    """The stack's own ``max_price_per_hour_usd`` as written on its resources (GCP labels write
    ``12_5`` for 12.5), or None."""
    value = _stack_tag(recs, AWS_BUDGET_TAG, GCP_BUDGET_LABEL)
    return None if value is None else value.replace("_", ".")


def validate_budget(args: Any, report_violation: ReportViolation) -> None:
    """Stack policy ``gpuinfra-budget``: the stack's priced $/h is at most the policy config's
    ``maxPricePerHourUsd``, else the stack's own ``max_price_per_hour_usd`` (carried as a tag /
    label); a resource without a price fails (money fails closed). Not applicable
    (``args.not_applicable``) when neither is set.

    Args:
        args: ``pulumi_policy.StackValidationArgs`` (``resources``, ``get_config()``).
        report_violation: CrossGuard's callback.
    """
    config = args.get_config() or {}
    recs = records(args.resources)
    configured = config.get("maxPricePerHourUsd")
    if configured is None:
        configured = _stack_budget(recs)
    if configured is None:
        args.not_applicable("no maxPricePerHourUsd in the policy config and no max_price_per_hour_usd on the stack")
        return
    try:
        limit = Decimal(str(configured))
    except InvalidOperation:
        report_violation(
            f"the budget {configured!r} (policy config maxPricePerHourUsd or the stack's "
            "max_price_per_hour_usd) is not set to a number"
        )
        return
    if not limit.is_finite() or limit <= 0:
        report_violation(f"the budget must be a positive number, got {configured!r}")
        return

    # usage defaults and run length as `gpuinfra preview` uses them (per-run transfer is spread
    # over the run); without a recorded run length, one hour (the strictest spread)
    profile = _stack_tag(recs, "gpuinfra:profile", "gpuinfra-profile")
    try:
        hours = Decimal((_stack_tag(recs, AWS_RUN_HOURS_TAG, GCP_RUN_HOURS_LABEL) or "1").replace("_", "."))
    except InvalidOperation:
        hours = Decimal(1)
    hours = hours if hours.is_finite() and hours > 0 else Decimal(1)
    result = estimate(recs, load_catalog(), _region(args, recs), usage_for(profile), hours)
    missing = [line for line in result.lines if line.unit_price_usd is None and line.hourly_quantity]
    for name, rtype, why in result.not_priced:
        report_violation(f"no price for {rtype} ({why}); a missing price is never $0", _urn(args.resources, name))
    for line in missing:
        report_violation(
            f"no price for {line.component} ({line.source}); a missing price is never $0",
            _urn(args.resources, line.resource),
        )
    if missing or result.not_priced:
        return
    hourly = sum((line.hourly_usd or Decimal(0) for line in result.lines), Decimal(0))
    if hourly > limit:
        report_violation(f"the stack costs ${hourly:.2f}/h, over maxPricePerHourUsd ${limit:.2f}/h")


def policies() -> list:
    """The pack's two ``pulumi_policy.StackValidationPolicy`` objects (mandatory):
    ``gpuinfra-cloud-rules`` (:func:`validate_conformance`) and ``gpuinfra-budget``
    (:func:`validate_budget`, config ``maxPricePerHourUsd``).

    Raises:
        ImportError: pulumi-policy is not installed (``pip install gpuinfra[policy]``).
    """
    from pulumi_policy import EnforcementLevel, PolicyConfigSchema, StackValidationPolicy

    return [
        StackValidationPolicy(
            name="gpuinfra-cloud-rules",
            description="GPU cluster resources follow the clouds' rules (sources: gpuinfra/rules/spec_rules.py).",
            validate=validate_conformance,
            enforcement_level=EnforcementLevel.MANDATORY,
        ),
        StackValidationPolicy(
            name="gpuinfra-budget",
            description="The stack's price per hour is within maxPricePerHourUsd; a missing price fails.",
            validate=validate_budget,
            enforcement_level=EnforcementLevel.MANDATORY,
            config_schema=PolicyConfigSchema(
                properties={"maxPricePerHourUsd": {"type": "number", "exclusiveMinimum": 0}}
            ),
        ),
    ]
