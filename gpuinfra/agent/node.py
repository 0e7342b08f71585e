"""gpuinfra node agent: end idle or expired nodes, save checkpoints on spot interruption.

Runs under systemd on every node (unit ``gpuinfra-agent.service`` written by the user data).
Standalone on purpose: only the standard library, plus ``pynvml`` (nvidia-ml-py) and ``boto3``
when present, so the user data can ship this one file.

Every ``--poll-seconds`` it:

* reads GPU utilization through NVML (falls back to ``nvidia-smi``); the node is idle when every
  GPU stays under ``GPUINFRA_IDLE_GPU_UTILIZATION_PERCENT`` for ``GPUINFRA_IDLE_TIMEOUT_MINUTES``;
* checks the TTL: ``gpuinfra:expires-at`` from the instance tags in IMDS (AWS), else
  ``GPUINFRA_EXPIRES_AT`` from /etc/gpuinfra/node.env;
* checks for a spot interruption: AWS IMDSv2 ``/latest/meta-data/spot/instance-action``
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html, 2 min
  notice, "we recommend that you check for these warnings every 5 seconds"), GCP
  ``instance/preempted`` read with ``wait_for_change`` (a hanging GET that answers as soon as the
  value changes: cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange;
  cloud.google.com/compute/docs/instances/spot#detect-preemption, 30 s notice). A preempted GCP
  VM of the bulk insert asks the managed instance group for its replacement
  (:func:`gpuinfra.agent.replace.request_gcp_replacement`, in the node bundle); the group's
  repair recreates a member.

* checks the GPUs: a read that fails (NVML error, ``nvidia-smi`` exit status or timeout, "No
  devices were found") or shows fewer GPUs than ``GPUINFRA_GPU_COUNT`` for
  :data:`GPU_FAULT_SECONDS` is a GPU fault: the node ends. A GPU that cannot be read is never
  "busy";
* with ``health_gate: enforce``: idle time counts once the gate has a verdict; no verdict
  within ``GPUINFRA_HEALTH_WAIT_SECONDS`` of the agent's first start is a failed gate (the agent
  writes ``health-failed``, so ``gpuinfra-run`` refuses and the idle clock runs); a node the gate
  left out (``health-excluded``) ends once the ranks are decided;
* once the node bundle is in, runs the job watch (:mod:`gpuinfra.agent.watch`, not in the user
  data): a fatal Xid in the kernel log is a GPU fault; a hung job (busy GPUs at low power, or a
  stale progress file) triggers the profile's ``hang.action``; a job that is over (the job unit,
  :mod:`gpuinfra.agent.job`) ends the node.

Checkpoints (complete folders, newest first, one bucket part per node rank) are synced by
:mod:`gpuinfra.agent.checkpoints`, which the node bundle installs beside this file: in a
background thread (every ``GPUINFRA_CHECKPOINT_INTERVAL_MINUTES``, on completion, on the
operator's sync request and the AWS rebalance recommendation), within the window of a spot
notice, and for :data:`STOP_SYNC_SECONDS` on SIGTERM (systemd stop, power-off). Before any end
(idle, TTL, GPU fault, hang, gate) it syncs once for at most :data:`END_SYNC_BOUND_SECONDS`, then
ends the node whatever the sync did, and keeps trying until the node is gone
(:meth:`Agent.end_try`): the cloud's end call (AWS ``shutdown -h now``: the launch template's
instance-initiated shutdown behaviour is *terminate*; GCP deletes its own VM: a managed instance
group's member from the group, which shrinks, a VM of the stack's bulk insert itself), retried
:data:`END_RETRY_SECONDS` apart; after
:data:`END_API_TRIES` failed GCP calls ``shutdown -h now`` and the call take turns; the cloud's
backstop (AWS EventBridge Scheduler, GCP ``max_run_duration``) is the last resort. The agent
never exits while the node lives (its unit restarts it whatever its exit status).
``--dry-run`` logs instead of acting.

The keys of ``/etc/gpuinfra/node.env`` are defined once, in :data:`NODE_ENV_KEYS`; the boot
templates of both clouds write the file with :func:`format_node_env` and the agent reads it with
:func:`parse_node_env`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

LOG = logging.getLogger("gpuinfra-agent")
AWS_IMDS = "http://169.254.169.254"
GCP_METADATA = "http://metadata.google.internal/computeMetadata/v1"
NOTICE_SECONDS = {"aws": 120, "gcp": 30}
#: Seconds the checkpoint sync may take before an idle or expired node is ended anyway. The
#: cloud-side backstops (AWS EventBridge Scheduler, GCP ``max_run_duration``) fire after the TTL
#: plus this bound and a margin, so the agent ends the node first, with its checkpoints saved.
END_SYNC_BOUND_SECONDS = 300
#: Share of a spot notice spent syncing checkpoints (the rest is left for the upload to finish).
NOTICE_SYNC_SHARE = 0.75
#: Seconds the agent syncs after SIGTERM (systemd stop: the OS shuts down). GCP: the 30 s between
#: the ACPI soft-off and the hard off of a Spot VM (Compute API ``Scheduling.skipGuestOsShutdown``);
#: AWS: inside the 2-minute spot notice. ``TimeoutStopSec`` of the unit is above both.
STOP_SYNC_SECONDS = {"aws": 100, "gcp": 25}
#: Seconds between tries to end the node after a failed try (the last repeats): API errors
#: such as HTTP 429/503 clear within seconds to minutes.
END_RETRY_SECONDS = (5, 10, 20, 40, 80, 160, 300)
#: GCP end calls tried before ``shutdown -h now`` and the call take turns.
END_API_TRIES = 5
#: Seconds a node may take to go away after an end call or power-off succeeded before the next try.
END_GONE_SECONDS = 300
#: Seconds the GPUs may stay unreadable, or fewer than expected, before that is a GPU fault.
GPU_FAULT_SECONDS = 60

#: ``/etc/gpuinfra/node.env``: key -> (required, meaning). The one definition of the file's keys.
NODE_ENV_KEYS: dict[str, tuple[bool, str]] = {
    "GPUINFRA_CLOUD": (True, "aws | gcp"),
    "GPUINFRA_STACK": (True, "stack name"),
    "GPUINFRA_PROFILE": (True, "workload profile name"),
    "GPUINFRA_BUCKET": (True, "the stack's bucket (checkpoints are synced to it)"),
    "GPUINFRA_EXPIRES_AT": (False, "TTL end, ISO 8601 UTC; empty = no TTL"),
    "GPUINFRA_IDLE_TIMEOUT_MINUTES": (True, "minutes every GPU must stay under the threshold"),
    "GPUINFRA_IDLE_GPU_UTILIZATION_PERCENT": (True, "idle threshold, GPU utilization percent"),
    "GPUINFRA_SCRATCH": (True, "scratch mount point; checkpoints are read from <scratch>/checkpoints"),
    "GPUINFRA_CHECKPOINT_DIR": (False, "checkpoint folder to sync instead of <scratch>/checkpoints"),
    "GPUINFRA_CHECKPOINT_INTERVAL_MINUTES": (False, "minutes between checkpoint syncs (profile); 0/empty: none"),
    "GPUINFRA_AGENT_DRY_RUN": (False, "1: log instead of ending the node"),
    "GPUINFRA_HEALTH_GATE": (False, "enforce | report | off (profile health_gate); empty = off"),
    "GPUINFRA_HEALTH_WAIT_SECONDS": (False, "no verdict by then fails the gate"),
    "GPUINFRA_GPU_COUNT": (False, "GPUs per node"),
    "GPUINFRA_HANG_ACTION": (False, "alert | end | restart | off"),
    "GPUINFRA_HANG_MINUTES": (False, "hang duration"),
    "GPUINFRA_HANG_POWER_PERCENT": (False, "hang power threshold"),
    "GPUINFRA_PROGRESS_FILE": (False, "job progress file"),
    "GPUINFRA_DEPLOYMENT": (False, "deployment id (gpuinfra up)"),
    "GPUINFRA_STACK_ID": (False, "stack id <stack>-<suffix>: scopes the job's secrets"),
}


def format_node_env(values: Mapping[str, object]) -> str:
    """``KEY=VALUE`` lines of node.env, in :data:`NODE_ENV_KEYS` order (None -> empty value).

    Raises:
        ValueError: a key is unknown, a required key is missing, or a value holds a newline.
    """
    unknown = sorted(set(values) - set(NODE_ENV_KEYS))
    missing = [k for k, (required, _) in NODE_ENV_KEYS.items() if required and values.get(k) in (None, "")]
    if unknown or missing:
        raise ValueError(f"node.env: unknown keys {unknown}, missing keys {missing}")
    lines = []
    for key in NODE_ENV_KEYS:
        text = "" if values.get(key) is None else str(values[key])
        if any(not c.isprintable() for c in text):  # parse_node_env splits at every line break
            raise ValueError(f"node.env: {key} holds a line break or control character")
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


def parse_node_env(text: str) -> dict[str, str]:
    """The ``KEY=VALUE`` lines of node.env (comments and blank lines skipped)."""
    env = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip()
    return env


class GpuMonitor(Protocol):
    """Narrow interface to the GPUs (NVML on nodes, a fake in tests)."""

    def utilizations(self) -> list[int]:
        """Utilization percent of every visible GPU. Raises when the GPUs cannot be read."""


class NvmlGpus:
    """GPU utilization through NVML (nvidia-ml-py), or ``nvidia-smi`` when pynvml is missing.
    Errors propagate (NVML errors, ``nvidia-smi`` exit status or timeout): a GPU fault."""

    def __init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:  # no pynvml, or no driver: fall back to nvidia-smi
            self._nvml = None

    def utilizations(self) -> list[int]:
        if self._nvml is not None:
            n = self._nvml
            return [
                int(n.nvmlDeviceGetUtilizationRates(n.nvmlDeviceGetHandleByIndex(i)).gpu)
                for i in range(n.nvmlDeviceGetCount())
            ]
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return [int(line.strip()) for line in out.splitlines() if line.strip().isdigit()]


def _http(
    url: str,
    method: str = "GET",
    headers: dict | None = None,
    timeout: float = 2.0,
    response_headers: dict | None = None,
) -> tuple[int, str]:
    """(HTTP status, body); ``response_headers`` (when given) receives the response's headers."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if response_headers is not None:
                response_headers.update(response.headers.items())
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


