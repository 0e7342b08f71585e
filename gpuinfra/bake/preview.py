"""Offline preview of a bake stack: the real program (:func:`blueprints.program.build_bake`)
under Pulumi's mocks, recorded the way :mod:`gpuinfra.preview` records a cluster, then the
conformance rules and the provider-values check (:func:`gpuinfra.rules.check_graph`).

Values Image Builder and Cloud Build compute when they run (the AMI id, the container digest,
the GCP image name) are unknown here; the preview notes say so.
"""

from __future__ import annotations

import json

from gpuinfra.bake.model import BakeSpec
from gpuinfra.preview import PreviewMocks, PreviewResult, run_program
from gpuinfra.rules import check_graph
from gpuinfra.rules.model import ResourceGraph

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


def run_bake_preview(spec: BakeSpec) -> PreviewResult:
    """Every resource the bake stack registers, offline (:func:`gpuinfra.preview.run_program`,
    as a cluster preview runs), with the note of what only the build itself knows."""

    def program():
        # imported when the program runs: blueprints load Pulumi and the cloud provider SDKs
        from blueprints.program import build_bake

        return build_bake(spec)

    config = {"gpuinfra:bake": json.dumps(spec.to_config()), **bake_provider_config(spec)}
    result = run_program(spec.stack, PreviewMocks(spec), config, program)
    result.notes.append(NOTES[spec.cloud])
    return result


def check_bake(resources) -> list:
    """Conformance rules and provider values over a bake preview's resources.

    Returns:
        :class:`gpuinfra.rules.model.Violation` list; empty when the stack conforms.
    """
    return check_graph(ResourceGraph.from_records(resources), {})
