"""Collective communication time per rank, as NCCL measures it.

NCCL's definitions (github.com/NVIDIA/nccl-tests doc/PERFORMANCE.md): a collective over ``n``
ranks on a buffer of ``S`` bytes takes ``t``; algorithm bandwidth ``algbw = S / t``; bus
bandwidth ``busbw = algbw x factor``, the rate every rank's busiest link runs at, with factor
``2(n-1)/n`` for all-reduce and ``(n-1)/n`` for all-gather and reduce-scatter (``S`` = the
whole gathered buffer). So ``t = S x factor / busbw``, and ``busbw`` is a property of the
links, not of ``n``.

Links (:class:`Links`):

* Inside a node: the GPU's NVLink / PCIe bandwidth per direction (``data/links.yaml``, NVIDIA
  datasheets) x :data:`NVLINK_EFFICIENCY`.
* Across nodes: a ring or tree crosses each node's NICs once per direction, so a collective
  whose ranks fill every GPU of the node runs at the node's GPU-NIC bandwidth (catalog facts
  ``network_bandwidth_gbps``: EFA on AWS, GPUDirect-TCPX/TCPXO or RDMA NICs on GCP) x
  :data:`NETWORK_EFFICIENCY`; a group with ``k`` of the node's ``G`` GPUs (tensor or pipeline
  parallel splitting the node) gets ``k / G`` of it.
* Point-to-point (pipeline stages on different nodes): one GPU's share of the node's NICs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

LINKS = Path(__file__).parent / "data" / "links.yaml"

#: Achieved all-reduce bus bandwidth inside one NVSwitch node / NVLink bandwidth per direction:
#: 230.77 GB/s measured by nccl-tests ``all_reduce_perf`` on one p4dn.24xlarge (8 x A100, 1 GiB)
#: against NVLink's 300 GB/s per direction (github.com/NVIDIA/nccl/issues/527).
NVLINK_EFFICIENCY = 230.77 / 300
#: Achieved all-reduce bus bandwidth across nodes / the node's network bandwidth: 29.61 GB/s
#: measured on 4 x p4dn.24xlarge over EFA (400 Gbit/s = 50 GB/s per node), 1 GiB
#: (github.com/NVIDIA/nccl/issues/527; 2 nodes read higher because NCCL's tree halves the
#: traffic there, nccl-tests issue 22). 3 nodes: 31.77 GB/s (tests/sizing/test_comm.py).
NETWORK_EFFICIENCY = 29.61 / 50
#: Collectives :func:`bus_factor` knows (nccl-tests doc/PERFORMANCE.md).
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "all_reduce", "all_gather", "reduce_scatter"


def bus_factor(collective: str, ranks: int) -> float:
    """NCCL's bus-bandwidth factor for ``collective`` over ``ranks`` ranks (0 for one rank).

    Raises:
        ValueError: an unknown collective.
    """
    if ranks <= 1:
        return 0.0
    if collective == ALL_REDUCE:
        return 2 * (ranks - 1) / ranks
    if collective in (ALL_GATHER, REDUCE_SCATTER):
        return (ranks - 1) / ranks
    raise ValueError(f"unknown collective {collective!r}")


@lru_cache(maxsize=1)
def link_table() -> dict:
    """The parsed ``data/links.yaml`` (GPU -> intra-node link, GB/s per direction, source)."""
    return yaml.safe_load(LINKS.read_text())


@dataclass(frozen=True)
class Links:
    """Achievable bus bandwidth of one node's links, bytes/s.

    Attributes:
        gpus_per_node: GPUs in the node.
        intra_bytes_per_s: NVLink / PCIe per GPU and direction x :data:`NVLINK_EFFICIENCY`.
        network_bytes_per_s: the node's GPU NICs together x :data:`NETWORK_EFFICIENCY`; None
            when the catalog has no bandwidth for the type (time then unknown).
        intra_source, network_source: where the raw figures come from.
    """

    gpus_per_node: int
    intra_bytes_per_s: float
    network_bytes_per_s: float | None
    intra_source: str
    network_source: str

    def bus_bytes_per_s(self, ranks: int, ranks_per_node: int) -> float | None:
        """Bus bandwidth of a collective over ``ranks`` ranks, ``ranks_per_node`` of them in each
        node (module docstring); None when it crosses nodes of unknown bandwidth."""
        if ranks <= ranks_per_node:
            return self.intra_bytes_per_s
        if self.network_bytes_per_s is None:
            return None
        share = self.network_bytes_per_s * min(ranks_per_node, self.gpus_per_node) / self.gpus_per_node
        return min(self.intra_bytes_per_s, share)

    def collective_seconds(self, collective: str, size_bytes: float, ranks: int, ranks_per_node: int) -> float | None:
        """Seconds for ``collective`` on a ``size_bytes`` buffer (the whole buffer: gathered
        output, reduced input) over ``ranks`` ranks; 0 for one rank; None when unknown."""
        factor = bus_factor(collective, ranks)
        if not factor or not size_bytes:
            return 0.0
        bw = self.bus_bytes_per_s(ranks, ranks_per_node)
        return None if bw is None else size_bytes * factor / bw

    def p2p_seconds(self, size_bytes: float, across_nodes: bool) -> float | None:
        """Seconds to send ``size_bytes`` from one GPU to one GPU (pipeline stage boundary)."""
        if not across_nodes:
            return size_bytes / self.intra_bytes_per_s
        if self.network_bytes_per_s is None:
            return None
        return size_bytes / (self.network_bytes_per_s / self.gpus_per_node)


def links_for(gpu: str, gpus_per_node: int, network_bandwidth_gbps: float | None) -> Links:
    """The :class:`Links` of a node of ``gpus_per_node`` x ``gpu`` whose GPU NICs carry
    ``network_bandwidth_gbps`` Gbit/s (None: unknown). A GPU missing from ``links.yaml`` gets
    PCIe Gen3 x16's 16 GB/s per direction (the slowest link listed; errs slow)."""
    entry = link_table().get(gpu) or {"gb_per_s": 16, "source": "not listed: PCIe Gen3 x16 assumed"}
    intra = float(entry["gb_per_s"]) * 1e9 * NVLINK_EFFICIENCY
    network = None if not network_bandwidth_gbps else network_bandwidth_gbps * 1e9 / 8 * NETWORK_EFFICIENCY
    return Links(
        gpus_per_node,
        intra,
        network,
        str(entry["source"]),
        "catalog facts network_bandwidth_gbps" if network_bandwidth_gbps else "unknown",
    )
