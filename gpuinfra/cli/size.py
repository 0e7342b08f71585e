"""``gpuinfra size``: memory per GPU for a model and method, and the cheapest GPUs that fit."""

from __future__ import annotations

from typing import Optional

import typer


def build_request(model: str | None, params: str | None, method: str, seq: int, batch: int, precision: str,
                  strategy: str | None, recompute: str | None, tokens: str | None):
    """Typed, validated sizing request from CLI values.

    Raises:
        SizingError: neither or both of --model/--params, or a bad value.
    """
    from gpuinfra.sizing.models import SizingError, get_model, parse_count, shape_from_params
    from gpuinfra.sizing.recommend import SizingRequest

    if (model is None) == (params is None):
        raise SizingError("give exactly one of --model NAME or --params COUNT (e.g. --params 7B)")
    shape = get_model(model) if model else shape_from_params(parse_count(params))
    return SizingRequest(shape, method, precision, strategy, recompute, seq, batch,
                         parse_count(tokens, "--tokens") if tokens else None).resolved()


def size_document(req, gpus: str | None, nodes: int) -> dict:
    """The ``gpuinfra size --json`` document."""
    from gpuinfra.catalog.gpus import gpu_model
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.requests import parse_gpu_spec
    from gpuinfra.sizing.recommend import candidate_json, candidates, evaluate, gpu_compute

    catalog = load_catalog()
    ranked = candidates(req, catalog)
    doc = {
        "model": {"name": req.shape.name, "params": req.shape.params, "layers": req.shape.layers,
                  "hidden": req.shape.hidden, "heads": req.shape.heads, "kv_heads": req.shape.kv_heads,
                  "vocab": req.shape.vocab, "source": req.shape.source},
        "method": req.method, "precision": req.precision, "strategy": req.strategy, "recompute": req.recompute,
        "seq": req.seq, "batch": req.batch,
        "tokens": req.tokens, "mfu": gpu_compute()["mfu"].get(req.method) if req.tokens else None,
        "catalog_date": catalog.catalog_date,
        "candidates": [candidate_json(c) for c in ranked[:5]],
    }
    if gpus:
        request = parse_gpu_spec(gpus, nodes)
        memory = gpu_model(request.gpu).memory_gib
        chosen = evaluate(req, request.gpu, memory, request.gpu_count, nodes)
        priced = next((c for c in ranked if c.gpu == request.gpu and c.gpus_per_node == request.gpu_count), None)
        if priced is not None:
            chosen.price_per_hour_usd = priced.price_per_hour_usd / priced.nodes * nodes
            chosen.offer = priced.offer
    elif ranked:
        chosen = ranked[0]
    else:
        chosen = None
    if chosen is None:
        doc.update(fits=False, recommendation=None, memory_per_gpu_gib=None, gpu_memory_gib=None, breakdown=None)
        return doc
    view = candidate_json(chosen)
    best = chosen if chosen.fits else (ranked[0] if ranked else None)
    doc.update(
        gpus=view["gpus"], nodes=view["nodes"], total_gpus=view["total_gpus"],
        memory_per_gpu_gib=view["memory_per_gpu_gib"], gpu_memory_gib=view["gpu_memory_gib"],
        fits=chosen.fits, margin_gib=view["margin_gib"], breakdown=chosen.breakdown.gib(),
        training_hours=view["training_hours"], run_cost_usd=view["run_cost_usd"],
        price_per_hour_usd=view["price_per_hour_usd"],
        recommendation=None if best is None else {"gpus": best.spec, "nodes": best.nodes, **best.offer,
                                                   "price_per_hour_usd": candidate_json(best)["price_per_hour_usd"]},
    )
    return doc


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

    from gpuinfra.sizing.recommend import nothing_fits

    req = build_request(model, params, method, seq, batch, precision, strategy, recompute, tokens)
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
            extra = f", {c['training_hours']:.1f} h, ${c['run_cost_usd']:,.0f}" if c["training_hours"] is not None else ""
            out.print(f"  --gpus {c['gpus']} --nodes {c['nodes']}: {c['memory_per_gpu_gib']:.1f}/{c['gpu_memory_gib']:.0f} GiB, "
                      f"${c['price_per_hour_usd']:,.2f}/h ({c['cloud']} {c['instance_type']}){extra}")
    if doc.get("recommendation"):
        r = doc["recommendation"]
        out.print(f"next: gpuinfra new --gpus {r['gpus']} --nodes {r['nodes']}")
    if not doc["candidates"]:
        raise nothing_fits(req)  # exit 4 after the breakdown above
