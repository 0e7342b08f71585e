"""What the GPU fabric needs inside the training container, per node family, and the
``gpuinfra-run`` script that starts that container (``templates/gpuinfra-run.sh.j2``).

Pure Python, no Pulumi imports. The fabric's facts (devices, plugin, mounts, variables, CPU
bindings, pinned versions) are its :class:`gpuinfra.fabrics.Fabric` record; this module turns the
record and the plan into a :class:`FabricRuntime`: the EFA count on AWS, the NIC layout and GPU
NIC counts on GCP, read from the instance facts -- never from a name prefix. The NCCL variables
come from the ``/etc/gpuinfra/nccl.env`` the boot scripts write (passed in); a runtime adds only
what the container needs on top. Every container gets ``--gpus all --network host --ipc host
--ulimit memlock=-1 --ulimit stack=67108864``; families with a GPU fabric also get
``--cap-add IPC_LOCK``. Where a fabric's host stack is missing, ``gpuinfra-run`` fails with one
line naming what is missing instead of letting NCCL fall back to TCP sockets. The host stacks
are installed at boot by :mod:`gpuinfra.plan.fabric_host` (GCP); on AWS the EFA user space is
built into the training image (:func:`efa_image_build`).

Sources per family: ``docs/sources/fabric.md``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

from gpuinfra.agent.constants import RESUME_ENV, RESUME_FILE_PATH, SCRATCH_MOUNT
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.fabrics import EFA, FABRICS, GVNIC, Fabric, NcclPlugin
from gpuinfra.health import node as health_node
from gpuinfra.plan.naming import AWS_STACK_ID_TAG
from gpuinfra.plan.units import CLUSTER_ENV_PATH, ETC_DIR, NCCL_ENV_PATH, NODE_ENV_PATH, SystemdUnit, shell
from gpuinfra.templating import render

RUN_SCRIPT_PATH = health_node.RUN_SCRIPT  # the health gate runs its all-reduce through it
#: systemd unit that runs the GPUDirect receive-datapath manager (RxDM) on A3 High / A3 Mega
#: nodes, installed and enabled by the host install script (gpuinfra/plan/fabric_host.py).
RXDM_UNIT = "gpuinfra-rxdm.service"
#: Seconds gpuinfra-run waits by default for ``/etc/gpuinfra/cluster.env`` and then the health
#: gate's verdict: a first boot of an EFA node builds the image, then the gate waits for every
#: peer's result (:data:`gpuinfra.health.node.HEALTH_RESULT_WAIT_SECONDS`) and runs the all-reduce.
CLUSTER_ENV_WAIT_SECONDS = 3600
#: AWS-RunShellScript's ``executionTimeout`` maximum, seconds (the document's parameter:
#: ``"default": "3600"``, "Maximum is 172800 (48 hours)"; SSM User Guide, AWS-RunShellScript
#: content as shown by ``aws ssm get-document --name AWS-RunShellScript``).
SSM_EXECUTION_TIMEOUT_SECONDS = 172800
#: Seconds torchrun's c10d rendezvous gives one call to its store on the rank-0 node
#: (``--rdzv_conf read_timeout``; PyTorch's default is 60: "read_timeout | The read timeout, in
#: seconds, for store operations. Defaults to 60 seconds.", C10dRendezvousBackend,
#: pytorch.org/docs/stable/elastic/rendezvous.html). The elastic agent of every other node calls
#: the store every ``--monitor_interval`` (5 s in torch 1.13, pytorch.org/docs/stable/elastic/run.html),
#: so when the rank-0 node is powered off it fails within this bound and the job unit restarts
#: the job (gpuinfra/agent/job.py follows rank 0 to its replacement). A lost node of another rank
#: is noticed by the job's own collectives instead: their timeout is the ``timeout`` of the
#: script's ``init_process_group`` (docs/run.md, "A lost node").
RDZV_READ_TIMEOUT_SECONDS = 30
#: How a user starts a job (stack output ``run_command``).
EXAMPLE_COMMAND = "gpuinfra-run -- python train.py"
#: Container stack limit (awsome-distributed-training Batch templates: 64 MiB).
STACK_LIMIT_BYTES = 67108864

#: EFA user space built into the training image on EFA nodes (:data:`gpuinfra.fabrics.EFA`).
EFA_INSTALLER_VERSION = EFA.host.versions["efa-installer"]
AWS_OFI_NCCL_VERSION = EFA.host.versions["aws-ofi-nccl"]


def _efa_plugin() -> NcclPlugin:
    """The EFA record's NCCL plugin (aws-ofi-nccl); every GPU fabric record names one."""
    if EFA.plugin is None:
        raise AssertionError("gpuinfra.fabrics.EFA names no NCCL plugin")
    return EFA.plugin


