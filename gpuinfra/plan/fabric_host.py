"""What a GCP node must install and run on the host for its GPU fabric, as one script per
fabric that serves both the boot-time startup script and the image bake.

Pure Python, no Pulumi imports. The fabric's facts (template, pinned images and versions, boot
blocker) are its :class:`gpuinfra.fabrics.Fabric` record, and everything the container side
needs comes from :func:`~gpuinfra.plan.fabric.gcp_fabric`; this module renders the host side
from ``templates/fabric/``:

* ``gcp-tcpx-host.sh.j2`` / ``gcp-tcpxo-host.sh.j2`` / ``gcp-gib-host.sh.j2``: the install
  script, written to :data:`HOST_SCRIPT_PATH`. Run without arguments at every boot (it skips
  what is done); ``--bake`` installs but starts nothing that needs GPUs or GPU NICs. Exit codes:
  2 bad argument, 6 a prerequisite it cannot install (kernel, docker), 7 a failed step; the last
  stderr line names the step.
* :func:`rxdm_systemd_unit`: the :data:`~gpuinfra.plan.fabric.RXDM_UNIT` systemd unit (the
  script writes and enables it); ``gcp-tcpxo-aperture.rules.j2``: the aperture udev rule.

What each fabric installs, and from which sources: ``docs/sources/fabric.md``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.fabrics import GIB, TCPX, TCPXO
from gpuinfra.plan.fabric import RXDM_UNIT, FabricRuntime, gcp_fabric
from gpuinfra.plan.units import SystemdUnit, command, shell
from gpuinfra.templating import render

#: Where the boot script (or the bake) writes the host install script.
HOST_SCRIPT_PATH = "/usr/local/sbin/gpuinfra-fabric-host"
#: ``nccl-gib`` apt version (:data:`gpuinfra.fabrics.GIB`).
NCCL_GIB_VERSION = GIB.host.versions["nccl-gib"]
#: ``dmabuf-import-helper`` DKMS version (:data:`gpuinfra.fabrics.TCPXO`).
DMABUF_IMPORT_HELPER_VERSION = TCPXO.host.versions["dmabuf-import-helper"]
#: udev rule that exposes the A3 Mega aperture devices.
APERTURE_UDEV_RULE = "/etc/udev/rules.d/00-gpuinfra-tcpxo-aperture.rules"
#: Log line of the TCPXO RxDM once it serves (slurm-gcp receive-data-path-manager-mega L78).
TCPXO_RXDM_READY = "Buffer manager initialization complete"
#: How long the TCPXO RxDM unit waits for that line (slurm-gcp: 60 tries, 2 s apart).
TCPXO_RXDM_WAIT_SECONDS = 120
#: Folder the plugin installer containers write under (``-v /var/lib:/var/lib``).
_INSTALLER_ROOT = "/var/lib/"
_TCPX_RXDM_LD_LIBRARY_PATH = f"/usr/local/nvidia/lib64:{TCPX.rxdm_socket_dir}:/usr/lib/lib32:/usr/lib/x86_64-linux-gnu/"


@dataclass(frozen=True)
class HostStack:
    """The host side of one node family's fabric.

    Attributes:
        fabric: ``tcpx`` | ``tcpxo`` | ``gib`` | ``sockets`` (as :class:`FabricRuntime`).
        files: node path -> content that the boot script or the bake writes (the install
            script at :data:`HOST_SCRIPT_PATH`); empty for ``sockets``.
        writes: node path -> content that the install script writes itself (RxDM unit, udev
            rule), for review and tests.
        units: systemd units the script enables (and starts at boot).
        images: container images the script pulls or runs (pinned tags).
        boot_blocker: why the fabric cannot be made to work at boot, with its source; None when
            it can (then the script completes at boot).
    """

    fabric: str
    files: dict[str, str] = field(default_factory=dict)
    writes: dict[str, str] = field(default_factory=dict)
    units: tuple[str, ...] = ()
    images: tuple[str, ...] = ()
    boot_blocker: str | None = None

    @property
    def boot_ok(self) -> bool:
        """Whether the script completes at boot on gpuinfra's image (no blocker)."""
        return self.boot_blocker is None

    @property
    def boot_command(self) -> str:
        """Command the boot script runs ("" when there is nothing to install)."""
        return HOST_SCRIPT_PATH if self.files else ""

    @property
    def bake_command(self) -> str:
        """Command an image bake runs: installs, starts nothing ("" when nothing to install)."""
        return f"{HOST_SCRIPT_PATH} --bake" if self.files else ""


def _installer_probe(runtime: FabricRuntime) -> str:
    """The file ``gpuinfra-run`` requires inside the plugin folder: the installer must write it."""
    probe = next(
        r.target for r in runtime.requirements if r.kind == "path" and r.target.startswith(runtime.library_path + "/")
    )
    if not probe.startswith(_INSTALLER_ROOT):
        raise ValueError(
            f"{runtime.fabric}: plugin folder {runtime.library_path} is outside {_INSTALLER_ROOT}, "
            "where the installer container writes"
        )
    return probe


