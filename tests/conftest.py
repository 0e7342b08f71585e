"""Shared fixtures: isolate every test from the user's catalog, profiles and credentials."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# hypothesis is imported here, at collection, not lazily by its plugin at the terminal summary:
# that late import runs pytest's assertion rewriter (ast.parse) after the Pulumi previews, where
# CPython 3.11.7 raised "SystemError: AST constructor recursion depth mismatch" and the run
# ended with a traceback after every test had passed.
import hypothesis  # noqa: F401
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT_DIR = REPO_ROOT / "data" / "snapshot"


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    for var in (
        "GPUINFRA_CATALOG_DIR",
        "GPUINFRA_PROFILES_DIR",
        "GPUINFRA_DEBUG",
        "GOOGLE_CLOUD_PROJECT",
        "AWS_PROFILE",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    from gpuinfra import preflight

    # the quota preflight of `new` / `up` never reaches a cloud unless a test puts its checks back
    monkeypatch.setattr(preflight, "CHECKS", {"aws": lambda spec, catalog: [], "gcp": lambda spec, catalog: []})
    from gpuinfra.catalog import store

    store._load.cache_clear()
    yield
    store._load.cache_clear()


def without_aws_credentials(monkeypatch, folder: Path) -> None:
    """No AWS credentials anywhere botocore looks: the environment, the shared credentials and
    config files (pointed at missing files under ``folder``) and instance metadata. Call it in
    the test body, after fixtures that set test credentials."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(folder / "no-aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(folder / "no-aws-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="session")
def moto_url():
    """A moto server on 127.0.0.1 (random port) for the whole test session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


class CliResult:
    """Outcome of one in-process CLI run."""

    def __init__(self, exit_code: int, stdout: str, stderr: str):
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


@pytest.fixture
def run_cli(capsys):
    """Run ``gpuinfra <args>`` in-process through the real entry point (error handling included)."""
    from gpuinfra.cli import main

    def _run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return _run


def gpuinfra_exe() -> list[str]:
    """Command line that runs the installed console script as a whole process."""
    exe = Path(sys.executable).with_name("gpuinfra")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from gpuinfra.cli import main; main()"]


os.environ.setdefault("PULUMI_CONFIG_PASSPHRASE", "")


#: Lines tests want shown after the run even without ``-s`` (e.g. the conformance matrix counts).
SUMMARY_LINES: list[str] = []


def pytest_terminal_summary(terminalreporter):
    """Print :data:`SUMMARY_LINES` in pytest's closing summary."""
    for line in SUMMARY_LINES:
        terminalreporter.write_line(line)
