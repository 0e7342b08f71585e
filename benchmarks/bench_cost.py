"""Wall time of pricing a 64-node stack (target: under 2 s on a 2-core machine).

Prints the in-process time of the estimate alone (resources already planned), of offline
preview + estimate, and the whole `gpuinfra cost STACK --json` process, cold (GPUINFRA_NO_CACHE=1:
Python start, Pulumi SDK imports, program, pricing) and with the preview cached (as after
`gpuinfra new`), median of N runs.
Usage: uv run python benchmarks/bench_cost.py [--runs N]
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
from decimal import Decimal
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from gpuinfra.catalog.prices import usage_for
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.cli import main as cli_main
    from gpuinfra.cost.estimate import estimate
    from gpuinfra.preview import run_preview
    from gpuinfra.stackfile import provider_config, read_stack_spec

    exe = str(Path(sys.executable).with_name("gpuinfra"))
    with tempfile.TemporaryDirectory() as tmp:
        for itype in ("p5.48xlarge", "a3-megagpu-8g"):
            stack = f"bench-{itype.split('.')[0]}"
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    cli_main(
                        [
                            "new",
                            "--instance-type",
                            itype,
                            "--nodes",
                            "64",
                            "--profile",
                            "llm-pretrain",
                            "--name",
                            stack,
                            "--project-dir",
                            tmp,
                            "--json",
                        ]
                    )
                except SystemExit as exc:
                    if exc.code:
                        raise
            spec = read_stack_spec(Path(tmp), stack)
            resources = run_preview(spec, provider_config(spec)).resources
            catalog = load_catalog()
            only, both, cold, warm = [], [], [], []
            for _ in range(args.runs):
                start = time.perf_counter()
                est = estimate(
                    resources, catalog, spec.region, usage_for(spec.profile.name), Decimal(str(spec.run_hours))
                )
                only.append(time.perf_counter() - start)
                start = time.perf_counter()
                estimate(
                    run_preview(spec, provider_config(spec)).resources,
                    catalog,
                    spec.region,
                    usage_for(spec.profile.name),
                    Decimal(str(spec.run_hours)),
                )
                both.append(time.perf_counter() - start)
                for env, times in (({**os.environ, "GPUINFRA_NO_CACHE": "1"}, cold), (os.environ, warm)):
                    start = time.perf_counter()
                    subprocess.run(
                        [exe, "cost", stack, "--project-dir", tmp, "--json"], check=True, capture_output=True, env=env
                    )
                    times.append(time.perf_counter() - start)
            print(f"{itype} x 64 nodes: {len(resources)} resources, {len(est.lines)} cost lines")
            print(
                f"  estimate only {statistics.median(only):.3f} s | preview + estimate {statistics.median(both):.3f} s"
                f" | whole `gpuinfra cost` process: cold {statistics.median(cold):.3f} s, "
                f"preview cached {statistics.median(warm):.3f} s  (target < 2 s)"
            )


if __name__ == "__main__":
    main()
