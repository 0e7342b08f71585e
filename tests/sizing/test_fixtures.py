"""The memory model against measured memory: the published fixture (every row within +-15%)
and, when committed, the harness's measured fixture (benchmarks/results/gpu-memory-*.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuinfra.sizing.calibration import predict

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "tests" / "fixtures" / "sizing" / "published.yaml"
MEASURED = sorted((ROOT / "benchmarks" / "results").glob("gpu-memory-*.json"))
TOLERANCE = 0.15


def _published_rows() -> list[dict]:
    return yaml.safe_load(PUBLISHED.read_text())["rows"]


def _measured_rows() -> list[dict]:
    rows = []
    for path in MEASURED:
        doc = json.loads(path.read_text())
        rows += [r for r in doc["rows"] if r.get("status") == "ok"]
    return rows


def _report(name: str, rows: list[dict]) -> float:
    comparisons = [predict(r) for r in rows]
    worst = max(comparisons, key=lambda c: abs(c.error))
    print(f"\n{name}: {len(comparisons)} rows covered, worst error {worst.error:+.1%} ({worst.row_id})")
    for c in comparisons:
        print(
            f"  {c.row_id}: measured {c.measured_bytes / 2**30:.2f} GiB, model {c.predicted_bytes / 2**30:.2f} GiB "
            f"({c.error:+.1%})"
        )
    bad = [c.row_id for c in comparisons if abs(c.error) > TOLERANCE]
    assert not bad, f"rows outside +-{TOLERANCE:.0%}: {bad}"
    return worst.error


def test_published_fixture_rows_are_cited_and_complete():
    rows = _published_rows()
    assert len(rows) >= 15 and len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["source"] and r["metric"] in ("allocated", "reserved", "device_used") and r["measured"] > 0


def test_model_within_15_percent_of_every_published_row():
    _report("published fixture", _published_rows())


@pytest.mark.skipif(not MEASURED, reason="no measured fixture committed (benchmarks/measure_gpu_memory.py needs a GPU)")
def test_model_within_15_percent_of_every_measured_row():
    _report("measured fixture", _measured_rows())


@pytest.mark.skipif(not MEASURED, reason="no measured fixture committed (benchmarks/measure_gpu_memory.py needs a GPU)")
def test_issue_cases_match_the_h100_measurement():
    # `gpuinfra size --model llama-3.1-8b --method lora --seq 2048 --batch 2 --recompute full
    # --gpus 1xH100` and `--method inference --batch 32` against the harness rows of the same cases.
    rows = {r["id"]: r for r in _measured_rows()}
    for case in ("llama-3.1-8b-lora-s2048-b2-full", "llama-3.1-8b-inference-s2048-b32"):
        assert case in rows, f"measured fixture lacks {case}"
        assert abs(predict(rows[case]).error) <= TOLERANCE
