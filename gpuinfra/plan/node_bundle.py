"""The node bundle: what every GPU node installs at boot beyond its boot script, as one JSON
object in the stack bucket (:func:`bundle_key`: named after its SHA-256).

Why an object: EC2 user data is limited to 16 KB gzip'd
(docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html) and the boot script already holds
the node agent and the scratch script, which must run even when the bucket cannot be read (a
node must still end itself). Everything else -- ``gpuinfra-run``, the health gate, the training
image build, the fabric host stacks and the monitoring agents -- is listed here, fetched by
``gpuinfra-bundle.service`` (``templates/node-bundle-fetch.sh.j2``), written to disk and its
units started. Pulumi creates the object before the nodes (their launch template / instance
template depends on it), so a node never boots before its bundle exists.

Integrity: the boot text carries the bundle's SHA-256 (:meth:`NodeBundle.sha256`) and the object
key is named after it, so a node only ever runs the bundle of its own deployment. The fetch
script checks the download with ``sha256sum -c`` before anything in it is used; on a mismatch it
runs nothing, logs both hashes and writes the ``health-failed`` verdict (the node agent's idle
clock then ends the node). The verified copy is kept at :data:`BUNDLE_CACHE_PATH`: a reboot
uses it (checked again) instead of fetching. A bundle that changes changes the boot text, so
``gpuinfra up`` replaces the nodes (``--replace-nodes``) instead of handing running nodes a
bundle they did not boot with.

The document (:meth:`NodeBundle.to_json`)::

    {"schema_version": "1", "files": [{"path": ..., "mode": "0755", "content": ...}, ...],
     "units": ["gpuinfra-health.service", ...]}

Pure Python, no Pulumi imports.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuinfra.health import node as health_node
from gpuinfra.health.baselines import baseline_nodes, find_baseline
from gpuinfra.health.gate import Expectations
from gpuinfra.plan.monitoring_node import MONITORING_UNITS, monitoring_node_files
from gpuinfra.plan.units import RUN_DIR, NodeFile, SystemdUnit, check_value, command
from gpuinfra.spec import ClusterSpec
from gpuinfra.templating import render

#: Prefix of the object key (:func:`bundle_key`); write-protected from the nodes (blueprints/aws/identity.py).
BUNDLE_PREFIX = "gpuinfra/"
#: The node's verified copy of its bundle (root only, kept across reboots; :func:`fetch_script`).
BUNDLE_CACHE_PATH = "/var/lib/gpuinfra/node-bundle.json"
BUNDLE_SCHEMA_VERSION = "1"
BUNDLE_UNIT = "gpuinfra-bundle.service"
BUNDLE_FETCH_PATH = "/usr/local/sbin/gpuinfra-bundle"
#: Where the node's copy of gpuinfra's standard-library modules lives (PYTHONPATH of the units).
NODE_LIB = health_node.NODE_LIB
HEALTH_UNIT = "gpuinfra-health.service"
EXPECTATIONS_PATH = str(health_node.EXPECTATIONS_PATH)
ALLREDUCE_PATH = f"{health_node.ALLREDUCE_DIR}/{health_node.ALLREDUCE_SCRIPT}"
#: gpuinfra's modules the nodes run (standard library only: gpuinfra/health/__init__.py says so).
NODE_MODULES = (
    "__init__.py",
    "errors.py",
    "agent/__init__.py",
    "agent/constants.py",
    "agent/checkpoints.py",
    "agent/job.py",
    "agent/node.py",
    "agent/replace.py",
    "agent/watch.py",
    "health/__init__.py",
    "health/parsers.py",
    "health/baselines.py",
    "health/gate.py",
    "health/node.py",
    "health/ranks.py",
)
_PACKAGE = Path(__file__).resolve().parents[1]


@dataclass
class NodeBundle:
    """Files and the systemd units to enable and start (``--no-block``), in order."""

    files: list[NodeFile] = field(default_factory=list)
    units: list[str] = field(default_factory=list)

    def add(self, path: str, content: str, mode: str = "0644") -> None:
        """Add a file (content gets a final newline).

        Raises:
            ValueError: the path is not absolute or is already in the bundle.
        """
        if not path.startswith("/"):
            raise ValueError(f"node bundle path {path!r} is not absolute")
        if any(f.path == path for f in self.files):
            raise ValueError(f"node bundle already has {path}")
        self.files.append(NodeFile(path, mode, content))

    def add_unit(self, unit: SystemdUnit) -> None:
        """Add ``unit``'s file (:meth:`SystemdUnit.render`) and, unless another unit starts it
        (``start="none"``), its name to the units the fetch script starts.

        Raises:
            ValueError: the unit file is already in the bundle.
        """
        self.add(unit.path, unit.render())
        if unit.start != "none" and unit.name not in self.units:
            self.units.append(unit.name)

    def add_files(self, files: dict[str, str], units: tuple[str, ...] | list[str] = (), mode: str = "0644") -> None:
        """Add ``path -> content`` files (``.sh`` and ``/bin/`` / ``/sbin/`` paths executable) and units."""
        for path, content in files.items():
            executable = path.endswith(".sh") or "/bin/" in path or "/sbin/" in path
            self.add(path, content, "0755" if executable else mode)
        self.units.extend(u for u in units if u not in self.units)

    def file(self, path: str) -> NodeFile:
        """The file at ``path``.

        Raises:
            KeyError: no such file.
        """
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)

    def sha256(self) -> str:
        """SHA-256 of :meth:`to_json` (UTF-8), 64 lowercase hex digits: the boot text pins it."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @property
    def key(self) -> str:
        """The object key of this bundle (:func:`bundle_key`)."""
        return bundle_key(self.sha256())

    def to_json(self) -> str:
        """The object's body: files sorted by path, so the same bundle gives the same bytes."""
        return (
            json.dumps(
                {
                    "schema_version": BUNDLE_SCHEMA_VERSION,
                    "files": [
                        {"path": f.path, "mode": f.mode, "content": f.content}
                        for f in sorted(self.files, key=lambda f: f.path)
                    ],
                    "units": self.units,
                },
                indent=1,
                sort_keys=False,
            )
            + "\n"
        )


