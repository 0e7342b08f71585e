"""Turn a model and a training method into a GPU request: per-GPU memory, the cheapest fitting
configurations from the catalog, and training time and cost from tokens.

Fit rule: memory per GPU x 1.10 <= GPU memory (at least 10% headroom for fragmentation and
allocator caches; sizing-formulas.md section 1.9). Time: FLOPs = 6*P*D, or 8*P*D with full
recompute (Kaplan et al. 2020; Chinchilla), at an assumed MFU per method
(``data/gpu_compute.yaml``); hours = FLOPs / (GPUs x peak x MFU x 3600).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

import yaml

from gpuinfra.catalog.store import Catalog
from gpuinfra.errors import NoOfferError, SizingError
from gpuinfra.money import usd_json
from gpuinfra.sizing.memory import GIB, METHODS, RECOMPUTE, STRATEGIES, Breakdown, memory_per_gpu
from gpuinfra.sizing.models import ModelShape, get_model, parse_count, shape_from_params

HEADROOM = 1.10
NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64)
COMPUTE = Path(__file__).parent / "data" / "gpu_compute.yaml"
DEFAULT_STRATEGY = {"pretrain": "fsdp", "full": "fsdp", "lora": "ddp", "qlora": "ddp", "inference": "ddp"}
DEFAULT_RECOMPUTE = {"pretrain": "selective", "full": "selective", "lora": "full", "qlora": "full", "inference": "none"}
PROFILE_FOR_METHOD = {"pretrain": "llm-pretrain", "full": "llm-finetune", "lora": "lora-finetune",
                      "qlora": "qlora-finetune", "inference": "inference"}


@lru_cache(maxsize=1)
def gpu_compute() -> dict:
    """Peak TFLOP/s, bf16 and FlashAttention support per GPU, and MFU per method."""
    return yaml.safe_load(COMPUTE.read_text())


@dataclass(frozen=True)
class SizingRequest:
    """Typed ``gpuinfra size`` input."""

    shape: ModelShape
    method: str = "full"
    precision: str = "bf16"
    strategy: str | None = None
    recompute: str | None = None
    seq: int = 2048
    batch: int = 1
    tokens: float | None = None

    def resolved(self) -> "SizingRequest":
        """Defaults filled in per method; validated.

        Raises:
            SizingError: an unknown method/strategy/recompute/precision or a bad number.
        """
        if self.method not in METHODS:
            raise SizingError(f"--method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.precision not in ("fp32", "bf16", "fp16", "int8", "int4"):
            raise SizingError(f"--precision must be one of fp32, bf16, fp16, int8, int4, got {self.precision!r}")
        if self.method in ("pretrain", "full") and self.precision in ("int8", "int4"):
            raise SizingError(f"--precision {self.precision} is for inference or the frozen base of lora/qlora")
        strategy = self.strategy or DEFAULT_STRATEGY[self.method]
        recompute = self.recompute or DEFAULT_RECOMPUTE[self.method]
        if strategy not in STRATEGIES:
            raise SizingError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if recompute not in RECOMPUTE:
            raise SizingError(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
        if not 1 <= self.seq <= 1_048_576 or not 1 <= self.batch <= 4096:
            raise SizingError("--seq must be 1..1048576 and --batch 1..4096")
        return SizingRequest(self.shape, self.method, self.precision, strategy, recompute, self.seq, self.batch, self.tokens)


def sizing_request(model: str | None = None, params: str | None = None, method: str = "full", seq: int = 2048,
                   batch: int = 1, precision: str = "bf16", strategy: str | None = None,
                   recompute: str | None = None, tokens: str | None = None) -> SizingRequest:
    """A validated :class:`SizingRequest` with the method's defaults filled in.

    Args:
        model: a known model name (``llama-3.1-8b``); exactly one of ``model`` / ``params``.
        params: a parameter count (``7B``, ``350M``) for a derived shape.
        method, precision, strategy, recompute: as in :class:`SizingRequest`.
        seq: sequence length in tokens; batch: micro-batch per GPU.
        tokens: training tokens (``2T``, ``500B``) for time and cost, or None.

    Raises:
        SizingError: neither or both of ``model`` / ``params``, an unknown model, or a bad value.
    """
    if (model is None) == (params is None):
        raise SizingError("give exactly one of --model NAME or --params COUNT (e.g. --params 7B)")
    shape = get_model(model) if model else shape_from_params(parse_count(params))
    return SizingRequest(shape, method, precision, strategy, recompute, seq, batch,
                         parse_count(tokens, "--tokens") if tokens else None).resolved()


@dataclass
class Candidate:
    """One GPU configuration with its memory and (when priced) its cheapest offer.

    Attributes:
        gpu, gpus_per_node, nodes: the configuration (``nodes`` x ``gpus_per_node`` GPUs).
        gpu_memory_gib: memory of one GPU.
        breakdown: memory per GPU by kind.
        price_per_hour_usd: on-demand USD per hour for all nodes of the cheapest offer; None
            when not priced.
        offer: where that offer is (``cloud``, ``region``, ``zone``, ``instance_type``).
        hours: training hours for the request's tokens (None without tokens).
    """

    gpu: str
    gpus_per_node: int
    nodes: int
    gpu_memory_gib: float
    breakdown: Breakdown
    price_per_hour_usd: Decimal | None = None
    offer: dict = field(default_factory=dict)
    hours: float | None = None

    @property
    def memory_per_gpu_gib(self) -> float:
        """Per-GPU need in GiB."""
        return self.breakdown.total / GIB

    @property
    def fits(self) -> bool:
        """Fits with 10% headroom."""
        return self.memory_per_gpu_gib * HEADROOM <= self.gpu_memory_gib

    @property
    def spec(self) -> str:
        """``--gpus`` string."""
        return f"{self.gpus_per_node}x{self.gpu}"

    @property
    def run_cost_usd(self) -> Decimal | None:
        """USD for the training run: price x hours when both are known."""
        if self.hours is None or self.price_per_hour_usd is None:
            return None
        return self.price_per_hour_usd * Decimal(str(self.hours))


def evaluate(req: SizingRequest, gpu: str, gpu_memory_gib: float, gpus_per_node: int, nodes: int) -> Candidate:
    """Memory of ``req`` on ``nodes`` x ``gpus_per_node`` GPUs of model ``gpu``."""
    facts = gpu_compute().get(gpu, {})
    flash = bool(facts.get("flash_attention", True))
    breakdown = memory_per_gpu(req.shape, req.method, req.precision, req.strategy, req.recompute, req.seq,
                               req.batch, gpus_per_node * nodes, gpus_per_node, flash)
    candidate = Candidate(gpu, gpus_per_node, nodes, gpu_memory_gib, breakdown)
    candidate.hours = training_hours(req, gpu, gpus_per_node * nodes)
    return candidate


def training_hours(req: SizingRequest, gpu: str, total_gpus: int) -> float | None:
    """Hours to train ``req.tokens`` tokens (None without tokens, for inference, or unknown peak)."""
    if not req.tokens or req.method == "inference":
        return None
    facts = gpu_compute().get(gpu)
    if not facts:
        return None
    factor = 8 if req.recompute == "full" else 6
    flops = factor * req.shape.params * req.tokens
    mfu = gpu_compute()["mfu"][req.method]
    return flops / (total_gpus * facts["tflops"] * 1e12 * mfu * 3600)


def _cheapest_offers(catalog: Catalog) -> dict[tuple[str, int], dict]:
    best: dict[tuple[str, int], dict] = {}
    for o in catalog.offers:
        price = o.on_demand_price_per_hour_usd
        if price is None or o.local_zone:
            continue
        key = (o.gpu, o.gpu_count)
        if key not in best or price < best[key]["price"]:
            best[key] = {"price": price, "cloud": o.cloud, "region": o.region, "zone": o.zone,
                         "instance_type": o.instance_type, "gpu_memory_gib": o.gpu_memory_gib}
    return best


def candidates(req: SizingRequest, catalog: Catalog) -> list[Candidate]:
    """Every fitting configuration the catalog can rent, cheapest (or cheapest run) first."""
    multi_node = req.method in ("pretrain", "full") and req.strategy != "ddp"
    out = []
    for (gpu, count), offer in _cheapest_offers(catalog).items():
        if gpu not in gpu_compute() or (req.precision == "bf16" and not gpu_compute()[gpu]["bf16"] and req.method != "inference"):
            continue
        for nodes in NODE_COUNTS if multi_node else (1,):
            c = evaluate(req, gpu, offer["gpu_memory_gib"], count, nodes)
            if c.fits:
                c.price_per_hour_usd = offer["price"] * nodes
                c.offer = {k: offer[k] for k in ("cloud", "region", "zone", "instance_type")}
                out.append(c)
                break  # more nodes of the same shape only cost more
    out.sort(key=lambda c: (c.run_cost_usd if c.run_cost_usd is not None else c.price_per_hour_usd,
                            c.nodes, c.gpus_per_node))
    return out


def candidate_json(c: Candidate) -> dict:
    """JSON view of a candidate (USD as :func:`gpuinfra.money.usd_json` strings)."""
    return {
        "gpus": c.spec, "nodes": c.nodes, "total_gpus": c.gpus_per_node * c.nodes,
        "memory_per_gpu_gib": round(c.memory_per_gpu_gib, 2), "gpu_memory_gib": c.gpu_memory_gib,
        "fits": c.fits, "margin_gib": round(c.gpu_memory_gib - c.memory_per_gpu_gib, 2),
        "price_per_hour_usd": usd_json(c.price_per_hour_usd),
        "training_hours": None if c.hours is None else round(c.hours, 2),
        "run_cost_usd": usd_json(c.run_cost_usd),
        **c.offer,
    }


def nothing_fits(req: SizingRequest) -> NoOfferError:
    """The error when :func:`candidates` is empty: no GPU the catalog rents holds ``req`` with
    10% headroom, on one node or (sharded methods) up to ``NODE_COUNTS[-1]`` nodes; exit 4 as for
    any request no offer fits, naming the settings that lower memory per GPU."""
    sharded = req.method in ("pretrain", "full") and req.strategy != "ddp"
    where = f"on up to {NODE_COUNTS[-1]} nodes" if sharded else "on one node"
    hints = {"pretrain": ["--method lora or qlora"], "full": ["--method lora or qlora"],
             "lora": ["--method qlora"]}.get(req.method, [])
    if req.method == "inference" and req.precision != "int4":
        hints.append("--precision int4")
    if req.recompute != "full" and req.method != "inference":
        hints.append("--recompute full")
    if req.batch > 1:
        hints.append("a smaller --batch")
    hints.append("a shorter --seq")
    return NoOfferError(f"no configuration in the catalog fits {req.shape.name} ({req.method}, {req.precision}) "
                        f"with 10% memory headroom {where}; try {', '.join(hints)}")
