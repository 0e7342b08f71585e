"""Training throughput of published runs, 1 to 384 nodes, predicted within +/-20%.

The utilization each prediction uses comes from other runs (``data/mfu.yaml``: A100 from
Korthikanti et al. 2022, H100 from the Llama 3 paper); what is tested is the rest of the model
-- FLOPs, tensor-parallel all-reduces, pipeline bubble, data-parallel traffic over the node's
NICs and its overlap -- on runs that differ in size, layout and scale. Each run is given with
its layout as published; the network is the run's own (Selene: 8 x 200 Gbit/s HDR InfiniBand
per DGX A100, Narayanan 2021 section 5; the others on 8-GPU nodes with 3,200 Gbit/s, the AWS
p5 / GCP A3 Ultra figure, or 1,600 Gbit/s for MosaicML's A100 RoCE clusters).

Runs (published figure -> compared as tokens/s per GPU, or TFLOP/s per GPU by the paper's
own formula):

* Narayanan et al. 2021 (arXiv:2104.04473), A100 80GB, full recompute, micro-batch 1, seq 2048,
  vocab 51,200; TFLOP/s per GPU by Eq. 3, 96 B s l h^2 (1 + s/6h + V/16lh) / step / GPUs:
  Table 1 (weak scaling) and Table 2 (PTD-P, fixed batch, more GPUs).
* MosaicML llm-foundry scripts/train/benchmarking/README.md "H100 80GB BF16": MPT models,
  FSDP FULL_SHARD, seq 2048, no activation checkpointing; Throughput (T/s/GPU).
* torchtitan docs/performance.md: Llama 3.1 8B on 8 H100 (Table 1, FSDP, local batch 2,
  seq 8192, selective AC): 5,762 TPS/GPU; Llama 3 8B on 64 A100 80GB (FSDP, batch 1, seq 8192,
  selective op AC): 2,973 WPS.

Not within 20% (reported, not asserted; docs/sizing.md): Narayanan Table 1 1.7B on 32 GPUs
(+26%: small GEMMs run below the large-model utilization); llm-foundry MPT-70B on 64 H100 and
MPT-30B on 32 H100 with activation checkpointing (-29%, -31%: Composer reaches 57-59% of peak
in hardware FLOPs there, above the Llama 3 figure).
"""

from __future__ import annotations

import pytest

from gpuinfra.sizing.comm import links_for
from gpuinfra.sizing.layout import Layout
from gpuinfra.sizing.models import ModelShape, get_model
from gpuinfra.sizing.throughput import training_time

TOLERANCE = 0.20


def _megatron_shape(heads: int, hidden: int, layers: int, vocab: int = 51200, seq: int = 2048) -> ModelShape:
    # Narayanan 2021 Eq. 2: P = 12 l h^2 (1 + 13/12h + (V + s)/12lh); GPT-2 style, tied embedding
    params = 12 * layers * hidden**2 * (1 + 13 / (12 * hidden) + (vocab + seq) / (12 * layers * hidden))
    return ModelShape(
        f"gpt-{params / 1e9:.1f}B", params, layers, hidden, heads, heads, vocab, "Narayanan 2021 Table 1",
        ffn=4 * hidden, mlp="gelu", norm="layernorm", tied=True, positions=seq,
    )  # fmt: skip


def _megatron_tflops_per_gpu(shape: ModelShape, batch: int, seconds: float, gpus: int, seq: int = 2048) -> float:
    h, layers, vocab = shape.hidden, shape.layers, shape.vocab
    flops = 96 * batch * seq * layers * h**2 * (1 + seq / (6 * h) + vocab / (16 * layers * h))
    return flops / seconds / gpus / 1e12


