"""The node boot manifest: what a GPU node's boot text writes and starts, on either cloud.

:func:`node_boot` builds one :class:`NodeBoot` for a spec and its plan: the files
(:class:`NodeFile`), the systemd units in start order (:class:`SystemdUnit`) and the boot steps
(``systemctl`` calls). Cloud differences are data in the manifest (the scratch unit waits for the
Deep Learning AMI's ``dlami-nvme.service`` on AWS; each cloud has its own peer-discovery script
and NCCL settings; AWS EFA nodes build their image in the bundle instead of pre-pulling it).
Each cloud only serialises the manifest:

* AWS (:func:`gpuinfra.plan.boot_aws.render_user_data`): ``#cloud-config`` ``write_files`` +
  ``runcmd``, dumped with PyYAML's safe dumper (cloud-init runs it on the first boot only:
  https://cloudinit.readthedocs.io/en/latest/reference/modules.html#runcmd).
* GCP (:func:`gpuinfra.plan.boot_gcp.render_startup_script`): a bash startup script that GCE
  runs on every boot, writing each file only when it changed.

The node bundle's units (health gate, image build, fabric host stack, RxDM, monitoring agent)
are :class:`SystemdUnit` records too, with ``delivery="bundle"``
(:mod:`gpuinfra.plan.node_bundle`).

Pure Python, no Pulumi imports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gpuinfra.agent.constants import SCRATCH_MOUNT
from gpuinfra.agent.node import STOP_SYNC_SECONDS
from gpuinfra.errors import UnitValueError
from gpuinfra.oci import check_image_reference
from gpuinfra.plan.fabric import IMAGE_UNIT
from gpuinfra.plan.node_bundle import BUNDLE_FETCH_PATH, fetch_systemd_unit
from gpuinfra.plan.node_files import DOCKER_MEMLOCK_DROPIN, NODE_FILES
from gpuinfra.plan.units import (
    CLUSTER_ENV_PATH,
    ETC_DIR,
    HOSTFILE_PATH,
    NCCL_ENV_PATH,
    NODE_ENV_PATH,
    NODE_LIB,
    SBIN_DIR,
    SCRATCH_FAILED_PATH,
    ExecCommand,
    NodeFile,
    SystemdUnit,
    check_unit_name,
    check_value,
    command,
    shell,
)
from gpuinfra.spec import ClusterSpec
from gpuinfra.templating import agent_source, render

__all__ = [
    "BootStep",
    "NodeBoot",
    "node_boot",
    "AGENT_UNIT",
    "SCRATCH_UNIT",
    "CLUSTER_ENV_UNIT",
    "PREPULL_UNIT",
    "REGISTRY_LOGIN_UNIT",
]

AGENT_UNIT = "gpuinfra-agent.service"
SCRATCH_UNIT = "gpuinfra-scratch.service"
#: The mount unit of :data:`SCRATCH_MOUNT` (systemd.mount(5): named after the escaped path;
#: ``/scratch`` has nothing to escape, checked here).
SCRATCH_MOUNT_UNIT = SCRATCH_MOUNT.strip("/") + ".mount"
if not SCRATCH_MOUNT.strip("/").isalnum():  # a path with '/', '-' or others would need systemd-escape
    raise ImportError(f"SCRATCH_MOUNT {SCRATCH_MOUNT!r}: its mount unit name needs systemd-escape")
CLUSTER_ENV_UNIT = "gpuinfra-cluster-env.service"
#: Pulls the profile's training image once Docker and scratch are up (the health gate's
#: all-reduce runs in it, so the gate is ordered after it on both clouds).
PREPULL_UNIT = "gpuinfra-prepull.service"
#: Logs Docker in to the bake's registry (nodes booted from a baked image; before the pre-pull
#: and the image build, which may need to pull from it).
REGISTRY_LOGIN_UNIT = "gpuinfra-registry-login.service"
#: Units that pull the training image and so start after the registry login.
_PULLING_UNITS = (PREPULL_UNIT, IMAGE_UNIT)
AGENT_PATH = f"{NODE_LIB}/gpuinfra_agent.py"
SCRATCH_SCRIPT_PATH = f"{SBIN_DIR}/gpuinfra-scratch-raid0"
CLUSTER_ENV_SCRIPT_PATH = f"{SBIN_DIR}/gpuinfra-cluster-env"
PROFILE_SCRIPT_PATH = "/etc/profile.d/gpuinfra.sh"
#: The container runtime: scratch is mounted before it starts (Docker's data may live there).
CONTAINER_RUNTIME_UNITS = ("docker.service", "containerd.service")
#: Periodic apt on training nodes: a driver or kernel update in the middle of a run breaks the
#: GPU stack (the apt.conf.d file in gpuinfra/plan/node_files.py turns periodic apt off).
APT_TIMERS = ("apt-daily.timer", "apt-daily-upgrade.timer")
APT_SERVICES = ("apt-daily.service", "apt-daily-upgrade.service", "unattended-upgrades.service")


@dataclass(frozen=True)
class BootStep:
    """One ``systemctl`` call of the boot, in order.

    Attributes:
        argv: the command (``systemctl`` first); every word is a unit name or an option.
        when_changed: a node file path: run only when the boot changed that file (GCP runs the
            boot on every start; AWS runs it once, when every file is new, so always).
        unit: the unit this step starts (empty for other steps).
        status_file: a file whose first line explains a failure of this step (printed on GCP).

    Raises:
        UnitValueError: a word that is neither an option nor a unit name.
    """

    argv: tuple[str, ...]
    when_changed: str = ""
    unit: str = ""
    status_file: str = ""

    def __post_init__(self) -> None:
        if self.argv[:1] != ("systemctl",):
            raise UnitValueError(f"boot step {self.argv!r} is not a systemctl call")
        for word in self.argv[1:]:
            if not re.fullmatch(r"--?[a-z-]+|[a-z-]+", word):
                check_unit_name(word)

    @property
    def no_block(self) -> bool:
        """The step queues its unit's start and does not wait for it (``--no-block``)."""
        return "--no-block" in self.argv


