"""``gpuinfra size``: memory per GPU for a model and method, and the GPUs that fit
(the document is :func:`gpuinfra.sizing.report.size_document`)."""

from __future__ import annotations

from decimal import Decimal

import typer

from gpuinfra.sizing import DEFAULT_HEADROOM_FRACTION
from gpuinfra.sizing.checkpoint import DEFAULT_INTERRUPTIONS_PER_NODE_HOUR


def size(
    model: str | None = typer.Option(
        None, "--model", help="Model name (llama-3.1-8b, mistral-7b ...).", show_default=False
    ),
    params: str | None = typer.Option(
        None, "--params", help="Parameter count instead of a model: 7B, 1.3B, 350M.", show_default=False
    ),
    method: str = typer.Option("full", "--method", help="pretrain | full | lora | qlora | inference."),
    seq: int = typer.Option(2048, "--seq", help="Sequence length in tokens (inference: prompt + output)."),
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
    precision: str = typer.Option(
        "bf16",
        "--precision",
        help="Training: compute precision bf16 | fp16 | fp32. Inference: weights fp32 | bf16 | fp16 | int8 | int4.",
    ),
    base_precision: str | None = typer.Option(
        None,
        "--base-precision",
        help="Frozen base storage: lora bf16 | fp16 | fp32 | int8; qlora nf4 | nf4-dq.",
        show_default=False,
    ),
    strategy: str | None = typer.Option(
        None, "--strategy", help="ddp | fsdp | zero1 | zero2 | zero3 (default per method).", show_default=False
    ),
    recompute: str | None = typer.Option(
        None, "--recompute", help="none | selective | full (default per method).", show_default=False
    ),
    offload: str = typer.Option(
        "none", "--offload", help="CPU offload: none | optimizer (ZeRO) | params (ZeRO-3, FSDP)."
    ),
    attention: str | None = typer.Option(
        None, "--attention", help="sdpa | eager (default: sdpa where FlashAttention runs).", show_default=False
    ),
    gpus: str | None = typer.Option(
        None, "--gpus", help="Check this configuration (GPUs per node), e.g. 8xA100-80GB.", show_default=False
    ),
    nodes: int = typer.Option(1, "--nodes", help="Nodes for --gpus; sharding spans all GPUs of all nodes."),
    tokens: str | None = typer.Option(
        None,
        "--tokens",
        help="Training tokens for time and cost, e.g. 2T, 500B (ranks by cost to finish).",
        show_default=False,
    ),
    headroom: float = typer.Option(
        DEFAULT_HEADROOM_FRACTION, "--headroom", help="Free GPU memory to keep, fraction of the need."
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
    from gpuinfra.sizing.recommend import nothing_fits, sizing_request
    from gpuinfra.sizing.report import size_document, size_markets

    if nodes < 1:
        raise SizingError(f"--nodes must be >= 1, got {nodes}")
    check_interruption_rate(interruption_rate)
    req = sizing_request(
        model,
        params,
        method,
        seq,
        batch,
        precision,
        strategy,
        recompute,
        tokens,
        base_precision,
        offload,
        attention,
        headroom,
        allow_slow_interconnect,
        global_batch,
        tp,
        pp,
    )
    scope = OfferScope(cloud=cloud, region=region, markets=size_markets(spot))
    doc = size_document(req, gpus, nodes, spot=spot, interruptions_per_node_hour=interruption_rate, scope=scope)
    if as_json:
        print_json(doc)
        if not doc["candidates"]:
            raise nothing_fits(req, scope, load_catalog())
        return
    out = stdout_console()
    base = f", base {req.base_precision}" if req.base_precision else ""
    out.print(
        f"[bold]{doc['model']['name']}[/bold] ({doc['model']['params'] / 1e9:.2f}B params), {req.method}, "
        f"{req.precision}{base}, {req.strategy}, recompute {req.recompute}, offload {req.offload}, "
        f"seq {req.seq}" + (f", micro-batch {req.batch}" if req.batch else "")
    )
    if doc.get("breakdown"):
        b = doc["breakdown"]
        verdict = "fits" if doc["fits"] else "does NOT fit"
        out.print(
            f"{doc['gpus']} x {doc['nodes']} node(s): {doc['memory_per_gpu_gib']:.1f} GiB per GPU of "
            f"{doc['gpu_memory_gib']:.1f} GiB -> {verdict} (margin {doc['margin_gib']:.1f} GiB after "
            f"{req.headroom:.0%} headroom)"
        )
        out.print("  " + ", ".join(f"{k.removesuffix('_gib')} {v:.2f}" for k, v in b.items()) + " (GiB)")
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
    if doc.get("next_command"):
        out.print(f"next: {doc['next_command']}")
    for a in doc.get("assumptions") or []:
        out.print(f"  assumed {a['name']} = {a['value']} ({a['source']})")
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
