"""Build specs for blueprint tests through the real planner, and run the offline preview."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import UTC, datetime

import pytest
import yaml

from gpuinfra.catalog.store import load_catalog
from gpuinfra.planner import PlanRequest, plan_cluster
from gpuinfra.preview import run_preview
from gpuinfra.profiles import get_profile
from gpuinfra.stackfile import provider_config

NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
#: The name suffix `gpuinfra new` draws at random, fixed here so previews are repeatable.
NAME_SUFFIX = "t3st0a"


def make_spec(instance_type: str, nodes: int = 1, profile: str = "llm-finetune", cloud: str = "aws", **overrides):
    """The spec `gpuinfra new --instance-type T --nodes N --profile P` would write."""
    flex_start = overrides.pop("flex_start", False)
    spot = overrides.pop("spot", None if flex_start else False)
    gpus = overrides.pop("gpus", None)
    resolved = get_profile(profile)
    profile_updates = overrides.pop("profile_updates", None)
    if profile_updates:
        resolved = type(resolved).model_validate({**resolved.model_dump(), **profile_updates})
    plan = plan_cluster(
        load_catalog(),
        PlanRequest(
            gpus=gpus,
            instance_type=instance_type,
            nodes=nodes,
            cloud=cloud,
            spot=spot,
            name=f"t-{nodes}",
            flex_start=flex_start,
        ),
        resolved,
        NOW,
    )
    spec = plan.spec.model_copy(update={"name_suffix": NAME_SUFFIX})
    if overrides:
        spec = type(spec).model_validate({**spec.model_dump(), **overrides})
    return spec


def preview(spec, mocks=None):
    return run_preview(spec, provider_config(spec), mocks)


def need_tool(name: str) -> str:
    """Path of a Debian tool; in CI (CI=true) a missing tool fails the test, locally it skips."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed (.ci/run installs it)")
        pytest.skip(f"{name} not installed")
    return path


def shellcheck_cloud_config(text: str, tmp_path) -> None:
    """Validate a cloud-config with `cloud-init schema` and every script in it with shellcheck."""
    config = tmp_path / "user-data.yaml"
    config.write_text(text)
    result = subprocess.run(
        [need_tool("cloud-init"), "schema", "--config-file", str(config)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    scripts = [f for f in yaml.safe_load(text)["write_files"] if f["content"].startswith("#!")]
    assert scripts, "no shell scripts found in the cloud-config"
    for index, script in enumerate(scripts):
        path = tmp_path / f"script{index}.sh"
        path.write_text(script["content"])
        result = subprocess.run(
            [need_tool("shellcheck"), "--severity=style", str(path)], capture_output=True, text=True
        )
        assert result.returncode == 0, f"{script['path']}:\n{result.stdout}"


def gcp_script_files(script: str) -> dict[str, tuple[str, str]]:
    """The files a GCP startup script writes: path -> (mode, content), read from its
    ``gpuinfra_file PATH MODE <<'TAG'`` heredocs (a path written twice fails the test)."""
    import re
    import shlex

    files: dict[str, tuple[str, str]] = {}
    for match in re.finditer(r"^gpuinfra_file (\S+) (0[0-7]{3}) <<'([A-Z0-9_]+)'\n(.*?)^\3\n", script, re.M | re.S):
        path = shlex.split(match.group(1))[0]
        assert path not in files, f"{path} is written twice"
        files[path] = (match.group(2), match.group(4))
    return files
