"""gpuinfra.sizing.layout: the layout chosen, its bubble and its memory effect."""

from __future__ import annotations

import pytest

from gpuinfra.errors import SizingError
from gpuinfra.sizing.layout import Layout, bubble_fraction, choose_layout, layout_memory
from gpuinfra.sizing.memory import ALLOCATOR_RESERVE_FRACTION, Workload, memory_per_gpu
from gpuinfra.sizing.models import get_model


def test_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    # Narayanan et al. 2021 (arXiv:2104.04473) section 2.2.1: bubble time / ideal time = (p-1)/m,
    # so the bubble's share of the step is (p-1)/(m+p-1): p=8, m=64 -> 7/71
    assert bubble_fraction(8, 64) == 7 / 71
    assert bubble_fraction(1, 1) == 0
    assert Layout(dp=4, tp=8, pp=8, micro_batch=1, accumulation=16).bubble_fraction == 7 / 23


def test_global_batch_is_micro_batch_times_accumulation_times_dp():
    layout = Layout(dp=6, tp=8, pp=64, micro_batch=1, accumulation=512)
    assert (layout.global_batch, layout.gpus) == (3072, 3072)  # Megatron-LM 2021 Table 1, 1T row


def _fits_when(limit):
    """fits(tp, pp, mb) when the per-GPU share of a 'model' of 64 units plus 8 units per
    micro-batch split by tp stays within ``limit``."""
    return lambda tp, pp, mb: 64 / (tp * pp) + 8 * mb / tp <= limit


def test_tensor_parallel_inside_the_node_first_then_pipeline_across_nodes():
    # fits at tp 1: nothing split
    assert (lambda lay: (lay.tp, lay.pp))(choose_layout(8, 4, 32, 32, _fits_when(100), micro_batch=1)) == (1, 1)
    # needs tp 4 (64/4 + 8/4 = 18 <= 20); pp stays 1
    lay = choose_layout(8, 4, 32, 32, _fits_when(20), micro_batch=1)
    assert (lay.tp, lay.pp, lay.dp) == (4, 1, 8) and "tp" in lay.chosen
    # tp 8 is not enough (8 + 1 = 9 > 6): pipeline over nodes, the fewest stages that fit
    lay = choose_layout(8, 4, 32, 32, _fits_when(6), micro_batch=1)
    assert (lay.tp, lay.pp, lay.dp) == (8, 2, 2)
    # one node: no pipeline to add, the caller reports no fit
    assert (lambda lay: (lay.tp, lay.pp))(choose_layout(8, 1, 32, 32, _fits_when(6), micro_batch=1)) == (1, 1)
    # tp must divide the heads: 12 heads on 8 GPUs -> tp 1, 2 or 4
    lay = choose_layout(8, 1, 12, 32, _fits_when(20), micro_batch=1)
    assert lay.tp == 4


def test_micro_batch_is_the_largest_that_fits_and_accumulation_fills_the_global_batch():
    lay = choose_layout(8, 1, 32, 32, _fits_when(80))  # 64 + 8 mb <= 80 -> mb 2 (of 1, 2, 4, 8 ...)
    assert (lay.tp, lay.micro_batch, lay.accumulation, lay.global_batch) == (1, 2, 1, 16)
    lay = choose_layout(8, 1, 32, 32, _fits_when(80), global_batch=256)
    assert (lay.micro_batch, lay.accumulation, lay.global_batch) == (2, 16, 256)
    # a global batch smaller than the fitting micro-batches caps them; uneven ones round up
    assert choose_layout(8, 1, 32, 32, _fits_when(80), global_batch=8).micro_batch == 1
    assert choose_layout(8, 1, 32, 32, _fits_when(80), micro_batch=2, global_batch=100).global_batch == 112


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 3}, r"--tp 3 must divide the GPUs per node \(8\) and the attention heads \(32\)"),
        ({"tp": 16}, "--tp 16 must divide the GPUs per node"),
        ({"pp": 64}, r"--pp 64 must be at most the layers \(32\)"),
    ],
)
def test_given_sizes_that_cannot_be_laid_out(kwargs, message):
    with pytest.raises(SizingError, match=message):
        choose_layout(8, 4, 32, 32, _fits_when(100), **kwargs)


def test_layout_memory_splits_every_phase_before_the_peak_is_taken():
    # 8 data-parallel ranks of a 13B ZeRO-3 pretrain; tp 4 x pp 2 on top (32 GPUs)
    w = Workload(
        get_model("llama-2-13b"), "pretrain", strategy="zero3", recompute="full", seq=4096, gpus=8, gpus_per_node=8
    )
    one, split = memory_per_gpu(w), layout_memory(w, tp=4, pp=2)
    # model states (weights, gradients, optimizer state) over tp x pp = 8
    assert split.phases["between_steps"] == pytest.approx(one.phases["between_steps"] / 8)
    assert split.phases["optimizer_step"] == pytest.approx(one.phases["optimizer_step"] / 8)
    # activations over tp only (1F1B: the first stage keeps all L layers of one micro-batch)
    fwd_acts = one.phases["forward"] - one.phases["between_steps"]
    assert split.phases["forward"] - split.phases["between_steps"] == pytest.approx(fwd_acts / 4)
    # the peak is taken after the split, with the reserve as its share of it; context per process
    assert split.allocated == pytest.approx(max(split.phases[k] for k in ("forward", "backward", "optimizer_step")))
    assert split.allocator_reserve == pytest.approx(ALLOCATOR_RESERVE_FRACTION * split.allocated)
    assert split.cuda_context == one.cuda_context
    assert layout_memory(w, 1, 1) == one
