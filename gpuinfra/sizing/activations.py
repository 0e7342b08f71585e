"""Activation, logits and inference-workspace memory of the implementations users run, in bytes.

The per-layer count follows Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (arXiv:2205.05198, section 4.1: ``s*b*h*(34 + 5*a*s/h)`` bytes for a GPT
layer with 16-bit activations and 1-byte dropout masks), redone tensor by tensor for what
PyTorch autograd saves in the Hugging Face implementations (transformers
``models/llama/modeling_llama.py``, ``models/gpt2/modeling_gpt2.py``,
``models/bert/modeling_bert.py``):

* residual stream: fp32 weights under ``torch.autocast`` (full training with DDP) keep it fp32
  (the embedding output is fp32 and autocast does not cast additions); 16-bit weights keep it
  16-bit.
* norms: RMSNorm upcasts its input to fp32 (``hidden_states.to(torch.float32)``) and saves
  it (4 B per value), and ``weight * normed`` saves the normalized value when the weight
  trains; LayerNorm under autocast runs in fp32 (autocast fp32 op list,
  pytorch.org/docs/stable/amp.html) and saves its fp32 input. Under autocast each linear layer
  that reads an fp32 norm output casts it to 16 bits itself and saves its own cast (q, k, v: 3
  casts; gate, up: 2).
* attention: SDPA / FlashAttention saves q, k, v (after RoPE; RoPE's products save only
  cos/sin), the output (which o_proj reads) and a log-sum-exp (no s x s term); eager attention also saves the fp32 softmax (``softmax(..., dtype=float32)`` /
  autocast), its cast to the compute dtype, and a dropout mask + output when p > 0. Eager
  GQA expands k and v to all heads (``repeat_kv``) before the matmuls that save them.
* MLP: SwiGLU saves the gate output (SiLU input), the SiLU output, the up output and the
  product (input of ``down_proj``); GELU saves fc1 output and GELU output; GPT-2's
  ``gelu_new`` (transformers ``NewGELUActivation``, Python ops) saves the fp32 input of
  ``pow`` (autocast fp32 op), tanh's output, ``1 + tanh``, ``0.5 * x`` and the cast product.
* frozen linear layers (LoRA/QLoRA base) save nothing for their weight; each LoRA site saves
  a dropout mask and the dropped input (PEFT ``lora_dropout``).
* loss: transformers' ``ForCausalLMLoss`` upcasts logits to fp32: in the forward the 16-bit
  logits, the fp32 copy and the fp32 log-probabilities ``(c + 8) * v`` bytes per token; at the
  start of backward the log-probabilities and two fp32 gradients ``12 * v``.
* recompute: ``full`` (HF ``gradient_checkpointing``) keeps each layer's input (residual
  bytes x h per token) plus one layer's activations while it is computed or recomputed; ``selective`` (Megatron) drops
  the s x s attention terms (paper section 4.2).

Inference (``generate()`` with a KV cache, no autograd): the prompt is prefilled in one pass;
the transient peak of one layer is the SwiGLU/GELU intermediates plus q, k, v and the
attention output; logits are computed for the last token only (transformers >= 4.45
``logits_to_keep``) and upcast to fp32 for sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    residual_bytes: int | None = None,
    lora_dropout: bool = True,
) -> float:
    """Bytes one transformer layer saves for backward, per token of the micro-batch
    (checked against autograd's saved tensors on an H100:
    benchmarks/results/saved-bytes-h100-2026-11-27).

    Args:
        shape: model shape (``mlp``, ``norm``, ``dropout``, ``fused_qkv`` select the terms).
        compute_bytes: bytes of a compute-dtype value (2 for bf16/fp16, 4 for fp32).
        seq: sequence length (the eager s x s terms grow with it).
        attention: ``sdpa`` (FlashAttention / memory-efficient SDPA) | ``eager``.
        frozen: the block's linear weights are frozen (LoRA / QLoRA base).
        lora_sites: LoRA inputs with their own dropout in the layer (0 when not LoRA).
        drop_scores: selective recompute: leave out the s x s attention terms.
        residual_bytes: bytes of a residual-stream value: 4 when fp32 weights run under
            ``torch.autocast`` (the embedding and every residual add stay fp32), else
            ``compute_bytes`` (default).
        lora_dropout: each LoRA site applies dropout (p > 0): a 1-byte mask and the dropped input
            (``lora_A``'s input); p = 0 (PEFT's default): the input only.
    """
    c, h, f, a, kv = compute_bytes, shape.hidden, shape.ffn_size, shape.heads, shape.kv_dim
    r = residual_bytes or c
    trained = not frozen
    total = 0.0
    consumers = (1 if shape.fused_qkv else 3, 2 if shape.mlp == "swiglu" else 1)
    for n in consumers:  # the two norms: fp32 input, RMSNorm's normalized value, the linears' inputs
        total += 4 * h
        if trained:
            total += r * h if shape.norm == "rmsnorm" else 0  # weight * normed saves normed
            total += (n if r != c else 1) * c * h  # autocast casts the norm output once per linear
    if attention == "eager":
        total += c * 3 * h  # q and the k, v expanded to all heads
        if not drop_scores:
            scores = 4 * a * seq  # fp32 softmax output
            scores += (1 + c) * a * seq if shape.dropout else (c * a * seq if c == 2 else 0)
            total += scores
        total += c * h if trained else 0  # input of o_proj (a copy of the transposed output)
    else:
        total += c * (2 * h + 2 * kv)  # q, k, v and the output SDPA saves (o_proj reads the output)
    total += 2 * h if shape.dropout else 0  # dropout masks after attention and after the MLP
    if shape.mlp == "swiglu":
        total += c * f * (4 if trained else 3)  # gate, SiLU output, up, product (down_proj input)
    elif shape.mlp == "gelu_new":
        # 0.5*x*(1+tanh(k*(x+0.044715*pow(x,3)))) in Python ops: pow runs in fp32 under autocast
        # and saves its fp32 input; tanh's fp32 output, 1+tanh (fp32) and 0.5*x are saved by the
        # products; the fp32 product is cast again for c_proj
        total += 12 * f + c * f + (c * f if trained else 0)
    else:
        total += c * f * (2 if trained else 1)  # fc1 output (GELU input) and GELU output
    total += lora_sites * ((1 + c) if lora_dropout else c) * h
    return float(total)


def logits_bytes(shape: ModelShape, tokens: float, compute_bytes: int, fp32_loss: bool = True) -> float:
    """Forward-pass peak bytes of the LM head's logits and loss for ``tokens`` tokens (0 for a
    classifier): the ``compute``-dtype logits, their fp32 upcast and the fp32 log-probabilities
    ``log_softmax`` saves (transformers ``ForCausalLMLoss``: ``logits.float()`` then
    ``cross_entropy``) = ``(c + 8) * v`` per token; a 16-bit chunked loss (LitGPT
    ``chunked_cross_entropy``) ``4 * c * v``."""
    if shape.head != "lm":
        return 0.0
    c = compute_bytes
    per_token = (c + 8) * shape.vocab if fp32_loss or c == 4 else 4 * c * shape.vocab
    return tokens * per_token


def loss_backward_bytes(shape: ModelShape, tokens: float, compute_bytes: int, fp32_loss: bool = True) -> float:
    """Bytes alive at the start of the backward pass for the loss: the saved fp32
    log-probabilities, the gradient ``nll_loss`` returns and the gradient of ``log_softmax``'s
    input, all fp32 and vocabulary-wide = ``12 * v`` per token (16-bit chunked loss: ``3 * c * v``)."""
    if shape.head != "lm":
        return 0.0
    c = compute_bytes
    return tokens * (12 * shape.vocab if fp32_loss or c == 4 else 3 * c * shape.vocab)


@dataclass(frozen=True)
class ActivationPhases:
    """Activation bytes of one micro-batch in each phase of a training step.

    Attributes:
        forward: saved activations (or, with full recompute, the layer inputs) plus the larger of
            the loss's forward transient and one layer's intermediates.
        backward_start: what is alive when ``backward()`` starts: saved activations and the
            loss's backward transient.
        backward_end: what is alive while the first layer's gradients are computed: one
            layer's (recomputed) activations and its input.
    """

    forward: float
    backward_start: float
    backward_end: float


def training_activation_phases(
    shape: ModelShape,
    seq: int,
    batch: int,
    compute_bytes: int,
    attention: str,
    recompute: str,
    frozen: bool,
    lora_sites: int = 0,
    fp32_loss: bool = True,
    residual_bytes: int | None = None,
    lora_dropout: bool = True,
) -> ActivationPhases:
    """Activation bytes per phase of one micro-batch on one GPU (no tensor/pipeline parallelism).

    Args:
        shape, compute_bytes, attention, frozen, lora_sites, residual_bytes, lora_dropout: as in
            :func:`layer_bytes_per_token`.
        seq, batch: tokens per sequence and sequences per micro-batch.
        recompute: ``none`` | ``selective`` | ``full`` (HF ``gradient_checkpointing``: each
            layer keeps its input, ``residual_bytes * h`` per token).
        fp32_loss: as in :func:`logits_bytes`.
    """
    c, r, h = compute_bytes, residual_bytes or compute_bytes, shape.hidden
    tokens = seq * batch
    layer = tokens * layer_bytes_per_token(
        shape, c, seq, attention, frozen, lora_sites, recompute == "selective", residual_bytes, lora_dropout
    )
    embedding = tokens * (h if shape.dropout else 0)  # embedding dropout mask
    head = tokens * (4 * h + (0 if frozen else c * h)) if shape.head == "lm" else 0.0  # final norm, LM-head input
    loss_fwd = logits_bytes(shape, tokens, c, fp32_loss)
    loss_bwd = loss_backward_bytes(shape, tokens, c, fp32_loss)
    if recompute == "full":
        kept = shape.layers * tokens * r * h + embedding + head
        return ActivationPhases(kept + max(loss_fwd, layer), kept + loss_bwd, layer + tokens * r * h)
    kept = shape.layers * layer + embedding + head
    return ActivationPhases(kept + loss_fwd, kept + loss_bwd, layer)


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
    residual_bytes: int | None = None,
) -> float:
    """Largest activation bytes of one micro-batch over the phases of a step
    (:func:`training_activation_phases`)."""
    p = training_activation_phases(
        shape, seq, batch, compute_bytes, attention, recompute, frozen, lora_sites, fp32_loss, residual_bytes
    )
    return max(p.forward, p.backward_start, p.backward_end)


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