def rxdm_systemd_unit(
    runtime: FabricRuntime, *, pre: list[str], docker_args: list[str], rxdm_args: list[str], post: str
) -> SystemdUnit:
    """The RxDM unit (:data:`~gpuinfra.plan.fabric.RXDM_UNIT`) of a GPUDirect-TCPX(O)
    ``runtime``: wait until every GPU NIC is routable, remove a leftover container, run ``pre``,
    then the RxDM container (``docker_args``, the image, ``rxdm_args``; each entry is split into
    words as a shell would), ``post`` once it runs; restarted 10 s after a failure without a
    rate limit. The host script writes it and starts it (``start="none"`` here).

    Raises:
        UnitValueError: a value with a newline.
    """
    wait = (
        "/usr/lib/systemd/systemd-networkd-wait-online",
        "-o",
        "routable",
        "--timeout=120",
        *(w for nic in runtime.gpu_nics for w in ("-i", nic)),
    )
    docker = (
        "/usr/bin/docker",
        "run",
        "--rm",
        "--name",
        RXDM_CONTAINER,
        *(w for a in docker_args for w in shlex.split(a)),
        runtime.rxdm_image,
        *(w for a in rxdm_args for w in shlex.split(a)),
    )
    return SystemdUnit(
        RXDM_UNIT,
        f"gpuinfra: {runtime.label} receive-datapath manager (RxDM)",
        requires=("docker.service",),
        wants=("network-online.target",),
        after=("docker.service", "network-online.target", "nvidia-persistenced.service"),
        start_limit_interval_sec=0,
        exec_start_pre=(
            command(*wait),
            command("/usr/bin/docker", "rm", "-f", RXDM_CONTAINER, ignore_failure=True),
            *(command(*shlex.split(c)) for c in pre),
        ),
        exec_start=(command(*docker),),
        exec_start_post=(command(*shlex.split(post)),),
        exec_stop=(command("/usr/bin/docker", "stop", RXDM_CONTAINER),),
        restart="on-failure",
        restart_sec=10,
        timeout_start_sec=300,
        start="none",
        delivery="bundle",
    )


def _unit(runtime: FabricRuntime, *, pre: list[str], docker_args: list[str], rxdm_args: list[str], post: str) -> str:
    return rxdm_systemd_unit(runtime, pre=pre, docker_args=docker_args, rxdm_args=rxdm_args, post=post).render()


def _common(runtime: FabricRuntime, machine: str, extra_modes: tuple[str, ...] = ()) -> dict[str, object]:
    return {"fabric": runtime.fabric, "label": runtime.label, "machine": machine, "extra_modes": extra_modes}


def _tcpx(runtime: FabricRuntime, facts: InstanceFacts) -> HostStack:
    uds = TCPX.rxdm_socket_dir
    unit = _unit(
        runtime,
        pre=[f"/usr/bin/mkdir -p {uds}"],
        docker_args=[
            "--cap-add=NET_ADMIN",
            "--network=host",
            "--privileged",
            "--gpus all",
            f"--volume {uds}:{uds}",
            f"--env LD_LIBRARY_PATH={_TCPX_RXDM_LD_LIBRARY_PATH}",
            "--entrypoint /tcpgpudmarxd/build/app/tcpgpudmarxd",
            "--ulimit memlock=-1",
        ],
        rxdm_args=[
            "--gpu_nic_preset a3vm",
            "--gpu_shmem_type fd",
            f"--uds_path {uds}",
            '--setup_param "--verbose 128 2 0 "',
        ],
        post="/usr/bin/sleep 10",
    )
    script = render(
        TCPX.host.template,
        **_common(runtime, facts.instance_type),
        plugin_installer_image=shlex.quote(runtime.plugin_installer_image),
        plugin_probe=shlex.quote(_installer_probe(runtime)),
        rxdm_image=shlex.quote(runtime.rxdm_image),
        rxdm_unit=RXDM_UNIT,
        unit_text=unit,
    )
    return HostStack(
        "tcpx",
        files={HOST_SCRIPT_PATH: script},
        writes={f"/etc/systemd/system/{RXDM_UNIT}": unit},
        units=(RXDM_UNIT,),
        images=(runtime.plugin_installer_image, runtime.rxdm_image),
        boot_blocker=TCPX.boot_blocker,
    )


