"""Per-GPU memory of training and inference as the device sees it, in bytes (GiB at the edge).

A :class:`Workload` says what runs (method, storage and compute precision, strategy, offload,
recompute, attention, optimizer, engine, shape of the batch); :func:`memory_per_gpu` returns a
:class:`Breakdown` at the peak phase with the allocated bytes of every phase. ``allocated`` is
what ``torch.cuda.max_memory_allocated`` reports, ``reserved`` what ``max_memory_reserved``
reports, ``total`` what the device shows in use for the process.

Training = persistent memory + the largest phase of a step (checked phase by phase against
benchmarks/results/memory-phases-h100-2026-11-26):

* between steps: weights (full training with DDP: the fp32 parameters, 4 B; LoRA: the frozen
  base + fp32 adapters) and the optimizer state (:data:`OPTIMIZERS`);
* forward: + the 16-bit copies ``torch.autocast`` caches of every fp32 weight (2 B/param, freed
  when autocast exits) + the saved activations (or, with recompute, each layer's input) + the
  loss (:mod:`gpuinfra.sizing.activations`);
* backward: gradients exist from here on (fp32, 4 B per trainable parameter): the larger of the
  start (saved activations, the casts autograd saved, the loss's backward) and the end (all
  gradients + one layer's recomputed activations);
* optimizer step: gradients + the optimizer's workspace (foreach AdamW 4 B/param, fused none).
  ``zero_grad(set_to_none=True)`` frees the gradients before the next step.

ZeRO / FSDP shard as in :mod:`gpuinfra.sizing.states` (one GPU shards nothing: sized as DDP).

Other formulas:

* KV cache: 2 * L * kv_heads * head_dim * seq * batch * bytes (transformers
  ``docs/source/en/llm_tutorial_optimization.md``), with the model's real KV heads. HF
  ``generate()`` keeps :data:`HF_KV_RESERVE_FRACTION` of it reserved on top; vLLM
  preallocates :data:`VLLM_GPU_MEMORY_UTILIZATION` of the device and must hold it all inside.
* Quantized weights (bitsandbytes through transformers): int8 (LLM.int8, arXiv:2208.07339)
  1 B per linear weight; 4-bit (NF4/FP4, QLoRA arXiv:2305.14314 section 3) 4 bits plus one
  fp32 absmax per 64 weights = 4.5 bits, 4.127 bits with double quantization; embeddings and
  the LM head stay 16-bit. 4-bit matmuls dequantize one weight to the compute dtype at a time
  (workspace: the largest matrix).
* LoRA (arXiv:2106.09685): adapters r*(d_in + d_out) on q, k, v, o of every layer, kept in
  fp32 by PEFT (``autocast_adapter_dtype``); their 16-bit autocast copies live in the forward.
* QLoRA: bitsandbytes' 4-bit matmul saves its input for backward like a trained linear layer
  (bitsandbytes/autograd/_functions.py ``MatMul4Bit``); plain LoRA's frozen 16-bit linears save
  no input.
* Allocator reserve (training): :data:`ALLOCATOR_RESERVE_FRACTION` of the allocated peak; CUDA
  context and libraries: :data:`CUDA_CONTEXT_BYTES`. Both measured on an H100 (the files are
  named at each constant).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpuinfra.sizing.activations import DEFAULT_LORA_SITES, prefill_workspace_bytes, training_activation_phases
from gpuinfra.sizing.models import ModelShape
from gpuinfra.sizing.states import (
    OFFLOAD_STRATEGIES,
    deepspeed_zero2_estimate,
    deepspeed_zero3_estimate,
    full_training_states,
    zero_model_states,
)

GIB = 2**30
#: CUDA context, kernels and library workspaces outside PyTorch's pool (``mem_get_info`` used -
#: ``memory_reserved``), measured on an H100 with torch 2.11: 0.68-0.75 GiB in
#: ../shared/data/sizing/h100-measured-2026-11-22.jsonl (all nine rows, copied to
#: tests/fixtures/sizing/h100-measured-2026-11-22.jsonl) and 1.19-1.26 GiB in every row of
#: benchmarks/results/memory-phases-h100-2026-11-26 and kv-throughput-h100-2026-11-27 (the
#: harness also loads bitsandbytes / cuDNN attention). The largest measured value: a fit must
#: hold for every stack measured.
CUDA_CONTEXT_BYTES = 1.26 * GIB
#: Reserved-but-unallocated memory of PyTorch's caching allocator in training, as a fraction of
#: the allocated peak: the mean of (max_memory_reserved - max_memory_allocated) /
#: max_memory_allocated over the 19 training rows measured on an H100 (the six that fit in
#: h100-measured-2026-11-22.jsonl, the nine of memory-phases-h100-2026-11-26, the four of
#: kv-throughput-h100-2026-11-27): 0.026-0.151, mean 0.081.
ALLOCATOR_RESERVE_FRACTION = 0.081
#: HF ``generate()`` with the dynamic KV cache: every decode step reallocates each layer's K and
#: V one token longer (``torch.cat`` in ``DynamicLayer.update``), and the caching allocator keeps
#: the blocks the shorter tensors leave. Reserved - allocated, as a fraction of the KV cache, in
#: the two rows that generate 64 tokens (h100-measured-2026-11-22.jsonl mistral-7b-infer-s4096-b8
#: 0.45, phi3-infer-s4096-b16 0.75): their mean. The rows that generate 16 tokens (memory-phases
#: and kv-throughput files) show 0.16-0.46: the model errs high for short outputs.
HF_KV_RESERVE_FRACTION = 0.60
#: vLLM preallocates this fraction of the device memory for weights, activations and its paged
#: KV cache ("vLLM pre-allocates GPU cache using this percentage of memory", ``gpu_memory_utilization``,
#: default 0.9: docs.vllm.ai/en/stable/configuration/optimization/).
VLLM_GPU_MEMORY_UTILIZATION = 0.9
#: Tokens of one vLLM forward pass (``max_num_batched_tokens``; chunked prefill splits longer
#: prompts): the activation peak vLLM's profile run reserves. 8192 as in the example of
#: docs.vllm.ai/en/stable/configuration/optimization/ (an assumption: the default depends on
#: the vLLM version and GPU).
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
METHODS = ("pretrain", "full", "lora", "qlora", "inference")
STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "optimizer", "params")
ATTENTION = ("sdpa", "eager")
COMPUTE_PRECISIONS = ("bf16", "fp16", "fp32")
ENGINES = ("hf", "vllm")
#: Optimizer state and step workspace in bytes per trainable parameter (fp32 gradients):
#: * adamw-fused: ``torch.optim.AdamW(fused=True)`` (the HF Trainer default ``adamw_torch_fused``
#:   since transformers 4.55 / torch 2.8): exp_avg + exp_avg_sq fp32 = 8 B, updated in place.
#: * adamw-foreach: ``AdamW(foreach=True)`` (PyTorch's default on CUDA): 8 B, and the step
#:   allocates ``_foreach_sqrt(exp_avg_sqs)`` for all parameters at once (torch/optim/adamw.py
#:   ``_multi_tensor_adamw``): 4 B (measured 3.99 B: memory-phases-h100-2026-11-26 README).
#: * adamw-8bit: bitsandbytes ``AdamW8bit``: two 8-bit states with one fp32 absmax per block of
#:   256 (block-wise quantization, Dettmers et al., arXiv:2110.02861): 2 + 8/256 B; the update
#:   kernel works in place.
#: * adafactor: factored second moment, row + column statistics per matrix, no first moment
#:   (Shazeer & Stern, arXiv:1804.04235; transformers ``Adafactor`` default ``beta1=None``):
#:   4 B x (rows + cols) per matrix, ~8/h B per parameter; the step's fp32 update buffers are
#:   per tensor.
#: * sgd: ``torch.optim.SGD(momentum=0.9)``: one fp32 momentum buffer, 4 B, in-place update.
OPTIMIZERS = ("adamw-fused", "adamw-foreach", "adamw-8bit", "adafactor", "sgd")
DEFAULT_OPTIMIZER = "adamw-fused"
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
        offload: none | optimizer | params (CPU offload: full/pretrain with ZeRO or FSDP;
            lora/qlora: the adapters' optimizer on the CPU, DeepSpeed ZeRO-Offload).
        lora_rank, lora_sites: LoRA rank; LoRA-adapted linear layers per layer.
        lora_dropout: the adapters apply dropout (p > 0); False: PEFT's default p = 0.
        fp32_loss: the loss upcasts logits to fp32 (transformers); False: 16-bit chunked loss.
        optimizer: one of :data:`OPTIMIZERS`.
        adapter_bytes: bytes per stored adapter weight (4: PEFT fp32; 2: 16-bit "true" precision).
        grads_between_steps: gradients stay allocated between steps (``zero_grad(set_to_none=False)``,
            PyTorch < 2.0's default, which transformers' Trainer called before torch 2.0 made
            ``set_to_none=True`` the default); False: freed after each optimizer step.
        engine: inference engine: hf (``generate()``, dynamic KV cache) | vllm (preallocated pool).
        gpu_memory_utilization: vLLM's share of the device memory.
        tp, pp: tensor and pipeline parallel sizes of a training run (``gpus`` is then the
            data-parallel ranks that ZeRO / FSDP shard over): every phase's model states, autocast
            copies and optimizer workspace split over tp x pp, its activations over tp
            (:mod:`gpuinfra.sizing.layout`).
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
    lora_dropout: bool = True
    fp32_loss: bool = True
    optimizer: str = DEFAULT_OPTIMIZER
    adapter_bytes: int = 4
    grads_between_steps: bool = False
    engine: str = "hf"
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    tp: int = 1
    pp: int = 1


@dataclass(frozen=True)
class Breakdown:
    """Per-GPU bytes by kind at the peak phase, and CPU bytes per node for offload.

    ``phase`` names the peak (``forward`` | ``backward`` | ``optimizer_step`` | ``generate`` |
    ``vllm_pool``); ``phases`` holds the allocated bytes of every phase (training:
    ``between_steps``, ``forward``, ``backward``, ``optimizer_step``). For vLLM,
    ``preallocated`` is what the engine takes from the device (``gpu_memory_utilization`` x
    device memory is decided by the caller); the kinds are what must fit inside it.
    """

    weights: float
    gradients: float
    optimizer: float
    activations: float
    kv_cache: float
    workspace: float
    allocator_reserve: float
    cuda_context: float
    cpu_per_node: float = field(default=0.0)
    phase: str = ""
    phases: dict[str, float] = field(default_factory=dict)

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

    def phases_gib(self) -> dict[str, float]:
        """Allocated GiB per phase (``{"forward": ...}``), empty for inference."""
        return {k: round(v / GIB, 3) for k, v in self.phases.items()}


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


def optimizer_bytes(optimizer: str, trainable: float, shape: ModelShape) -> tuple[float, float]:
    """(state bytes, step workspace bytes) of ``optimizer`` over ``trainable`` parameters
    (:data:`OPTIMIZERS` comment has the sources).

    Raises:
        ValueError: unknown optimizer.
    """
    if optimizer == "adamw-fused":
        return 8 * trainable, 0.0
    if optimizer == "adamw-foreach":
        return 8 * trainable, 4 * trainable
    if optimizer == "adamw-8bit":
        return (2 + 8 / 256) * trainable, 0.0
    if optimizer == "adafactor":
        # rows + cols fp32 per h x n matrix ~ 2 * 4 / h B per parameter; per-tensor fp32 update
        # buffers (squared gradient and update) of the largest matrix
        return 8 * trainable / shape.hidden, 2 * 4 * min(trainable, shape.largest_matrix_params)
    if optimizer == "sgd":
        return 4 * trainable, 0.0
    raise ValueError(f"unknown optimizer {optimizer!r}")


def memory_per_gpu(w: Workload) -> Breakdown:
    """Per-GPU memory of ``w`` (module docstring). Inputs are assumed validated
    (:class:`gpuinfra.sizing.recommend.SizingRequest`)."""
    c = _compute_bytes(w.compute)
    if w.method == "inference":
        return _inference(w, c)
    return _training(w, c)


def _training(w: Workload, c: int) -> Breakdown:
    """Persistent memory (weights, optimizer state) + the largest phase of a step: forward
    (autocast 16-bit copies of the weights, saved activations, loss), backward (gradients from
    here on), optimizer step (gradients + the optimizer's workspace)."""
    shape = w.shape
    frozen = w.method in ("lora", "qlora")
    mixed = c == 2
    dequant = 0.0
    cpu = 0.0
    if frozen:
        base = weight_bytes(shape, w.storage)
        if w.strategy in ("zero3", "fsdp"):
            base = base / w.gpus + 2 * 2 * shape.layer_params
        adapters = lora_params(shape, w.lora_rank)
        a = w.adapter_bytes
        weights = base + a * adapters
        copies = 2 * adapters if a == 4 and mixed else 0.0  # autocast copy of the fp32 adapters
        grads = a * adapters
        state, step = optimizer_bytes(w.optimizer, adapters, shape)
        state = state * a / 4  # 16-bit adapters keep 16-bit states (LitGPT "bf16-true")
        if w.offload != "none":  # ZeRO-Offload: the adapters' optimizer steps on the CPU
            cpu, state, step = state + 4 * adapters, 0.0, 0.0
        residual = 4 if w.storage == "fp32" else c
        dequant = c * shape.largest_matrix_params if w.storage in QUANTIZED else 0.0
    elif w.strategy == "ddp" and w.offload == "none":
        p = shape.params
        weights = 4 * p  # fp32 master weights = the model's parameters
        copies = 2 * p if mixed else 0.0  # autocast's cache of 16-bit weights, inside the forward
        grads = 4 * p
        state, step = optimizer_bytes(w.optimizer, p, shape)
        residual = 4  # fp32 embedding output; residual adds stay fp32 under autocast
    else:
        states = full_training_states(
            shape.params, shape.layer_params, w.gpus, w.gpus_per_node, w.strategy, mixed, w.offload
        )
        weights, grads, cpu = states.weights, states.gradients, states.cpu_per_node
        copies = 0.0  # ZeRO / FSDP MixedPrecision keep the 16-bit parameters themselves
        sharded = shape.params / w.gpus
        if w.offload != "none":
            state, step = states.optimizer, 0.0
        else:  # fp32 master shard (4 B) + the optimizer's state on the shard
            own, step = optimizer_bytes(w.optimizer, sharded, shape)
            state = (4 * sharded if mixed else 0.0) + own
        residual = c
    acts = training_activation_phases(
        shape,
        w.seq,
        w.batch,
        c,
        w.attention,
        w.recompute,
        w.method == "lora",  # bitsandbytes' 4-bit matmul saves its input like a trained linear
        w.lora_sites if frozen else 0,
        w.fp32_loss,
        residual,
        w.lora_dropout,
    )
    if w.tp * w.pp > 1:  # Megatron layout (gpuinfra.sizing.layout): split before the phases are compared
        split = w.tp * w.pp
        weights, copies, grads, state, step, dequant = (
            x / split for x in (weights, copies, grads, state, step, dequant)
        )
        # offload: a node's CPU holds its GPUs' shares of the whole model, whatever the layout;
        # the estimators took dp ranks as the nodes' GPUs (states.full_training_states)
        per_node = max(1, w.gpus_per_node)
        cpu = cpu * max(1, w.gpus // per_node) / max(1, w.gpus * split // per_node)
        acts = replace(
            acts,
            forward=acts.forward / w.tp,
            backward_start=acts.backward_start / w.tp,
            backward_end=acts.backward_end / w.tp,
        )
    persistent = weights + state + (grads if w.grads_between_steps else 0.0)
    if w.grads_between_steps:
        weights, grads = weights + grads, 0.0  # counted with the persistent weights
    saved_copies = copies if w.recompute == "none" else 0.0  # autograd keeps the casts it saved
    phases = {
        "between_steps": persistent,
        "forward": persistent + copies + acts.forward + dequant,
        "backward": persistent + max(saved_copies + acts.backward_start, grads + acts.backward_end) + dequant,
        "optimizer_step": persistent + grads + step,
    }
    phase = max(("forward", "backward", "optimizer_step"), key=lambda k: phases[k])
    if phase == "forward":
        parts = (weights + copies, 0.0, state, acts.forward, 0.0, dequant)
    elif phase == "backward" and saved_copies + acts.backward_start > grads + acts.backward_end:
        parts = (weights + saved_copies, 0.0, state, acts.backward_start, 0.0, dequant)
    elif phase == "backward":
        parts = (weights, grads, state, acts.backward_end, 0.0, dequant)
    else:
        parts = (weights, grads, state, 0.0, 0.0, step)
    allocated = sum(parts)
    return Breakdown(
        *parts,
        ALLOCATOR_RESERVE_FRACTION * allocated,
        CUDA_CONTEXT_BYTES,
        cpu,
        phase=phase,
        phases=phases,
    )


def _inference(w: Workload, c: int) -> Breakdown:
    """HF ``generate()``: weights + the KV cache of ``batch`` sequences of ``seq`` tokens + the
    prefill's transient peak; the allocator keeps :data:`HF_KV_RESERVE_FRACTION` of the KV cache
    on top. vLLM: the same parts must fit in its preallocated pool (the caller compares with
    ``gpu_memory_utilization`` x device memory); its paged cache leaves no reserve."""
    shape, t = w.shape, max(1, w.gpus_per_node)  # tensor parallel inside one node
    kv_bytes = 4 if w.storage == "fp32" else 2
    c = 4 if w.storage == "fp32" or w.compute == "fp32" else 2
    weights = weight_bytes(shape, w.storage)
    kv = kv_cache_bytes(shape, w.seq, w.batch, kv_bytes)
    if w.engine == "vllm":  # chunked prefill: one pass of at most max_num_batched_tokens
        chunk = min(w.seq * w.batch, VLLM_MAX_NUM_BATCHED_TOKENS)
        workspace = prefill_workspace_bytes(shape, chunk, 1, c, w.attention)
    else:
        workspace = prefill_workspace_bytes(shape, w.seq, w.batch, c, w.attention)
    if w.storage in QUANTIZED:
        workspace += c * shape.largest_matrix_params
    reserve = 0.0 if w.engine == "vllm" else HF_KV_RESERVE_FRACTION * kv / t
    return Breakdown(
        weights / t,
        0.0,
        0.0,
        0.0,
        kv / t,
        workspace / t,
        reserve,
        CUDA_CONTEXT_BYTES,
        phase="vllm_pool" if w.engine == "vllm" else "generate",
    )