class AwsMetadata:
    """IMDSv2: session token, spot instance-action, instance tags."""

    def __init__(self, base: str = AWS_IMDS) -> None:
        self.base = base.rstrip("/")

    def _get(self, path: str) -> tuple[int, str]:
        status, token = _http(f"{self.base}/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        if status != 200:
            raise OSError(f"IMDSv2 token request failed with HTTP {status}")
        return _http(f"{self.base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})

    def interruption(self) -> dict | None:
        """The spot instance-action notice (``{"action": "terminate", "time": ...}``) or None."""
        status, body = self._get("spot/instance-action")
        return json.loads(body) if status == 200 and body else None

    def expires_at(self) -> str | None:
        """The ``gpuinfra:expires-at`` tag (needs instance metadata tags enabled), or None."""
        status, body = self._get("tags/instance/gpuinfra:expires-at")
        return body.strip() if status == 200 and body.strip() else None

    def instance_id(self) -> str:
        """This instance's id."""
        return self._get("instance-id")[1]

    def node_name(self) -> str:
        """This instance's id (``i-...``)."""
        return self.instance_id().strip()

    def address(self) -> str:
        """This instance's primary private IPv4 address."""
        return self._get("local-ipv4")[1].strip()


class GcpMetadata:
    """GCE metadata server: preemption flag (read with ``wait_for_change``) and instance identity.

    Args:
        base: metadata server URL.
        wait_seconds: longest a preemption read hangs waiting for a change (the agent passes its
            poll period; the poll loop does not sleep on top of it), so a preemption is seen as
            soon as GCE flags it.
    """

    def __init__(self, base: str = GCP_METADATA, wait_seconds: float = 5.0) -> None:
        self.base = base.rstrip("/")
        self.wait_seconds = wait_seconds
        self._etag: str | None = None

    def _get(self, path: str, timeout: float = 2.0, headers: dict | None = None) -> tuple[int, str]:
        return _http(
            f"{self.base}/{path}", headers={"Metadata-Flavor": "Google"}, timeout=timeout, response_headers=headers
        )

    def interruption(self) -> dict | None:
        """``{"action": "preempted"}`` once GCE has preempted this spot VM, else None.

        The first read returns the value at once and keeps its ETag; later reads hang until the
        value differs from that ETag or ``wait_seconds`` pass (``timeout_sec``).
        """
        path = "instance/preempted"
        timeout = 2.0
        if self._etag is not None:
            query = {"wait_for_change": "true", "timeout_sec": max(1, int(self.wait_seconds)), "last_etag": self._etag}
            path += "?" + urllib.parse.urlencode(query)
            timeout += self.wait_seconds
        headers: dict = {}
        status, body = self._get(path, timeout, headers)
        etag = {k.lower(): v for k, v in headers.items()}.get("etag")
        self._etag = etag if status == 200 and etag else None
        return {"action": "preempted"} if status == 200 and body.strip().upper() == "TRUE" else None

    def expires_at(self) -> str | None:
        """GCP labels are not in the metadata server: the TTL comes from node.env."""
        return None

    def instance(self) -> tuple[str, str]:
        """(instance name, zone)."""
        name = self._get("instance/name")[1].strip()
        zone = self._get("instance/zone")[1].strip().rsplit("/", 1)[-1]
        return name, zone

    def node_name(self) -> str:
        """This VM's name."""
        return self.instance()[0]

    def mig_member(self) -> bool:
        """True when a managed instance group created this VM: only those carry the ``created-by``
        key, the group's URL (cloud.google.com/compute/docs/instance-groups/getting-info-about-migs;
        the VMs of a bulk insert have none, HTTP 404).

        Raises:
            OSError: the metadata server answered neither 200 nor 404, or not at all.
        """
        status = self._get("instance/attributes/created-by")[0]
        if status not in (200, 404):
            raise OSError(f"created-by: HTTP {status}")
        return status == 200

    def address(self) -> str:
        """The first NIC's internal IPv4 address."""
        return self._get("instance/network-interfaces/0/ip")[1].strip()


@dataclass
class AgentConfig:
    """Settings from /etc/gpuinfra/node.env (keys: :data:`NODE_ENV_KEYS`).

    ``verdict_wait_seconds``: seconds after the agent's first start with no health verdict
    that fail an ``enforce`` gate (0: no bound); ``gpu_count``: GPUs the node has (0: not
    checked); ``env``: every node.env value (the job watch reads its own keys).
    """

    cloud: str
    stack: str
    bucket: str
    expires_at: datetime | None
    idle_timeout_seconds: float
    idle_utilization_percent: int
    checkpoint_dir: Path
    dry_run: bool = False
    health_gate: str = "off"
    checkpoint_interval_minutes: float = 0.0
    verdict_wait_seconds: float = 0.0
    gpu_count: int = 0
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env_file(cls, path: Path, dry_run: bool = False) -> AgentConfig:
        """Parse ``KEY=VALUE`` lines.

        Raises:
            ValueError: a required key is missing or a number does not parse.
        """
        env = parse_node_env(Path(path).read_text())
        try:
            expires = env.get("GPUINFRA_EXPIRES_AT")
            return cls(
                cloud=env["GPUINFRA_CLOUD"],
                stack=env["GPUINFRA_STACK"],
                bucket=env["GPUINFRA_BUCKET"],
                expires_at=parse_time(expires) if expires else None,
                idle_timeout_seconds=float(env["GPUINFRA_IDLE_TIMEOUT_MINUTES"]) * 60,
                idle_utilization_percent=int(env["GPUINFRA_IDLE_GPU_UTILIZATION_PERCENT"]),
                checkpoint_dir=Path(
                    env.get("GPUINFRA_CHECKPOINT_DIR") or env.get("GPUINFRA_SCRATCH", "/scratch") + "/checkpoints"
                ),
                dry_run=dry_run or env.get("GPUINFRA_AGENT_DRY_RUN") == "1",
                health_gate=env.get("GPUINFRA_HEALTH_GATE") or "off",
                checkpoint_interval_minutes=float(env.get("GPUINFRA_CHECKPOINT_INTERVAL_MINUTES") or 0),
                verdict_wait_seconds=float(env.get("GPUINFRA_HEALTH_WAIT_SECONDS") or 0),
                gpu_count=int(env.get("GPUINFRA_GPU_COUNT") or 0),
                env=env,
            )
        except KeyError as exc:
            raise ValueError(f"{path}: missing {exc.args[0]}") from None


def parse_time(text: str) -> datetime:
    """ISO 8601 UTC (``2026-11-25T01:00:00Z``)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


@dataclass
class Agent:
    """The decision loop (pure apart from the injected GPUs, metadata, syncer and actions).

    ``end_node`` is the cloud's end call and ``power_off`` (None: none) the fallback
    ``shutdown -h now``; both raise on failure. ``replace`` (None: none) asks for a preempted
    node's replacement (:meth:`ask_replacement`). ``watch`` builds the job watch for the agent
    (:class:`gpuinfra.agent.watch.Watch`; None: no watch); until it can be built (the node
    bundle is not in yet) every poll tries again.
    """

    config: AgentConfig
    gpus: GpuMonitor
    metadata: AwsMetadata | GcpMetadata
    syncer: Callable[[], Any] | None  # -> gpuinfra.agent.checkpoints.CheckpointSync
    end_node: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    idle_since: float | None = None
    events: list[str] = field(default_factory=list)
    interrupted: bool = False
    state_dir: Path | None = None
    end_sync_seconds: float = END_SYNC_BOUND_SECONDS
    synced_before_end: bool = False
    power_off: Callable[[str], None] | None = None
    watch: Callable | None = None
    #: the end under way (``idle``, ``expired``, ``gpu-fault``, ``hang``, ``excluded``), else ""
    ending: str = ""
    end_tries: int = 0
    end_failures: int = 0
    next_end_try: float = 0.0
    fault_since: float | None = None
    job_watch: Any = None
    #: asks the cloud for this preempted node's replacement (its name; "" when none is asked for)
    replace: Callable[[], str] | None = None
    replacing: threading.Thread | None = None

    def _idle_file(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / "idle_since"

    def __post_init__(self) -> None:
        """Take the idle start (and the first start, :attr:`started`) a previous agent process
        of this boot wrote (wall clock, epoch seconds), so a restart by systemd does not start
        either clock again (``state_dir`` is under /run: a reboot clears it)."""
        self.started = self.now().timestamp()
        if self.state_dir is None:
            return
        first = self.state_dir / "agent-started"
        try:
            self.started = float(first.read_text())
        except (OSError, ValueError):
            try:
                first.parent.mkdir(parents=True, exist_ok=True)
                first.write_text(f"{self.started:.3f}\n")
            except OSError:
                pass
        path = self._idle_file()
        if self.idle_since is not None or path is None:
            return
        try:
            started = float(path.read_text())
        except (OSError, ValueError):
            return
        self.idle_since = self.clock() - max(0.0, self.now().timestamp() - started)

    def _record_idle_start(self, idle: bool) -> None:
        """Write (idle) or remove (busy) the idle start; called when the state changes."""
        path = self._idle_file()
        if path is None:
            return
        try:
            if idle:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"{self.now().timestamp():.3f}\n")
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            self._log(f"cannot record the idle start in {path}: {exc}")

    def _log(self, message: str) -> None:
        self.events.append(message)
        LOG.info(message)

    def expiry(self) -> datetime | None:
        """TTL end: the instance tag when readable and valid, else node.env."""
        try:
            tagged = self.metadata.expires_at()
            return parse_time(tagged) if tagged else self.config.expires_at
        except Exception as exc:  # noqa: BLE001 - unreachable metadata or a malformed tag
            self._log(f"cannot read the expiry tag, using node.env: {exc!r}")
            return self.config.expires_at

    def save_checkpoints(self, seconds: float) -> list[str]:
        """Sync complete checkpoint folders, newest first, for at most ``seconds``
        (:meth:`gpuinfra.agent.checkpoints.CheckpointSync.sync`, loaded from the node bundle by
        ``syncer()``). A failure is logged, never raised: ending the node must not depend on it.

        Returns:
            Names of the folders uploaded.
        """
        try:
            sync = self.syncer() if self.syncer else None
            result = sync.sync(sync.clock() + seconds) if sync else None
        except Exception as exc:  # noqa: BLE001 - no bundle yet, or any upload error
            self._log(f"checkpoint sync failed, going on: {exc!r}")
            return []
        if result is not None:
            state = "" if result.complete else ", some complete checkpoints not in the bucket"
            self._log(f"synced {len(result.uploaded)} checkpoint folder(s) to {self.config.bucket}{state}")
            return list(result.uploaded)
        return []

    def gate(self) -> str | None:
        """None once idle time counts: the health gate is off or has a verdict (``health-passed``
        or ``health-failed`` in ``state_dir``, written by ``gpuinfra-health.service``). Before,
        ``starting``: the GPUs wait for the image build, the peers and the all-reduce. With no
        verdict ``config.verdict_wait_seconds`` after the agent's first start the gate counts as
        failed: the agent writes ``health-failed`` itself (``gpuinfra-run`` refuses, the idle
        clock runs). A node the gate left out (``health-excluded``) ends once the ranks are
        decided (``ranks-decided``) or that bound passed."""
        c, d = self.config, self.state_dir
        if c.health_gate in ("", "off") or d is None:
            return None
        late = 0 < c.verdict_wait_seconds <= self.now().timestamp() - self.started
        if (d / "health-excluded").exists():
            if late or (d / "ranks-decided").exists():
                return self._finish("excluded", "the health gate left this node out")
            return "starting"
        if (d / "health-passed").exists() or (d / "health-failed").exists():
            return None
        if not late:
            return "starting"
        why = f"no health verdict within {c.verdict_wait_seconds:.0f} s of the agent's start"
        self._log(f"{why}: the gate counts as failed")
        (d / "health-failed").write_text(why + "\n")
        return None

    def gpu_fault(self) -> tuple[list[int] | None, str]:
        """(GPU utilizations, "") or (None, why the GPUs count as faulty now, "" while a failed read
        is younger than :data:`GPU_FAULT_SECONDS`). A fatal Xid (the job watch) is a fault at once."""
        if self.job_watch is None and self.watch is not None:
            with contextlib.suppress(Exception):  # not installed yet: try again next poll
                self.job_watch = self.watch(self)
        xid = self.job_watch.xid() if self.job_watch else ""
        if xid:
            return None, xid
        try:
            utilization = self.gpus.utilizations()
            if len(utilization) < max(1, self.config.gpu_count):
                raise OSError(f"{len(utilization)} GPUs visible")
            self.fault_since = None
            return utilization, ""
        except Exception as exc:  # noqa: BLE001 - any failure to read the GPUs
            if self.fault_since is None:
                self.fault_since = self.clock()
                self._log(f"cannot read the GPUs: {exc!r}")
            failing = self.clock() - self.fault_since
            return None, f"{exc!r} for {failing:.0f} s" if failing >= GPU_FAULT_SECONDS else ""

    def step(self) -> str:
        """One poll. Returns ``running`` | ``starting`` | ``hung`` | ``interrupted`` or, once
        the node is ending (every later poll tries again, :meth:`end_try`), ``idle`` |
        ``expired`` | ``gpu-fault`` | ``job-done`` | ``hang`` | ``excluded``.

        An error reading the metadata service is logged and the poll goes on: the TTL, GPU and
        idle checks still run.
        """
        if self.ending:
            return self.end_try()
        notice = None
        if not self.interrupted:
            try:
                notice = self.metadata.interruption()
            except Exception as exc:  # noqa: BLE001 - metadata errors must not stop the poll
                self._log(f"cannot read the interruption notice: {exc!r}")
        if notice:
            self.interrupted = True
            self._log(f"spot interruption notice {notice}: saving checkpoints")
            self.ask_replacement()
            self.save_checkpoints(NOTICE_SECONDS[self.config.cloud] * NOTICE_SYNC_SHARE)
            return "interrupted"
        expires = self.expiry()
        if expires is not None and self.now() >= expires:
            return self._finish("expired", f"TTL reached ({expires.isoformat()})")
        utilization, fault = self.gpu_fault()
        if fault:
            return self._finish("gpu-fault", f"GPU fault: {fault}")
        done = self.job_watch.job_done() if self.job_watch else ""
        if done:
            return self._finish("job-done", done)
        state = self.gate()
        if state:
            if self.idle_since is not None:
                self.idle_since = None
                self._record_idle_start(False)
            return state
        if utilization is None:  # a failed read, not a fault yet: neither busy nor idle
            return "running"
        if any(u >= self.config.idle_utilization_percent for u in utilization):
            if self.idle_since is not None:
                self.idle_since = None
                self._record_idle_start(False)
            return self.job_watch.hang(utilization) if self.job_watch else "running"
        if self.idle_since is None:
            self.idle_since = self.clock()
            self._record_idle_start(True)
        idle_for = self.clock() - self.idle_since
        if idle_for >= self.config.idle_timeout_seconds:
            return self._finish(
                "idle", f"all GPUs under {self.config.idle_utilization_percent}% for {idle_for / 60:.0f} min"
            )
        return "running"

    def ask_replacement(self) -> None:
        """Once, and not for a node that is ending on purpose: :attr:`replace` in a thread, beside
        the notice's checkpoint sync (a failure is logged; the notice leaves no time to retry)."""
        if self.replace is None or self.replacing or self.ending:
            return

        def ask() -> None:
            try:
                name = self.replace()  # type: ignore[misc]
                self._log(f"asked for replacement {name}" if name else "no replacement asked for")
            except Exception as exc:  # noqa: BLE001 - log it and move on
                self._log(f"replacement request failed: {exc!r}")

        self.replacing = threading.Thread(target=ask, daemon=True)
        self.replacing.start()

    def _finish(self, reason: str, why: str) -> str:
        self._log(f"ending node: {why}")
        if not self.synced_before_end:  # one bounded sync; the end tries that follow do not sync again
            self.synced_before_end = True
            self.save_checkpoints(self.end_sync_seconds)
        self.ending = reason
        return self.end_try()

    def end_try(self) -> str:
        """Try to end the node once its next try is due, and return :attr:`ending`. Tries
        :data:`END_API_TRIES` cloud end calls, :data:`END_RETRY_SECONDS` apart after each
        failure and :data:`END_GONE_SECONDS` after a success (the node should be gone by then),
        then ``power_off`` and the end call take turns; the cloud's backstop ends a node all of
        them failed to end."""
        if self.config.dry_run:
            if not self.end_tries:
                self._log("dry run: not ending the node")
            self.end_tries = 1
            return self.ending
        started = self.clock()
        if started < self.next_end_try:
            return self.ending
        n = self.end_tries
        self.end_tries += 1
        call, name = self.end_node, "end call"
        if self.power_off is not None and n >= END_API_TRIES and (n - END_API_TRIES) % 2 == 0:
            call, name = self.power_off, "shutdown -h now"
        if n == END_API_TRIES:
            self._log("relying on the cloud backstop if this fails: AWS EventBridge Scheduler, GCP max_run_duration")
        try:
            call(self.ending)
        except Exception as exc:  # noqa: BLE001 - any failure: try again later
            self.end_failures += 1
            wait = END_RETRY_SECONDS[min(self.end_failures, len(END_RETRY_SECONDS)) - 1]
            self._log(f"{name} failed, again in {wait} s: {exc!r}")
        else:
            self.end_failures, wait = 0, END_GONE_SECONDS
            self._log(f"{name} done")
        self.next_end_try = started + wait
        return self.ending


def end_aws_node(reason: str) -> None:
    """Instance-initiated shutdown (``shutdown -h now``): on AWS the launch template makes it
    terminate the instance; on GCP it stops the VM (the agent's fallback there).

    Raises:
        subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError: shutdown failed.
    """
    subprocess.run(["shutdown", "-h", "now", f"gpuinfra agent: {reason}"], check=True, timeout=60)


def end_gcp_node(reason: str, metadata: GcpMetadata | None = None) -> None:
    """Delete this VM: a managed instance group's member from its group (which shrinks instead of
    replacing it), a VM of the bulk insert (no ``created-by``: :meth:`GcpMetadata.mig_member`) itself.

    Raises:
        OSError: the metadata server gave no name or zone, or no answer on ``created-by``;
            subprocess.CalledProcessError, subprocess.TimeoutExpired: ``gcloud`` failed or hung.
    """
    metadata = metadata or GcpMetadata()
    name, zone = metadata.instance()
    if not name or not zone:
        raise OSError("the metadata server gave no instance name or zone")
    group = name.rsplit("-", 1)[0]
    if metadata.mig_member():
        LOG.info("deleting %s from managed instance group %s: %s", name, group, reason)
        argv = ["instance-groups", "managed", "delete-instances", group, f"--instances={name}"]
    else:
        LOG.info("deleting %s: %s", name, reason)
        argv = ["instances", "delete", name]
    subprocess.run(["gcloud", "compute", *argv, f"--zone={zone}", "--quiet"], check=True, timeout=300)


def node_name(metadata: AwsMetadata | GcpMetadata) -> str:
    """This node's id for its checkpoint prefix: the instance id (AWS) or VM name (GCP), else
    the host name when the metadata service cannot be read."""
    try:
        name = metadata.node_name()
    except Exception as exc:  # noqa: BLE001 - fall back to the host name
        LOG.info("cannot read the node name from metadata (%r); using the host name", exc)
        name = ""
    return name or socket.gethostname()


def build_agent(config: AgentConfig, state_dir: Path | None = None, poll_seconds: float = 5.0) -> Agent:
    """The agent with real NVML, metadata, sync and actions for ``config.cloud``; ``state_dir``
    keeps the idle start across restarts; on GCP the preemption read waits up to ``poll_seconds``
    for a change (so the poll period is spent waiting on the flag, not sleeping). The checkpoint
    sync comes from the node bundle (``gpuinfra.agent.checkpoints``), loaded on first use."""
    gcp = GcpMetadata(wait_seconds=poll_seconds)
    metadata: AwsMetadata | GcpMetadata = AwsMetadata() if config.cloud == "aws" else gcp
    loaded: list = []

    def syncer():
        if not loaded:
            from gpuinfra.agent import checkpoints  # the bundle's copy, beside this file

            root, node = config.checkpoint_dir, node_name(metadata)
            loaded.append(checkpoints.for_node(config.cloud, config.bucket, config.stack, root, node))
        return loaded[0]

    aws = config.cloud == "aws"
    end = end_aws_node if aws else lambda reason: end_gcp_node(reason, gcp)
    power_off = None if aws else end_aws_node  # GCP: shutdown -h now as the fallback

    def replace() -> str:
        from gpuinfra.agent import replace  # the bundle's module, beside this file

        return replace.request_gcp_replacement(gcp, config.expires_at)

    return Agent(
        config,
        NvmlGpus(),
        metadata,
        syncer,
        end,
        state_dir=state_dir,
        power_off=power_off,
        watch=load_watch,
        replace=None if aws else replace,
    )


def load_watch(agent: Agent):
    """The job watch of the node bundle (:mod:`gpuinfra.agent.watch`, beside this file on the
    node once the bundle is in).

    Raises:
        ImportError: the bundle is not in yet.
    """
    import importlib

    importlib.invalidate_caches()  # the bundle wrote the package after this process started
    from gpuinfra.agent.watch import Watch  # only on the node once the bundle is in (not in the user data)

    return Watch(agent)


def keep_syncing(agent: Agent) -> None:
    """Background thread: once the bundle is installed, :func:`gpuinfra.agent.checkpoints.keep_syncing`
    (interval syncs, inotify, sync requests, rebalance recommendations)."""
    while True:
        try:
            from gpuinfra.agent import checkpoints  # the bundle's module: absent until it is installed

            sync, cloud = agent.syncer(), agent.config.cloud  # type: ignore[misc]
            poll = checkpoints.Requests(sync, cloud, agent.metadata._get).poll  # type: ignore[arg-type]
            checkpoints.keep_syncing(sync, agent.config.checkpoint_interval_minutes * 60, poll)
        except Exception as exc:  # noqa: BLE001 - no bundle yet: try again
            LOG.info("checkpoint sync not running yet: %r", exc)
        time.sleep(30)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``gpuinfra_agent.py [--config /etc/gpuinfra/node.env] [--poll-seconds 5] [--state-dir /run/gpuinfra] [--dry-run] [--once]``.
    Polls until the node is gone (returns only with ``--once``)."""
    parser = argparse.ArgumentParser(description="gpuinfra node agent")
    parser.add_argument("--config", type=Path, default=Path("/etc/gpuinfra/node.env"))
    # 5 s: spot / preemption notices come 120 s (AWS) and 30 s (GCP) before the end
    parser.add_argument("--poll-seconds", type=float, default=5.0)
    parser.add_argument("--state-dir", type=Path, default=Path("/run/gpuinfra"))
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--once", action="store_true", help="one poll, then exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpuinfra-agent %(message)s", stream=sys.stdout)
    agent = build_agent(AgentConfig.from_env_file(args.config, args.dry_run), args.state_dir, args.poll_seconds)

    def stop(*_: object) -> None:  # systemd stop / OS shutdown: a bounded sync, then exit
        agent._log("SIGTERM: saving checkpoints")
        bound = time.monotonic() + STOP_SYNC_SECONDS[agent.config.cloud]
        agent.ask_replacement()  # GCP: a preemption's ACPI soft-off may come before the poll sees the flag
        agent.save_checkpoints(STOP_SYNC_SECONDS[agent.config.cloud])
        if agent.replacing:  # KillMode=mixed kills the request's gcloud once this process exits
            agent.replacing.join(max(0.0, bound - time.monotonic()))
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    if not args.once:
        threading.Thread(target=keep_syncing, args=(agent,), daemon=True).start()
    while True:
        started = time.monotonic()
        try:
            agent.step()
        except Exception as exc:  # noqa: BLE001 - a poll never stops the agent
            LOG.exception("poll failed, going on: %r", exc)
        if args.once:
            return 0
        # a poll that waited on the metadata server (GCP wait_for_change) counts toward the period
        time.sleep(max(0.0, args.poll_seconds - (time.monotonic() - started)))


if __name__ == "__main__":
    sys.exit(main())
