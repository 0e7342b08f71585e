"""gpuinfra.sizing.mfu: which utilization a GPU, method and model size get, and from where."""

from __future__ import annotations

from gpuinfra.sizing.mfu import hf_utilization_h100, token_flops, utilization
from gpuinfra.sizing.models import get_model


def test_pretraining_takes_the_generations_published_run():
    h100, a100 = utilization("H100", "pretrain", 70e9), utilization("A100-80GB", "pretrain", 70e9)
    assert 0.38 <= h100.value <= 0.43 and "arXiv:2407.21783" in h100.source  # Llama 3 Table 4
    assert a100.value == round(0.421 * 4 / 3, 3) and "arXiv:2205.05198" in a100.source
    # no run of their own: Hopper's (lower) value, and the source says so
    for gpu in ("L4", "B200", "A10G", "T4"):
        u = utilization(gpu, "pretrain", 7e9)
        assert u.value == h100.value and u.source.startswith("no published run on ")


def test_fine_tuning_follows_the_measured_size_curve():
    small, mid, large = (hf_utilization_h100(p) for p in (1e9, 3.82e9, 70e9))
    assert small < mid < large  # larger GEMMs run closer to peak
    assert hf_utilization_h100(0.1e9) == small and hf_utilization_h100(400e9) == large  # held at the ends
    lora, full = utilization("H100", "lora", 8e9), utilization("H100", "full", 8e9)
    assert lora == full  # one curve: LoRA's saving is in its FLOPs, not its utilization
    assert utilization("H100", "qlora", 8e9).value < lora.value
    assert utilization("A100", "lora", 8e9).value > lora.value  # scaled by the A100 / H100 runs


def test_full_recompute_adds_a_forward_to_hardware_not_model_flops():
    shape = get_model("llama-3.1-8b")
    none, full = token_flops(shape, 4096, "full", "none"), token_flops(shape, 4096, "full", "full")
    assert none.model == full.model and full.hardware == full.model * 4 / 3
    # attention grows with the sequence: 4 L h s per token forward (Narayanan 2021 Eq. 3)
    longer = token_flops(shape, 8192, "full", "none")
    assert longer.model - none.model == 3 * 4 * shape.layers * shape.hidden * 4096
