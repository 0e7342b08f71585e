"""What a GCP node must install and run on the host for its GPU fabric, as
one script per fabric that serves both the boot-time startup script and the image bake.

Pure Python, no Pulumi imports. Everything the container side needs is defined once in
:mod:`gpuinfra.plan.fabric` (:func:`~gpuinfra.plan.fabric.gcp_fabric`: plugin folder,
env profile, aperture folder, GPU NIC names, RxDM unit and the pinned images); this module
reads those and renders the host side from ``templates/fabric/``:

* ``gcp-tcpx-host.sh.j2`` / ``gcp-tcpxo-host.sh.j2`` / ``gcp-gib-host.sh.j2``: the install
  script, written to :data:`HOST_SCRIPT_PATH`. Run without arguments at every boot (it skips
  what is done); ``--bake`` installs but starts nothing that needs GPUs or GPU NICs. Exit codes:
  2 bad argument, 6 a prerequisite it cannot install (kernel, docker), 7 a failed step; the last
  stderr line names the step.
* :func:`rxdm_systemd_unit`: the :data:`~gpuinfra.plan.fabric.RXDM_UNIT` systemd unit (the
  script writes and enables it); ``gcp-tcpxo-aperture.rules.j2``: the aperture udev rule.

Sources (commits: cluster-toolkit@1047080375afbb44da4b596be314634e7486af4a,
slurm-gcp@13fd92b615c030b9ba62e4a87d610bcc7af72b75,
container-engine-accelerators@992db81257553607f1477945f1b3219632991829):

* **A3 High, GPUDirect-TCPX.** Kernel: ``linux-gcp-tcpx`` from a private Canonical PPA whose
  login Google staff hand out, installed, held and made the GRUB default, then a reboot
  (cluster-toolkit ``examples/machine-learning/a3-highgpu-8g/README.md`` L8-13,
  ``a3high-slurm-blueprint.yaml`` L91-146 and L246-250: DKMS modules rebuilt for that kernel);
  Google's VM guide uses Container-Optimized OS instead (cloud.google.com/compute/docs/gpus/
  gpudirect: "Create your GPU VMs by using the cos-105-lts Container-Optimized OS image"). Plugin:
  ``docker run --rm --network=host -v /var/lib:/var/lib <installer> install`` fills
  ``/var/lib/tcpx/lib64`` (slurm-gcp ``tools/prologs-epilogs/receive-data-path-manager``
  L31-39). RxDM: ``docker run --cap-add=NET_ADMIN --network=host --privileged --gpus all
  --volume <uds>:<uds> --env LD_LIBRARY_PATH=... --entrypoint /tcpgpudmarxd/build/app/tcpgpudmarxd
  --ulimit memlock=-1`` (same file L49-64), given ``--gpu_nic_preset a3vm --gpu_shmem_type fd
  --uds_path /run/tcpx --setup_param "--verbose 128 2 0 "`` (container-engine-accelerators
  ``gpudirect-tcpx/nccl-test-latest.yaml`` L62-74: the built-in A3 High GPU/NIC map, where
  slurm-gcp L65-66 passes the same map as a textproto), then 10 s to come up (L70-71). GPU NICs
  routable first (cluster-toolkit ``a3high-slurm-blueprint.yaml`` L253-267,
  ``systemd-networkd-wait-online -o routable --timeout=120``).
* **A3 Mega, GPUDirect-TCPXO.** No kernel change: the ``dmabuf-import-helper`` DKMS module
  (version 1.1) from ``deb [arch=all trusted=yes] ar+https://us-apt.pkg.dev/projects/gce-ai-infra
  gpudirect-tcpxo-apt main`` through ``apt-transport-artifact-registry``, downloaded, patched for
  kernels >= 6.13 (``MODULE_IMPORT_NS("DMA_BUF")``) and built with DKMS for the running kernel
  (cluster-toolkit ``a3-megagpu-8g/a3mega-slurm-blueprint.yaml`` L298-391, on the stock
  ``ubuntu-accelerator-2404`` kernel, L30-32), then ``modprobe import-helper`` (slurm-gcp
  ``receive-data-path-manager-mega`` L28-29); the aperture udev rule (cluster-toolkit L393-415),
  triggered once for devices already present; the plugin installer with ``install
  --install-nccl`` into ``/var/lib/tcpxo/lib64`` (slurm-gcp L40-47); RxDM ``docker run
  --cap-add=NET_ADMIN --network=host --privileged --gpus all --volume
  /dev/dmabuf_import_helper:/dev/dmabuf_import_helper --env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu
  <image> --num_hops=2 --num_nics=8 --uid= --alsologtostderr`` (L60-73), ready when it logs
  ``Buffer manager initialization complete`` (L75-93).
* **A3 Ultra / A4, gIB.** No daemon, no kernel change: ``nccl-gib`` (pinned
  :data:`NCCL_GIB_VERSION`, held) from ``ar+https://us-apt.pkg.dev/projects/gce-ai-infra
  gpudirect-gib-apt main`` signed by ``https://us-apt.pkg.dev/doc/repo-signing-key.gpg``, with
  ``apt-transport-artifact-registry`` and ``ibverbs-utils`` (cluster-toolkit
  ``a3-ultragpu-8g/a3ultra-slurm-blueprint.yaml`` L43, L227-239, L494-530;
  ``a4-highgpu-8g/a4high-vm.yaml`` L186-199, L245-281, done at boot by the VM's startup script on
  ``ubuntu-2204-lts``). It installs ``/usr/local/gib/lib64`` and
  ``/usr/local/gib/scripts/set_nccl_env.sh`` (a3ultra L543-555). The verbs devices come from the
  kernel's mlx5 driver; the script waits for all of them.
* **A2, G2, N1+T4, A3 High 1g-4g** (``gvnic``): nothing beyond the NVIDIA driver in the image;
  they have one gVNIC and no GPU NICs, so NCCL uses TCP sockets (gcp_machine_facts.json
  ``networks``).

What the references do that gpuinfra leaves out, and why: the ``/var/lib/nvidia/lib64`` volume
of the RxDM containers (a COS driver path; on the DLVM image ``--gpus all`` puts the driver
libraries into the container); the ``nccl-env-profile.sh`` additions of slurm-gcp -mega L49-57
and the ``/etc/ld.so.conf.d`` / ``/etc/environment`` settings of a4high-vm.yaml L283-317 (the
container gets those settings from ``nccl.env`` and ``gpuinfra-run``); the host ``libnccl2`` pin
(the container brings its NCCL).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.plan.units import SystemdUnit, command, shell
from gpuinfra.plan.fabric import RXDM_UNIT, FabricRuntime, gcp_fabric
from gpuinfra.rules.spec_rules import fabric_boot_blocker
from gpuinfra.templating import render

#: Where the boot script (or the bake) writes the host install script.
HOST_SCRIPT_PATH = "/usr/local/sbin/gpuinfra-fabric-host"
#: ``nccl-gib`` apt version (cluster-toolkit a3ultra-slurm-blueprint.yaml L43 ``nccl_gib_version``).
NCCL_GIB_VERSION = "1.1.0"
#: ``dmabuf-import-helper`` DKMS version (cluster-toolkit a3mega-slurm-blueprint.yaml L306).
DMABUF_IMPORT_HELPER_VERSION = "1.1"
#: udev rule that exposes the A3 Mega aperture devices.
APERTURE_UDEV_RULE = "/etc/udev/rules.d/00-gpuinfra-tcpxo-aperture.rules"
#: Log line of the TCPXO RxDM once it serves (slurm-gcp receive-data-path-manager-mega L78).
TCPXO_RXDM_READY = "Buffer manager initialization complete"
#: How long the TCPXO RxDM unit waits for that line (slurm-gcp: 60 tries, 2 s apart).
TCPXO_RXDM_WAIT_SECONDS = 120
#: Folder the plugin installer containers write under (``-v /var/lib:/var/lib``).
_INSTALLER_ROOT = "/var/lib/"
_TCPX_RXDM_LD_LIBRARY_PATH = "/usr/local/nvidia/lib64:/run/tcpx:/usr/lib/lib32:/usr/lib/x86_64-linux-gnu/"



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
    probe = next(r.target for r in runtime.requirements
                 if r.kind == "path" and r.target.startswith(runtime.library_path + "/"))
    if not probe.startswith(_INSTALLER_ROOT):
        raise ValueError(f"{runtime.fabric}: plugin folder {runtime.library_path} is outside {_INSTALLER_ROOT}, "
                         "where the installer container writes")
    return probe


def rxdm_systemd_unit(runtime: FabricRuntime, *, pre: list[str], docker_args: list[str], rxdm_args: list[str],
                      post: str) -> SystemdUnit:
    """The RxDM unit (:data:`~gpuinfra.plan.fabric.RXDM_UNIT`) of a GPUDirect-TCPX(O)
    ``runtime``: wait until every GPU NIC is routable, remove a leftover container, run ``pre``,
    then the RxDM container (``docker_args``, the image, ``rxdm_args``; each entry is split into
    words as a shell would), ``post`` once it runs; restarted 10 s after a failure without a
    rate limit. The host script writes it and starts it (``start="none"`` here).

    Raises:
        UnitValueError: a value with a newline.
    """
    wait = ("/usr/lib/systemd/systemd-networkd-wait-online", "-o", "routable", "--timeout=120",
            *(w for nic in runtime.gpu_nics for w in ("-i", nic)))
    docker = ("/usr/bin/docker", "run", "--rm", "--name", RXDM_CONTAINER,
              *(w for a in docker_args for w in shlex.split(a)), runtime.rxdm_image,
              *(w for a in rxdm_args for w in shlex.split(a)))
    return SystemdUnit(
        RXDM_UNIT, f"gpuinfra: {runtime.label} receive-datapath manager (RxDM)",
        requires=("docker.service",), wants=("network-online.target",),
        after=("docker.service", "network-online.target", "nvidia-persistenced.service"),
        start_limit_interval_sec=0,
        exec_start_pre=(command(*wait), command("/usr/bin/docker", "rm", "-f", RXDM_CONTAINER, ignore_failure=True),
                        *(command(*shlex.split(c)) for c in pre)),
        exec_start=(command(*docker),),
        exec_start_post=(command(*shlex.split(post)),),
        exec_stop=(command("/usr/bin/docker", "stop", RXDM_CONTAINER),),
        restart="on-failure", restart_sec=10, timeout_start_sec=300,
        start="none", delivery="bundle",
    )


def _unit(runtime: FabricRuntime, *, pre: list[str], docker_args: list[str], rxdm_args: list[str],
          post: str) -> str:
    return rxdm_systemd_unit(runtime, pre=pre, docker_args=docker_args, rxdm_args=rxdm_args, post=post).render()


def _common(runtime: FabricRuntime, machine: str, extra_modes: tuple[str, ...] = ()) -> dict[str, object]:
    return {"fabric": runtime.fabric, "label": runtime.label, "machine": machine, "extra_modes": extra_modes}


def _tcpx(runtime: FabricRuntime, facts: InstanceFacts) -> HostStack:
    uds = runtime.env["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"]
    unit = _unit(
        runtime,
        pre=[f"/usr/bin/mkdir -p {uds}"],
        docker_args=["--cap-add=NET_ADMIN", "--network=host", "--privileged", "--gpus all",
                     f"--volume {uds}:{uds}", f"--env LD_LIBRARY_PATH={_TCPX_RXDM_LD_LIBRARY_PATH}",
                     "--entrypoint /tcpgpudmarxd/build/app/tcpgpudmarxd", "--ulimit memlock=-1"],
        rxdm_args=["--gpu_nic_preset a3vm", "--gpu_shmem_type fd", f"--uds_path {uds}",
                   '--setup_param "--verbose 128 2 0 "'],
        post="/usr/bin/sleep 10",
    )
    script = render("fabric/gcp-tcpx-host.sh.j2", **_common(runtime, facts.instance_type),
                    plugin_installer_image=shlex.quote(runtime.plugin_installer_image),
                    plugin_probe=shlex.quote(_installer_probe(runtime)),
                    rxdm_image=shlex.quote(runtime.rxdm_image), rxdm_unit=RXDM_UNIT, unit_text=unit)
    return HostStack("tcpx", files={HOST_SCRIPT_PATH: script}, writes={f"/etc/systemd/system/{RXDM_UNIT}": unit},
                     units=(RXDM_UNIT,), images=(runtime.plugin_installer_image, runtime.rxdm_image),
                     boot_blocker=fabric_boot_blocker("gcp", "tcpx"))


def _tcpxo(runtime: FabricRuntime, facts: InstanceFacts, env: dict[str, str]) -> HostStack:
    aperture = env["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"]
    unit = _unit(
        runtime,
        pre=["/usr/sbin/modprobe import-helper"],
        docker_args=["--cap-add=NET_ADMIN", "--network=host", "--privileged", "--gpus all",
                     "--volume /dev/dmabuf_import_helper:/dev/dmabuf_import_helper",
                     "--env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu"],
        rxdm_args=["--num_hops=2", f"--num_nics={len(runtime.gpu_nics)}", "--uid=", "--alsologtostderr"],
        post=f"{HOST_SCRIPT_PATH} --wait-rxdm",
    )
    rule = render("fabric/gcp-tcpxo-aperture.rules.j2", aperture_dir=aperture)
    script = render("fabric/gcp-tcpxo-host.sh.j2", **_common(runtime, facts.instance_type, ("--wait-rxdm",)),
                    dmabuf_version=DMABUF_IMPORT_HELPER_VERSION,
                    plugin_installer_image=shlex.quote(runtime.plugin_installer_image),
                    plugin_probe=shlex.quote(_installer_probe(runtime)),
                    rxdm_image=shlex.quote(runtime.rxdm_image), rxdm_unit=RXDM_UNIT, unit_text=unit,
                    udev_rule_path=APERTURE_UDEV_RULE, rule_text=rule, aperture_dir=aperture,
                    rxdm_ready=TCPXO_RXDM_READY, rxdm_wait_seconds=TCPXO_RXDM_WAIT_SECONDS)
    return HostStack("tcpxo", files={HOST_SCRIPT_PATH: script},
                     writes={f"/etc/systemd/system/{RXDM_UNIT}": unit, APERTURE_UDEV_RULE: rule},
                     units=(RXDM_UNIT,), images=(runtime.plugin_installer_image, runtime.rxdm_image),
                     boot_blocker=fabric_boot_blocker("gcp", "tcpxo"))


def _gib(runtime: FabricRuntime, facts: InstanceFacts) -> HostStack:
    script = render("fabric/gcp-gib-host.sh.j2", **_common(runtime, facts.instance_type),
                    gib_version=NCCL_GIB_VERSION, gib_lib_dir=runtime.library_path,
                    gib_env_script=runtime.env_script, uverbs_count=len(runtime.devices))
    return HostStack("gib", files={HOST_SCRIPT_PATH: script}, boot_blocker=fabric_boot_blocker("gcp", "gib"))


def gcp_host_stack(nic_layout: str, facts: InstanceFacts, env: dict[str, str]) -> HostStack:
    """The host stack of a GCP node (module docstring lists what each fabric gets and why).

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


