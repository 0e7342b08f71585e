"""Training time: compute at an MFU per GPU and method, plus inter-node communication.

* Compute: FLOPs = 6*P*D, 8*P*D with full recompute (Kaplan et al. 2020, arXiv:2001.08361
  section 2.1; one extra forward for recompute), at the MFU of ``data/gpu_compute.yaml``
  (value and source per GPU and method): hours = FLOPs / (GPUs x peak x MFU x 3600).
* Communication per optimizer step and GPU (ZeRO paper, arXiv:1910.02054 section 7): data
  parallel all-reduce of 16-bit gradients = 2 x 2P bytes (ZeRO-1/2 the same volume);
  ZeRO-3 / FSDP all-gather parameters in forward and backward plus reduce-scatter gradients
  = 3 x 2P bytes; each scaled by (N-1)/N. LoRA/QLoRA exchange adapter gradients only. The
  volume crosses the node's network, shared by its GPUs: per-GPU bandwidth = node network
  bandwidth (catalog facts ``network_bandwidth_gbps``: AWS all cards, GCP the GPU NICs where
  the type has them, e.g. a3-megagpu-8g 8 x 200 Gbps, else the VM's maximum egress) / GPUs
  per node. Inside one node
  (NVLink / PCIe) communication is not counted. No overlap with compute is assumed (errs
  high). Steps = tokens / (seq x micro-batch x GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

COMPUTE = Path(__file__).parent / "data" / "gpu_compute.yaml"


@lru_cache(maxsize=1)
def gpu_compute() -> dict:
    """Peak TFLOP/s, bf16 and FlashAttention support per GPU, and MFU per method (and GPU)."""
    return yaml.safe_load(COMPUTE.read_text())


def mfu_for(method: str, gpu: str) -> tuple[float, str] | None:
    """(MFU, source) for a training method on a GPU; None for inference."""
    table = gpu_compute()["mfu"].get(method)
    if not table:
        return None
    entry = table.get(gpu, table["default"])
    return float(entry["value"]), str(entry["source"])


@dataclass(frozen=True)
class TrainingTime:
    """Hours to train: compute and exposed communication, with the MFU used."""

    compute_hours: float
    communication_hours: float | None
    mfu: float
    mfu_source: str

    @property
    def hours(self) -> float | None:
        """Total hours; None when the network bandwidth is unknown for a multi-node run."""
        if self.communication_hours is None:
            return None
        return self.compute_hours + self.communication_hours


def communication_bytes_per_step(trainable_params: float, strategy: str, gpus: int) -> float:
    """Bytes each GPU sends per optimizer step (module docstring)."""
    if gpus <= 1:
        return 0.0
    factor = 3 if strategy in ("zero3", "fsdp") else 2
    return factor * 2 * trainable_params * (gpus - 1) / gpus


def training_time(
    params: float,
    trainable_params: float,
    tokens: float,
    method: str,
    recompute: str,
    strategy: str,
    gpu: str,
    gpus_per_node: int,
    nodes: int,
    seq: int,
    batch: int,
    network_bandwidth_gbps: float | None,
) -> TrainingTime | None:
    """Hours to train ``tokens`` tokens; None for inference or a GPU without a known peak.

    Args:
        params: model parameters (FLOPs); trainable_params: what is communicated.
        network_bandwidth_gbps: node network bandwidth (Gbit/s); None when unknown.
    """
    facts = gpu_compute().get(gpu)
    mfu = mfu_for(method, gpu)
    if not facts or mfu is None or not tokens:
        return None
    gpus = gpus_per_node * nodes
    flops = (8 if recompute == "full" else 6) * params * tokens
    compute = flops / (gpus * facts["tflops"] * 1e12 * mfu[0] * 3600)
    if nodes <= 1:
        return TrainingTime(compute, 0.0, mfu[0], mfu[1])
    if not network_bandwidth_gbps:
        return TrainingTime(compute, None, mfu[0], mfu[1])
    steps = tokens / (seq * batch * gpus)
    per_gpu_bytes_per_s = network_bandwidth_gbps * 1e9 / 8 / gpus_per_node
    comm = steps * communication_bytes_per_step(trainable_params, strategy, gpus) / per_gpu_bytes_per_s / 3600
    return TrainingTime(compute, comm, mfu[0], mfu[1])
