"""Per-GPU memory of training and inference, in bytes (converted to GiB at the edge).

Formulas (sizing-formulas.md):

* Model states, mixed-precision Adam, ZeRO paper (Rajbhandari et al., arXiv:1910.02054 section 3,
  Fig. 1): 2P weights + 2P gradients + 12P optimizer (fp32 master, momentum, variance). With
  N data-parallel GPUs: DDP 16P; ZeRO-1 4P + 12P/N; ZeRO-2 2P + 14P/N; ZeRO-3 16P/N. PyTorch
  FSDP FULL_SHARD = ZeRO-3 (torch/distributed/fsdp/api.py ShardingStrategy), plus the unsharded
  16-bit parameters of the current and prefetched unit (2 x 2 B x largest layer).
* Activations (Korthikanti et al., arXiv:2205.05198): per layer s*b*h*(34 + 5*a*s/h) bytes with
  16-bit activations; FlashAttention drops the 5*a*s^2*b term; selective recompute keeps 34*s*b*h;
  full recompute keeps the layer input 2*s*b*h; the output layer adds 4*s*b*h*(1 + v/h).
* KV cache: 2 * L * kv_heads * head_dim * seq * batch * bytes (HF llm_tutorial_optimization.md).
* LoRA (arXiv:2106.09685): frozen base in the given precision, adapters r*(d_in + d_out) per
  adapted matrix (q, k, v, o here), trained in fp32 with Adam: 16 B per adapter parameter.
  QLoRA (arXiv:2305.14314): NF4 base with double quantization, 4.127 bits per parameter.
* CUDA context ~1.5 GiB per GPU (HF model_memory_anatomy.md measures 1.3 GB of kernels);
  inference adds ~20% of the weights (EleutherAI Transformer Math 101).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuinfra.sizing.models import ModelShape

GIB = 2**30
CUDA_CONTEXT_BYTES = 1.5 * GIB
BYTES_PER_PARAM = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "int4": 0.5}
NF4_DOUBLE_QUANT_BYTES = 4.127 / 8  # QLoRA section 3: 4 + 0.127 bits per parameter
METHODS = ("pretrain", "full", "lora", "qlora", "inference")
STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
RECOMPUTE = ("none", "selective", "full")
DEFAULT_LORA_RANK = 16


@dataclass(frozen=True)
class Breakdown:
    """Per-GPU bytes by kind."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    kv_cache: float
    overhead: float

    @property
    def total(self) -> float:
        """Sum in bytes."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.kv_cache + self.overhead

    def gib(self) -> dict[str, float]:
        """The JSON breakdown in GiB (keys ``weights_gib`` ...)."""
        return {f"{k}_gib": round(getattr(self, k) / GIB, 3)
                for k in ("weights", "gradients", "optimizer", "activations", "kv_cache", "overhead")}


def zero_model_states(params: float, gpus: int, strategy: str) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU for mixed-precision Adam (ZeRO paper).

    Args:
        params: parameter count P.
        gpus: data-parallel GPUs N (all GPUs of all nodes).
        strategy: ddp | zero1 | zero2 | zero3 | fsdp (fsdp = zero3 for model states).

    Examples (ZeRO paper Fig. 1, P = 7.5e9, N = 64): 120 / 31.4 / 16.6 / 1.9 GB.
    """
    p, n = params, gpus
    if strategy == "ddp":
        return 2 * p, 2 * p, 12 * p
    if strategy == "zero1":
        return 2 * p, 2 * p, 12 * p / n
    if strategy == "zero2":
        return 2 * p, 2 * p / n, 12 * p / n
    if strategy in ("zero3", "fsdp"):
        return 2 * p / n, 2 * p / n, 12 * p / n
    raise ValueError(f"unknown strategy {strategy!r}")


def activation_bytes(shape: ModelShape, seq: int, batch: int, recompute: str, flash: bool) -> float:
    """Activation memory of one GPU's micro-batch (Korthikanti et al.; no tensor parallelism)."""
    s, b, h, a, L, v = seq, batch, shape.hidden, shape.heads, shape.layers, shape.vocab
    if recompute == "full":
        per_layer = 2 * s * b * h
    elif recompute == "selective" or flash:
        per_layer = 34 * s * b * h
    else:
        per_layer = 34 * s * b * h + 5 * a * s * s * b
    return L * per_layer + 4 * s * b * h * (1 + v / h)


def kv_cache_bytes(shape: ModelShape, seq: int, batch: int, bytes_per_value: float = 2.0) -> float:
    """K and V of every layer for ``batch`` sequences of ``seq`` tokens."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * seq * batch * bytes_per_value


def lora_params(shape: ModelShape, rank: int = DEFAULT_LORA_RANK) -> float:
    """LoRA adapter parameters on q, k, v, o of every layer: r * (d_in + d_out) each."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    per_layer = rank * ((h + h) + (h + kv) + (h + kv) + (h + h))
    return shape.layers * per_layer


