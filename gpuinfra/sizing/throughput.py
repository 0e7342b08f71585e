"""Training time: compute at a cited utilization, communication as NCCL runs it, overlap, and
the pipeline bubble, for one :class:`gpuinfra.sizing.layout.Layout`.

Per optimizer step, with m = accumulation micro-batches, p = pipeline stages:

* Compute of one micro-batch on one GPU: hardware FLOPs per token
  (:func:`gpuinfra.sizing.mfu.token_flops`) x micro-batch x seq / (tp x pp), at peak
  (``data/gpu_compute.yaml``) x utilization (:func:`gpuinfra.sizing.mfu.utilization`).
* Tensor parallel: 2 all-reduces of the micro-batch's activations (micro-batch x seq x hidden
  x 2 B) per layer in the forward and 2 in the backward (Megatron-LM, Shoeybi et al. 2019
  arXiv:1909.08053 section 3; Narayanan et al. 2021 arXiv:2104.04473 section 3.2), 2 more with
  full recompute, inside the node, on the critical path (not overlapped).
* Pipeline: each micro-batch sends its activations forward and their gradients back across
  every stage boundary, scattered over the tp ranks (Narayanan 2021 section 4.1: b s h / t
  per GPU), over one GPU's share of the node's NICs. A step takes (m + p - 1) micro-batch
  slots, of which p - 1 are the bubble.
* Data parallel (ZeRO paper, Rajbhandari et al. 2020 arXiv:1910.02054 section 7), on the
  gradients of the stage's shard (trainable params / (tp x pp)):
  - ddp: one all-reduce per step of the fp32 gradients (PyTorch DDP reduces the ``.grad`` of
    fp32 parameters under autocast; LoRA adapters are fp32), bucketed so it runs during the
    backward of the last micro-batch (Li et al. 2020, arXiv:2006.15704 section 3.2.3): what
    exceeds that backward is exposed.
  - zero1 / zero2: reduce-scatter of 16-bit gradients during that backward, then an
    all-gather of the updated 16-bit parameters after the step (exposed): the all-reduce's
    volume, 2 x 2 x params.
  - zero3 / fsdp: for every micro-batch, all-gather the 16-bit parameters for the forward
    and again for the backward, and reduce-scatter the gradients (3 x 2 x params, ZeRO
    section 7.2.2; FSDP reduce-scatters every backward), prefetched so it overlaps that
    micro-batch's compute; what exceeds the compute is exposed. LoRA/QLoRA gather the frozen
    base at its stored width and reduce only the adapters.
* Collective times: :mod:`gpuinfra.sizing.comm` (NCCL bus bandwidth, NVLink inside a node, the
  node's GPU NICs across nodes, cited efficiencies).

Steps = tokens / (global batch x seq). MFU = model FLOPs (no recompute) / (time x GPUs x peak).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from gpuinfra.sizing.comm import (
    ALL_GATHER,
    ALL_REDUCE,
    NETWORK_EFFICIENCY,
    NVLINK_EFFICIENCY,
    REDUCE_SCATTER,
    Links,
)
from gpuinfra.sizing.layout import Layout
from gpuinfra.sizing.mfu import token_flops, utilization
from gpuinfra.sizing.models import ModelShape

COMPUTE = Path(__file__).parent / "data" / "gpu_compute.yaml"
#: Bytes of a 16-bit activation / gathered parameter / ZeRO gradient.
HALF_BYTES = 2
#: Bytes of a DDP gradient (fp32 parameters under autocast; fp32 LoRA adapters).
DDP_GRAD_BYTES = 4
#: Share of a micro-batch's compute that is its backward: 2 of 3 forward-equivalents, 3 of 4
#: with full recompute (the recomputed forward runs inside the backward).
BACKWARD_SHARE = {"full": 3 / 4}
DEFAULT_BACKWARD_SHARE = 2 / 3


@lru_cache(maxsize=1)
def gpu_compute() -> dict:
    """Peak TFLOP/s, bf16 and FlashAttention support per GPU (``data/gpu_compute.yaml``)."""
    return yaml.safe_load(COMPUTE.read_text())


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step on one GPU, by cause.

    Attributes:
        compute_seconds: m micro-batches of compute.
        bubble_seconds: the p - 1 idle pipeline slots.
        tensor_parallel_seconds, pipeline_seconds: their communication (exposed).
        data_parallel_seconds: data-parallel communication before overlap.
        data_parallel_exposed_seconds: what the overlap leaves on the critical path.
        None in a field: the communication crosses nodes of unknown bandwidth.
    """

    compute_seconds: float
    bubble_seconds: float | None
    tensor_parallel_seconds: float
    pipeline_seconds: float | None
    data_parallel_seconds: float | None
    data_parallel_exposed_seconds: float | None

    @property
    def communication_seconds(self) -> float | None:
        """All communication of the step before overlap."""
        if self.pipeline_seconds is None or self.data_parallel_seconds is None:
            return None
        return self.tensor_parallel_seconds + self.pipeline_seconds + self.data_parallel_seconds

    @property
    def exposed_communication_seconds(self) -> float | None:
        """Communication on the critical path."""
        if self.pipeline_seconds is None or self.data_parallel_exposed_seconds is None:
            return None
        return self.tensor_parallel_seconds + self.pipeline_seconds + self.data_parallel_exposed_seconds

    @property
    def seconds(self) -> float | None:
        """The step: compute + bubble + exposed communication."""
        exposed = self.exposed_communication_seconds
        if exposed is None or self.bubble_seconds is None:
            return None
        return self.compute_seconds + self.bubble_seconds + exposed

    @property
    def overlap_fraction(self) -> float | None:
        """Share of the communication hidden behind compute (None without communication)."""
        total, exposed = self.communication_seconds, self.exposed_communication_seconds
        if not total or exposed is None:
            return None
        return 1 - exposed / total


