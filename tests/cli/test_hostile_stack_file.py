"""A hand-edited stack file whose node-bound values break their grammar: ``preview`` refuses it
with one line naming the field and the allowed form (exit 2), and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuinfra.errors import ExitCode


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile")


def _stack(run_cli, project: Path, cloud: str) -> Path:
    path = project / "stacks" / f"Pulumi.h-{cloud}.yaml"
    if not path.exists():
        args = ["new", "--gpus", "8xH100", "--cloud", cloud, "--name", f"h-{cloud}", "--project-dir", str(project)]
        result = run_cli(*args)
        assert result.exit_code == 0, result.stderr
    return path


HOSTILE = [
    ("aws", ("profile", "container_image"), "nvcr.io/nvidia/pytorch:25.01-py3 && touch /tmp/PWNED", "OCI image"),
    ("gcp", ("profile", "container_image"), "nvcr.io/nvidia/pytorch:25.01-py3\nbootcmd: [x]", "OCI image"),
    ("aws", ("stack",), "h-aws;id", "stack-name"),
    ("aws", ("region",), "us-east-1 $(id)", "region name"),
    ("gcp", ("zone",), "europe-west1-b;id", "zone"),
    ("aws", ("instance_type",), "p5.48xlarge`id`", "instance type"),
    ("gcp", ("profile", "name"), "llm-pretrain'x", "profile.name"),
]


@pytest.mark.parametrize(("cloud", "path", "value", "named"), HOSTILE, ids=[repr(h[2]) for h in HOSTILE])
def test_preview_refuses_a_hostile_value(run_cli, project, cloud, path, value, named):
    stack_file = _stack(run_cli, project, cloud)
    original = stack_file.read_text()
    doc = yaml.safe_load(original)
    target = doc["config"]["gpuinfra:cluster"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    if path == ("instance_type",):
        doc["config"]["gpuinfra:cluster"]["facts"]["instance_type"] = value
    stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        before = {p: p.stat().st_mtime_ns for p in project.rglob("*")}
        result = run_cli("preview", f"h-{cloud}", "--project-dir", str(project))
        assert result.exit_code == ExitCode.BAD_INPUT, result.stderr
        assert result.stderr.startswith("error: gpuinfra:cluster") and result.stderr.count("\n") == 1, result.stderr
        assert named in result.stderr and "Traceback" not in result.stderr
        assert {p: p.stat().st_mtime_ns for p in project.rglob("*")} == before
    finally:
        stack_file.write_text(original)
