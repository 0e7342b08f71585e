"""Pure planning of a GCP GPU cluster (no Pulumi imports): NIC layout, networks, compact
placement, disks, scheduling, image, NCCL environment -- decided and validated before any
resource is registered.

Sources (cluster-facts.md sections 2 and 6):

* NIC layouts: A3 High 1 system + 4 GPU gVNIC VPCs (GPUDirect-TCPX), A3 Mega 1 + 8 (TCPXO),
  MTU 8244 (cluster-toolkit a3high/a3mega blueprints, GKE gpu_direct.tf); A3 Ultra / A4 2 gVNIC
  VPCs (MTU 8896) + 8 MRDMA NICs on one RoCE VPC (network profile ``<zone>-vpc-roce``) with
  8 subnets and **no firewall rules** (modules/network/gpu-rdma-vpc, vpc/main.tf L191-198).
* Compact placement: ``collocation = COLLOCATED``, ``vm_count`` = number of VMs, at most 1500
  VMs per policy, not for N1/E2/M (slurm-gcp resume.py L50, L693-702); requires
  ``on_host_maintenance = TERMINATE`` and ``automatic_restart = false``; not with a reservation
  that does not accept external policies (resume.py L127-144). ``max_distance`` is left unset
  (A3 rejects 1).
* Scheduling: GPUs force ``TERMINATE`` on host maintenance; spot is ``provisioning_model=SPOT``;
  the TTL becomes ``max_run_duration`` with ``instance_termination_action = DELETE``
  (cloud.google.com/compute/docs/instances/limit-vm-runtime).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuinfra.catalog.model import InstanceFacts
from gpuinfra.catalog.store import Catalog
from gpuinfra.errors import SpecError
from gpuinfra.spec import ClusterSpec

MAX_VMS_PER_COMPACT_POLICY = 1500
NO_COMPACT_PLACEMENT_PREFIXES = ("n1-", "e2-", "t2d-", "t2a-", "m1-", "m2-", "m3-")
SYSTEM_CIDR = "10.128.0.0/20"
IAP_SSH_RANGE = "35.235.240.0/20"  # cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule
LOCAL_SSD_GIB = 375
DLVM_PROJECT = "deeplearning-platform-release"
TORCHRUN_PORT = 29500


@dataclass(frozen=True)
class NetworkPlan:
    """One VPC of the cluster.

    Attributes:
        role: ``system`` | ``gpu-<i>`` | ``net-1`` | ``roce``.
        mtu: network MTU.
        subnets: CIDRs of its subnets (8 for the RoCE VPC).
        nic_type: NIC type of the interfaces on it (``GVNIC`` | ``MRDMA``).
        firewall: allow internal tcp/udp/icmp (never on a RoCE VPC).
        roce: uses the zone's RoCE network profile.
    """

    role: str
    mtu: int
    subnets: tuple[str, ...]
    nic_type: str
    firewall: bool
    roce: bool = False


@dataclass(frozen=True)
class GcpClusterPlan:
    """Decisions for one GCP cluster."""

    networks: tuple[NetworkPlan, ...]
    nic_count: int
    compact_placement: bool
    local_ssd_count: int
    local_ssd_bundled: bool
    boot_disk_type: str
    image: str
    guest_accelerator: tuple[str, int] | None
    max_run_duration_seconds: int
    nic_layout: str


def network_layout(facts: InstanceFacts) -> tuple[NetworkPlan, ...]:
    """VPCs for the machine's NIC layout (see module docstring)."""
    layout = facts.nic_layout
    if layout in ("tcpx", "tcpxo"):
        gpu = tuple(
            NetworkPlan(f"gpu-{i}", 8244, (f"10.{i + 1}.0.0/20",), "GVNIC", True) for i in range(facts.gpu_nic_count)
        )
        return (NetworkPlan("system", 8244, (SYSTEM_CIDR,), "GVNIC", True), *gpu)
    if layout == "gib":
        roce_subnets = tuple(f"10.200.{i}.0/24" for i in range(facts.gpu_nic_count))
        return (
            NetworkPlan("system", 8896, (SYSTEM_CIDR,), "GVNIC", True),
            NetworkPlan("net-1", 8896, ("10.129.0.0/20",), "GVNIC", True),
            NetworkPlan("roce", 8896, roce_subnets, "MRDMA", False, roce=True),
        )
    return (NetworkPlan("system", 1460, (SYSTEM_CIDR,), "GVNIC", True),)