def bundle_key(sha256: str) -> str:
    """``gpuinfra/node-bundle-<sha256>.json``: a bundle's object key, named after its content.

    Raises:
        ValueError: ``sha256`` is not 64 lowercase hex digits.
    """
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"not a SHA-256 hex digest: {sha256!r}")
    return f"{BUNDLE_PREFIX}node-bundle-{sha256}.json"


def node_modules() -> dict[str, str]:
    """gpuinfra's node-side modules at their node paths (``/usr/local/lib/gpuinfra/gpuinfra/...``)."""
    return {f"{NODE_LIB}/gpuinfra/{rel}": (_PACKAGE / rel).read_text() for rel in NODE_MODULES}


def health_unit(after: tuple[str, ...]) -> str:
    """``gpuinfra-health.service`` text (:func:`health_systemd_unit`)."""
    return health_systemd_unit(after).render()


def health_systemd_unit(after: tuple[str, ...]) -> SystemdUnit:
    """``gpuinfra-health.service``: the gate once per boot, after Docker, scratch and ``after``
    (the units that make the training image ready: pre-pull, image build, fabric host stack)."""
    return SystemdUnit(
        HEALTH_UNIT,
        "gpuinfra: boot health gate (local checks, then the cluster all-reduce)",
        wants=("network-online.target",),
        after=("network-online.target", BUNDLE_UNIT, "docker.service", "gpuinfra-scratch.service", *after),
        type="oneshot",
        remain_after_exit=True,
        timeout_start_sec="infinity",
        environment=(("PYTHONPATH", NODE_LIB),),
        exec_start=(command("/usr/bin/python3", "-m", "gpuinfra.health.node", "run"),),
        delivery="bundle",
    )


def expectations_document(spec: ClusterSpec, expectations: Expectations) -> dict:
    """The node's expectations file: :meth:`Expectations.to_dict`, plus ``world_baselines``
    (node count -> baseline, for a cluster the gate shrinks; counts without one are left out)
    and ``results_not_before`` (the stack file's ``created_at``: older results are from an
    earlier deployment)."""
    worlds = {}
    for nodes in baseline_nodes(spec.cloud, spec.instance_type):  # the counts the table has, not 1..N
        base = find_baseline(spec.cloud, spec.instance_type, nodes, expectations.nic_layout)
        if nodes < spec.nodes and base is not None:
            worlds[str(nodes)] = base.to_dict()
    return {**expectations.to_dict(), "world_baselines": worlds, "results_not_before": spec.created_at.isoformat()}


def add_health_gate(
    bundle: NodeBundle, spec: ClusterSpec, expectations: Expectations, after: tuple[str, ...] = ()
) -> None:
    """The health gate's files: gpuinfra's node modules, the all-reduce script, the
    expectations (:func:`expectations_document`) and, unless the profile turns the gate off,
    its unit."""
    bundle.add_files(node_modules())
    bundle.add(ALLREDUCE_PATH, (_PACKAGE / "health" / "allreduce.py").read_text(), "0755")
    bundle.add(EXPECTATIONS_PATH, json.dumps(expectations_document(spec, expectations), indent=1))
    if spec.profile.health_gate != "off":
        bundle.add_unit(health_systemd_unit(after))


#: Restores the newest checkpoint in the bucket before the job starts (``gpuinfra-run`` waits
#: for :data:`gpuinfra.agent.constants.RESUME_FILE_PATH`, which it writes whatever happened).
RESTORE_UNIT = "gpuinfra-restore.service"
#: Seconds a restore may download before the job starts without it (oneshot units have no start
#: timeout by default, systemd.service(5)); the unit writes the resume file either way.
RESTORE_TIMEOUT_SECONDS = 1800


