"""``gpuinfra catalog``: show where the catalog comes from; refresh it from the clouds' APIs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(help="Inspect or rebuild the instance/price catalog.", no_args_is_help=True)


@app.command("show")
def show(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print the catalog in use: folder, snapshot date per cloud, sources, counts."""
    from collections import Counter

    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.cli.console import print_json, stdout_console

    catalog = load_catalog()
    counts = Counter(o.cloud for o in catalog.offers)
    info = {
        "path": str(catalog.path),
        "catalog_date": catalog.catalog_date,
        "sources": catalog.meta.get("sources", {}),
        "offers": dict(counts),
        "instance_types": {c: len(catalog.instance_types(c)) for c in sorted(counts)},
        "gpus": sorted({o.gpu for o in catalog.offers}),
    }
    if as_json:
        print_json(info)
        return
    out = stdout_console()
    out.print(f"catalog: {info['path']}")
    for cloud, source in info["sources"].items():
        out.print(f"  {cloud}: {counts.get(cloud, 0)} offers, {info['instance_types'].get(cloud, 0)} types, "
                  f"prices of {source.get('date')} from {source.get('prices')}")
    out.print(f"  GPUs: {', '.join(info['gpus'])}")


@app.command("refresh")
def refresh(
    cloud: Optional[str] = typer.Option(None, "--cloud", help="aws or gcp (default: both).", show_default=False),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Catalog folder to write (default: the user catalog folder).", show_default=False),
    regions: Optional[str] = typer.Option(None, "--regions", help="Comma-separated regions (default: all enabled).", show_default=False),
    gcp_project: Optional[str] = typer.Option(None, "--gcp-project", envvar="GOOGLE_CLOUD_PROJECT", help="Project for the Compute machine-types call.", show_default=False),
    accept_price_cuts: bool = typer.Option(False, "--accept-price-cuts", help="Compare GCP on-demand prices with the fresh us-central1 prices only, not with the shipped catalog's (after a real price cut of more than 20%)."),
) -> None:
    """Rebuild the catalog from the clouds' own APIs (needs credentials)."""
    from gpuinfra.catalog.refresh import refresh_catalog
    from gpuinfra.cli.console import stdout_console

    clouds = [cloud] if cloud else ["aws", "gcp"]
    if gcp_project is not None and "gcp" in clouds:
        from gpuinfra.spec import check_gcp_project_id

        check_gcp_project_id(gcp_project)
    result = refresh_catalog(
        clouds=clouds,
        out_dir=out_dir,
        regions=[r.strip() for r in regions.split(",")] if regions else None,
        gcp_project=gcp_project,
        accept_price_cuts=accept_price_cuts,
    )
    out = stdout_console()
    for line in result.summary_lines():
        out.print(line)
