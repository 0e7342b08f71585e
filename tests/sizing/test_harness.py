"""benchmarks/measure_gpu_memory.py: its pure parts (configs, record format) without a GPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from gpuinfra.sizing.calibration import WORKLOAD_KEYS, workload_for
from gpuinfra.sizing.models import get_model

HARNESS = Path(__file__).resolve().parents[2] / "benchmarks" / "measure_gpu_memory.py"


def _harness():
    spec = importlib.util.spec_from_file_location("measure_gpu_memory", HARNESS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_is_the_published_llama_31_8b_config():
    cfg = _harness().hf_config_dict("llama-3.1-8b")
    # huggingface.co/meta-llama/Llama-3.1-8B config.json
    assert (
        cfg["num_hidden_layers"],
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
        cfg["tie_word_embeddings"],
    ) == (32, 4096, 32, 8, 14336, 128256, False)
    gpt2 = _harness().hf_config_dict("gpt2-xl")
    assert (gpt2["model_type"], gpt2["n_layer"], gpt2["n_embd"], gpt2["n_head"]) == ("gpt2", 48, 1600, 25)


def test_rows_are_in_the_fixture_format_the_model_reads():
    h = _harness()
    row = h.make_row(
        "llama-3.1-8b",
        "lora",
        2048,
        2,
        "full",
        device_used=30 * 2**30,
        allocated=25 * 2**30,
        reserved=28 * 2**30,
        step_seconds=0.5,
        tokens_per_second=8192.0,
    )
    assert row["id"] == "llama-3.1-8b-lora-s2048-b2-full" and row["unit"] == "bytes" and row["status"] == "ok"
    w = workload_for(row)
    assert (w.shape, w.method, w.seq, w.batch, w.recompute, w.storage, w.lora_sites) == (
        get_model("llama-3.1-8b"),
        "lora",
        2048,
        2,
        "full",
        "bf16",
        4,
    )
    assert set(WORKLOAD_KEYS) & set(row) >= {"method", "seq", "batch", "recompute", "compute", "storage"}
    assert h.case_id("llama-3.1-8b", "inference", 2048, 32, "none") == "llama-3.1-8b-inference-s2048-b32"


def test_issue_cases_are_in_both_grids():
    h = _harness()
    assert set(h.GRIDS["issue"]) <= set(h.GRIDS["default"])


def test_without_cuda_it_exits_with_one_line(tmp_path):
    try:
        import torch  # noqa: F401

        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is present: the harness would run")
    except ImportError:
        pass
    result = subprocess.run([sys.executable, str(HARNESS), "--out", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 6 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())
