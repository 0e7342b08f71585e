"""Median wall time of `gpuinfra offers --gpus 8xH100 --json` as a whole process.

Target: under 1.0 s on a 2-core machine. Prints one line per run and a summary.
Usage: uv run python benchmarks/bench_offers_cli.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    exe = Path(sys.executable).with_name("gpuinfra")
    cmd = [str(exe), "offers", "--gpus", "8xH100", "--json"]
    subprocess.run(cmd, check=True, capture_output=True)  # warm the OS file cache and .pyc files
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        proc = subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    count = proc.stdout.count(b'"instance_type"')
    print(f"gpuinfra offers --gpus 8xH100 --json: {count} offers, runs={args.runs}")
    print(
        f"  median {statistics.median(times):.3f} s  min {min(times):.3f} s  max {max(times):.3f} s  (target < 1.0 s)"
    )


if __name__ == "__main__":
    main()
