"""``gpuinfra size``: memory per GPU for a model and method, and the GPUs that fit
(the document is :func:`gpuinfra.sizing.report.size_document`)."""

from __future__ import annotations

from decimal import Decimal

import typer

from gpuinfra.sizing import DEFAULT_HEADROOM_FRACTION
from gpuinfra.sizing.checkpoint import DEFAULT_INTERRUPTIONS_PER_NODE_HOUR
from gpuinfra.sizing.memory import (
    ALLOCATOR_RESERVE_FRACTION,
    CUDA_CONTEXT_BYTES,
    GIB,
    HF_KV_RESERVE_FRACTION,
    VLLM_GPU_MEMORY_UTILIZATION,
)


def size(
    model: str | None = typer.Option(
        None, "--model", help="Model name (llama-3.1-8b, mistral-7b ...).", show_default=False
    ),
    params: str | None = typer.Option(
        None, "--params", help="Parameter count instead of a model: 7B, 1.3B, 350M.", show_default=False
    ),
    method: str = typer.Option("full", "--method", help="pretrain | full | lora | qlora | inference."),
    seq: int | None = typer.Option(
        None,
        "--seq",
        help="Sequence length in tokens (inference: prompt + output); at most the model's context. "
        "Default: 2048, capped at the model's context.",
        show_default=False,
    ),
    batch: int | None = typer.Option(
        None,
        "--batch",
        "--micro-batch",
        help="Micro-batch per GPU (default: the largest that fits); inference: concurrent sequences (default 1).",
        show_default=False,
    ),
    global_batch: int | None = typer.Option(
        None,
        "--global-batch",
        help="Sequences per optimizer step (gradient accumulation = global / (micro-batch x data-parallel GPUs)); "
        "default: one micro-batch per data-parallel GPU.",
        show_default=False,
    ),
    tp: int | None = typer.Option(
        None,
        "--tp",
        help="Tensor parallel size, inside a node (pretrain/full; default: the smallest that fits).",
        show_default=False,
    ),
    pp: int | None = typer.Option(
        None,
        "--pp",
        help="Pipeline parallel size, across nodes (pretrain/full; default: 1 unless the model fits no other way).",
        show_default=False,
    ),
    precision: str | None = typer.Option(
        None,
        "--precision",
        help="Training: compute precision bf16 | fp16 | fp32. Inference: weights fp32 | bf16 | fp16 | int8 | int4. "
        "Default: bf16.",
        show_default=False,
    ),
    optimizer: str | None = typer.Option(
        None,
        "--optimizer",
        help="adamw-fused | adamw-foreach | adamw-8bit | adafactor | sgd. Default: adamw-fused "
        "(HF Trainer's adamw_torch_fused).",
        show_default=False,
    ),
    engine: str | None = typer.Option(
        None,
        "--engine",
        help=f"Inference engine: hf (generate(), growing KV cache) | vllm (preallocates {VLLM_GPU_MEMORY_UTILIZATION} "
        "of the device: gpu_memory_utilization). Default: hf.",
        show_default=False,
    ),
    base_precision: str | None = typer.Option(
        None,
        "--base-precision",
        help="Frozen base storage: lora bf16 | fp16 | fp32 | int8; qlora nf4 | nf4-dq.",
        show_default=False,
    ),
    strategy: str | None = typer.Option(
        None,
        "--strategy",
        help="ddp | fsdp | zero1 | zero2 | zero3. Default: fsdp for pretrain/full, ddp otherwise (one GPU: ddp).",
        show_default=False,
    ),
    recompute: str | None = typer.Option(
        None,
        "--recompute",
        help="none | selective | full. Default: none (the HF Trainer / torchrun default); full (gradient "
        "checkpointing) where none does not fit, printed with the reason.",
        show_default=False,
    ),
    offload: str = typer.Option(
        "none",
        "--offload",
        help="CPU offload: none | optimizer (ZeRO; lora/qlora: the adapters' optimizer) | params (ZeRO-3, FSDP).",
    ),
    attention: str | None = typer.Option(
        None, "--attention", help="sdpa | eager (default: sdpa where FlashAttention runs).", show_default=False
    ),
    gpus: str | None = typer.Option(
        None, "--gpus", help="Check this configuration (GPUs per node), e.g. 8xA100-80GB.", show_default=False
    ),
    nodes: int = typer.Option(1, "--nodes", help="Nodes for --gpus; sharding spans all GPUs of all nodes."),
    gpu_memory: float | None = typer.Option(
        None,
        "--gpu-memory",
        help="GiB the device reports, for a --gpus GPU the catalog does not sell (e.g. --gpus 1xRTX-4090 "
        "--gpu-memory 23.6): checked, not priced.",
        show_default=False,
    ),
    tokens: str | None = typer.Option(
        None,
        "--tokens",
        help="Training tokens for time and cost, e.g. 2T, 500B (ranks by cost to finish).",
        show_default=False,
    ),
    samples: str | None = typer.Option(
        None,
        "--samples",
        help="Instead of --tokens: training sequences (50K); tokens = samples x epochs x seq.",
        show_default=False,
    ),
    epochs: float | None = typer.Option(
        None, "--epochs", help="Passes over --samples (default 1).", show_default=False
    ),
    headroom: float | None = typer.Option(
        None,
        "--headroom",
        help=f"Free GPU memory to keep, fraction of the need. Default: {DEFAULT_HEADROOM_FRACTION}. The need "
        f"already holds the measured CUDA context ({CUDA_CONTEXT_BYTES / GIB:.2f} GiB) and allocator reserve "
        f"({ALLOCATOR_RESERVE_FRACTION:.1%} of allocated in training; {HF_KV_RESERVE_FRACTION} x the KV cache "
        f"for HF generate; vLLM: none, its pool is {VLLM_GPU_MEMORY_UTILIZATION} of the device).",
        show_default=False,
    ),
    allow_slow_interconnect: bool = typer.Option(
        False,
        "--allow-slow-interconnect",
        help="Also propose multi-node sharded training on types without EFA/GPUDirect.",
    ),
    cloud: str | None = typer.Option(None, "--cloud", help="aws or gcp (default: both).", show_default=False),
    region: str | None = typer.Option(
        None, "--region", help="Only offers in this region, e.g. us-east-1.", show_default=False
    ),
    spot: bool = typer.Option(
        False,
        "--spot",
        help="Spot capacity: price spot offers and add the checkpoint plan (size, upload time, notice, interval).",
    ),
    interruption_rate: float = typer.Option(
        DEFAULT_INTERRUPTIONS_PER_NODE_HOUR,
        "--interruption-rate",
        help="Spot interruptions per node-hour (checkpoint interval).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Estimate memory per GPU and recommend GPUs that fit with headroom; exit 4 when none does."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.errors import SizingError
    from gpuinfra.offers import OfferScope
    from gpuinfra.sizing.checkpoint import check_interruption_rate
    from gpuinfra.sizing.memory import VLLM_GPU_MEMORY_UTILIZATION
    from gpuinfra.sizing.recommend import nothing_fits, sizing_request
    from gpuinfra.sizing.report import size_document, size_markets

    if nodes < 1:
        raise SizingError(f"--nodes must be >= 1, got {nodes}")
    check_interruption_rate(interruption_rate)
    if gpu_memory is not None and not gpus:
        raise SizingError("--gpu-memory needs --gpus NxNAME (the GPU it describes)")
    given = {
        "seq": seq,
        "batch": batch,
        "precision": precision,
        "strategy": strategy,
        "recompute": recompute,
        "attention": attention,
        "headroom": headroom,
        "optimizer": optimizer,
        "engine": engine,
        "base_precision": base_precision,
        "global_batch": global_batch,
        "tp": tp,
        "pp": pp,
    }
    req = sizing_request(
        model,
        params,
        method,
        seq,
        batch,
        precision or "bf16",
        strategy,
        recompute,
        tokens,
        base_precision,
        offload,
        attention,
        DEFAULT_HEADROOM_FRACTION if headroom is None else headroom,
        allow_slow_interconnect,
        optimizer,
        engine,
        samples,
        epochs,
        frozenset(k for k, v in given.items() if v is not None),
        global_batch,
        tp,
        pp,
    )
    scope = OfferScope(cloud=cloud, region=region, markets=size_markets(spot))
    doc = size_document(
        req,
        gpus,
        nodes,
        spot=spot,
        interruptions_per_node_hour=interruption_rate,
        scope=scope,
        gpu_memory_gib=gpu_memory,
    )
    if as_json:
        print_json(doc)
        if not doc["candidates"]:
            raise nothing_fits(req, scope, load_catalog())
        return
    out = stdout_console()
    base = f", base {req.base_precision}" if req.base_precision else ""
    out.print(
        f"[bold]{doc['model']['name']}[/bold] ({doc['model']['params'] / 1e9:.2f}B params), {req.method}, "
        f"{req.precision}{base}, {req.strategy}, recompute {doc['recompute']}, offload {req.offload}, "
        f"seq {req.seq}"
        + (f", micro-batch {req.batch}" if req.batch else "")
        + (f", {req.engine}" if req.method == "inference" else f", {req.optimizer}")
    )
    if doc.get("breakdown"):
        b = doc["breakdown"]
        verdict = "fits" if doc["fits"] else "does NOT fit"
        vllm = req.method == "inference" and req.engine == "vllm"
        rule = (
            f"inside vLLM's preallocated {VLLM_GPU_MEMORY_UTILIZATION:g} of the device"
            if vllm
            else f"after {req.headroom:.0%} headroom"
        )
        out.print(
            f"{doc['gpus']} x {doc['nodes']} node(s): {doc['memory_per_gpu_gib']:.1f} GiB per GPU of "
            f"{doc['gpu_memory_gib']:.1f} GiB -> {verdict} (margin {doc['margin_gib']:.1f} GiB {rule})"
        )
        out.print(
            "  "
            + ", ".join(f"{k.removesuffix('_gib')} {v:.2f}" for k, v in b.items())
            + f" (GiB, at the {doc['peak_phase'].replace('_', ' ')} peak)"
        )
        if doc.get("phases_gib"):
            out.print(
                "  allocated by phase: "
                + ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in doc["phases_gib"].items())
                + " (GiB)"
            )
        if doc.get("cpu_memory_per_node_gib"):
            out.print(f"  CPU memory per node for offload: {doc['cpu_memory_per_node_gib']:.1f} GiB")
        if doc.get("layout"):
            out.print("  " + layout_text(doc["layout"]))
        if doc.get("time"):
            out.print("  " + time_text(doc["time"]))
    if doc.get("interconnect_note"):
        out.print(f"note: {doc['interconnect_note']}")
    if doc.get("offer_note"):
        out.print(f"note: {doc['offer_note']}")
    if doc["candidates"]:
        ranked = (
            "cost to finish" if doc["ranked_by"] == "run_cost_usd" else "$/h (give --tokens to rank by cost to finish)"
        )
        out.print(
            f"configurations that fit, ranked by {ranked}, {' or '.join(scope.markets)} prices"
            f"{scope.describe()} (catalog {doc['catalog_date']}):"
        )
        for c in doc["candidates"]:
            extra = ""
            if c["training_hours"] is not None:
                extra = (
                    f", {c['training_hours']:.1f} h (comm {c['communication_hours']:.1f} h, MFU {c['mfu']:.2f}), "
                    f"${Decimal(c['run_cost_usd']):,.0f}"
                )
            out.print(
                f"  --gpus {c['gpus']} --nodes {c['nodes']}: {c['memory_per_gpu_gib']:.1f}/{c['gpu_memory_gib']:.1f} GiB, "
                f"${Decimal(c['price_per_hour_usd']):,.2f}/h ({c['cloud']} {c['instance_type']}){extra}"
            )
    plan = doc.get("checkpoint_plan")
    if plan:
        upload = "unknown" if plan["upload_seconds"] is None else f"{plan['upload_seconds']:.0f} s"
        fits = {True: "fits", False: "does NOT fit", None: "unknown vs"}[plan["fits_notice"]]
        interval = "unknown" if plan["interval_minutes"] is None else f"every {plan['interval_minutes']:.0f} min"
        out.print(
            f"spot checkpoint: {plan['checkpoint_gib_per_node']:.1f} GiB per node, upload {upload} -> {fits} the "
            f"{plan['notice_seconds']} s notice; checkpoint {interval} (Young/Daly, "
            f"{plan['interruptions_per_node_hour']} interruptions per node-hour)"
        )
    out.print("assumed (not given):")
    for a in doc["assumptions"]:
        out.print(f"  {a['name']} {a['value']}: {a['source']}")
    if doc.get("next_command"):
        out.print(f"next: {doc['next_command']}")
    if not doc["candidates"]:
        raise nothing_fits(req, scope, load_catalog())  # exit 4 after the breakdown above


def layout_text(layout: dict) -> str:
    """One line for a layout (:meth:`gpuinfra.sizing.layout.Layout.to_json`)."""
    chosen = f" (chosen: {', '.join(layout['chosen'])})" if layout["chosen"] else ""
    return (
        f"layout: dp {layout['dp']} x tp {layout['tp']} x pp {layout['pp']}, micro-batch {layout['micro_batch']} x "
        f"accumulation {layout['accumulation']} = global batch {layout['global_batch']}, "
        f"bubble {layout['bubble_fraction']:.1%}{chosen}"
    )


def time_text(time: dict) -> str:
    """One line for a step's time (:meth:`gpuinfra.sizing.throughput.TrainingTime.to_json`)."""
    step = "unknown" if time["step_seconds"] is None else f"{time['step_seconds']:.3f} s"
    comm = time["communication_seconds_per_step"]
    exposed = time["exposed_communication_seconds_per_step"]
    overlap = "" if time["overlap_fraction"] is None else f", {time['overlap_fraction']:.0%} overlapped"
    comm_text = "unknown" if comm is None else f"{comm:.3f} s ({exposed:.3f} s exposed{overlap})"
    mfu = "unknown" if time["mfu"] is None else f"{time['mfu']:.1%}"
    return (
        f"step {step} x {time['steps']:,} steps: compute {time['compute_seconds_per_step']:.3f} s, "
        f"communication {comm_text}; MFU {mfu} at utilization {time['utilization']:.3f} ({time['utilization_source']})"
    )
