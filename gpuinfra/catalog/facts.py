"""Instance facts from the clouds' own descriptions.

AWS facts are read from EC2 ``DescribeInstanceTypes`` output (the same parser serves the
shipped snapshot and ``gpuinfra catalog refresh``). GCP has no API field for GPU NIC layouts,
bundled local SSDs or network bandwidth, so those come from a curated table with sources
(``gpuinfra/catalog/data/gcp_machine_facts.json``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpuinfra.catalog.facts_model import (
    AWS_GPUDIRECT_RDMA_SOURCE,
    AWS_GPUDIRECT_RDMA_TYPES,
    InstanceFacts,
    LocalSsdFacts,
    NicNetwork,
    PlacementFacts,
    aws_primary_card_gbps,
)

#: Instance types whose GPUs sit on NVSwitch, so NVIDIA fabric manager must run.
#: Source: aws-parallelcluster-cookbook resources/fabric_manager/partial/_fabric_manager_common.rb
#: L33-62 (P4 PCI 10de:1af1, P5 10de:22a3) via docs/sources/cluster-facts.md sections 3.2 and 4.1.
AWS_NVSWITCH_TYPES = frozenset(
    {
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
    }
)

#: EC2 VPC jumbo-frame MTU (docs.aws.amazon.com/AWSEC2/latest/UserGuide/network_mtu.html).
AWS_VPC_MTU = 9001

#: EBS volume types a root volume may use on any EC2 GPU instance (st1/sc1 cannot boot)
#: (docs.aws.amazon.com/ebs/latest/userguide/ebs-volume-types.html).
AWS_BOOT_DISK_TYPES = ("gp3", "gp2", "io2", "io1")

#: EC2 ``SupportedUsageClasses`` -> gpuinfra provisioning model
#: (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceTypeInfo.html).
_AWS_USAGE_CLASSES = {"on-demand": "on-demand", "spot": "spot", "capacity-block": "capacity-block"}

#: EC2 names the 80 GB A100 and the 32 GB V100 like the smaller ones; memory tells them apart.
_AWS_GPU_NAME_BY_MEMORY = {("A100", 81920): "A100-80GB", ("V100", 32768): "V100-32GB"}

_GB_TO_GIB = 1e9 / 2**30
_BANDWIDTH_RE = re.compile(r"(?:(\d+)x\s*)?(\d+(?:\.\d+)?)\s*Gigabit", re.IGNORECASE)


def parse_network_performance_gbps(text: str) -> float | None:
    """Turn EC2 ``NetworkPerformance`` into Gbps.

    Args:
        text: e.g. ``"100 Gigabit"``, ``"4x 100 Gigabit"``, ``"Up to 25 Gigabit"``.

    Returns:
        The advertised (peak) figure in Gbps, or None when the text has no number.
    """
    match = _BANDWIDTH_RE.search(text or "")
    if not match:
        return None
    multiplier = int(match.group(1) or 1)
    return multiplier * float(match.group(2))


def aws_gpu_name(name: str, memory_mib: int) -> str:
    """Canonical GPU model for an EC2 GPU (EC2 names the 80 GB A100 just ``A100``)."""
    return _AWS_GPU_NAME_BY_MEMORY.get((name, memory_mib), name)


def aws_facts_from_describe(instance_type: Mapping, source: str) -> InstanceFacts:
    """Build :class:`InstanceFacts` from one ``DescribeInstanceTypes`` ``InstanceTypes`` item.

    Args:
        instance_type: the item as boto3 returns it (keys ``InstanceType``, ``GpuInfo``,
            ``NetworkInfo``, ``InstanceStorageInfo``, ``PlacementGroupInfo``,
            ``SupportedUsageClasses``).
        source: provenance written into ``sources``.

    Rules (docs/sources/cluster-facts.md section 6, items 5-6): the number of EFA interfaces is
    ``NetworkInfo.EfaInfo.MaximumEfaInterfaces`` (0 when ``EfaSupported`` is false); network
    cards are ``NetworkInfo.MaximumNetworkCards``; cluster placement is supported when
    ``PlacementGroupInfo.SupportedStrategies`` contains ``cluster``; provisioning models are
    ``SupportedUsageClasses`` (``on-demand``, ``spot``, ``capacity-block``). The VPC MTU is
    9001 (jumbo frames).

    Raises:
        pydantic.ValidationError: the item describes an impossible combination.
    """
    network = instance_type.get("NetworkInfo", {})
    cards = network.get("NetworkCards") or []
    efa = network.get("EfaInfo") or {}
    max_efa = int(efa.get("MaximumEfaInterfaces", 0)) if network.get("EfaSupported") else 0
    storage = instance_type.get("InstanceStorageInfo") or {}
    disks = storage.get("Disks") or []
    nvme_count = sum(int(d.get("Count", 0)) for d in disks)
    nvme_size_gib = round(float(disks[0]["SizeInGB"]) * _GB_TO_GIB, 2) if disks else 0.0
    bandwidth = aws_bandwidth_gbps(network)
    strategies = (instance_type.get("PlacementGroupInfo") or {}).get("SupportedStrategies", [])
    gpus = (instance_type.get("GpuInfo") or {}).get("Gpus") or []
    gpu = aws_gpu_name(gpus[0]["Name"], int(gpus[0].get("MemoryInfo", {}).get("SizeInMiB", 0))) if gpus else None
    usage = instance_type.get("SupportedUsageClasses") or ["on-demand"]
    name = instance_type["InstanceType"]
    card_count = int(network.get("MaximumNetworkCards", max(len(cards), 1)))
    return InstanceFacts(
        cloud="aws",
        instance_type=name,
        gpu=gpu,
        gpu_count=sum(int(g.get("Count", 0)) for g in gpus),
        network_cards=card_count,
        max_interfaces_per_network_card=min((int(c.get("MaximumNetworkInterfaces", 1)) for c in cards), default=1),
        max_efa_interfaces=max_efa,
        gpudirect_rdma=bool(max_efa) and name in AWS_GPUDIRECT_RDMA_TYPES,
        nic_layout="efa" if max_efa else "ena",
        networks=(
            NicNetwork(role="system", nic_type="EFA" if max_efa else "ENA", count=max(max_efa, 1), mtu=AWS_VPC_MTU),
        ),
        local_ssd=LocalSsdFacts(
            bundled_count=nvme_count, size_gib=nvme_size_gib, interface="NVME" if nvme_count else ""
        ),
        boot_disk_types=AWS_BOOT_DISK_TYPES,
        nvswitch=name in AWS_NVSWITCH_TYPES,
        placement=PlacementFacts(cluster_placement_group="cluster" in strategies),
        provisioning_models=tuple(_AWS_USAGE_CLASSES[u] for u in usage if u in _AWS_USAGE_CLASSES),
        network_bandwidth_gbps=bandwidth,
        host_nic_bandwidth_gbps=aws_primary_card_gbps(bandwidth, card_count),
        sources={
            "describe": source,
            "mtu": "docs.aws.amazon.com/AWSEC2/latest/UserGuide/network_mtu.html (9001 in a VPC)",
            "boot_disk_types": "docs.aws.amazon.com/ebs/latest/userguide/ebs-volume-types.html",
            "nvswitch": "aws-parallelcluster-cookbook fabric_manager/partial/_fabric_manager_common.rb L33-62",
            "gpudirect_rdma": AWS_GPUDIRECT_RDMA_SOURCE,
        },
    )


def _gcp_gpu(machine_type: str, curated: Mapping) -> tuple[str | None, int]:
    """(GPU model, count) built into a GCP machine type, from the curated ``host_gpu_map``."""
    for gpu, by_count in curated["host_gpu_map"].items():
        if gpu.startswith("_"):
            continue
        for count, hosts in by_count.items():
            if machine_type in ([hosts] if isinstance(hosts, str) else hosts):
                return ("H100" if gpu == "H100-MEGA" else gpu), int(count)
    return None, 0


def aws_bandwidth_gbps(network: Mapping) -> float | None:
    """The instance's network bandwidth (Gbit/s) from EC2 ``NetworkInfo``.

    An explicit ``NetworkPerformance`` ("400 Gigabit", "3200 Gigabit") is AWS's published total
    and wins; ``PeakBandwidthInGbps`` summed over ``NetworkCards`` serves the "Up to N Gigabit"
    types and records without a figure. In the shipped snapshot the per-card peaks contradict
    the published total for g6e.24xlarge (2 x 200 vs "200 Gigabit"), g6e.48xlarge (4 x 400 vs
    "400 Gigabit") and p6-b200.48xlarge (8 x 200 vs "3200 Gigabit"). The totals agree with
    AWS's EFA page for G6e ("up to 4 cards / 400 Gbps", docs.aws.amazon.com/AWSEC2/latest/UserGuide/p5-efa.html
    as quoted in docs/sources/cluster-facts.md section 3.5) and with p5's 32 cards / 3,200 Gbps.
    """
    text = network.get("NetworkPerformance", "") or ""
    advertised = parse_network_performance_gbps(text)
    if advertised and not text.lower().startswith("up to"):
        return advertised
    peak = [c.get("PeakBandwidthInGbps") for c in network.get("NetworkCards") or []]
    if peak and all(p is not None for p in peak):
        return float(sum(peak))
    return advertised


def gcp_bandwidth_gbps(
    machine_type: str, family: Mapping, networks: tuple[NicNetwork, ...]
) -> tuple[float | None, float | None]:
    """(GPU-traffic, host-NIC) bandwidth in Gbit/s of a GCP machine type from its family's
    ``network_bandwidth`` table (sources in the family's ``sources.network_bandwidth``).

    Args:
        machine_type: e.g. ``a3-megagpu-8g``.
        family: the curated family entry that matched ``machine_type``.
        networks: the type's NIC networks (roles ``gpu`` / ``roce`` are GPU NICs).

    Rules: a type with GPU NICs gives ``gpu_nics_gbps`` (all GPU NICs together: they carry
    NCCL) and ``host_nics_gbps`` (all other gVNICs together: they reach Cloud Storage); a type
    without GPU NICs has one gVNIC, so its ``vm_max_gbps`` serves both. A type missing from the
    table, or a missing figure, is unknown (None): gpuinfra does not guess bandwidth.

    Raises:
        ValueError: the entry is inconsistent (GPU-NIC figures on a type without GPU NICs, or
            GPU + host NICs above the VM's maximum egress).
    """
    entry = family.get("network_bandwidth", {}).get(machine_type)
    if entry is None:
        return None, None
    vm, gpu, host = (entry.get(k) for k in ("vm_max_gbps", "gpu_nics_gbps", "host_nics_gbps"))
    if not any(n.role in ("gpu", "roce") for n in networks):
        if gpu is not None or host is not None:
            raise ValueError(f"gcp_machine_facts.json: {machine_type} has no GPU NICs but lists GPU/host NIC bandwidth")
        return (None, None) if vm is None else (float(vm), float(vm))
    if vm is not None and gpu is not None and host is not None and gpu + host > vm:
        raise ValueError(
            f"gcp_machine_facts.json: {machine_type} GPU NICs {gpu} + host NICs {host} Gbps exceed the VM's {vm} Gbps"
        )
    return (None if gpu is None else float(gpu)), (None if host is None else float(host))


def gcp_facts(machine_type: str, curated: Mapping) -> InstanceFacts | None:
    """Facts of a GCP machine type from the curated family table.

    Args:
        machine_type: e.g. ``a3-megagpu-8g``, ``n1-standard-8``.
        curated: the parsed ``gcp_machine_facts.json``.

    Returns:
        The facts, or None when no family in the table matches (the type is then left out of
        the catalog: gpuinfra does not guess NIC layouts).

    Raises:
        pydantic.ValidationError: the curated entry is inconsistent.
        ValueError: the curated bandwidth entry is inconsistent (:func:`gcp_bandwidth_gbps`).
    """
    for family in curated["families"]:
        if not re.match(family["match"], machine_type):
            continue
        lssd = family["local_ssd"]
        bundled = int(lssd["bundled"].get(machine_type, 0))
        attach = lssd["attach_counts"].get(machine_type, lssd["attach_counts"].get("*", []))
        gpu, gpu_count = _gcp_gpu(machine_type, curated)
        networks = tuple(NicNetwork(**n) for n in family["networks"])
        provisioning = family.get("provisioning_models_by_type", {}).get(machine_type, family["provisioning_models"])
        gpu_traffic_gbps, host_nic_gbps = gcp_bandwidth_gbps(machine_type, family, networks)
        return InstanceFacts(
            cloud="gcp",
            instance_type=machine_type,
            gpu=gpu,
            gpu_count=gpu_count,
            guest_accelerators=family["gpu"] is None,
            network_cards=1,
            max_interfaces_per_network_card=sum(n.count for n in networks),
            max_efa_interfaces=0,
            nic_layout=family["nic_layout"],
            networks=networks,
            local_ssd=LocalSsdFacts(
                bundled_count=bundled,
                attach_counts=tuple(attach),
                size_gib=float(curated["local_ssd"]["size_gib"]) if (bundled or attach) else 0.0,
                interface=lssd["interface"] if (bundled or attach) else "",
                list_in_template=bool(lssd["list_in_template"]),
            ),
            boot_disk_types=tuple(family["boot_disk_types"]),
            nvswitch=machine_type in family.get("nvswitch_types", []),
            placement=PlacementFacts(**family["placement"]),
            provisioning_models=tuple(provisioning),
            network_bandwidth_gbps=gpu_traffic_gbps,
            host_nic_bandwidth_gbps=host_nic_gbps,
            sources={**family["sources"], "local_ssd_size": curated["local_ssd"]["_source"]},
        )
    return None
