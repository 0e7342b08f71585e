"""Parallel layout of a training run: data, tensor and pipeline parallel sizes, micro-batch and
gradient accumulation; what the layout does to memory per GPU; the pipeline bubble.

* GPUs = dp x tp x pp. Tensor parallel (Megatron-LM, Shoeybi et al. 2019 arXiv:1909.08053)
  stays inside a node (NVLink); pipeline parallel splits the layers over nodes (Narayanan et
  al. 2021, arXiv:2104.04473, Takeaway 1: tensor parallel up to the GPUs of a server, then
  pipeline across servers).
* Global batch (sequences per optimizer step) = micro-batch x accumulation x dp; each
  pipeline runs ``accumulation`` micro-batches per step.
* Pipeline bubble (1F1B, Narayanan 2021 section 2.2.1): (p - 1) idle micro-batch slots out of
  m + p - 1, so the bubble is (p - 1) / (m + p - 1) of the step.
* Memory (:func:`layout_memory`: the memory model's phases for one GPU of a dp-way run, each
  phase split before the peak is taken): weights, their autocast copies, gradients, optimizer
  states and the optimizer's workspace split over tp x pp; activations split
  over tp (sequence parallel, Korthikanti et al. 2022 arXiv:2205.05198 Table 2: sbh/t (34 +
  5as/h)); under 1F1B the first stage keeps p micro-batches in flight, each with L/p layers,
  so its activations stay those of all L layers for one micro-batch (Korthikanti section 4.2.3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuinfra.errors import SizingError
from gpuinfra.sizing.memory import Breakdown, Workload, memory_per_gpu

#: Micro-batches tried when none is given, smallest first: the largest that fits is taken.
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Layout:
    """How the GPUs of a run split the work.

    Attributes:
        dp, tp, pp: data, tensor and pipeline parallel sizes (dp x tp x pp = GPUs).
        micro_batch: sequences per GPU per forward/backward.
        accumulation: micro-batches per optimizer step (gradient accumulation; the pipeline's m).
        chosen: which of tp / pp / micro_batch were chosen here rather than given.
    """

    dp: int
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    accumulation: int = 1
    chosen: tuple[str, ...] = ()

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.micro_batch * self.accumulation * self.dp

    @property
    def gpus(self) -> int:
        """All GPUs of the run."""
        return self.dp * self.tp * self.pp

    @property
    def bubble_fraction(self) -> float:
        """Idle fraction of a pipeline step, (p - 1) / (m + p - 1)."""
        return bubble_fraction(self.pp, self.accumulation)

    def to_json(self) -> dict:
        """``{"dp", "tp", "pp", "micro_batch", "accumulation", "global_batch", "bubble_fraction", "chosen"}``."""
        return {
            "dp": self.dp,
            "tp": self.tp,
            "pp": self.pp,
            "micro_batch": self.micro_batch,
            "accumulation": self.accumulation,
            "global_batch": self.global_batch,
            "bubble_fraction": round(self.bubble_fraction, 4),
            "chosen": list(self.chosen),
        }


def bubble_fraction(pp: int, micro_batches: int) -> float:
    """(p - 1) / (m + p - 1): the 1F1B pipeline's idle share of a step (Narayanan 2021)."""
    return (pp - 1) / (micro_batches + pp - 1) if pp > 1 else 0.0


def layout_memory(w: Workload, tp: int, pp: int) -> Breakdown:
    """Per-GPU memory of workload ``w`` (one GPU of the dp-way run: ``w.gpus`` = dp) once tensor
    parallel ``tp`` and pipeline parallel ``pp`` split it (module docstring): the memory model
    (:func:`gpuinfra.sizing.memory.memory_per_gpu`) splits every phase's model states over
    tp x pp and its activations over tp before it takes the peak phase, so the peak may move
    (activations shrink by tp only). The allocator reserve stays its share of the allocated
    peak; the CUDA context is per process."""
    return memory_per_gpu(replace(w, tp=tp, pp=pp))


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def choose_layout(
    gpus_per_node: int,
    nodes: int,
    heads: int,
    layers: int,
    fits: Callable[[int, int, int], bool],
    tp: int | None = None,
    pp: int | None = None,
    micro_batch: int | None = None,
    global_batch: int | None = None,
) -> Layout:
    """The layout of a run on ``nodes`` x ``gpus_per_node`` GPUs.

    Args:
        heads, layers: the model's attention heads (tp must divide them) and layers (pp at most).
        fits: ``fits(tp, pp, micro_batch)`` -> the memory per GPU fits.
        tp, pp: given sizes; None: the smallest tp dividing the node's GPUs and the heads that
            fits, then (only if tp = GPUs per node still does not) the smallest pp dividing the
            nodes that fits. Nothing fitting leaves tp = pp = 1 (the caller reports no fit).
        micro_batch: given micro-batch; None: the largest of :data:`MICRO_BATCHES` that fits
            (and does not exceed the global batch's share per data-parallel rank), else 1.
        global_batch: sequences per step, rounded up to a multiple of micro-batch x dp (the
            layout's :attr:`Layout.global_batch` is what runs); None: one micro-batch per rank
            (no accumulation).

    Raises:
        SizingError: a given size that does not divide the GPUs, tp beyond one node or not
            dividing the heads, or pp beyond the layers.
    """
    gpus = gpus_per_node * nodes
    chosen: list[str] = []
    if tp is not None and (gpus_per_node % tp or heads % tp):
        raise SizingError(
            f"--tp {tp} must divide the GPUs per node ({gpus_per_node}) and the attention heads ({heads})"
        )
    if pp is not None and (pp > layers or (gpus // (tp or 1)) % pp):
        raise SizingError(f"--pp {pp} must be at most the layers ({layers}) and divide the GPUs / tp")
    mb0 = micro_batch or 1
    if tp is None and pp is None:
        tp, pp = 1, 1
        if not fits(1, 1, mb0):
            tp_options = [t for t in _divisors(gpus_per_node, gpus_per_node) if heads % t == 0]
            found = next((t for t in tp_options if fits(t, 1, mb0)), None)
            if found is not None:
                tp = found
            elif nodes > 1:
                top = tp_options[-1]
                found_pp = next((p for p in _divisors(nodes, layers) if p > 1 and fits(top, p, mb0)), None)
                if found_pp is not None:
                    tp, pp = top, found_pp
        chosen += ["tp", "pp"]
    elif tp is None:
        tp = next((t for t in _divisors(gpus_per_node, gpus_per_node) if heads % t == 0 and fits(t, pp or 1, mb0)), 1)
        chosen.append("tp")
    elif pp is None:
        pp = next((p for p in _divisors(nodes, layers) if fits(tp, p, mb0)), 1)
        chosen.append("pp")
    assert tp is not None and pp is not None
    dp = gpus // (tp * pp)
    if micro_batch is None:
        cap = max(1, -(-global_batch // dp)) if global_batch else MICRO_BATCHES[-1]
        fitting = [m for m in MICRO_BATCHES if m <= cap and fits(tp, pp, m)]
        micro_batch = fitting[-1] if fitting else 1
        chosen.append("micro_batch")
    # a global batch that micro-batch x dp does not divide is rounded up (Layout.global_batch)
    accumulation = 1 if global_batch is None else max(1, -(-global_batch // (micro_batch * dp)))
    return Layout(dp, tp, pp, micro_batch, accumulation, tuple(chosen))
