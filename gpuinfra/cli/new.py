"""``gpuinfra new``: pick the best offer and write ``stacks/Pulumi.<stack>.yaml``
(:func:`gpuinfra.newstack.create_stack` does the work; this module parses and prints)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpuinfra.cli import options


def new(
    gpus: str | None = typer.Option(
        None, "--gpus", help="GPU request per node: 4xA100, A100:4, 8xH100 ...", show_default=False
    ),
    cloud: str | None = options.Cloud,
    region: str | None = options.Region,
    zone: str | None = options.Zone,
    instance_type: str | None = typer.Option(
        None, "--instance-type", help="Use this type (then --gpus is optional).", show_default=False
    ),
    nodes: int = options.Nodes,
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="Workload profile (see `gpuinfra profiles`; default llm-finetune, or the one for --method).",
        show_default=False,
    ),
    model: str | None = typer.Option(
        None, "--model", help="Size the cluster for this model (with --method) instead of --gpus.", show_default=False
    ),
    params: str | None = typer.Option(
        None, "--params", help="Size for a parameter count (7B) instead of --gpus.", show_default=False
    ),
    method: str | None = typer.Option(
        None, "--method", help="With --model/--params: pretrain | full | lora | qlora | inference.", show_default=False
    ),
    spot: bool = typer.Option(False, "--spot", help="Spot capacity (default: the profile's spot policy)."),
    on_demand: bool = typer.Option(
        False, "--on-demand", help="On-demand capacity (default: the profile's spot policy)."
    ),
    flex_start: bool = typer.Option(
        False,
        "--flex-start",
        help="GCP flex-start (Dynamic Workload Scheduler; the `offers --market flex` market): all nodes at once "
        "through a MIG resize request, run at most 7 days (profile ttl_hours <= 168). Not with --spot/--on-demand.",
    ),
    hours: float | None = typer.Option(
        None, "--hours", help="Expected run hours for the cost projection (default: the profile's).", show_default=False
    ),
    name: str | None = typer.Option(
        None, "--name", help="Stack name (default: <cloud>-<count>x<gpu>).", show_default=False
    ),
    capacity_reservation: str | None = typer.Option(
        None,
        "--capacity-reservation",
        help="AWS: launch into this On-Demand Capacity Reservation or Capacity Block (cr-...), read from EC2 in --region (needs credentials).",
        show_default=False,
    ),
    max_price_per_hour: float | None = typer.Option(
        None,
        "--max-price-per-hour",
        help="Budget in USD per hour for the whole stack: refused when its priced $/h is over it (also enforced by the CrossGuard policy pack).",
        show_default=False,
    ),
    spot_max_price: float | None = typer.Option(
        None,
        "--spot-max-price",
        help="AWS spot: the most the fleet may pay per instance-hour in USD (positive, not above on-demand; default: the budgeted spot price of the offer). GCP Spot VMs have no max price.",
        show_default=False,
    ),
    gcp_project: str | None = options.gcp_project_option("GCP project id written as gcp:project."),
    include_local_zones: bool = options.LocalZones,
    data: str | None = options.Data,
    data_region: str | None = options.DataRegion,
    data_size: str | None = options.DataSize,
    project_dir: Path = options.ProjectDir,
    profiles_dir: Path | None = options.ProfilesDir,
    image: str | None = typer.Option(
        None,
        "--image",
        help="Boot a baked image: baked:<bake name> (`gpuinfra image bake`); the stack records its id and manifest.",
        show_default=False,
    ),
    ssh_cidr: str | None = typer.Option(
        None,
        "--ssh-cidr",
        help="AWS: allow SSH (TCP 22) to the nodes from this IPv4 block only (default: none; use SSM Session Manager). A block open to the world (prefix shorter than /8) needs --allow-world-ssh.",
        show_default=False,
    ),
    allow_world_ssh: bool = typer.Option(
        False,
        "--allow-world-ssh",
        help="With --ssh-cidr: let it be open to the world (recorded as network.allow_world_ssh in the stack file).",
    ),
    fallback: int | None = typer.Option(
        None,
        "--fallback",
        help="Also write N (0 to 10) alternatives from the same ranking (other zones, regions, the other cloud unless "
        "--cloud pins one, the other market when the flags and profile allow; one per region and market before "
        "a second zone of any, kept in price order), each checked like the first and "
        "named <stack>-fb1 ... <stack>-fbN, with its $/h and its change against the first; alternatives over "
        "--max-price-per-hour are left out. The order is recorded in ladders/<stack>.yaml; `gpuinfra up <stack> "
        "--fallback` tries them in order. All files are written or none.",
        show_default=False,
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing stack file."),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Refuse an --instance-type that misses any setting of the profile (scratch, placement, EFA/GPU NICs) instead of writing the stack with one warning per missed setting.",
    ),
    as_json: bool = options.Json,
) -> None:
    """Plan a cluster for the request and write its Pulumi stack file (nothing is created in the cloud)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import note, print_json, stdout_console, usd
    from gpuinfra.cost.report import document_total, fill_advice, unpriced_lines
    from gpuinfra.money import Total
    from gpuinfra.newstack import NewStackRequest, create_stack
    from gpuinfra.offers import spot_price_note
    from gpuinfra.planner import PlanRequest
    from gpuinfra.requests import spot_choice, spot_max_price_usd
    from gpuinfra.services.ladder import write_ladder

    planned = PlanRequest(
        gpus=gpus,
        nodes=nodes,
        cloud=cloud,
        region=region,
        zone=zone,
        instance_type=instance_type,
        spot=spot_choice(spot, on_demand),
        hours=hours,
        name=name,
        gcp_project=gcp_project,
        include_local_zones=include_local_zones,
        max_price_per_hour_usd=max_price_per_hour,
        strict=strict,
        warnings_are_errors=strict,
        flex_start=flex_start,
    )
    stack_request = NewStackRequest(
        planned,
        profile=profile,
        model=model,
        params=params,
        method=method,
        capacity_reservation=capacity_reservation,
        data=data,
        data_region=data_region,
        data_size=data_size,
        profiles_dir=profiles_dir,
        image=image,
        ssh_cidr=ssh_cidr,
        allow_world_ssh=allow_world_ssh,
        spot_max_price_usd=None if spot_max_price is None else spot_max_price_usd(spot_max_price),
    )
    ladder = None
    if fallback is None:
        result = create_stack(stack_request, project_dir, force=force)
    else:
        ladder = write_ladder(stack_request, project_dir, fallback, force=force)
        result = ladder.first
    plan, written, summary, sized = result.plan, result.written, result.verified.cost, result.sizing
    for warning in plan.warnings:
        note(f"warning: {warning}")
    for line in result.preflight:
        note(f"preflight: {line}")
    if as_json:
        print_json(result.to_json() if ladder is None else {**result.to_json(), "ladder": ladder.to_json()})
        return
    spec, offer = plan.spec, plan.offer
    out = stdout_console()
    if sized is not None:
        doc = sized.to_json()
        out.print(
            f"sized {doc['model']} ({doc['method']}): {doc['memory_per_gpu_gib']:.1f} GiB per GPU "
            f"of {doc['gpu_memory_gib']:g} -> --gpus {sized.gpus} --nodes {sized.nodes}"
        )
        if doc.get("recompute_source"):
            out.print(f"  note: recompute {doc['recompute']}: {doc['recompute_source']}")
        for refused in sized.passed_over[:3]:
            out.print(f"  note: passed over {refused}")
        if len(sized.passed_over) > 3:
            out.print(f"  note: and {len(sized.passed_over) - 3} more configuration(s) (--json lists them)")
    out.print(
        f"[bold]{spec.stack}[/bold]: {spec.nodes} x {spec.instance_type} "
        f"({spec.gpu_count}x{spec.gpu} per node) in {spec.zone} ({spec.cloud} {spec.region}), "
        f"{result.pricing}, profile {spec.profile.name}"
    )
    if offer.round_up:
        out.print(f"  note: {offer.round_up_note}")
    if spec.spot:
        out.print(f"  {spot_price_note(offer.offer, spec.spot_max_price_per_hour_usd)}")
    if plan.spot_from_profile:
        out.print(f"  note: spot chosen because profile {spec.profile.name} prefers it (--on-demand to change)")
    if spec.data is not None:
        out.print(
            f"  data: {spec.data.size_gb:f} GB in {spec.data.uri or spec.data.location} ({spec.data.cloud} "
            f"{spec.data.location}); the cost below moves it once"
        )
    if plan.locality_note:
        out.print(f"  note: {plan.locality_note}")
    hourly, run = document_total(summary, "hourly_usd"), document_total(summary, "run_usd")
    totals = (
        f"{hourly.text(suffix='/h')}, {run.text()} for a {spec.run_hours:g} h run"
        if hourly.complete
        else f"{hourly.text()} ({spec.run_hours:g} h run)"
    )
    compute = (
        f"{usd(offer.price_per_hour_usd)}/h ({usd(offer.price_per_gpu_hour_usd, 3)}/GPU-h)"
        if plan.compute_price_per_hour_usd is not None
        else f"no {spec.market} price in the catalog (the total is incomplete)"
    )
    out.print(
        f"  compute: {compute}; "
        f"all {len(result.verified.preview.resources)} resources: {totals} (catalog {plan.catalog_date}; "
        f"breakdown: gpuinfra cost {spec.stack})"
    )
    out.print(
        f"  30 days left running would cost {document_total(summary, 'monthly_if_left_running_usd').text()}; "
        f"nodes end themselves after {spec.profile.idle_timeout_minutes} min idle or at "
        f"{spec.expires_at:%Y-%m-%d %H:%M} UTC"
    )
    kept = summary["left_after_down"]
    kept_total = Total.from_json(kept["monthly_usd"], kept["lines_without_price"])
    out.print(
        f"  left after down: {kept_total.text(suffix='/month')} (the kept bucket; `gpuinfra cost {spec.stack}` lists it)"
        if kept["lines"]
        else "  left after down: nothing (the bucket is deleted with the stack)"
    )
    for path in written.scaffolded:
        out.print(f"  scaffolded {path}")
    out.print(f"  wrote {written.stack_file}")
    missing = unpriced_lines(summary)
    if missing:
        note(
            f"warning: no total: {len(missing)} line(s) have no price, so `gpuinfra cost "
            f"{spec.stack}` exits 4: {'; '.join(missing)}" + (f"; {advice}" if (advice := fill_advice(summary)) else "")
        )
    alt = result.alternative
    if alt is not None:
        where = alt.offer.offer
        flag = f"--region {where.region}" if where.region != spec.region else f"--zone {where.zone}"
        note(
            f"note: complete total in {where.region}: {usd(alt.compute_price_per_hour_usd)}/h compute, "
            f"{usd(alt.run_usd)} for the {spec.run_hours:g} h run ({where.instance_type} {alt.market} in "
            f"{where.zone}); rerun with {flag} --force to write that stack instead"
        )
    if spec.cloud == "gcp" and not spec.gcp_project:
        note(
            f"warning: no GCP project set; before `gpuinfra up` run: pulumi config set gcp:project <id> -s {spec.stack}"
        )
    if ladder is not None:
        _print_ladder(out, ladder)
        out.print(f"next: gpuinfra preview {spec.stack}   then   gpuinfra up {spec.stack} --fallback")
        return
    out.print(f"next: gpuinfra preview {spec.stack}   then   gpuinfra up {spec.stack}")