@dataclass(frozen=True)
class TrainingTime:
    """Hours to train, the step they come from, and the utilization used.

    Attributes:
        layout: the parallel layout.
        step: one optimizer step (:class:`StepTime`).
        steps: optimizer steps for the tokens.
        utilization: hardware FLOPs utilization assumed for compute; utilization_source: its run.
        model_flops_per_step: model FLOPs of one step on all GPUs (MFU numerator).
        peak_flops: dense 16-bit peak of all GPUs, FLOP/s.
    """

    layout: Layout
    step: StepTime
    steps: float
    utilization: float
    utilization_source: str
    model_flops_per_step: float
    peak_flops: float

    def _hours(self, seconds: float | None) -> float | None:
        return None if seconds is None else seconds * self.steps / 3600

    @property
    def compute_hours(self) -> float:
        """Compute (no bubble, no communication)."""
        return self.step.compute_seconds * self.steps / 3600

    @property
    def communication_hours(self) -> float | None:
        """Exposed communication; None when unknown."""
        return self._hours(self.step.exposed_communication_seconds)

    @property
    def bubble_hours(self) -> float | None:
        """Pipeline bubble."""
        return self._hours(self.step.bubble_seconds)

    @property
    def hours(self) -> float | None:
        """Total hours; None when the network bandwidth is unknown for a multi-node run."""
        return self._hours(self.step.seconds)

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization of the whole run (None when the time is unknown)."""
        seconds = self.step.seconds
        return None if not seconds else self.model_flops_per_step / (seconds * self.peak_flops)

    def to_json(self) -> dict:
        """Step, communication and utilization figures (``gpuinfra size --json`` ``time``)."""
        s = self.step
        r = lambda v, n=4: None if v is None else round(v, n)  # noqa: E731
        return {
            "layout": self.layout.to_json(),
            "steps": round(self.steps),
            "step_seconds": r(s.seconds),
            "compute_seconds_per_step": r(s.compute_seconds),
            "bubble_seconds_per_step": r(s.bubble_seconds),
            "communication_seconds_per_step": r(s.communication_seconds),
            "exposed_communication_seconds_per_step": r(s.exposed_communication_seconds),
            "tensor_parallel_seconds_per_step": r(s.tensor_parallel_seconds),
            "pipeline_seconds_per_step": r(s.pipeline_seconds),
            "data_parallel_seconds_per_step": r(s.data_parallel_seconds),
            "overlap_fraction": r(s.overlap_fraction, 3),
            "utilization": self.utilization,
            "utilization_source": self.utilization_source,
            "mfu": r(self.mfu, 3),
        }


def step_time(
    shape: ModelShape,
    method: str,
    recompute: str,
    strategy: str,
    gpu: str,
    layout: Layout,
    seq: int,
    links: Links,
    nodes: int,
    trainable_params: float,
    gathered_bytes_per_param: float = HALF_BYTES,
    adapter_params: float = 0.0,
) -> tuple[StepTime, float, str, float]:
    """One optimizer step (module docstring) and (utilization, its source, model FLOPs per step).

    Args:
        shape: the model; method: pretrain | full | lora | qlora; recompute: none | selective | full.
        strategy: ddp | zero1 | zero2 | zero3 | fsdp.
        gpu: catalog GPU model (peak from ``gpu_compute.yaml``).
        layout: dp / tp / pp / micro-batch / accumulation.
        links: the node's links (:func:`gpuinfra.sizing.comm.links_for`); nodes: node count.
        trainable_params: parameters with gradients (all, or the LoRA adapters).
        gathered_bytes_per_param: bytes per parameter ZeRO-3 / FSDP gathers (16-bit, or the
            frozen base's storage for LoRA/QLoRA).
        adapter_params: LoRA adapter parameters (FLOPs).

    Raises:
        KeyError: ``gpu`` has no peak in ``gpu_compute.yaml``.
    """
    peak = gpu_compute()[gpu]["tflops"] * 1e12
    util = utilization(gpu, method, shape.params)
    flops = token_flops(shape, seq, method, recompute, adapter_params)
    tokens_mb = layout.micro_batch * seq
    model_parallel = layout.tp * layout.pp
    t_mb = flops.hardware * tokens_mb / model_parallel / (peak * util.value)
    m, p = layout.accumulation, layout.pp
    gpn = links.gpus_per_node
    # tensor parallel: all-reduces of b x s x h 16-bit activations, inside the node
    activation_bytes = tokens_mb * shape.hidden * HALF_BYTES
    per_layer = 4 + (2 if recompute == "full" else 0)
    tp_one = links.collective_seconds(ALL_REDUCE, activation_bytes, layout.tp, layout.tp) or 0.0
    t_tp_mb = shape.layers / p * per_layer * tp_one
    # pipeline: activations forward and gradients back per micro-batch, scattered over tp
    stages_per_node = max(1, p // nodes) if p > 1 else 1
    p2p = links.p2p_seconds(activation_bytes / layout.tp, across_nodes=p > stages_per_node) if p > 1 else 0.0
    t_pp_mb = None if p2p is None else 2 * p2p
    # data parallel over dp ranks, k of them per node
    ranks_per_node = max(1, gpn // (layout.tp * stages_per_node))
    shard = trainable_params / model_parallel
    dp, backward = layout.dp, BACKWARD_SHARE.get(recompute, DEFAULT_BACKWARD_SHARE)
    coll = links.collective_seconds
    dp_total: float | None
    dp_exposed: float | None
    if strategy in ("zero3", "fsdp"):
        gathered = shape.params / model_parallel * gathered_bytes_per_param
        ag = coll(ALL_GATHER, gathered, dp, ranks_per_node)
        rs = coll(REDUCE_SCATTER, shard * HALF_BYTES, dp, ranks_per_node)
        per_mb = None if ag is None or rs is None else 2 * ag + rs
        dp_total = None if per_mb is None else m * per_mb
        dp_exposed = None if per_mb is None else m * max(0.0, per_mb - t_mb)
    elif strategy in ("zero1", "zero2"):
        rs = coll(REDUCE_SCATTER, shard * HALF_BYTES, dp, ranks_per_node)
        ag = coll(ALL_GATHER, shard * HALF_BYTES, dp, ranks_per_node)
        dp_total = None if rs is None or ag is None else rs + ag
        dp_exposed = None if rs is None or ag is None else max(0.0, rs - backward * t_mb) + ag
    else:
        ar = coll(ALL_REDUCE, shard * DDP_GRAD_BYTES, dp, ranks_per_node)
        dp_total = ar
        dp_exposed = None if ar is None else max(0.0, ar - backward * t_mb)
    slot = None if t_pp_mb is None else t_mb + t_tp_mb + t_pp_mb
    step = StepTime(
        compute_seconds=m * t_mb,
        bubble_seconds=None if slot is None else (p - 1) * slot,
        tensor_parallel_seconds=m * t_tp_mb,
        pipeline_seconds=None if t_pp_mb is None else m * t_pp_mb,
        data_parallel_seconds=dp_total,
        data_parallel_exposed_seconds=dp_exposed,
    )
    model_flops = flops.model * tokens_mb * m * dp
    return step, util.value, util.source, model_flops


def training_time(
    shape: ModelShape,
    method: str,
    recompute: str,
    strategy: str,
    gpu: str,
    layout: Layout,
    seq: int,
    tokens: float,
    links: Links,
    nodes: int,
    trainable_params: float,
    gathered_bytes_per_param: float = HALF_BYTES,
    adapter_params: float = 0.0,
) -> TrainingTime | None:
    """Hours to train ``tokens`` tokens (module docstring); None for a GPU without a known peak.

    Arguments as :func:`step_time`; ``tokens``: training tokens.
    """
    if gpu not in gpu_compute() or not tokens:
        return None
    step, util, source, model_flops = step_time(
        shape,
        method,
        recompute,
        strategy,
        gpu,
        layout,
        seq,
        links,
        nodes,
        trainable_params,
        gathered_bytes_per_param,
        adapter_params,
    )
    steps = tokens / (layout.global_batch * seq)
    peak = gpu_compute()[gpu]["tflops"] * 1e12 * layout.gpus
    return TrainingTime(layout, step, steps, util, source, model_flops, peak)


def time_assumptions(time: TrainingTime | None) -> list[dict]:
    """Every assumed value behind ``time`` (a candidate's training time), as ``{"name",
    "value", "source"}``: utilization, link efficiencies, gradient widths and the overlap rules
    (the layout sizes chosen rather than given are in
    :meth:`gpuinfra.sizing.recommend.SizingRequest.assumptions`). Empty without a training time."""
    if time is None:
        return []
    return [
        {"name": "utilization", "value": time.utilization, "source": time.utilization_source},
        {
            "name": "nvlink_efficiency",
            "value": round(NVLINK_EFFICIENCY, 3),
            "source": "nccl-tests all_reduce busbw 230.77 GB/s on 1 x p4dn (github.com/NVIDIA/nccl/issues/527) / 300 GB/s",
        },
        {
            "name": "network_efficiency",
            "value": round(NETWORK_EFFICIENCY, 3),
            "source": "nccl-tests all_reduce busbw 29.61 GB/s on 4 x p4dn over EFA (github.com/NVIDIA/nccl/issues/527) / 50 GB/s",
        },
        {
            "name": "ddp_gradient_bytes",
            "value": DDP_GRAD_BYTES,
            "source": "PyTorch DDP all-reduces the fp32 .grad of fp32 parameters under autocast",
        },
        {
            "name": "zero_fsdp_bytes",
            "value": HALF_BYTES,
            "source": "16-bit parameters gathered and gradients reduced (ZeRO paper section 7)",
        },
        {
            "name": "overlap",
            "value": "ddp/zero1/zero2: gradient reduction during the last backward; zero3/fsdp: prefetch "
            "over each micro-batch; tensor / pipeline parallel: none",
            "source": "Li et al. 2020 (arXiv:2006.15704) section 3.2.3; ZeRO paper section 7.2.2",
        },
    ]