def start_step(unit: SystemdUnit) -> BootStep:
    """The step that enables and starts ``unit`` (``systemctl enable --now [--no-block]``)."""
    flags = ("--no-block",) if unit.start == "no-block" else ()
    return BootStep(("systemctl", "enable", "--now", *flags, unit.name), unit=unit.name, status_file=unit.status_file)


@dataclass(frozen=True)
class NodeBoot:
    """What the boot text of a node does.

    Attributes:
        cloud: ``aws`` | ``gcp``.
        summary: comment lines for the top of the boot text (no newlines).
        files: node files (scripts, settings), unit files not included, each path once.
        units: the units the boot writes, in start order (``delivery="boot"``).
        steps: ``systemctl`` calls in order (apt off, ``daemon-reexec``, unit starts...).

    Raises:
        UnitValueError: a path or unit written twice, or a step starting a unit not listed.
    """

    cloud: Literal["aws", "gcp"]
    summary: tuple[str, ...]
    files: tuple[NodeFile, ...]
    units: tuple[SystemdUnit, ...]
    steps: tuple[BootStep, ...]

    def __post_init__(self) -> None:
        paths = [f.path for f in self.all_files()]
        if len(paths) != len(set(paths)):
            raise UnitValueError(f"a node file is written twice: {sorted(p for p in paths if paths.count(p) > 1)}")
        for line in self.summary:
            check_value("summary line", line)
        names = {u.name for u in self.units}
        for step in self.steps:
            if step.unit and step.unit not in names:
                raise UnitValueError(f"boot step starts {step.unit}, which the boot does not write")

    def all_files(self) -> tuple[NodeFile, ...]:
        """Every file the boot text writes: :attr:`files`, then each unit's file."""
        return (*self.files, *(u.file() for u in self.units))


@dataclass(frozen=True)
class CloudBoot:
    """The cloud's part of :func:`node_boot` (built by the cloud's renderer module).

    Attributes:
        cloud: ``aws`` | ``gcp``.
        summary: comment lines after the one naming the stack, type and profile.
        scratch_script: the scratch unit's script (``templates/scratch-raid0.sh.j2``).
        scratch_after: extra units scratch starts after (``dlami-nvme.service`` on AWS, which
            mounts the instance store itself on the Deep Learning AMI).
        cluster_env_script: the peer-discovery script (``templates/<cloud>-cluster-env.sh.j2``).
        nccl_env: ``/etc/gpuinfra/nccl.env`` settings.
        node_env: ``/etc/gpuinfra/node.env`` text.
        bundle_fetch_script: ``templates/node-bundle-fetch.sh.j2`` rendered for the bucket.
        prepull: the node pre-pulls the profile's container image with :data:`PREPULL_UNIT`
            (False where the bundle builds the training image from it instead: AWS EFA nodes).
        registry_login: the command that logs Docker in to the bake's registry
            (:func:`registry_login_unit`); empty when the node boots no baked image.

    What is the same on both clouds (the bundle fetch unit and path, the node settings files,
    the Docker drop-in) :func:`node_boot` takes from its own module, not from here.
    """

    cloud: Literal["aws", "gcp"]
    summary: tuple[str, ...]
    scratch_script: str
    scratch_after: tuple[str, ...]
    cluster_env_script: str
    nccl_env: dict[str, str]
    node_env: str
    bundle_fetch_script: str
    prepull: bool
    registry_login: tuple[ExecCommand, ...] = ()


