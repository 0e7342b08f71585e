"""The memory model against GPU memory measured on an H100 (torch 2.11, transformers 5.17,
peft 0.21): the nine handed-over rows (tests/fixtures/sizing/h100-measured-2026-11-22.jsonl,
a copy of ../shared/data/sizing/ with its README) within +-10% on device memory with the right
fit verdict; the phase rows of benchmarks/results/memory-phases-h100-2026-11-26 and the
generate / micro-batch rows of benchmarks/results/kv-throughput-h100-2026-11-27: peak allocated
within +-10% per phase (held out: no constant of the phase model comes from these rows) and device
memory within +-20% (not held out: memory.CUDA_CONTEXT_BYTES is the largest context measured in
these rows and memory.ALLOCATOR_RESERVE_FRACTION the mean reserve of all 19 training rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuinfra.catalog.gpus import gpu_model
from gpuinfra.sizing.calibration import predict, workload_for
from gpuinfra.sizing.memory import GIB, memory_per_gpu

ROOT = Path(__file__).resolve().parents[2]
HANDED_OVER = ROOT / "tests" / "fixtures" / "sizing" / "h100-measured-2026-11-22.jsonl"
PHASES = ROOT / "benchmarks" / "results" / "memory-phases-h100-2026-11-26" / "memory-phases.json"
KV = ROOT / "benchmarks" / "results" / "kv-throughput-h100-2026-11-27" / "kv-throughput.json"


def _handed_over() -> list[dict]:
    """The jsonl rows in the fixture format; the settings are those its README states (SDPA,
    bf16 autocast, fused AdamW, PEFT r=16 on q, k, v, o with LoraConfig's default dropout 0)."""
    rows = []
    for line in HANDED_OVER.read_text().splitlines():
        r = json.loads(line)
        row = {
            "id": r["name"],
            "model": r["model"],
            "method": r["method"],
            "seq": r["seq"],
            "batch": r["batch"],
            "recompute": r["recompute"],
            "compute": "bf16",
            "attention": "sdpa",
            "storage": "fp32" if r["weights"] == "mixed" else "bf16",
            "lora_rank": 16,
            "lora_sites": 4,
            "lora_dropout": False,
            "metric": "device_used",
            "measured": r["peak_reserved_gib"] + r["context_gib"],
            "unit": "GiB",
            "fits": r["fits"],
            "allocated_gib": r["peak_allocated_gib"],
        }
        if r["method"] != "inference":
            row["optimizer"] = "adamw-fused"
        rows.append(row)
    return rows


def _measured(path: Path) -> list[dict]:
    return [r for r in json.loads(path.read_text())["rows"] if r["status"] == "ok"]


def test_the_h100_the_rows_were_measured_on_reports_what_the_catalog_holds():
    # device_total_gib 79.1787 in every row = what gpus.json gives an H100 (fit target)
    totals = {round(json.loads(line)["device_total_gib"], 2) for line in HANDED_OVER.read_text().splitlines()}
    assert totals == {gpu_model("H100").device_reported_gib} == {79.18}


@pytest.mark.parametrize("row", _handed_over(), ids=lambda r: r["id"])
def test_handed_over_rows_within_10_percent_with_the_right_verdict(row):
    c = predict(row)
    fits = c.predicted_bytes / GIB <= gpu_model("H100").device_reported_gib
    assert fits is row["fits"], f"{row['id']}: model {c.predicted_bytes / GIB:.2f} GiB"
    if row["fits"]:  # an out-of-memory row holds the peak reached before the error
        assert abs(c.error) <= 0.10, f"{row['id']}: {c.error:+.1%}"


@pytest.mark.parametrize("row", _measured(PHASES) + _measured(KV), ids=lambda r: f"{r['id']}-{r.get('optimizer', '')}")
def test_held_out_phase_and_generate_rows(row):
    breakdown = memory_per_gpu(workload_for(row))
    measured = row["phases"]
    if row["method"] == "inference":
        # weights before generate(); GPT-2 also holds a 1024 x 1024 causal-mask buffer per layer (2%)
        assert breakdown.weights == pytest.approx(measured["weights"], rel=0.03)
    else:
        for phase in ("between_steps", "forward", "backward", "optimizer_step"):
            assert breakdown.phases[phase] == pytest.approx(measured[phase], rel=0.10), phase
        peak = max(("forward", "backward", "optimizer_step"), key=lambda k: measured[k])
        if abs(measured["forward"] - measured["backward"]) > 0.02 * measured[peak]:
            assert breakdown.phase == peak  # the phase that sets the peak
    assert breakdown.allocated == pytest.approx(row["max_memory_allocated"], rel=0.10)
    assert abs(predict(row).error) <= 0.20  # device memory; short generate() outputs err high


def test_optimizer_implementations_differ_as_measured():
    rows = {r["optimizer"]: r for r in _measured(PHASES) if r["id"] == "phi-3-mini-full-s2048-b1-full"}
    fused, foreach = (memory_per_gpu(workload_for(rows[k])) for k in ("adamw-fused", "adamw-foreach"))
    measured_step = rows["adamw-foreach"]["phases"]["optimizer_step"] - rows["adamw-fused"]["phases"]["optimizer_step"]
    modeled_step = foreach.phases["optimizer_step"] - fused.phases["optimizer_step"]
    assert modeled_step == pytest.approx(measured_step, rel=0.02)  # foreach's sqrt(exp_avg_sq) workspace
