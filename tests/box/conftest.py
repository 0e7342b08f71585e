"""The box tier's fixtures: the cached rootfs (built once per session) and a box per test.

The tier needs root, ``systemd-nspawn`` (Debian: systemd-container), ``debootstrap``, ``ip``
(iproute2), ``nsenter`` and overlayfs. Without them the tests skip with the reason; with
``CI=true`` (the CI runner sets it for .ci/run, which runs as root and installs the tools) a
missing prerequisite fails them instead.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import SUMMARY_LINES

TOOLS = ("systemd-nspawn", "debootstrap", "ip", "nsenter", "mount")


def missing_prerequisite() -> str | None:
    """Why the box cannot run here, or None."""
    if os.geteuid() != 0:
        return "the box tier needs root (network namespaces, overlay mounts, systemd-nspawn)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"the box tier needs {', '.join(missing)} (apt-get install systemd-container debootstrap iproute2)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the box tier needs overlayfs"
    return None


@pytest.fixture(scope="session")
def box_rootfs() -> Path:
    """The cached rootfs (:func:`tests.box.rootfs.ensure_rootfs`); its build time goes to the summary."""
    reason = missing_prerequisite()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    from tests.box.rootfs import ensure_rootfs

    path, seconds = ensure_rootfs()
    SUMMARY_LINES.append(
        f"box: rootfs {path} " + (f"built in {seconds:.0f} s" if seconds is not None else "from cache")
    )
    return path


@pytest.fixture
def box_timer(request):
    """Adds ``box: <test> <wall seconds>`` to the summary when the test ends."""
    started = time.monotonic()
    yield
    SUMMARY_LINES.append(f"box: {request.node.name} {time.monotonic() - started:.0f} s")


#: Rows of the fault table: (test, fault, outcome, seconds until the node ended or the data was
#: saved), printed as one table at the end of the run (:func:`pytest_terminal_summary`).
FAULT_ROWS: list[tuple[str, str, str, float]] = []


@pytest.fixture
def fault_row(request):
    """``fault_row(fault, outcome, seconds)``: add one row to the box fault table."""

    def add(fault: str, outcome: str, seconds: float) -> None:
        FAULT_ROWS.append((request.node.name, fault, outcome, seconds))

    return add


def fault_table(rows: list[tuple[str, str, str, float]]) -> list[str]:
    """The fault table's lines (no lines when no row was added)."""
    if not rows:
        return []
    cells = [("test", "fault", "outcome", "seconds")] + [(t, f, o, f"{s:.0f}") for t, f, o, s in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(4)]
    return ["box fault table:"] + [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    ]


def pytest_terminal_summary(terminalreporter):
    """Print the fault table after the run."""
    for line in fault_table(FAULT_ROWS):
        terminalreporter.write_line(line)
