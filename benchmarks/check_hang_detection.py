"""Run the node agent's own GPU reads and hang check on a real GPU, against real load.

The agent (:class:`gpuinfra.agent.node.Agent` with :class:`~gpuinfra.agent.node.NvmlGpus` and the
job watch :class:`gpuinfra.agent.watch.Watch`, its real ``nvidia-smi`` power query and its real
``/dev/kmsg`` reader) polls every ``POLL_SECONDS`` while another process loads the GPU:

* ``wait``: ``torch.cuda._sleep`` (a kernel that only waits: what an NCCL collective waiting for a
  peer looks like, github.com/NVIDIA/nccl/issues/968), for ``PHASE_SECONDS``;
* ``gemm``: back-to-back bf16 8192^3 matrix products, for ``PHASE_SECONDS``.

With ``GPUINFRA_HANG_MINUTES`` = 0.5 and ``GPUINFRA_HANG_POWER_PERCENT`` = 25 (the profiles'
default), the agent must report ``hung`` during ``wait`` (after 30 s of low power at full
utilization) and only ``running`` during ``gemm``. Writes ``OUT/hang_check.json`` (every poll:
phase, seconds into it, agent state, utilization, power readings) and prints a summary.
Usage: ``python benchmarks/check_hang_detection.py OUT_DIR`` (repository root on PYTHONPATH).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpuinfra.agent.node import Agent, AgentConfig, NvmlGpus  # noqa: E402  (stdlib-only node modules)
from gpuinfra.agent.watch import Watch, gpu_power  # noqa: E402

PHASE_SECONDS = 60
POLL_SECONDS = 5
LOADS = {
    "wait": "import torch; torch.cuda._sleep(int({s} * 1.98e9)); torch.cuda.synchronize()",
    "gemm": (
        "import time, torch\n"
        "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)\n"
        "end = time.monotonic() + {s}\n"
        "while time.monotonic() < end:\n"
        "    [a @ b for _ in range(20)]; torch.cuda.synchronize()\n"
    ),
}


class NoMetadata:
    """No spot notice, no expiry tag (the check is about the GPUs)."""

    def interruption(self):
        return None

    def expires_at(self):
        return None


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    state_dir = Path(tempfile.mkdtemp())
    env = {"GPUINFRA_HANG_ACTION": "alert", "GPUINFRA_HANG_MINUTES": "0.5", "GPUINFRA_HANG_POWER_PERCENT": "25"}
    config = AgentConfig(
        cloud="aws",
        stack="gpu-check",
        bucket="none",
        expires_at=None,
        idle_timeout_seconds=24 * 3600,
        idle_utilization_percent=10,
        checkpoint_dir=state_dir / "ckpt",
        dry_run=True,
        gpu_count=1,
        env=env,
    )
    gpus = NvmlGpus()
    agent = Agent(config, gpus, NoMetadata(), None, lambda reason: None, state_dir=state_dir, watch=Watch)  # type: ignore[arg-type]
    polls = []
    for phase, code in LOADS.items():
        load = subprocess.Popen([sys.executable, "-c", code.format(s=PHASE_SECONDS)])
        time.sleep(3)  # CUDA context and the first kernels
        started = time.monotonic()
        while load.poll() is None and time.monotonic() - started < PHASE_SECONDS - 5:
            state = agent.step()
            polls.append(
                {
                    "phase": phase,
                    "seconds": round(time.monotonic() - started, 1),
                    "state": state,
                    "utilization": gpus.utilizations(),
                    "power_w_limit_w": gpu_power(),
                }
            )
            print(json.dumps(polls[-1]), flush=True)
            time.sleep(POLL_SECONDS)
        load.wait(PHASE_SECONDS + 60)
        agent.step()  # the load ended: the next poll clears the hang
    summary = {phase: sorted({p["state"] for p in polls if p["phase"] == phase}) for phase in LOADS} | {
        "first_hung_seconds": next((p["seconds"] for p in polls if p["state"] == "hung"), None),
        "nvml": gpus._nvml is not None,
        "events": agent.events,
    }
    (out / "hang_check.json").write_text(json.dumps({"summary": summary, "polls": polls}, indent=1) + "\n")
    print(json.dumps(summary))
    return 0 if summary["wait"] == ["hung", "running"] and summary["gemm"] == ["running"] else 3


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "hang-check-out")))
