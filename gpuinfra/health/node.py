"""The health gate as a node runs it at boot (``gpuinfra-health.service``), before ranks are assigned.

Standard library only: the node bundle (:mod:`gpuinfra.plan.node_bundle`) copies this
package's stdlib modules to ``/usr/local/lib/gpuinfra/gpuinfra/`` and the units run
``python3 -m gpuinfra.health.node``. Three commands:

``local``
    Runs the node's own checks (``nvidia-smi`` query, ``nvidia-smi nvlink -s``, the fabric
    manager unit, ``fi_info -p efa``: :data:`gpuinfra.health.parsers` commands), decides them
    with the expectations the deploy step wrote (``/etc/gpuinfra/health-expectations.json``,
    :class:`~gpuinfra.health.gate.Expectations`), and uploads the ``local`` stage document to
    ``<bucket>/health/<stack>/<node>.json``. With ``GPUINFRA_HEALTH_GATE=enforce`` a node that
    fails is marked excluded (``/run/gpuinfra/health-excluded``) and ended the way the node
    agent ends it (AWS instance-initiated shutdown = terminate; GCP leaves its managed instance
    group).
``peers [--stored-only] ADDRESS...``
    With ``--stored-only`` (``gpuinfra-cluster-env`` while it lists fewer nodes than the stack
    has): the ranking this deployment already decided, when it ranks this node and every node it
    ranks is listed (a node whose first ``peers`` call failed, retrying after a node the gate left
    out has ended), else :data:`EXIT_UNDECIDED`. Without it: used by ``gpuinfra-cluster-env`` once
    all nodes are listed: prints the addresses that may
    take a rank, one per line. With ``report`` all of them. With ``enforce`` the cluster's one
    rank decision (:mod:`gpuinfra.health.ranks`): the one stored in the bucket when a node
    stored it; else, once every listed address has a result (:data:`HEALTH_RESULT_WAIT_SECONDS` at
    most), the addresses whose result passed (a node without a result by then is left out
    too), stored create-only, or the decision another node stored first. Exit
    :data:`EXIT_EXCLUDED` when this node is not among them (it gets no rank),
    :data:`EXIT_UNDECIDED` (nothing printed) when no decision could be stored or read.
``cluster``
    Once ``/etc/gpuinfra/cluster.env`` exists: runs the cluster all-reduce
    (:mod:`gpuinfra.health.allreduce`) through ``gpuinfra-run`` with ``NCCL_DEBUG=INFO`` on
    every node that has a rank, decides every check (``cluster`` stage), uploads the document
    and writes ``/run/gpuinfra/health-passed`` or ``health-failed``; ``gpuinfra-run`` waits for
    one of them before it starts a training job (unless the gate is ``off``).

``run`` does ``local`` then ``cluster`` (the unit's command). With ``enforce``, a node that
failed its local checks ends itself only once ranks are decided (``gpuinfra-cluster-env``
writes ``/run/gpuinfra/ranks-decided``), so the peers never list one node fewer than they wait
for. Results are matched to peers by the private address written into each document; a result
of another deployment (``GPUINFRA_DEPLOYMENT`` of node.env: a new id at every ``gpuinfra up``
that creates the nodes), or checked before the stack file was written (``results_not_before``
in the expectations file), does not count; nor does another deployment's rank decision.

The cluster stage checks the world the ranks were given: when the gate left nodes out,
``NNODES`` in ``cluster.env`` is smaller than the stack's node count, and the expectations (rank
count, bandwidth baseline for that node count from the expectations file's
``world_baselines``) follow it.

After a reboot (``/var/lib/gpuinfra/health-cluster.json`` holds this node's passed cluster
result of this stack) the peers do not run the all-reduce again, so the node runs its local
checks and, when they pass, keeps the earlier all-reduce checks (their detail says when they
were measured) instead of waiting for an all-reduce no peer joins.

Bucket reads and writes go through the clouds' CLIs, which the DLAMI (``aws``) and DLVM
(``gcloud``) images ship, so the node needs no Python package.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from gpuinfra.errors import PreconditionFailed
from gpuinfra.health import parsers as p
from gpuinfra.health.baselines import Baseline
from gpuinfra.health.gate import (
    ALL_REDUCE_CHECKS,
    HEALTH_PREFIX,
    Expectations,
    GateOutputs,
    NodeHealth,
    decide,
    health_key,
)
from gpuinfra.health.ranks import DecisionScope, settle

STATE_DIR = Path("/run/gpuinfra")
PASSED_MARK = "health-passed"
FAILED_MARK = "health-failed"
EXCLUDED_MARK = "health-excluded"
#: Written by gpuinfra-cluster-env once this node's rank (or its exclusion) is decided.
RANKS_DECIDED_MARK = "ranks-decided"
#: This node's last passed cluster-stage result, kept across reboots (boot disk).
KEPT_RESULT_PATH = Path("/var/lib/gpuinfra/health-cluster.json")
#: The ranking gpuinfra-cluster-env decided with the gate (boot disk): reused while its nodes are
#: listed, so a reboot or retry of a cluster the gate shrank gets the same ranks again.
KEPT_RANKS_PATH = Path("/var/lib/gpuinfra/ranked-hostfile")
EXPECTATIONS_PATH = Path("/etc/gpuinfra/health-expectations.json")
NODE_ENV_PATH = Path("/etc/gpuinfra/node.env")
CLUSTER_ENV_PATH = Path("/etc/gpuinfra/cluster.env")
#: The ranked nodes' addresses, rank order (written with cluster.env by gpuinfra-cluster-env).
HOSTFILE_PATH = Path("/etc/gpuinfra/hostfile")
RUN_SCRIPT = "/usr/local/bin/gpuinfra-run"
#: Where the node's copy of gpuinfra's modules lives (PYTHONPATH of the units) and, beside them,
#: ``gpuinfra_allreduce.py`` (gpuinfra-run mounts the working folder into the container).
NODE_LIB = "/usr/local/lib/gpuinfra"
ALLREDUCE_DIR = NODE_LIB
ALLREDUCE_SCRIPT = "gpuinfra_allreduce.py"
ALLREDUCE_CONTAINER = "gpuinfra-health-allreduce"
#: How long peers wait for every node's local result: the AWS EFA image build at boot takes
#: minutes before the node's checks run (gpuinfra/plan/fabric.py).
HEALTH_RESULT_WAIT_SECONDS = 2700
#: Longest the cluster all-reduce may take (12 sizes up to 2 GiB take seconds; NCCL set-up over
#: a slow fabric and the container start take the rest).
ALLREDUCE_TIMEOUT_SECONDS = 1200
EXIT_EXCLUDED = 3
EXIT_FAILED = 4
#: ``peers``: no rank decision could be stored or read (gpuinfra-cluster-env tries again later).
EXIT_UNDECIDED = 5
MODES = ("enforce", "report", "off")
#: fi_info from the EFA installer's prefix first (not on PATH of a systemd unit).
FI_INFO = ("/opt/amazon/efa/bin/fi_info", "fi_info")

Runner = Callable[[list[str], float], tuple[int, str]]


def run_command(argv: list[str], timeout: float, cwd: str | None = None) -> tuple[int, str]:
    """``(exit code, stdout + stderr)``; 127 when the program is missing, 124 on timeout."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found\n"
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        return 124, (
            out.decode(errors="replace") if isinstance(out, bytes) else out
        ) + f"\ntimed out after {timeout} s\n"
    return done.returncode, done.stdout + done.stderr