def restore_systemd_unit() -> SystemdUnit:
    """``gpuinfra-restore.service``: once per boot, after the bundle (the module), scratch (the
    checkpoint dir) and the ranks (the key layout is per rank), ``python3 -m
    gpuinfra.agent.checkpoints restore`` (:func:`gpuinfra.agent.checkpoints.restore`)."""
    return SystemdUnit(
        RESTORE_UNIT,
        "gpuinfra: restore the newest complete checkpoint from the stack bucket",
        wants=("network-online.target",),
        after=("network-online.target", BUNDLE_UNIT, "gpuinfra-scratch.service", "gpuinfra-cluster-env.service"),
        type="oneshot",
        remain_after_exit=True,
        timeout_start_sec=RESTORE_TIMEOUT_SECONDS + 60,
        environment=(("PYTHONPATH", NODE_LIB),),
        exec_start=(
            command(
                "/usr/bin/python3",
                "-m",
                "gpuinfra.agent.checkpoints",
                "restore",
                "--timeout-seconds",
                str(RESTORE_TIMEOUT_SECONDS),
            ),
        ),
        delivery="bundle",
    )


def add_checkpoint_restore(bundle: NodeBundle) -> None:
    """The restore unit (the node modules come with :func:`add_health_gate`)."""
    bundle.add_unit(restore_systemd_unit())


#: Runs the stack's job from the bucket on every node (:mod:`gpuinfra.agent.job`; docs/run.md).
JOB_UNIT = "gpuinfra-job.service"


def job_systemd_unit() -> SystemdUnit:
    """``gpuinfra-job.service``: ``python3 -m gpuinfra.agent.job`` after the bundle, scratch, the
    ranks, the health gate and the restore (``gpuinfra-run`` waits for the last three itself,
    bounded); restarted on failure every 30 s without limit (a crash of the unit is not the job's
    failure: the job's own restarts are counted in the bucket). Stopping it ends the job's
    process group (``KillMode=control-group``, systemd.kill(5))."""
    return SystemdUnit(
        JOB_UNIT,
        "gpuinfra: run the stack's job from the bucket (gpuinfra run)",
        wants=("network-online.target",),
        after=("network-online.target", BUNDLE_UNIT, "gpuinfra-scratch.service", "gpuinfra-cluster-env.service"),
        start_limit_interval_sec=0,
        environment=(("PYTHONPATH", NODE_LIB),),
        exec_start=(command("/usr/bin/python3", "-m", "gpuinfra.agent.job"),),
        restart="on-failure",
        restart_sec=30,
        delivery="bundle",
    )


def add_job(bundle: NodeBundle) -> None:
    """The job unit (the node modules come with :func:`add_health_gate`)."""
    bundle.add_unit(job_systemd_unit())


def add_monitoring(bundle: NodeBundle, spec: ClusterSpec, cloud: str) -> None:
    """The monitoring agent's files and unit (:mod:`gpuinfra.plan.monitoring_node`); nothing
    when the profile turns monitoring off."""
    files = monitoring_node_files(spec, cloud)
    if files:
        bundle.add_files(files, MONITORING_UNITS)


def health_template_vars(spec: ClusterSpec) -> dict[str, object]:
    """What ``templates/cluster-env-health.sh.j2`` (included by both clouds' cluster-env
    scripts) needs: the gate's mode and the node runner's paths, exit code and marks."""
    return {
        "health_gate": spec.profile.health_gate,
        "node_lib": NODE_LIB,
        "exit_excluded": health_node.EXIT_EXCLUDED,
        "state_dir": str(health_node.STATE_DIR),
        "ranks_decided_mark": health_node.RANKS_DECIDED_MARK,
        "kept_ranks_path": str(health_node.KEPT_RANKS_PATH),
    }


def fetch_script(cloud: str, bucket: str, sha256: str) -> str:
    """The boot script part that installs the bundle whose SHA-256 is ``sha256``
    (``templates/node-bundle-fetch.sh.j2``): from :data:`BUNDLE_CACHE_PATH` when that copy still
    matches, else fetched from ``bucket`` and checked; never a bundle that does not match.

    Raises:
        ValueError: ``sha256`` is not a SHA-256 hex digest; UnitValueError: a bucket name that
            cannot be written into a script (validated by the cloud before).
    """
    scheme = "s3" if cloud == "aws" else "gs"
    return render(
        "node-bundle-fetch.sh.j2",
        cloud=cloud,
        url=check_value("bucket", f"{scheme}://{bucket}/{bundle_key(sha256)}"),
        sha256=sha256,
        schema_version=BUNDLE_SCHEMA_VERSION,
        run_dir=RUN_DIR,
        cache_path=BUNDLE_CACHE_PATH,
        failed_mark=health_node.FAILED_MARK,
    ).rstrip("\n")


def fetch_systemd_unit() -> SystemdUnit:
    """``gpuinfra-bundle.service``: install the pinned bundle on every boot (the verified local
    copy, else a fetch), retried every 20 s while it fails: the bucket does not answer, the object
    is missing or does not match (``StartLimitIntervalSec=0``: no limit on the retries)."""
    return SystemdUnit(
        BUNDLE_UNIT,
        "gpuinfra: fetch and install the node bundle from the stack bucket",
        wants=("network-online.target",),
        after=("network-online.target",),
        start_limit_interval_sec=0,
        type="oneshot",
        remain_after_exit=True,
        exec_start=(command(BUNDLE_FETCH_PATH),),
        restart="on-failure",
        restart_sec=20,
    )
