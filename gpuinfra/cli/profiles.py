"""``gpuinfra profiles``: list the workload profiles and their settings."""

from __future__ import annotations

from pathlib import Path

from gpuinfra.cli import options
from gpuinfra.cli.tables import Col

#: The profiles table's columns; ``drop``: the order they go when the terminal is narrow
#: (:mod:`gpuinfra.cli.tables`); the description wraps.
PROFILE_COLUMNS = (
    Col("profile"),
    Col("placement", drop=3),
    Col("fast network", drop=4),
    Col("scratch", drop=2),
    Col("spot", drop=5),
    Col("idle / TTL", drop=6),
    Col("root disk", drop=1),
    Col("run h", drop=0),
    Col("description", fold=True, fold_min=20, drop=7),
)


def profiles(
    profiles_dir: Path | None = options.ProfilesDir,
    as_json: bool = options.Json,
    wide: bool = options.Wide,
) -> None:
    """List workload profiles (built-in and from --profiles-dir) with their settings."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.profiles import load_profiles

    loaded = load_profiles(profiles_dir)
    if as_json:
        print_json([p.model_dump(mode="json") for p in loaded.values()])
        return
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.tables import dropped_note, print_table

    rows = [
        (
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
        for p in loaded.values()
    ]
    out = stdout_console()
    shown = print_table(out, PROFILE_COLUMNS, rows, wide=wide, title="workload profiles", title_justify="left")
    hidden = dropped_note(PROFILE_COLUMNS, shown)
    if hidden:
        out.print(hidden, markup=False)
