"""``gpuinfra profiles``: list the workload profiles and their settings."""

from __future__ import annotations

from pathlib import Path

from gpuinfra.cli import options


def profiles(
    profiles_dir: Path | None = options.ProfilesDir,
    as_json: bool = options.Json,
) -> None:
    """List workload profiles (built-in and from --profiles-dir) with their settings."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.profiles import load_profiles

    loaded = load_profiles(profiles_dir)
    if as_json:
        print_json([p.model_dump(mode="json") for p in loaded.values()])
        return
    from rich.table import Table

    table = Table(title="workload profiles", title_justify="left")
    for header in (
        "profile",
        "placement",
        "fast network",
        "scratch",
        "spot",
        "idle / TTL",
        "root disk",
        "run h",
        "description",
    ):
        table.add_column(header)
    for p in loaded.values():
        table.add_row(
            p.name,
            p.placement,
            p.high_bandwidth_networking,
            f">= {p.scratch.min_gib} GiB" if p.scratch.required else "optional",
            p.spot.policy
            + (f" (ckpt {p.spot.checkpoint_interval_minutes} min)" if p.spot.checkpoint_interval_minutes else ""),
            f"{p.idle_timeout_minutes} min / {p.ttl_hours} h",
            f"{p.root_disk_gib} GiB",
            f"{p.default_run_hours:g}",
            p.description,
        )
    stdout_console().print(table)
