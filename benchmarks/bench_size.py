"""Median wall time of `gpuinfra size` as a whole process (target: under 1 s).

Usage: uv run python benchmarks/bench_size.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [
    ["--params", "7B", "--method", "full", "--strategy", "fsdp", "--json"],
    ["--model", "llama-3.1-70b", "--method", "pretrain", "--tokens", "2T", "--json"],
    ["--model", "llama-3.1-8b", "--method", "qlora", "--json"],
    ["--model", "llama-3.1-70b", "--method", "inference", "--seq", "8192", "--batch", "8", "--json"],
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    exe = str(Path(sys.executable).with_name("gpuinfra"))
    for case in CASES:
        subprocess.run([exe, "size", *case], check=True, capture_output=True)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([exe, "size", *case], check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        print(f"gpuinfra size {' '.join(case)}: median {statistics.median(times):.3f} s (target < 1 s)")


if __name__ == "__main__":
    main()
