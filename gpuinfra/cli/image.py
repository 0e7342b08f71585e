"""``gpuinfra image bake|record|preview``: prebaked machine images and training containers
(:mod:`gpuinfra.bake` does the work; this module parses and prints)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpuinfra.cli import options
from gpuinfra.money import incomplete_text


def next_step(spec) -> str:
    """The command after ``image bake`` (AWS: ``up`` builds and records; GCP: ``up`` starts the
    build, ``record --from-outputs`` once it finished)."""
    if spec.cloud == "aws":
        return (
            f"gpuinfra up {spec.stack}   (builds the container and the AMI and records them)   then   "
            f"gpuinfra down {spec.stack}   (its NAT gateway bills by the hour; the image stays)"
        )
    return f"gpuinfra up {spec.stack}   (starts the build)   then   gpuinfra image record {spec.stack} --from-outputs"


app = typer.Typer(
    help="Bake a node family's machine image and training container (a Pulumi stack of its own: "
    "`gpuinfra up <name>` builds it, `gpuinfra down <name>` removes the build resources and keeps "
    "the image), use it with `gpuinfra new --image baked:<name>`.",
    no_args_is_help=True,
)

_DEFAULT_REGION = {"aws": "us-east-1", "gcp": "us-central1"}


@app.command("bake")
def bake(
    cloud: str = typer.Option(..., "--cloud", help="aws or gcp."),
    family: str = typer.Option(..., "--family", help="Node family: AWS p5 (or p5.48xlarge), GCP a3-megagpu-8g."),
    base_image: str | None = typer.Option(
        None, "--base-image", help="Pinned base image: ami-... or projects/P/global/images/NAME.", show_default=False
    ),
    base_arch: str | None = typer.Option(
        None,
        "--base-arch",
        help="Architecture of --base-image: x86_64 or arm64 (AWS default x86_64; GCP: from the image name).",
        show_default=False,
    ),
    container_base: str | None = typer.Option(
        None,
        "--container-base",
        help="Training container base, repo:tag@sha256:... (default: the profile's container_image).",
        show_default=False,
    ),
    require_digest: bool = typer.Option(
        True, "--require-digest/--no-require-digest", help="Refuse a container base without a digest."
    ),
    driver_branch: str | None = typer.Option(
        None,
        "--driver-branch",
        help="NVIDIA driver branch the base carries (default: AWS 580, the DLAMI's; GCP: from the image name, e.g. nvidia-570).",
        show_default=False,
    ),
    region: str | None = typer.Option(
        None, "--region", help="Build and image region (default us-east-1 / us-central1).", show_default=False
    ),
    zone: str | None = typer.Option(None, "--zone", help="GCP build zone (default <region>-a).", show_default=False),
    gcp_project: str | None = options.gcp_project_option("GCP project of the image."),
    profile: str | None = typer.Option(
        None, "--profile", help="Workload profile (container image and driver branch defaults).", show_default=False
    ),
    name: str | None = typer.Option(
        None, "--name", help="Bake (stack) name (default bake-<family>).", show_default=False
    ),
    project_dir: Path = options.ProjectDir,
    profiles_dir: Path | None = options.ProfilesDir,
    force: bool = typer.Option(False, "--force", help="Replace an existing bake stack file."),
    as_json: bool = options.Json,
) -> None:
    """Write the bake stack of a node family (previewed and checked offline first; nothing is built)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.bake.plan import BakeRequest
    from gpuinfra.bake.stack import create_bake
    from gpuinfra.cli.console import print_json, stdout_console

    request = BakeRequest(
        cloud=cloud,
        family=family,
        region=region or _DEFAULT_REGION.get(cloud, ""),
        base_image=base_image,
        container_base=container_base or "",
        zone=zone,
        base_architecture=base_arch,
        require_digest=require_digest,
        driver_branch=driver_branch,
        name=name,
        gcp_project=gcp_project,
    )
    made = create_bake(request, project_dir, profile=profile, profiles_dir=profiles_dir, force=force)
    m = made.spec.manifest
    if as_json:
        print_json(
            {
                "stack": made.spec.stack,
                "stack_file": str(made.stack_file),
                "manifest": m.to_config(),
                "manifest_sha256": m.sha256,
                "resources": [{"type": r.type, "name": r.name} for r in made.resources],
                "cost": made.cost,
                "notes": made.notes,
            }
        )
        return
    out = stdout_console()
    out.print(
        f"[bold]{made.spec.stack}[/bold]: {m.cloud} {m.family} ({m.fabric}) on {m.base_image}, container base "
        f"{m.container_base}; {len(made.resources)} resources, manifest sha256 {m.sha256[:12]}"
    )
    _print_cost(out, made.cost)
    for note in made.notes:
        out.print(f"  note: {note}")
    out.print(f"  wrote {made.stack_file}")
    out.print(f"next: {next_step(made.spec)}", markup=False)


