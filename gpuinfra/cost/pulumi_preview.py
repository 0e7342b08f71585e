"""Read the output of ``pulumi preview --json`` so users with the Pulumi CLI price exactly what
Pulumi plans.

Format (pulumi/pulumi pkg/display/json.go, ``previewDigest``): ``{"config": {"aws:region": ...},
"steps": [{"op": "create"|"update"|"same"|"replace"|"delete"|..., "urn": ..., "newState":
{"type", "urn", "custom", "inputs", "parent", ...}, "oldState": {...}}], "changeSummary": ...}``.
Steps whose op deletes a resource are left out; for the others ``newState.inputs`` is priced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gpuinfra.errors import PreviewFileError

_DELETING = {"delete", "discard", "delete-replaced", "discard-replaced", "remove-pending-replace"}


@dataclass
class PlannedResource:
    """A resource from the preview (same shape as an offline-preview record)."""

    type: str
    name: str
    inputs: dict


def read_pulumi_preview(path: Path) -> tuple[list[PlannedResource], dict, str]:
    """(resources, config, stack name) from a `pulumi preview --json` file.

    Raises:
        PreviewFileError: unreadable, not JSON, or without ``steps``.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PreviewFileError(f"cannot read {path} as `pulumi preview --json` output: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        raise PreviewFileError(
            f"{path} has no 'steps' list; produce it with `pulumi preview --json > {Path(path).name}`"
        )
    resources = []
    stack = ""
    for step in doc["steps"]:
        if step.get("op") in _DELETING:
            continue
        state = step.get("newState") or {}
        urn = state.get("urn") or step.get("urn", "")
        rtype = state.get("type") or (urn.split("::")[2].split("$")[-1] if urn.count("::") >= 3 else "")
        if not rtype or rtype in ("pulumi:pulumi:Stack",) or rtype.startswith("pulumi:providers:"):
            if rtype == "pulumi:pulumi:Stack" and urn.count("::") >= 3:
                stack = urn.split("::")[0].split(":")[-1]
            continue
        stack = stack or urn.split("::")[0].split(":")[-1]
        resources.append(PlannedResource(type=rtype, name=urn.split("::")[-1], inputs=state.get("inputs") or {}))
    return resources, doc.get("config") or {}, stack
