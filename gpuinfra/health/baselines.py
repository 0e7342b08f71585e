"""Per-instance-type all-reduce bus bandwidth baselines (``data/baselines.json``).

Standard library only (read on the nodes too). Every baseline carries the observations it was
taken from, each with its source and what it measured; ``busbw_gbps`` is the lowest of them
(so a node that does as well as any published healthy run passes). A type or scope without an
entry has no baseline: the bandwidth check then says so instead of using a made-up number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BASELINES_PATH = Path(__file__).parent / "data" / "baselines.json"
#: ``inter_node``: 2+ nodes, traffic over the cluster network; ``intra_node``: one node (NVLink).
SCOPES = ("inter_node", "intra_node")


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
        scope: ``inter_node`` | ``intra_node``.
        nodes: nodes in the observed runs.
        message_size_bytes: message size the busbw was read at; None: the largest of the run.
        busbw_gbps: the baseline (lowest observation), GB/s.
        observations: what it was taken from.
    """

    cloud: str
    instance_type: str
    scope: str
    nodes: int
    message_size_bytes: int | None
    busbw_gbps: float
    observations: tuple[Observation, ...]

    @property
    def source(self) -> str:
        """The source of the observation the baseline equals."""
        return next(o.source for o in self.observations if o.busbw_gbps == self.busbw_gbps)

    def to_dict(self) -> dict:
        """JSON form (as in ``baselines.json``)."""
        return {"cloud": self.cloud, "instance_type": self.instance_type, "scope": self.scope, "nodes": self.nodes,
                "message_size_bytes": self.message_size_bytes, "busbw_gbps": self.busbw_gbps,
                "observations": [{"busbw_gbps": o.busbw_gbps, "source": o.source, "measured": o.measured}
                                 for o in self.observations]}

    @classmethod
    def from_dict(cls, data: dict) -> Baseline:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: a field is missing or the entry breaks a rule (scope, no observation,
                an observation without source, ``busbw_gbps`` not the lowest observation).
        """
        try:
            observations = tuple(Observation(float(o["busbw_gbps"]), str(o["source"]), str(o["measured"]))
                                 for o in data["observations"])
            size = data["message_size_bytes"]
            baseline = cls(str(data["cloud"]), str(data["instance_type"]), str(data["scope"]), int(data["nodes"]),
                           None if size is None else int(size), float(data["busbw_gbps"]), observations)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"baseline entry {data.get('instance_type', '?')!r} is invalid: {exc!r}") from None
        name = f"{baseline.instance_type} {baseline.scope}"
        if baseline.scope not in SCOPES:
            raise ValueError(f"baseline {name}: scope must be one of {', '.join(SCOPES)}")
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


def find_baseline(cloud: str, instance_type: str, scope: str, path: Path = BASELINES_PATH) -> Baseline | None:
    """The baseline of ``instance_type`` for ``scope``, or None when the table has none."""
    return next((b for b in load_baselines(path)
                 if (b.cloud, b.instance_type, b.scope) == (cloud, instance_type, scope)), None)
