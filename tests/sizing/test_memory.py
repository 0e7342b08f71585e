"""Sizing formulas against the published worked examples (docs/sources/sizing-formulas.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuinfra.errors import SizingError
from gpuinfra.sizing.activations import layer_bytes_per_token, training_activation_bytes, training_activation_phases
from gpuinfra.sizing.memory import (
    GIB,
    Workload,
    deepspeed_zero2_estimate,
    deepspeed_zero3_estimate,
    kv_cache_bytes,
    lora_params,
    memory_per_gpu,
    zero_model_states,
)
from gpuinfra.sizing.models import get_model, parse_count, shape_from_params


@pytest.mark.parametrize(("strategy", "gb"), [("ddp", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9)])
def test_zero_paper_figure_1(strategy, gb):
    # Rajbhandari et al., ZeRO (arXiv:1910.02054) Fig. 1: 7.5B parameters, 64 GPUs, K = 12
    total = sum(zero_model_states(7.5e9, 64, strategy)) / 1e9
    assert round(total, 1) == gb


def test_zero_exact_values():
    assert [round(sum(zero_model_states(7.5e9, 64, s)) / 1e9, 3) for s in ("ddp", "zero1", "zero2", "zero3")] == [
        120.0,
        31.406,
        16.641,
        1.875,
    ]
    assert zero_model_states(7.5e9, 64, "fsdp") == zero_model_states(7.5e9, 64, "zero3")


def test_deepspeed_zero2_estimator_t5_3b():
    # docs/code-docs/source/memory.rst: t5-3b, 2851M params, 8 GPUs: 15.93 GiB without offload
    # (legacy formula the docs print), 5.31 GiB with optimizer offload
    assert round(deepspeed_zero2_estimate(2851e6, 8, 1, offload_optimizer=False, legacy=True)[0] / GIB, 2) == 15.93
    assert round(deepspeed_zero2_estimate(2851e6, 8, 1, offload_optimizer=True)[0] / GIB, 2) == 5.31
    assert round(deepspeed_zero2_estimate(2851e6, 8, 1, offload_optimizer=False)[0] / GIB, 2) == 11.28  # current code


@pytest.mark.parametrize(
    ("offload_params", "offload_optimizer", "gpu_gib"),
    [(True, True, 0.12), (False, True, 0.78), (False, False, 6.09)],
)
def test_deepspeed_zero3_estimator_t5_3b(offload_params, offload_optimizer, gpu_gib):
    gpu, _ = deepspeed_zero3_estimate(2851e6, 32e6, 8, 1, offload_params, offload_optimizer)
    assert round(gpu / GIB, 2) == gpu_gib


def test_deepspeed_zero3_cpu_and_t5_large():
    _, cpu = deepspeed_zero3_estimate(2851e6, 32e6, 8, 1, True, True, zero_init=True)
    assert round(cpu / GIB, 2) == 71.69
    # t5-large, 737.67M params, 32.90M largest layer, 4 GPUs: 3291 / 125 / 477 MiB
    mib = [
        int(deepspeed_zero3_estimate(737.67e6, 32.90e6, 4, 1, p, o)[0] / 2**20)  # DeepSpeed truncates
        for p, o in ((False, False), (True, True), (False, True))
    ]
    assert mib == [3291, 125, 477]


def test_activation_formula_reduces_to_korthikanti_for_gpt_layers():
    # Korthikanti et al. (arXiv:2205.05198) 4.1: 34*s*b*h + 5*a*s^2*b bytes per layer with 16-bit
    # activations. HF GPT-2 adds, per token: fp32 LayerNorm inputs (+2 x 2h), the fp32 softmax
    # kept next to its 16-bit cast (+2as net), and gelu_new in Python ops, whose pow runs in fp32
    # under autocast (+12f over torch's GELU).
    gpt2 = get_model("gpt2")
    s, h, a, f = 1024, gpt2.hidden, gpt2.heads, gpt2.ffn_size
    ours = layer_bytes_per_token(gpt2, 2, s, "eager", frozen=False, residual_bytes=2)
    torch_gelu = replace(gpt2, mlp="gelu")
    plain = layer_bytes_per_token(torch_gelu, 2, s, "eager", frozen=False, residual_bytes=2)
    assert ours - plain == 12 * f  # the fp32 pow input, tanh output and 1 + tanh of gelu_new
    paper = 34 * h + 5 * a * s
    assert plain - paper == 4 * h + 2 * a * s  # fp32 norm inputs, fp32 softmax output


def test_flash_attention_and_recompute_lower_activations():
    shape = get_model("llama-2-7b")
    eager = training_activation_bytes(shape, 4096, 1, 2, "eager", "none", False)
    sdpa = training_activation_bytes(shape, 4096, 1, 2, "sdpa", "none", False)
    full = training_activation_bytes(shape, 4096, 1, 2, "sdpa", "full", False)
    assert full < sdpa < eager
    # eager keeps the fp32 softmax and its bf16 cast (6*a*s B per token and layer), q and the
    # expanded k, v, and o_proj's input copy, where SDPA keeps q, k, v and its output
    assert eager - sdpa == 32 * 4096 * (6 * 32 * 4096 + 2 * 3 * 4096 + 2 * 4096 - 2 * (2 * 4096 + 2 * 4096))


def test_fp32_logits_of_a_128k_vocabulary():
    # transformers' loss upcasts logits to fp32: at the start of backward the fp32
    # log-probabilities, nll_loss's gradient and log_softmax's input gradient (12 B x 128256 per
    # token) against 3 x 2 B for a 16-bit chunked loss
    shape = get_model("llama-3.1-8b")
    base = training_activation_phases(shape, 2048, 2, 2, "sdpa", "full", True, fp32_loss=False)
    fp32 = training_activation_phases(shape, 2048, 2, 2, "sdpa", "full", True, fp32_loss=True)
    assert fp32.backward_start - base.backward_start == pytest.approx(4096 * (12 - 6) * 128256)
    assert fp32.backward_start / GIB > 6.1  # the loss alone is ~5.9 GiB at 4096 tokens


def test_autocast_copy_lives_in_the_forward_and_gradients_from_the_backward_on():
    # phi-3-mini full fine-tuning with recompute (memory-phases-h100-2026-11-26): 12 B/param
    # between steps, + 2 B/param bf16 copies in the forward only, + 4 B/param fp32 gradients
    # from the backward on; fused AdamW adds nothing at the step, foreach AdamW 4 B/param
    shape = get_model("phi-3-mini")
    p = shape.params
    fused = memory_per_gpu(Workload(shape, "full", storage="fp32", recompute="full"))
    foreach = memory_per_gpu(Workload(shape, "full", storage="fp32", recompute="full", optimizer="adamw-foreach"))
    assert fused.phases["between_steps"] == pytest.approx(12 * p)
    assert fused.phases["forward"] - 12 * p > 2 * p  # copies + layer inputs + loss
    assert fused.phases["optimizer_step"] == pytest.approx(16 * p) and fused.phase == "backward"
    assert foreach.phases["optimizer_step"] == pytest.approx(20 * p) and foreach.phase == "optimizer_step"
    eight = memory_per_gpu(Workload(shape, "full", storage="fp32", recompute="full", optimizer="adamw-8bit"))
    assert eight.phases["between_steps"] == pytest.approx((4 + 2 + 8 / 256) * p)


def test_kv_cache_matches_hf_llama31_table():
    # HF llama31.md: 8B at 16k tokens = 1.95 GB (GiB), 70B at 16k = 4.88 GB, fp16
    assert round(kv_cache_bytes(get_model("llama-3.1-8b"), 16 * 1024, 1) / GIB, 2) == 2.0
    assert round(kv_cache_bytes(get_model("llama-3.1-8b"), 1024, 1) / GIB, 3) == 0.125
    assert round(kv_cache_bytes(get_model("llama-3.1-70b"), 1024, 1) / GIB, 3) == 0.312


def test_quantized_weights_keep_embeddings_and_head_16_bit():
    shape = get_model("llama-3.1-8b")
    q = memory_per_gpu(Workload(shape, "qlora", storage="nf4-dq", recompute="full"))
    lo = memory_per_gpu(Workload(shape, "lora", storage="bf16", recompute="full"))
    adapters = lora_params(shape)
    embed_and_head = 2 * 128256 * 4096
    # peak in the backward pass: fp32 adapters without their forward-only bf16 autocast copies
    assert q.phase == lo.phase == "backward"
    assert q.weights - 4 * adapters == pytest.approx((8.03e9 - embed_and_head) * 4.127 / 8 + 2 * embed_and_head)
    assert lo.weights - 4 * adapters == pytest.approx(8.03e9 * 2)
    assert q.phases["optimizer_step"] - q.phases["between_steps"] == pytest.approx(4 * adapters)  # fp32 gradients
    assert q.optimizer == lo.optimizer == 8 * adapters
    infer = memory_per_gpu(Workload(shape, "inference", storage="int4", seq=100))
    # bitsandbytes 4-bit: 4 bits + fp32 absmax per 64 = 4.5 bits; the 128k embeddings and head stay bf16
    assert infer.weights == pytest.approx((8.03e9 - embed_and_head) * 4.5 / 8 + 2 * embed_and_head)


def test_offload_moves_model_states_to_cpu():
    shape = get_model("llama-3.1-8b")
    none = memory_per_gpu(Workload(shape, "full", strategy="zero3", gpus=8, gpus_per_node=8))
    opt = memory_per_gpu(Workload(shape, "full", strategy="zero3", gpus=8, gpus_per_node=8, offload="optimizer"))
    par = memory_per_gpu(Workload(shape, "full", strategy="zero3", gpus=8, gpus_per_node=8, offload="params"))
    assert par.weights + par.optimizer < opt.weights + opt.optimizer < none.weights + none.optimizer
    # DeepSpeed's ZeRO-3 estimator, one node, zero_init: CPU = 18P * 1.5 (both) / 16P * 1.5 (optimizer)
    assert par.cpu_per_node == pytest.approx(18 * 8.03e9 * 1.5) and opt.cpu_per_node == pytest.approx(16 * 8.03e9 * 1.5)
    assert none.cpu_per_node == 0


def test_sharding_spans_all_gpus_of_all_nodes():
    shape = get_model("llama-3.1-70b")
    one_node = memory_per_gpu(Workload(shape, "full", strategy="fsdp", recompute="selective", gpus=8, gpus_per_node=8))
    eight_nodes = memory_per_gpu(
        Workload(shape, "full", strategy="fsdp", recompute="selective", gpus=64, gpus_per_node=8)
    )
    assert eight_nodes.optimizer == pytest.approx(one_node.optimizer / 8)


@pytest.mark.parametrize(("text", "value"), [("7B", 7e9), ("1.3b", 1.3e9), ("350M", 3.5e8), ("2T", 2e12), ("70", 70.0)])
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["", "B7", "-7B", "7X", "0B", "1e9"])
def test_parse_count_rejects(text):
    with pytest.raises(SizingError, match="must look like 7B"):
        parse_count(text)


def test_params_above_1000t_is_refused():
    with pytest.raises(SizingError, match="--params must be at most 1000T, got '10000T'"):
        parse_count("10000T")


def test_params_heuristic_is_llama_like():
    shape = shape_from_params(7e9)
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads) == (33, 4224, 33, 8)
    assert (shape.mlp, shape.vocab) == ("swiglu", 128256)
    assert shape_from_params(70e9).kv_dim == 8 * 128  # as Llama-3.1-70B (8 KV heads of 128)
    assert abs(12 * shape.layers * shape.hidden**2 - 7e9) / 7e9 < 0.05


def test_unknown_model():
    with pytest.raises(SizingError, match="unknown model 'llama-3.1-9b'. Did you mean llama-3.1-8b"):
        get_model("llama-3.1-9b")
