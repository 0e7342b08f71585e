"""Capture, on a GPU machine, the raw outputs the boot health gate reads (gpuinfra/health/), so the
parsers can be tested on this machine's real output.

Runs each command the gate runs (``gpuinfra.health.parsers`` *_COMMAND / NVIDIA_SMI_QUERY), plus
a one-process NCCL all-reduce through torch.distributed with ``NCCL_DEBUG=INFO`` (the NCCL INFO
lines the GPUDirect-plugin check reads; nccl-tests' all_reduce_perf is used instead when it is on
PATH), and writes each output to ``OUT/<name>.txt`` with ``OUT/versions.json``.

Usage: ``python benchmarks/capture_node_health.py OUT_DIR`` (prints what it wrote; a command that
is missing on the machine is recorded as such, never faked).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpuinfra.health import parsers  # noqa: E402  (stdlib only: the module the nodes run)

ALL_REDUCE_TORCH = r"""
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29511", rank=0, world_size=1)
torch.cuda.set_device(0)
x = torch.ones(256 * 1024 * 1024 // 4, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(20):
    dist.all_reduce(x)
torch.cuda.synchronize()
print(f"torch all_reduce 256 MiB x 20, 1 rank: {(time.perf_counter() - t) / 20 * 1e6:.1f} us per call")
dist.destroy_process_group()
"""


def run(command: str, env: dict | None = None, timeout: int = 300) -> str:
    """stdout+stderr of ``command`` (a shell line), or a note that it could not run."""
    if shutil.which(command.split()[0]) is None:
        return f"(not run: {command.split()[0]} is not on PATH)\n"
    done = subprocess.run(
        command, shell=True, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    return done.stdout + done.stderr + (f"(exit {done.returncode})\n" if done.returncode else "")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    outputs = {
        "nvidia_smi_query": run(parsers.NVIDIA_SMI_QUERY),
        "nvidia_smi_nvlink_s": run(parsers.NVLINK_STATUS_COMMAND),
        "fabric_manager": run(parsers.FABRIC_MANAGER_COMMAND),
        "fi_info_efa": run(parsers.FI_INFO_COMMAND),
        "nvidia_smi": run("nvidia-smi"),
        "nvidia_smi_topo": run("nvidia-smi topo -m"),
    }
    if shutil.which("all_reduce_perf"):
        outputs["all_reduce_perf"] = run("all_reduce_perf -b 8 -e 2G -f 2 -g 1 -c 1", {"NCCL_DEBUG": "INFO"}, 600)
    else:
        script = out / "all_reduce_torch.py"
        script.write_text(ALL_REDUCE_TORCH)
        outputs["all_reduce_torch_nccl_info"] = run(f"{sys.executable} {script}", {"NCCL_DEBUG": "INFO"}, 600)
    for name, text in outputs.items():
        (out / f"{name}.txt").write_text(text)
    versions = {
        "captured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "driver": run("nvidia-smi --query-gpu=driver_version,name --format=csv,noheader").strip(),
        "python": sys.version.split()[0],
    }
    try:
        import torch

        versions.update(
            torch=torch.__version__, cuda=torch.version.cuda, nccl=".".join(map(str, torch.cuda.nccl.version()))
        )
    except Exception as exc:  # noqa: BLE001 - record why
        versions["torch"] = f"unavailable: {exc!r}"
    (out / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")
    print(json.dumps(versions, indent=2))
    for name in outputs:
        print(f"wrote {out / (name + '.txt')}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "node-health"))
