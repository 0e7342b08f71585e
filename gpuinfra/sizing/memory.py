"""Per-GPU memory of training and inference as the device sees it, in bytes (GiB at the edge).

A :class:`Workload` says what runs (method, storage and compute precision, strategy, offload,
recompute, attention, shape of the batch); :func:`memory_per_gpu` returns a
:class:`Breakdown`: model states (:mod:`gpuinfra.sizing.states`), activations / logits /
KV cache / workspace (:mod:`gpuinfra.sizing.activations`), the caching allocator's reserve
and the CUDA context. ``allocated`` is what ``torch.cuda.max_memory_allocated`` reports,
``reserved`` what ``max_memory_reserved`` reports, ``total`` what ``nvidia-smi`` shows for the
process.

Other formulas:

* KV cache: 2 * L * kv_heads * head_dim * seq * batch * bytes (transformers
  ``docs/source/en/llm_tutorial_optimization.md``), with the model's real KV heads.
* Quantized weights (bitsandbytes through transformers): int8 (LLM.int8, arXiv:2208.07339)
  1 B per linear weight; 4-bit (NF4/FP4, QLoRA arXiv:2305.14314 section 3) 4 bits plus one
  fp32 absmax per 64 weights = 4.5 bits, 4.127 bits with double quantization; embeddings and
  the LM head stay 16-bit. 4-bit matmuls dequantize one weight to the compute dtype at a time
  (workspace: the largest matrix).
* LoRA (arXiv:2106.09685): adapters r*(d_in + d_out) on q, k, v, o of every layer, kept in
  fp32 by PEFT (``autocast_adapter_dtype``) and trained with Adam: 16 B per adapter parameter
  plus the 16-bit copy autocast makes.
* QLoRA: bitsandbytes' 4-bit matmul saves its input for backward like a trained linear layer
  (bitsandbytes/autograd/_functions.py ``MatMul4Bit``), so its activations are those of full
  training minus nothing; plain LoRA's frozen 16-bit linears save no input.
* Optimizer step: PyTorch's default foreach AdamW (torch/optim/adamw.py ``_multi_tensor_adamw``)
  allocates ``sqrt(exp_avg_sq)`` for all parameters at once: 4 B per trainable parameter on
  the GPU, after the activations are freed (counted only where it exceeds them).
* Allocator reserve: :data:`ALLOCATOR_RESERVE_FRACTION` of allocated memory; CUDA context
  :data:`CUDA_CONTEXT_BYTES` (transformers ``model_memory_anatomy.md`` measures 1343 MiB on a
  V100; rounded up).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuinfra.sizing.activations import DEFAULT_LORA_SITES, prefill_workspace_bytes, training_activation_bytes
from gpuinfra.sizing.models import ModelShape
from gpuinfra.sizing.states import (
    OFFLOAD_STRATEGIES,
    deepspeed_zero2_estimate,
    deepspeed_zero3_estimate,
    full_training_states,
    zero_model_states,
)

GIB = 2**30
CUDA_CONTEXT_BYTES = 1.5 * GIB
#: Reserved-but-unallocated memory of PyTorch's caching allocator, as a fraction of the
#: allocated peak. Calibrated on the nvidia-smi rows of tests/fixtures/sizing/published.yaml
#: (transformers performance docs, BERT-large on a V100: the model without it is 3-12% low).
ALLOCATOR_RESERVE_FRACTION = 0.10
METHODS = ("pretrain", "full", "lora", "qlora", "inference")
STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "optimizer", "params")
ATTENTION = ("sdpa", "eager")
COMPUTE_PRECISIONS = ("bf16", "fp16", "fp32")
#: Bytes per weight by storage type; ``int4`` = bitsandbytes 4-bit without double quantization.
BYTES_PER_PARAM = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "int8": 1.0,
    "int4": 4.5 / 8,
    "nf4": 4.5 / 8,
    "nf4-dq": 4.127 / 8,
}
NF4_DOUBLE_QUANT_BYTES = 4.127 / 8  # QLoRA section 3: 4 + 0.127 bits per parameter
QUANTIZED = ("int8", "int4", "nf4", "nf4-dq")
DEFAULT_LORA_RANK = 16

__all__ = [
    "GIB",
    "Breakdown",
    "Workload",
    "memory_per_gpu",
    "kv_cache_bytes",
    "lora_params",
    "zero_model_states",
    "deepspeed_zero2_estimate",
    "deepspeed_zero3_estimate",
    "OFFLOAD_STRATEGIES",
]


@dataclass(frozen=True)
class Workload:
    """What runs on the GPUs.

    Attributes:
        shape: model shape.
        method: pretrain | full | lora | qlora | inference.
        compute: compute precision: bf16 | fp16 (autocast over fp32 weights for full training)
            | fp32.
        storage: how the weights are stored: training full/pretrain = fp32 master (ignored);
            lora: the frozen base (bf16 | fp16 | fp32 | int8); qlora: nf4 | nf4-dq; inference:
            fp32 | bf16 | fp16 | int8 | int4.
        strategy: ddp | fsdp | zero1 | zero2 | zero3 (sharding spans ``gpus``).
        recompute: none | selective | full.
        seq, batch: tokens per sequence; micro-batch per GPU (inference: concurrent sequences).
        gpus: all GPUs of all nodes; gpus_per_node: GPUs of one node (inference shards over them).
        attention: sdpa (FlashAttention / SDPA) | eager.
        offload: none | optimizer | params (CPU offload, full/pretrain with ZeRO or FSDP).
        lora_rank, lora_sites: LoRA rank; LoRA inputs with their own dropout per layer.
        fp32_loss: the loss upcasts logits to fp32 (transformers); False: 16-bit chunked loss.
        foreach_optimizer: PyTorch >= 2.0 foreach AdamW step workspace.
        adapter_bytes: bytes per stored adapter weight (4: PEFT fp32; 2: 16-bit "true" precision).
    """

    shape: ModelShape
    method: str = "full"
    compute: str = "bf16"
    storage: str = "bf16"
    strategy: str = "ddp"
    recompute: str = "none"
    seq: int = 2048
    batch: int = 1
    gpus: int = 1
    gpus_per_node: int = 1
    attention: str = "sdpa"
    offload: str = "none"
    lora_rank: int = DEFAULT_LORA_RANK
    lora_sites: int = DEFAULT_LORA_SITES
    fp32_loss: bool = True
    foreach_optimizer: bool = True
    adapter_bytes: int = 4


@dataclass(frozen=True)
class Breakdown:
    """Per-GPU bytes by kind, and CPU bytes per node for offload."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    kv_cache: float
    workspace: float
    allocator_reserve: float
    cuda_context: float
    cpu_per_node: float = field(default=0.0)

    KINDS = (
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "kv_cache",
        "workspace",
        "allocator_reserve",
        "cuda_context",
    )

    @property
    def allocated(self) -> float:
        """Peak of ``torch.cuda.max_memory_allocated``, bytes."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.kv_cache + self.workspace

    @property
    def reserved(self) -> float:
        """Peak of ``torch.cuda.max_memory_reserved``, bytes."""
        return self.allocated + self.allocator_reserve

    @property
    def total(self) -> float:
        """Device memory the process uses (nvidia-smi): reserved + CUDA context, bytes."""
        return self.reserved + self.cuda_context

    def gib(self) -> dict[str, float]:
        """The JSON breakdown in GiB (keys ``weights_gib`` ... ``cuda_context_gib``)."""
        return {f"{k}_gib": round(getattr(self, k) / GIB, 3) for k in self.KINDS}


def kv_cache_bytes(shape: ModelShape, seq: int, batch: int, bytes_per_value: float = 2.0) -> float:
    """K and V of every layer for ``batch`` sequences of ``seq`` tokens."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * seq * batch * bytes_per_value