OFI_NCCL_PREFIX = str(PurePosixPath(_efa_plugin().library).parent.parent)
#: What an image with the EFA user space has (the requirements gpuinfra-run checks, below).
EFA_USER_SPACE_GLOBS = " ".join(glob for glob, _ in EFA.container.image_needs)
#: Build context of the boot-time image build (gpuinfra-image.service).
IMAGE_BUILD_DIR = f"{ETC_DIR}/image"
#: Tries of the boot-time image build, 60 s apart, within one start of the unit.
IMAGE_BUILD_ATTEMPTS = 3


@dataclass(frozen=True)
class Requirement:
    """Something the node must have before the container starts.

    Attributes:
        kind: ``path`` (exists), ``dir`` (a non-empty directory), ``nic`` (a network interface
            whose /sys/class/net/NAME/operstate is ``up``), ``unit`` (an active systemd unit), ``image`` (a shell glob that
            matches in the container image).
        target: the path, interface, unit or glob.
        what: what it is, for the error line.
    """

    kind: Literal["path", "dir", "nic", "unit", "image"]
    target: str
    what: str


@dataclass(frozen=True)
class FabricRuntime:
    """What ``gpuinfra-run`` passes to ``docker run`` for one node family (module docstring).

    Attributes:
        fabric: ``efa`` | ``tcpx`` | ``tcpxo`` | ``gib`` | ``sockets``.
        label: name for messages (``EFA``, ``GPUDirect-TCPXO`` ...).
        devices: host device nodes passed with ``--device`` (same path in the container).
        mounts: ``HOST:CONTAINER[:ro]`` volumes beyond scratch, checkpoints and the work folder.
        env: variables added after ``nccl.env`` (a later value wins).
        library_path: folder put first on the container's ``LD_LIBRARY_PATH`` ("" for none);
            prepended inside the container so the image's own entries stay.
        env_script: host script whose ``NCCL_*`` settings go into the env before ``nccl.env``
            ("" for none); env_script_lib_dir: ``NCCL_LIB_DIR`` it is read with.
        requirements: what the node must have (:class:`Requirement`).
        gpu_nics: GPU NIC interface names (TCPX / TCPXO), from ``nccl.env``.
        rxdm_unit / rxdm_image / plugin_installer_image: host-side pieces for the host install
            on GCP, "" where the fabric has none.
        hint: what to do when a requirement is missing.
    """

    fabric: str
    label: str
    devices: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    library_path: str = ""
    env_script: str = ""
    env_script_lib_dir: str = ""
    requirements: tuple[Requirement, ...] = ()
    gpu_nics: tuple[str, ...] = ()
    rxdm_unit: str = ""
    rxdm_image: str = ""
    plugin_installer_image: str = ""
    hint: str = ""

    @property
    def capabilities(self) -> tuple[str, ...]:
        """``--cap-add`` values: IPC_LOCK where a fabric registers memory (module docstring)."""
        return () if self.fabric == "sockets" else ("IPC_LOCK",)


SOCKETS = FabricRuntime(GVNIC.runtime, GVNIC.label)


def uverbs_devices(count: int) -> tuple[str, ...]:
    """``/dev/infiniband/uverbs0`` .. ``uverbs<count-1>``."""
    return tuple(f"/dev/infiniband/uverbs{i}" for i in range(count))


def aws_fabric(efa_count: int) -> FabricRuntime:
    """Runtime of an AWS node with ``efa_count`` EFA interfaces (``AwsClusterPlan.efa_count``,
    from ``EfaInfo.MaximumEfaInterfaces``); sockets without EFA."""
    if efa_count <= 0:
        return SOCKETS
    return FabricRuntime(
        EFA.runtime,
        EFA.label,
        devices=uverbs_devices(efa_count),
        requirements=tuple(Requirement("image", glob, what) for glob, what in EFA.container.image_needs),
        hint="devices: check the EFA driver (fi_info -p efa); image: the node builds one at boot "
        "(journalctl -u gpuinfra-image), or pass --image with one built from "
        "templates/fabric/aws-efa-container.Dockerfile.j2",
    )


