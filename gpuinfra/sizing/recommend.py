"""Turn a model and a training method into a GPU request: per-GPU memory, the fitting
configurations from the catalog ranked by cost to finish (with ``--tokens``) or by $/h, and
training time with communication.

Fit rule: memory per GPU (reserved + CUDA context, :mod:`gpuinfra.sizing.memory`) x
(1 + headroom) <= the memory the device reports (``gpus.json`` ``device_memory_gib``);
headroom is :data:`DEFAULT_HEADROOM_FRACTION` unless the request names another. Offload also
needs its CPU memory per node within the instance's host memory.

Interconnect: sharded training over several nodes is only proposed on instance types with a
high-bandwidth GPU network -- AWS EFA (``EfaInfo``), GCP GPUDirect-TCPX/TCPXO or RDMA NIC
layouts -- unless the request allows slow interconnects (``--allow-slow-interconnect``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal

from gpuinfra.catalog.gpus import gpu_model
from gpuinfra.catalog.store import Catalog
from gpuinfra.errors import NoOfferError, SizingError
from gpuinfra.money import usd_json
from gpuinfra.offers import OfferScope
from gpuinfra.sizing import DEFAULT_HEADROOM_FRACTION
from gpuinfra.sizing.comm import links_for
from gpuinfra.sizing.layout import Layout, choose_layout, layout_memory
from gpuinfra.sizing.memory import (
    ALLOCATOR_RESERVE_FRACTION,
    ATTENTION,
    BYTES_PER_PARAM,
    COMPUTE_PRECISIONS,
    CUDA_CONTEXT_BYTES,
    DEFAULT_LORA_RANK,
    DEFAULT_OPTIMIZER,
    ENGINES,
    GIB,
    HF_KV_RESERVE_FRACTION,
    METHODS,
    OFFLOAD,
    OFFLOAD_STRATEGIES,
    OPTIMIZERS,
    RECOMPUTE,
    STRATEGIES,
    VLLM_GPU_MEMORY_UTILIZATION,
    Breakdown,
    Workload,
    lora_params,
    memory_per_gpu,
)
from gpuinfra.sizing.models import ModelShape, get_model, parse_count, shape_from_params
from gpuinfra.sizing.supply import OFFER_KEYS, cheapest_offers
from gpuinfra.sizing.throughput import HALF_BYTES, TrainingTime, gpu_compute, training_time

NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_STRATEGY = {"pretrain": "fsdp", "full": "fsdp", "lora": "ddp", "qlora": "ddp", "inference": "ddp"}
#: No recompute: what a Hugging Face Trainer or torchrun user runs (TrainingArguments
#: ``gradient_checkpointing`` defaults to False); where that does not fit a configuration, it is
#: sized with full recompute (gradient checkpointing) instead and the output says so
#: (:func:`evaluate`). ``--recompute`` overrides both.
DEFAULT_RECOMPUTE = dict.fromkeys(("pretrain", "full", "lora", "qlora", "inference"), "none")
PROFILE_FOR_METHOD = {
    "pretrain": "llm-pretrain",
    "full": "llm-finetune",
    "lora": "lora-finetune",
    "qlora": "qlora-finetune",
    "inference": "inference",
}
INFERENCE_PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4")
BASE_PRECISIONS = {"lora": ("bf16", "fp16", "fp32", "int8"), "qlora": ("nf4", "nf4-dq")}
MAX_SEQ, MAX_BATCH = 1_048_576, 4096
#: Sequence length when ``--seq`` is not given (capped at the model's context).
DEFAULT_SEQ = 2048
#: Where each default comes from (the ``assumptions`` of ``gpuinfra size``).
DEFAULT_SOURCES = {
    "seq": f"{DEFAULT_SEQ} tokens, capped at the model's context (max_position_embeddings)",
    "batch": "the largest micro-batch of 1, 2, 4 ... 64 that fits (at most the global batch's share "
    "per data-parallel GPU)",
    "inference_batch": "1 concurrent sequence",
    "precision": "bf16 (training: autocast over fp32 weights, HF Trainer bf16=True; inference: bf16 weights)",
    "strategy": "per method: fsdp for pretrain/full, ddp for lora/qlora/inference",
    "recompute": "the HF Trainer / torchrun default (TrainingArguments gradient_checkpointing=False); "
    "full recompute only where none does not fit",
    "attention": "sdpa where the GPU runs FlashAttention-2 (Ampere or newer), else eager",
    "optimizer": "adamw-fused: transformers TrainingArguments optim default adamw_torch_fused (torch >= 2.8)",
    "engine": "hf: transformers generate() with the dynamic KV cache",
    "base_precision": "lora: the compute precision; qlora: nf4-dq (QLoRA paper, arXiv:2305.14314)",
    "lora_rank": "16 (PEFT LoraConfig r), adapters on q, k, v, o of every layer, with dropout",
    "headroom": "10% of the need kept free (model error, allocator growth)",
    "tp": "chosen: the smallest tensor parallel size inside a node that fits (Narayanan et al. 2021, "
    "arXiv:2104.04473, Takeaway 1)",
    "pp": "chosen: 1, or the fewest pipeline stages across nodes that fit when tp = GPUs per node does not",
    "global_batch": "no --global-batch: one micro-batch per data-parallel GPU, no accumulation",
}
MAX_GLOBAL_BATCH = 1_048_576
#: Methods that take tensor / pipeline parallel layouts; the others keep tp = pp = 1.
LAYOUT_METHODS = ("pretrain", "full")


@dataclass(frozen=True)
class SizingRequest:
    """Typed ``gpuinfra size`` input.

    ``precision`` is the compute precision for training (bf16 | fp16 | fp32) and the weight
    storage for inference (fp32 | bf16 | fp16 | int8 | int4); ``base_precision`` is the storage
    of the frozen base for lora (bf16 | fp16 | fp32 | int8; default = ``precision``) and qlora
    (nf4 | nf4-dq; default nf4-dq, as in the QLoRA paper).

    ``batch`` is the micro-batch per GPU for training (None: the largest that fits,
    :func:`gpuinfra.sizing.layout.choose_layout`) and the concurrent sequences for inference
    (None: 1). ``global_batch`` is sequences per optimizer step (None: one micro-batch per
    data-parallel rank); ``tp`` / ``pp`` tensor / pipeline parallel sizes (None: chosen;
    pretrain and full only).

    ``recompute`` None (training) resolves to ``none`` with ``recompute_fallback`` set: a
    configuration where no recompute does not fit is sized with ``full`` (:func:`evaluate`).
    """

    shape: ModelShape
    method: str = "full"
    precision: str = "bf16"
    strategy: str | None = None
    recompute: str | None = None
    seq: int = 2048
    batch: int | None = None
    tokens: float | None = None
    base_precision: str | None = None
    offload: str = "none"
    attention: str | None = None
    headroom: float = DEFAULT_HEADROOM_FRACTION
    allow_slow_interconnect: bool = False
    optimizer: str = DEFAULT_OPTIMIZER
    engine: str = "hf"
    given: frozenset[str] = frozenset()
    global_batch: int | None = None
    tp: int | None = None
    pp: int | None = None
    recompute_fallback: bool = False

    def resolved(self) -> SizingRequest:
        """Defaults filled in per method; validated.

        Raises:
            SizingError: an unknown or inconsistent value (one line naming what is allowed).
        """
        m = self.method
        if m not in METHODS:
            raise SizingError(f"--method must be one of {', '.join(METHODS)}, got {m!r}")
        allowed = INFERENCE_PRECISIONS if m == "inference" else COMPUTE_PRECISIONS
        if self.precision not in allowed:
            hint = " (the frozen base's storage is --base-precision)" if m in BASE_PRECISIONS else ""
            raise SizingError(
                f"--precision for --method {m} must be one of {', '.join(allowed)}{hint}, got {self.precision!r}"
            )
        base = self.base_precision
        if m in BASE_PRECISIONS:
            base = base or ("nf4-dq" if m == "qlora" else self.precision)
            if base not in BASE_PRECISIONS[m]:
                raise SizingError(
                    f"--base-precision for --method {m} must be one of {', '.join(BASE_PRECISIONS[m])}, got {base!r}"
                )
        elif base is not None:
            raise SizingError("--base-precision applies to --method lora or qlora only")
        strategy = self.strategy or DEFAULT_STRATEGY[m]
        recompute = self.recompute or DEFAULT_RECOMPUTE[m]
        if strategy not in STRATEGIES:
            raise SizingError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if recompute not in RECOMPUTE:
            raise SizingError(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
        if self.attention is not None and self.attention not in ATTENTION:
            raise SizingError(f"--attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        _check_offload(self.offload, m, strategy)
        if self.optimizer not in OPTIMIZERS:
            raise SizingError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.engine not in ENGINES:
            raise SizingError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.engine != "hf" and m != "inference":
            raise SizingError(f"--engine {self.engine} applies to --method inference only")
        batch = self.batch if self.batch is not None or m != "inference" else 1
        if not 1 <= self.seq <= MAX_SEQ or (batch is not None and not 1 <= batch <= MAX_BATCH):
            raise SizingError(f"--seq must be 1..{MAX_SEQ} and --batch 1..{MAX_BATCH}, got {self.seq} and {batch}")
        context = self.shape.context
        if context and self.seq > context:
            raise SizingError(
                f"--seq {self.seq} is beyond the context of {self.shape.name}: {context} tokens "
                f"(max_position_embeddings in {self.shape.source})"
            )
        _check_layout(self, m)
        if not 0 <= self.headroom <= 1:
            raise SizingError(f"--headroom must be a fraction 0..1, got {self.headroom}")
        fallback = self.recompute_fallback or (self.recompute is None and m != "inference")
        return replace(
            self, strategy=strategy, recompute=recompute, base_precision=base, batch=batch, recompute_fallback=fallback
        )

    def assumptions(self, chosen: Candidate | None = None) -> list[dict]:
        """Every value the user did not give and the sizing assumed: ``[{"name", "value",
        "source"}]`` (defaults of this request and, with ``chosen`` -- the evaluated
        configuration -- the recompute, micro-batch, tp, pp and global batch it was sized with
        (:func:`evaluate`, :func:`gpuinfra.sizing.layout.choose_layout`), then the memory model's
        measured constants). The time model's assumptions are
        :func:`gpuinfra.sizing.throughput.time_assumptions`."""
        out = []
        layout = None if chosen is None else chosen.layout
        sources = dict(DEFAULT_SOURCES)
        if self.method == "inference":
            sources["batch"] = sources["inference_batch"]
        recompute = self.recompute
        if chosen is not None and chosen.recompute is not None:
            recompute = chosen.recompute
            sources["recompute"] = chosen.recompute_source or sources["recompute"]
        values = {
            "seq": self.seq,
            "batch": layout.micro_batch if layout is not None else self.batch,
            "precision": self.precision,
            "strategy": self.strategy,
            "recompute": recompute,
            "attention": self.attention or "sdpa",
            "headroom": self.headroom,
        }
        if self.method == "inference":
            values["engine"] = self.engine
        else:
            values["optimizer"] = self.optimizer
        if self.method in BASE_PRECISIONS:
            values["base_precision"] = self.base_precision
            values["lora_rank"] = DEFAULT_LORA_RANK
        if layout is not None:
            if self.method in LAYOUT_METHODS:
                values["tp"], values["pp"] = layout.tp, layout.pp
            values["global_batch"] = layout.global_batch
        for name, value in values.items():
            if name not in self.given:
                out.append({"name": name, "value": value, "source": sources[name]})
        out.append(
            {
                "name": "cuda_context_gib",
                "value": round(CUDA_CONTEXT_BYTES / GIB, 2),
                "source": "largest measured on an H100 (memory.CUDA_CONTEXT_BYTES: benchmarks/results/*-h100-*)",
            }
        )
        if self.method == "inference" and self.engine == "vllm":
            out.append(
                {
                    "name": "gpu_memory_utilization",
                    "value": VLLM_GPU_MEMORY_UTILIZATION,
                    "source": "vLLM engine argument default (docs.vllm.ai engine_args)",
                }
            )
        elif self.method == "inference":
            out.append(
                {
                    "name": "hf_kv_reserve_fraction",
                    "value": HF_KV_RESERVE_FRACTION,
                    "source": "allocator reserve of HF generate() per KV-cache byte, measured on an H100 "
                    "(memory.HF_KV_RESERVE_FRACTION)",
                }
            )
        else:
            out.append(
                {
                    "name": "allocator_reserve_fraction",
                    "value": ALLOCATOR_RESERVE_FRACTION,
                    "source": "mean reserved/allocated excess of 19 H100 training rows (memory.ALLOCATOR_RESERVE_FRACTION)",
                }
            )
        return out

    @property
    def storage(self) -> str:
        """Weight storage of the workload (:class:`gpuinfra.sizing.memory.Workload`)."""
        if self.method == "inference":
            return self.precision
        return self.base_precision or "fp32"

    @property
    def trained_params(self) -> float:
        """Parameters whose gradients and optimizer states exist (adapters for LoRA/QLoRA)."""
        if self.method in ("lora", "qlora"):
            return lora_params(self.shape)
        return 0.0 if self.method == "inference" else self.shape.params

    @property
    def sharded(self) -> bool:
        """Full training sharded over all GPUs of all nodes (ZeRO / FSDP)."""
        return self.method in ("pretrain", "full") and self.strategy != "ddp"


def _check_layout(req: SizingRequest, method: str) -> None:
    if req.global_batch is not None and not 1 <= req.global_batch <= MAX_GLOBAL_BATCH:
        raise SizingError(f"--global-batch must be 1..{MAX_GLOBAL_BATCH} sequences, got {req.global_batch}")
    for flag, value in (("--tp", req.tp), ("--pp", req.pp)):
        if value is not None and value < 1:
            raise SizingError(f"{flag} must be >= 1, got {value}")
    if method not in LAYOUT_METHODS and ((req.tp or 1) > 1 or (req.pp or 1) > 1):
        raise SizingError(
            f"--tp / --pp apply to --method {' or '.join(LAYOUT_METHODS)} (Megatron-style tensor and "
            f"pipeline parallel); --method {method} runs one model copy per GPU"
        )
    heads, layers = req.shape.heads, req.shape.layers
    if req.tp is not None and heads % req.tp:
        # Megatron-LM splits the attention heads over the tensor-parallel ranks (Narayanan et al.
        # 2021, arXiv:2104.04473 section 2.3) and the layers over the pipeline stages (section 2.2)
        raise SizingError(f"--tp {req.tp} must divide the attention heads ({heads}) of {req.shape.name}")
    if req.pp is not None and req.pp > layers:
        raise SizingError(
            f"--pp {req.pp} is more than the layers ({layers}) of {req.shape.name}: one per stage at least"
        )
    if method == "inference" and req.global_batch is not None:
        raise SizingError(
            "--global-batch applies to training methods; for inference --batch is the concurrent sequences"
        )


def _check_offload(offload: str, method: str, strategy: str) -> None:
    if offload not in OFFLOAD:
        raise SizingError(f"--offload must be one of {', '.join(OFFLOAD)}, got {offload!r}")
    if offload == "none":
        return
    if method in ("lora", "qlora"):
        if offload != "optimizer":
            raise SizingError(
                f"--offload {offload} has no meaning for --method {method}: the frozen base stays on the GPU; "
                "--offload optimizer moves the adapters' optimizer to the CPU (DeepSpeed ZeRO-Offload)"
            )
        return
    if method not in ("pretrain", "full"):
        raise SizingError(
            f"--offload {offload} has no meaning for --method {method}: CPU offload is for "
            "--method full or pretrain with --strategy zero1/zero2/zero3 (optimizer) or zero3/fsdp (params), "
            "or --method lora/qlora (optimizer)"
        )
    if strategy not in OFFLOAD_STRATEGIES[offload]:
        raise SizingError(
            f"--offload {offload} needs --strategy {' or '.join(OFFLOAD_STRATEGIES[offload])} "
            f"(DeepSpeed ZeRO offload_optimizer / offload_param; FSDP CPUOffload offloads parameters "
            f"and optimizer together), got {strategy}"
        )


def sizing_request(
    model: str | None = None,
    params: str | None = None,
    method: str = "full",
    seq: int | None = None,
    batch: int | None = None,
    precision: str = "bf16",
    strategy: str | None = None,
    recompute: str | None = None,
    tokens: str | None = None,
    base_precision: str | None = None,
    offload: str = "none",
    attention: str | None = None,
    headroom: float = DEFAULT_HEADROOM_FRACTION,
    allow_slow_interconnect: bool = False,
    optimizer: str | None = None,
    engine: str | None = None,
    samples: str | None = None,
    epochs: float | None = None,
    given: frozenset[str] = frozenset(),
    global_batch: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
) -> SizingRequest:
    """A validated :class:`SizingRequest` with the method's defaults filled in.

    Args:
        model: a known model name (``llama-3.1-8b``); exactly one of ``model`` / ``params``.
        params: a parameter count (``7B``, ``350M``; at most 1000T) for a derived shape.
        tokens: training tokens (``2T``, ``500B``) for time and cost, or None.
        samples, epochs: instead of ``tokens``: ``samples`` sequences (``50K``) of ``seq`` tokens,
            ``epochs`` times (default 1): tokens = samples x epochs x seq.
        seq: None = :data:`DEFAULT_SEQ` capped at the model's context.
        given: names of the values the user gave (the rest are listed as assumptions).
        Others: as in :class:`SizingRequest`.

    Raises:
        SizingError: neither or both of ``model`` / ``params``, an unknown model, a bad value,
            ``--tokens`` with ``--samples``, or ``--epochs`` without ``--samples``.
    """
    if (model is None) == (params is None):
        raise SizingError("give exactly one of --model NAME or --params COUNT (e.g. --params 7B)")
    shape = get_model(model) if model else shape_from_params(parse_count(params or ""))  # exactly one is given
    if seq is None:
        seq = min(DEFAULT_SEQ, shape.context) if shape.context else DEFAULT_SEQ
    count = parse_count(tokens, "--tokens") if tokens else None
    if samples is not None:
        if tokens:
            raise SizingError("give --tokens or --samples (with --epochs and --seq), not both")
        if epochs is not None and not 0 < epochs <= 1000:
            raise SizingError(f"--epochs must be more than 0 and at most 1000, got {epochs}")
        count = parse_count(samples, "--samples") * (epochs or 1) * seq
    elif epochs is not None:
        raise SizingError("--epochs needs --samples (the number of training sequences)")
    return SizingRequest(
        shape,
        method,
        precision,
        strategy,
        recompute,
        seq,
        batch,
        count,
        base_precision,
        offload,
        attention,
        headroom,
        allow_slow_interconnect,
        optimizer or DEFAULT_OPTIMIZER,
        engine or "hf",
        given,
        global_batch,
        tp,
        pp,
    ).resolved()


@dataclass
class Candidate:
    """One GPU configuration with its memory, time and (when priced) its cheapest offer.

    Attributes:
        gpu, gpus_per_node, nodes: the configuration (``nodes`` x ``gpus_per_node`` GPUs).
        gpu_memory_gib: memory the device reports (fit target).
        breakdown: memory per GPU by kind.
        headroom: headroom fraction of the fit rule.
        price_per_hour_usd: USD per hour for all nodes in ``offer["market"]``; None when not priced.
        offer: where that offer is and how it is bought (:data:`gpuinfra.sizing.supply.OFFER_KEYS`: ``cloud``,
            ``region``, ``zone``, ``instance_type``, ``market``).
        time: training time (None without tokens).
        host_memory_gib: host RAM of one node (CPU offload check); None when unknown.
        network_bandwidth_gbps: bandwidth of the node's NICs for inter-node GPU traffic, Gbit/s
            (catalog facts ``network_bandwidth_gbps``); None when unknown.
        layout: the parallel layout of a training method (None for inference).
        recompute: the recompute a training method was sized with (None for inference);
            ``recompute_source`` says why when it is not what the request named (no recompute
            did not fit: full).
        usable_fraction: the share of ``gpu_memory_gib`` the process may take (vLLM's
            ``gpu_memory_utilization``; 1 otherwise).
        storage_bandwidth_gbps: bandwidth of the node's host NIC(s), the object-storage path,
            Gbit/s (catalog facts ``host_nic_bandwidth_gbps``: AWS the primary card, GCP the
            host gVNICs); None when unknown.
    """

    gpu: str
    gpus_per_node: int
    nodes: int
    gpu_memory_gib: float
    breakdown: Breakdown
    headroom: float = DEFAULT_HEADROOM_FRACTION
    price_per_hour_usd: Decimal | None = None
    offer: dict = field(default_factory=dict)
    time: TrainingTime | None = None
    host_memory_gib: float | None = None
    network_bandwidth_gbps: float | None = None
    storage_bandwidth_gbps: float | None = None
    usable_fraction: float = 1.0
    layout: Layout | None = None
    recompute: str | None = None
    recompute_source: str | None = None

    @property
    def memory_per_gpu_gib(self) -> float:
        """Per-GPU need in GiB (as nvidia-smi would show it)."""
        return self.breakdown.total / GIB

    @property
    def cpu_memory_gib(self) -> float:
        """CPU memory per node for offload, GiB."""
        return self.breakdown.cpu_per_node / GIB

    @property
    def fits_gpu_memory(self) -> bool:
        """Fits with the headroom in the usable share of the device (vLLM: its
        ``gpu_memory_utilization``, no headroom: the pool is preallocated)."""
        return self.memory_per_gpu_gib * (1 + self.headroom) <= self.gpu_memory_gib * self.usable_fraction

    @property
    def fits(self) -> bool:
        """:attr:`fits_gpu_memory` and, with offload, the CPU memory in the host memory."""
        if not self.fits_gpu_memory:
            return False
        return not (
            self.cpu_memory_gib and self.host_memory_gib is not None and self.cpu_memory_gib > self.host_memory_gib
        )

    @property
    def spec(self) -> str:
        """``--gpus`` string."""
        return f"{self.gpus_per_node}x{self.gpu}"

    @property
    def hours(self) -> float | None:
        """Training hours with communication (None without tokens or bandwidth)."""
        return None if self.time is None else self.time.hours

    @property
    def run_cost_usd(self) -> Decimal | None:
        """USD for the training run: price x hours when both are known."""
        if self.hours is None or self.price_per_hour_usd is None:
            return None
        return self.price_per_hour_usd * Decimal(str(self.hours))


def workload(
    req: SizingRequest, gpu: str, gpus_per_node: int, nodes: int, batch: int | None = None, dp: int | None = None
) -> Workload:
    """The :class:`Workload` of ``req`` on a configuration (eager attention on GPUs without
    FlashAttention); ``batch`` overrides the request's micro-batch, ``dp`` the GPUs that shard
    model states (all GPUs when no tensor / pipeline parallel splits them)."""
    flash = bool(gpu_compute().get(gpu, {}).get("flash_attention", True))
    attention = req.attention or ("sdpa" if flash else "eager")
    compute = req.precision if req.method != "inference" else ("fp32" if req.precision == "fp32" else "bf16")
    assert req.strategy is not None and req.recompute is not None  # set by SizingRequest.resolved()
    dp = dp or gpus_per_node * nodes
    # one data-parallel rank shards nothing: FSDP / ZeRO there hold what DDP holds (the single-GPU stack)
    single = dp == 1 and req.offload == "none"
    return Workload(
        req.shape,
        req.method,
        compute,
        req.storage,
        "ddp" if single else req.strategy,
        req.recompute,
        req.seq,
        batch or req.batch or 1,
        dp,
        gpus_per_node,
        attention,
        req.offload,
        optimizer=req.optimizer,
        engine=req.engine,
    )


def evaluate(
    req: SizingRequest,
    gpu: str,
    gpu_memory_gib: float,
    gpus_per_node: int,
    nodes: int,
    network_bandwidth_gbps: float | None = None,
) -> Candidate:
    """Memory and time of ``req`` on ``nodes`` x ``gpus_per_node`` GPUs of model ``gpu``: for
    training, in the layout :func:`gpuinfra.sizing.layout.choose_layout` picks (the given or
    fitting tp / pp, the given or largest fitting micro-batch), with no recompute unless the
    request names one; where no recompute does not fit in ``gpu_memory_gib`` (with the
    headroom), with full recompute (gradient checkpointing), saying why in
    :attr:`Candidate.recompute_source`.

    Raises:
        SizingError: a given ``--tp`` / ``--pp`` this configuration cannot take.
    """
    if req.method == "inference":
        vllm = req.engine == "vllm"
        return Candidate(
            gpu,
            gpus_per_node,
            nodes,
            gpu_memory_gib,
            memory_per_gpu(workload(req, gpu, gpus_per_node, nodes)),
            0.0 if vllm else req.headroom,  # vLLM's pool is preallocated: nothing grows past it
            network_bandwidth_gbps=network_bandwidth_gbps,
            usable_fraction=VLLM_GPU_MEMORY_UTILIZATION if vllm else 1.0,
        )
    c = _evaluate_training(req, gpu, gpu_memory_gib, gpus_per_node, nodes, network_bandwidth_gbps)
    if req.recompute_fallback and req.recompute == "none" and not c.fits_gpu_memory:
        need = c.memory_per_gpu_gib * (1 + c.headroom)
        c = _evaluate_training(
            replace(req, recompute="full"), gpu, gpu_memory_gib, gpus_per_node, nodes, network_bandwidth_gbps
        )
        c.recompute_source = (
            f"none does not fit in {gpu_memory_gib:.2f} GiB ({need:.2f} GiB with {c.headroom:.0%} headroom): "
            "full recompute (gradient checkpointing, HF gradient_checkpointing=True) is needed"
        )
    return c


def _evaluate_training(
    req: SizingRequest,
    gpu: str,
    gpu_memory_gib: float,
    gpus_per_node: int,
    nodes: int,
    network_bandwidth_gbps: float | None,
) -> Candidate:
    gpus = gpus_per_node * nodes

    def memory(tp: int, pp: int, micro_batch: int) -> Breakdown:
        dp = gpus // (tp * pp)
        return layout_memory(workload(req, gpu, gpus_per_node, nodes, micro_batch, dp), tp, pp)

    def fits(tp: int, pp: int, micro_batch: int) -> bool:
        return memory(tp, pp, micro_batch).total * (1 + req.headroom) <= gpu_memory_gib * GIB

    layered = req.method in LAYOUT_METHODS
    layout = choose_layout(
        gpus_per_node,
        nodes,
        req.shape.heads,
        req.shape.layers,
        fits,
        req.tp if layered else 1,
        req.pp if layered else 1,
        req.batch,
        req.global_batch,
    )
    breakdown = memory(layout.tp, layout.pp, layout.micro_batch)
    time = None
    if req.tokens:
        assert req.strategy is not None and req.recompute is not None  # set by SizingRequest.resolved()
        frozen = req.method in ("lora", "qlora")
        time = training_time(
            req.shape,
            req.method,
            req.recompute,
            req.strategy,
            gpu,
            layout,
            req.seq,
            req.tokens,
            links_for(gpu, gpus_per_node, network_bandwidth_gbps),
            nodes,
            req.trained_params,
            BYTES_PER_PARAM[req.storage] if frozen else HALF_BYTES,
            req.trained_params if frozen else 0.0,
        )
    return Candidate(
        gpu,
        gpus_per_node,
        nodes,
        gpu_memory_gib,
        breakdown,
        req.headroom,
        time=time,
        network_bandwidth_gbps=network_bandwidth_gbps,
        layout=layout,
        recompute=req.recompute,
    )


def priced(c: Candidate, offer: dict, nodes: int) -> Candidate:
    """``c`` with ``offer``'s (:func:`gpuinfra.sizing.supply.cheapest_offers`) host facts, and its
    price for ``nodes`` nodes."""
    c.host_memory_gib = offer["host_memory_gib"]
    c.storage_bandwidth_gbps = offer["storage_bandwidth_gbps"]
    c.price_per_hour_usd = offer["price"] * nodes
    c.offer = {k: offer[k] for k in OFFER_KEYS}
    return c


def device_memory_gib(gpu: str) -> float:
    """GiB of memory the device reports for GPU model ``gpu`` (``gpus.json``
    ``device_memory_gib``, :attr:`gpuinfra.catalog.gpus.GpuModel.device_reported_gib`)."""
    return gpu_model(gpu).device_reported_gib


def candidates(req: SizingRequest, catalog: Catalog, scope: OfferScope = OfferScope()) -> list[Candidate]:
    """Every fitting configuration the catalog can rent in ``scope``: one node of every (GPU,
    count) offer, and for sharded training the fewest nodes (up to the type's node limit) of a
    high-bandwidth type (any type with ``allow_slow_interconnect``). Ranked by cost to finish
    with tokens, by $/h without (in the scope's markets, :func:`cheapest_offers`)."""
    out = []
    tables: list[tuple[dict, tuple[int, ...]]] = [(cheapest_offers(catalog, False, scope), (1,))]
    if req.sharded:
        tables.append((cheapest_offers(catalog, not req.allow_slow_interconnect, scope), NODE_COUNTS[1:]))
    seen: set[tuple[str, int]] = set()
    for offers, node_counts in tables:
        for (gpu, count), offer in offers.items():
            facts = gpu_compute().get(gpu)
            if (gpu, count) in seen or facts is None:
                continue
            if req.method != "inference" and req.precision == "bf16" and not facts["bf16"]:
                continue
            for nodes in (n for n in node_counts if n <= offer["max_nodes"]):
                try:
                    evaluated = evaluate(
                        req, gpu, device_memory_gib(gpu), count, nodes, offer["network_bandwidth_gbps"]
                    )
                except SizingError:
                    continue  # a given --tp / --pp this shape cannot take
                c = priced(evaluated, offer, nodes)
                if c.fits:
                    out.append(c)
                    seen.add((gpu, count))
                    break  # more nodes of the same shape only cost more
    return sorted(out, key=lambda c: ranking_key(req, c))


def ranking_key(req: SizingRequest, c: Candidate) -> tuple:
    """Cost to finish (unknown last) with tokens; $/h without."""
    if req.tokens and req.method != "inference":
        cost = c.run_cost_usd
        return (cost is None, cost if cost is not None else Decimal(0), c.price_per_hour_usd, c.nodes)
    return (False, c.price_per_hour_usd, c.nodes, c.gpus_per_node)


def candidate_json(c: Candidate) -> dict:
    """JSON view of a candidate (USD as :func:`gpuinfra.money.usd_json` strings)."""
    t = c.time
    return {
        "gpus": c.spec,
        "nodes": c.nodes,
        "total_gpus": c.gpus_per_node * c.nodes,
        "memory_per_gpu_gib": round(c.memory_per_gpu_gib, 2),
        "gpu_memory_gib": c.gpu_memory_gib,
        "cpu_memory_per_node_gib": round(c.cpu_memory_gib, 2),
        "fits": c.fits,
        "margin_gib": round(c.gpu_memory_gib * c.usable_fraction - c.memory_per_gpu_gib * (1 + c.headroom), 2),
        "price_per_hour_usd": usd_json(c.price_per_hour_usd),
        "training_hours": None if c.hours is None else round(c.hours, 2),
        "compute_hours": None if t is None else round(t.compute_hours, 2),
        "communication_hours": None if t is None or t.communication_hours is None else round(t.communication_hours, 2),
        "bubble_hours": None if t is None or t.bubble_hours is None else round(t.bubble_hours, 2),
        "mfu": None if t is None or t.mfu is None else round(t.mfu, 3),
        "mfu_source": None if t is None else t.utilization_source,
        "recompute": c.recompute,
        "layout": None if c.layout is None else c.layout.to_json(),
        "time": None if t is None else t.to_json(),
        "network_bandwidth_gbps": c.network_bandwidth_gbps,
        "run_cost_usd": usd_json(c.run_cost_usd),
        **c.offer,
    }


def nothing_fits(
    req: SizingRequest, scope: OfferScope = OfferScope(), catalog: Catalog | None = None, command: str = "size"
) -> NoOfferError:
    """The error when :func:`candidates` is empty (exit 4), naming the scope searched and the
    settings that lower memory per GPU; with ``catalog``, also ``--spot`` or a wider place when
    something fits there. ``command`` (``size`` | ``new``) is the command that speaks: ``new``
    has no ``--strategy`` / ``--recompute`` / ``--seq`` / ``--batch`` / ``--precision``, so
    those are offered as a ``gpuinfra size`` run."""
    where = f"on up to {NODE_COUNTS[-1]} nodes" if req.sharded else "on one node"
    markets = " or ".join(scope.markets)
    hints = {
        "pretrain": ["--method lora or qlora"],
        "full": ["--method lora or qlora"],
        "lora": ["--method qlora"],
    }.get(req.method, [])
    tuning = []
    if req.method in LAYOUT_METHODS and (req.tp is not None or req.pp is not None):
        tuning.append("without --tp / --pp (chosen to fit when not given)")
    if req.method in ("lora", "qlora") and req.strategy == "ddp":
        tuning.append("--strategy fsdp (shards the frozen base)")
    if req.method == "inference" and req.precision != "int4":
        tuning.append("--precision int4")
    if req.recompute != "full" and req.method != "inference" and not req.recompute_fallback:
        tuning.append("--recompute full")  # without --recompute, full was tried where none did not fit
    if (req.batch or 1) > 1:
        tuning.append("a smaller --batch")
    tuning.append("a shorter --seq")
    if catalog is not None:
        narrowed = [
            flag
            for flag, value in (
                ("--cloud", scope.cloud),
                ("--region", scope.region),
                ("--zone", scope.zone),
                ("--instance-type", scope.instance_type),
            )
            if value
        ]
        wider = replace(scope, cloud=None, region=None, zone=None, instance_type=None)
        if narrowed and candidates(req, catalog, wider):
            hints.append(f"without {'/'.join(narrowed)}")
        if "spot" not in scope.markets and candidates(req, catalog, replace(scope, markets=(*scope.markets, "spot"))):
            hints.append("--spot (some GPU types are sold only as spot)")
    if command == "new":
        hints.append(f"`gpuinfra size` with {' or '.join(tuning)}")
    else:
        hints = hints[:1] + tuning + hints[1:]
    return NoOfferError(
        f"no configuration in the catalog{scope.describe()} sold {markets} fits {req.shape.name} "
        f"({req.method}, {req.precision}) with {req.headroom:.0%} memory headroom {where}; "
        f"try {', '.join(hints)}"
    )
