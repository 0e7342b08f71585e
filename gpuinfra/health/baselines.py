"""Per-instance-type all-reduce bus bandwidth baselines (``data/baselines.json``).

Standard library only (read on the nodes too). Every baseline carries the observations it was
taken from, each with its source and what it measured; ``busbw_gbps`` is the lowest of them
(so a node that does as well as any published healthy run passes). A type without an entry has
no baseline: the bandwidth check then says so instead of using a made-up number.

A baseline applies only to what it measured:

* the same node count: busbw changes with the number of nodes (NVIDIA/nccl#1221: 8 x H100 per
  node with NVLS reach ~430 GB/s on 1 and 2 nodes but ~320 GB/s beyond 2), so a 2-node number
  is never used for 4 nodes;
* the same network (``nic_layout``, multi-node only): a number taken over EFA or GPUDirect says
  nothing about a cluster deployed without it (``high_bandwidth_networking: off``);
* the message size it was read at (``message_size_bytes``, required): busbw grows with the size
  and peaks differ by algorithm (NVLS), so a number without its size cannot be compared fairly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BASELINES_PATH = Path(__file__).parent / "data" / "baselines.json"
#: ``inter_node``: 2+ nodes, traffic over the cluster network; ``intra_node``: one node (NVLink).
SCOPES = ("inter_node", "intra_node")


def scope_of(nodes: int) -> str:
    """``intra_node`` for one node, else ``inter_node``."""
    return "intra_node" if nodes == 1 else "inter_node"


@dataclass(frozen=True)
class Observation:
    """One published measurement: ``busbw_gbps`` in GB/s, ``source`` (URL), ``measured`` (setup)."""

    busbw_gbps: float
    source: str
    measured: str


@dataclass(frozen=True)
class Baseline:
    """Expected all_reduce_perf out-of-place busbw of one instance type and scope.

    Attributes:
        cloud: ``aws`` | ``gcp``.
        instance_type: e.g. ``p5.48xlarge``.
        scope: ``inter_node`` | ``intra_node`` (follows from ``nodes``).
        nodes: nodes in the observed runs; the baseline is used for clusters of exactly as many.
        nic_layout: the network the runs went over (``efa``, ``tcpx``, ...; as in the facts).
        message_size_bytes: message size the busbw was read at (the gate compares that row).
        busbw_gbps: the baseline (lowest observation), GB/s.
        observations: what it was taken from.
    """

    cloud: str
    instance_type: str
    scope: str
    nodes: int
    nic_layout: str
    message_size_bytes: int
    busbw_gbps: float
    observations: tuple[Observation, ...]

    @property
    def source(self) -> str:
        """The source of the observation the baseline equals."""
        return next(o.source for o in self.observations if o.busbw_gbps == self.busbw_gbps)

    def to_dict(self) -> dict:
        """JSON form (as in ``baselines.json``)."""
        return {
            "cloud": self.cloud,
            "instance_type": self.instance_type,
            "scope": self.scope,
            "nodes": self.nodes,
            "nic_layout": self.nic_layout,
            "message_size_bytes": self.message_size_bytes,
            "busbw_gbps": self.busbw_gbps,
            "observations": [
                {"busbw_gbps": o.busbw_gbps, "source": o.source, "measured": o.measured} for o in self.observations
            ],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Baseline:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: a field is missing or the entry breaks a rule (scope not the one of
                ``nodes``, no message size, no observation, an observation without source,
                ``busbw_gbps`` not the lowest observation).
        """
        try:
            observations = tuple(
                Observation(float(o["busbw_gbps"]), str(o["source"]), str(o["measured"])) for o in data["observations"]
            )
            size = data["message_size_bytes"]
            if size is None:
                raise ValueError(
                    "message_size_bytes is null: a baseline without the message size it was read at "
                    "cannot be compared fairly"
                )
            baseline = cls(
                str(data["cloud"]),
                str(data["instance_type"]),
                str(data["scope"]),
                int(data["nodes"]),
                str(data["nic_layout"]),
                int(size),
                float(data["busbw_gbps"]),
                observations,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"baseline entry {data.get('instance_type', '?')!r} is invalid: {exc!r}") from None
        name = f"{baseline.instance_type} {baseline.scope}"
        if baseline.nodes < 1 or baseline.scope != scope_of(baseline.nodes):
            raise ValueError(f"baseline {name}: nodes {baseline.nodes} needs scope {scope_of(max(baseline.nodes, 1))}")
        if baseline.message_size_bytes < 1:
            raise ValueError(f"baseline {name}: message_size_bytes must be positive")
        if not observations or any(not o.source.strip() or not o.measured.strip() for o in observations):
            raise ValueError(f"baseline {name}: every observation needs a source and what it measured")
        if baseline.busbw_gbps != min(o.busbw_gbps for o in observations):
            raise ValueError(f"baseline {name}: busbw_gbps must be the lowest observation")
        return baseline


@lru_cache(maxsize=4)
def load_baselines(path: Path = BASELINES_PATH) -> tuple[Baseline, ...]:
    """Every baseline of the table.

    Raises:
        ValueError: the file is not valid JSON or an entry is invalid (see :meth:`Baseline.from_dict`).
    """
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    return tuple(Baseline.from_dict(entry) for entry in doc["baselines"])


def find_baseline(
    cloud: str, instance_type: str, nodes: int, nic_layout: str, path: Path = BASELINES_PATH
) -> Baseline | None:
    """The baseline measured on exactly ``nodes`` x ``instance_type`` (over ``nic_layout`` when
    ``nodes`` > 1; one node does not use the network), or None when the table has none."""
    return next(
        (
            b
            for b in load_baselines(path)
            if (b.cloud, b.instance_type, b.nodes) == (cloud, instance_type, nodes)
            and (nodes == 1 or b.nic_layout == nic_layout)
        ),
        None,
    )


def baseline_nodes(cloud: str, instance_type: str, path: Path = BASELINES_PATH) -> tuple[int, ...]:
    """Node counts the table has a baseline for, for ``instance_type`` (for messages)."""
    return tuple(
        sorted({b.nodes for b in load_baselines(path) if (b.cloud, b.instance_type) == (cloud, instance_type)})
    )
