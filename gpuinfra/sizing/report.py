"""The ``gpuinfra size`` document, and sizing a new stack from a model (``gpuinfra new --model``).

Document (``gpuinfra size --json``; USD as :func:`gpuinfra.money.usd_json` strings):
``{"model": {"name", "params", "layers", "hidden", "heads", "kv_heads", "vocab", "source"},
"method", "precision", "base_precision", "strategy", "recompute" (what the configuration shown was
sized with: without ``--recompute``, none, or full where none does not fit), "offload", "seq", "batch",
"optimizer" (training), "engine" (inference), "tokens", "headroom", "ranked_by" ("run_cost_usd" with tokens, else "price_per_hour_usd"),
"scope": {"cloud", "region", "markets"} (where configurations were looked for, and the markets
they are priced in), "catalog_date", "candidates": [candidate, ...] (at most 5, best first), "fits",
"recommendation", "next_command" (:func:`next_command`; None when nothing fits),
"interconnect_note", "offer_note" (with ``gpus``: no machine in the scope carries that many
GPUs per node, even rounded up as ``gpuinfra new`` would; the recommendation is then the best
fitting configuration instead), "checkpoint_plan"}`` and, when a configuration was
evaluated, ``"gpus", "nodes", "total_gpus", "memory_per_gpu_gib", "gpu_memory_gib",
"cpu_memory_per_node_gib", "margin_gib", "breakdown": {"<kind>_gib": ...} (at the peak phase),
"peak_phase" (forward | backward | optimizer_step | generate | vllm_pool), "phases_gib"
({"between_steps", "forward", "backward", "optimizer_step"} allocated GiB; training), "training_hours",
"compute_hours", "communication_hours" (exposed, after overlap), "bubble_hours", "mfu" (model
FLOPs utilization of the predicted run), "mfu_source" (the run the utilization comes from),
"layout" (:meth:`gpuinfra.sizing.layout.Layout.to_json`: dp, tp, pp, micro-batch,
accumulation, global batch, bubble), "time" (:meth:`gpuinfra.sizing.throughput.TrainingTime.to_json`:
per-step compute, bubble and communication seconds, overlap), "run_cost_usd",
"price_per_hour_usd"``; a candidate is :func:`gpuinfra.sizing.recommend.candidate_json`.
``checkpoint_plan`` (:class:`gpuinfra.sizing.checkpoint.CheckpointPlan`) is set with ``spot``
for training methods. ``assumptions`` (``[{"name", "value", "source"}, ...]``) lists every
value the user did not give, with its source: the request's defaults and the layout chosen for
the evaluated configuration (:meth:`gpuinfra.sizing.recommend.SizingRequest.assumptions`), then
every assumed value of the time model (:func:`gpuinfra.sizing.throughput.time_assumptions`); ``gpus`` with
``gpu_memory_gib`` checks a GPU the catalog does not sell (no price, no cost).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from gpuinfra.catalog.store import Catalog, load_catalog
from gpuinfra.errors import SizingError
from gpuinfra.offers import MAX_ROUND_UP_FACTOR, OfferScope, validate_location
from gpuinfra.requests import parse_gpu_spec
from gpuinfra.sizing.checkpoint import DEFAULT_INTERRUPTIONS_PER_NODE_HOUR, CheckpointPlan, checkpoint_plan
from gpuinfra.sizing.recommend import (
    PROFILE_FOR_METHOD,
    Candidate,
    SizingRequest,
    candidate_json,
    candidates,
    device_memory_gib,
    evaluate,
    nothing_fits,
    priced,
    sizing_request,
)
from gpuinfra.sizing.supply import cheapest_offers
from gpuinfra.sizing.throughput import time_assumptions

#: Candidates listed in the document.
SHOWN_CANDIDATES = 5


def size_markets(spot: bool) -> tuple[str, ...]:
    """The markets ``gpuinfra size`` prices in: spot with ``--spot``, else on-demand."""
    return ("spot",) if spot else ("on-demand",)


def size_document(
    req: SizingRequest,
    gpus: str | None = None,
    nodes: int = 1,
    catalog: Catalog | None = None,
    spot: bool = False,
    interruptions_per_node_hour: float = DEFAULT_INTERRUPTIONS_PER_NODE_HOUR,
    scope: OfferScope | None = None,
    gpu_memory_gib: float | None = None,
) -> dict[str, Any]:
    """Memory per GPU of ``req`` and the best configurations that fit (module docstring).

    Args:
        req: a resolved request (:func:`gpuinfra.sizing.recommend.sizing_request`).
        gpus: check this configuration (GPUs per node, ``8xA100-80GB``) instead of the best
            fitting one; priced when the scope has that configuration.
        nodes: nodes of ``gpus``.
        catalog: the catalog to price from (default: the one in use).
        spot: spot capacity: priced as spot, with the spot checkpoint plan of the chosen
            configuration.
        interruptions_per_node_hour: spot interruption rate for the checkpoint interval.
        scope: where to look (cloud, region ...; default: the whole catalog); its markets are
            set here (:func:`size_markets`).
        gpu_memory_gib: with ``gpus``: the memory the device reports, GiB, for a GPU the
            catalog does not sell (``1xRTX-4090``): checked, never priced.

    Returns:
        The document; ``candidates`` is empty when nothing in the scope fits (the caller
        raises :func:`gpuinfra.sizing.recommend.nothing_fits` after showing the breakdown).

    Raises:
        RequestError: a malformed ``gpus`` spec or unknown GPU.
        CatalogError: an unknown cloud, region or zone in ``scope``.
    """
    catalog = catalog or load_catalog()
    scope = replace(scope or OfferScope(), markets=size_markets(spot))
    validate_location(catalog, scope)
    ranked = candidates(req, catalog, scope)
    training = req.tokens and req.method != "inference"
    doc: dict[str, Any] = {
        "model": {
            "name": req.shape.name,
            "params": req.shape.params,
            "layers": req.shape.layers,
            "hidden": req.shape.hidden,
            "heads": req.shape.heads,
            "kv_heads": req.shape.kv_heads,
            "vocab": req.shape.vocab,
            "source": req.shape.source,
        },
        "method": req.method,
        "precision": req.precision,
        "base_precision": req.base_precision,
        "strategy": req.strategy,
        "recompute": req.recompute,
        "offload": req.offload,
        "seq": req.seq,
        "batch": req.batch,
        "optimizer": None if req.method == "inference" else req.optimizer,
        "engine": req.engine if req.method == "inference" else None,
        "tokens": req.tokens,
        "headroom": req.headroom,
        "ranked_by": "run_cost_usd" if training else "price_per_hour_usd",
        "scope": {"cloud": scope.cloud, "region": scope.region, "markets": list(scope.markets)},
        "catalog_date": catalog.catalog_date,
        "candidates": [candidate_json(c) for c in ranked[:SHOWN_CANDIDATES]],
        "interconnect_note": None,
        "offer_note": None,
        "checkpoint_plan": None,
        "assumptions": req.assumptions(),
    }
    chosen: Candidate | None
    outside: list[dict] = []
    if gpus and gpu_memory_gib is not None:
        count, name = _outside_gpu(gpus, gpu_memory_gib)
        chosen = evaluate(req, name, gpu_memory_gib, count, nodes)
        doc["offer_note"] = (
            f"{name} is not in the catalog: checked with --gpu-memory {gpu_memory_gib:g} GiB, not priced or planned"
        )
        outside = [
            {
                "name": "gpu_memory_gib",
                "value": gpu_memory_gib,
                "source": f"--gpu-memory for {name} (not in the catalog)",
            }
        ]
    elif gpus:
        request = parse_gpu_spec(gpus, nodes)
        multi = req.sharded and nodes > 1
        offers = cheapest_offers(catalog, multi and not req.allow_slow_interconnect, scope)
        offer = offers.get((request.gpu, request.gpu_count))
        if multi and offer is None and not req.allow_slow_interconnect:
            doc["interconnect_note"] = (
                f"no instance type with {request.gpu_count}x{request.gpu} and a high-bandwidth "
                f"GPU network (EFA / GPUDirect) is sold {' or '.join(scope.markets)}"
                f"{scope.describe()}; sharded training over nodes is not recommended (a wider "
                "--cloud/--region, --spot, or --allow-slow-interconnect to price it anyway)"
            )
        chosen = evaluate(
            req,
            request.gpu,
            device_memory_gib(request.gpu),
            request.gpu_count,
            nodes,
            None if offer is None else offer["network_bandwidth_gbps"],
        )
        if offer is not None:
            chosen = priced(chosen, offer, nodes)
        shapes = cheapest_offers(catalog, False, scope) if multi else offers
        if not any(
            gpu == request.gpu and request.gpu_count <= count <= MAX_ROUND_UP_FACTOR * request.gpu_count
            for gpu, count in shapes
        ):
            sold = sorted(count for gpu, count in shapes if gpu == request.gpu)
            doc["offer_note"] = (
                f"no machine carries {request.gpu_count}x{request.gpu} per node{scope.describe()} "
                f"(`gpuinfra new` rounds up at most {MAX_ROUND_UP_FACTOR}x; {request.gpu} per node there: "
                f"{', '.join(map(str, sold)) or 'none'})"
            )
    else:
        chosen = ranked[0] if ranked else None
    if chosen is None:
        doc.update(fits=False, recommendation=None, memory_per_gpu_gib=None, gpu_memory_gib=None, breakdown=None)
        return doc
    # one list: the request's defaults with the layout chosen here, then the time model's
    doc["assumptions"] = req.assumptions(chosen) + outside + time_assumptions(chosen.time)
    if chosen.recompute is not None:
        doc["recompute"] = chosen.recompute  # full where no recompute does not fit (recommend.evaluate)
    view = candidate_json(chosen)
    usable = chosen.fits and doc["interconnect_note"] is None and doc["offer_note"] is None
    best = chosen if usable else (ranked[0] if ranked else None)
    doc.update(
        gpus=view["gpus"],
        nodes=view["nodes"],
        total_gpus=view["total_gpus"],
        memory_per_gpu_gib=view["memory_per_gpu_gib"],
        gpu_memory_gib=view["gpu_memory_gib"],
        cpu_memory_per_node_gib=view["cpu_memory_per_node_gib"],
        fits=chosen.fits,
        margin_gib=view["margin_gib"],
        breakdown=chosen.breakdown.gib(),
        peak_phase=chosen.breakdown.phase,
        phases_gib=chosen.breakdown.phases_gib(),
        **{
            k: view[k]
            for k in (
                "training_hours",
                "compute_hours",
                "communication_hours",
                "bubble_hours",
                "mfu",
                "mfu_source",
                "layout",
                "time",
                "run_cost_usd",
                "price_per_hour_usd",
            )
        },
        recommendation=None
        if best is None
        else {
            "gpus": best.spec,
            "nodes": best.nodes,
            **best.offer,
            "price_per_hour_usd": candidate_json(best)["price_per_hour_usd"],
        },
    )
    doc["next_command"] = None if best is None else next_command(req, best, scope)
    if spot and req.method != "inference" and best is not None and best.offer:
        plan = checkpoint_plan(
            req.trained_params,
            best.nodes,
            best.offer["cloud"],
            best.storage_bandwidth_gbps,
            interruptions_per_node_hour,
        )
        doc["checkpoint_plan"] = plan.to_json()
    return doc


def _outside_gpu(gpus: str, gpu_memory_gib: float) -> tuple[int, str]:
    """(count, name) of ``--gpus NxNAME`` for a GPU outside the catalog, checked with
    ``--gpu-memory``.

    Raises:
        SizingError: a malformed spec, a count outside 1..16, or memory outside 1..1024 GiB.
    """
    match = re.fullmatch(r"\s*(\d+)\s*x\s*([A-Za-z0-9][A-Za-z0-9._-]{0,39})\s*", gpus)
    if not match or not 1 <= int(match.group(1)) <= 16:
        raise SizingError(f"--gpus with --gpu-memory must look like 1xRTX-4090 (1..16 GPUs), got {gpus!r}")
    if not 1 <= gpu_memory_gib <= 1024:
        raise SizingError(f"--gpu-memory must be 1..1024 GiB, got {gpu_memory_gib}")
    return int(match.group(1)), match.group(2).upper()


def next_command(req: SizingRequest, best: Candidate, scope: OfferScope) -> str:
    """The ``gpuinfra new`` command that plans ``best`` in ``scope``: the method's profile,
    ``--gpus``/``--nodes``,
    the scope's cloud and region, ``--spot`` when priced as spot, and for training sharded over
    nodes ``--instance-type`` (the high-bandwidth type it was priced on, so the planner does not
    take a cheaper type without EFA / GPUDirect for the same GPUs)."""
    parts = ["gpuinfra new", f"--profile {PROFILE_FOR_METHOD[req.method]}"]
    if req.sharded and best.nodes > 1 and best.offer:
        parts.append(f"--instance-type {best.offer['instance_type']}")
    else:
        parts.append(f"--gpus {best.spec}")
    parts.append(f"--nodes {best.nodes}")
    cloud = scope.cloud or (best.offer or {}).get("cloud")
    if scope.cloud or (req.sharded and best.nodes > 1 and cloud):
        parts.append(f"--cloud {cloud}")
    if scope.region:
        parts.append(f"--region {scope.region}")
    if best.offer and best.offer.get("market") == "spot":
        parts.append("--spot")
    return " ".join(parts)


@dataclass(frozen=True)
class StackSizing:
    """How ``gpuinfra new --model/--params`` sized a model into a GPU request.

    Attributes:
        request: the resolved sizing request (sequence 2048, the largest micro-batch that
            fits, bf16, the method's default strategy and recompute).
        candidates: every configuration that fits in the stack's scope, best first
            (:func:`gpuinfra.sizing.recommend.candidates`).
        profile: the workload profile of the method (``qlora`` -> ``qlora-finetune``).
        chosen: the configuration the planner accepted (None before planning).
        passed_over: ``"<gpus> x <nodes> node(s): <why the planner refused it>"`` for each better
            ranked configuration the planner refused (profile needs, node limits ...).
        checkpoint_plan: the spot checkpoint plan of the planned instance type (None unless spot
            and a training method).
    """

    request: SizingRequest
    candidates: tuple[Candidate, ...]
    profile: str
    chosen: Candidate | None = None
    passed_over: tuple[str, ...] = ()
    checkpoint_plan: CheckpointPlan | None = None

    @property
    def gpus(self) -> str:
        """``--gpus`` of the chosen (else the best) configuration, e.g. ``1xL4``."""
        return (self.chosen or self.candidates[0]).spec

    @property
    def nodes(self) -> int:
        """Node count of the chosen (else the best) configuration."""
        return (self.chosen or self.candidates[0]).nodes

    def planned(
        self,
        chosen: Candidate,
        passed_over: tuple[str, ...],
        catalog: Catalog,
        cloud: str,
        instance_type: str,
        spot: bool,
    ) -> StackSizing:
        """This sizing once the planner took ``chosen`` as ``instance_type`` on ``cloud``; the
        checkpoint plan reads that type's host NIC bandwidth (catalog facts
        ``host_nic_bandwidth_gbps``) when ``spot``."""
        plan = None
        if spot and self.request.method != "inference":
            facts = catalog.fact(cloud, instance_type)
            plan = checkpoint_plan(
                self.request.trained_params,
                chosen.nodes,
                cloud,
                None if facts is None else facts.host_nic_bandwidth_gbps,
            )
        return replace(self, chosen=chosen, passed_over=passed_over, checkpoint_plan=plan)

    def to_json(self) -> dict[str, Any]:
        """``{"model", "method", "gpus", "nodes", "memory_per_gpu_gib", "gpu_memory_gib",
        "breakdown", "peak_phase", "layout", "passed_over", "checkpoint_plan", "recompute",
        "recompute_source", "assumptions"}`` (``new --json`` ``sizing``; ``layout``:
        :meth:`gpuinfra.sizing.layout.Layout.to_json`, None for inference; ``recompute``: what
        it was sized with, ``recompute_source`` why full when no recompute did not fit, else
        None; ``assumptions`` as in ``gpuinfra size --json``)."""
        c = self.chosen or self.candidates[0]
        return {
            "model": self.request.shape.name,
            "method": self.request.method,
            "gpus": c.spec,
            "nodes": c.nodes,
            "memory_per_gpu_gib": round(c.memory_per_gpu_gib, 2),
            "gpu_memory_gib": c.gpu_memory_gib,
            "breakdown": c.breakdown.gib(),
            "peak_phase": c.breakdown.phase,
            "layout": None if c.layout is None else c.layout.to_json(),
            "passed_over": list(self.passed_over),
            "checkpoint_plan": None if self.checkpoint_plan is None else self.checkpoint_plan.to_json(),
            "recompute": c.recompute,
            "recompute_source": c.recompute_source,
            "assumptions": self.request.assumptions(c),
        }


def size_for_stack(
    model: str | None,
    params: str | None,
    method: str | None = None,
    catalog: Catalog | None = None,
    scope: OfferScope = OfferScope(),
    command: str = "new",
) -> StackSizing:
    """Every GPU configuration in ``scope`` that holds a model for ``method`` (default
    ``full``), at sequence length 2048, the largest micro-batch that fits, bf16 and the method's default strategy,
    best first; the caller plans them in order (:func:`gpuinfra.newstack.create_stack`).

    Args:
        command: the command whose flags the "nothing fits" hints name
            (:func:`gpuinfra.sizing.recommend.nothing_fits`).

    Raises:
        SizingError: neither or both of ``model`` / ``params``, or a bad value.
        CatalogError: an unknown cloud, region or zone in ``scope``.
        NoOfferError: no configuration in the scope fits (exit 4).
    """
    method = method or "full"
    req = sizing_request(model, params, method)
    catalog = catalog or load_catalog()
    validate_location(catalog, scope)
    ranked = candidates(req, catalog, scope)
    if not ranked:
        raise nothing_fits(req, scope, catalog, command)
    return StackSizing(req, tuple(ranked), PROFILE_FOR_METHOD[method])
