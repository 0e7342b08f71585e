"""Single-GPU step time against the measured H100 rows.

Rows: ``tests/fixtures/sizing/h100-measured-2026-11-22.jsonl`` (copy of the shared file, see its
``.source.md``), ``benchmarks/results/memory-phases-h100-2026-11-26/memory-phases.json`` and
``benchmarks/results/kv-throughput-h100-2026-11-27/kv-throughput.json``: one NVIDIA H100 80GB
HBM3, torch 2.11.0+cu130, transformers 5.17, peft 0.21, AdamW(fused=True), SDPA.

The HF utilization curve (``gpuinfra/sizing/data/mfu.yaml`` ``hf``) takes the median of the
2026-11-22 and 2026-11-26 rows per model (3-4 rows each); the 2026-11-27 rows are held out.
Stated tolerance: +/-35% on the rows the curve was built from (one utilization per model size
for every sequence length and micro-batch), +/-25% on the held-out rows. Outside the model:
gpt2 (124M, below the smallest anchor; HF's per-kernel overhead dominates, measured 10% of
peak) and the foreach / 8-bit optimizer rows (the optimizer step's own time is not modelled).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from gpuinfra.sizing.comm import links_for
from gpuinfra.sizing.layout import Layout
from gpuinfra.sizing.memory import lora_params
from gpuinfra.sizing.mfu import mfu_table, token_flops
from gpuinfra.sizing.models import get_model
from gpuinfra.sizing.throughput import step_time

ROOT = Path(__file__).resolve().parents[2]
H100_PEAK = 989e12  # dense BF16, gpu_compute.yaml (Lightning / torchtitan / nanochat tables)


def _rows() -> list[dict]:
    rows = []
    for line in (ROOT / "tests/fixtures/sizing/h100-measured-2026-11-22.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["method"] != "inference" and r.get("step_s"):
            rows.append({**r, "step_seconds": r["step_s"], "optimizer": "adamw-fused", "set": "2026-11-22"})
    for date, path in (
        ("2026-11-26", "benchmarks/results/memory-phases-h100-2026-11-26/memory-phases.json"),
        ("2026-11-27", "benchmarks/results/kv-throughput-h100-2026-11-27/kv-throughput.json"),
    ):
        for r in json.loads((ROOT / path).read_text())["rows"]:
            if r["method"] != "inference" and r.get("status") == "ok":
                rows.append({**r, "name": r["id"], "set": date})
    return rows


ROWS = _rows()


def _predicted_seconds(row: dict) -> float:
    shape = get_model(row["model"])
    adapters = lora_params(shape) if row["method"] == "lora" else 0.0
    step, *_ = step_time(
        shape,
        row["method"],
        row["recompute"],
        "ddp",
        "H100",
        Layout(1, 1, 1, row["batch"], 1),
        row["seq"],
        links_for("H100", 1, None),
        1,
        adapters or shape.params,
        adapter_params=adapters,
    )
    return step.seconds


def _in_model(row: dict) -> bool:
    return row["model"] != "gpt2" and row.get("optimizer") == "adamw-fused"


@pytest.mark.parametrize("row", [r for r in ROWS if _in_model(r)], ids=lambda r: f"{r['set']}:{r['name']}")
def test_single_h100_step_time(row):
    tolerance = 0.25 if row["set"] == "2026-11-27" else 0.35
    error = _predicted_seconds(row) / row["step_seconds"] - 1
    assert abs(error) <= tolerance, (row["name"], error)


def test_held_out_rows_err_slow_not_fast():
    # the curve comes from rows at 2-16k tokens per micro-batch; the held-out larger micro-batches
    # run faster than it, so their cost errs high (safe side)
    held_out = [r for r in ROWS if r["set"] == "2026-11-27"]
    assert len(held_out) == 4 and all(_predicted_seconds(r) > r["step_seconds"] for r in held_out)


def test_the_utilization_anchors_are_the_measured_rows():
    """mfu.yaml's per-row utilizations are recomputed from the rows, not typed in."""
    by_name = {r["name"]: r for r in ROWS if r.get("optimizer") == "adamw-fused"}
    for anchor in mfu_table()["hf"]["anchors"]:
        for cited in anchor["rows"]:
            r = by_name[cited["row"]]
            shape = get_model(r["model"])
            adapters = lora_params(shape) if r["method"] == "lora" else 0.0
            flops = token_flops(shape, r["seq"], r["method"], r["recompute"], adapters).hardware
            measured = flops * r["seq"] * r["batch"] / r["step_seconds"] / H100_PEAK
            assert abs(measured - cited["utilization"]) < 5e-4, cited
        assert len(anchor["rows"]) >= 3  # never one row
        assert statistics.median(c["utilization"] for c in anchor["rows"]) > 0


def test_lora_counts_four_not_six_flops_per_parameter():
    # frozen base: forward 2N + activation gradients 2N, no weight-gradient GEMM
    shape = get_model("llama-3.1-8b")
    lora = token_flops(shape, 1, "lora", "none", lora_params(shape)).model
    full = token_flops(shape, 1, "full", "none").model
    assert 0.66 < lora / full < 0.68
