"""Offline preview of a bake stack: the real program (:func:`blueprints.program.build_bake`)
under Pulumi's mocks, recorded the way :mod:`gpuinfra.preview` records a cluster, then the
conformance rules and the provider-values check (:func:`gpuinfra.rules.check_graph`).

Values Image Builder and Cloud Build compute when they run (the AMI id, the container digest,
the GCP image name) are unknown here; the preview notes say so.
"""

from __future__ import annotations

import asyncio
import contextvars
import json

from gpuinfra.bake.model import BakeSpec
from gpuinfra.preview import PreviewMocks, PreviewResult, ResourceRecord, _make_monitor, _make_runtime_mocks

NOTES = {
    "aws": "the AMI id and the container digest are known only after Image Builder ran; `gpuinfra up` waits "
           "for the build and records both",
    "gcp": "the image name is known only after the Cloud Build run, which `gpuinfra up` starts; then run "
           "`gpuinfra image record <name> --from-outputs`",
}


def bake_provider_config(spec: BakeSpec) -> dict[str, str]:
    """Provider settings of a bake stack: ``aws:region``, or ``gcp:project/region/zone``."""
    if spec.cloud == "aws":
        return {"aws:region": spec.region}
    return {"gcp:project": spec.gcp_project or "", "gcp:region": spec.region, "gcp:zone": spec.zone}


def _run(spec: BakeSpec) -> PreviewResult:
    import pulumi
    from pulumi.runtime.settings import SETTINGS
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    from blueprints.program import build_bake

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    records: list[ResourceRecord] = []
    outputs: dict = {}
    mocks = PreviewMocks(spec)  # answers no call a bake makes; fills ARNs, names, links
    runtime_mocks = _make_runtime_mocks(mocks)
    pulumi.runtime.set_mocks(runtime_mocks, project="gpuinfra", stack=spec.stack, preview=True,
                             monitor=_make_monitor(runtime_mocks, records, outputs))
    pulumi.runtime.set_all_config({"gpuinfra:bake": json.dumps(spec.to_config()), **bake_provider_config(spec)})
    SETTINGS.rpc_manager.clear()
    SETTINGS.outputs.clear()
    try:
        _sync_await(run_pulumi_func(lambda: build_bake(spec)))
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        asyncio.set_event_loop(None)
    return PreviewResult(stack=spec.stack, resources=records, outputs=outputs, notes=[*mocks.notes, NOTES[spec.cloud]])


def run_bake_preview(spec: BakeSpec) -> PreviewResult:
    """Every resource the bake stack registers, offline (in a fresh context, as
    :func:`gpuinfra.preview.run_preview`)."""
    return contextvars.Context().run(_run, spec)


def check_bake(resources) -> list:
    """Conformance rules and provider values over a bake preview's resources.

    Returns:
        :class:`gpuinfra.rules.model.Violation` list; empty when the stack conforms.
    """
    from gpuinfra.rules import check_graph
    from gpuinfra.rules.model import ResourceGraph

    return check_graph(ResourceGraph.from_records(resources), {})
