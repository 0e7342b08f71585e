"""Golden copies of the three example stacks' offline previews: every resource, its type, name,
parent and inputs, compared with ``tests/golden/``. A refactor must leave them as they are.

The boot text (AWS launch-template user data, decoded; GCP ``startup-script``) is kept as its own
text file and the node bundle as its file list with each file's sha256, so a change to what the
nodes run shows as a readable diff. After an intended change, regenerate with
``GPUINFRA_UPDATE_GOLDEN=1 scripts/uv run --extra test pytest tests/test_golden_stacks.py`` and
review the diff like code.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest

from gpuinfra.preview import run_preview
from gpuinfra.stackfile import provider_config, read_stack_spec

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
STACKS = ("example-p5-2nodes", "example-a3mega-2nodes", "example-4xa100")
UPDATE = os.environ.get("GPUINFRA_UPDATE_GOLDEN") == "1"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _bundle_listing(document: str) -> dict:
    bundle = json.loads(document)
    files = [{"path": f["path"], "mode": f["mode"], "sha256": _sha256(f["content"])} for f in bundle["files"]]
    return {**{k: v for k, v in bundle.items() if k != "files"}, "files": files}


def _split(preview: dict) -> tuple[dict, dict[str, str]]:
    """The preview with boot text and bundle content replaced by a pointer; the texts apart."""
    texts: dict[str, str] = {}
    for resource in preview["resources"]:
        inputs = resource.get("inputs") or {}
        if resource["type"] == "aws:ec2/launchTemplate:LaunchTemplate" and "userData" in inputs:
            texts["boot.txt"] = gzip.decompress(base64.b64decode(inputs["userData"])).decode()
            inputs["userData"] = "<gzip+base64 of boot.txt>"
        metadata = inputs.get("metadata")
        if resource["type"] == "gcp:compute/instanceTemplate:InstanceTemplate" and "startup-script" in metadata:
            texts["boot.txt"] = metadata["startup-script"]
            metadata["startup-script"] = "<boot.txt>"
        if resource["name"].endswith("-node-bundle"):
            key = "content" if isinstance(inputs.get("content"), str) else None
            document = inputs["content"] if key else inputs["content"]["value"]
            texts["bundle.json"] = json.dumps(_bundle_listing(document), indent=1, sort_keys=True) + "\n"
            if key:
                inputs["content"] = "<node bundle: bundle.json>"
            else:
                inputs["content"]["value"] = "<node bundle: bundle.json>"
    # Pulumi registers children concurrently: the order of registration is not part of the contract
    preview["resources"].sort(key=lambda r: (r["type"], r["name"]))
    preview["notes"].sort()
    texts["preview.json"] = json.dumps(preview, indent=1, sort_keys=True) + "\n"
    return preview, texts


@pytest.mark.parametrize("stack", STACKS)
def test_example_stack_preview_matches_its_golden_copy(stack):
    spec = read_stack_spec(ROOT, stack)
    _, texts = _split(run_preview(spec, provider_config(spec)).to_json())
    assert set(texts) == {"preview.json", "boot.txt", "bundle.json"}
    folder = GOLDEN / stack
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (folder / name).write_text(text)
    for name, text in texts.items():
        expected = (folder / name).read_text()
        assert text == expected, f"{stack}/{name} differs from tests/golden (GPUINFRA_UPDATE_GOLDEN=1 to accept)"
