"""Write ``stacks/Pulumi.<stack>.yaml`` (and scaffold a Pulumi project when needed).

Everything is rendered in memory first; files are then written atomically (temporary file +
rename) and all or nothing (:class:`~gpuinfra.fsutil.NewFiles`), so bad input, a folder that
cannot be written or any other failure never leaves a half-written stack or scaffold behind.
An existing stack file is never replaced without ``force``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import yaml

from gpuinfra import __version__
from gpuinfra.capacity import CapacityBlockPrice, CapacityReservation
from gpuinfra.errors import FileExistsGpuinfraError, ProjectDirError, SpecError
from gpuinfra.fsutil import NewFiles, folder_problem
from gpuinfra.plan.purchase import PURCHASE_CONFIG_KEY, PurchaseSpec
from gpuinfra.planner import Plan
from gpuinfra.spec import NAME_SUFFIX_RE, ClusterSpec, check_stack_name
from gpuinfra.templating import render
from gpuinfra.userfile import read_user_file

PROJECT_NAME = "gpuinfra"
STACKS_DIRNAME = "stacks"


@dataclass(frozen=True)
class WrittenFiles:
    """Paths ``write_stack`` created or replaced (the stack file, plus scaffold files if any)."""

    stack_file: Path
    scaffolded: tuple[Path, ...]


def stack_file_path(project_dir: Path, stack: str) -> Path:
    """``<project_dir>/stacks/Pulumi.<stack>.yaml``."""
    return Path(project_dir) / STACKS_DIRNAME / f"Pulumi.{stack}.yaml"


def provider_config(spec: ClusterSpec) -> dict[str, str]:
    """Provider settings of the stack: ``aws:region`` or ``gcp:project/region/zone``."""
    if spec.cloud == "aws":
        return {"aws:region": spec.region}
    config = {"gcp:region": spec.region, "gcp:zone": spec.zone}
    if spec.gcp_project:
        config = {"gcp:project": spec.gcp_project, **config}
    return config


def render_stack(
    plan: Plan,
    generated_at: datetime | None = None,
    image_config: dict | None = None,
    checkpoint_plan: dict | None = None,
) -> str:
    """The stack file's text for ``plan``; with ``image_config`` (a baked image's manifest and id,
    :meth:`gpuinfra.bake.stack.BakedImage.config`) also ``gpuinfra:image``; with
    ``checkpoint_plan`` (a spot stack sized from a model: :func:`gpuinfra.sizing.checkpoint.checkpoint_plan`)
    also ``gpuinfra:checkpoint_plan``, for the reader (the program does not read it)."""
    spec = plan.spec
    offer = plan.offer
    generated_at = generated_at or datetime.now(UTC)
    pricing = spec.market
    summary = (
        f"{spec.nodes} x {spec.instance_type} ({spec.gpu_count}x{spec.gpu} each) in {spec.zone} "
        f"({spec.region}), {pricing}, profile {spec.profile.name}"
    )
    hourly, run = plan.compute_price_per_hour_usd, plan.run_cost_usd
    price_line = (
        f"${hourly:.2f}/h {pricing} for the cluster, ${run:.2f} for {spec.run_hours:g} h"
        if hourly is not None and run is not None
        else f"no {pricing} price in the catalog for {offer.offer.instance_type} in {spec.zone}: the cost is incomplete"
    )
    text = render(
        "stack.yaml.j2",
        spec=spec,
        spec_config=spec.to_config(),
        provider_config=provider_config(spec),
        version=__version__,
        generated_at=generated_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        summary=summary,
        price_line=price_line,
        catalog_date=plan.catalog_date,
        expires_at=spec.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    extra = {}
    if image_config:  # the baked image the cluster uses, recorded once (gpuinfra/bake/stack.py)
        extra["gpuinfra:image"] = image_config
    if checkpoint_plan:  # spot: how often to checkpoint and whether a save fits the notice
        extra["gpuinfra:checkpoint_plan"] = checkpoint_plan
    if extra:
        block = yaml.safe_dump(extra, sort_keys=False, width=100)
        text = text.rstrip("\n") + "\n" + "".join(f"  {line}\n" for line in block.splitlines())
    return text


def check_project_to_list(project_dir: Path) -> None:
    """A ``--project-dir`` a listing (``ls``, ``reap``, ``image ls``) can read: an existing folder
    whose ``stacks`` is a folder or absent (no stacks yet); a typo is refused, never "0 stacks".

    Raises:
        ProjectDirError: the folder does not exist or is a file, or its ``stacks`` is a file (exit 2).
    """
    problem = folder_problem(Path(project_dir))
    if problem:
        raise ProjectDirError(f"--project-dir {project_dir} {problem}")
    stacks = Path(project_dir) / STACKS_DIRNAME
    if stacks.exists() and not stacks.is_dir():
        raise ProjectDirError(f"{stacks} is a file, not a folder: stack files live in the folder {STACKS_DIRNAME}/")


def read_stack_config(project_dir: Path, stack: str) -> dict:
    """The ``config`` mapping of ``stacks/Pulumi.<stack>.yaml``, read through the one user-file
    reader (:func:`gpuinfra.userfile.read_user_file`: UTF-8 YAML, no duplicate keys, bounded
    depth and alias expansion, finite numbers, no symlink out of the project folder).

    Raises:
        SpecError: a name Pulumi does not allow for a stack, no such stack file (the message lists
            the stacks there), or a file that is not a stack file (one line naming the file and
            the problem).
    """
    path = stack_file_path(project_dir, check_stack_name(stack))
    if not path.exists() and not path.is_symlink():
        known = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in path.parent.glob("Pulumi.*.yaml"))
        hint = f" Stacks in {path.parent}: {', '.join(known)}." if known else ""
        raise SpecError(f"no stack {stack!r}: {path} does not exist.{hint}")
    doc = read_user_file(path, kind="stack file", error=SpecError, root=Path(project_dir))
    config = doc.get("config")
    if not isinstance(config, dict):
        raise SpecError(f"stack file {path}: 'config' must be a mapping of Pulumi config keys")
    return config


def read_stack_spec(project_dir: Path, stack: str) -> ClusterSpec:
    """Read ``gpuinfra:cluster`` back from a stack file.

    Raises:
        SpecError: no such stack file, not a readable stack file (:func:`read_stack_config`), an
            invalid spec, or a spec whose ``stack`` is not the name in the file name (Pulumi
            picks the file by the stack's name).
    """
    path = stack_file_path(project_dir, stack)
    value = read_stack_config(project_dir, stack).get("gpuinfra:cluster")
    if value is None:
        raise SpecError(f"{path} has no gpuinfra:cluster config (was it written by `gpuinfra new`?)")
    if not isinstance(value, dict):
        raise SpecError(f"stack file {path}: gpuinfra:cluster must be a mapping, not {type(value).__name__}")
    spec = ClusterSpec.from_config(value)
    if spec.stack != stack:
        raise SpecError(
            f"{path} holds stack {spec.stack!r}, not {stack!r}: Pulumi reads stack {stack!r} from "
            f"Pulumi.{stack}.yaml, so gpuinfra:cluster.stack must be {stack!r} (or rename the file "
            f"to Pulumi.{spec.stack}.yaml)"
        )
    return spec


def check_stack_free(project_dir: Path, stack: str) -> None:
    """Refuse a stack name a stack file of this project folder already has (``gpuinfra new``
    checks it before planning, :func:`write_stack` again when writing).

    Raises:
        FileExistsGpuinfraError: ``stacks/Pulumi.<stack>.yaml`` exists (exit 5); nothing is written.
    """
    target = stack_file_path(project_dir, stack)
    try:
        exists = target.exists()
    except OSError as exc:  # e.g. ENAMETOOLONG
        raise ProjectDirError(f"--project-dir {project_dir} cannot be used: {exc.strerror or exc}") from None
    if exists:
        raise _exists(target)


def recorded_name_suffix(project_dir: Path, stack: str) -> str | None:
    """The ``gpuinfra:cluster.name_suffix`` an existing stack file holds, or None (no file, not
    readable, none recorded): ``new --force`` keeps it, so the stack's cloud names never change."""
    try:
        suffix = read_stack_config(project_dir, stack)["gpuinfra:cluster"].get("name_suffix")
    except (SpecError, KeyError, TypeError, AttributeError):
        return None
    return suffix if isinstance(suffix, str) and NAME_SUFFIX_RE.match(suffix) else None


def write_stack(
    plan: Plan,
    project_dir: Path,
    force: bool = False,
    image_config: dict | None = None,
    checkpoint_plan: dict | None = None,
) -> WrittenFiles:
    """Render and write the stack file; scaffold ``Pulumi.yaml`` + ``program/`` if absent.

    All or nothing: when any file cannot be written, the files and folders written so far are
    removed again.

    Args:
        plan: the planned cluster.
        project_dir: folder of the Pulumi project (created if missing).
        force: replace an existing stack file.
        image_config: ``gpuinfra:image`` of a baked image (see :func:`render_stack`).
        checkpoint_plan: ``gpuinfra:checkpoint_plan`` of a spot stack sized from a model.

    Raises:
        FileExistsGpuinfraError: the stack file exists and ``force`` is False.
        ProjectDirError: ``project_dir`` exists but is not a folder, or a file or folder in it
            cannot be written (no permission, read-only file system, disk full).
    """
    stack_text = render_stack(plan, image_config=image_config, checkpoint_plan=checkpoint_plan)
    written = write_stack_files([(plan.spec.stack, stack_text)], project_dir, force=force)
    return WrittenFiles(stack_file=written.stack_file, scaffolded=written.scaffolded)


@dataclass(frozen=True)
class WrittenStacks:
    """What :func:`write_stack_files` wrote.

    Attributes:
        stack_files: the stack files, in the order given.
        scaffolded: the project files scaffolded (empty when the project existed).
        extra: the other files written (``also``), in the order given.
    """

    stack_files: tuple[Path, ...]
    scaffolded: tuple[Path, ...]
    extra: tuple[Path, ...] = ()

    @property
    def stack_file(self) -> Path:
        """The first stack file."""
        return self.stack_files[0]


def write_stack_files(
    stacks: list[tuple[str, str]], project_dir: Path, force: bool = False, also: dict[Path, str] | None = None
) -> WrittenStacks:
    """Write rendered stack files (and ``also``: other project files, e.g. a fallback ladder's
    record) all or nothing, scaffolding ``Pulumi.yaml`` + ``program/`` if absent: when any file
    cannot be written, or the write is interrupted, the files and folders written so far are
    removed again and replaced files get their old content back (:class:`~gpuinfra.fsutil.NewFiles`).

    Args:
        stacks: ``(stack name, stack file text)`` pairs (:func:`render_stack`).
        project_dir: folder of the Pulumi project (created if missing).
        force: replace existing stack files (the ``also`` files are always replaced).
        also: path -> text of the other files, written after the stack files.

    Raises:
        FileExistsGpuinfraError: a stack file exists and ``force`` is False (nothing written).
        ProjectDirError: as :func:`write_stack`.
    """
    project_dir = Path(project_dir)
    if project_dir.exists() and folder_problem(project_dir):
        raise ProjectDirError(f"--project-dir {project_dir} {folder_problem(project_dir)}")
    targets = [stack_file_path(project_dir, name) for name, _ in stacks]
    for target in targets:
        if target.exists() and not force:
            raise _exists(target)
    scaffold: dict[Path, str] = {}
    if not (project_dir / "Pulumi.yaml").exists():
        scaffold[project_dir / "Pulumi.yaml"] = render("Pulumi.yaml.j2", project_name=PROJECT_NAME)
        scaffold[project_dir / "program" / "__main__.py"] = render("program_main.py.j2")
    extra = dict(also or {})
    try:
        with NewFiles() as files:
            for path, text in scaffold.items():
                files.write(path, text)
            for target, (_, text) in zip(targets, stacks, strict=True):
                files.write(target, text, exclusive=not force)
            for path, text in extra.items():
                files.write(path, text)
    except FileExistsError as exc:
        if Path(exc.filename2 or "") in targets:  # another process wrote it since the check above
            raise _exists(Path(exc.filename2 or "")) from None
        raise _not_writable(exc, project_dir) from None
    except OSError as exc:
        raise _not_writable(exc, project_dir) from None
    return WrittenStacks(tuple(targets), tuple(scaffold), tuple(extra))


def purchased_block_price(project_dir: Path, block: CapacityReservation) -> CapacityBlockPrice | None:
    """The fee recorded by the purchase stack in ``project_dir`` that bought a block like ``block``
    (same instance type, count, AZ, start and end), or None.

    Returns:
        The recorded fee with its source (the offering and the purchase stack) and the day it was
        read; None when no purchase stack matches or a stack file is unreadable.
    """
    folder = Path(project_dir) / "stacks"
    if not block.capacity_block or not folder.is_dir():
        return None
    for path in sorted(folder.glob("Pulumi.*.yaml")):
        try:
            doc = read_user_file(path, kind="stack file", error=SpecError, root=Path(project_dir))
            config = doc.get("config")
            raw = config.get(f"gpuinfra:{PURCHASE_CONFIG_KEY}") if isinstance(config, dict) else None
            if raw is None:
                continue
            spec = PurchaseSpec.from_config(raw)
        except SpecError:
            continue
        same = (
            spec.instance_type == block.instance_type
            and spec.instance_count == block.total_instance_count
            and spec.availability_zone == block.availability_zone
            and spec.start == block.start_date
            and spec.end == block.end_date
        )
        if same:
            return CapacityBlockPrice(
                Decimal(spec.upfront_usd),
                f"bought with purchase stack {spec.stack}: {spec.price_source}"[:300],
                spec.price_date,
            )
    return None


def purchase_stacks(project_dir: Path) -> set[str]:
    """Names of the stack files in ``project_dir`` that hold a purchase (``gpuinfra:purchase``,
    written by ``gpuinfra plan --buy``): ``ls`` and ``reap`` leave them out (no nodes, no TTL;
    destroying one refunds nothing). Files the user-file reader refuses are not purchases (``ls``
    lists them as ``INVALID``)."""
    found = set()
    for path in sorted((Path(project_dir) / "stacks").glob("Pulumi.*.yaml")):
        try:
            doc = read_user_file(path, kind="stack file", error=SpecError, root=Path(project_dir))
        except SpecError:
            continue
        config = doc.get("config")
        if isinstance(config, dict) and f"gpuinfra:{PURCHASE_CONFIG_KEY}" in config:
            found.add(path.name[len("Pulumi.") : -len(".yaml")])
    return found


def write_one_stack_file(project_dir: Path, stack: str, text: str, force: bool, taken_hint: str) -> Path:
    """Write ``text`` as ``stacks/Pulumi.<stack>.yaml`` (all or nothing), for the stack kinds that
    are one file (a bake, a purchase).

    Args:
        taken_hint: what to do when the file exists, after "already exists; " (e.g. "pass --force ...").

    Raises:
        FileExistsGpuinfraError: the file exists and not ``force`` (exit 5).
        ProjectDirError: ``project_dir`` cannot be written (exit 2).
    """
    project_dir = Path(project_dir)
    if project_dir.exists() and folder_problem(project_dir):
        raise ProjectDirError(f"--project-dir {project_dir} {folder_problem(project_dir)}")
    target = stack_file_path(project_dir, stack)
    if target.exists() and not force:
        raise FileExistsGpuinfraError(f"stack file {target} already exists; {taken_hint}")
    try:
        with NewFiles() as files:
            files.write(target, text, exclusive=not force)
    except OSError as exc:
        raise ProjectDirError(
            f"cannot write {exc.filename or target}: {exc.strerror or exc} (nothing was written)"
        ) from None
    return target


def _exists(target: Path) -> FileExistsGpuinfraError:
    return FileExistsGpuinfraError(
        f"stack file {target} already exists; pass --force to replace it or --name to pick another stack"
    )


def _not_writable(exc: OSError, project_dir: Path) -> ProjectDirError:
    where = exc.filename or project_dir
    return ProjectDirError(
        f"cannot write {where}: {exc.strerror or exc}; --project-dir {project_dir} must be a "
        "folder you can write (nothing was written)"
    )
