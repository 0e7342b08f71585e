"""``gpuinfra catalog``: show where the catalog comes from; refresh it from the clouds' APIs."""

from __future__ import annotations

from pathlib import Path

import typer

from gpuinfra.cli import options

app = typer.Typer(help="Inspect or rebuild the instance/price catalog.", no_args_is_help=True)


@app.command("show")
def show(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print the catalog in use: folder, snapshot date per cloud, sources, counts."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.cli.console import print_json, stdout_console

    info = load_catalog().summary()
    if as_json:
        print_json(info)
        return
    out = stdout_console()
    out.print(f"catalog: {info['path']}")
    for cloud, source in info["sources"].items():
        out.print(
            f"  {cloud}: {info['offers'].get(cloud, 0)} offers, {info['instance_types'].get(cloud, 0)} types, "
            f"prices of {source.get('date')} from {source.get('prices')}"
        )
    out.print(f"  GPUs: {', '.join(info['gpus'])}")
    for source in info["commitment_sources"].values():
        out.print(f"  commitments: {source['market']}, prices of {source['date']} from {source['source']}")


@app.command("refresh")
def refresh(
    cloud: str | None = typer.Option(None, "--cloud", help="aws or gcp (default: both).", show_default=False),
    out_dir: Path | None = typer.Option(
        None, "--out", help="Catalog folder to write (default: the user catalog folder).", show_default=False
    ),
    regions: str | None = typer.Option(
        None, "--regions", help="Comma-separated regions (default: all enabled).", show_default=False
    ),
    gcp_project: str | None = options.gcp_project_option("Project for the Compute machine-types call."),
    accept_price_cuts: bool = typer.Option(
        False,
        "--accept-price-cuts",
        help="Compare GCP on-demand prices with the fresh us-central1 prices only, not with the shipped catalog's (after a real price cut of more than 20%).",
    ),
) -> None:
    """Rebuild the catalog from the clouds' own APIs (needs credentials)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import stdout_console
    from gpuinfra.services.catalog_refresh import refresh_catalog

    result = refresh_catalog(
        clouds=[cloud] if cloud else ["aws", "gcp"],
        out_dir=out_dir,
        regions=[r.strip() for r in regions.split(",")] if regions else None,
        gcp_project=gcp_project,
        accept_price_cuts=accept_price_cuts,
    )
    out = stdout_console()
    for line in result.summary_lines():
        out.print(line)