def _tcpxo(runtime: FabricRuntime, facts: InstanceFacts, env: dict[str, str]) -> HostStack:
    aperture = env["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"]
    unit = _unit(
        runtime,
        pre=["/usr/sbin/modprobe import-helper"],
        docker_args=[
            "--cap-add=NET_ADMIN",
            "--network=host",
            "--privileged",
            "--gpus all",
            "--volume /dev/dmabuf_import_helper:/dev/dmabuf_import_helper",
            "--env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu",
        ],
        rxdm_args=["--num_hops=2", f"--num_nics={len(runtime.gpu_nics)}", "--uid=", "--alsologtostderr"],
        post=f"{HOST_SCRIPT_PATH} --wait-rxdm",
    )
    rule = render("fabric/gcp-tcpxo-aperture.rules.j2", aperture_dir=aperture)
    script = render(
        TCPXO.host.template,
        **_common(runtime, facts.instance_type, ("--wait-rxdm",)),
        dmabuf_version=DMABUF_IMPORT_HELPER_VERSION,
        plugin_installer_image=shlex.quote(runtime.plugin_installer_image),
        plugin_probe=shlex.quote(_installer_probe(runtime)),
        rxdm_image=shlex.quote(runtime.rxdm_image),
        rxdm_unit=RXDM_UNIT,
        unit_text=unit,
        udev_rule_path=APERTURE_UDEV_RULE,
        rule_text=rule,
        aperture_dir=aperture,
        rxdm_ready=TCPXO_RXDM_READY,
        rxdm_wait_seconds=TCPXO_RXDM_WAIT_SECONDS,
    )
    return HostStack(
        "tcpxo",
        files={HOST_SCRIPT_PATH: script},
        writes={f"/etc/systemd/system/{RXDM_UNIT}": unit, APERTURE_UDEV_RULE: rule},
        units=(RXDM_UNIT,),
        images=(runtime.plugin_installer_image, runtime.rxdm_image),
        boot_blocker=TCPXO.boot_blocker,
    )


def _gib(runtime: FabricRuntime, facts: InstanceFacts) -> HostStack:
    script = render(
        GIB.host.template,
        **_common(runtime, facts.instance_type),
        gib_version=NCCL_GIB_VERSION,
        gib_lib_dir=runtime.library_path,
        gib_env_script=runtime.env_script,
        uverbs_count=len(runtime.devices),
    )
    return HostStack("gib", files={HOST_SCRIPT_PATH: script}, boot_blocker=GIB.boot_blocker)


def gcp_host_stack(nic_layout: str, facts: InstanceFacts, env: dict[str, str]) -> HostStack:
    """The host stack of a GCP node (what each fabric gets and why: ``docs/sources/fabric.md``).

    Args:
        nic_layout: ``GcpClusterPlan.nic_layout`` (``gvnic`` when high-bandwidth networking is
            off).
        facts: the machine's facts (GPU NIC count, machine type for the script header).
        env: the node's ``nccl.env`` settings (:func:`gpuinfra.plan.gcp.nccl_env` of the
            layout), read through :func:`gpuinfra.plan.fabric.gcp_fabric`.

    Returns:
        An empty stack (``sockets``, nothing to install) for ``gvnic``; else the install script
        and what it writes.

    Raises:
        ValueError: the NCCL settings name another number of GPU NICs than the facts
            (:func:`~gpuinfra.plan.fabric.gcp_fabric`), or a plugin folder outside /var/lib.
    """
    runtime = gcp_fabric(nic_layout, facts, env)
    if runtime.fabric == "tcpx":
        return _tcpx(runtime, facts)
    if runtime.fabric == "tcpxo":
        return _tcpxo(runtime, facts, env)
    if runtime.fabric == "gib":
        return _gib(runtime, facts)
    return HostStack("sockets")


#: The RxDM container's name (``docker logs gpuinfra-rxdm`` in the TCPXO host script).
RXDM_CONTAINER = "gpuinfra-rxdm"
#: The unit that runs the host install script at boot (the script enables RxDM itself).
FABRIC_HOST_UNIT = "gpuinfra-fabric-host.service"


def fabric_host_systemd_unit(host: HostStack) -> SystemdUnit:
    """``gpuinfra-fabric-host.service``: :data:`HOST_SCRIPT_PATH` once per boot after Docker
    (an A3 Mega first boot builds a kernel module and waits up to 120 s for NICs and 120 s for
    RxDM). A failure is retried inside the one start (3 tries, 60 s apart; each step is skipped
    once done), never after exit 2 or 6 (a bad argument, a kernel or Docker it cannot install):
    with ``Restart=`` the start job would end at the first failure and release the health gate
    ordered after it (systemd#32017)."""
    script = (
        f"for _ in 1 2 3; do {host.boot_command} && exit 0; rc=$?; "
        'case $rc in 2|6) exit "$rc" ;; esac; sleep 60; done; exit "$rc"'
    )
    return SystemdUnit(
        FABRIC_HOST_UNIT,
        f"gpuinfra: {host.fabric} GPU fabric host stack",
        wants=("network-online.target",),
        requires=("docker.service",),
        after=("network-online.target", "docker.service"),
        type="oneshot",
        remain_after_exit=True,
        timeout_start_sec=3600,
        exec_start=(shell(script),),
        delivery="bundle",
    )
