"""Activation, logits and inference-workspace memory of the implementations users run, in bytes.

The per-layer count follows Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (arXiv:2205.05198, section 4.1: ``s*b*h*(34 + 5*a*s/h)`` bytes for a GPT
layer with 16-bit activations and 1-byte dropout masks), redone tensor by tensor for what
PyTorch autograd saves in the Hugging Face implementations (transformers
``models/llama/modeling_llama.py``, ``models/gpt2/modeling_gpt2.py``,
``models/bert/modeling_bert.py``):

* norms: RMSNorm upcasts its input to fp32 (``hidden_states.to(torch.float32)``) and saves
  it (4 B per value); LayerNorm under autocast runs in fp32 (autocast fp32 op list,
  pytorch.org/docs/stable/amp.html) and saves its fp32 input. The normalized output is saved
  (compute dtype) when the next linear layer trains its weight.
* attention: SDPA / FlashAttention saves q, k, v, the output and a log-sum-exp (no s x s
  term); eager attention also saves the fp32 softmax (``softmax(..., dtype=float32)`` /
  autocast), its cast to the compute dtype, and a dropout mask + output when p > 0. Eager
  GQA expands k and v to all heads (``repeat_kv``) before the matmuls that save them.
* MLP: SwiGLU saves the gate output (SiLU input), the SiLU output, the up output and the
  product (input of ``down_proj``); GELU saves fc1 output and GELU output.
* frozen linear layers (LoRA/QLoRA base) save nothing for their weight; each LoRA site saves
  a dropout mask and the dropped input (PEFT ``lora_dropout``).
* loss: transformers' ``ForCausalLMLoss`` upcasts logits to fp32; at the start of backward
  the 16-bit logits, the fp32 log-probabilities saved by ``log_softmax`` and two fp32
  gradients of the same size are alive: ``(c + 12) * v`` bytes per token.
* recompute: ``full`` (HF ``gradient_checkpointing``) keeps each layer's input (``c*h`` per
  token) plus one layer's activations while it is recomputed; ``selective`` (Megatron) drops
  the s x s attention terms (paper section 4.2).

Inference (``generate()`` with a KV cache, no autograd): the prompt is prefilled in one pass;
the transient peak of one layer is the SwiGLU/GELU intermediates plus q, k, v and the
attention output; logits are computed for the last token only (transformers >= 4.45
``logits_to_keep``) and upcast to fp32 for sampling.
"""

from __future__ import annotations

from gpuinfra.sizing.models import ModelShape

#: LoRA sites per layer with their own dropout (PEFT's default targets for LLaMA-type models
#: are ``q_proj`` and ``v_proj``: peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
DEFAULT_LORA_SITES = 2


def layer_bytes_per_token(
    shape: ModelShape,
    compute_bytes: int,
    seq: int,
    attention: str,
    frozen: bool,
    lora_sites: int = 0,
    drop_scores: bool = False,
) -> float:
    """Bytes one transformer layer saves for backward, per token of the micro-batch.

    Args:
        shape: model shape (``mlp``, ``norm``, ``dropout`` select the terms).
        compute_bytes: bytes of a compute-dtype value (2 for bf16/fp16, 4 for fp32).
        seq: sequence length (the eager s x s terms grow with it).
        attention: ``sdpa`` (FlashAttention / memory-efficient SDPA) | ``eager``.
        frozen: the block's linear weights are frozen (LoRA / QLoRA base).
        lora_sites: LoRA inputs with their own dropout in the layer (0 when not LoRA).
        drop_scores: selective recompute: leave out the s x s attention terms.
    """
    c, h, f, a, kv = compute_bytes, shape.hidden, shape.ffn_size, shape.heads, shape.kv_dim
    drop = shape.dropout
    saved_norm_output = 0 if frozen else c * h
    total = 2 * (4 * h + saved_norm_output)
    if attention == "eager":
        total += c * 3 * h  # q and the k, v expanded to all heads
        if not drop_scores:
            scores = 4 * a * seq  # fp32 softmax output
            scores += (1 + c) * a * seq if drop else (c * a * seq if c == 2 else 0)
            total += scores
    else:
        total += c * (h + 2 * kv) + c * h  # q, k, v and the output saved by SDPA
    total += 0 if frozen else c * h  # input of o_proj
    total += h if drop else 0  # dropout mask after the attention output
    if shape.mlp == "swiglu":
        total += c * f * (3 if frozen else 4)
    else:
        total += c * f * (1 if frozen else 2)
    total += h if drop else 0  # dropout mask after the MLP
    total += lora_sites * (1 + c) * h
    return float(total)


def logits_bytes(shape: ModelShape, tokens: float, compute_bytes: int, fp32_loss: bool = True) -> float:
    """Peak bytes of the LM head's logits and loss for ``tokens`` tokens (0 for a classifier).

    ``fp32_loss``: transformers' loss upcasts to fp32 -> ``(c + 12) * v`` per token; a 16-bit
    chunked loss (LitGPT ``chunked_cross_entropy``) -> ``4 * c * v``.
    """
    if shape.head != "lm":
        return 0.0
    per_token = (
        (compute_bytes + 12) * shape.vocab if fp32_loss or compute_bytes == 4 else 4 * compute_bytes * shape.vocab
    )
    return tokens * (per_token + (compute_bytes + 4) * shape.hidden)


def training_activation_bytes(
    shape: ModelShape,
    seq: int,
    batch: int,
    compute_bytes: int,
    attention: str,
    recompute: str,
    frozen: bool,
    lora_sites: int = 0,
    fp32_loss: bool = True,
) -> float:
    """Activations of one micro-batch on one GPU (no tensor or pipeline parallelism), bytes.

    Args:
        shape, compute_bytes, attention, frozen, lora_sites: as in :func:`layer_bytes_per_token`.
        seq, batch: tokens per sequence and sequences per micro-batch.
        recompute: ``none`` | ``selective`` | ``full``.
        fp32_loss: as in :func:`logits_bytes`.
    """
    tokens = seq * batch
    per_layer = layer_bytes_per_token(
        shape, compute_bytes, seq, attention, frozen, lora_sites, drop_scores=recompute == "selective"
    )
    embedding = tokens * ((1 + compute_bytes) * shape.hidden if shape.dropout else 0)
    if recompute == "full":
        layers = shape.layers * tokens * compute_bytes * shape.hidden + tokens * per_layer
    else:
        layers = shape.layers * tokens * per_layer
    return layers + embedding + logits_bytes(shape, tokens, compute_bytes, fp32_loss)


def prefill_workspace_bytes(shape: ModelShape, seq: int, batch: int, compute_bytes: int, attention: str) -> float:
    """Transient peak of one layer while ``batch`` prompts of ``seq`` tokens are prefilled, plus
    the last-token logits in fp32, bytes (see module docstring)."""
    c, h, f, kv = compute_bytes, shape.hidden, shape.ffn_size, shape.kv_dim
    tokens = seq * batch
    mlp = (3 if shape.mlp == "swiglu" else 2) * f
    per_token = c * (mlp + 2 * h + 2 * kv + h)
    scores = batch * shape.heads * seq * seq * (4 + c) if attention == "eager" else 0.0
    last_logits = batch * shape.vocab * (c + 8) if shape.head == "lm" else 0.0
    return tokens * per_token + scores + last_logits
