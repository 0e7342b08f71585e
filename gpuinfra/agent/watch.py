"""The node agent's job watch: fatal Xids in the kernel log and hung jobs.

Standard library only, shipped in the node bundle (:data:`gpuinfra.plan.node_bundle.NODE_MODULES`)
rather than in the user data (EC2's 16 KB): both matter once a job can run, and a job runs only
once the bundle is in. The agent (:mod:`gpuinfra.agent.node`) imports it lazily and calls
:meth:`Watch.xid` and :meth:`Watch.hang` every poll.

* **Fatal Xids.** The NVIDIA driver logs ``NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the
  bus.`` to the kernel log. The codes in :data:`FATAL_XIDS` are those whose "Resolution Bucket
  (Immediate Action)" in NVIDIA's Xid catalog
  (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) is ``RESET_GPU``,
  ``RESTART_VM`` or ``RESTART_BM``: the GPU is unusable until a reset or a reboot, which on a cloud
  node means ending it (transcribed from the catalog's columns as NVIDIA/NVSentinel's
  ``xiderrorsmapping.csv`` carries them). The log is read from ``/dev/kmsg``
  (https://www.kernel.org/doc/Documentation/ABI/testing/dev-kmsg): the first read returns every
  record since boot, later reads only new ones.
* **Hangs.** An NCCL collective that waits forever keeps the GPUs at 100% utilization while they
  draw little power: "the GPU util is 100% but the power consumption is pretty low (~70W)"
  (https://github.com/NVIDIA/nccl/issues/968), about 10% of an H100 SXM's 700 W limit and what an
  idle H100 draws (69-71 W of 700 W in the ``nvidia-smi`` of
  https://github.com/NVIDIA/nccl/issues/1967). Measured on an H100 80GB HBM3 (driver 580.159.04,
  2026-11-26, ``benchmarks/results/hang-power-h100-2026-11-26/``): kernels that only wait, at
  100% utilization, drew 18.0-19.9% of the 700 W limit; bf16 matrix products 99.7%. A job is hung
  when every GPU is busy (at or over the idle threshold) under ``GPUINFRA_HANG_POWER_PERCENT`` of
  its enforced power limit (profile ``hang.power_percent``; empty or 0: no power sign), or when the progress file the job
  touches (``GPUINFRA_PROGRESS_FILE``, given to the job by ``gpuinfra-run``) is older than
  ``GPUINFRA_HANG_MINUTES``, for ``GPUINFRA_HANG_MINUTES``. Action ``alert``: one log line starting
  with :data:`HANG_MARKER` and ``<state-dir>/hang`` (removed once the job moves again); ``end``:
  the agent syncs the checkpoints and ends the node; ``restart``: the alert, plus
  ``<state-dir>/job-restart`` once per hang, on which the job unit (:mod:`gpuinfra.agent.job`)
  stops the job and starts it again (it resumes from its newest checkpoint) while restarts are
  left.
* **The job is over.** The job unit writes ``<state-dir>/job-done``; :meth:`Watch.job_done`
  makes the agent sync the checkpoints (bounded) and end the node.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from gpuinfra.agent.job import JOB_DONE_MARK, JOB_RESTART_MARK

#: NVRM Xid codes that need a GPU reset or a reboot (module docstring): 46 GPU timeout, 62 PMU
#: halt, 64 DRAM retirement failure, 79 fallen off the bus, 95 uncontained error, 109 context
#: switch timeout, 110 security fault, 119/120 GSP RPC timeout / error, 136 link training,
#: 140 ECC escape, 143 GPU init, 151 key rotation, 155 NVLink software error, 156 resource
#: retirement, 158 fatal timeout, 160 channel retirement.
FATAL_XIDS = frozenset((46, 62, 64, 79, 95, 109, 110, 119, 120, 136, 140, 143, 151, 155, 156, 158, 160))
KMSG_PATH = "/dev/kmsg"
#: Start of the agent's log line when a job looks hung (``hang.action: alert``).
HANG_MARKER = "GPUINFRA-ALERT job hang:"
HANG_MARK = "hang"
_XID = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+),")


def _watts(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # [N/A], [Not Supported]
        return None


def gpu_power() -> list[tuple[float | None, float | None]]:
    """Per GPU (power draw W, enforced power limit W; None where not reported), from
    ``nvidia-smi --query-gpu=power.draw,enforced.power.limit`` (``nvidia-smi --help-query-gpu``:
    the enforced limit is "the power management algorithm's power ceiling").

    Raises:
        OSError, subprocess.SubprocessError: nvidia-smi failed.
    """
    text = subprocess.run(
        ["nvidia-smi", "--query-gpu=power.draw,enforced.power.limit", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    rows = [line.split(",") for line in text.splitlines()]
    return [(_watts(r[0]), _watts(r[1])) for r in rows if len(r) == 2]


class KernelLog:
    """The kernel log since boot, then only what is new (``/dev/kmsg`` keeps each reader's
    position; in the box tier a regular file stands in for it)."""

    def __init__(self, path: str = KMSG_PATH) -> None:
        self.path, self.fd = path, -1

    def __call__(self) -> str:
        """Records not read yet (the first call: every record since boot).

        Raises:
            OSError: the log cannot be opened.
        """
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        chunks = []
        while True:
            try:
                data = os.read(self.fd, 8192)
            except BlockingIOError:  # no new record
                break
            except BrokenPipeError:  # EPIPE: records overwritten before they were read
                continue
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks).decode(errors="replace")


def fatal_xid(text: str) -> str | None:
    """The first ``NVRM: Xid (PCI:...): N, ...`` line of ``text`` whose N is in :data:`FATAL_XIDS`."""
    for line in text.splitlines():
        found = _XID.search(line)
        if found and int(found.group(2)) in FATAL_XIDS:
            return line[found.start() :].strip()
    return None


class Watch:
    """The checks for one agent (``agent``: :class:`gpuinfra.agent.node.Agent`), its settings
    from node.env (``agent.config.env``).

    Args:
        agent: the agent whose clocks, state folder, log and end this uses.
        kernel_log: returns new kernel log text (default :class:`KernelLog`).
        power: returns (draw W, limit W) per GPU (default :func:`gpu_power`).

    Raises:
        ValueError: a hang setting in node.env does not parse.
    """

    def __init__(self, agent, kernel_log=None, power=gpu_power) -> None:
        env = agent.config.env
        self.agent, self.power = agent, power
        self.kernel_log = kernel_log or KernelLog()
        self.action = env.get("GPUINFRA_HANG_ACTION") or "off"
        self.hang_seconds = float(env.get("GPUINFRA_HANG_MINUTES") or 30) * 60
        self.power_percent = float(env.get("GPUINFRA_HANG_POWER_PERCENT") or 0)  # 0: no power sign
        progress = env.get("GPUINFRA_PROGRESS_FILE")
        self.progress = Path(progress) if progress else None
        self.low_power_since: float | None = None
        self.hung = False
        self.log_failed = False

    def xid(self) -> str:
        """The fatal Xid line new in the kernel log, or "" (an unreadable log is logged once)."""
        try:
            return fatal_xid(self.kernel_log()) or ""
        except OSError as exc:
            if not self.log_failed:
                self.log_failed = True
                self.agent._log(f"cannot read the kernel log: {exc}")
            return ""

    def job_done(self) -> str:
        """The job unit's done mark's text (why the node ends now), or ""."""
        if self.agent.state_dir is None:
            return ""
        try:
            return "job over: " + (Path(self.agent.state_dir) / JOB_DONE_MARK).read_text().strip()
        except OSError:
            return ""

    def why_hung(self, utilization: list[int]) -> str:
        """Why the job looks hung now, or "" (power is read only while every GPU is busy; a
        failed power read is no sign)."""
        a = self.agent
        low = False
        if self.power_percent > 0 and all(u >= a.config.idle_utilization_percent for u in utilization):
            try:
                power = self.power()
            except (OSError, subprocess.SubprocessError):
                power = []
            low = len(power) == len(utilization) and all(
                p is not None and limit and p < limit * self.power_percent / 100 for p, limit in power
            )
        if not low:
            self.low_power_since = None
        elif self.low_power_since is None:
            self.low_power_since = a.clock()
        if self.low_power_since is not None and a.clock() - self.low_power_since >= self.hang_seconds:
            return f"every GPU busy under {self.power_percent:g}% of its power limit for {self.hang_seconds / 60:g} min"
        try:
            stale = a.now().timestamp() - self.progress.stat().st_mtime if self.progress else 0.0
        except OSError:  # the job does not report progress
            stale = 0.0
        return f"{self.progress} not touched for {stale / 60:.0f} min" if stale >= self.hang_seconds else ""

    def hang(self, utilization: list[int]) -> str:
        """``running``, or for a hung job (:meth:`why_hung`) ``hung`` (action ``alert``: one
        :data:`HANG_MARKER` line and ``<state-dir>/hang``) or the agent's end (action ``end``)."""
        a = self.agent
        why = self.why_hung(utilization) if self.action in ("alert", "end", "restart") else ""
        mark = None if a.state_dir is None else Path(a.state_dir) / HANG_MARK
        if not why:
            if self.hung and mark is not None:
                mark.unlink(missing_ok=True)
            self.hung = False
            return "running"
        if self.action == "end":
            return a._finish("hang", f"job hang: {why}")
        if not self.hung:
            self.hung = True
            a._log(f"{HANG_MARKER} {why}")
            if mark is not None:
                mark.write_text(why + "\n")
                if self.action == "restart":
                    (mark.parent / JOB_RESTART_MARK).write_text(why + "\n")
        return "hung"
