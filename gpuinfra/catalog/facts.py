"""Instance facts from the clouds' own descriptions.

AWS facts are read from EC2 ``DescribeInstanceTypes`` output (the same parser serves the
shipped snapshot and ``gpuinfra catalog refresh``). GCP has no API field for GPU NIC layouts
or bundled local SSDs, so those come from a curated table with sources
(``gpuinfra/catalog/data/gcp_machine_facts.json``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpuinfra.catalog.model import InstanceFacts

#: Instance types whose GPUs sit on NVSwitch, so NVIDIA fabric manager must run.
#: Source: aws-parallelcluster-cookbook resources/fabric_manager/partial/_fabric_manager_common.rb
#: L33-62 (P4 PCI 10de:1af1, P5 10de:22a3) via cluster-facts.md sections 3.2 and 4.1.
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


def aws_facts_from_describe(instance_type: Mapping, source: str) -> InstanceFacts:
    """Build :class:`InstanceFacts` from one ``DescribeInstanceTypes`` ``InstanceTypes`` item.

    Args:
        instance_type: the item as boto3 returns it (keys ``InstanceType``, ``NetworkInfo``,
            ``InstanceStorageInfo``, ``PlacementGroupInfo`` ...).
        source: provenance written into ``sources``.

    Rules (cluster-facts.md section 6, items 5-6): the number of EFA interfaces is
    ``NetworkInfo.EfaInfo.MaximumEfaInterfaces`` (0 when ``EfaSupported`` is false); network
    cards are ``NetworkInfo.MaximumNetworkCards``; cluster placement is supported when
    ``PlacementGroupInfo.SupportedStrategies`` contains ``cluster``.
    """
    network = instance_type.get("NetworkInfo", {})
    cards = network.get("NetworkCards") or []
    efa = network.get("EfaInfo") or {}
    max_efa = int(efa.get("MaximumEfaInterfaces", 0)) if network.get("EfaSupported") else 0
    storage = instance_type.get("InstanceStorageInfo") or {}
    disks = storage.get("Disks") or []
    nvme_count = sum(int(d.get("Count", 0)) for d in disks)
    nvme_size_gib = round(float(disks[0]["SizeInGB"]) * _GB_TO_GIB, 2) if disks else 0.0
    peak = [c.get("PeakBandwidthInGbps") for c in cards]
    if cards and all(p is not None for p in peak):
        bandwidth = float(sum(peak))
    else:
        bandwidth = parse_network_performance_gbps(network.get("NetworkPerformance", ""))
    strategies = (instance_type.get("PlacementGroupInfo") or {}).get("SupportedStrategies", [])
    name = instance_type["InstanceType"]
    return InstanceFacts(
        cloud="aws",
        instance_type=name,
        network_cards=int(network.get("MaximumNetworkCards", max(len(cards), 1))),
        max_interfaces_per_network_card=min(
            (int(c.get("MaximumNetworkInterfaces", 1)) for c in cards), default=1
        ),
        max_efa_interfaces=max_efa,
        gpu_nic_count=max_efa,
        nic_layout="efa" if max_efa else "ena",
        mtu=AWS_VPC_MTU,
        local_nvme_count=nvme_count,
        local_nvme_size_gib=nvme_size_gib,
        nvswitch=name in AWS_NVSWITCH_TYPES,
        cluster_placement="cluster" in strategies,
        network_bandwidth_gbps=bandwidth,
        sources=(source,),
    )


def gcp_facts(machine_type: str, curated: Mapping) -> InstanceFacts | None:
    """Facts of a GCP machine type from the curated family table.

    Args:
        machine_type: e.g. ``a3-megagpu-8g``, ``n1-standard-8``.
        curated: the parsed ``gcp_machine_facts.json``.

    Returns:
        The facts, or None when no family in the table matches (the type is then left out of
        the catalog: gpuinfra does not guess NIC layouts).
    """
    for family in curated["families"]:
        if re.match(family["match"], machine_type):
            local_ssd = int(family.get("local_ssd_bundled", {}).get(machine_type, 0))
            gpu_nics = int(family["gpu_nic_count"])
            return InstanceFacts(
                cloud="gcp",
                instance_type=machine_type,
                network_cards=1,
                max_interfaces_per_network_card=1 + gpu_nics + (1 if family["nic_layout"] == "gib" else 0),
                max_efa_interfaces=0,
                gpu_nic_count=gpu_nics,
                nic_layout=family["nic_layout"],
                mtu=int(family["mtu"]),
                local_nvme_count=local_ssd,
                local_nvme_size_gib=float(curated["local_ssd_disk_size_gib"]) if local_ssd else 0.0,
                nvswitch=machine_type in family.get("nvswitch_types", []),
                cluster_placement=bool(family["compact_placement"]),
                network_bandwidth_gbps=None,
                sources=tuple(family["sources"]),
            )
    return None