def lora_params(shape: ModelShape, rank: int = DEFAULT_LORA_RANK) -> float:
    """LoRA adapter parameters on q, k, v, o of every layer: r * (d_in + d_out) each."""
    h, kv = shape.hidden, shape.kv_dim
    return shape.layers * rank * ((h + h) + (h + kv) + (h + kv) + (h + h))


def weight_bytes(shape: ModelShape, storage: str) -> float:
    """Stored weights: quantized block linears, 16-bit embeddings and LM head (module docstring)."""
    if storage not in QUANTIZED:
        return shape.params * BYTES_PER_PARAM[storage]
    return shape.quantizable_params * BYTES_PER_PARAM[storage] + (shape.params - shape.quantizable_params) * 2


def _compute_bytes(compute: str) -> int:
    return 4 if compute == "fp32" else 2


def memory_per_gpu(w: Workload) -> Breakdown:
    """Per-GPU memory of ``w`` (module docstring). Inputs are assumed validated
    (:class:`gpuinfra.sizing.recommend.SizingRequest`)."""
    shape, c = w.shape, _compute_bytes(w.compute)
    if w.method == "inference":
        return _inference(w, c)
    frozen = w.method in ("lora", "qlora")
    # bitsandbytes' 4-bit matmul keeps its input for backward (``MatMul4Bit.forward``:
    # ``ctx.tensors = (A, B)``, bitsandbytes 0.41), so a QLoRA base saves what a trained linear saves.
    activations = training_activation_bytes(
        shape,
        w.seq,
        w.batch,
        c,
        w.attention,
        w.recompute,
        w.method == "lora",
        w.lora_sites if frozen else 0,
        w.fp32_loss,
    )
    if frozen:
        base = weight_bytes(shape, w.storage)
        if w.strategy in ("zero3", "fsdp"):
            base = base / w.gpus + 2 * 2 * shape.layer_params
        adapters = lora_params(shape, w.lora_rank)
        a = w.adapter_bytes
        weights = base + a * adapters + (2 * adapters if a == 4 and c == 2 else 0)
        grads, optim, trainable, cpu = a * adapters, 2 * a * adapters, adapters, 0.0
        dequant = c * shape.largest_matrix_params if w.storage in QUANTIZED else 0.0
    else:
        states = full_training_states(
            shape.params, shape.layer_params, w.gpus, w.gpus_per_node, w.strategy, c == 2, w.offload
        )
        weights, grads, optim, cpu = states.weights, states.gradients, states.optimizer, states.cpu_per_node
        sharded = w.strategy in ("zero1", "zero2", "zero3", "fsdp")
        trainable = 0.0 if w.offload != "none" else shape.params / (w.gpus if sharded else 1)
        dequant = 0.0
    step = 4 * trainable if w.foreach_optimizer else 0.0
    workspace = max(0.0, step - activations) + dequant
    allocated = weights + grads + optim + activations + workspace
    return Breakdown(
        weights,
        grads,
        optim,
        activations,
        0.0,
        workspace,
        ALLOCATOR_RESERVE_FRACTION * allocated,
        CUDA_CONTEXT_BYTES,
        cpu,
    )


def _inference(w: Workload, c: int) -> Breakdown:
    shape, t = w.shape, max(1, w.gpus_per_node)  # tensor parallel inside one node
    kv_bytes = 4 if w.storage == "fp32" else 2
    c = 4 if w.storage == "fp32" or w.compute == "fp32" else 2
    weights = weight_bytes(shape, w.storage)
    kv = kv_cache_bytes(shape, w.seq, w.batch, kv_bytes)
    workspace = prefill_workspace_bytes(shape, w.seq, w.batch, c, w.attention)
    if w.storage in QUANTIZED:
        workspace += c * shape.largest_matrix_params
    allocated = (weights + kv + workspace) / t
    return Breakdown(
        weights / t, 0.0, 0.0, 0.0, kv / t, workspace / t, ALLOCATOR_RESERVE_FRACTION * allocated, CUDA_CONTEXT_BYTES
    )