def nccl_env(layout: str) -> dict[str, str]:
    """NCCL environment per GPU network stack (cluster-facts.md section 2.6).

    TCPX: cluster-toolkit a3-highgpu-8g run-nccl-tests.sh; TCPXO: a3-megagpu-8g
    run-nccl-tests.sh (plus ``nccl-env-profile.sh`` from the plugin); gIB: a4high-vm.yaml.
    """
    if layout == "tcpx":
        return {
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
            "GPUINFRA_NCCL_PLUGIN_DIR": "/var/lib/tcpx/lib64",
        }
    if layout == "tcpxo":
        return {
            "NCCL_FASTRAK_CTRL_DEV": "enp0s12",
            "NCCL_FASTRAK_IFNAME": "enp6s0,enp7s0,enp13s0,enp14s0,enp134s0,enp135s0,enp141s0,enp142s0",
            "NCCL_SOCKET_IFNAME": "enp0s12",
            "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": "/dev/aperture_devices",
            "GPUINFRA_NCCL_ENV_PROFILE": "/var/lib/tcpxo/lib64/nccl-env-profile.sh",
            "GPUINFRA_NCCL_PLUGIN_DIR": "/var/lib/tcpxo/lib64",
        }
    if layout == "gib":
        return {
            "NCCL_CROSS_NIC": "0",
            "NCCL_NET_GDR_LEVEL": "PIX",
            "NCCL_P2P_NET_CHUNKSIZE": "131072",
            "NCCL_NVLS_CHUNKSIZE": "524288",
            "NCCL_IB_GID_INDEX": "3",
            "NCCL_IB_ADAPTIVE_ROUTING": "1",
            "NCCL_IB_QPS_PER_CONNECTION": "4",
            "NCCL_IB_TC": "52",
            "NCCL_IB_FIFO_TC": "84",
            "NCCL_TUNER_CONFIG_PATH": "/usr/local/gib/configs/tuner_config.txtpb",
            "GPUINFRA_NCCL_PLUGIN_DIR": "/usr/local/gib/lib64",
        }
    return {"NCCL_SOCKET_IFNAME": "^docker,lo,veth", "NCCL_DEBUG": "WARN"}


def _boot_disk_type(machine_type: str) -> str:
    # A3 Ultra and A4 take Hyperdisk only (cloud.google.com/compute/docs/accelerator-optimized-machines
    # #supported-disk-types); the others take Persistent Disk.
    return "hyperdisk-balanced" if machine_type.startswith(("a3-ultragpu-", "a4-")) else "pd-balanced"


def _attached_local_ssds(machine_type: str, min_gib: int) -> int:
    if min_gib <= 0:
        return 0
    count = math.ceil(min_gib / LOCAL_SSD_GIB)
    # counts Compute Engine accepts for attached local SSD: powers of two up to 8
    # (cloud.google.com/compute/docs/disks/local-ssd#choose_number_local_ssds)
    return min(8, 1 << (count - 1).bit_length())


def plan_gcp_cluster(spec: ClusterSpec, catalog: Catalog) -> GcpClusterPlan:
    """Decide and validate the GCP layout for ``spec``.

    Raises:
        SpecError: the machine type does not carry the requested GPU, compact placement on a
            family without it, too many VMs for one compact policy, a spec that is not GCP.
    """
    if spec.cloud != "gcp":
        raise SpecError(f"GcpGpuCluster needs cloud gcp, got {spec.cloud!r}")
    facts = catalog.fact("gcp", spec.instance_type)
    if facts is None:
        raise SpecError(f"{spec.instance_type!r} is not a GCP GPU machine type in the catalog")
    shapes = {(o.gpu, o.gpu_count, o.accelerator_type) for o in catalog.offers
              if o.cloud == "gcp" and o.instance_type == spec.instance_type}
    match = next((s for s in shapes if s[0] == spec.gpu and s[1] == spec.gpu_count), None)
    if match is None:
        carried = ", ".join(sorted(f"{c}x{g}" for g, c, _ in shapes)) or "no GPU"
        raise SpecError(
            f"{spec.instance_type} does not carry {spec.gpu_count}x{spec.gpu}; it carries: {carried}"
        )
    hbn = spec.profile.high_bandwidth_networking
    if hbn == "required" and facts.gpu_nic_count == 0:
        raise SpecError(
            f"profile {spec.profile.name!r} requires GPUDirect NICs, but {spec.instance_type} has none "
            "(a3-highgpu-8g, a3-megagpu-8g, a3-ultragpu-8g and a4-highgpu-8g have them)"
        )
    wants_compact = spec.nodes > 1 and spec.profile.placement == "required"
    if wants_compact and spec.instance_type.startswith(NO_COMPACT_PLACEMENT_PREFIXES):
        raise SpecError(
            f"compact placement is not supported on {spec.instance_type.split('-')[0].upper()} machines; "
            "use A2/A3/G2 machines or a profile with placement: none"
        )
    if wants_compact and spec.nodes > MAX_VMS_PER_COMPACT_POLICY:
        raise SpecError(
            f"vm_count {spec.nodes} is over the compact placement limit of {MAX_VMS_PER_COMPACT_POLICY} VMs per policy"
        )
    if spec.gcp_reservation and not spec.gcp_reservation_accepts_placement:
        wants_compact = False  # vanilla reservations don't take external placement policies
    bundled = facts.local_nvme_count
    attached = 0 if bundled else (
        _attached_local_ssds(spec.instance_type, spec.profile.scratch.min_gib) if spec.profile.scratch.required else 0
    )
    networks = network_layout(facts) if hbn != "off" else network_layout(
        type(facts)(**{**facts.to_dict(), "nic_layout": "gvnic", "gpu_nic_count": 0, "sources": facts.sources})
    )
    image = spec.gcp_image or f"projects/{DLVM_PROJECT}/global/images/family/{spec.profile.image.gcp_image_family}"
    guest = (match[2], spec.gpu_count) if spec.instance_type.startswith("n1-") else None
    return GcpClusterPlan(
        networks=networks,
        nic_count=sum(len(n.subnets) if n.roce else 1 for n in networks),
        compact_placement=wants_compact,
        local_ssd_count=bundled or attached,
        local_ssd_bundled=bool(bundled),
        boot_disk_type=_boot_disk_type(spec.instance_type),
        image=image,
        guest_accelerator=guest,
        max_run_duration_seconds=spec.profile.ttl_hours * 3600,
        nic_layout=facts.nic_layout if hbn != "off" else "gvnic",
    )
