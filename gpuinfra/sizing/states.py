"""Model states (weights, gradients, optimizer) per GPU and offloaded to CPU, in bytes.

* Mixed-precision Adam, ZeRO paper (Rajbhandari et al., arXiv:1910.02054 section 3, Fig. 1):
  2P weights + 2P gradients + 12P optimizer (fp32 master, momentum, variance). With N
  data-parallel GPUs: ZeRO-1 4P + 12P/N; ZeRO-2 2P + 14P/N; ZeRO-3 16P/N. PyTorch FSDP
  FULL_SHARD = ZeRO-3 (torch/distributed/fsdp/api.py ShardingStrategy) plus the unsharded
  16-bit parameters of the current and prefetched unit (2 x 2 B x largest block).
* DDP with ``torch.autocast`` over fp32 weights (what ``Trainer(bf16=True)`` runs): fp32 weights
  4P, fp32 gradients 4P, AdamW 8P, plus the 16-bit copies autocast makes of every weight and
  autograd keeps for backward (2P): the "18 bytes per parameter" of transformers
  ``docs/source/en/model_memory_anatomy.md``.
* CPU offload, DeepSpeed's own estimators (``estimate_zero2_model_states_mem_needs``,
  ``estimate_zero3_model_states_mem_needs`` in deepspeed/runtime/zero/stage_1_and_2.py
  @02aa38c3 and stage3.py @007cca6a, buffer factor 1.5): ZeRO-1/2 ``offload_optimizer`` keeps
  the 16-bit weights on GPU (2P); ZeRO-3 ``offload_optimizer`` keeps 2P/N plus the gathered
  largest layer; ``offload_param`` keeps only the gathered largest layer. PyTorch FSDP
  ``CPUOffload(offload_params=True)`` offloads parameters and gradients and steps the
  optimizer on CPU (torch/distributed/fsdp/api.py CPUOffload); it has no optimizer-only mode.
"""

from __future__ import annotations

from dataclasses import dataclass

OFFLOAD_STRATEGIES = {"optimizer": ("zero1", "zero2", "zero3"), "params": ("zero3", "fsdp")}
DEEPSPEED_BUFFER_FACTOR = 1.5


@dataclass(frozen=True)
class States:
    """Model-state bytes on one GPU, and on the CPU of one node (offload)."""

    weights: float
    gradients: float
    optimizer: float
    cpu_per_node: float = 0.0


def zero_model_states(params: float, gpus: int, strategy: str) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU for mixed-precision Adam (ZeRO paper).

    Args:
        params: parameter count P.
        gpus: data-parallel GPUs N (all GPUs of all nodes).
        strategy: ddp | zero1 | zero2 | zero3 | fsdp (fsdp = zero3 for model states).

    Examples (ZeRO paper Fig. 1, P = 7.5e9, N = 64): 120 / 31.4 / 16.6 / 1.9 GB.

    Raises:
        ValueError: unknown strategy.
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


def deepspeed_zero2_estimate(
    params: float,
    gpus_per_node: int,
    nodes: int,
    offload_optimizer: bool,
    legacy: bool = False,
    buffer_factor: float = DEEPSPEED_BUFFER_FACTOR,
) -> tuple[float, float]:
    """DeepSpeed ``estimate_zero2_model_states_mem_needs`` -> (GPU bytes, CPU bytes per node).

    Current code (deepspeed/runtime/zero/stage_1_and_2.py @02aa38c3): GPU = 2P + int(18P/G)
    without offload, 2P with CPU offload; ``legacy`` uses the older 4P + int(16P/G) that
    docs/code-docs/source/memory.rst still prints.
    """
    total_gpus = gpus_per_node * nodes
    if offload_optimizer:
        return 2 * params, params * max(4 * total_gpus, 16) * buffer_factor
    gpu = 4 * params + int(16 * params / total_gpus) if legacy else 2 * params + int(18 * params / total_gpus)
    return gpu, params * 4 * gpus_per_node * buffer_factor


def deepspeed_zero3_estimate(
    params: float,
    largest_layer_params: float,
    gpus_per_node: int,
    nodes: int,
    offload_params: bool,
    offload_optimizer: bool,
    zero_init: bool = True,
    buffer_factor: float = DEEPSPEED_BUFFER_FACTOR,
) -> tuple[float, float]:
    """DeepSpeed ``estimate_zero3_model_states_mem_needs`` -> (GPU bytes, CPU bytes per node)
    (deepspeed/runtime/zero/stage3.py @007cca6a)."""
    total_gpus = gpus_per_node * nodes
    largest = 4 * largest_layer_params
    gpus_factor = 1 / nodes
    if offload_params and offload_optimizer:
        gpu = largest
        cpu = (
            params * 18 * gpus_factor * buffer_factor
            if zero_init
            else params * max(4 * gpus_per_node, 18 * gpus_factor) * buffer_factor
        )
    elif offload_optimizer:
        gpu = largest + int(2 * params / total_gpus)
        cpu = (
            params * 16 * gpus_factor * buffer_factor
            if zero_init
            else params * max(4 * gpus_per_node, 16 * gpus_factor) * buffer_factor
        )
    else:
        gpu = largest + int(18 * params / total_gpus)
        cpu = (
            largest_layer_params * 4 * gpus_per_node * buffer_factor
            if zero_init
            else params * 4 * gpus_per_node * buffer_factor
        )
    return gpu, cpu


def full_training_states(
    params: float, largest_layer: float, gpus: int, gpus_per_node: int, strategy: str, mixed: bool, offload: str
) -> States:
    """Model states of full fine-tuning / pre-training with Adam (module docstring).

    Args:
        params: parameters P; largest_layer: parameters of the largest gathered module.
        gpus: all GPUs of all nodes; gpus_per_node: GPUs per node.
        strategy: ddp | zero1 | zero2 | zero3 | fsdp.
        mixed: 16-bit compute (bf16/fp16) over fp32 master weights; False: plain fp32.
        offload: none | optimizer | params (validated by the caller).
    """
    p, n, nodes = params, gpus, max(1, gpus // max(1, gpus_per_node))
    if offload == "params":
        gpu, cpu = deepspeed_zero3_estimate(p, largest_layer, gpus_per_node, nodes, True, True)
        return States(gpu, 0.0, 0.0, cpu)
    if offload == "optimizer":
        if strategy == "zero3":
            gpu, cpu = deepspeed_zero3_estimate(p, largest_layer, gpus_per_node, nodes, False, True)
        else:
            gpu, cpu = deepspeed_zero2_estimate(p, gpus_per_node, nodes, True)
        return States(gpu, 0.0, 0.0, cpu)
    if strategy == "ddp":
        return States(6 * p if mixed else 4 * p, 4 * p, 8 * p)
    w, g, o = zero_model_states(p, n, strategy)
    if not mixed:  # fp32 Adam: 4 B weights + 4 B grads + 8 B moments, sharded alike
        w, g, o = w * 2, g * 2, o * 8 / 12
    if strategy in ("zero3", "fsdp"):
        w += 2 * 2 * largest_layer  # gathered 16-bit parameters of the current + prefetched unit
    return States(w, g, o)