@dataclass(frozen=True)
class NodeConfig:
    """What the runner reads from node.env: cloud, stack, bucket, the gate's mode and the
    deployment id ("" when node.env has none)."""

    cloud: str
    stack: str
    bucket: str
    mode: str
    dry_run: bool = False
    deployment: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str]) -> NodeConfig:
        """From parsed node.env (:func:`gpuinfra.agent.node.parse_node_env`).

        Raises:
            ValueError: an unknown mode.
        """
        mode = env.get("GPUINFRA_HEALTH_GATE") or "off"
        if mode not in MODES:
            raise ValueError(f"GPUINFRA_HEALTH_GATE={mode!r}, allowed: {', '.join(MODES)}")
        return cls(
            env["GPUINFRA_CLOUD"],
            env["GPUINFRA_STACK"],
            env["GPUINFRA_BUCKET"],
            mode,
            env.get("GPUINFRA_AGENT_DRY_RUN") == "1",
            env.get("GPUINFRA_DEPLOYMENT") or "",
        )


class Bucket:
    """The stack bucket through the cloud's CLI (``aws s3`` / ``gcloud storage``)."""

    def __init__(self, cloud: str, bucket: str, runner: Runner = run_command) -> None:
        self.scheme = "s3" if cloud == "aws" else "gs"
        self.cloud, self.bucket, self.runner = cloud, bucket, runner

    def url(self, key: str) -> str:
        """``s3://bucket/key`` / ``gs://bucket/key``."""
        return f"{self.scheme}://{self.bucket}/{key}"

    def put(self, key: str, path: Path) -> None:
        """Upload ``path`` to ``key``.

        Raises:
            OSError: the CLI failed.
        """
        argv = (
            ["aws", "s3", "cp", "--only-show-errors", str(path), self.url(key)]
            if self.cloud == "aws"
            else ["gcloud", "storage", "cp", str(path), self.url(key)]
        )
        rc, out = self.runner(argv, 120)
        if rc:
            raise OSError(f"upload to {self.url(key)} failed ({rc}): {out.strip()[-300:]}")

    def put_new(self, key: str, path: Path) -> None:
        """Upload ``path`` to ``key`` only when no object has that key (create-only).

        AWS: ``aws s3api put-object --if-none-match "*"``: S3 answers 412 PreconditionFailed when
        the key exists (docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html;
        option: awscli.amazonaws.com/v2/documentation/api/latest/reference/s3api/put-object.html,
        added in AWS CLI 2.17.34 / 1.34.2 of 2024-08-20, aws/aws-cli .changes/2.17.34.json). A
        concurrent write may get 409 ConditionalRequestConflict instead: an ordinary failure here.
        GCP: ``gcloud storage cp --if-generation-match=0`` (cloud.google.com/sdk/gcloud/reference/
        storage/cp): generation 0 = no live version, 412 otherwise
        (cloud.google.com/storage/docs/request-preconditions); gcloud prints ``HTTPError 412``.

        Raises:
            PreconditionFailed: the key exists.
            OSError: the CLI failed otherwise.
        """
        argv = (
            [
                "aws",
                "s3api",
                "put-object",
                "--bucket",
                self.bucket,
                "--key",
                key,
                "--body",
                str(path),
                "--if-none-match",
                "*",
            ]
            if self.cloud == "aws"
            else ["gcloud", "storage", "cp", "--if-generation-match=0", str(path), self.url(key)]
        )
        rc, out = self.runner(argv, 120)
        if not rc:
            return
        tail = out.strip()[-300:]
        if "(PreconditionFailed)" in out or "HTTPError 412" in out:
            raise PreconditionFailed(f"{self.url(key)} exists: {tail}")
        raise OSError(f"create-only upload to {self.url(key)} failed ({rc}): {tail}")

    def read_prefix(self, prefix: str) -> dict[str, bytes]:
        """Every object under ``prefix`` (key -> body); {} when there is none.

        Raises:
            OSError: the CLI failed.
        """
        with tempfile.TemporaryDirectory() as tmp:
            argv = (
                ["aws", "s3", "cp", "--only-show-errors", "--recursive", self.url(prefix), tmp]
                if self.cloud == "aws"
                else ["gcloud", "storage", "cp", "--recursive", self.url(prefix + "*"), tmp]
            )
            rc, out = self.runner(argv, 120)
            if rc and not (self.cloud == "gcp" and "matched no objects" in out.lower()):
                raise OSError(f"listing {self.url(prefix)} failed ({rc}): {out.strip()[-300:]}")
            root = Path(tmp)
            return {prefix + str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def collect_local(exp: Expectations, runner: Runner = run_command) -> GateOutputs:
    """The node's own command outputs; a command that could not run gives None (its check fails
    "not run"), except the fabric manager, whose ``systemctl is-active`` prints the state even
    with a non-zero exit."""

    def out(argv: list[str], keep_failed: bool = False) -> str | None:
        rc, text = runner(argv, 120)
        return text if rc == 0 or (keep_failed and rc not in (124, 127)) else None

    smi = out(p.NVIDIA_SMI_QUERY.split())
    nvlink = out(p.NVLINK_STATUS_COMMAND.split()) if exp.nvswitch else None
    fabric = out(p.FABRIC_MANAGER_COMMAND.split(), keep_failed=True) if exp.nvswitch else None
    fi_info = None
    if exp.efa_count:
        for binary in FI_INFO:
            if (fi_info := out([binary, "-p", "efa"])) is not None:
                break
    return GateOutputs(nvidia_smi=smi, nvlink_status=nvlink, fabric_manager=fabric, fi_info=fi_info)


def current_results(
    docs: dict[str, bytes], stack: str, not_before: datetime, deployment: str = ""
) -> dict[str, NodeHealth]:
    """Readable results of ``stack`` and ``deployment`` checked at or after ``not_before``, by
    address (the newest per address)."""
    by_address: dict[str, NodeHealth] = {}
    for body in docs.values():
        try:
            health = NodeHealth.from_dict(json.loads(body))
            checked = datetime.fromisoformat(health.checked_at)
        except ValueError:
            continue
        if health.stack != stack or health.deployment != deployment or not health.address:
            continue
        if checked.tzinfo is None or checked < not_before:
            continue
        old = by_address.get(health.address)
        if old is None or old.checked_at <= health.checked_at:
            by_address[health.address] = health
    return by_address


def ranked_addresses(addresses: list[str], results: dict[str, NodeHealth], mode: str) -> list[str]:
    """Addresses that take a rank, in the given order: all of them with ``report``; with
    ``enforce`` those whose result passed (``local`` or ``cluster`` stage)."""
    if mode != "enforce":
        return list(addresses)
    return [a for a in addresses if a in results and results[a].passed]


@dataclass
class HealthNode:
    """One node's gate (tests build it with a fake runner, bucket and identity)."""

    config: NodeConfig
    expectations: Expectations
    node: str
    address: str
    bucket: Bucket
    runner: Runner = run_command
    state_dir: Path = STATE_DIR
    end_node: Callable[[str], None] | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    #: node count -> baseline (dict form) for a world the gate shrank; from the expectations file
    world_baselines: dict[int, dict | None] = field(default_factory=dict)
    results_not_before: datetime | None = None
    kept_result: Path = KEPT_RESULT_PATH

    def _mark(self, name: str, text: str = "") -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if name in (PASSED_MARK, FAILED_MARK):  # one verdict at a time
            for other in {PASSED_MARK, FAILED_MARK} - {name}:
                (self.state_dir / other).unlink(missing_ok=True)
        (self.state_dir / name).write_text(text)

    def publish(self, health: NodeHealth) -> None:
        """Write the result to ``/run/gpuinfra/health.json`` and upload it."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / "health.json"
        path.write_text(health.to_json())
        self.bucket.put(health_key(self.config.stack, self.node), path)

    def _decide(self, outputs: GateOutputs, stage: str) -> NodeHealth:
        return decide(
            self.expectations,
            outputs,
            stack=self.config.stack,
            node=self.node,
            stage=stage,
            address=self.address,
            deployment=self.config.deployment,
        )

    def local(self) -> NodeHealth:
        """The ``local`` stage: checks, upload; with ``enforce`` a failure is the verdict and the
        exclusion mark (the node is ended by :meth:`end_when_ranks_decided`); with ``report``
        the verdict waits for the cluster stage (the node still takes a rank)."""
        for mark in (PASSED_MARK, FAILED_MARK, EXCLUDED_MARK):
            (self.state_dir / mark).unlink(missing_ok=True)
        health = self._decide(collect_local(self.expectations, self.runner), "local")
        self.publish(health)
        if not health.passed and self.config.mode == "enforce":  # final: no rank, the node ends
            reason = _reasons(health)
            self._mark(FAILED_MARK, reason + "\n")
            self._mark(EXCLUDED_MARK, reason + "\n")
        return health

    def end_when_ranks_decided(
        self, health: NodeHealth, wait_seconds: float = HEALTH_RESULT_WAIT_SECONDS + 600, poll_seconds: float = 10.0
    ) -> None:
        """End an excluded node once gpuinfra-cluster-env decided the ranks (or after
        ``wait_seconds``): ending earlier would leave the peers listing one node fewer than
        they wait for. A failed end call is printed, not raised: the node agent ends a node the
        gate left out too, and retries until it is gone (the verdict marks stay as they are)."""
        deadline = self.clock() + wait_seconds
        while not (self.state_dir / RANKS_DECIDED_MARK).exists() and self.clock() < deadline:
            self.sleep(poll_seconds)
        if self.end_node and not self.config.dry_run:
            try:
                self.end_node(f"health gate failed: {_reasons(health)}")
            except (OSError, subprocess.SubprocessError) as exc:  # the node agent ends it, retrying
                print(f"gpuinfra-health: ending this node failed, the node agent retries: {exc!r}", file=sys.stderr)

    def peers(
        self, addresses: list[str], wait_seconds: float = HEALTH_RESULT_WAIT_SECONDS, poll_seconds: float = 15.0
    ) -> list[str]:
        """Addresses that take a rank, in rank order; with ``report`` at once (all of them).
        With ``enforce`` the cluster's one decision (:mod:`gpuinfra.health.ranks`): the stored
        one as soon as there is one; for a node that passed its checks and that an earlier
        decision of this deployment does not rank (a replacement), that decision with this node
        in a lost node's slot (:meth:`~gpuinfra.health.ranks.DecisionScope.takeover`); else, once every address has a result or after
        ``wait_seconds``, this node's :func:`ranked_addresses`, stored create-only (or the
        decision another node stored first).

        Raises:
            OSError: the results could not be read; :class:`~gpuinfra.health.ranks.RankDecisionError`:
                no decision could be stored or read back (this node's own is never used then).
        """
        if self.config.mode != "enforce":
            return list(addresses)
        prefix = f"{HEALTH_PREFIX}/{self.config.stack}/"
        not_before = self.results_not_before or datetime.min.replace(tzinfo=timezone.utc)
        scope = self._scope(addresses)
        deadline = self.clock() + wait_seconds
        while True:
            docs = self.bucket.read_prefix(prefix)
            if (stored := scope.stored(docs)) is not None:
                return list(stored.ranked)
            results = current_results(docs, self.config.stack, not_before, self.config.deployment)
            mine = results.get(self.address)
            # a node booting after its cluster formed (a replacement) takes a lost node's rank,
            # once its own checks passed; the survivors' ranks stand
            if mine is not None and mine.passed and (taken := scope.takeover(docs, self.address)):
                proposal = scope.propose(taken, results, self.node, self.address, "replacement")
                return list(
                    settle(self.bucket, scope, proposal, lambda: self.bucket.read_prefix(prefix), self.sleep).ranked
                )
            complete = all(a in results for a in addresses)
            if complete or self.clock() >= deadline:
                proposal = scope.propose(
                    ranked_addresses(addresses, results, self.config.mode),
                    results,
                    self.node,
                    self.address,
                    "all-results" if complete else "deadline",
                )
                return list(
                    settle(self.bucket, scope, proposal, lambda: self.bucket.read_prefix(prefix), self.sleep).ranked
                )
            self.sleep(poll_seconds)

    def _scope(self, addresses: list[str]) -> DecisionScope:
        return DecisionScope(self.config.stack, tuple(addresses), self.results_not_before, self.config.deployment)

    def stored_ranking(self, addresses: list[str]) -> list[str] | None:
        """The ranking this deployment already decided that ranks this node and only ``addresses``
        (:meth:`~gpuinfra.health.ranks.DecisionScope.ranking_of`), or None.

        Raises:
            OSError: the bucket could not be read.
        """
        docs = self.bucket.read_prefix(f"{HEALTH_PREFIX}/{self.config.stack}/")
        return self._scope(addresses).ranking_of(docs, self.address)

    def world(self, nnodes: int) -> Expectations:
        """The expectations for the world the ranks were given (``NNODES`` of cluster.env)."""
        exp = self.expectations
        if nnodes == exp.nodes:
            return exp
        base = self.world_baselines.get(nnodes)
        return replace(exp, nodes=nnodes, baseline=Baseline.from_dict(base) if base else None)

    def cluster(self, nnodes: int | None = None) -> NodeHealth:
        """The ``cluster`` stage over ``nnodes`` nodes (default: the stack's): the all-reduce
        through gpuinfra-run (named container, removed on timeout), every check, upload, mark;
        :meth:`keep` stores a passed result for reboots once the verdict is collective."""
        self.runner(["docker", "rm", "-f", ALLREDUCE_CONTAINER], 60)
        rc, text = self.runner(
            [
                RUN_SCRIPT,
                "--skip-health-gate",
                "--no-restore-wait",  # the gate's all-reduce comes before any job: no checkpoint to wait for
                "--wait",
                "60",
                "--name",
                ALLREDUCE_CONTAINER,
                "--entrypoint",
                "env",
                "-e",
                "NCCL_DEBUG=INFO",
                "-e",
                "NCCL_DEBUG_SUBSYS=INIT,NET",
                "--",
                "python3",
                ALLREDUCE_SCRIPT,
            ],
            ALLREDUCE_TIMEOUT_SECONDS,
        )
        if rc == 124:
            self.runner(["docker", "rm", "-f", ALLREDUCE_CONTAINER], 60)
        exp = self.world(nnodes or self.expectations.nodes)
        outputs = collect_local(exp, self.runner)
        health = decide(
            exp,
            GateOutputs(
                outputs.nvidia_smi, outputs.nvlink_status, outputs.fabric_manager, outputs.fi_info, all_reduce=text
            ),
            stack=self.config.stack,
            node=self.node,
            stage="cluster",
            address=self.address,
            deployment=self.config.deployment,
        )
        self.publish(health)
        if health.passed:
            self._mark(PASSED_MARK, health.checked_at + "\n")
        else:
            self._mark(FAILED_MARK, _reasons(health) + "\n")
        return health

    def await_peers(
        self,
        health: NodeHealth,
        addresses: list[str],
        since: datetime,
        wait_seconds: float = 900,
        poll_seconds: float = 15.0,
    ) -> NodeHealth:
        """The job is collective: this node's ``passed`` verdict stands only when every ranked
        node (``addresses``, the hostfile) uploaded a passed cluster result checked at or after
        ``since``; otherwise the verdict becomes failed, naming the peers (a job started here
        would wait for them forever)."""
        if not health.passed:
            return health
        prefix = f"health/{self.config.stack}/"
        deadline = self.clock() + wait_seconds
        while True:
            results = {
                a: r
                for a, r in current_results(
                    self.bucket.read_prefix(prefix), self.config.stack, since, self.config.deployment
                ).items()
                if r.stage == "cluster" and r.nodes == health.nodes
            }
            missing = [a for a in addresses if a not in results]
            if not missing or self.clock() >= deadline:
                break
            self.sleep(poll_seconds)
        failed = [f"{a} ({_reasons(results[a])})" for a in addresses if a in results and not results[a].passed]
        problems = [f"peer {f} failed" for f in failed] + [f"no cluster result from {a}" for a in missing]
        if problems:
            self._mark(FAILED_MARK, "; ".join(problems) + "\n")
        else:
            self.keep(health)
        return health

    def keep(self, health: NodeHealth) -> None:
        """Store a passed cluster result on the boot disk for :meth:`rejoin` after a reboot."""
        self.kept_result.parent.mkdir(parents=True, exist_ok=True)
        self.kept_result.write_text(health.to_json())

    def rejoin(self, local: NodeHealth) -> NodeHealth | None:
        """After a reboot: this node's kept cluster result with the fresh local checks, or None
        when there is none for this stack and node (then the cluster stage runs)."""
        try:
            kept = NodeHealth.from_dict(json.loads(self.kept_result.read_text()))
        except (OSError, ValueError):
            return None
        if (kept.stack, kept.node, kept.stage) != (self.config.stack, self.node, "cluster") or not kept.passed:
            return None
        if kept.deployment != self.config.deployment:
            return None  # another deployment's
        if self.results_not_before and datetime.fromisoformat(kept.checked_at) < self.results_not_before:
            return None  # another deployment's
        fresh = {c.name: c for c in local.checks}
        checks = tuple(
            fresh[c.name]
            if c.name not in ALL_REDUCE_CHECKS
            else replace(c, detail=f"{c.detail} (cluster all-reduce of {kept.checked_at}, before a reboot)")
            for c in kept.checks
        )
        health = NodeHealth(
            kept.stack,
            kept.node,
            kept.cloud,
            kept.instance_type,
            kept.nodes,
            local.checked_at,
            checks,
            "cluster",
            self.address,
            self.config.deployment,
        )
        self.publish(health)
        self._mark(
            PASSED_MARK if health.passed else FAILED_MARK,
            (health.checked_at if health.passed else _reasons(health)) + "\n",
        )
        return health


def _reasons(health: NodeHealth) -> str:
    return "; ".join(f"{c.name}: {c.detail}" for c in health.failed)


def peers_exit(node: HealthNode, addresses: list[str], out=None, err=None) -> int:
    """``peers``: print the ranked addresses (``out``, default stdout) and return the exit code:
    0 this node has a rank, :data:`EXIT_EXCLUDED` it has none, :data:`EXIT_UNDECIDED` no
    decision could be stored or read (one line on ``err``, nothing on ``out``)."""
    try:
        ranked = node.peers(addresses)
    except OSError as exc:  # RankDecisionError included
        print(f"gpuinfra-health: no rank decision, this node takes no rank yet: {exc}", file=err or sys.stderr)
        return EXIT_UNDECIDED
    print("\n".join(ranked), file=out or sys.stdout)
    return 0 if node.address in ranked else EXIT_EXCLUDED


def stored_exit(node: HealthNode, addresses: list[str], out=None, err=None) -> int:
    """``peers --stored-only``: print the ranking this deployment already decided
    (:meth:`HealthNode.stored_ranking`) and return 0, else :data:`EXIT_UNDECIDED` (nothing on
    ``out``)."""
    try:
        ranked = node.stored_ranking(addresses)
    except OSError as exc:
        print(f"gpuinfra-health: no stored rank decision readable: {exc}", file=err or sys.stderr)
        return EXIT_UNDECIDED
    if ranked is None:
        return EXIT_UNDECIDED
    print("\n".join(ranked), file=out or sys.stdout)
    return 0


def cluster_size(path: Path = CLUSTER_ENV_PATH) -> int | None:
    """``NNODES`` of cluster.env, None when absent or unreadable."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("NNODES="):
                return int(line.split("=", 1)[1])
    except (OSError, ValueError):
        return None
    return None


def _build(config: NodeConfig, expectations_path: Path) -> HealthNode:  # pragma: no cover - on a node
    from gpuinfra.agent.node import AwsMetadata, GcpMetadata, end_aws_node, end_gcp_node

    doc = json.loads(expectations_path.read_text())
    exp = Expectations.from_dict(doc)
    gcp_metadata = None if config.cloud == "aws" else GcpMetadata()
    metadata = AwsMetadata() if gcp_metadata is None else gcp_metadata
    end = end_aws_node if config.cloud == "aws" else (lambda reason: end_gcp_node(reason, gcp_metadata))
    runner: Runner = lambda argv, timeout: run_command(argv, timeout, cwd=ALLREDUCE_DIR)  # noqa: E731
    address = metadata.address()
    if not address:
        raise OSError("the metadata service gave no private address")
    not_before = doc.get("results_not_before")
    return HealthNode(
        config,
        exp,
        metadata.node_name(),
        address,
        Bucket(config.cloud, config.bucket),
        runner,
        end_node=end,
        world_baselines={int(k): v for k, v in (doc.get("world_baselines") or {}).items()},
        results_not_before=datetime.fromisoformat(not_before) if not_before else None,
    )


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - on a node
    """``python3 -m gpuinfra.health.node run | local | cluster | peers [--stored-only] ADDRESS...``; exit 0 passed
    (or gate off / report), :data:`EXIT_FAILED` failed with ``enforce``, :data:`EXIT_EXCLUDED`
    this node takes no rank (``peers``), :data:`EXIT_UNDECIDED` no rank decision yet
    (``peers``), 2 bad settings."""
    from gpuinfra.agent.node import parse_node_env

    parser = argparse.ArgumentParser(description="gpuinfra boot health gate")
    parser.add_argument("command", choices=("run", "local", "cluster", "peers"))
    parser.add_argument("addresses", nargs="*")
    parser.add_argument("--stored-only", action="store_true", help="peers: only a ranking already decided")
    parser.add_argument("--config", type=Path, default=NODE_ENV_PATH)
    parser.add_argument("--expectations", type=Path, default=EXPECTATIONS_PATH)
    args = parser.parse_args(argv)
    try:
        config = NodeConfig.from_env(parse_node_env(args.config.read_text()))
    except (OSError, KeyError, ValueError) as exc:
        print(f"gpuinfra-health: cannot read {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.command == "peers":
        if config.mode == "off":
            print("\n".join(args.addresses))
            return 0
        if args.stored_only:
            return stored_exit(_build(config, args.expectations), args.addresses)
        return peers_exit(_build(config, args.expectations), args.addresses)
    if config.mode == "off":
        print("gpuinfra-health: the profile turns the health gate off", file=sys.stderr)
        return 0
    try:
        return _run(config, args)
    except Exception as exc:  # noqa: BLE001 - a crash must still leave a verdict (agent, gpuinfra-run)
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / FAILED_MARK).write_text(f"the health gate crashed: {exc!r}\n")
        print(f"gpuinfra-health: crashed: {exc!r}", file=sys.stderr)
        return EXIT_FAILED


def _run(config: NodeConfig, args) -> int:  # pragma: no cover - on a node
    node = _build(config, args.expectations)
    local = node.local()
    if not local.passed and config.mode == "enforce":
        node.end_when_ranks_decided(local)
        return EXIT_FAILED
    if args.command == "local":
        return 0
    if args.command == "run" and (rejoined := node.rejoin(local)) is not None:
        return 0 if rejoined.passed or config.mode == "report" else EXIT_FAILED
    deadline = time.monotonic() + HEALTH_RESULT_WAIT_SECONDS + 600
    while (nnodes := cluster_size()) is None:
        decided = (STATE_DIR / RANKS_DECIDED_MARK).exists()
        if (STATE_DIR / EXCLUDED_MARK).exists() or decided or time.monotonic() > deadline:
            # ranks were decided without this node, or never: no job can run here
            why = "the peers decided the ranks without this node" if decided else "no ranks after the peer wait"
            node._mark(FAILED_MARK, why + "\n")
            print(f"gpuinfra-health: {why}; the cluster all-reduce did not run", file=sys.stderr)
            return EXIT_EXCLUDED
        time.sleep(10)
    started = datetime.now(timezone.utc)
    health = node.cluster(nnodes)
    try:
        ranked = [line.strip() for line in HOSTFILE_PATH.read_text().splitlines() if line.strip()]
    except OSError:
        ranked = []
    node.await_peers(health, ranked, started - timedelta(minutes=10))
    if (STATE_DIR / FAILED_MARK).exists() and health.passed:
        print(f"gpuinfra-health: {(STATE_DIR / FAILED_MARK).read_text().strip()}", file=sys.stderr)
        return 0 if config.mode == "report" else EXIT_FAILED
    for check in health.failed:
        print(f"gpuinfra-health: FAIL {check.name}: {check.detail}", file=sys.stderr)
    return 0 if health.passed or config.mode == "report" else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
