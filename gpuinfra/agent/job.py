"""The job: one spec in the stack bucket, run on every node by ``gpuinfra-job.service``.

Standard library only (the node bundle ships it, :data:`gpuinfra.plan.node_bundle.NODE_MODULES`);
``gpuinfra run`` (:mod:`gpuinfra.services.jobs`) writes the spec and reads what the nodes write.
No SSH, no open port, no SSM Run Command: the nodes poll the bucket. User docs: docs/run.md.

**The contract** (what lets a node that boots at any time -- a replacement too -- find the
current job and join it):

* The spec is ``gpuinfra/jobs/<stack>/job.json`` (:func:`spec_key`), under the prefix the nodes
  may only read (the node bundle's). ``gpuinfra run`` writes it; ``gpuinfra cancel`` rewrites
  it with ``"cancel": true``. Fields: :class:`JobSpec`.
* Every node's ``gpuinfra-job.service`` (``python3 -m gpuinfra.agent.job``) reads the spec every
  :data:`POLL_SECONDS` until it finds one whose job is not finished (no :func:`final_key`
  object) and that was submitted to its deployment (``deployment`` = node.env
  ``GPUINFRA_DEPLOYMENT``; the bucket outlives ``down``, so the spec of an earlier deployment is
  ignored, not taken for this one's finished job), then runs ``gpuinfra-run --name gpuinfra-job --rdzv-id <id> --nnodes <min_nodes>:<NNODES>
  -- <argv>``: torchrun's ``c10d`` rendezvous at ``MASTER_ADDR:MASTER_PORT`` of
  ``/etc/gpuinfra/cluster.env`` (the rank-0 node hosts the store), ``--rdzv-id`` the job id, so
  a node started later runs the same command and joins the next rendezvous round
  (pytorch.org/docs/stable/elastic/run.html, "Elastic (min=1, max=4, tolerates up to 3
  membership changes or failures)").
* Restarts are the unit's: a job that exits non-zero (or that the agent's hang watch asks to
  restart, ``hang.action: restart``) runs again while ``restart == "on-failure"`` and fewer than
  ``max_restarts`` restarts are recorded in this node's part; the job resumes from the newest
  checkpoint in ``GPUINFRA_CHECKPOINT_DIR`` itself. A restart of the job restarts every node
  once (a failed collective fails them all), so the job's restart count is the most any part
  recorded (:attr:`gpuinfra.services.jobs.JobView.restart_count`); a replacement continues the
  records of the part it takes over (:meth:`JobRunner.inherited`) instead of starting at 0.
* A failed worker ends the attempt at once: torchrun (``--max_restarts 0``) logs ``failed
  (exitcode: N) local_rank: ...`` and then waits in its exit barrier for every other node's
  agent, 300 s, not settable from torchrun's command line (pytorch/pytorch#99051: "on a segfault
  on a single trainer, we end up keeping the gpu on all ranks blocked for 5 minutes due to
  elastic agents barrier timeouts"). A lost node never arrives there, so the job unit stops
  torchrun :data:`WORKER_FAILED_GRACE_SECONDS` after that line. An attempt that logged that line
  and failed records exit status N, the worker's, not torchrun's own 1.
* Rank 0 moves: before an attempt, a node reads the newest rank decision of its deployment
  (:func:`gpuinfra.health.ranks.newest_ranking`, ``health/<stack>/ranks-<deployment>-*``). When
  it keeps this node's rank and names another rank 0 (a replacement took a lost rank 0:
  :meth:`gpuinfra.health.ranks.DecisionScope.takeover`), the node rewrites ``MASTER_ADDR`` of
  cluster.env and the hostfile (atomically; each address checked as an IPv4 address), so the next attempt
  meets the replacement's rendezvous. A node that does not host the rendezvous waits before
  every attempt until rank 0's rendezvous port answers or such a decision appears, at most
  :data:`RANK0_WAIT_SECONDS`: an attempt against a lost rank 0 would only fail and spend a restart.
* What the node writes (``<part>`` = ``rank-<NODE_RANK>``): :func:`status_key` (JSON:
  ``state`` ``waiting | running | succeeded | failed | cancelled``, ``exit_code``,
  ``restarts`` [``{"at", "cause", "step"}``; once the next attempt logs its first ``step=N``
  also ``resumed_at_step`` (N - 1) and ``steps_redone`` (``step`` - ``resumed_at_step``)], ``progress`` (the ``key=value`` numbers of the last
  log line that has ``step=N``), ``node``, ``updated_at``), the log as chunks
  :func:`log_key` (lines prefixed ``[<part>] ``, every :data:`LOG_CHUNK_SECONDS`), the outputs
  folder (``GPUINFRA_OUTPUT_DIR``) under ``jobs/<stack>/<id>/outputs/<part>/`` and, once the job
  is over, :func:`final_key` (any node; the first one wins nothing, they all say the same).
  The same prefixed lines also go to :data:`LOCAL_LOG` on the node, bounded
  (:data:`LOCAL_LOG_BYTES`, one rotated file): the file the monitoring agent ships to CloudWatch
  Logs / Cloud Logging when the profile's ``monitoring.job_logs`` is on
  (:func:`gpuinfra.monitoring.metrics.aws_agent_config`, ``gcp_ops_agent_config``).
* End on exit: a finished job writes ``/run/gpuinfra/job-done``; the agent then syncs the
  checkpoints (bounded, ``END_SYNC_BOUND_SECONDS``) and ends the node (:mod:`gpuinfra.agent.watch`).

Secrets go by reference only (``secrets``: variable -> name): ``aws ssm get-parameter
--with-decryption`` for ``/gpuinfra/<stack id>/job/...`` names, ``aws secretsmanager get-secret-value``
for ``gpuinfra/<stack id>/job/...`` names (AWS), ``gcloud secrets versions access latest`` for
``gpuinfra-<stack id>_...`` (GCP); the stack id is ``<stack>-<suffix>`` (:func:`secret_command`). The
values reach ``gpuinfra-run`` through its environment (``-e KEY``), never a command line.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from gpuinfra.agent.constants import PEER_DISCOVERY_WAIT_SECONDS

#: Seconds between reads of the spec (waiting for a job, and for a cancel while one runs).
POLL_SECONDS = 10
#: Seconds between log chunk uploads (a chunk also goes when it reaches :data:`LOG_CHUNK_BYTES`).
LOG_CHUNK_SECONDS = 10
LOG_CHUNK_BYTES = 1 << 20
#: Seconds a cancelled or hung job gets between SIGTERM and SIGKILL of its process group.
STOP_GRACE_SECONDS = 30
#: Seconds the outputs upload may take after the job (inside the agent's end sync bound).
OUTPUT_SYNC_SECONDS = 240
#: Seconds a node that does not host the rendezvous waits before an attempt for rank 0's
#: rendezvous port or a rank decision naming another rank 0 (module docstring): as long as a
#: replacement's own peer discovery may take.
RANK0_WAIT_SECONDS = PEER_DISCOVERY_WAIT_SECONDS
JOB_ID_PATTERN = r"j-[a-z0-9-]{1,60}"
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
RESTART_POLICIES = ("on-failure", "never")
STATES_FINAL = ("succeeded", "failed", "cancelled")
GPUINFRA_RUN = "/usr/local/bin/gpuinfra-run"
STATE_DIR = Path("/run/gpuinfra")
#: The job's combined output on the node (the bucket chunks' ``[<part>] `` lines), appended as
#: they come; what the monitoring agent ships when the profile turns ``monitoring.job_logs`` on.
LOCAL_LOG = "/var/log/gpuinfra/job.log"
#: Bytes after which :data:`LOCAL_LOG` is renamed to ``job.log.1`` (replacing the one before) and
#: a new file begins: the log takes at most twice this on the root disk.
LOCAL_LOG_BYTES = 100 << 20
#: Written when the job is over (its text says how); the agent's watch ends the node on it.
JOB_DONE_MARK = "job-done"
#: Written by the agent's watch for a hung job with ``hang.action: restart`` (its text: why).
JOB_RESTART_MARK = "job-restart"
#: Seconds the job unit lets torchrun run on after it logged a failed worker, then stops it
#: (module docstring: torchrun's exit barrier).
WORKER_FAILED_GRACE_SECONDS = 10
#: torchrun's line for a failed worker (torch.distributed.elastic.multiprocessing.api, logged at
#: ERROR, which torchrun prints by default, in 1.13 and 2.x alike).
_WORKER_FAILED = re.compile(r"\bfailed \(exitcode: (-?\d+)\) local_rank: \d+")
_PROGRESS = re.compile(r"\bstep=(\d+)\b")
_NUMBER = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(-?[0-9][0-9.eE+-]*)\b")


def spec_key(stack: str) -> str:
    """Bucket key of the stack's job spec (read-only for the nodes)."""
    return f"gpuinfra/jobs/{stack}/job.json"


