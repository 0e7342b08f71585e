"""Offline preview wall time and resource count for 1, 8, 64 and 512 nodes.

Target: under 2 s median at 512 nodes on a 2-core machine, and a flat resource count.
Prints two figures per size: the in-process time of ``run_preview`` (program under Pulumi mocks,
SDKs already imported) and the whole ``gpuinfra preview --json`` process (Python start, SDK
imports, program; GPUINFRA_NO_CACHE=1, so no cached preview is used).

``--warm``: instead, the whole-process time of ``gpuinfra preview``, ``gpuinfra cost`` and
``gpuinfra new`` (stack file removed before each run) of the README's stack (``new --gpus
4xA100``), cold (``GPUINFRA_NO_CACHE=1``: the Pulumi program runs, the provider SDKs are
imported) and warm (a cached preview of the same stack, with its provider-value verdict), and
whether each run imported ``pulumi_aws`` / ``pulumi_gcp`` (``python -X importtime``).

Usage: uv run python benchmarks/bench_preview.py [--runs N] [--cloud aws|gcp] [--warm]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
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
    parser.add_argument("--warm", action="store_true", help="cold vs warm preview / cost / new of one stack")
    args = parser.parse_args()
    if args.warm:
        warm_vs_cold(args.runs)
        return
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


def _timed(argv: list[str], env: dict[str, str], importtime: bool = False) -> tuple[float, float, bool]:
    """Wall and CPU (user + system) seconds of one ``gpuinfra`` process, and (with
    ``importtime``, which slows the run: not timed then) whether it imported a provider SDK.
    CPU seconds barely move with other load on the machine; wall seconds do."""
    flags = ["-X", "importtime"] if importtime else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *flags, "-c", "from gpuinfra.cli import main; main()", *argv],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu, any(name in done.stderr for name in ("| pulumi_aws", "| pulumi_gcp"))


def warm_vs_cold(runs: int) -> None:
    """Print the median wall time of cold and warm ``preview`` / ``cost`` / ``new`` processes."""
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        base = {**os.environ, "XDG_CACHE_HOME": str(cache)}
        cold_env = {**base, "GPUINFRA_NO_CACHE": "1"}
        new = ["new", "--gpus", "4xA100", "--cloud", "gcp", "--project-dir", tmp, "--json"]
        subprocess.run(
            [sys.executable, "-c", "from gpuinfra.cli import main; main()", *new],
            check=True,
            capture_output=True,
            env=base,
        )
        stack = "gcp-4xa100"
        stack_file = Path(tmp) / "stacks" / f"Pulumi.{stack}.yaml"
        commands = {
            "preview": ["preview", stack, "--project-dir", tmp],
            "cost": ["cost", stack, "--project-dir", tmp],
            "new": new,
        }
        print(f"whole process, median of {runs} runs: wall s, CPU s; SDK: pulumi_aws or pulumi_gcp imported")
        print(
            f"{'command':>8} {'cold wall':>10} {'cold CPU':>9} {'cold SDK':>9} {'warm wall':>10} {'warm CPU':>9} {'warm SDK':>9}"
        )
        for name, argv in commands.items():
            cells = []
            for env in (cold_env, base):
                walls, cpus, sdk = [], [], False
                for run in range(runs + 1):
                    if name == "new":
                        stack_file.unlink(missing_ok=True)
                    wall, cpu, imported = _timed(argv, env, importtime=run == runs)
                    if run < runs:
                        walls.append(wall)
                        cpus.append(cpu)
                    sdk = sdk or imported
                cells += [
                    f"{statistics.median(walls):>10.2f}",
                    f"{statistics.median(cpus):>9.2f}",
                    f"{'yes' if sdk else 'no':>9}",
                ]
            print(f"{name:>8} {' '.join(cells)}")


if __name__ == "__main__":
    main()
