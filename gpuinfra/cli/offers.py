"""``gpuinfra offers``: every offer that fits a GPU request, cheapest first
(:func:`gpuinfra.offer_search.search_offers` ranks; this module parses and renders)."""

from __future__ import annotations

import typer

from gpuinfra.cli import options
from gpuinfra.cli.tables import Col


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
    gpus: str | None = typer.Option(
        None, "--gpus", help="GPU request per node: 4xA100, A100:4, 8xH100, A100-80GB:8, 1xL4.", show_default=False
    ),
    cloud: str | None = options.Cloud,
    region: str | None = options.Region,
    zone: str | None = options.Zone,
    instance_type: str | None = options.InstanceType,
    market: str | None = typer.Option(
        None,
        "--market",
        help="Market to rank by: on-demand, spot, flex (GCP flex-start / DWS), commit-1y or commit-3y (committed rate "
        "of on-demand VMs: AWS standard RI no upfront, GCP resource-based CUD). Offers without a price there, or of "
        "types the cloud does not sell there, are left out.",
    ),
    spot: bool = typer.Option(False, "--spot", help="Same as --market spot."),
    nodes: int = options.Nodes,
    include_local_zones: bool = options.LocalZones,
    limit: int | None = typer.Option(
        None, "--limit", help="Show at most N offers (table default 20; 0 = all).", show_default=False
    ),
    data: str | None = options.Data,
    data_region: str | None = options.DataRegion,
    data_size: str | None = options.DataSize,
    hours: float | None = typer.Option(
        None,
        "--hours",
        help="Run length in hours (needed with --data: it decides whether moving the data pays).",
        show_default=False,
    ),
    as_json: bool = options.Json,
    wide: bool = options.Wide,
) -> None:
    """Rank every offer that fits the GPU request, cheapest total $/h first (with --data: cheapest run)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.cli.console import print_json
    from gpuinfra.errors import RequestError
    from gpuinfra.offer_search import offer_json, run_json, search_offers

    if limit is not None and limit < 0:
        raise RequestError(f"--limit must be 0 (all) or more, got {limit}")
    catalog = load_catalog()
    found = search_offers(
        catalog,
        gpus=gpus,
        instance_type=instance_type,
        nodes=nodes,
        cloud=cloud,
        region=region,
        zone=zone,
        market=market,
        spot=spot,
        include_local_zones=include_local_zones,
        data=data,
        data_region=data_region,
        data_size=data_size,
        hours=hours,
    )
    if as_json:
        if found.runs is not None:
            print_json([run_json(r, catalog) for r in _shown(found.runs, limit, as_json)])
        else:
            print_json([offer_json(r, catalog) for r in _shown(found.ranked, limit, as_json)])
        return
    if found.runs is not None:
        _print_runs(found, limit, wide)
    elif found.query.market == "spot":
        _print_spot_table(found.ranked, found.query.request, limit, wide)
    else:
        _print_table(found.ranked, catalog, found.query.request, found.query.market, limit, wide)


def _shown(items: list, limit: int | None, as_json: bool) -> list:
    """What ``--limit`` shows: 0 = all; unset = all in JSON, 20 in the table."""
    if limit == 0 or (limit is None and as_json):
        return items
    return items[: 20 if limit is None else limit]


#: The ``--data`` table's columns; ``drop``: the order they go when the terminal is narrow.
RUN_COLUMNS = (
    Col("cloud", drop=4),
    Col("region", drop=5),
    Col("zone"),
    Col("instance"),
    Col("GPUs", "right"),
    Col("$/h", "right"),
    Col("compute $", "right", drop=2),
    Col("data $", "right", drop=3),
    Col("run $", "right"),
    Col("data route", drop=1),
)

#: The spot table's columns (see :data:`RUN_COLUMNS`).
SPOT_COLUMNS = (
    Col("location"),
    Col("instance"),
    Col("spot $/h", "right"),
    Col("range $/h", "right", drop=1),
    Col("spot date", drop=4),
    Col("od $/h", "right", drop=3),
    Col("intr/mo", drop=2),
)

#: The offers table's columns (see :data:`RUN_COLUMNS`): price, GPUs, type and zone stay.
OFFER_COLUMNS = (
    Col("cloud", drop=7),
    Col("region", drop=8),
    Col("zone"),
    Col("instance"),
    Col("GPUs", "right"),
    Col("vCPU", "right", drop=5),
    Col("RAM GiB", "right", drop=4),
    Col("market", drop=6),
    Col("$/h", "right"),
    Col("$/GPU-h", "right", drop=9),
    Col("other markets $/h", drop=2),
    Col("EFA/NICs", drop=3),
    Col("NVMe", drop=1),
)


def _print_runs(found, limit: int | None, wide: bool) -> None:
    from rich import box

    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import stdout_console, usd
    from gpuinfra.locality import cheapest_gpu_note

    runs, request, market, data_set, hours = (
        found.runs,
        found.query.request,
        found.query.market,
        found.data,
        found.hours,
    )
    shown = _shown(runs, limit, as_json=False)
    note = cheapest_gpu_note(runs)
    rows = []
    for r in shown:
        o = r.ranked.offer
        rows.append(
            (
                o.cloud,
                o.region,
                o.zone,
                o.instance_type,
                f"{o.gpu_count}x{o.gpu}",
                usd(r.ranked.price_per_hour_usd),
                usd(r.compute_usd),
                "?" if r.transfer.usd is None else usd(r.transfer.usd),
                "?" if r.run_usd is None else usd(r.run_usd),
                r.transfer.route,
            )
        )
    console = stdout_console()
    _print(
        console,
        RUN_COLUMNS,
        rows,
        wide,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        title=f"{len(runs)} offers for {request} ({market}), {float(hours):g} h run with {data_set.describe()}",
    )
    if note:
        console.print(f"note: {note}")
    unknown = [r for r in runs if r.run_usd is None]
    if unknown:
        console.print(f"? {len(unknown)} offers have no transfer price for their route: ranked last, never as free")


def _other_markets_cell(r) -> str:
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import usd

    cells = []
    for m, label in (("on-demand", "od"), ("spot", "spot"), ("flex-start", "flex")):
        if m == r.market:
            continue
        p = r.market_price_per_hour_usd(m)
        cells.append(
            f"{label} {usd(p) if p is not None else '-'}"
            + (" !" if m == "spot" and r.offer.spot_not_discounted else "")
        )
    return "  ".join(cells)


def _spot_range_cell(r) -> str:
    lo, hi = r.offer.spot_price_min_per_hour_usd, r.offer.spot_price_max_per_hour_usd
    if lo is None or hi is None:
        return "-"
    return f"{lo * r.nodes:,.2f}-{hi * r.nodes:,.2f}"


def _spot_date_cell(date: str) -> str:
    return "undated" if date.startswith("undated") else date


def _print_spot_table(ranked, request, limit: int | None, wide: bool) -> None:
    """The spot table: each price with its own source date, its window range where the source
    has one, and the AWS Spot Instance Advisor interruption band (fits 100 columns)."""
    from rich import box

    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import stdout_console, usd

    shown = _shown(ranked, limit, as_json=False)
    rows = []
    for r in shown:
        o = r.offer
        od = r.market_price_per_hour_usd("on-demand")
        rows.append(
            (
                f"aws {o.region}/{o.zone}" if o.cloud == "aws" else f"gcp {o.zone}",
                o.instance_type + (" *" if r.round_up else ""),
                usd(r.price_per_hour_usd) + (" !" if o.spot_not_discounted else ""),
                _spot_range_cell(r),
                _spot_date_cell(o.spot_price_date),
                "-" if od is None else usd(od),
                o.spot_interruption_band or "-",
            )
        )
    console = stdout_console()
    _print(
        console,
        SPOT_COLUMNS,
        rows,
        wide,
        box=box.SIMPLE_HEAD,
        title=f"{len(ranked)} offers for {request} (spot; each price with its source date)",
        title_justify="left",
        padding=(0, 1, 0, 0),
        pad_edge=False,
    )
    console.print(
        "spot $/h: AWS: the highest price of the dated window (the fleet's maximum price); "
        "GCP: the dated list price (no maximum price on GCP)."
    )
    undated = sorted({r.offer.spot_price_date for r in shown if _spot_date_cell(r.offer.spot_price_date) == "undated"})
    if undated:
        console.print(f"undated: from a snapshot without a date of its own: {', '.join(undated)}.")
    _print_footer(console, shown, ranked, request, "! spot price is not below on-demand: spot saves nothing there")


def _print_table(ranked, catalog, request, market: str, limit: int | None, wide: bool) -> None:
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import stdout_console, usd

    shown = _shown(ranked, limit, as_json=False)
    dates = sorted({catalog.date_for(r.offer.cloud) for r in shown})
    if any(r.commitment for r in shown):  # ranked by commitment rates: their sources' own dates
        sources = {catalog.commitments.source_of(r.commitment)["date"] for r in shown if r.commitment}
        dates = [f"commitments of {', '.join(sorted(sources))}; on-demand {', '.join(dates)}"]
    pricing = market
    from rich import box

    notes = []
    rows = []
    for r in shown:
        o = r.offer
        fact = catalog.fact(o.cloud, o.instance_type)
        gpus_cell = f"{o.gpu_count}x{o.gpu}" + (" *" if r.round_up else "")
        rows.append(
            (
                o.cloud,
                o.region,
                o.zone,
                o.instance_type,
                gpus_cell,
                f"{o.vcpus:g}",
                f"{o.memory_gib:g}",
                r.market,
                usd(r.price_per_hour_usd),
                usd(r.price_per_gpu_hour_usd, 3),
                _other_markets_cell(r),
                _network_cell(fact),
                _nvme_cell(fact),
            )
        )
        if r.round_up and r.round_up_note not in notes:
            notes.append(r.round_up_note)
    console = stdout_console()
    _print(
        console,
        OFFER_COLUMNS,
        rows,
        wide,
        box=box.SIMPLE_HEAD,
        title=f"{len(ranked)} offers for {request} ({pricing}, prices from catalog {', '.join(dates)})",
        title_justify="left",
    )
    for text in notes:
        console.print(f"* round-up: {text}")
    _print_footer(
        console,
        shown,
        ranked,
        request,
        "! spot price in the snapshot is not below on-demand (data defect or no discount there)",
    )


def _print(console, columns, rows, wide: bool, **table_kwargs) -> None:
    """Print a table fitted to the terminal (:mod:`gpuinfra.cli.tables`), then which columns
    the width left out."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.tables import dropped_note, print_table

    shown = print_table(console, columns, rows, wide=wide, **table_kwargs)
    hidden = dropped_note(columns, shown)
    if hidden:
        console.print(hidden, markup=False)


def _print_footer(console, shown, ranked, request, not_discounted: str) -> None:
    """The lines under an offers table: the spot = on-demand mark, node totals, what was left out."""
    if any(r.offer.spot_not_discounted for r in shown):
        console.print(not_discounted)
    if request.nodes > 1:
        console.print(f"Prices are totals for {request.nodes} nodes.")
    if len(shown) < len(ranked):
        console.print(f"{len(ranked) - len(shown)} more offers: use --limit 0 to see all, or --json.")
