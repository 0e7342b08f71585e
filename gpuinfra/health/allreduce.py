"""The health gate's all-reduce: ``torch.distributed.all_reduce`` over NCCL on every GPU of the
cluster, printed in the table layout of nccl-tests' ``all_reduce_perf`` so that one parser
(:func:`gpuinfra.health.parsers.parse_all_reduce`) and one gate read both.

Why not ``all_reduce_perf`` itself: across nodes it needs MPI and SSH between the nodes
(NVIDIA/nccl-tests README, "MPI=1"), which the clusters do not set up; torchrun's rendezvous is
what every node already has (``gpuinfra-run``). The training container (NGC PyTorch) has torch.

It runs in the training container under torchrun (``gpuinfra-run -- python3 gpuinfra_allreduce.py``,
the node copies this file to ``/usr/local/lib/gpuinfra/gpuinfra_allreduce.py``). What it measures,
per message size (bytes, powers of two from ``--min-bytes`` to ``--max-bytes``):

* time: ``--iters`` in-place all-reduces of float32 after ``--warmup`` ones, CUDA-event timed
  on every rank, the slowest rank's average (us);
* ``algbw`` = size / time and ``busbw`` = algbw x 2 (n - 1) / n for n ranks, GB/s = 1e9 B/s
  (NVIDIA/nccl-tests doc/PERFORMANCE.md, "AllReduce": the bus bandwidth factor 2(n-1)/n);
* ``#wrong``: after one more all-reduce of tensors filled with ``rank + 1``, the elements that
  differ from n (n + 1) / 2, summed over ranks.

The table has one set of columns, in-place (``torch.distributed.all_reduce`` works in place;
all_reduce_perf prints out-of-place first). Every node's local rank 0 prints the whole table
(times and errors are reduced over all ranks), so each node's log carries it, with the
``# Rank`` list of every rank's host name and GPU.

Standard library at import; torch is imported in :func:`main` only.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from dataclasses import dataclass

DEFAULT_MIN_BYTES = 1 << 20
#: 2 GiB: the largest message size the baselines are read at (gpuinfra/health/data/baselines.json).
DEFAULT_MAX_BYTES = 1 << 31
DEFAULT_WARMUP = 5
DEFAULT_ITERS = 20
FLOAT32_BYTES = 4


@dataclass(frozen=True)
class SizeResult:
    """One message size: ``size_bytes``, slowest rank's average ``time_us``, wrong elements."""

    size_bytes: int
    time_us: float
    wrong: int


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Message sizes: ``min_bytes`` doubled until past ``max_bytes`` (nccl-tests ``-f 2``).

    Raises:
        ValueError: a size under 4 bytes (one float32) or ``min_bytes > max_bytes``.
    """
    if min_bytes < FLOAT32_BYTES or min_bytes > max_bytes:
        raise ValueError(f"sizes must satisfy {FLOAT32_BYTES} <= min <= max, got {min_bytes}..{max_bytes}")
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def bus_bandwidth_gbps(size_bytes: int, time_us: float, ranks: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s for an all-reduce of ``size_bytes`` taking ``time_us`` on
    ``ranks`` ranks (nccl-tests doc/PERFORMANCE.md)."""
    algbw = size_bytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
    return algbw, algbw * 2 * (ranks - 1) / ranks if ranks > 1 else 0.0


def format_report(
    results: list[SizeResult],
    devices: list[tuple[int, str, int, str]],
    *,
    min_bytes: int,
    max_bytes: int,
    warmup: int,
    iters: int,
) -> str:
    """The run in the all_reduce_perf layout.

    Args:
        results: per size, in order.
        devices: ``(rank, host, local GPU index, GPU name)`` of every rank.
        min_bytes, max_bytes, warmup, iters: the run's settings (printed in the header line the
            parser reads the planned sizes from).
    """
    ranks = len(devices)
    lines = [
        "# gpuinfra-allreduce: torch.distributed.all_reduce (NCCL), nccl-tests table layout, in-place only",
        f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: 2(factor) warmup iters: {warmup} "
        f"iters: {iters} agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    lines += [
        f"#  Rank {rank:2d} Group  0 Pid {0:6d} on {host:>10s} device {gpu:2d} [0x00] {name}"
        for rank, host, gpu, name in devices
    ]
    lines += [
        "#",
        f"#{'':>62s}in-place",
        f"#{'size':>11s} {'count':>13s} {'type':>9s} {'redop':>7s} {'root':>7s} {'time':>8s} {'algbw':>7s} "
        f"{'busbw':>7s} {'#wrong':>6s}",
        f"#{'(B)':>11s} {'(elements)':>13s} {'':>9s} {'':>7s} {'':>7s} {'(us)':>8s} {'(GB/s)':>7s} {'(GB/s)':>7s}",
    ]
    total = 0.0
    for r in results:
        algbw, busbw = bus_bandwidth_gbps(r.size_bytes, r.time_us, ranks)
        total += busbw
        lines.append(
            f" {r.size_bytes:11d} {r.size_bytes // FLOAT32_BYTES:13d} {'float':>9s} {'sum':>7s} {-1:7d} "
            f"{r.time_us:8.1f} {algbw:7.2f} {busbw:7.2f} {r.wrong:6d}"
        )
    bad = sum(r.wrong for r in results)
    lines += [
        f"# Out of bounds values : {bad} {'OK' if not bad else 'FAILED'}",
        f"# Avg bus bandwidth    : {total / len(results) if results else 0.0:.4f}",
        "#",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - needs torch, GPUs and torchrun
    """Run under torchrun; prints the table on every node's local rank 0."""
    parser = argparse.ArgumentParser(description="gpuinfra health gate all-reduce")
    parser.add_argument("--min-bytes", type=int, default=DEFAULT_MIN_BYTES)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    parser.add_argument("--iters", type=int, default=DEFAULT_ITERS)
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    me = [(rank, socket.gethostname(), local_rank, torch.cuda.get_device_name(local_rank))]
    devices: list = [None] * world
    dist.all_gather_object(devices, me)
    results = []
    expected = world * (world + 1) / 2
    for size in sizes(args.min_bytes, args.max_bytes):
        buf = torch.ones(size // FLOAT32_BYTES, dtype=torch.float32, device="cuda")
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        end.record()
        torch.cuda.synchronize()
        elapsed = torch.tensor([start.elapsed_time(end) * 1000 / args.iters], device="cuda")
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        wrong = torch.tensor([int((buf != expected).sum().item())], device="cuda")
        dist.all_reduce(wrong)
        results.append(SizeResult(size, float(elapsed.item()), int(wrong.item())))
        del buf
    if local_rank == 0:
        sys.stdout.write(
            format_report(
                results,
                [d for group in devices for d in group],
                min_bytes=args.min_bytes,
                max_bytes=args.max_bytes,
                warmup=args.warmup,
                iters=args.iters,
            )
        )
        sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
