"""``gpuinfra offers``: every offer that fits a GPU request, cheapest first."""

from __future__ import annotations

from typing import Optional

import typer

from gpuinfra.cli import options


def offer_to_json(ranked, catalog) -> dict:
    """The JSON object of one ranked offer (stable keys, documented in README.md)."""
    offer = ranked.offer
    fact = catalog.fact(offer.cloud, offer.instance_type)
    return {
        "cloud": offer.cloud,
        "region": offer.region,
        "zone": offer.zone,
        "instance_type": offer.instance_type,
        "gpu": offer.gpu,
        "gpu_count": offer.gpu_count,
        "requested_gpu_count": ranked.requested_gpu_count,
        "round_up": ranked.round_up,
        "gpu_memory_gib": offer.gpu_memory_gib,
        "vcpus": offer.vcpus,
        "memory_gib": offer.memory_gib,
        "nodes": ranked.nodes,
        "pricing": "spot" if ranked.spot else "on-demand",
        "price_per_hour_usd": ranked.price_per_hour_usd,
        "price_per_gpu_hour_usd": round(ranked.price_per_gpu_hour_usd, 5),
        "on_demand_price_per_hour_usd": ranked.on_demand_price_per_hour_usd,
        "spot_price_per_hour_usd": ranked.spot_price_per_hour_usd,
        "spot_not_discounted": offer.spot_not_discounted,
        "host_price_per_hour_usd": (
            None if offer.cloud != "gcp" else _times(offer.host_on_demand_price_per_hour_usd if not ranked.spot else offer.host_spot_price_per_hour_usd, ranked.nodes)
        ),
        "accelerator_price_per_hour_usd": (
            None if offer.cloud != "gcp" else _times(offer.accelerator_on_demand_price_per_hour_usd if not ranked.spot else offer.accelerator_spot_price_per_hour_usd, ranked.nodes)
        ),
        "efa_interfaces": fact.max_efa_interfaces if fact else None,
        "gpu_nics": fact.gpu_nic_count if fact else None,
        "local_nvme_count": fact.local_ssd.bundled_count if fact else None,
        "local_nvme_size_gib": fact.local_ssd.size_gib if fact else None,
        "local_ssd_attach_counts": list(fact.local_ssd.attach_counts) if fact else None,
        "provisioning_models": list(fact.provisioning_models) if fact else None,
        "local_zone": offer.local_zone,
        "catalog_date": catalog.date_for(offer.cloud),
    }


def _times(value, nodes):
    return None if value is None else value * nodes


def _network_cell(fact) -> str:
    if fact is None:
        return "?"
    if fact.cloud == "aws":
        return f"{fact.max_efa_interfaces} EFA" if fact.max_efa_interfaces else "-"
    label = {"tcpx": "TCPX", "tcpxo": "TCPXO", "gib": "gIB RDMA"}.get(fact.nic_layout)
    return f"{fact.gpu_nic_count} GPU NICs ({label})" if label else "gVNIC"


def _nvme_cell(fact) -> str:
    if fact is None:
        return "-"
    lssd = fact.local_ssd
    if lssd.bundled_count:
        return f"{lssd.bundled_count}x{lssd.size_gib:.0f} GiB"
    if lssd.attach_counts:
        return f"{'/'.join(map(str, lssd.attach_counts[:4]))}{'...' if len(lssd.attach_counts) > 4 else ''}x{lssd.size_gib:.0f} GiB"
    return "-"


def offers(
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU request per node: 4xA100, A100:4, 8xH100, A100-80GB:8, 1xL4.", show_default=False),
    cloud: Optional[str] = options.Cloud,
    region: Optional[str] = options.Region,
    zone: Optional[str] = options.Zone,
    instance_type: Optional[str] = options.InstanceType,
    spot: bool = typer.Option(False, "--spot", help="Rank by spot price (offers without one are left out)."),
    nodes: int = options.Nodes,
    include_local_zones: bool = options.LocalZones,
    limit: Optional[int] = typer.Option(None, "--limit", help="Show at most N offers (table default 20; 0 = all).", show_default=False),
    as_json: bool = options.Json,
) -> None:
    """Rank every offer that fits the GPU request, cheapest total $/h first."""
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.errors import RequestError
    from gpuinfra.offers import OfferQuery, find_offers, request_from_instance_type
    from gpuinfra.requests import parse_gpu_spec

    catalog = load_catalog()
    if gpus:
        request = parse_gpu_spec(gpus, nodes)
    elif instance_type:
        request = request_from_instance_type(catalog, cloud, instance_type, nodes)
        parse_gpu_spec(f"{request.gpu_count}x{request.gpu}", nodes)
    else:
        raise RequestError("give --gpus (e.g. 4xA100) or --instance-type")
    if limit is not None and limit < 0:
        raise RequestError(f"--limit must be 0 (all) or more, got {limit}")
    query = OfferQuery(
        request=request, cloud=cloud, region=region, zone=zone, instance_type=instance_type,
        spot=spot, include_local_zones=include_local_zones,
    )
    ranked = find_offers(catalog, query)
    if as_json:
        from gpuinfra.cli.console import print_json

        shown = ranked if not limit else ranked[:limit]
        print_json([offer_to_json(r, catalog) for r in shown])
        return
    _print_table(ranked, catalog, request, spot, 20 if limit is None else limit)


def _print_table(ranked, catalog, request, spot: bool, limit: int) -> None:
    from rich.table import Table

    from gpuinfra.cli.console import stdout_console, usd

    shown = ranked if limit == 0 else ranked[:limit]
    dates = sorted({catalog.date_for(r.offer.cloud) for r in shown})
    pricing = "spot" if spot else "on-demand"
    from rich import box

    table = Table(
        box=box.SIMPLE_HEAD,
        title=f"{len(ranked)} offers for {request} ({pricing}, prices from catalog {', '.join(dates)})",
        title_justify="left",
    )
    for header, justify in [
        ("cloud", "left"), ("region", "left"), ("zone", "left"), ("instance", "left"),
        ("GPUs", "right"), ("vCPU", "right"), ("RAM GiB", "right"), ("$/h", "right"),
        ("$/GPU-h", "right"), ("spot $/h", "right"), ("EFA/NICs", "left"), ("NVMe", "left"),
    ]:
        table.add_column(header, justify=justify, no_wrap=header in ("instance", "zone"))
    notes = []
    for r in shown:
        o = r.offer
        fact = catalog.fact(o.cloud, o.instance_type)
        gpus_cell = f"{o.gpu_count}x{o.gpu}" + (" *" if r.round_up else "")
        spot_cell = usd(r.spot_price_per_hour_usd) + (" !" if o.spot_not_discounted else "")
        table.add_row(
            o.cloud, o.region, o.zone, o.instance_type, gpus_cell, f"{o.vcpus:g}", f"{o.memory_gib:g}",
            usd(r.price_per_hour_usd), usd(r.price_per_gpu_hour_usd, 3), spot_cell,
            _network_cell(fact), _nvme_cell(fact),
        )
        if r.round_up and r.round_up_note not in notes:
            notes.append(r.round_up_note)
    console = stdout_console()
    console.print(table)
    for text in notes:
        console.print(f"* round-up: {text}")
    if any(r.offer.spot_not_discounted for r in shown):
        console.print("! spot price in the snapshot is not below on-demand (data defect or no discount there)")
    if request.nodes > 1:
        console.print(f"Prices are totals for {request.nodes} nodes.")
    if len(shown) < len(ranked):
        console.print(f"{len(ranked) - len(shown)} more offers: use --limit 0 to see all, or --json.")
