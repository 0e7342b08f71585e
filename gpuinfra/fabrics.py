"""The GPU fabric of each network layout (``InstanceFacts.nic_layout``): one frozen
:class:`Fabric` record per layout in :data:`FABRICS`, looked up with :func:`fabric_for`.

A record says everything gpuinfra knows about the layout: the devices and NICs it needs, the
NCCL network plugin and the ``nccl.env`` settings, the host install (script template, pinned
images and versions), what ``gpuinfra-run`` adds to the container, the NCCL log lines the boot
health gate accepts, the busbw baseline key and why it cannot be installed at boot, each with
its public source. The readers derive from it and keep no copy:
:func:`gpuinfra.plan.gcp.nccl_env`, :func:`gpuinfra.plan.boot_aws.nccl_env`,
:mod:`gpuinfra.plan.fabric` (container runtime), :mod:`gpuinfra.plan.fabric_host` (host stack),
:func:`gpuinfra.plan.health.expectations_for` (baseline),
:func:`gpuinfra.rules.spec_rules.fabric_boot_blocker`.

Domain layer, not ``gpuinfra.plan``: the planner, the supply model and the rules registry (all in
the domain layer) read the boot blocker. The health gate's log markers stay defined in the
node-side :data:`gpuinfra.health.gate.GPUDIRECT_PLUGINS` (the nodes import only the standard
library and each other); the record points at that entry instead of copying it.

Sources, with line numbers and commits: ``docs/sources/fabric.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from gpuinfra.catalog.facts_model import NicLayout
from gpuinfra.health.gate import GPUDIRECT_PLUGINS, GpudirectPlugin

#: Artifact Registry of Google's GPUDirect images and apt repositories.
GCE_AI_INFRA = "us-docker.pkg.dev/gce-ai-infra"


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class NcclPlugin:
    """The NCCL network plugin a fabric uses.

    Attributes:
        name: the plugin's project name (``aws-ofi-nccl``, ``nccl-plugin-gpudirecttcpx`` ...).
        library: the ``libnccl-net.so`` NCCL loads (its path on the node, or in the image for EFA).
        lib_dir: folder put first on the container's ``LD_LIBRARY_PATH`` ("" for none; EFA: the
            image's own loader path finds it).
    """

    name: str
    library: str
    lib_dir: str = ""


@dataclass(frozen=True)
class HostInstall:
    """What the node's host installs for the fabric (GCP: at boot or in a bake; AWS EFA: in the
    training image).

    Attributes:
        template: the install script or image recipe under ``templates/`` ("" for none).
        rxdm_image / plugin_installer_image: pinned GPUDirect-TCPX(O) images ("" for none).
        versions: pinned package versions, package name -> version.
    """

    template: str = ""
    rxdm_image: str = ""
    plugin_installer_image: str = ""
    versions: Mapping[str, str] = field(default_factory=lambda: _frozen({}))


@dataclass(frozen=True)
class Container:
    """What ``gpuinfra-run`` adds to ``docker run`` for the fabric, beyond the ``nccl.env``
    settings (:class:`gpuinfra.plan.fabric.FabricRuntime` is built from it and the plan).

    Attributes:
        uverbs: one ``--device /dev/infiniband/uverbsN`` per fabric NIC (EFA interface or MRDMA
            NIC), N = 0..count-1.
        mounts: ``HOST:CONTAINER[:ro]`` volumes (the plugin folder, the RxDM socket folder ...).
        env: variables set after ``nccl.env``.
        env_script: host script whose ``NCCL_*`` settings are read before ``nccl.env`` ("" none).
        cpu_bindings: ``NCCL_GPUDIRECTTCPX_{TX,RX}_BINDINGS`` CPU ranges per NUMA node
            (``TX`` / ``RX`` -> (NUMA 0, NUMA 1)); the first half of the GPU NICs is on NUMA 0.
        image_needs: ``(glob, what)`` the training image must match (EFA user space).
    """

    uverbs: bool = False
    mounts: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    env_script: str = ""
    cpu_bindings: Mapping[str, tuple[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    image_needs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Fabric:
    """The GPU fabric of one network layout.

    Attributes:
        layout: the ``nic_layout`` (``efa`` | ``ena`` | ``gvnic`` | ``tcpx`` | ``tcpxo`` | ``gib``).
        cloud: ``aws`` | ``gcp``.
        runtime: the runtime family (``efa`` | ``tcpx`` | ``tcpxo`` | ``gib`` | ``sockets``).
        label: name for messages.
        nics: the NICs and devices the layout needs, in words.
        plugin: the NCCL network plugin; None: NCCL's own TCP sockets.
        nccl_env: the ``/etc/gpuinfra/nccl.env`` settings (AWS EFA adds the plan's device count).
        gpu_nic_env: the ``nccl_env`` key that names the GPU NICs ("" for none).
        rxdm_socket_dir: the RxDM's Unix socket folder (TCPX; "" for none).
        host: the host install.
        container: what ``gpuinfra-run`` adds.
        gate: how the boot health gate sees NCCL use the plugin (the node-side entry of
            :data:`gpuinfra.health.gate.GPUDIRECT_PLUGINS`); None: not checked (no GPU fabric).
        baseline_network: the ``nic_layout`` of the ``health/data/baselines.json`` entries a
            multi-node cluster on this fabric is judged against.
        boot_blocker: why the fabric cannot be made to work at boot on gpuinfra's images, with
            its source; None when it can.
        sources: the public pages and files the record comes from (``docs/sources/fabric.md``).
    """

    layout: NicLayout
    cloud: Literal["aws", "gcp"]
    runtime: str
    label: str
    nics: str
    plugin: NcclPlugin | None
    nccl_env: Mapping[str, str]
    sources: tuple[str, ...]
    gpu_nic_env: str = ""
    rxdm_socket_dir: str = ""
    host: HostInstall = HostInstall()
    container: Container = Container()
    boot_blocker: str | None = None

    @property
    def gate(self) -> GpudirectPlugin | None:
        """The health gate's entry for this layout (None: no GPU fabric to check)."""
        return GPUDIRECT_PLUGINS.get(self.layout)

    @property
    def baseline_network(self) -> str:
        """Key of the baselines measured over this fabric (``baselines.json`` ``nic_layout``)."""
        return self.layout


#: What every layout without a GPU fabric puts in ``nccl.env``: bootstrap traffic off the
#: container bridges (awsome-distributed-training 1.architectures/efa-cheatsheet.md).
_SOCKETS_ENV = {"NCCL_SOCKET_IFNAME": "^docker,lo,veth", "NCCL_DEBUG": "WARN"}

_OFI_NCCL_PLUGIN = "/opt/amazon/ofi-nccl/lib/libnccl-net.so"
EFA = Fabric(
    layout="efa",
    cloud="aws",
    runtime="efa",
    label="EFA",
    nics="EFA interfaces (EfaInfo.MaximumEfaInterfaces), one uverbs device each",
    plugin=NcclPlugin("aws-ofi-nccl", _OFI_NCCL_PLUGIN),
    # libfabric >= 1.18 / aws-ofi-nccl >= 1.7 need no FI_PROVIDER / NCCL_PROTO /
    # FI_EFA_USE_DEVICE_RDMA; FI_EFA_USE_HUGE_PAGE=0 avoids fork() failures; never RDMAV_*
    nccl_env=_frozen({**_SOCKETS_ENV, "FI_EFA_USE_HUGE_PAGE": "0"}),
    host=HostInstall(
        template="fabric/aws-efa-container.Dockerfile.j2",
        versions=_frozen({"efa-installer": "1.43.2", "aws-ofi-nccl": "1.16.3"}),
    ),
    container=Container(
        uverbs=True,
        image_needs=(
            ("/opt/amazon/efa/lib*/libfabric.so*", "EFA user space (libfabric)"),
            (_OFI_NCCL_PLUGIN, "aws-ofi-nccl NCCL plugin"),
        ),
    ),
    sources=(
        "awsome-distributed-training 1.architectures/efa-cheatsheet.md L11-25",
        "awsome-distributed-training 0.aws-batch-distributed-training-p5.yaml L487-674",
        "awsome-distributed-training@0162aacd micro-benchmarks/nccl-tests/nccl-tests.Dockerfile L7-8",
        "aws-samples/aws-efa-eks README.md L157",
    ),
)

ENA = Fabric(
    layout="ena",
    cloud="aws",
    runtime="sockets",
    label="TCP sockets",
    nics="ENA only (no EFA, or high-bandwidth networking off)",
    plugin=None,
    nccl_env=_frozen(_SOCKETS_ENV),
    sources=("awsome-distributed-training 1.architectures/efa-cheatsheet.md",),
)

GVNIC = Fabric(
    layout="gvnic",
    cloud="gcp",
    runtime="sockets",
    label="TCP sockets",
    nics="one gVNIC, no GPU NICs (A2, G2, N1, A3 High 1g-4g, or high-bandwidth networking off)",
    plugin=None,
    nccl_env=_frozen(_SOCKETS_ENV),
    sources=("gpuinfra/catalog/data/gcp_machine_facts.json networks",),
)

_TCPX_LIB = "/var/lib/tcpx/lib64"
_TCPX_IMAGES = f"{GCE_AI_INFRA}/gpudirect-tcpx"
_TCPX_UDS = "/run/tcpx"
TCPX = Fabric(
    layout="tcpx",
    cloud="gcp",
    runtime="tcpx",
    label="GPUDirect-TCPX",
    nics="1 system gVNIC + 4 GPU gVNICs (A3 High 8g); RxDM serves the GPU NICs",
    plugin=NcclPlugin("nccl-plugin-gpudirecttcpx", f"{_TCPX_LIB}/libnccl-net.so", _TCPX_LIB),
    nccl_env=_frozen(
        {
            "NCCL_NET": "GPUDirectTCPX_v7",
            "NCCL_SOCKET_IFNAME": "enp0s12",
            "NCCL_GPUDIRECTTCPX_CTRL_DEV": "enp0s12",
            "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": "enp6s0,enp12s0,enp134s0,enp140s0",
            "NCCL_CROSS_NIC": "0",
            "NCCL_ALGO": "Ring",
            "NCCL_PROTO": "Simple",
            "NCCL_NSOCKS_PERTHREAD": "4",
            "NCCL_SOCKET_NTHREADS": "1",
            "NCCL_DYNAMIC_CHUNK_SIZE": "524288",
            "NCCL_P2P_NET_CHUNKSIZE": "524288",
            "NCCL_P2P_PCI_CHUNKSIZE": "524288",
            "NCCL_P2P_NVL_CHUNKSIZE": "1048576",
            "NCCL_BUFFSIZE": "4194304",
            "NCCL_NET_GDR_LEVEL": "PIX",
            "NCCL_P2P_PXN_LEVEL": "0",
            "GPUINFRA_NCCL_PLUGIN_DIR": _TCPX_LIB,
        }
    ),
    gpu_nic_env="NCCL_GPUDIRECTTCPX_SOCKET_IFNAME",
    rxdm_socket_dir=_TCPX_UDS,
    host=HostInstall(
        template="fabric/gcp-tcpx-host.sh.j2",
        rxdm_image=f"{_TCPX_IMAGES}/tcpgpudmarxd-dev:v2.0.12",
        plugin_installer_image=f"{_TCPX_IMAGES}/nccl-plugin-gpudirecttcpx-dev:v3.1.9-2.19.4-12.0",
    ),
    container=Container(
        mounts=(f"{_TCPX_LIB}:{_TCPX_LIB}:ro", f"{_TCPX_UDS}:{_TCPX_UDS}"),
        env=_frozen(
            {
                "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX": _TCPX_UDS,
                "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS": "500000",
            }
        ),
        # NICs 1-2 on NUMA 0, NICs 3-4 on NUMA 1 (run-nccl-tests.sh L64-65)
        cpu_bindings=MappingProxyType(
            {"TX": ("8-21,112-125", "60-73,164-177"), "RX": ("22-35,126-139", "74-87,178-191")}
        ),
    ),
    boot_blocker=(
        "GPUDirect-TCPX needs the linux-gcp-tcpx kernel, which comes from a private Canonical PPA with "
        "credentials from Google and takes a reboot (cluster-toolkit examples/machine-learning/a3-highgpu-8g/"
        "README.md L8-13, a3high-slurm-blueprint.yaml L91-146), or Container-Optimized OS "
        "(cloud.google.com/compute/docs/gpus/gpudirect); the Deep Learning VM image has neither, so it cannot "
        "be set up at boot: bake an image with that kernel"
    ),
    sources=(
        "cluster-toolkit@10470803 examples/machine-learning/a3-highgpu-8g/nccl-tests/run-nccl-tests.sh",
        "slurm-gcp@13fd92b6 tools/prologs-epilogs/receive-data-path-manager L31-32 (images)",
        "skypilot@46817b72 sky/provision/gcp/constants.py GPU_DIRECT_TCPX_SPECIFIC_OPTIONS",
        "cloud.google.com/compute/docs/gpus/gpudirect",
    ),
)

_TCPXO_LIB = "/var/lib/tcpxo/lib64"
_APERTURE = "/dev/aperture_devices"
TCPXO = Fabric(
    layout="tcpxo",
    cloud="gcp",
    runtime="tcpxo",
    label="GPUDirect-TCPXO",
    nics="1 system gVNIC + 8 GPU gVNICs (A3 Mega), the aperture devices, the dmabuf import helper",
    plugin=NcclPlugin("nccl-plugin-gpudirecttcpx (FasTrak)", f"{_TCPXO_LIB}/libnccl-net.so", _TCPXO_LIB),
    nccl_env=_frozen(
        {
            "NCCL_FASTRAK_CTRL_DEV": "enp0s12",
            "NCCL_FASTRAK_IFNAME": "enp6s0,enp7s0,enp13s0,enp14s0,enp134s0,enp135s0,enp141s0,enp142s0",
            "NCCL_SOCKET_IFNAME": "enp0s12",
            "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": _APERTURE,
            "GPUINFRA_NCCL_ENV_PROFILE": f"{_TCPXO_LIB}/nccl-env-profile.sh",
            "GPUINFRA_NCCL_PLUGIN_DIR": _TCPXO_LIB,
        }
    ),
    gpu_nic_env="NCCL_FASTRAK_IFNAME",
    host=HostInstall(
        template="fabric/gcp-tcpxo-host.sh.j2",
        rxdm_image=f"{GCE_AI_INFRA}/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.23",
        plugin_installer_image=f"{GCE_AI_INFRA}/gpudirect-tcpxo/nccl-plugin-gpudirecttcpx-dev:v1.0.17",
        versions=_frozen({"dmabuf-import-helper": "1.1"}),
    ),
    container=Container(
        mounts=(f"{_TCPXO_LIB}:{_TCPXO_LIB}:ro", f"{_APERTURE}:{_APERTURE}"),
        env_script=f"{_TCPXO_LIB}/nccl-env-profile.sh",
    ),
    sources=(
        "cluster-toolkit@10470803 examples/machine-learning/a3-megagpu-8g/nccl-tests/run-nccl-tests.sh",
        "slurm-gcp@13fd92b6 tools/prologs-epilogs/receive-data-path-manager-mega L31-32 (images)",
        "cluster-toolkit a3mega-slurm-blueprint.yaml L306 (dmabuf-import-helper version)",
        "container-engine-accelerators@992db812 gpudirect-tcpxo/README.md, nccl-test-latest.yaml",
        "cloud.google.com/compute/docs/gpus/gpudirect",
    ),
)

_GIB_ROOT = "/usr/local/gib"
GIB = Fabric(
    layout="gib",
    cloud="gcp",
    runtime="gib",
    label="RDMA (gIB)",
    nics="2 gVNICs + 8 MRDMA NICs on one RoCE VPC (A3 Ultra, A4), one uverbs device each",
    plugin=NcclPlugin("nccl-gib", f"{_GIB_ROOT}/lib64/libnccl-net.so", f"{_GIB_ROOT}/lib64"),
    nccl_env=_frozen(
        {
            "NCCL_CROSS_NIC": "0",
            "NCCL_NET_GDR_LEVEL": "PIX",
            "NCCL_P2P_NET_CHUNKSIZE": "131072",
            "NCCL_NVLS_CHUNKSIZE": "524288",
            "NCCL_IB_GID_INDEX": "3",
            "NCCL_IB_ADAPTIVE_ROUTING": "1",
            "NCCL_IB_QPS_PER_CONNECTION": "4",
            "NCCL_IB_TC": "52",
            "NCCL_IB_FIFO_TC": "84",
            "NCCL_TUNER_CONFIG_PATH": f"{_GIB_ROOT}/configs/tuner_config.txtpb",
            "GPUINFRA_NCCL_PLUGIN_DIR": f"{_GIB_ROOT}/lib64",
        }
    ),
    host=HostInstall(template="fabric/gcp-gib-host.sh.j2", versions=_frozen({"nccl-gib": "1.1.0"})),
    container=Container(
        uverbs=True,
        mounts=(f"{_GIB_ROOT}:{_GIB_ROOT}:ro",),
        env=_frozen({"NCCL_NET": "gIB", "NCCL_SOCKET_IFNAME": "enp0s19,enp192s20"}),
        env_script=f"{_GIB_ROOT}/scripts/set_nccl_env.sh",
    ),
    sources=(
        "cluster-toolkit@10470803 examples/machine-learning/a3-ultragpu-8g/nccl-tests/run-nccl-tests.sh L34-56",
        "cluster-toolkit a3ultra-slurm-blueprint.yaml L43 (nccl_gib_version), L494-555",
        "cluster-toolkit a4-highgpu-8g/a4high-vm.yaml",
        "cluster-toolkit examples/gke-a3-ultragpu/nccl-jobset-example.yaml",
    ),
)

#: ``nic_layout`` -> its fabric.
FABRICS: Mapping[str, Fabric] = MappingProxyType({f.layout: f for f in (EFA, ENA, GVNIC, TCPX, TCPXO, GIB)})


def fabric_for(layout: str) -> Fabric:
    """The fabric of ``layout`` (``InstanceFacts.nic_layout``, or a plan's deployed layout).

    Raises:
        ValueError: a layout :data:`FABRICS` does not have.
    """
    try:
        return FABRICS[layout]
    except KeyError:
        raise ValueError(f"unknown nic_layout {layout!r}; known: {', '.join(FABRICS)}") from None