def fabric_host_unit(host: HostStack) -> str:
    """:func:`fabric_host_systemd_unit` as unit-file text."""
    return fabric_host_systemd_unit(host).render()


def fabric_host_systemd_unit(host: HostStack) -> SystemdUnit:
    """``gpuinfra-fabric-host.service``: :data:`HOST_SCRIPT_PATH` once per boot after Docker
    (an A3 Mega first boot builds a kernel module and waits up to 120 s for NICs and 120 s for
    RxDM). A failure is retried inside the one start (3 tries, 60 s apart; each step is skipped
    once done), never after exit 2 or 6 (a bad argument, a kernel or Docker it cannot install):
    with ``Restart=`` the start job would end at the first failure and release the health gate
    ordered after it (systemd#32017)."""
    script = (f'for _ in 1 2 3; do {host.boot_command} && exit 0; rc=$?; '
              'case $rc in 2|6) exit "$rc" ;; esac; sleep 60; done; exit "$rc"')
    return SystemdUnit(
        FABRIC_HOST_UNIT, f"gpuinfra: {host.fabric} GPU fabric host stack",
        wants=("network-online.target",), requires=("docker.service",),
        after=("network-online.target", "docker.service"),
        type="oneshot", remain_after_exit=True, timeout_start_sec=3600,
        exec_start=(shell(script),), delivery="bundle",
    )