def _print_cost(out, cost: dict) -> None:
    """One line per cost component, then the totals (or, in their place, "incomplete: N lines
    without a price")."""

    for line in cost["lines"]:
        usd = f"${line['usd']}" if line["usd"] is not None else "price not found"
        out.print(f"  cost {line['when']}: {line['component']}: {line['quantity']} {line['unit']} -> {usd}")

    def total(when: str, key: str) -> str:
        missing = sum(1 for line in cost["lines"] if line["when"] == when and line["usd"] is None)
        return incomplete_text(missing) if cost[key] is None else f"${cost[key]}"

    once, monthly = total("once", "once_usd"), total("monthly", "monthly_usd")
    out.print(f"  cost: {once} per bake, {monthly} per month while the image is kept")
    if any(line["when"] == "stack" for line in cost["lines"]):
        stack = total("stack", "stack_monthly_usd")
        out.print(
            f"  cost: {stack} per month while the bake stack exists: `gpuinfra down` it once the image is recorded"
        )


@app.command("cost")
def cost(
    name: str = typer.Argument(..., help="Bake name."),
    project_dir: Path = options.ProjectDir,
    as_json: bool = options.Json,
) -> None:
    """Price a bake: the build once, image and registry storage per month, and (AWS) the NAT gateway per month while the bake stack exists (exit 4 when a price is missing)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.bake.cost import bake_cost
    from gpuinfra.bake.stack import read_bake
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.errors import PriceMissingError

    doc = bake_cost(read_bake(project_dir, name))
    if as_json:
        print_json(doc)
    else:
        _print_cost(stdout_console(), doc)
    if doc["price_not_found"]:
        raise PriceMissingError(doc["price_not_found"])


@app.command("ls")
def ls(project_dir: Path = options.ProjectDir, as_json: bool = options.Json) -> None:
    """List the project's bakes: cloud, family, fabric, recorded image id; unreadable stack files as invalid."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.bake.stack import bake_listing
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.stackfile import check_project_to_list

    check_project_to_list(Path(project_dir))
    bakes, invalid = bake_listing(project_dir)
    rows = [
        {
            "name": b.stack,
            "cloud": b.cloud,
            "family": b.manifest.family,
            "fabric": b.manifest.fabric,
            "image_id": b.result.image_id if b.result else None,
            "manifest_sha256": b.manifest.sha256,
            "invalid": None,
        }
        for b in bakes
    ] + [
        {"name": name, **dict.fromkeys(("cloud", "family", "fabric", "image_id", "manifest_sha256")), "invalid": reason}
        for name, reason in invalid
    ]
    if as_json:
        print_json(rows)
        return
    out = stdout_console()
    for row in rows:
        if row["invalid"]:
            out.print(f"{row['name']}  INVALID  {row['invalid']}", markup=False)
            continue
        out.print(
            f"{row['name']}  {row['cloud']} {row['family']} ({row['fabric']})  "
            f"{row['image_id'] or 'not built yet (gpuinfra up ' + str(row['name']) + ')'}",
            markup=False,
        )
    if not rows:
        out.print(f"no bakes in {project_dir / 'stacks'} (gpuinfra image bake ...)")


@app.command("record")
def record(
    name: str = typer.Argument(..., help="Bake name."),
    image_id: str | None = typer.Option(
        None, "--image-id", help="The bake's image: ami-... or projects/P/global/images/NAME.", show_default=False
    ),
    container_image: str = typer.Option("", "--container-image", help="The bake's container (repo@sha256:...)."),
    from_outputs: bool = typer.Option(
        False,
        "--from-outputs",
        help="Take them from the deployed bake stack (AWS: outputs, container digest from ECR; GCP: newest image of the bake's family).",
    ),
    project_dir: Path = options.ProjectDir,
) -> None:
    """Record a finished bake's image in its stack file (then `gpuinfra new --image baked:NAME`); `gpuinfra up` does this on AWS."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.bake.stack import record_result
    from gpuinfra.cli.console import stdout_console
    from gpuinfra.errors import RequestError

    if from_outputs == (image_id is not None) or (from_outputs and container_image):
        raise RequestError("give either --from-outputs, or --image-id (and --container-image)")
    if from_outputs:
        # imported on use: CLI start-up time (only the command that runs loads its library modules)
        from gpuinfra.bake.deploy import record_from_outputs
        from gpuinfra.bake.stack import read_bake
        from gpuinfra.lifecycle import check_credentials, make_backend

        spec = read_bake(project_dir, name)
        backend = make_backend()
        check_credentials(spec.cloud)
        spec = record_from_outputs(Path(project_dir), spec, backend.outputs(Path(project_dir), name))
    else:
        assert image_id is not None  # --image-id without --from-outputs (checked above)
        spec = record_result(project_dir, name, image_id, container_image)
    result = spec.result
    assert result is not None  # recorded just above
    container = f", container {result.container_image}" if result.container_image else ""
    stdout_console().print(
        f"{name}: image {result.image_id}{container} recorded; use: gpuinfra new ... --image baked:{name}",
        markup=False,
        soft_wrap=True,
    )


@app.command("preview")
def preview(
    name: str = typer.Argument(..., help="Bake name."),
    project_dir: Path = options.ProjectDir,
    as_json: bool = options.Json,
) -> None:
    """Preview a bake stack offline: every resource, checked against the conformance rules."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.bake.preview import check_bake, run_bake_preview
    from gpuinfra.bake.stack import read_bake
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.errors import RuleViolationError

    spec = read_bake(project_dir, name)
    result = run_bake_preview(spec)
    violations = check_bake(result.resources)
    if violations:
        raise RuleViolationError(violations)
    if as_json:
        print_json(result.to_json())
        return
    out = stdout_console()
    for r in result.resources:
        out.print(f"{r.type}  {r.name}")
    for note in result.notes:
        out.print(f"note: {note}")
