"""Read the output of ``pulumi preview --json`` so users with the Pulumi CLI price exactly what
Pulumi plans.

Format (pulumi/pulumi pkg/display/json.go, ``previewDigest``): ``{"config": {"aws:region": ...},
"steps": [{"op": "create"|"update"|"same"|"replace"|"delete"|..., "urn": ..., "newState":
{"type", "urn", "custom", "inputs", "parent", ...}, "oldState": {...}}], "changeSummary": ...}``.
Steps whose op deletes a resource are left out; for the others ``newState.inputs`` is priced.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuinfra.errors import PreviewFileError
from gpuinfra.userfile import read_user_file

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
        PreviewFileError: unreadable or not JSON (:func:`gpuinfra.userfile.read_user_file`),
            without a ``steps`` list, or a step of the wrong shape (one line naming the step).
    """
    doc = read_user_file(Path(path), kind="preview file", error=PreviewFileError, fmt="json")
    if not isinstance(doc.get("steps"), list):
        raise PreviewFileError(
            f"{path} has no 'steps' list; produce it with `pulumi preview --json > {Path(path).name}`"
        )
    config = doc.get("config") or {}
    if not isinstance(config, dict):
        raise PreviewFileError(f"preview file {path}: 'config' must be an object")
    resources = []
    stack = ""
    for number, step in enumerate(doc["steps"], 1):
        state = step.get("newState") or {} if isinstance(step, dict) else None
        if not isinstance(state, dict):
            raise PreviewFileError(
                f"preview file {path}: step {number} must be an object with an optional 'newState' object"
            )
        if step.get("op") in _DELETING:
            continue
        urn = state.get("urn") or step.get("urn", "")
        rtype = state.get("type", "")
        inputs = state.get("inputs") or {}
        if not isinstance(urn, str) or not isinstance(rtype, str) or not isinstance(inputs, dict):
            raise PreviewFileError(
                f"preview file {path}: step {number}: 'urn' and 'type' must be strings and 'inputs' an object"
            )
        rtype = rtype or (urn.split("::")[2].split("$")[-1] if urn.count("::") >= 3 else "")
        if not rtype or rtype in ("pulumi:pulumi:Stack",) or rtype.startswith("pulumi:providers:"):
            if rtype == "pulumi:pulumi:Stack" and urn.count("::") >= 3:
                stack = urn.split("::")[0].split(":")[-1]
            continue
        stack = stack or urn.split("::")[0].split(":")[-1]
        resources.append(PlannedResource(type=rtype, name=urn.split("::")[-1], inputs=inputs))
    return resources, config, stack
