"""The ``gpuinfra size`` document, and sizing a new stack from a model (``gpuinfra new --model``).

Document (``gpuinfra size --json``; USD as :func:`gpuinfra.money.usd_json` strings):
``{"model": {"name", "params", "layers", "hidden", "heads", "kv_heads", "vocab", "source"},
"method", "precision", "base_precision", "strategy", "recompute", "offload", "seq", "batch",
"tokens", "headroom", "ranked_by" ("run_cost_usd" with tokens, else "price_per_hour_usd"),
"catalog_date", "candidates": [candidate, ...] (at most 5, best first), "fits",
"recommendation", "interconnect_note", "checkpoint_plan"}`` and, when a configuration was
evaluated, ``"gpus", "nodes", "total_gpus", "memory_per_gpu_gib", "gpu_memory_gib",
"cpu_memory_per_node_gib", "margin_gib", "breakdown": {"<kind>_gib": ...}, "training_hours",
"compute_hours", "communication_hours", "mfu", "mfu_source", "run_cost_usd",
"price_per_hour_usd"``; a candidate is :func:`gpuinfra.sizing.recommend.candidate_json`.
``checkpoint_plan`` (:class:`gpuinfra.sizing.checkpoint.CheckpointPlan`) is set with ``spot``
for training methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuinfra.catalog.store import Catalog, load_catalog
from gpuinfra.sizing.checkpoint import DEFAULT_INTERRUPTIONS_PER_NODE_HOUR, checkpoint_plan
from gpuinfra.sizing.recommend import (PROFILE_FOR_METHOD, Candidate, SizingRequest, _cheapest_offers,
                                       _device_memory_gib, candidate_json, candidates, evaluate, nothing_fits,
                                       sizing_request)

#: Candidates listed in the document.
SHOWN_CANDIDATES = 5


def size_document(req: SizingRequest, gpus: str | None = None, nodes: int = 1, catalog: Catalog | None = None,
                  spot: bool = False,
                  interruptions_per_node_hour: float = DEFAULT_INTERRUPTIONS_PER_NODE_HOUR) -> dict[str, Any]:
    """Memory per GPU of ``req`` and the best configurations that fit (module docstring).

    Args:
        req: a resolved request (:func:`gpuinfra.sizing.recommend.sizing_request`).
        gpus: check this configuration (GPUs per node, ``8xA100-80GB``) instead of the best
            fitting one; priced when the catalog has that configuration.
        nodes: nodes of ``gpus``.
        catalog: the catalog to price from (default: the one in use).
        spot: add the spot checkpoint plan of the chosen configuration.
        interruptions_per_node_hour: spot interruption rate for the checkpoint interval.

    Returns:
        The document; ``candidates`` is empty when nothing in the catalog fits (the caller
        raises :func:`gpuinfra.sizing.recommend.nothing_fits` after showing the breakdown).

    Raises:
        RequestError: a malformed ``gpus`` spec or unknown GPU.
    """
    from gpuinfra.requests import parse_gpu_spec

    catalog = catalog or load_catalog()
    ranked = candidates(req, catalog)
    training = req.tokens and req.method != "inference"
    doc: dict[str, Any] = {
        "model": {"name": req.shape.name, "params": req.shape.params, "layers": req.shape.layers,
                  "hidden": req.shape.hidden, "heads": req.shape.heads, "kv_heads": req.shape.kv_heads,
                  "vocab": req.shape.vocab, "source": req.shape.source},
        "method": req.method, "precision": req.precision, "base_precision": req.base_precision,
        "strategy": req.strategy, "recompute": req.recompute, "offload": req.offload,
        "seq": req.seq, "batch": req.batch, "tokens": req.tokens, "headroom": req.headroom,
        "ranked_by": "run_cost_usd" if training else "price_per_hour_usd",
        "catalog_date": catalog.catalog_date,
        "candidates": [candidate_json(c) for c in ranked[:SHOWN_CANDIDATES]],
        "interconnect_note": None, "checkpoint_plan": None,
    }
    chosen: Candidate | None
    if gpus:
        request = parse_gpu_spec(gpus, nodes)
        multi = req.sharded and nodes > 1
        offers = _cheapest_offers(catalog, multi and not req.allow_slow_interconnect)
        offer = offers.get((request.gpu, request.gpu_count))
        if multi and offer is None and not req.allow_slow_interconnect:
            doc["interconnect_note"] = (f"no instance type with {request.gpu_count}x{request.gpu} has a high-bandwidth "
                                        "GPU network (EFA / GPUDirect); sharded training over nodes is not recommended "
                                        "(--allow-slow-interconnect to price it anyway)")
        chosen = evaluate(req, request.gpu, _device_memory_gib(request.gpu), request.gpu_count, nodes,
                          None if offer is None else offer["network_bandwidth_gbps"])
        if offer is not None:
            chosen.host_memory_gib = offer["host_memory_gib"]
            chosen.storage_bandwidth_gbps = offer["storage_bandwidth_gbps"]
            chosen.price_per_hour_usd = offer["price"] * nodes
            chosen.offer = {k: offer[k] for k in ("cloud", "region", "zone", "instance_type")}
    else:
        chosen = ranked[0] if ranked else None
    if chosen is None:
        doc.update(fits=False, recommendation=None, memory_per_gpu_gib=None, gpu_memory_gib=None, breakdown=None)
        return doc
    view = candidate_json(chosen)
    usable = chosen.fits and doc["interconnect_note"] is None
    best = chosen if usable else (ranked[0] if ranked else None)
    doc.update(
        gpus=view["gpus"], nodes=view["nodes"], total_gpus=view["total_gpus"],
        memory_per_gpu_gib=view["memory_per_gpu_gib"], gpu_memory_gib=view["gpu_memory_gib"],
        cpu_memory_per_node_gib=view["cpu_memory_per_node_gib"],
        fits=chosen.fits, margin_gib=view["margin_gib"], breakdown=chosen.breakdown.gib(),
        **{k: view[k] for k in ("training_hours", "compute_hours", "communication_hours", "mfu", "mfu_source",
                                "run_cost_usd", "price_per_hour_usd")},
        recommendation=None if best is None else {"gpus": best.spec, "nodes": best.nodes, **best.offer,
                                                   "price_per_hour_usd": candidate_json(best)["price_per_hour_usd"]},
    )
    if spot and req.method != "inference" and best is not None and best.offer:
        plan = checkpoint_plan(req.trained_params, best.nodes, best.offer["cloud"], best.storage_bandwidth_gbps,
                               interruptions_per_node_hour)
        doc["checkpoint_plan"] = plan.to_json()
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
        """``{"memory_per_gpu_gib", "gpu_memory_gib", "breakdown", "method", "checkpoint_plan"}``
        (``new --json`` ``sizing``; ``checkpoint_plan`` is None unless sized for spot)."""
        return {k: self.document[k] for k in ("memory_per_gpu_gib", "gpu_memory_gib", "breakdown", "method",
                                              "checkpoint_plan")}


def size_for_stack(model: str | None, params: str | None, method: str | None = None,
                   catalog: Catalog | None = None, spot: bool = False) -> StackSizing:
    """The cheapest GPU configuration that holds a model for ``method`` (default ``full``), at
    sequence length 2048, micro-batch 1, bf16 and the method's default strategy.

    Raises:
        SizingError: neither or both of ``model`` / ``params``, or a bad value.
        NoOfferError: no configuration in the catalog fits (exit 4).
    """
    method = method or "full"
    req = sizing_request(model, params, method)
    doc = size_document(req, catalog=catalog, spot=spot)
    if not doc.get("recommendation"):
        raise nothing_fits(req)
    return StackSizing(doc["recommendation"]["gpus"], doc["recommendation"]["nodes"], PROFILE_FOR_METHOD[method], doc)
