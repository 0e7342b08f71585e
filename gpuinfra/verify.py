"""Preview as validation: a spec is accepted only after the real Pulumi program ran over it
offline, every resource was priced and every cloud rule held.

``gpuinfra new`` runs :func:`verify_spec` before it writes a stack file (a spec the blueprint
or a rule rejects never reaches the disk); ``gpuinfra preview`` runs :func:`verify_stack_file`
on a stack file, edited or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuinfra.catalog.store import Catalog, load_catalog
from gpuinfra.cost.report import cost_summary
from gpuinfra.preview import PreviewResult, run_preview_cached
from gpuinfra.rules import verify_stack
from gpuinfra.spec import ClusterSpec
from gpuinfra.stackfile import provider_config, read_stack_spec


@dataclass(frozen=True)
class VerifiedPreview:
    """A spec's offline preview that passed every rule, with its cost summary.

    Attributes:
        spec: the spec previewed.
        preview: its resources, outputs and notes (:func:`gpuinfra.preview.run_preview_cached`).
        cost: :func:`gpuinfra.cost.report.cost_summary` of the resources: ``hourly_usd``,
            ``run_usd``, ``monthly_if_left_running_usd`` (USD strings), ``hours``, ``pricing``,
            ``catalog_date``, ``price_not_found`` (lines without a price, each left out of the
            totals).
    """

    spec: ClusterSpec
    preview: PreviewResult
    cost: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The ``gpuinfra preview --json`` document: ``{"stack", "resources", "outputs", "notes",
        "cost", "violations": []}`` (``violations`` is always empty: a violation raises)."""
        return {**self.preview.to_json(), "cost": self.cost, "violations": []}


def verify_spec(spec: ClusterSpec, catalog: Catalog | None = None) -> VerifiedPreview:
    """Preview ``spec`` offline, price it and check every cloud rule.

    Args:
        spec: the cluster spec (planned by :func:`gpuinfra.planner.plan_cluster` or read back).
        catalog: the catalog for ``offered-in-zone`` and ``facts-current`` (default: the one
            in use).

    Raises:
        RuleViolationError: one line per broken rule (exit 2), also the blueprint's own refusals.
        SpecError: the blueprint refuses the spec, or its TTL runs past its Capacity Block's end
            (:meth:`ClusterSpec.check_ttl_within_block`).
    """
    spec.check_ttl_within_block()
    result = run_preview_cached(spec, provider_config(spec))
    summary = cost_summary(spec, result.resources)
    verify_stack(spec, result.resources, catalog or load_catalog(), summary, result.provider_violations)
    return VerifiedPreview(spec, result, summary)


def verify_stack_file(project_dir: Path, stack: str) -> VerifiedPreview:
    """:func:`verify_spec` of ``<project_dir>/stacks/Pulumi.<stack>.yaml``.

    Raises:
        SpecError: no such stack, an invalid stack file, or one without ``name_suffix``
            (:meth:`ClusterSpec.check_name_suffix`: its cloud names would collide).
        RuleViolationError: as :func:`verify_spec`.
    """
    spec = read_stack_spec(project_dir, stack)
    spec.check_name_suffix()
    return verify_spec(spec)
