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
  cloud.google.com/compute/docs/instances/spot#detect-preemption, 30 s notice).

On a spot notice it syncs the checkpoint folder to ``<bucket>/checkpoints/<stack>/<node>/`` (one
prefix per node, so ranks that write files of the same name never overwrite each other) within
the notice window. On idle or expiry it syncs for at most :data:`END_SYNC_BOUND_SECONDS`, then
ends the node whatever the sync did: AWS ``shutdown -h now`` (the launch template's
instance-initiated shutdown behaviour is *terminate*); GCP deletes its own VM from the managed
instance group (the group shrinks, nothing is recreated). ``--dry-run`` logs instead of acting.

The keys of ``/etc/gpuinfra/node.env`` are defined once, in :data:`NODE_ENV_KEYS`; the boot
templates of both clouds write the file with :func:`format_node_env` and the agent reads it with
:func:`parse_node_env`.
"""

from __future__ import annotations

import argparse
import json
import logging
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
from typing import Protocol

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
    "GPUINFRA_AGENT_DRY_RUN": (False, "1: log instead of ending the node"),
    "GPUINFRA_HEALTH_GATE": (False, "enforce | report | off (profile health_gate); empty = off"),
    "GPUINFRA_DEPLOYMENT": (False, "deployment id (gpuinfra up)"),
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
        """Utilization percent of every GPU (empty: no GPU visible)."""


class NvmlGpus:
    """GPU utilization through NVML (nvidia-ml-py), or ``nvidia-smi`` when pynvml is missing."""

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
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return []
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

    def address(self) -> str:
        """The first NIC's internal IPv4 address."""
        return self._get("instance/network-interfaces/0/ip")[1].strip()


class S3Sync:
    """Upload new or changed files of a folder to ``s3://bucket/prefix`` (boto3, else the AWS CLI
    that the Deep Learning AMI ships). boto3 gets short connect/read timeouts and 3 attempts, so
    one unreachable endpoint cannot hold an upload for the SDK's default minutes."""

    def __init__(self, bucket: str, prefix: str, client=None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if client is None:
            try:
                import boto3
                from botocore.config import Config

                client = boto3.client(
                    "s3",
                    config=Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"}),
                )
            except ImportError:
                client = None
        self.client = client
        self.uploaded: dict[str, tuple[int, float]] = {}

    def key(self, root: Path, path: Path) -> str:
        rel = path.relative_to(root).as_posix()
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def upload(self, root: Path, path: Path) -> None:
        if self.client is None:
            subprocess.run(
                ["aws", "s3", "cp", str(path), f"s3://{self.bucket}/{self.key(root, path)}"],
                check=True,
                timeout=END_SYNC_BOUND_SECONDS,
            )
        else:
            self.client.upload_file(str(path), self.bucket, self.key(root, path))


def sync_folder(
    root: Path,
    syncer: S3Sync,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    on_upload: Callable[[Path], None] | None = None,
) -> list[str]:
    """Upload every file of ``root`` that is new or changed since it was last uploaded, and
    repeat until a full pass finds nothing new (files written during the sync are caught by the
    next pass) or ``deadline`` passes.

    Returns:
        Keys uploaded, in order.
    """
    done: list[str] = []
    if not root.is_dir():
        return done
    while clock() < deadline:
        changed = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            stat = path.stat()
            signature = (stat.st_size, stat.st_mtime)
            if syncer.uploaded.get(str(path)) != signature:
                changed.append((path, signature))
        if not changed:
            break
        for path, signature in changed:
            if clock() >= deadline:
                break
            syncer.upload(root, path)
            syncer.uploaded[str(path)] = signature
            done.append(syncer.key(root, path))
            if on_upload is not None:
                on_upload(path)
    return done


@dataclass
class AgentConfig:
    """Settings from /etc/gpuinfra/node.env (see the user data templates)."""

    cloud: str
    stack: str
    bucket: str
    expires_at: datetime | None
    idle_timeout_seconds: float
    idle_utilization_percent: int
    checkpoint_dir: Path
    dry_run: bool = False
    health_gate: str = "off"

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
            )
        except KeyError as exc:
            raise ValueError(f"{path}: missing {exc.args[0]}") from None


