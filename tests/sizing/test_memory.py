"""Sizing formulas against the published worked examples (sizing-formulas.md)."""

from __future__ import annotations

import pytest

from gpuinfra.errors import SizingError
from gpuinfra.sizing.memory import (
    GIB,
    activation_bytes,
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
    assert [round(sum(zero_model_states(7.5e9, 64, s)) / 1e9, 3) for s in ("ddp", "zero1", "zero2", "zero3")] == \
        [120.0, 31.406, 16.641, 1.875]
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
    mib = [int(deepspeed_zero3_estimate(737.67e6, 32.90e6, 4, 1, p, o)[0] / 2**20)  # DeepSpeed truncates
           for p, o in ((False, False), (True, True), (False, True))]
    assert mib == [3291, 125, 477]


def test_activation_example_llama_7b():
    # sizing-formulas.md 1.6 [derived]: LLaMA-7B, b = 4, s = 512, eager attention -> 14.5 GB (layers only)
    shape = get_model("llama-2-7b")
    per_layers = activation_bytes(shape, 512, 4, "none", flash=False) - 4 * 512 * 4 * 4096 * (1 + 32000 / 4096)
    assert round(per_layers / 1e9, 1) == 14.5
    assert activation_bytes(shape, 512, 4, "full", flash=False) < activation_bytes(shape, 512, 4, "selective", flash=False)


def test_kv_cache_matches_hf_llama31_table():
    # HF llama31.md: 8B at 16k tokens = 1.95 GB (GiB), 70B at 16k = 4.88 GB, fp16
    assert round(kv_cache_bytes(get_model("llama-3.1-8b"), 16 * 1024, 1) / GIB, 2) == 2.0
    assert round(kv_cache_bytes(get_model("llama-3.1-8b"), 1024, 1) / GIB, 3) == 0.125
    assert round(kv_cache_bytes(get_model("llama-3.1-70b"), 1024, 1) / GIB, 3) == 0.312


def test_qlora_base_is_nf4_and_smaller_than_lora():
    shape = get_model("llama-3.1-8b")
    q = memory_per_gpu(shape, "qlora", "bf16", "ddp", "full", 2048, 1, 1, 1, True)
    lo = memory_per_gpu(shape, "lora", "bf16", "ddp", "full", 2048, 1, 1, 1, True)
    adapters = lora_params(shape)
    assert round(q.weights - 4 * adapters) == round(8.03e9 * 4.127 / 8)
    assert round(lo.weights - 4 * adapters) == round(8.03e9 * 2)
    assert q.gradients == lo.gradients == 4 * adapters and q.optimizer == 8 * adapters
    # HF llama31 blog estimates: QLoRA 8B ~6 GB, LoRA 8B ~16 GB
    assert 5 < q.total / 1e9 < 9 and 16 < lo.total / 1e9 < 22


def test_sharding_spans_all_gpus_of_all_nodes():
    shape = get_model("llama-3.1-70b")
    one_node = memory_per_gpu(shape, "full", "bf16", "fsdp", "selective", 2048, 1, 8, 8, True)
    eight_nodes = memory_per_gpu(shape, "full", "bf16", "fsdp", "selective", 2048, 1, 64, 8, True)
    assert eight_nodes.optimizer == pytest.approx(one_node.optimizer / 8)


@pytest.mark.parametrize(("text", "value"), [("7B", 7e9), ("1.3b", 1.3e9), ("350M", 3.5e8), ("2T", 2e12), ("70", 70.0)])
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["", "B7", "-7B", "7X", "0B", "1e9"])
def test_parse_count_rejects(text):
    with pytest.raises(SizingError, match="must look like 7B"):
        parse_count(text)


def test_params_heuristic_is_llama_like():
    shape = shape_from_params(7e9)
    assert (shape.layers, shape.hidden, shape.heads) == (33, 4224, 33)
    assert abs(12 * shape.layers * shape.hidden**2 - 7e9) / 7e9 < 0.05


def test_unknown_model():
    with pytest.raises(SizingError, match="unknown model 'llama-3.1-9b'. Did you mean llama-3.1-8b"):
        get_model("llama-3.1-9b")