@dataclass(frozen=True)
class ImageBuild:
    """The training image a node builds at boot: ``dockerfile`` text and the local ``tag``
    (``gpuinfra/train:efa-<first 12 hex of the Dockerfile's SHA-256>``, so a changed recipe is a
    new tag and an unchanged one is reused after a reboot)."""

    dockerfile: str
    tag: str
    base_image: str


def efa_image_build(base_image: str) -> ImageBuild:
    """The EFA-enabled training image on top of ``base_image`` (the profile's container image)
    for EFA nodes (``templates/fabric/aws-efa-container.Dockerfile.j2``).

    Raises:
        ValueError: no base image (the profile has no container image).
    """
    import hashlib

    if not base_image:
        raise ValueError("an EFA training image needs a base image (the profile's container_image)")
    text = render(
        EFA.host.template,
        base_image=base_image,
        efa_installer_version=EFA_INSTALLER_VERSION,
        aws_ofi_nccl_version=AWS_OFI_NCCL_VERSION,
        ofi_nccl_prefix=OFI_NCCL_PREFIX,
    )
    return ImageBuild(text, f"gpuinfra/train:efa-{hashlib.sha256(text.encode()).hexdigest()[:12]}", base_image)


#: The unit that builds the EFA training image at boot (in the node bundle).
IMAGE_UNIT = "gpuinfra-image.service"


def image_build_systemd_unit(build: ImageBuild) -> SystemdUnit:
    """``gpuinfra-image.service``: ``docker build`` of ``build`` once Docker and scratch are up
    (or ``docker tag`` of the base when it already has the EFA user space); skipped when the tag
    exists. A registry or download hiccup is retried inside the one start
    (:data:`IMAGE_BUILD_ATTEMPTS` tries, 60 s apart): with ``Restart=`` the start job would end
    at the first failure and release the units ordered after it (systemd#32017), so the health
    gate would test an image that is still being built. After the last try the unit stays failed
    and the gate goes on (its all-reduce then fails on this node).

    The base image, the tag and the build folder reach the shell as arguments (``$1``-``$3``),
    never as script text. An image that already carries the EFA user space (a baked container)
    is used as it is: tagged, not rebuilt.
    """
    tries = " ".join(str(i) for i in range(1, IMAGE_BUILD_ATTEMPTS + 1))
    script = (
        f"for _ in {tries}; do "
        f'if docker run --rm --entrypoint /bin/sh "$1" -c "ls {EFA_USER_SPACE_GLOBS}" >/dev/null 2>&1; '
        'then docker tag "$1" "$2" && exit 0; '
        'else docker build --tag "$2" "$3" && exit 0; fi; sleep 60; done; exit 1'
    )
    return SystemdUnit(
        IMAGE_UNIT,
        f"gpuinfra: build the training image {build.tag} (EFA user space on {build.base_image})",
        wants=("network-online.target",),
        requires=("docker.service",),
        after=("network-online.target", "docker.service", "gpuinfra-scratch.service"),
        type="oneshot",
        remain_after_exit=True,
        timeout_start_sec=5400,
        exec_condition=(shell('! docker image inspect "$1" >/dev/null 2>&1', build.tag),),
        exec_start=(shell(script, build.base_image, build.tag, IMAGE_BUILD_DIR),),
        delivery="bundle",
    )


def _nics(env: dict[str, str], key: str, expected: int, layout: str) -> tuple[str, ...]:
    nics = tuple(env[key].split(","))
    if len(nics) != expected:
        raise ValueError(f"{layout}: {key} names {len(nics)} NICs, the facts say {expected} GPU NICs")
    return nics


_HOST_STACK_HINT = (
    "the {label} host stack is not ready: see journalctl -u gpuinfra-fabric-host -u gpuinfra-rxdm, "
    "or run sudo /usr/local/sbin/gpuinfra-fabric-host; or use a profile with "
    "high_bandwidth_networking: off"
)