def memory_per_gpu(shape: ModelShape, method: str, precision: str, strategy: str, recompute: str,
                   seq: int, batch: int, gpus: int, gpus_per_node: int, flash: bool) -> Breakdown:
    """Per-GPU memory for one configuration.

    Args:
        shape: model shape.
        method: pretrain | full | lora | qlora | inference.
        precision: fp32 | bf16 | fp16 | int8 | int4 (weights; QLoRA always NF4 base).
        strategy: ddp | fsdp | zero1 | zero2 | zero3 (training; sharding spans ``gpus``).
        recompute: none | selective | full.
        seq, batch: sequence length and micro-batch per GPU (inference: concurrent sequences).
        gpus: all GPUs of all nodes.
        gpus_per_node: GPUs in one node (inference shards weights and KV over them).
        flash: FlashAttention / SDPA available.
    """
    p = shape.params
    if method == "inference":
        weight = p * BYTES_PER_PARAM[precision]
        kv = kv_cache_bytes(shape, seq, batch, 4.0 if precision == "fp32" else 2.0)
        t = gpus_per_node  # tensor parallel inside one node
        return Breakdown(weight / t, 0.0, 0.0, 0.0, kv / t, CUDA_CONTEXT_BYTES + 0.2 * weight / t)
    activations = activation_bytes(shape, seq, batch, recompute, flash)
    if method in ("lora", "qlora"):
        base = p * (NF4_DOUBLE_QUANT_BYTES if method == "qlora" else BYTES_PER_PARAM[precision])
        adapters = lora_params(shape)
        return Breakdown(base + 4 * adapters, 4 * adapters, 8 * adapters, activations, 0.0, CUDA_CONTEXT_BYTES)
    if precision == "fp32":
        w, g, o = zero_model_states(p, gpus, strategy)
        # fp32 Adam: 4 B weights + 4 B grads + 8 B moments (no separate master copy): same 16 B/param
        w, g, o = w * 2, g * 2, o * 8 / 12
    else:
        w, g, o = zero_model_states(p, gpus, strategy)
    if strategy in ("zero3", "fsdp"):
        w += 2 * 2 * shape.layer_params  # gathered 16-bit parameters of the current + prefetched unit
    return Breakdown(w, g, o, activations, 0.0, CUDA_CONTEXT_BYTES)


def deepspeed_zero2_estimate(params: float, gpus_per_node: int, nodes: int, offload_optimizer: bool,
                             legacy: bool = False, buffer_factor: float = 1.5) -> tuple[float, float]:
    """DeepSpeed ``estimate_zero2_model_states_mem_needs`` -> (GPU bytes, CPU bytes).

    Current code (deepspeed/runtime/zero/stage_1_and_2.py @02aa38c3): GPU = 2P + int(18P/G)
    without offload, 2P with CPU offload; ``legacy`` uses the older 4P + int(16P/G) that
    docs/code-docs/source/memory.rst still prints.
    """
    total_gpus = gpus_per_node * nodes
    if offload_optimizer:
        return 2 * params, params * max(4 * total_gpus, 16) * buffer_factor
    gpu = 4 * params + int(16 * params / total_gpus) if legacy else 2 * params + int(18 * params / total_gpus)
    return gpu, params * 4 * gpus_per_node * buffer_factor


def deepspeed_zero3_estimate(params: float, largest_layer_params: float, gpus_per_node: int, nodes: int,
                             offload_params: bool, offload_optimizer: bool, zero_init: bool = True,
                             buffer_factor: float = 1.5) -> tuple[float, float]:
    """DeepSpeed ``estimate_zero3_model_states_mem_needs`` -> (GPU bytes, CPU bytes)
    (deepspeed/runtime/zero/stage3.py @007cca6a)."""
    total_gpus = gpus_per_node * nodes
    largest = 4 * largest_layer_params
    gpus_factor = 1 / nodes
    if offload_params and offload_optimizer:
        gpu = largest
        cpu = params * 18 * gpus_factor * buffer_factor if zero_init else \
            params * max(4 * gpus_per_node, 18 * gpus_factor) * buffer_factor
    elif offload_optimizer:
        gpu = largest + int(2 * params / total_gpus)
        cpu = params * 16 * gpus_factor * buffer_factor if zero_init else \
            params * max(4 * gpus_per_node, 16 * gpus_factor) * buffer_factor
    else:
        gpu = largest + int(18 * params / total_gpus)
        cpu = largest_layer_params * 4 * gpus_per_node * buffer_factor if zero_init else \
            params * 4 * gpus_per_node * buffer_factor
    return gpu, cpu