def job_prefix(stack: str, job_id: str) -> str:
    """Bucket prefix of everything the nodes write for one job."""
    return f"jobs/{stack}/{job_id}"


def status_key(stack: str, job_id: str, part: str) -> str:
    """Bucket key of one node's status document."""
    return f"{job_prefix(stack, job_id)}/status/{part}.json"


def log_key(stack: str, job_id: str, part: str, seq: int) -> str:
    """Bucket key of one node's log chunk ``seq`` (zero-padded: keys sort in order)."""
    return f"{job_prefix(stack, job_id)}/logs/{part}/{seq:06d}.log"


def final_key(stack: str, job_id: str) -> str:
    """Bucket key written once the job is over on a node: a later node does not start it."""
    return f"{job_prefix(stack, job_id)}/final.json"


def utc_now() -> str:
    """Now, ISO 8601 UTC, seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class JobSpec:
    """The job ``gpuinfra run`` submits (the JSON of :func:`spec_key`).

    Attributes:
        id: ``j-...`` (:data:`JOB_ID_PATTERN`), new for every submission.
        argv: the command torchrun starts on every node (``--no-python``: ``["python", "train.py"]``).
        image: container image; "" = the profile's.
        env: variables given to the job (names: :data:`ENV_NAME_PATTERN`; values on one line).
        secrets: variable -> secret name (module docstring), resolved on the node.
        restart: ``on-failure`` | ``never``.
        max_restarts: restarts of the job before it counts as failed (0-100; module docstring).
        min_nodes: torchrun ``--nnodes MIN:MAX`` MIN (0: all the cluster's nodes).
        nproc_per_node: processes per node (0: one per GPU, cluster.env ``NPROC_PER_NODE``).
        workdir: the job's working folder on the node ("": the scratch mount).
        deployment: the stack's deployment id when submitted (stack file ``deployment_id``, 12
            hex digits; "" = any): a node of another deployment ignores the spec.
        cancel: set by ``gpuinfra cancel``: stop the job and end the nodes.
        submitted_at: ISO 8601 UTC.
    """

    id: str
    argv: tuple[str, ...]
    image: str = ""
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    restart: str = "on-failure"
    max_restarts: int = 3
    min_nodes: int = 0
    nproc_per_node: int = 0
    workdir: str = ""
    deployment: str = ""
    cancel: bool = False
    submitted_at: str = ""

    def __post_init__(self) -> None:
        """Raises ValueError on any field that could not reach a node's command line safely."""
        bad = []
        if not re.fullmatch(JOB_ID_PATTERN, self.id):
            bad.append(f"id {self.id!r} is not {JOB_ID_PATTERN}")
        if not self.argv or any(not isinstance(a, str) or "\x00" in a for a in self.argv):
            bad.append("argv must be a non-empty list of strings")
        for name, value in {**self.env, **self.secrets}.items():
            if not re.fullmatch(ENV_NAME_PATTERN, name) or not all(c.isprintable() for c in str(value)):
                bad.append(f"variable {name!r}: a name is {ENV_NAME_PATTERN}, a value one printable line")
        if set(self.env) & set(self.secrets):
            bad.append(f"{sorted(set(self.env) & set(self.secrets))} both in env and secrets")
        if self.restart not in RESTART_POLICIES:
            bad.append(f"restart {self.restart!r} is not one of {RESTART_POLICIES}")
        if not 0 <= self.max_restarts <= 100 or self.min_nodes < 0 or self.nproc_per_node < 0:
            bad.append("max_restarts is 0-100, min_nodes and nproc_per_node are >= 0")
        if self.image and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*", self.image):
            bad.append(f"image {self.image!r} is not an image reference")
        if self.workdir and not re.fullmatch(r"/[A-Za-z0-9._/-]*", self.workdir):
            bad.append(f"workdir {self.workdir!r} is not an absolute path of plain characters")
        if not re.fullmatch(r"[0-9a-f]{0,12}", str(self.deployment)):
            bad.append(f"deployment {self.deployment!r} is not a deployment id")
        if bad:
            raise ValueError("job spec: " + "; ".join(bad))

    def to_json(self) -> str:
        """The spec's JSON text."""
        return json.dumps({**asdict(self), "argv": list(self.argv), "schema_version": "1"}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """Parse :meth:`to_json` text.

        Raises:
            ValueError: not JSON, unknown fields or an invalid value.
        """
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.pop("schema_version", "1") != "1":
            raise ValueError("job spec: not a schema 1 object")
        unknown = sorted(set(doc) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"job spec: unknown fields {unknown}")
        if not isinstance(doc.get("argv"), list):
            raise ValueError("job spec: argv must be a non-empty list of strings")
        return cls(**{**doc, "argv": tuple(doc["argv"])})


def secret_command(cloud: str, scope: str, name: str) -> list[str]:
    """The CLI call that prints secret ``name``'s value (module docstring: which names).

    ``scope`` is the stack id (:func:`gpuinfra.plan.naming.stack_id`, ``<stack>-<suffix>``;
    node.env ``GPUINFRA_STACK_ID``), unique per stack file even when two project folders hold a
    stack of the same name: the nodes' grants cover these names only (AWS: the node role's
    ``node-job-secrets`` policy; GCP: the secret accessor binding of
    :func:`blueprints.gcp.storage.build_secret_reader`). GCP names end the scope with ``_``,
    which no stack name ``gpuinfra new`` writes has, so no other stack id continues it.

    Sources: docs.aws.amazon.com/cli/latest/reference/ssm/get-parameter.html (``--with-decryption``),
    docs.aws.amazon.com/cli/latest/reference/secretsmanager/get-secret-value.html (``SecretString``),
    cloud.google.com/sdk/gcloud/reference/secrets/versions/access.

    Raises:
        ValueError: ``name`` is outside the stack's names (the node may read nothing else).
    """
    if cloud == "gcp":
        if not re.fullmatch(rf"{re.escape(gcp_secret_prefix(scope))}[A-Za-z0-9_-]+", name):
            raise ValueError(f"secret {name!r}: GCP secrets of this stack are named {gcp_secret_prefix(scope)}...")
        return ["gcloud", "secrets", "versions", "access", "latest", f"--secret={name}"]
    text = ["--output", "text"]
    ssm, manager = aws_secret_prefixes(scope)
    if re.fullmatch(rf"{re.escape(ssm)}[A-Za-z0-9_./-]+", name):
        return ["aws", "ssm", "get-parameter", "--with-decryption", "--name", name, "--query", "Parameter.Value", *text]
    if re.fullmatch(rf"{re.escape(manager)}[A-Za-z0-9_./+=@-]+", name):
        return ["aws", "secretsmanager", "get-secret-value", "--secret-id", name, "--query", "SecretString", *text]
    raise ValueError(f"secret {name!r}: AWS names are {ssm}... (SSM) or {manager}... (Secrets Manager)")


def aws_secret_prefixes(scope: str) -> tuple[str, str]:
    """How the names of a stack's job secrets start on AWS: (SSM Parameter Store, Secrets
    Manager), ``/gpuinfra/<stack id>/job/`` and ``gpuinfra/<stack id>/job/``. The ``job/`` level
    keeps them apart from gpuinfra's own parameters of the stack (the CloudWatch agent's
    configuration, ``/gpuinfra/<stack id>/cloudwatch-agent``)."""
    return f"/gpuinfra/{scope}/job/", f"gpuinfra/{scope}/job/"


def gcp_secret_prefix(scope: str) -> str:
    """How every GCP Secret Manager secret id a stack's job may read starts: ``gpuinfra-<stack id>_``."""
    return f"gpuinfra-{scope}_"


def progress_of(line: str) -> dict[str, float] | None:
    """The ``key=number`` pairs of a log line that has ``step=N`` (else None)."""
    if not _PROGRESS.search(line):
        return None
    found = {}
    for key, value in _NUMBER.findall(line):
        try:
            found[key] = int(value) if key == "step" else float(value)
        except ValueError:
            continue
    return found


class JobRunner:
    """One node's side of the job (module docstring).

    Args:
        bucket: :class:`gpuinfra.agent.checkpoints.Bucket` (``put_text``, ``get_text``, ``put_tree``).
        cloud, stack: from node.env.
        part: ``rank-<NODE_RANK>`` (:func:`gpuinfra.agent.checkpoints.node_part`).
        node: this node's id (instance id or VM name).
        nnodes: the cluster's node count (cluster.env ``NNODES``).
        scratch: the scratch mount (default workdir; outputs under ``<scratch>/outputs``).
        state_dir: where the done and restart marks are.
        run: the ``gpuinfra-run`` path.
        deployment: node.env ``GPUINFRA_DEPLOYMENT`` ("": every spec is this deployment's).
        cluster_env, hostfile: the node's ranks (``/etc/gpuinfra/cluster.env``, ``hostfile``);
            None: rank 0 is never followed (module docstring).
        decisions: reads ``health/<stack>/`` (key -> body; raises OSError), for the newest
            rank decision; None: rank 0 is never followed.
        secret_scope: node.env ``GPUINFRA_STACK_ID`` (:func:`secret_command`); "": the stack name.
        local_log: where the job's lines also go on the node (:data:`LOCAL_LOG`; None: nowhere).
    """

    def __init__(
        self, bucket, cloud: str, stack: str, part: str, node: str, nnodes: int, scratch: str, state_dir: Path = STATE_DIR,
        run: str = GPUINFRA_RUN, deployment: str = "", cluster_env: Path | None = None, hostfile: Path | None = None,
        decisions: Callable[[], Mapping[str, bytes]] | None = None, secret_scope: str = "",
        local_log: str | Path | None = None,
    ) -> None:  # fmt: skip
        self.bucket, self.cloud, self.stack, self.part, self.node = bucket, cloud, stack, part, node
        self.nnodes, self.scratch, self.state_dir, self.run_path = nnodes, scratch, Path(state_dir), run
        self.deployment, self.cluster_env, self.hostfile, self.decisions = deployment, cluster_env, hostfile, decisions
        self.secret_scope = secret_scope or stack
        self.status: dict = {}
        self.lines: list[str] = []
        self.seq = 0
        self.lock, self.flushing, self.writing = threading.Lock(), threading.Lock(), threading.Lock()
        self.cancel_seen = False
        self.redo: dict | None = None
        self.worker_failed: tuple[float, int] | None = None
        self.local_log = Path(local_log) if local_log else None
        self._local: IO[str] | None = None

    # ---------------------------------------------------------------- bucket
    def read_spec(self) -> JobSpec | None:
        """The current spec, or None (none yet, another deployment's, unreadable or invalid: logged)."""
        try:
            spec = JobSpec.from_json(self.bucket.get_text(spec_key(self.stack), 60))
        except OSError:
            return None  # no job yet (the CLI answers "not found" with an error)
        except (subprocess.SubprocessError, TimeoutError) as exc:
            print(f"gpuinfra-job: reading the job spec failed: {exc}", flush=True)
            return None
        except (ValueError, TypeError) as exc:
            print(f"gpuinfra-job: ignoring an invalid job spec: {exc}", flush=True)
            return None
        return None if spec.deployment and self.deployment and spec.deployment != self.deployment else spec

    def finished(self, job_id: str) -> bool:
        """Whether some node wrote the job's final object."""
        try:
            self.bucket.get_text(final_key(self.stack, job_id), 60)
            return True
        except OSError:
            return False

    def put_status(self, spec: JobSpec, **changes) -> None:
        """Update and upload this node's status (an upload error is logged, never raised)."""
        self.status.update(changes, node=self.node, part=self.part, job=spec.id, updated_at=utc_now())
        try:
            self.bucket.put_text(status_key(self.stack, spec.id, self.part), json.dumps(self.status) + "\n", 60)
        except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
            print(f"gpuinfra-job: status upload failed: {exc}", flush=True)

    def flush_log(self, spec: JobSpec) -> None:
        """Upload the lines gathered since the last chunk as the next chunk (one upload at a
        time: the attempt's bucket thread and the end of an attempt both flush)."""
        with self.flushing:
            with self.lock:
                lines, self.lines = self.lines, []
            if not lines:
                return
            try:
                self.bucket.put_text(log_key(self.stack, spec.id, self.part, self.seq), "".join(lines), 60)
                self.seq += 1
            except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
                print(f"gpuinfra-job: log upload failed, keeping the lines: {exc}", flush=True)
                with self.lock:
                    self.lines[:0] = lines

    # ---------------------------------------------------------------- rank 0
    def follow_rank0(self) -> bool:
        """Point cluster.env's ``MASTER_ADDR`` (and the hostfile) at rank 0 of the newest rank
        decision when that decision keeps this node's rank and names another rank 0 (module
        docstring). Returns whether it rewrote them; a bucket error or a bad address is logged."""
        if self.decisions is None or self.cluster_env is None or self.hostfile is None:
            return False
        from gpuinfra.health.ranks import newest_ranking  # node bundle; here: job <- watch <- node

        rank, master = _value(self.cluster_env, "NODE_RANK"), _value(self.cluster_env, "MASTER_ADDR")
        try:
            hosts = [h.strip() for h in self.hostfile.read_text().splitlines() if h.strip()]
        except OSError:
            return False
        if not rank.isdigit() or int(rank) >= len(hosts):
            return False
        mine = hosts[int(rank)]
        try:
            ranked = newest_ranking(self.decisions(), self.stack, self.deployment, mine)
        except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
            print(f"gpuinfra-job: cannot read the rank decisions: {exc}", flush=True)
            return False
        if not ranked or int(rank) >= len(ranked) or ranked[int(rank)] != mine or ranked[0] == master:
            return False
        try:
            for address in ranked:
                ipaddress.IPv4Address(address)
        except ValueError as exc:
            print(f"gpuinfra-job: ignoring a rank decision with a bad address: {exc}", flush=True)
            return False
        lines = self.cluster_env.read_text().splitlines()
        text = "".join(f"MASTER_ADDR={ranked[0]}\n" if ln.startswith("MASTER_ADDR=") else f"{ln}\n" for ln in lines)
        for path, body in ((self.hostfile, "".join(f"{a}\n" for a in ranked)), (self.cluster_env, text)):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(body)
            os.replace(tmp, path)
        self.note(f"gpuinfra-job: rank 0 is now {ranked[0]} (was {master}): MASTER_ADDR rewritten")
        return True

    def note(self, text: str) -> None:
        """A line of the job unit's own in the job's log (and the journal)."""
        print(text, flush=True)
        self._add(f"[{self.part}] {text}\n")

    def _add(self, text: str) -> None:
        """Keep one prefixed line for the next chunk and append it to the local log."""
        with self.lock:
            self.lines.append(text)
        with self.writing:  # the output reader and the unit's own notes: one writer at a time
            self._append_local(text)

    def _append_local(self, text: str) -> None:
        if self.local_log is None:
            return
        try:
            out = self._local
            if out is None:
                self.local_log.parent.mkdir(parents=True, exist_ok=True)
                out = self._local = self.local_log.open("a", encoding="utf-8", errors="replace")
            out.write(text)
            out.flush()
            if out.tell() >= LOCAL_LOG_BYTES:
                out.close()
                self._local = None
                os.replace(self.local_log, self.local_log.with_name(self.local_log.name + ".1"))
        except OSError as exc:  # the bucket still gets every line: never stop the job for this file
            print(f"gpuinfra-job: local log {self.local_log} off: {exc}", flush=True)
            self.local_log = None

    def await_rank0(self, wait_seconds: float = RANK0_WAIT_SECONDS, poll_seconds: float = POLL_SECONDS) -> None:
        """Before an attempt on a node that does not host the rendezvous (``NODE_RANK`` != 0):
        return once rank 0's rendezvous port (``MASTER_ADDR:MASTER_PORT``) accepts a connection or
        :meth:`follow_rank0` moved rank 0, or after ``wait_seconds``; or at once when the spec
        says the job is cancelled or replaced (``cancel_seen``)."""
        if self.cluster_env is None:
            return
        deadline = time.monotonic() + wait_seconds
        while not self.follow_rank0() and _value(self.cluster_env, "NODE_RANK") not in ("0", ""):
            current = self.read_spec()  # a cancel (or another job) ends the wait: no billing through it
            if current is not None and (current.cancel or current.id != self.status.get("job")):
                self.cancel_seen = True
                return
            master, port = _value(self.cluster_env, "MASTER_ADDR"), _value(self.cluster_env, "MASTER_PORT")
            try:
                socket.create_connection((master, int(port)), 3).close()
                return
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                self.note(f"gpuinfra-job: rank 0 ({master}) still unreachable after {wait_seconds:.0f} s")
                return
            time.sleep(poll_seconds)

    # ---------------------------------------------------------------- the job
    def command(self, spec: JobSpec) -> tuple[list[str], dict[str, str]]:
        """(``gpuinfra-run`` argv, its environment: the spec's env and resolved secrets).

        Raises:
            ValueError: a secret outside the stack's names; OSError / subprocess errors: a
                secret cannot be read.
        """
        env = dict(spec.env)
        for var, name in spec.secrets.items():
            argv = secret_command(self.cloud, self.secret_scope, name)
            env[var] = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout.rstrip("\n")
        low = spec.min_nodes or self.nnodes
        argv = [self.run_path, "--name", "gpuinfra-job", "--rdzv-id", spec.id, "--nnodes", f"{low}:{self.nnodes}"]
        if spec.image:
            argv += ["--image", spec.image]
        if spec.nproc_per_node:
            argv += ["--nproc-per-node", str(spec.nproc_per_node)]
        outputs = f"{self.scratch}/outputs"
        env["GPUINFRA_OUTPUT_DIR"] = outputs
        env["GPUINFRA_JOB_ID"] = spec.id
        for var in env:
            argv += ["-e", var]  # gpuinfra-run takes each value from its environment: off the command line
        return [*argv, "--", *spec.argv], env

    def _read(self, proc: subprocess.Popen, spec: JobSpec) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            print(line, end="", flush=True)
            self._add(f"[{self.part}] {line}" if line.endswith("\n") else f"[{self.part}] {line}\n")
            failed = _WORKER_FAILED.search(line)
            if failed and self.worker_failed is None:
                self.worker_failed = (time.monotonic(), int(failed.group(1)) or 1)
            progress = progress_of(line)
            if progress:
                self.status["progress"] = progress
                redo, self.redo = self.redo, None
                if redo is not None:  # the first step after a restart: it resumed at the step before
                    redo["resumed_at_step"] = progress["step"] - 1
                    redo["steps_redone"] = max(0, (redo["step"] or 0) - redo["resumed_at_step"])

    def _stop(self, proc: subprocess.Popen) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(STOP_GRACE_SECONDS)
                return
            except subprocess.TimeoutExpired:
                continue

    def attempt(self, spec: JobSpec) -> tuple[int, str]:
        """Run the job once. Returns (exit code, why it stopped early: ``cancelled``, a hang
        cause, or "")."""
        argv, env = self.command(spec)
        Path(f"{self.scratch}/outputs").mkdir(parents=True, exist_ok=True)
        workdir = spec.workdir or self.scratch
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            env={**os.environ, **env}, cwd=workdir, start_new_session=True,
        )  # fmt: skip
        self.worker_failed, self.cancel_seen = None, False
        reader = threading.Thread(target=self._read, args=(proc, spec), daemon=True)
        reader.start()
        stop = threading.Event()
        threading.Thread(target=self._bucket_io, args=(spec, stop), daemon=True).start()
        mark, why = self.state_dir / JOB_RESTART_MARK, ""
        while proc.poll() is None:
            time.sleep(1)
            failed = self.worker_failed
            if failed and time.monotonic() - failed[0] >= WORKER_FAILED_GRACE_SECONDS:
                self.note(f"gpuinfra-job: a worker failed (exit status {failed[1]}); stopping torchrun's exit barrier")
                self._stop(proc)
                break
            if mark.exists():
                why = "hang: " + mark.read_text().strip()
                mark.unlink(missing_ok=True)
            elif self.cancel_seen:
                why = "cancelled"
            if why:
                self._stop(proc)
                break
        stop.set()
        proc.wait()
        reader.join(30)
        self.flush_log(spec)
        failed = self.worker_failed
        return (failed[1] if failed and proc.returncode else proc.returncode), why

    def _bucket_io(self, spec: JobSpec, stop: threading.Event) -> None:
        """An attempt's bucket calls, off the loop that watches the job (a bucket call may take
        up to its 60 s timeout, which must not delay stopping or ending an attempt): the spec
        every :data:`POLL_SECONDS` (a cancel, or another job, sets ``cancel_seen``) and the log
        chunks."""
        last_spec = time.monotonic()
        while not stop.wait(1):
            if time.monotonic() - last_spec >= POLL_SECONDS:
                last_spec = time.monotonic()
                current = self.read_spec()
                if current is not None and (current.cancel or current.id != spec.id):
                    self.cancel_seen = True
            if self.lines and self._due():
                self.flush_log(spec)

    def _due(self) -> bool:
        now = time.monotonic()
        size = sum(len(line) for line in self.lines)
        if size >= LOG_CHUNK_BYTES or now - getattr(self, "_flushed", 0.0) >= LOG_CHUNK_SECONDS:
            self._flushed = now
            return True
        return False

    def run(self, spec: JobSpec) -> str:
        """Run ``spec`` with its restart policy, then record the end. Returns the final state."""
        if not self.status:
            self.status = self.inherited(spec)
            self.seq = self.next_log_seq(spec)
        restarts: list[dict] = self.status.get("restarts", [])
        self.put_status(spec, state="running", restarts=restarts, exit_code=None, started_at=utc_now())
        self.await_rank0()
        code = 0
        while True:
            if self.cancel_seen:  # while it waited for rank 0: no attempt
                state = "cancelled"
                break
            try:
                code, why = self.attempt(spec)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                code, why = 127, ""
                self._add(f"[{self.part}] gpuinfra-job: cannot start the job: {exc}\n")
                self.flush_log(spec)
            if why == "cancelled":
                state = "cancelled"
                break
            if code == 0 and not why:
                state = "succeeded"
                break
            cause = why or f"exit status {code}"
            if spec.restart != "on-failure" or len(restarts) >= spec.max_restarts:
                state = "failed"
                break
            self.redo = {"at": utc_now(), "cause": cause, "step": self.status.get("progress", {}).get("step")}
            restarts.append(self.redo)
            self.put_status(spec, state="running", restarts=restarts, last_exit_code=code)
            self.await_rank0()
        self.finish(spec, state, code)
        return state

    def inherited(self, spec: JobSpec) -> dict:
        """What this node takes over of its part's status (module docstring): a replacement
        continues the restarts of the node whose rank it took, so the job's restart count (and
        ``max_restarts``) is the cluster's, not reset by a new node; ``replaces`` names that node."""
        try:
            doc = json.loads(self.bucket.get_text(status_key(self.stack, spec.id, self.part), 60))
        except (OSError, ValueError, subprocess.SubprocessError, TimeoutError):
            return {}
        if not isinstance(doc, dict) or doc.get("job") != spec.id or not isinstance(doc.get("restarts"), list):
            return {}
        kept = {"restarts": doc["restarts"]}
        return {**kept, "replaces": doc["node"]} if doc.get("node") not in (None, self.node) else kept

    def next_log_seq(self, spec: JobSpec) -> int:
        """The first free chunk number of this node's part: after the chunks a node that held the
        part before wrote (a replacement, or this node's job unit before a restart), which stay,
        and which ``logs -f`` (it remembers the keys it printed) would never show again. Chunks
        are numbered from 0 without gaps: found with O(log n) reads; a read that fails counts as
        free."""

        def taken(seq: int) -> bool:
            try:
                self.bucket.get_text(log_key(self.stack, spec.id, self.part, seq), 60)
                return True
            except (OSError, subprocess.SubprocessError, TimeoutError):
                return False

        if not taken(0):
            return 0
        low, high = 0, 1
        while taken(high):
            low, high = high, high * 2
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if taken(mid) else (low, mid)
        return high

    def finish(self, spec: JobSpec, state: str, code: int) -> None:
        """Upload the outputs (bounded), the status and the final object; write the done mark."""
        outputs = Path(f"{self.scratch}/outputs")
        try:
            if outputs.is_dir() and any(outputs.iterdir()):
                key = f"{job_prefix(self.stack, spec.id)}/outputs/{self.part}"
                self.bucket.put_tree(outputs, key, OUTPUT_SYNC_SECONDS)
        except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
            print(f"gpuinfra-job: outputs upload failed: {exc}", flush=True)
        self.put_status(spec, state=state, exit_code=code, finished_at=utc_now())
        final = {"job": spec.id, "state": state, "exit_code": code, "node": self.node, "at": utc_now()}
        try:
            self.bucket.put_text(final_key(self.stack, spec.id), json.dumps(final) + "\n", 60)
        except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
            print(f"gpuinfra-job: final upload failed: {exc}", flush=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / JOB_DONE_MARK).write_text(f"job {spec.id} {state} (exit status {code})\n")

    def serve(self, poll_seconds: float = POLL_SECONDS) -> int:
        """Wait for a job that is not finished, run it, and return 0 once it is over (the node
        then ends). A finished or cancelled job seen at start also ends the node."""
        while True:
            spec = self.read_spec()
            if spec is not None:
                if spec.cancel or self.finished(spec.id):
                    self.state_dir.mkdir(parents=True, exist_ok=True)
                    (self.state_dir / JOB_DONE_MARK).write_text(f"job {spec.id} is over\n")
                    return 0
                self.run(spec)
                return 0
            time.sleep(poll_seconds)


