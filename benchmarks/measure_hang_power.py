"""Measure, on a GPU machine, what the node agent's hang detection reads: GPU utilization and
power draw against the board power limit while the GPU is idle, busy with real work, and busy
with a kernel that only waits (the shape of an NCCL collective waiting for a peer that never
comes: utilization reads 100% while the power stays low, github.com/NVIDIA/nccl/issues/968).

Phases (each ``PHASE_SECONDS``), sampled by ``nvidia-smi --query-gpu=... -lms 500`` running
beside the load:

* ``idle``: no kernel;
* ``gemm``: back-to-back bf16 8192^3 matrix products (a training step's dense work);
* ``spin_1block``: ``torch.cuda._sleep`` (one thread block spinning on ``clock64``);
* ``poll_32blocks``: 32 blocks x 640 threads polling a ``volatile`` flag in device memory that
  never changes (NCCL's primitives wait the same way: blocks of up to 640 threads spinning on a
  flag, one block per channel; NCCL src/device/prims_simple.h ``waitPeer``).

Writes ``OUT/samples_<phase>.csv`` (raw nvidia-smi lines), ``OUT/summary.json`` (per phase: median
utilization percent, median power draw W, the enforced power limit W and their ratio) and
``OUT/versions.json``. Usage: ``python benchmarks/measure_hang_power.py OUT_DIR``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

PHASE_SECONDS = 20
#: The fields sampled; ``enforced.power.limit`` is the limit the board runs under.
QUERY = "timestamp,utilization.gpu,power.draw,enforced.power.limit,power.max_limit,clocks.sm"

POLL_KERNEL = r"""
extern "C" __global__ void poll(volatile int *flag, long long cycles) {
    long long start = clock64();
    while (*flag == 0) {
        if (clock64() - start > cycles) break;
    }
}
"""


def sample(phase: str, out: Path, load) -> dict:
    """Run ``load(seconds)`` while nvidia-smi samples every 500 ms; returns the phase summary."""
    path = out / f"samples_{phase}.csv"
    with path.open("w") as handle:
        smi = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "500"],
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
        )
        time.sleep(2)  # let the sampler start before the load
        started = time.monotonic()
        load(PHASE_SECONDS)
        elapsed = time.monotonic() - started
        smi.terminate()
        smi.wait(10)
    rows = [line.split(", ") for line in path.read_text().splitlines() if line.count(",") == QUERY.count(",")]
    rows = rows[4:-1] or rows  # drop the samples taken before the load started and the last one
    util = [float(r[1]) for r in rows]
    power = [float(r[2]) for r in rows]
    limit = float(rows[-1][3])
    return {
        "phase": phase,
        "samples": len(rows),
        "load_seconds": round(elapsed, 1),
        "utilization_percent_median": statistics.median(util),
        "utilization_percent_min": min(util),
        "power_draw_w_median": statistics.median(power),
        "power_draw_w_max": max(power),
        "enforced_power_limit_w": limit,
        "power_fraction_of_limit_median": round(statistics.median(power) / limit, 4),
        "power_fraction_of_limit_max": round(max(power) / limit, 4),
    }


def main(out: Path) -> int:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    import cupy

    clock_hz = cupy.cuda.Device().attributes["ClockRate"] * 1e3  # kHz -> Hz (the SM clock clock64 counts)

    def idle(seconds: float) -> None:
        time.sleep(seconds)

    def gemm(seconds: float) -> None:
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()

    def spin_1block(seconds: float) -> None:
        torch.cuda._sleep(int(seconds * clock_hz))
        torch.cuda.synchronize()

    def poll_32blocks(seconds: float) -> None:
        kernel = cupy.RawKernel(POLL_KERNEL, "poll")
        flag = cupy.zeros(1, dtype=cupy.int32)
        kernel((32,), (640,), (flag, cupy.int64(int(seconds * clock_hz))))
        cupy.cuda.Device().synchronize()

    summary = []
    for phase, load in (("idle", idle), ("gemm", gemm), ("spin_1block", spin_1block), ("poll_32blocks", poll_32blocks)):
        try:
            summary.append(sample(phase, out, load))
        except Exception as exc:  # noqa: BLE001 - record the failure, never a made-up figure
            summary.append({"phase": phase, "error": repr(exc)})
        print(json.dumps(summary[-1]), flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,vbios_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    versions = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpu_driver_vbios": smi,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sm_clock_hz_assumed": clock_hz,
    }
    (out / "versions.json").write_text(json.dumps(versions, indent=1) + "\n")
    print(json.dumps(versions))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "hang-power-out")))
