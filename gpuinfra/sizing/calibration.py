"""Compare the memory model with measured rows (published fixture, harness results).

A row (``tests/fixtures/sizing/published.yaml``, ``benchmarks/results/gpu-memory-*.json``)
names a model, a workload and one measured value with its metric and unit; :func:`predict`
builds the :class:`gpuinfra.sizing.memory.Workload` the row describes and returns the model's
value for the same metric.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuinfra.errors import SizingError
from gpuinfra.sizing.memory import Breakdown, Workload, memory_per_gpu
from gpuinfra.sizing.models import get_model

UNITS = {"MiB": 2**20, "GiB": 2**30, "GB": 1e9, "bytes": 1}
METRICS = ("allocated", "reserved", "device_used")
#: Row keys copied onto the Workload when present.
WORKLOAD_KEYS = (
    "method",
    "compute",
    "storage",
    "strategy",
    "recompute",
    "seq",
    "batch",
    "gpus",
    "gpus_per_node",
    "attention",
    "offload",
    "lora_rank",
    "lora_sites",
    "lora_dropout",
    "fp32_loss",
    "optimizer",
    "adapter_bytes",
    "engine",
    "grads_between_steps",
)


@dataclass(frozen=True)
class Comparison:
    """One row against the model: measured and predicted bytes, and the relative error."""

    row_id: str
    measured_bytes: float
    predicted_bytes: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured; positive = the model errs high (safe side)."""
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def workload_for(row: dict) -> Workload:
    """The :class:`Workload` a fixture row describes.

    Raises:
        SizingError: unknown model name or a key the model cannot express.
    """
    shape = get_model(row["model"])
    kwargs = {k: row[k] for k in WORKLOAD_KEYS if k in row}
    return Workload(shape=shape, **kwargs)


def metric_bytes(breakdown: Breakdown, metric: str) -> float:
    """The model's value for a measured metric (module docstring)."""
    if metric == "allocated":
        return breakdown.allocated
    if metric == "reserved":
        return breakdown.reserved
    if metric == "device_used":
        return breakdown.total
    raise SizingError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")


def predict(row: dict) -> Comparison:
    """Measured vs predicted for one row."""
    measured = float(row["measured"]) * UNITS[row["unit"]]
    predicted = metric_bytes(memory_per_gpu(workload_for(row)), row["metric"])
    return Comparison(row["id"], measured, predicted)
