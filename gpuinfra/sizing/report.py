"""The ``gpuinfra size`` document, and sizing a new stack from a model (``gpuinfra new --model``).

Document (``gpuinfra size --json``; USD as :func:`gpuinfra.money.usd_json` strings):
``{"model": {"name", "params", "layers", "hidden", "heads", "kv_heads", "vocab", "source"},
"method", "precision", "strategy", "recompute", "seq", "batch", "tokens", "mfu", "catalog_date",
"candidates": [candidate, ...] (at most 5, cheapest first), "fits", "recommendation"}`` and, when
a configuration was evaluated, ``"gpus", "nodes", "total_gpus", "memory_per_gpu_gib",
"gpu_memory_gib", "margin_gib", "breakdown": {"<kind>_gib": ...}, "training_hours",
"run_cost_usd", "price_per_hour_usd"``; a candidate is
:func:`gpuinfra.sizing.recommend.candidate_json`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuinfra.catalog.store import Catalog, load_catalog
from gpuinfra.sizing.recommend import (PROFILE_FOR_METHOD, Candidate, SizingRequest, candidate_json, candidates,
                                       evaluate, gpu_compute, nothing_fits, sizing_request)

#: Candidates listed in the document.
SHOWN_CANDIDATES = 5


def size_document(req: SizingRequest, gpus: str | None = None, nodes: int = 1,
                  catalog: Catalog | None = None) -> dict[str, Any]:
    """Memory per GPU of ``req`` and the cheapest configurations that fit (module docstring).

    Args:
        req: a resolved request (:func:`gpuinfra.sizing.recommend.sizing_request`).
        gpus: check this configuration (GPUs per node, ``8xA100-80GB``) instead of the
            cheapest fitting one; priced when the catalog has that configuration.
        nodes: nodes of ``gpus``.
        catalog: the catalog to price from (default: the one in use).

    Returns:
        The document; ``candidates`` is empty when nothing in the catalog fits (the caller
        raises :func:`gpuinfra.sizing.recommend.nothing_fits` after showing the breakdown).

    Raises:
        RequestError: a malformed ``gpus`` spec or unknown GPU.
    """
    from gpuinfra.catalog.gpus import gpu_model
    from gpuinfra.requests import parse_gpu_spec

    catalog = catalog or load_catalog()
    ranked = candidates(req, catalog)
    doc: dict[str, Any] = {
        "model": {"name": req.shape.name, "params": req.shape.params, "layers": req.shape.layers,
                  "hidden": req.shape.hidden, "heads": req.shape.heads, "kv_heads": req.shape.kv_heads,
                  "vocab": req.shape.vocab, "source": req.shape.source},
        "method": req.method, "precision": req.precision, "strategy": req.strategy, "recompute": req.recompute,
        "seq": req.seq, "batch": req.batch,
        "tokens": req.tokens, "mfu": gpu_compute()["mfu"].get(req.method) if req.tokens else None,
        "catalog_date": catalog.catalog_date,
        "candidates": [candidate_json(c) for c in ranked[:SHOWN_CANDIDATES]],
    }
    chosen: Candidate | None
    if gpus:
        request = parse_gpu_spec(gpus, nodes)
        chosen = evaluate(req, request.gpu, gpu_model(request.gpu).memory_gib, request.gpu_count, nodes)
        priced = next((c for c in ranked if c.gpu == request.gpu and c.gpus_per_node == request.gpu_count), None)
        if priced is not None and priced.price_per_hour_usd is not None:
            chosen.price_per_hour_usd = priced.price_per_hour_usd / priced.nodes * nodes
            chosen.offer = priced.offer
    else:
        chosen = ranked[0] if ranked else None
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


@dataclass(frozen=True)
class StackSizing:
    """The GPU request ``gpuinfra new --model/--params`` plans for.

    Attributes:
        gpus: GPUs per node (``--gpus`` form, ``1xL4``).
        nodes: node count.
        profile: the workload profile of the method (``qlora`` -> ``qlora-finetune``).
        document: the :func:`size_document` it was read from.
    """

    gpus: str
    nodes: int
    profile: str
    document: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """``{"memory_per_gpu_gib", "gpu_memory_gib", "breakdown", "method"}`` (``new --json`` ``sizing``)."""
        return {k: self.document[k] for k in ("memory_per_gpu_gib", "gpu_memory_gib", "breakdown", "method")}


def size_for_stack(model: str | None, params: str | None, method: str | None = None,
                   catalog: Catalog | None = None) -> StackSizing:
    """The cheapest GPU configuration that holds a model for ``method`` (default ``full``), at
    sequence length 2048, micro-batch 1, bf16 and the method's default strategy.

    Raises:
        SizingError: neither or both of ``model`` / ``params``, or a bad value.
        NoOfferError: no configuration in the catalog fits (exit 4).
    """
    method = method or "full"
    req = sizing_request(model, params, method)
    doc = size_document(req, catalog=catalog)
    if not doc.get("recommendation"):
        raise nothing_fits(req)
    return StackSizing(doc["recommendation"]["gpus"], doc["recommendation"]["nodes"], PROFILE_FOR_METHOD[method], doc)
