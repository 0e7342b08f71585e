"""Options shared by several commands (defined once)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpuinfra.agent.constants import SYNC_REQUEST_WAIT_SECONDS  # imports nothing: cheap at CLI start-up

Cloud = typer.Option(None, "--cloud", help="aws or gcp (default: both).", show_default=False)
Region = typer.Option(None, "--region", help="Region, e.g. us-east-1 or us-central1.", show_default=False)
Zone = typer.Option(
    None,
    "--zone",
    help="AWS AZ ID (use1-az4; AZ names differ per account) or GCP zone (us-central1-a).",
    show_default=False,
)
InstanceType = typer.Option(None, "--instance-type", help="Restrict to one instance/machine type.", show_default=False)
Nodes = typer.Option(1, "--nodes", help="Number of nodes; --gpus counts GPUs per node.")
LocalZones = typer.Option(False, "--include-local-zones", help="Also consider AWS Local Zones.")
Json = typer.Option(False, "--json", help="Print JSON on stdout instead of a table.")
Wide = typer.Option(
    False,
    "--wide",
    help="Show every table column, however wide (default: drop low-priority columns to fit $COLUMNS, "
    "the terminal, or 80 columns).",
)


def _project_dir(value: Path) -> Path:
    """``--project-dir``: a path the file system takes, with room for ``stacks/Pulumi.<stack>.yaml``
    of the longest stack name (100 characters); whether it must exist is each command's matter."""
    # imported on use: CLI start-up time
    from gpuinfra.errors import ProjectDirError

    try:
        (Path(value) / "stacks" / f"Pulumi.{'x' * 100}.yaml").exists()
    except OSError as exc:  # ENAMETOOLONG: too long for the file system
        raise ProjectDirError(f"--project-dir {str(value)[:80]}... cannot be used: {exc.strerror or exc}") from None
    return value


ProjectDir = typer.Option(
    Path("."), "--project-dir", help="Pulumi project folder (stacks/ lives here).", callback=_project_dir
)


def _profiles_folder(value: Path | None) -> Path | None:
    """``--profiles-dir`` (or ``$GPUINFRA_PROFILES_DIR``) must be an existing folder."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.profiles import check_profiles_folder

    return check_profiles_folder(value)


def _gcp_project(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    """``--gcp-project`` or ``$GOOGLE_CLOUD_PROJECT``: a value from the environment is checked
    here, so a bad one is reported as the variable's, not as a flag the user never gave."""
    source = ctx.get_parameter_source(param.name or "")
    # compared by name: typer ships its own copy of click, whose ParameterSource is another enum
    if value is not None and getattr(source, "name", None) == "ENVIRONMENT":
        # imported on use: CLI start-up time
        from gpuinfra.spec import check_gcp_project_id

        check_gcp_project_id(value, flag="$GOOGLE_CLOUD_PROJECT (no --gcp-project given)")
    return value


def gcp_project_option(help_text: str):
    """A ``--gcp-project`` option that falls back to ``$GOOGLE_CLOUD_PROJECT`` (see :func:`_gcp_project`)."""
    return typer.Option(
        None, "--gcp-project", envvar="GOOGLE_CLOUD_PROJECT", help=help_text, show_default=False, callback=_gcp_project
    )


ProfilesDir: Path | None = typer.Option(
    None,
    "--profiles-dir",
    help="Folder of user profile YAML files (or $GPUINFRA_PROFILES_DIR).",
    show_default=False,
    callback=_profiles_folder,
)
Data = typer.Option(
    None,
    "--data",
    help="Training data location, s3://bucket/prefix or gs://bucket/prefix: offers are ranked by compute for the run "
    "plus moving the data there (the bucket's region and size are looked up).",
    show_default=False,
)
DataRegion = typer.Option(
    None,
    "--data-region",
    help="Region the data lives in (us-east-1, us-central1) instead of a lookup.",
    show_default=False,
)
DataSize = typer.Option(
    None,
    "--data-size",
    help="Size of the data set (2TB, 500GiB; GB without a unit) instead of listing the bucket.",
    show_default=False,
)
SyncTimeoutSeconds = typer.Option(
    SYNC_REQUEST_WAIT_SECONDS,
    "--sync-timeout-seconds",
    min=0,
    help="Before destroying, ask the running nodes to upload their checkpoints and wait up to this many seconds "
    "for every node's ack (0: do not ask).",
)