def nccl_env_text(env: dict[str, str]) -> str:
    """``KEY=value`` lines of ``env`` (one value a line; shell- and systemd-readable).

    Raises:
        UnitValueError: a key that is not a variable name, or a value with a newline, quote,
            ``$``, backtick or backslash.
    """
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or re.search(r"[\n\r\0'\"$`\\\s]", value):
            raise UnitValueError(f"NCCL setting {key}={value!r} cannot be written to {NCCL_ENV_PATH}")
    return "".join(f"{k}={v}\n" for k, v in env.items())


#: Seconds a pre-pull may run before systemd fails it (oneshot units have no start timeout by
#: default, systemd.service(5) "TimeoutStartSec="): a ~20 GB image pulls in minutes, so a pull
#: still running after 30 minutes is stalled; the health gate ordered after it then runs (and
#: fails its all-reduce on this node) well inside the peers' result wait
#: (:data:`gpuinfra.health.node.HEALTH_RESULT_WAIT_SECONDS`, 45 minutes) instead of never.
PREPULL_TIMEOUT_SECONDS = 1800


def prepull_unit(image: str) -> SystemdUnit:
    """:data:`PREPULL_UNIT` for ``image``: skipped when the image is already there; ``image``
    reaches ``docker`` as one argument (never as shell text).

    Raises:
        SpecError: ``image`` is not an OCI reference (:func:`gpuinfra.oci.check_image_reference`).
    """
    check_image_reference(image)
    return SystemdUnit(
        PREPULL_UNIT,
        "gpuinfra: pre-pull the training container image",
        wants=("network-online.target",),
        requires=("docker.service",),
        after=("docker.service", "network-online.target", SCRATCH_UNIT),
        type="oneshot",
        remain_after_exit=True,
        timeout_start_sec=PREPULL_TIMEOUT_SECONDS,
        # ExecCondition: exit 0 runs the unit, 1-254 skips it (systemd.service(5), ExecCondition=)
        exec_condition=(shell('! /usr/bin/docker image inspect "$1" >/dev/null 2>&1', image),),
        exec_start=(command("/usr/bin/docker", "pull", image),),
    )


def registry_login_unit(login: tuple[ExecCommand, ...]) -> SystemdUnit:
    """:data:`REGISTRY_LOGIN_UNIT` running ``login`` once Docker and the network are up, before
    the units that pull (:data:`PREPULL_UNIT`, :data:`gpuinfra.plan.fabric.IMAGE_UNIT`); retried every 30 s
    while it fails (the instance role or service account may take a moment to be usable). The
    login command comes from the cloud's writer (:func:`gpuinfra.plan.boot_aws.ecr_login`,
    :func:`gpuinfra.plan.boot_gcp.artifact_registry_login`)."""
    return SystemdUnit(
        REGISTRY_LOGIN_UNIT,
        "gpuinfra: log Docker in to the bake's container registry",
        wants=("network-online.target",),
        requires=("docker.service",),
        after=("docker.service", "network-online.target", SCRATCH_UNIT),
        before=_PULLING_UNITS,
        start_limit_interval_sec=0,
        type="oneshot",
        remain_after_exit=True,
        exec_start=login,
        restart="on-failure",
        restart_sec=30,
    )