def parse_time(text: str) -> datetime:
    """ISO 8601 UTC (``2026-11-25T01:00:00Z``)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


@dataclass
class Agent:
    """The decision loop (pure apart from the injected GPUs, metadata, syncer and actions)."""

    config: AgentConfig
    gpus: GpuMonitor
    metadata: AwsMetadata | GcpMetadata
    syncer: S3Sync | None
    end_node: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    idle_since: float | None = None
    events: list[str] = field(default_factory=list)
    interrupted: bool = False
    state_dir: Path | None = None
    end_sync_seconds: float = END_SYNC_BOUND_SECONDS
    synced_before_end: bool = False

    def _idle_file(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / "idle_since"

    def __post_init__(self) -> None:
        """Take the idle start a previous agent process wrote (wall clock, epoch seconds), so a
        restart by systemd does not start the idle clock again (``state_dir`` is under /run:
        a reboot clears it, and a rebooted node is busy again anyway)."""
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
        """Sync the checkpoint folder for at most ``seconds`` of wall time.

        The sync runs in a daemon thread that is abandoned when the bound passes (an upload
        hanging on an unreachable endpoint cannot hold the caller); a failure is logged, never
        raised: ending the node must not depend on the upload.

        Returns:
            Keys uploaded before the bound (all of them when the sync finished).
        """
        if self.syncer is None:
            return []
        syncer = self.syncer  # not None (checked above); the thread below sees this binding
        uploaded: list[str] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                sync_folder(
                    self.config.checkpoint_dir,
                    syncer,
                    self.clock() + seconds,
                    self.clock,
                    on_upload=lambda path: uploaded.append(syncer.key(self.config.checkpoint_dir, path)),
                )
            except Exception as exc:  # noqa: BLE001 - any upload error: log it and go on
                failure.append(exc)

        worker = threading.Thread(target=run, name="gpuinfra-checkpoint-sync", daemon=True)
        worker.start()
        worker.join(seconds)
        if worker.is_alive():
            self._log(
                f"checkpoint sync did not finish within {seconds:.0f} s ({len(uploaded)} file(s) uploaded), going on"
            )
        elif failure:
            self._log(f"checkpoint sync failed, going on: {failure[0]!r}")
        else:
            self._log(f"synced {len(uploaded)} checkpoint file(s) to {self.config.bucket}")
        return list(uploaded)

    def ready(self) -> bool:
        """The node can be idle: the boot health gate has a verdict (``health-passed`` or
        ``health-failed`` in ``state_dir``, written by ``gpuinfra-health.service``) or is off.
        Before that the GPUs wait for the image build, the peers and the all-reduce, which is not
        idleness: the TTL still ends a node whose gate never finishes."""
        if self.config.health_gate in ("", "off") or self.state_dir is None:
            return True
        if (self.state_dir / "health-excluded").exists():
            return False  # the gate ends this node itself once the peers have decided the ranks
        return any((self.state_dir / mark).exists() for mark in ("health-passed", "health-failed"))

    def step(self) -> str:
        """One poll. Returns ``running`` | ``starting`` | ``idle`` | ``expired`` | ``interrupted``
        (``starting``: the health gate has no verdict yet, see :meth:`ready`).

        An error reading the metadata service or the GPUs is logged and the poll goes on: the
        TTL and idle checks still run (a crash would let systemd restart the agent and, before
        the idle start was kept under /run, start the idle clock again).
        """
        notice = None
        if not self.interrupted:
            try:
                notice = self.metadata.interruption()
            except Exception as exc:  # noqa: BLE001 - metadata errors must not stop the poll
                self._log(f"cannot read the interruption notice: {exc!r}")
        if notice:
            self.interrupted = True
            self._log(f"spot interruption notice {notice}: saving checkpoints")
            self.save_checkpoints(NOTICE_SECONDS[self.config.cloud] * NOTICE_SYNC_SHARE)
            return "interrupted"
        expires = self.expiry()
        if expires is not None and self.now() >= expires:
            return self._finish("expired", f"TTL reached ({expires.isoformat()})")
        if not self.ready():
            if self.idle_since is not None:
                self.idle_since = None
                self._record_idle_start(False)
            return "starting"
        try:
            utilization = self.gpus.utilizations()
        except Exception as exc:  # noqa: BLE001 - unknown utilization counts as busy
            self._log(f"cannot read GPU utilization: {exc!r}")
            utilization = []
        busy = any(u >= self.config.idle_utilization_percent for u in utilization)
        if busy or not utilization:
            if self.idle_since is not None:
                self.idle_since = None
                self._record_idle_start(False)
            return "running"
        if self.idle_since is None:
            self.idle_since = self.clock()
            self._record_idle_start(True)
        idle_for = self.clock() - self.idle_since
        if idle_for >= self.config.idle_timeout_seconds:
            return self._finish(
                "idle", f"all GPUs under {self.config.idle_utilization_percent}% for {idle_for / 60:.0f} min"
            )
        return "running"

    def _finish(self, reason: str, why: str) -> str:
        self._log(f"ending node: {why}")
        if not self.synced_before_end:  # one bounded sync; a retry of a failed end does not sync again
            self.synced_before_end = True
            self.save_checkpoints(self.end_sync_seconds)
        if self.config.dry_run:
            self._log("dry run: not ending the node")
        else:
            self.end_node(reason)
        return reason


def end_aws_node(reason: str) -> None:
    """Instance-initiated shutdown; the launch template makes it terminate the instance."""
    subprocess.run(["shutdown", "-h", "now", f"gpuinfra agent: {reason}"], check=False)


def end_gcp_node(reason: str, metadata: GcpMetadata | None = None) -> None:
    """Delete this VM from its managed instance group (the group shrinks instead of replacing it)."""
    name, zone = (metadata or GcpMetadata()).instance()
    group = name.rsplit("-", 1)[0]
    LOG.info("deleting %s from managed instance group %s: %s", name, group, reason)
    subprocess.run(
        [
            "gcloud",
            "compute",
            "instance-groups",
            "managed",
            "delete-instances",
            group,
            f"--instances={name}",
            f"--zone={zone}",
            "--quiet",
        ],
        check=False,
    )


def node_name(metadata: AwsMetadata | GcpMetadata) -> str:
    """This node's id for its checkpoint prefix: the instance id (AWS) or VM name (GCP), else
    the host name when the metadata service cannot be read."""
    try:
        name = metadata.node_name()
    except Exception as exc:  # noqa: BLE001 - fall back to the host name
        LOG.info("cannot read the node name from metadata (%r); using the host name", exc)
        name = ""
    return name or socket.gethostname()


def checkpoint_prefix(config: AgentConfig, node: str) -> str:
    """``checkpoints/<stack>/<node>``: one prefix per node, so same-named files never overwrite."""
    return f"checkpoints/{config.stack}/{node}"


def build_agent(config: AgentConfig, state_dir: Path | None = None, poll_seconds: float = 5.0) -> Agent:
    """The agent with real NVML, metadata, sync and actions for ``config.cloud``; ``state_dir``
    keeps the idle start across restarts; on GCP the preemption read waits up to ``poll_seconds``
    for a change (so the poll period is spent waiting on the flag, not sleeping)."""
    if config.cloud == "aws":
        metadata = AwsMetadata()
        syncer = S3Sync(config.bucket, checkpoint_prefix(config, node_name(metadata)))
        return Agent(config, NvmlGpus(), metadata, syncer, end_aws_node, state_dir=state_dir)
    gcp = GcpMetadata(wait_seconds=poll_seconds)
    return Agent(
        config,
        NvmlGpus(),
        gcp,
        GcsCliSync(config.bucket, checkpoint_prefix(config, node_name(gcp))),
        lambda reason: end_gcp_node(reason, gcp),
        state_dir=state_dir,
    )


class GcsCliSync(S3Sync):
    """Upload to ``gs://bucket/prefix`` with ``gcloud storage cp`` (present on DLVM images)."""

    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket, self.prefix, self.uploaded, self.client = bucket, prefix.strip("/"), {}, None

    def upload(self, root: Path, path: Path) -> None:
        subprocess.run(
            ["gcloud", "storage", "cp", str(path), f"gs://{self.bucket}/{self.key(root, path)}"],
            check=True,
            timeout=END_SYNC_BOUND_SECONDS,
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``gpuinfra_agent.py [--config /etc/gpuinfra/node.env] [--poll-seconds 5] [--state-dir /run/gpuinfra] [--dry-run] [--once]``."""
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
    while True:
        started = time.monotonic()
        try:
            state = agent.step()
        except Exception as exc:  # noqa: BLE001 - a poll never stops the agent
            LOG.exception("poll failed, going on: %r", exc)
            state = "error"
        if args.once or state in ("idle", "expired"):
            return 0
        # a poll that waited on the metadata server (GCP wait_for_change) counts toward the period
        time.sleep(max(0.0, args.poll_seconds - (time.monotonic() - started)))


if __name__ == "__main__":
    sys.exit(main())
