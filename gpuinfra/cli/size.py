"""``gpuinfra size``: memory per GPU for a model and method, and the cheapest GPUs that fit
(the document is :func:`gpuinfra.sizing.report.size_document`)."""

from __future__ import annotations

from decimal import Decimal
from typing import Optional

import typer


def size(
    model: Optional[str] = typer.Option(None, "--model", help="Model name (llama-3.1-8b, mistral-7b ...).", show_default=False),
    params: Optional[str] = typer.Option(None, "--params", help="Parameter count instead of a model: 7B, 1.3B, 350M.", show_default=False),
    method: str = typer.Option("full", "--method", help="pretrain | full | lora | qlora | inference."),
    seq: int = typer.Option(2048, "--seq", help="Sequence length in tokens."),
    batch: int = typer.Option(1, "--batch", help="Micro-batch per GPU (inference: concurrent sequences)."),
    precision: str = typer.Option("bf16", "--precision", help="fp32 | bf16 | fp16 | int8 | int4."),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="ddp | fsdp | zero1 | zero2 | zero3 (default per method).", show_default=False),
    recompute: Optional[str] = typer.Option(None, "--recompute", help="none | selective | full (default per method).", show_default=False),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Check this configuration (GPUs per node), e.g. 8xA100-80GB.", show_default=False),
    nodes: int = typer.Option(1, "--nodes", help="Nodes for --gpus; sharding spans all GPUs of all nodes."),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="Training tokens for time and cost, e.g. 2T, 500B.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Estimate memory per GPU and recommend the cheapest GPUs that fit (10% headroom); exit 4 when none does."""
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.sizing.recommend import nothing_fits, sizing_request
    from gpuinfra.sizing.report import size_document

    req = sizing_request(model, params, method, seq, batch, precision, strategy, recompute, tokens)
    doc = size_document(req, gpus, nodes)
    if as_json:
        print_json(doc)
        if not doc["candidates"]:
            raise nothing_fits(req)
        return
    out = stdout_console()
    out.print(f"[bold]{doc['model']['name']}[/bold] ({doc['model']['params'] / 1e9:.2f}B params), {req.method}, "
              f"{req.precision}, {req.strategy}, recompute {req.recompute}, seq {req.seq}, micro-batch {req.batch}")
    if doc.get("breakdown"):
        b = doc["breakdown"]
        verdict = "fits" if doc["fits"] else "does NOT fit"
        out.print(f"{doc['gpus']} x {doc['nodes']} node(s): {doc['memory_per_gpu_gib']:.1f} GiB per GPU of "
                  f"{doc['gpu_memory_gib']:.1f} GiB -> {verdict} (margin {doc['margin_gib']:.1f} GiB, needs 10% headroom)")
        out.print("  " + ", ".join(f"{k.removesuffix('_gib')} {v:.2f}" for k, v in b.items()) + " (GiB)")
    if doc["candidates"]:
        out.print(f"cheapest configurations that fit (catalog {doc['catalog_date']}):")
        for c in doc["candidates"]:
            extra = f", {c['training_hours']:.1f} h, ${Decimal(c['run_cost_usd']):,.0f}" if c["training_hours"] is not None else ""
            out.print(f"  --gpus {c['gpus']} --nodes {c['nodes']}: {c['memory_per_gpu_gib']:.1f}/{c['gpu_memory_gib']:.0f} GiB, "
                      f"${Decimal(c['price_per_hour_usd']):,.2f}/h ({c['cloud']} {c['instance_type']}){extra}")
    if doc.get("recommendation"):
        r = doc["recommendation"]
        out.print(f"next: gpuinfra new --gpus {r['gpus']} --nodes {r['nodes']}")
    if not doc["candidates"]:
        raise nothing_fits(req)  # exit 4 after the breakdown above
