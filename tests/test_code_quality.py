"""The tree passes its own lint, format and type checks (``[tool.ruff]`` and ``[tool.mypy]`` in
pyproject.toml), run with the tools of the test environment.

mypy's first run in a fresh checkout takes minutes (it reads pulumi_aws and pulumi_gcp); later runs
reuse ``.mypy_cache`` and take seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What ruff checks: every folder with Python in it.
LINTED = ("gpuinfra", "blueprints", "tests", "policy", "benchmarks", "scripts")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=1500)


def _report(result: subprocess.CompletedProcess[str], count: str) -> str:
    output = (result.stdout + result.stderr).strip()
    found = re.search(count, output)
    return f"{found.group(0) if found else 'exit ' + str(result.returncode)}:\n{output[-6000:]}"


def test_ruff_check_finds_nothing():
    result = _run("ruff", "check", "--output-format", "concise", *LINTED)
    assert result.returncode == 0, _report(result, r"Found \d+ errors?")


def test_ruff_format_would_change_nothing():
    result = _run("ruff", "format", "--check", *LINTED)
    assert result.returncode == 0, _report(result, r"\d+ files? would be reformatted")


def test_mypy_finds_nothing():
    result = _run("mypy")  # packages and options from [tool.mypy]
    assert result.returncode == 0, _report(result, r"Found \d+ errors? in \d+ files?")
