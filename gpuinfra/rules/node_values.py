"""Rule ``node-values-grammar``: the values a stack's nodes boot with are data, never code.

The stack file and the profiles are edited by hand; every value of them that reaches a node's
boot text has a grammar (``gpuinfra/spec.py``, ``gpuinfra/profiles``, ``gpuinfra/oci.py``) and
is quoted by the writers. This rule checks the *result*, on the resources a preview registered,
so ``gpuinfra preview`` and the CrossGuard policy (``pulumi preview --policy-pack policy``) refuse
a stack whose boot text carries a value outside its grammar, however it got there:

* AWS launch template ``userData`` (gzip + base64 cloud-config): exactly the top-level keys
  gpuinfra writes (``write_files``, ``runcmd``; cloudinit.readthedocs.io/en/latest/reference/
  modules.html), each file only ``path`` / ``permissions`` / ``content``;
* GCP instance template ``metadata.startup-script``: the files its ``gpuinfra_file`` here-documents
  write (gpuinfra/plan/boot_gcp.py);
* in both, ``/etc/gpuinfra/node.env`` holds one plain word a key (no space, quote, ``$``, ``;``,
  backtick: :data:`gpuinfra.templating.PLAIN_WORD_RE`), its stack and profile names match their
  grammars, and every ``docker pull`` of a unit names an OCI image reference;
* the ``gpuinfra:stack`` / ``gpuinfra:profile`` tags (``gpuinfra-stack`` / ``gpuinfra-profile``
  labels) match the stack- and profile-name grammars.

A value Pulumi does not know yet (:data:`gpuinfra.rules.model.UNKNOWN`: user data built from a
bucket name still to be created) is skipped: the check runs once it is known.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import re
import shlex
from typing import Any

import yaml

from gpuinfra.errors import SpecError
from gpuinfra.health.node import NODE_ENV_PATH
from gpuinfra.oci import check_image_reference
from gpuinfra.profiles import PROFILE_NAME_RE
from gpuinfra.rules.model import UNKNOWN, Facts, Resource, ResourceGraph, Violation
from gpuinfra.rules.spec_rules import violation
from gpuinfra.spec import STACK_NAME_RE
from gpuinfra.templating import PLAIN_WORD_RE

RULE = "node-values-grammar"
_LT = "aws:ec2/launchTemplate:LaunchTemplate"
_GCP_TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
#: The top-level keys gpuinfra's cloud-config has (gpuinfra/plan/boot_aws.py ``cloud_config``).
CLOUD_CONFIG_KEYS = frozenset({"write_files", "runcmd"})
_FILE_KEYS = frozenset({"path", "permissions", "content"})
#: One ``gpuinfra_file PATH MODE <<'TAG'`` here-document of the GCP startup script.
_GCP_FILE_RE = re.compile(r"^gpuinfra_file (\S+) (0[0-7]{3}) <<'(\w+)'\n(.*?)^\3\n", re.MULTILINE | re.DOTALL)
_DOCKER_PULL_RE = re.compile(r"^Exec\w*=-?/usr/bin/docker pull (.*)$", re.MULTILINE)
#: Tag / label keys that carry the stack's and the profile's names (gpuinfra/plan/tags.py).
_NAME_TAGS = {
    "gpuinfra:stack": ("stack name", STACK_NAME_RE),
    "gpuinfra-stack": ("stack name", re.compile(r"[a-z0-9_-]{1,63}")),
    "gpuinfra:profile": ("profile name", PROFILE_NAME_RE),
    "gpuinfra-profile": ("profile name", re.compile(r"[a-z0-9_-]{1,63}")),
}


def aws_user_data_files(user_data: str) -> tuple[dict[str, str], list[str]]:
    """The files an AWS user data writes (path -> content) and what is wrong with its shape.

    Args:
        user_data: the launch template's ``userData`` (base64 of gzip, or of the plain text).

    Returns:
        ``(files, problems)``; ``problems`` lists one line per key or entry gpuinfra never
        writes, or why the text could not be read.
    """
    try:
        raw = base64.b64decode(user_data, validate=True)
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
        document = yaml.safe_load(text)
    except (binascii.Error, OSError, EOFError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return {}, [f"user data is not a gzip/base64 cloud-config ({type(exc).__name__})"]
    if not isinstance(document, dict):
        return {}, ["user data is not a cloud-config mapping"]
    problems = [
        f"cloud-config key {key!r} is not one gpuinfra writes" for key in document if key not in CLOUD_CONFIG_KEYS
    ]
    files: dict[str, str] = {}
    for entry in document.get("write_files") or []:
        if not isinstance(entry, dict) or set(entry) - _FILE_KEYS or not isinstance(entry.get("content"), str):
            problems.append(f"write_files entry {str(entry)[:80]!r} has keys gpuinfra never writes")
            continue
        files[str(entry.get("path"))] = entry["content"]
    for step in document.get("runcmd") or []:
        if not (isinstance(step, list) and all(isinstance(w, str) for w in step)):
            problems.append(f"runcmd entry {str(step)[:80]!r} is not an argument list")
    return files, problems


def gcp_startup_files(script: str) -> dict[str, str]:
    """The files a GCP startup script writes with ``gpuinfra_file`` (path -> content)."""
    files = {}
    for match in _GCP_FILE_RE.finditer(script):
        words = shlex.split(match.group(1))
        files[words[0] if words else match.group(1)] = match.group(4)
    return files


def file_problems(files: dict[str, str]) -> list[str]:
    """What is wrong with the values in a node's files: node.env values that are not one plain
    word, stack / profile names outside their grammars, ``docker pull`` of a non-reference."""
    problems = []
    env = files.get(str(NODE_ENV_PATH))
    for line in (env or "").splitlines():
        key, _, value = line.partition("=")
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            problems.append(f"{NODE_ENV_PATH}: line {line[:80]!r} is not KEY=value")
        elif value and not PLAIN_WORD_RE.fullmatch(value):
            problems.append(f"{NODE_ENV_PATH}: {key} {value[:80]!r} is not one plain word")
        elif key == "GPUINFRA_STACK" and not STACK_NAME_RE.fullmatch(value):
            problems.append(f"{NODE_ENV_PATH}: GPUINFRA_STACK {value!r} is not a stack name")
        elif key == "GPUINFRA_PROFILE" and not PROFILE_NAME_RE.fullmatch(value):
            problems.append(f"{NODE_ENV_PATH}: GPUINFRA_PROFILE {value!r} is not a profile name")
    for path, content in files.items():
        for match in _DOCKER_PULL_RE.finditer(content):
            words = match.group(1).split(" ")
            try:
                if len(words) != 1:
                    raise SpecError(f"{words!r} is more than one word")
                check_image_reference(words[0].replace("$$", "$").replace("%%", "%"), "")
            except SpecError as exc:
                problems.append(f"{path}: docker pull {str(exc)[:160]}")
    return problems


def _tag_problems(resource: Resource) -> list[str]:
    problems = []
    for bag_key in ("tags", "labels"):
        bag = resource.inputs.get(bag_key)
        if not isinstance(bag, dict):
            continue
        for key, (what, grammar) in _NAME_TAGS.items():
            value = bag.get(key)
            if isinstance(value, str) and value != UNKNOWN and not grammar.fullmatch(value):
                problems.append(f"{bag_key[:-1]} {key} {value[:80]!r} is not a {what}")
    return problems


def check_node_values(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``node-values-grammar`` over ``graph`` (module docstring); ``facts`` is not used (the
    signature of every check in :func:`gpuinfra.rules.check_graph`)."""
    found = []
    for resource in graph:
        problems = _tag_problems(resource)
        if resource.type == _LT:
            user_data = resource.inputs.get("userData")
            if isinstance(user_data, str) and user_data != UNKNOWN:
                files, shape = aws_user_data_files(user_data)
                problems += shape + file_problems(files)
        elif resource.type == _GCP_TEMPLATE:
            script = resource.get("metadata.startup-script")
            if isinstance(script, str) and script != UNKNOWN:
                problems += file_problems(gcp_startup_files(script))
        found += [violation(RULE, resource.name, problem) for problem in problems]
    return found


def resource_problems(resource: Any) -> list[str]:
    """The problems :func:`check_node_values` finds on one resource (tests, debugging)."""
    return [v.message for v in check_node_values(ResourceGraph([resource]), {})]