def _print_ladder(out, written) -> None:
    """The fallback ladder as a table: rung, stack, place, market, $/h and the change against the first."""
    from rich.table import Table

    ladder = written.ladder
    table = Table(
        title=f"fallback ladder {ladder.first}: {len(ladder.rungs) - 1} of {written.asked} alternative(s), "
        f"tried in this order by `gpuinfra up {ladder.first} --fallback`",
        title_justify="left",
    )
    for header in (
        "rung",
        "stack",
        "cloud",
        "region",
        "zone",
        "type",
        "market",
        "$/h",
        "vs first $/h",
        "run",
        "vs first run",
    ):
        table.add_column(header, justify="right" if "$" in header or "run" in header else "left")
    for index, rung in enumerate(ladder.rungs):
        table.add_row(
            str(index),
            rung.stack,
            rung.cloud,
            rung.region,
            rung.zone,
            rung.instance_type,
            rung.market,
            rung.hourly.text(suffix="/h"),
            "-" if index == 0 else rung.hourly_change.text(signed=True),
            rung.run.text(),
            "-" if index == 0 else rung.run_change.text(signed=True),
        )
    out.print(table)
    for why in written.passed_over:
        out.print(f"  passed over {why}", soft_wrap=True, markup=False)
    if len(ladder.rungs) - 1 < written.asked:
        out.print(
            f"  note: {len(ladder.rungs) - 1} written: no more offers of the ranking pass the checks"
            + (" within --max-price-per-hour" if ladder.max_price_per_hour_usd is not None else "")
        )
    out.print(
        f"  wrote {len(ladder.rungs)} stack file(s) and {written.record_file}; line by line: gpuinfra cost diff {ladder.first} <rung>"
    )