def node_boot(spec: ClusterSpec, cloud: CloudBoot) -> NodeBoot:
    """The boot manifest of the nodes of ``spec``; ``cloud`` carries what differs per cloud.

    Start order: the agent first (``--no-block``: whatever happens to apt or scratch, the node
    still ends itself when idle or expired), periodic apt off, ``daemon-reexec`` (new ``Default*``
    limits), ``fstrim.timer``, scratch (blocking: Docker must see it), Docker restarted
    when its memlock drop-in is new, then the bundle fetch, peer discovery and the pre-pull,
    all ``--no-block`` (they wait for the network and for each other, never the boot).

    Raises:
        SpecError: the profile's container image is not an OCI reference.
        UnitValueError: a value that cannot be written (a programming error).
    """
    agent = SystemdUnit(
        AGENT_UNIT,
        "gpuinfra agent: end the node when idle or expired, sync checkpoints",
        wants=("network-online.target",),
        # ordering only (no Wants): at shutdown the agent stops, and syncs, before the network goes
        # down and before /scratch (a mount unit the scratch script creates) is unmounted;
        # systemd.unit(5) "After=": the stop order is the reverse of the start order
        after=("network-online.target", SCRATCH_MOUNT_UNIT),
        exec_start=(command("/usr/bin/python3", AGENT_PATH, "--config", NODE_ENV_PATH),),
        # whatever its exit status: the agent must poll until the node is gone (systemd.service(5)
        # Restart=always); no start limit, so a crash loop is retried every RestartSec forever
        restart="always",
        restart_sec=10,
        start_limit_interval_sec=0,
        # stop: SIGTERM to the agent only (its sync's CLI children keep running), which syncs for
        # STOP_SYNC_SECONDS; ordered after network-online.target, so it stops before the network
        timeout_stop_sec=max(STOP_SYNC_SECONDS.values()) + 15,
        kill_mode="mixed",
    )
    scratch = SystemdUnit(
        SCRATCH_UNIT,
        f"gpuinfra: RAID0 local NVMe scratch at {SCRATCH_MOUNT}",
        default_dependencies=False,
        after=("local-fs.target", "systemd-udev-settle.service", *cloud.scratch_after),
        before=CONTAINER_RUNTIME_UNITS,
        type="oneshot",
        remain_after_exit=True,
        exec_start=(command(SCRATCH_SCRIPT_PATH),),
        start="block",
        status_file=SCRATCH_FAILED_PATH,
    )
    bundle = fetch_systemd_unit()
    cluster_env = SystemdUnit(
        CLUSTER_ENV_UNIT,
        f"gpuinfra: discover peers and write {CLUSTER_ENV_PATH}",
        wants=("network-online.target",),
        after=("network-online.target", bundle.name),
        start_limit_interval_sec=0,
        type="oneshot",
        remain_after_exit=True,
        exec_start_pre=(command("/bin/rm", "-f", CLUSTER_ENV_PATH, HOSTFILE_PATH),),
        exec_start=(command(CLUSTER_ENV_SCRIPT_PATH),),
        restart="on-failure",
        restart_sec=30,
    )
    units = [agent, scratch, bundle, cluster_env]
    if cloud.registry_login:
        units.append(registry_login_unit(cloud.registry_login))
    if cloud.prepull and spec.profile.container_image:
        units.append(prepull_unit(spec.profile.container_image))
    files = (
        NodeFile(SCRATCH_SCRIPT_PATH, "0755", cloud.scratch_script),
        NodeFile(CLUSTER_ENV_SCRIPT_PATH, "0755", cloud.cluster_env_script),
        NodeFile(BUNDLE_FETCH_PATH, "0755", cloud.bundle_fetch_script),
        NodeFile(AGENT_PATH, "0755", agent_source()),
        *(NodeFile(path, "0644", content) for path, content in NODE_FILES.items()),
        NodeFile(NCCL_ENV_PATH, "0644", nccl_env_text(cloud.nccl_env)),
        NodeFile(PROFILE_SCRIPT_PATH, "0644", profile_script()),
        NodeFile(NODE_ENV_PATH, "0644", cloud.node_env),
    )
    steps = (
        # the agent first: whatever happens next (a slow apt stop, scratch), the node still ends
        # itself when idle or expired
        start_step(agent),
        BootStep(("systemctl", "disable", "--now", *APT_TIMERS)),
        BootStep(("systemctl", "stop", *APT_SERVICES)),
        # systemd reads Default* limits only when it re-executes itself (systemd-system.conf(5));
        # re-executing also loads the unit files just written
        BootStep(("systemctl", "daemon-reexec")),
        # trim the scratch weekly instead of mounting it with online discard
        BootStep(("systemctl", "enable", "--now", "fstrim.timer")),
        start_step(scratch),
        # Docker may already run with the old limits: restart it once when its drop-in is new
        BootStep(("systemctl", "try-restart", "docker.service"), when_changed=DOCKER_MEMLOCK_DROPIN),
        *(start_step(u) for u in units[2:]),
    )
    summary = (
        f"gpuinfra node bootstrap for stack {spec.stack} ({spec.instance_type}, profile {spec.profile.name}).",
        *cloud.summary,
    )
    return NodeBoot(cloud.cloud, summary, files, tuple(units), steps)


def profile_script() -> str:
    """``/etc/profile.d/gpuinfra.sh``: login shells get the NCCL and torchrun settings."""
    return (
        "# gpuinfra: NCCL and torchrun settings for login shells\n"
        "set -a\n"
        f". {NCCL_ENV_PATH}\n"
        f"[ -r {CLUSTER_ENV_PATH} ] && . {CLUSTER_ENV_PATH}\n"
        "set +a\n"
    )


def cluster_env_paths() -> dict[str, str]:
    """The node paths the cluster-env templates write (``etc_dir``, ``cluster_env_path``,
    ``hostfile_path``)."""
    return {"etc_dir": ETC_DIR, "cluster_env_path": CLUSTER_ENV_PATH, "hostfile_path": HOSTFILE_PATH}


def render_cluster_env(template: str, **context: object) -> str:
    """``templates/<template>`` with the node paths of :func:`cluster_env_paths` (no trailing
    newline)."""
    return render(template, **cluster_env_paths(), **context).rstrip("\n")
