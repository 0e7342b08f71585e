"""``gpuinfra new``: pick the best offer and write ``stacks/Pulumi.<stack>.yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gpuinfra.cli import options


def new(
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU request per node: 4xA100, A100:4, 8xH100 ...", show_default=False),
    cloud: Optional[str] = options.Cloud,
    region: Optional[str] = options.Region,
    zone: Optional[str] = options.Zone,
    instance_type: Optional[str] = typer.Option(None, "--instance-type", help="Use this type (then --gpus is optional).", show_default=False),
    nodes: int = options.Nodes,
    profile: Optional[str] = typer.Option(None, "--profile", help="Workload profile (see `gpuinfra profiles`; default llm-finetune, or the one for --method).", show_default=False),
    model: Optional[str] = typer.Option(None, "--model", help="Size the cluster for this model (with --method) instead of --gpus.", show_default=False),
    params: Optional[str] = typer.Option(None, "--params", help="Size for a parameter count (7B) instead of --gpus.", show_default=False),
    method: Optional[str] = typer.Option(None, "--method", help="With --model/--params: pretrain | full | lora | qlora | inference.", show_default=False),
    spot: bool = typer.Option(False, "--spot", help="Spot capacity (default: the profile's spot policy)."),
    on_demand: bool = typer.Option(False, "--on-demand", help="On-demand capacity (default: the profile's spot policy)."),
    hours: Optional[float] = typer.Option(None, "--hours", help="Expected run hours for the cost projection (default: the profile's).", show_default=False),
    name: Optional[str] = typer.Option(None, "--name", help="Stack name (default: <cloud>-<count>x<gpu>).", show_default=False),
    capacity_reservation: Optional[str] = typer.Option(None, "--capacity-reservation", help="AWS: launch into this On-Demand Capacity Reservation or Capacity Block (cr-...), read from EC2 in --region (needs credentials).", show_default=False),
    max_price_per_hour: Optional[float] = typer.Option(None, "--max-price-per-hour", help="Budget in USD per hour for the whole stack: refused when its priced $/h is over it (also enforced by the CrossGuard policy pack).", show_default=False),
    gcp_project: Optional[str] = typer.Option(None, "--gcp-project", envvar="GOOGLE_CLOUD_PROJECT", help="GCP project id written as gcp:project.", show_default=False),
    include_local_zones: bool = options.LocalZones,
    data: Optional[str] = options.Data,
    data_region: Optional[str] = options.DataRegion,
    data_size: Optional[str] = options.DataSize,
    project_dir: Path = options.ProjectDir,
    profiles_dir: Optional[Path] = options.ProfilesDir,
    force: bool = typer.Option(False, "--force", help="Replace an existing stack file."),
    strict: bool = typer.Option(False, "--strict", help="Refuse an --instance-type that misses any setting of the profile (scratch, placement, EFA/GPU NICs) instead of writing the stack with one warning per missed setting."),
    as_json: bool = options.Json,
) -> None:
    """Plan a cluster for the request and write its Pulumi stack file (nothing is created in the cloud)."""
    from datetime import datetime, timezone

    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.cli.console import note, print_json, stdout_console, usd
    from gpuinfra.planner import PlanRequest, plan_cluster
    from gpuinfra.profiles import get_profile
    from gpuinfra.stackfile import write_stack

    from gpuinfra.errors import RequestError
    from gpuinfra.profiles import DEFAULT_PROFILE
    from gpuinfra.requests import spot_choice

    capacity = spot_choice(spot, on_demand)
    sized = None
    if model or params:
        if gpus or instance_type:
            raise RequestError("give either --model/--params (sized for you) or --gpus/--instance-type, not both")
        from gpuinfra.cli.size import build_request, size_document
        from gpuinfra.sizing.recommend import PROFILE_FOR_METHOD, nothing_fits

        method = method or "full"
        sizing = build_request(model, params, method, 2048, 1, "bf16", None, None, None)
        sized = size_document(sizing, None, 1)
        if not sized.get("recommendation"):
            raise nothing_fits(sizing)
        gpus, nodes = sized["recommendation"]["gpus"], sized["recommendation"]["nodes"]
        profile = profile or PROFILE_FOR_METHOD[method]
    elif method:
        raise RequestError("--method goes with --model or --params")
    resolved = get_profile(profile or DEFAULT_PROFILE, profiles_dir)
    catalog = load_catalog()
    reservation = None
    if capacity_reservation:
        from gpuinfra.capacity import describe_capacity_reservation

        if not region:
            raise RequestError("--capacity-reservation needs --region (EC2 reads reservations per region)")
        reservation = describe_capacity_reservation(capacity_reservation, region)
    from gpuinfra.datasource import resolve_data_set

    data_set = resolve_data_set(data, data_region, data_size)
    plan = plan_cluster(
        catalog,
        PlanRequest(
            gpus=gpus, nodes=nodes, cloud=cloud, region=region, zone=zone, instance_type=instance_type,
            spot=capacity, hours=hours, name=name, gcp_project=gcp_project, include_local_zones=include_local_zones,
            capacity_reservation=reservation, max_price_per_hour_usd=max_price_per_hour, data=data_set, strict=strict, warnings_are_errors=strict,
        ),
        resolved,
        datetime.now(timezone.utc),
    )
    # The real program runs offline before anything is written: a spec the blueprint rejects
    # never reaches the disk, and the summary below prices every resource, not just compute.
    from gpuinfra.cost.report import cost_summary
    from gpuinfra.preview import run_preview_cached
    from gpuinfra.stackfile import provider_config

    from gpuinfra.rules import verify_stack

    previewed = run_preview_cached(plan.spec, provider_config(plan.spec))
    summary = cost_summary(plan.spec, previewed.resources)
    verify_stack(plan.spec, previewed.resources, catalog, summary)  # refuses before anything is written
    written = write_stack(plan, project_dir, force=force)
    for warning in plan.warnings:
        note(f"warning: {warning}")
    spec, offer = plan.spec, plan.offer
    pricing = "spot" if spec.spot else "on-demand"
    if as_json:
        print_json({
            "stack": spec.stack,
            "stack_file": str(written.stack_file),
            "scaffolded": [str(p) for p in written.scaffolded],
            "cloud": spec.cloud, "region": spec.region, "zone": spec.zone,
            "instance_type": spec.instance_type, "gpu": spec.gpu, "gpu_count": spec.gpu_count,
            "nodes": spec.nodes, "pricing": pricing, "profile": spec.profile.name,
            "round_up": offer.round_up,
            "price_per_hour_usd": offer.price_per_hour_usd,
            "run_hours": spec.run_hours,
            "run_cost_usd": plan.run_cost_usd,
            "catalog_date": plan.catalog_date,
            "expires_at": spec.expires_at.isoformat(),
            "next": f"pulumi up -s {spec.stack}",
            "resources": len(previewed.resources),
            "cost": summary,
            "data": None if spec.data is None else spec.data.model_dump(mode="json"),
            "locality_note": plan.locality_note or None,
            "warnings": list(plan.warnings),
            "sizing": None if sized is None else {k: sized[k] for k in ("memory_per_gpu_gib", "gpu_memory_gib", "breakdown", "method")},
        })
        return
    out = stdout_console()
    if sized is not None:
        out.print(f"sized {sized['model']['name']} ({sized['method']}): {sized['memory_per_gpu_gib']:.1f} GiB per GPU "
                  f"-> --gpus {gpus} --nodes {nodes}")
    out.print(
        f"[bold]{spec.stack}[/bold]: {spec.nodes} x {spec.instance_type} "
        f"({spec.gpu_count}x{spec.gpu} per node) in {spec.zone} ({spec.cloud} {spec.region}), "
        f"{pricing}, profile {spec.profile.name}"
    )
    if offer.round_up:
        out.print(f"  note: {offer.round_up_note}")
    if plan.spot_from_profile:
        out.print(f"  note: spot chosen because profile {spec.profile.name} prefers it (--on-demand to change)")
    if spec.data is not None:
        out.print(f"  data: {spec.data.size_gb:f} GB in {spec.data.uri or spec.data.location} ({spec.data.cloud} "
                  f"{spec.data.location}); the cost below moves it once")
    if plan.locality_note:
        out.print(f"  note: {plan.locality_note}")
    from decimal import Decimal

    out.print(
        f"  compute: {usd(offer.price_per_hour_usd)}/h ({usd(offer.price_per_gpu_hour_usd, 3)}/GPU-h); "
        f"all {len(previewed.resources)} resources: {usd(Decimal(summary['hourly_usd']))}/h, "
        f"{usd(Decimal(summary['run_usd']))} for a {spec.run_hours:g} h run (catalog {plan.catalog_date}; "
        f"breakdown: gpuinfra cost {spec.stack})"
    )
    out.print(f"  30 days left running would cost {usd(Decimal(summary['monthly_usd_if_left_running']))}; "
              f"nodes end themselves after {spec.profile.idle_timeout_minutes} min idle or at "
              f"{spec.expires_at:%Y-%m-%d %H:%M} UTC")
    for path in written.scaffolded:
        out.print(f"  scaffolded {path}")
    out.print(f"  wrote {written.stack_file}")
    missing = summary["price_not_found"]
    if missing:
        note(f"warning: the totals above leave out {len(missing)} line(s) with no price, so `gpuinfra cost "
             f"{spec.stack}` exits 4: {'; '.join(missing)}")
    if spec.cloud == "gcp" and not spec.gcp_project:
        note(f"warning: no GCP project set; before `pulumi up` run: pulumi config set gcp:project <id> -s {spec.stack}")
    out.print(f"next: gpuinfra preview {spec.stack}   then   pulumi up -s {spec.stack}")