def _value(path: Path, key: str) -> str:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(f"{key}="):
                return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


def main(argv: list[str] | None = None) -> int:
    """``python3 -m gpuinfra.agent.job [--config /etc/gpuinfra/node.env]``: the node's job unit.
    Waits for the ranks (cluster.env), then :meth:`JobRunner.serve`."""
    import argparse

    # imported here: node -> watch -> job at import, so job importing node at the top would be a cycle
    from gpuinfra.agent import checkpoints
    from gpuinfra.agent import node as agent_node
    from gpuinfra.health import node as health_node

    parser = argparse.ArgumentParser(description="gpuinfra job unit")
    parser.add_argument("--config", type=Path, default=Path("/etc/gpuinfra/node.env"))
    args = parser.parse_args(argv)
    config = agent_node.AgentConfig.from_env_file(args.config)
    while not _value(checkpoints.CLUSTER_ENV, "NNODES").isdigit():
        time.sleep(5)
    metadata = agent_node.AwsMetadata() if config.cloud == "aws" else agent_node.GcpMetadata()
    node = agent_node.node_name(metadata)
    scratch = config.env.get("GPUINFRA_SCRATCH") or "/scratch"
    decisions = health_node.Bucket(config.cloud, config.bucket)
    runner = JobRunner(
        checkpoints.Bucket(config.cloud, config.bucket), config.cloud, config.stack,
        checkpoints.node_part(node), node, int(_value(checkpoints.CLUSTER_ENV, "NNODES")), scratch,
        deployment=config.env.get("GPUINFRA_DEPLOYMENT") or "", cluster_env=health_node.CLUSTER_ENV_PATH,
        hostfile=health_node.HOSTFILE_PATH,
        decisions=lambda: decisions.read_prefix(f"{health_node.HEALTH_PREFIX}/{config.stack}/"),
        secret_scope=config.env.get("GPUINFRA_STACK_ID") or config.stack, local_log=LOCAL_LOG,
    )  # fmt: skip
    return runner.serve()


if __name__ == "__main__":
    sys.exit(main())