MEGATRON = [
    # (table, heads, hidden, layers, tp, pp, GPUs, batch, published TFLOP/s per GPU)
    ("Table 1, 18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("Table 1, 39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("Table 1, 145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("Table 1, 310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("Table 1, 1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
    ("Table 2 PTD-P, 174.6B", 96, 12288, 96, 8, 12, 384, 1536, 153),
    ("Table 2 PTD-P, 174.6B", 96, 12288, 96, 8, 12, 768, 1536, 149),
    ("Table 2 PTD-P, 174.6B", 96, 12288, 96, 8, 12, 1536, 1536, 141),
    ("Table 2 PTD-P, 529.6B", 128, 20480, 105, 8, 35, 560, 2240, 171),
    ("Table 2 PTD-P, 529.6B", 128, 20480, 105, 8, 35, 1120, 2240, 167),
    ("Table 2 PTD-P, 529.6B", 128, 20480, 105, 8, 35, 2240, 2240, 159),
]


def _megatron_prediction(heads, hidden, layers, tp, pp, gpus, batch):
    shape = _megatron_shape(heads, hidden, layers)
    dp = gpus // (tp * pp)
    layout = Layout(dp, tp, pp, micro_batch=1, accumulation=batch // dp)
    links = links_for("A100-80GB", 8, 8 * 200)
    time = training_time(
        shape, "pretrain", "full", "ddp", "A100-80GB", layout, 2048, 1e12, links, gpus // 8, shape.params
    )
    return _megatron_tflops_per_gpu(shape, batch, time.step.seconds, gpus)


@pytest.mark.parametrize(("table", "heads", "hidden", "layers", "tp", "pp", "gpus", "batch", "published"), MEGATRON)
def test_megatron_lm_2021(table, heads, hidden, layers, tp, pp, gpus, batch, published):
    predicted = _megatron_prediction(heads, hidden, layers, tp, pp, gpus, batch)
    assert abs(predicted / published - 1) <= TOLERANCE, (table, gpus, predicted, published)


def test_megatron_table_2_loses_throughput_to_the_bubble_as_gpus_grow_at_a_fixed_batch():
    # 174.6B, batch 1536: 384 -> 1536 GPUs shrink each pipeline's micro-batches 384 -> 96, so the
    # bubble grows; published 153 -> 141 TFLOP/s (-7.8%)
    rows = [r for r in MEGATRON if r[0] == "Table 2 PTD-P, 174.6B"]
    first, last = (_megatron_prediction(*r[1:8]) for r in (rows[0], rows[-1]))
    assert last < first and abs((last / first) / (141 / 153) - 1) < 0.05


def _fsdp_tokens_per_gpu_s(shape, gpu, gpus, micro_batch, accumulation, seq, recompute, network_gbps):
    nodes = max(1, gpus // 8)
    layout = Layout(gpus, 1, 1, micro_batch, accumulation)
    links = links_for(gpu, min(8, gpus), network_gbps)
    time = training_time(shape, "pretrain", recompute, "fsdp", gpu, layout, seq, 1e12, links, nodes, shape.params)
    return micro_batch * accumulation * seq / time.step.seconds


def _mpt(params, layers, hidden, heads):
    # llm-foundry MPT configs: GPT-style blocks, ALiBi, tied embedding, vocabulary 50,368
    return ModelShape(
        f"mpt-{params / 1e9:.0f}b", params, layers, hidden, heads, heads, 50368, "llm-foundry yamls",
        ffn=4 * hidden, mlp="gelu", norm="layernorm", tied=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "shape", "gpus", "micro_batch", "accumulation", "published"),
    [
        ("MPT-7B, 8 H100", _mpt(6658859008, 32, 4096, 32), 8, 6, 1, 10643),
        ("MPT-13B, 64 H100", _mpt(12853954560, 40, 5120, 40), 64, 2, 1, 4800),
        ("MPT-3B, 64 H100", _mpt(2651837440, 32, 2560, 20), 64, 6, 3, 22525),
    ],
)
def test_llm_foundry_h100(name, shape, gpus, micro_batch, accumulation, published):
    predicted = _fsdp_tokens_per_gpu_s(shape, "H100", gpus, micro_batch, accumulation, 2048, "none", 3200)
    assert abs(predicted / published - 1) <= TOLERANCE, (name, predicted, published)


@pytest.mark.parametrize(
    ("name", "model", "gpu", "gpus", "micro_batch", "network_gbps", "published"),
    [
        ("Llama 3.1 8B, 8 H100", "llama-3.1-8b", "H100", 8, 2, 3200, 5762),
        ("Llama 3 8B, 64 A100", "llama-3.1-8b", "A100-80GB", 64, 1, 1600, 2973),
    ],
)
def test_torchtitan(name, model, gpu, gpus, micro_batch, network_gbps, published):
    predicted = _fsdp_tokens_per_gpu_s(get_model(model), gpu, gpus, micro_batch, 1, 8192, "selective", network_gbps)
    assert abs(predicted / published - 1) <= TOLERANCE, (name, predicted, published)


def test_without_node_nics_the_same_runs_are_communication_bound():
    # the model's communication matters: MPT-13B on 64 H100 over one 100 Gbit/s NIC per node
    # instead of 3,200 no longer hides its FSDP traffic behind compute
    shape = _mpt(12853954560, 40, 5120, 40)
    fast = _fsdp_tokens_per_gpu_s(shape, "H100", 64, 2, 1, 2048, "none", 3200)
    slow = _fsdp_tokens_per_gpu_s(shape, "H100", 64, 2, 1, 2048, "none", 100)
    assert slow < fast / 5
