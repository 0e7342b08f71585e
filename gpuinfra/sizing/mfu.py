"""FLOPs per token of what actually runs, and the utilization a GPU reaches on them, from cited runs.

FLOPs (per token, one sequence of ``seq`` tokens):

* Forward = 2 x the parameters that take part in a matmul (the blocks' linears and the LM head;
  an embedding lookup does no matmul) + attention scores and their weighted sum,
  4 x L x h x seq (Narayanan et al. 2021, arXiv:2104.04473 Eq. 3: 24bslh^2 (1 + s/6h); the
  PaLM paper's 6N + 12LHQT, arXiv:2204.02311 Appendix B, is the same for forward + backward).
* Training: backward = 2 x forward (gradients of activations and of weights), so 3 x forward
  (Kaplan et al. 2020, arXiv:2001.08361 section 2.1: 6N per token).
* LoRA / QLoRA: the frozen base runs its forward and, in the backward, only the gradients of
  its activations (no weight-gradient GEMM): forward 2N + backward 2N, about 4 x params x
  tokens rather than 6; attention has no weights, so its backward is 2 x its forward; the
  adapters (r x (d_in + d_out) each, :func:`gpuinfra.sizing.memory.lora_params`) train fully,
  6 x adapter params.
* Full recompute runs the forward once more (hardware FLOPs; Narayanan 2021 section 3.5:
  the factor 4 instead of 3 in Eq. 3). Model FLOPs (MFU) never count it (Korthikanti et al.
  2022, arXiv:2205.05198 section 6; MosaicML llm-foundry scripts/train/benchmarking/README.md).

Utilization (``data/mfu.yaml``): the hardware FLOPs a GPU sustains, as a fraction of its dense
16-bit peak (``data/gpu_compute.yaml``), by software stack:

* ``optimized`` (``--method pretrain``: Megatron-LM, torchtitan, LLM Foundry class stacks),
  per GPU generation, each value one published run named in the file.
* ``hf`` (fine-tuning with the HF Trainer / PEFT, one process per GPU), by model size: the
  median of the measured H100 rows of each model (the measurement files named in the file),
  interpolated in log(parameters) and held at the ends; other generations scale it by their
  ``optimized`` value relative to Hopper's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from gpuinfra.sizing.models import ModelShape

DATA = Path(__file__).parent / "data" / "mfu.yaml"


@lru_cache(maxsize=1)
def mfu_table() -> dict:
    """The parsed ``data/mfu.yaml``."""
    return yaml.safe_load(DATA.read_text())


def matmul_params(shape: ModelShape) -> float:
    """Parameters used in a matmul per token: blocks and LM head (embedding lookups excluded;
    a tied or classifier head still multiplies by ``vocab x hidden``)."""
    head = shape.vocab * shape.hidden if shape.head == "lm" else 0
    return max(0.0, shape.params - shape.embedding_params - shape.head_params) + head


@dataclass(frozen=True)
class TokenFlops:
    """FLOPs per token of one training step.

    Attributes:
        model: what the method needs (MFU numerator): forward + backward.
        hardware: what runs: ``model`` plus the recomputed forward under full recompute.
    """

    model: float
    hardware: float


def token_flops(shape: ModelShape, seq: int, method: str, recompute: str, adapter_params: float = 0.0) -> TokenFlops:
    """FLOPs per trained token (module docstring).

    Args:
        shape: the model.
        seq: tokens per sequence (attention cost grows with it).
        method: pretrain | full | lora | qlora.
        recompute: none | selective | full (selective recomputes attention scores only).
        adapter_params: LoRA adapter parameters (lora / qlora).
    """
    dense = 2 * matmul_params(shape)
    attention = 4 * shape.layers * shape.hidden * seq
    forward = dense + attention
    frozen = method in ("lora", "qlora")
    model = forward + (dense + 2 * attention) + 6 * adapter_params if frozen else 3 * forward
    extra = forward if recompute == "full" else (attention if recompute == "selective" else 0.0)
    return TokenFlops(model, model + extra)


@dataclass(frozen=True)
class Utilization:
    """Hardware FLOPs utilization used for compute time, with where it comes from."""

    value: float
    source: str


def generation(gpu: str) -> str:
    """GPU generation (``hopper``, ``ampere`` ...) of a catalog GPU model; ``unknown`` if absent."""
    return str(mfu_table()["generations"].get(gpu, "unknown"))


def _optimized(gen: str) -> tuple[float, str]:
    table = mfu_table()["optimized"]
    if gen in table:
        entry = table[gen]
        return float(entry["value"]), str(entry["source"])
    entry = table[table["fallback"]]
    return float(entry["value"]), f"no published run on {gen} GPUs; {table['fallback']} value: {entry['source']}"


def _hf_anchor_points() -> list[tuple[float, float, str]]:
    out = []
    for anchor in mfu_table()["hf"]["anchors"]:
        values = [float(r["utilization"]) for r in anchor["rows"]]
        out.append((float(anchor["params"]), statistics.median(values), str(anchor["model"])))
    return sorted(out)


def hf_utilization_h100(params: float) -> float:
    """Measured HF/PEFT utilization on an H100 at ``params`` parameters (module docstring)."""
    points = _hf_anchor_points()
    if params <= points[0][0]:
        return points[0][1]
    if params >= points[-1][0]:
        return points[-1][1]
    for (p0, u0, _), (p1, u1, _) in zip(points, points[1:], strict=False):
        if p0 <= params <= p1:
            x = (math.log(params) - math.log(p0)) / (math.log(p1) - math.log(p0))
            return u0 + x * (u1 - u0)
    return points[-1][1]  # unreachable: the anchors are sorted and cover params


def utilization(gpu: str, method: str, params: float) -> Utilization:
    """Hardware FLOPs utilization of ``method`` on ``gpu`` for a model of ``params`` parameters.

    ``pretrain`` takes the ``optimized`` value of the GPU's generation; fine-tuning methods the
    ``hf`` size curve (scaled from Hopper to the GPU's generation); ``qlora`` times
    ``hf.qlora_factor`` (NF4 dequantization before every matmul).
    """
    gen = generation(gpu)
    value, source = _optimized(gen)
    if method == "pretrain":
        return Utilization(value, source)
    hf = mfu_table()["hf"]
    hopper, _ = _optimized("hopper")
    u = hf_utilization_h100(params) * value / hopper
    if gen == "hopper":
        note = hf["source"]
    elif value == hopper:
        note = f"{hf['source']}; no published run on {gen} GPUs: the H100 curve as it is"
    else:
        note = f"{hf['source']}; x {value / hopper:.3f} for {gen} ({source})"
    if method == "qlora":
        factor = mfu_table()["hf"]["qlora_factor"]
        u *= float(factor["value"])
        note += f"; x {factor['value']} for QLoRA ({factor['source']})"
    return Utilization(round(u, 4), note)
