#!/usr/bin/python3
"""A real, tiny, deterministic training job for the box tier (PyTorch on CPU, gloo).

Run under torchrun by ``gpuinfra-run`` on every box node (``python3 train_tiny.py --steps 40
--checkpoint-every 5``). A linear model learns a fixed linear map from synthetic batches; every
batch is derived from ``(seed, step, rank)`` alone, so a run that resumes from a checkpoint ends
at the same step with the same loss as one that never stopped.

* Checkpoints: every ``--checkpoint-every`` steps the first process of each node writes
  ``$GPUINFRA_CHECKPOINT_DIR/step-<N>/state.pt`` and then ``.gpuinfra-complete`` (the marker the
  node's checkpoint sync waits for). Every node keeps a full copy, so any node can restore.
* Resume: each process finds its node's newest complete ``step-<N>`` (``GPUINFRA_RESUME_FROM``
  or a scan of the checkpoint dir); the processes agree on the newest step any of them has
  (all-reduce MAX) and the lowest rank holding it broadcasts the state.
* Progress: the first process of each node prints ``step=N loss=X`` every step (every node's job
  unit records the step it reached, and its hang watch sees the job move: it touches
  ``$GPUINFRA_PROGRESS_FILE``); rank 0 prints ``final step=N loss=X`` at the end and writes
  ``$GPUINFRA_OUTPUT_DIR/result.json``.
* A lost peer: ``init_process_group``'s ``timeout`` bounds every gloo collective (PyTorch's
  default for gloo is 30 min: pytorch.org/docs/stable/distributed.html#torch.distributed.
  init_process_group), so a process waiting on a powered-off peer fails after
  ``--collective-timeout`` seconds and the job unit restarts the job (docs/run.md).

One place for this job: the box's uninterrupted and interrupted scenarios both run it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

MARKER = ".gpuinfra-complete"


def batch(seed: int, step: int, rank: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``rank`` at ``step``: inputs and targets of the fixed map ``y = x @ W + 1``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(size, 8, generator=g)
    w = torch.arange(8, dtype=torch.float32).reshape(8, 1) / 8
    return x, x @ w + 1.0


def newest(root: Path) -> tuple[int, Path | None]:
    """(step, folder) of the newest complete ``step-<N>`` under ``root``; (0, None) when none."""
    found = [
        (int(p.name.split("-", 1)[1]), p)
        for p in root.glob("step-*")
        if p.name.split("-", 1)[1].isdigit() and (p / MARKER).exists()
    ]
    return max(found, default=(0, None), key=lambda f: f[0])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (a slower run)")
    parser.add_argument("--fail-at-step", type=int, default=0, help="every process exits 3 there (a crash)")
    parser.add_argument("--collective-timeout", type=float, default=60.0, help="seconds a collective may wait")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.collective_timeout))
    rank, world, local = dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))
    torch.manual_seed(args.seed)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    root = Path(os.environ.get("GPUINFRA_CHECKPOINT_DIR", "/tmp/checkpoints"))
    resume = os.environ.get("GPUINFRA_RESUME_FROM", "")
    step, folder = newest(Path(resume).parent if resume else root)
    if folder is None:
        step, folder = newest(root)
    best = torch.tensor([step])
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    start = int(best.item())
    if start:
        holder = torch.tensor([rank if step == start else world])
        dist.all_reduce(holder, op=dist.ReduceOp.MIN)
        state = [torch.load(folder / "state.pt") if rank == int(holder.item()) else None]
        dist.broadcast_object_list(state, src=int(holder.item()))
        model.load_state_dict(state[0]["model"])
        opt.load_state_dict(state[0]["optimizer"])
        if rank == 0:
            print(f"resumed from step {start}", flush=True)
    progress = os.environ.get("GPUINFRA_PROGRESS_FILE")
    total = torch.tensor(0.0)
    for step in range(start + 1, args.steps + 1):
        x, y = batch(args.seed, step, rank)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():  # the all-reduce DDP does, spelled out: mean gradient
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if local == 0:
            print(f"step={step} loss={total.item() / world:.6f}", flush=True)
            if progress:
                Path(progress).touch()
        if step % args.checkpoint_every == 0 and local == 0:
            out = root / f"step-{step}"
            out.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, out / "state.pt")
            (out / MARKER).write_text(f"{step}\n")
        if step == args.fail_at_step:
            print(f"failing at step={step} on purpose", flush=True)
            raise SystemExit(3)
        time.sleep(args.step_seconds)
    final = total.item() / world
    if rank == 0:
        print(f"final step={args.steps} loss={final:.6f}", flush=True)
        outputs = Path(os.environ.get("GPUINFRA_OUTPUT_DIR", "/tmp/outputs"))
        outputs.mkdir(parents=True, exist_ok=True)
        (outputs / "result.json").write_text(json.dumps({"step": args.steps, "loss": round(final, 6)}) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