def _gpudirect_tcp(
    fabric: Fabric, nics: tuple[str, ...], requirements: tuple[Requirement, ...], **fields
) -> FabricRuntime:
    """A GPUDirect-TCPX(O) runtime: its own ``requirements``, then the RxDM unit and every GPU
    NIC up (RxDM serves the GPU NICs; ``gpu_nics`` come from ``nccl.env``)."""
    return FabricRuntime(
        fabric.runtime,
        fabric.label,
        requirements=(
            *requirements,
            Requirement("unit", RXDM_UNIT, "RxDM (receive-datapath-manager)"),
            *(Requirement("nic", n, "GPU NIC") for n in nics),
        ),
        gpu_nics=nics,
        rxdm_unit=RXDM_UNIT,
        rxdm_image=fabric.host.rxdm_image,
        plugin_installer_image=fabric.host.plugin_installer_image,
        hint=_HOST_STACK_HINT.format(label=fabric.label),
        **fields,
    )


def gcp_fabric(nic_layout: str, facts: InstanceFacts, env: dict[str, str]) -> FabricRuntime:
    """Runtime of a GCP node, from the layout's :class:`~gpuinfra.fabrics.Fabric` record.

    Args:
        nic_layout: ``GcpClusterPlan.nic_layout`` (the facts' layout; ``gvnic`` when
            high-bandwidth networking is off).
        facts: the machine's facts (GPU NIC counts).
        env: the node's ``nccl.env`` settings (:func:`gpuinfra.plan.gcp.nccl_env` of the
            layout): the GPU NIC names and the aperture folder are read from it.

    Raises:
        ValueError: the NCCL settings name another number of GPU NICs than the facts.
    """
    fabric = FABRICS.get(nic_layout)
    if fabric is None or fabric.cloud != "gcp" or fabric.plugin is None:
        return SOCKETS
    box = fabric.container
    lib = fabric.plugin.lib_dir
    if fabric.runtime == "tcpx":
        nics = _nics(env, fabric.gpu_nic_env, facts.gpu_nic_count, nic_layout)
        numa = [0 if i < len(nics) // 2 else 1 for i in range(len(nics))]
        bindings = {
            f"NCCL_GPUDIRECTTCPX_{way}_BINDINGS": ";".join(f"{n}:{cpus[numa[i]]}" for i, n in enumerate(nics))
            for way, cpus in box.cpu_bindings.items()
        }
        return _gpudirect_tcp(
            fabric,
            nics,
            (
                Requirement("path", fabric.plugin.library, "TCPX NCCL plugin"),
                Requirement("path", fabric.rxdm_socket_dir, "RxDM socket directory"),
            ),
            mounts=box.mounts,
            env={**box.env, **bindings},
            library_path=lib,
        )
    if fabric.runtime == "tcpxo":
        return _gpudirect_tcp(
            fabric,
            _nics(env, fabric.gpu_nic_env, facts.gpu_nic_count, nic_layout),
            (
                Requirement("path", box.env_script, "TCPXO NCCL plugin"),
                Requirement("dir", env["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"], "aperture devices"),
            ),
            mounts=box.mounts,
            library_path=lib,
            env_script=box.env_script,
            env_script_lib_dir=lib,
        )
    return FabricRuntime(
        fabric.runtime,
        fabric.label,
        devices=uverbs_devices(facts.gpu_nic_count) if box.uverbs else (),
        mounts=box.mounts,
        env=dict(box.env),
        library_path=lib,
        env_script=box.env_script,
        requirements=(
            Requirement("dir", lib, "gIB NCCL plugin (nccl-gib)"),
            Requirement("path", box.env_script, "gIB NCCL settings"),
        ),
        hint=_HOST_STACK_HINT.format(label="NCCL gIB"),
    )


def _quote(word: str) -> str:
    """shlex.quote, also for words with a comma (shellcheck SC2054 reads a bare comma in an array
    as a mistaken separator)."""
    quoted = shlex.quote(word)
    return quoted if quoted != word or "," not in word else f"'{word}'"


def render_run_script(runtime: FabricRuntime, *, image: str, instance_type: str, scratch: str) -> str:
    """The ``gpuinfra-run`` script for nodes of ``instance_type`` (``templates/gpuinfra-run.sh.j2``).

    Args:
        runtime: the node family's runtime (:func:`aws_fabric`, :func:`gcp_fabric`).
        image: default container image (the profile's ``container_image``; "" = ``--image``
            required).
        instance_type: for the script's header and messages.
        scratch: scratch mount point (checkpoints default to ``<scratch>/checkpoints``, as the node
            agent reads them).
    """
    words = " ".join  # a bash array's elements, each quoted
    quoted = {
        "image": shlex.quote(image),
        "scratch": shlex.quote(scratch),
        "label": shlex.quote(runtime.label),
        # /dev/infiniband/uverbs{0..31}: bash brace expansion keeps the user data small
        "devices": (
            f"/dev/infiniband/uverbs{{0..{len(runtime.devices) - 1}}}"
            if len(runtime.devices) > 1 and runtime.devices == uverbs_devices(len(runtime.devices))
            else words(map(shlex.quote, runtime.devices))
        ),
        "mounts": words(map(shlex.quote, runtime.mounts)),
        "caps": words(map(shlex.quote, runtime.capabilities)),
        "env": words(_quote(f"{key}={value}") for key, value in runtime.env.items()),
        "needs": words(_quote(f"{r.kind}|{r.target}|{r.what}") for r in runtime.requirements),
        "library_path": shlex.quote(runtime.library_path),
        "env_script": shlex.quote(runtime.env_script),
        "env_script_lib_dir": shlex.quote(runtime.env_script_lib_dir),
        "hint": shlex.quote(runtime.hint),
    }
    return render(
        "gpuinfra-run.sh.j2",
        rt=runtime,
        sh=quoted,
        instance_type=instance_type,
        wait_seconds=CLUSTER_ENV_WAIT_SECONDS,
        rdzv_read_timeout=RDZV_READ_TIMEOUT_SECONDS,
        stack_limit=STACK_LIMIT_BYTES,
        state_dir=str(health_node.STATE_DIR),
        passed_mark=health_node.PASSED_MARK,
        failed_mark=health_node.FAILED_MARK,
        excluded_mark=health_node.EXCLUDED_MARK,
        nccl_env_path=NCCL_ENV_PATH,
        cluster_env_path=CLUSTER_ENV_PATH,
        node_env_path=NODE_ENV_PATH,
        resume_file=RESUME_FILE_PATH,
        resume_env=RESUME_ENV,
    )


def aws_run_command(region: str, stack_id: str) -> str:
    """Stack output: start :data:`EXAMPLE_COMMAND` on every node of the stack through SSM Run
    Command (``AWS-RunShellScript`` runs as root). The target is the stack's own
    :data:`gpuinfra.plan.naming.AWS_STACK_ID_TAG` (``stack_id``: :func:`gpuinfra.plan.naming.stack_id`),
    never ``gpuinfra:stack``, which a stack of the same name from another folder also carries (one
    ``Key=tag:<key>,Values=<value>`` target: docs.aws.amazon.com/systems-manager/latest/userguide/
    send-commands-multiple.html). A fallback: ``gpuinfra run`` delivers jobs through the bucket
    with no time limit (docs/run.md). ``executionTimeout`` is AWS-RunShellScript's maximum,
    :data:`SSM_EXECUTION_TIMEOUT_SECONDS`, not its 3600 s default, which also counts
    ``gpuinfra-run``'s own wait for the ranks and the health verdict."""
    params = shlex.quote(
        f'workingDirectory=["{SCRATCH_MOUNT}"],commands=["{EXAMPLE_COMMAND}"],'
        f'executionTimeout=["{SSM_EXECUTION_TIMEOUT_SECONDS}"]'
    )
    return (
        f"aws ssm send-command --region {region} --document-name AWS-RunShellScript "
        f"--targets Key=tag:{AWS_STACK_ID_TAG},Values={stack_id} --parameters {params}"
    )


def gcp_run_command(zone: str, group: str, iap_ssh: bool) -> str:
    """Stack output: start :data:`EXAMPLE_COMMAND` over IAP SSH on every VM of the group ``group``:
    every VM in ``zone`` whose name starts with ``<group>-`` -- the MIG's members and the
    bulk-inserted nodes (:func:`gpuinfra.plan.naming.gcp_bulk_instance_names`) alike; the prefix
    is no other stack's (:func:`gpuinfra.plan.naming.gcp_group_name`)."""
    if not iap_ssh:
        return f"on every node: sudo {EXAMPLE_COMMAND} (no SSH path: set network.iap_ssh: true in the stack file)"
    return (
        f"for vm in $(gcloud compute instances list --zones {zone} --filter='name~^{group}-' "
        f"--format='value(name)'); do gcloud compute ssh \"$vm\" --zone {zone} --tunnel-through-iap "
        f"--command 'cd /scratch && sudo {EXAMPLE_COMMAND}' & done; wait"
    )
