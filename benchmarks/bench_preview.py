"""Offline preview wall time and resource count for 1, 8, 64 and 512 nodes.

Target: under 2 s median at 512 nodes on a 2-core machine, and a flat resource count.
Prints two figures per size: the in-process time of ``run_preview`` (program under Pulumi mocks,
SDKs already imported) and the whole ``gpuinfra preview --json`` process (Python start, SDK
imports, program; GPUINFRA_NO_CACHE=1, so no cached preview is used). Usage: uv run python benchmarks/bench_preview.py [--runs N] [--cloud aws|gcp]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {"aws": ("p5.48xlarge", "llm-pretrain"), "gcp": ("a3-megagpu-8g", "llm-pretrain")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cloud", choices=sorted(SHAPES), default="aws")
    args = parser.parse_args()
    from gpuinfra.cli import main as cli_main
    from gpuinfra.preview import run_preview
    from gpuinfra.stackfile import provider_config, read_stack_spec

    itype, profile = SHAPES[args.cloud]
    exe = str(Path(sys.executable).with_name("gpuinfra"))
    with tempfile.TemporaryDirectory() as tmp:
        print(f"offline preview of {itype} ({args.cloud}), {args.runs} runs per size")
        print(f"{'nodes':>6} {'resources':>9} {'in-process median s':>20} {'whole process median s':>23}")
        for nodes in (1, 8, 64, 512):
            stack = f"bench-{nodes}"
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    cli_main(
                        [
                            "new",
                            "--instance-type",
                            itype,
                            "--nodes",
                            str(nodes),
                            "--profile",
                            profile,
                            "--name",
                            stack,
                            "--project-dir",
                            tmp,
                            "--force",
                            "--json",
                        ]
                    )
            except SystemExit as exc:
                if exc.code:
                    raise
            spec = read_stack_spec(Path(tmp), stack)
            warm, count = [], 0
            for _ in range(args.runs):
                start = time.perf_counter()
                count = len(run_preview(spec, provider_config(spec)).resources)
                warm.append(time.perf_counter() - start)
            whole = []
            for _ in range(args.runs):
                start = time.perf_counter()
                subprocess.run(
                    [exe, "preview", stack, "--project-dir", tmp, "--json"],
                    check=True,
                    capture_output=True,
                    env={**os.environ, "GPUINFRA_NO_CACHE": "1"},
                )
                whole.append(time.perf_counter() - start)
            print(f"{nodes:>6} {count:>9} {statistics.median(warm):>20.3f} {statistics.median(whole):>23.3f}")


if __name__ == "__main__":
    main()
