"""Every value a bake writes into a shell script stays one word: hostile values (quotes, ``$()``,
backticks, ``;``, ``&&``, line breaks) rendered into the bake's scripts parse (``bash -n``) and
reach the commands they feed as exactly one argument (stand-in ``docker`` / ``gcloud`` /
``modinfo`` record their arguments); the bake spec refuses such values before anything renders."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from gpuinfra.bake.model import BakeSpec
from gpuinfra.errors import SpecError
from gpuinfra.templating import render

HOSTILE = [
    "nvcr.io/nvidia/pytorch:25.01-py3 && touch /tmp/PWNED",
    "x'; touch /tmp/PWNED; echo '",
    'x"$(touch /tmp/PWNED)"',
    "x`touch /tmp/PWNED`",
    "x\ntouch /tmp/PWNED",
    "x;y|z>w",
    "--- \n...\n$HOME ${HOME} *",
]
STUB = """#!/bin/bash
{ printf '%s\\0' "$(basename "$0")" "$@"; printf '\\n'; } >> "$CALLS"
[ "$(basename "$0")" = modinfo ] && echo 580.1
exit 0
"""


def _run(script: str, tmp_path) -> None:
    """``bash -n`` then run ``script`` with stand-in programs recording each call's argv in
    ``tmp_path/calls``; nothing the hostile values name may run."""
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name in ("docker", "gcloud", "modinfo"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_bytes(b"")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "CALLS": str(calls)}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "PWNED").exists() and not os.path.exists("/tmp/PWNED")


def _calls(text: str) -> list[list[str]]:
    return [c.split("\0") for c in text.split("\0\n") if c]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_pull_container_passes_each_image_as_one_argument(hostile, tmp_path):
    script = render(
        "bake/gcp-pull-container.sh.j2",
        bake="b",
        container_image=shlex.quote(hostile),
        container_base=shlex.quote(hostile + "-base"),
        registry_host=shlex.quote(hostile + "-host"),
    )
    _run(script, tmp_path)
    calls = _calls((tmp_path / "calls").read_text())
    assert calls == [
        ["gcloud", "auth", "configure-docker", hostile + "-host", "--quiet"],
        ["docker", "pull", hostile],
        ["docker", "pull", hostile + "-base"],
    ]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_check_scripts_pass_each_value_as_one_argument(hostile, tmp_path):
    host = render(
        "bake/check-host.sh.j2",
        bake="b",
        driver_branch=shlex.quote("580"),
        efa=False,
        container_image=shlex.quote(hostile),
    )
    _run(host, tmp_path)
    assert _calls((tmp_path / "calls").read_text())[-1] == ["docker", "image", "inspect", hostile]
    inside = render(
        "bake/aws-check-container.sh.j2", bake="b", container_image=shlex.quote(hostile), check=shlex.quote(hostile)
    )
    _run(inside, tmp_path)
    assert _calls((tmp_path / "calls").read_text()) == [
        ["docker", "run", "--rm", "--entrypoint", "/bin/bash", hostile, "-c", hostile]
    ]


def _bake_config(spec: BakeSpec) -> dict:
    return json.loads(json.dumps(spec.to_config()))


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ((), "stack"),
        ((), "region"),
        ((), "zone"),
        ((), "gcp_project"),
        ((), "build_instance_type"),
        (("manifest",), "bake"),
        (("manifest",), "container_base"),
        (("manifest",), "base_image"),
        (("manifest",), "family"),
        (("manifest",), "gpuinfra_version"),
    ],
)
@pytest.mark.parametrize("hostile", HOSTILE[:5])
def test_bake_spec_refuses_hostile_values(a3mega_bake, path, field, hostile):
    config = _bake_config(a3mega_bake)
    target = config
    for key in path:
        target = target[key]
    target[field] = hostile
    with pytest.raises(SpecError):
        BakeSpec.from_config(config)


def test_the_fixture_bakes_parse(a3mega_bake, p5_bake):
    for spec in (a3mega_bake, p5_bake):
        assert BakeSpec.from_config(_bake_config(spec)) == spec
