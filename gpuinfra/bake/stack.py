"""Bake stack files: write one (``gpuinfra image bake``), record its result (``gpuinfra image
record``), and hand a finished bake to a cluster (``gpuinfra new --image baked:<name>``).

A bake lives in ``stacks/Pulumi.<name>.yaml`` of the same Pulumi project, config
``gpuinfra:bake``. A cluster made from it copies the bake's image id into its own spec
(``ami_id`` / ``gcp_image``) and the manifest into ``gpuinfra:image``; the cluster's program
reads only its own stack file, so re-baking never changes an existing cluster (a new cluster
stack, or ``gpuinfra new --force``, picks up the new image).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

from gpuinfra import __version__
from gpuinfra.bake import BAKE_CONFIG_KEY
from gpuinfra.bake.cost import bake_cost
from gpuinfra.bake.model import DIGEST_RE, BakeResult, BakeSpec, SoftwareManifest
from gpuinfra.bake.plan import plan_bake
from gpuinfra.bake.preview import bake_provider_config, check_bake, run_bake_preview
from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import BakeError, RuleViolationError, SpecError
from gpuinfra.fsutil import atomic_write_text
from gpuinfra.profiles import DEFAULT_PROFILE, get_profile
from gpuinfra.spec import BakedImageRef
from gpuinfra.stackfile import read_stack_config, stack_file_path, write_one_stack_file

#: ``gpuinfra new --image`` value naming a bake.
BAKED_PREFIX = "baked:"


def render_bake_stack(spec: BakeSpec, generated_at: datetime | None = None) -> str:
    """The bake stack file's text (provider config + ``gpuinfra:bake``)."""
    stamp = (generated_at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    m = spec.manifest
    build = (
        f"gpuinfra up {spec.stack}   (Image Builder builds the container and the AMI; `up` records both here)"
        if spec.cloud == "aws"
        else f"gpuinfra up {spec.stack}   (starts the Cloud Build run)   then   gpuinfra image record {spec.stack} "
        "--from-outputs"
    )
    header = (
        f'# Pulumi stack "{spec.stack}" of the gpuinfra project: an image bake, written by gpuinfra {__version__} on {stamp}.\n'
        f"# {m.cloud} {m.family} ({m.fabric}) on base {m.base_image}, container base {m.container_base}.\n"
        f"#\n# Review:  gpuinfra image preview {spec.stack}   (offline)\n"
        f"# Build:   {build}\n"
        f"# Use:     gpuinfra new ... --image baked:{spec.stack}\n"
        f"# Remove:  gpuinfra down {spec.stack}   (the build resources; the image stays for the clusters that boot it)\n"
        + (
            "#          Run it once the image is recorded: the bake's NAT gateway bills every hour the stack exists.\n"
            if spec.cloud == "aws"
            else ""
        )
    )
    config = {**bake_provider_config(spec), f"gpuinfra:{BAKE_CONFIG_KEY}": spec.to_config()}
    return header + yaml.safe_dump({"config": config}, sort_keys=False, width=100)


def write_bake_stack(spec: BakeSpec, project_dir: Path, force: bool = False) -> Path:
    """Write ``stacks/Pulumi.<name>.yaml`` for ``spec`` (all or nothing).

    Raises:
        FileExistsGpuinfraError: the file exists and not ``force`` (exit 5).
        ProjectDirError: ``project_dir`` cannot be written (exit 2).
    """
    return write_one_stack_file(
        project_dir,
        spec.stack,
        render_bake_stack(spec),
        force,
        "pass --force to replace it or --name to pick another bake",
    )


def read_bake(project_dir: Path, name: str) -> BakeSpec:
    """The bake spec of ``stacks/Pulumi.<name>.yaml``.

    Raises:
        BakeError: no such file, or it is not a bake stack (exit 2).
        SpecError: an invalid ``gpuinfra:bake``.
    """
    path = stack_file_path(project_dir, name)
    if not path.exists() and not path.is_symlink():
        raise BakeError(f"no bake {name!r}: {path} does not exist (create it with `gpuinfra image bake`)")
    value = read_stack_config(project_dir, name).get(f"gpuinfra:{BAKE_CONFIG_KEY}")
    if value is None:
        raise BakeError(f"{path} is not a bake stack (no gpuinfra:{BAKE_CONFIG_KEY})")
    if not isinstance(value, dict):
        raise SpecError(f"stack file {path}: gpuinfra:{BAKE_CONFIG_KEY} must be a mapping, not {type(value).__name__}")
    return BakeSpec.from_config(value)


def record_result(
    project_dir: Path, name: str, image_id: str, container_image: str = "", root_snapshot_gib: int | None = None
) -> BakeSpec:
    """Store a finished bake's outputs in its stack file (replacing an earlier result).

    ``root_snapshot_gib``: the image's root disk size as the cloud describes it (None: not read;
    clusters then take the bake's ``build_volume_size_gib``).

    Raises:
        BakeError: no such bake, an image id of the other cloud, or a container without a
            digest for a bake that pins its container.
        SpecError: a malformed image id.
    """
    spec = read_bake(project_dir, name)
    if (spec.cloud == "aws") != image_id.startswith("ami-"):
        raise BakeError(
            f"--image-id {image_id!r} is not a {spec.cloud} image id "
            f"({'ami-...' if spec.cloud == 'aws' else 'projects/P/global/images/NAME'})"
        )
    if container_image and spec.manifest.container_pinned and not DIGEST_RE.match(container_image):
        raise BakeError(
            f"--container-image {container_image!r} has no digest and bake {name!r} pins its container; "
            "give repo@sha256:<64 hex>, or let `gpuinfra image record "
            f"{name} --from-outputs` look the digest up"
        )
    try:
        result = BakeResult(image_id=image_id, container_image=container_image, root_snapshot_gib=root_snapshot_gib)
    except ValueError as exc:
        raise SpecError(f"--image-id {image_id!r}: {exc.errors()[0]['msg']}") from None  # type: ignore[attr-defined]
    recorded = spec.model_copy(update={"result": result})
    atomic_write_text(stack_file_path(project_dir, name), render_bake_stack(recorded))
    return recorded


#: ``<account>.dkr.ecr.<region>.amazonaws.com[.cn]/<repository>[:tag][@sha256:...]`` (ECR registry
#: URI: docs.aws.amazon.com/AmazonECR/latest/userguide/Registries.html).
_ECR_IMAGE_RE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?P<cn>\.cn)?/"
    r"(?P<repository>[a-z0-9._/-]+?)(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


def container_repository(spec: BakeSpec, container_image: str) -> str:
    """The repository a bake's nodes may pull from (:attr:`gpuinfra.spec.BakedImageRef.container_repository`):
    AWS the ECR repository ARN of ``container_image``
    (``arn:<partition>:ecr:<region>:<account>:repository/<name>``: Service Authorization
    Reference, Amazon ECR resource types); GCP the bake's Artifact Registry repository
    ``gpuinfra-<bake>`` in its region (blueprints/gcp/bake.py); "" when there is none.
    """
    if spec.cloud == "gcp":
        return f"projects/{spec.gcp_project}/locations/{spec.region}/repositories/gpuinfra-{spec.stack}"
    match = _ECR_IMAGE_RE.match(container_image)
    if not match:
        return ""
    partition = "aws-cn" if match["cn"] else "aws"
    return f"arn:{partition}:ecr:{match['region']}:{match['account']}:repository/{match['repository']}"


@dataclass(frozen=True)
class BakedImage:
    """A finished bake as a cluster uses it: the image id, the container the nodes run (AWS:
    the bake's ECR container; GCP: the manifest's container base, which the bake pulled onto the
    image under that reference), the manifest to record and the spec's
    :class:`~gpuinfra.spec.BakedImageRef`."""

    image_id: str
    container_image: str
    manifest: SoftwareManifest
    ref: BakedImageRef

    def config(self) -> dict:
        """``gpuinfra:image`` of the cluster's stack file: the manifest, the image id, the
        container and the manifest's SHA-256."""
        return {
            "image_id": self.image_id,
            "container_image": self.container_image,
            "manifest_sha256": self.manifest.sha256,
            "manifest": self.manifest.to_config(),
        }


def _bake_name(value: str) -> str:
    if not value.startswith(BAKED_PREFIX) or not value[len(BAKED_PREFIX) :]:
        raise BakeError(f"--image {value!r}: use baked:<bake name> (see `gpuinfra image ls`)")
    return value[len(BAKED_PREFIX) :]


def baked_image_targets(project_dir: Path, value: str) -> tuple[str, tuple[str, ...], str, str]:
    """``(cloud, instance_types, fabric, region)`` of the bake ``--image baked:<name>`` names:
    ``new`` plans on that cloud when no ``--cloud`` is given, on its type when it was baked for
    one type and no ``--instance-type`` is given, in its region when no ``--region`` is given,
    and counts the fabric the image carries as installed
    (:attr:`gpuinfra.planner.PlanRequest.image_fabric`).

    Raises:
        BakeError: not ``baked:<name>``, or no such bake.
    """
    spec = read_bake(project_dir, _bake_name(value))
    return spec.cloud, spec.manifest.instance_types, spec.manifest.fabric, spec.region


def list_bakes(project_dir: Path) -> list[BakeSpec]:
    """Every bake stack of the project (files with ``gpuinfra:bake``), by name; cluster stacks
    and unreadable files are skipped."""
    return bake_listing(project_dir)[0]


def bake_listing(project_dir: Path) -> tuple[list[BakeSpec], list[tuple[str, str]]]:
    """``gpuinfra image ls``: the project's bakes by name, and ``(name, reason)`` of every stack
    file that is unreadable as a stack file (so it could be a bake) or is a bake with an invalid
    ``gpuinfra:bake``. Cluster stacks are left out (``gpuinfra ls`` lists them)."""
    found: list[BakeSpec] = []
    invalid: list[tuple[str, str]] = []
    for path in sorted((Path(project_dir) / "stacks").glob("Pulumi.*.yaml")):
        name = path.name[len("Pulumi.") : -len(".yaml")]
        try:
            found.append(read_bake(project_dir, name))
        except BakeError:
            continue  # a cluster stack
        except SpecError as exc:
            invalid.append((name, str(exc).replace("\n", "; ")))
    return found, invalid


def baked_image(project_dir: Path, value: str, cloud: str, instance_type: str, region: str) -> BakedImage:
    """Resolve ``--image baked:<name>`` for a cluster of ``cloud`` / ``instance_type`` in ``region``.

    Raises:
        BakeError: not ``baked:<name>``, no such bake, another cloud, family or region (an AMI or
            GCP bake is used in its own region; copy it first), or no image id recorded yet (exit 2).
    """
    name = _bake_name(value)
    spec = read_bake(project_dir, name)
    m = spec.manifest
    if m.cloud != cloud:
        raise BakeError(f"bake {name!r} is a {m.cloud} image; this cluster is on {cloud}")
    if instance_type not in m.instance_types:
        raise BakeError(
            f"bake {name!r} was baked for {m.family} ({', '.join(m.instance_types)}), not {instance_type}; "
            f"pass --instance-type {m.instance_types[0]}"
        )
    if spec.region != region:
        raise BakeError(
            f"bake {name!r} is in {spec.region}, this cluster is in {region}: pass --region {spec.region}, "
            f"or bake again with --region {region}"
        )
    if spec.result is None:
        then = (
            ""
            if spec.cloud == "aws"
            else f", then `gpuinfra image record {name} --from-outputs` once its build finished"
        )
        raise BakeError(f"bake {name!r} has no image id yet: run `gpuinfra up {name}`{then}")
    result = spec.result
    container = result.container_image if spec.cloud == "aws" else m.container_base
    ref = BakedImageRef(
        bake=name,
        region=spec.region,
        root_snapshot_gib=result.root_snapshot_gib or spec.build_volume_size_gib,
        container_repository=container_repository(spec, result.container_image),
    )
    return BakedImage(result.image_id, container, m, ref)


def apply_baked_image(plan, project_dir: Path, value: str):
    """``plan`` with the bake's image: ``ami_id`` (AWS) or ``gcp_image`` (GCP) and ``baked_image``
    set, the profile's ``container_image`` the container on the image (:class:`BakedImage`), and
    its ``root_disk_gib`` raised to the image's root snapshot when smaller (EC2 and GCE refuse a
    root disk smaller than the image's: rule ``baked-root-disk``).

    Args:
        plan: the :class:`gpuinfra.planner.Plan` of ``gpuinfra new``.
        project_dir: the Pulumi project holding the bake's stack file.
        value: ``baked:<name>``.

    Returns:
        ``(plan, image_config)``: the new plan and ``gpuinfra:image`` for the stack file.

    Raises:
        BakeError: see :func:`baked_image`.
    """
    from dataclasses import replace

    spec = plan.spec
    image = baked_image(project_dir, value, spec.cloud, spec.instance_type, spec.region)
    updates: dict = {"ami_id": image.image_id} if spec.cloud == "aws" else {"gcp_image": image.image_id}
    updates["baked_image"] = image.ref
    profile: dict = {"root_disk_gib": max(spec.profile.root_disk_gib, image.ref.root_snapshot_gib)}
    if image.container_image:
        profile["container_image"] = image.container_image
    updates["profile"] = spec.profile.model_copy(update=profile)
    new_spec = type(spec).model_validate({**spec.model_dump(), **updates})
    return replace(plan, spec=new_spec), image.config()


@dataclass(frozen=True)
class CreatedBake:
    """A written bake stack: its spec, file, offline preview (resources, notes) and cost
    document (:func:`gpuinfra.bake.cost.bake_cost`)."""

    spec: BakeSpec
    stack_file: Path
    resources: list
    notes: list
    cost: dict


def create_bake(
    request, project_dir: Path, profile: str | None = None, profiles_dir: Path | None = None, force: bool = False
) -> CreatedBake:
    """Plan, preview offline, check every rule, price, and only then write a bake stack.

    Args:
        request: a :class:`gpuinfra.bake.plan.BakeRequest`; its ``container_base`` "" means
            the profile's ``container_image``.
        project_dir: the Pulumi project folder.
        profile: workload profile (default :data:`gpuinfra.profiles.DEFAULT_PROFILE`).
        profiles_dir: folder of user profiles.
        force: replace an existing bake stack file.

    Raises:
        BakeError, SpecError, ProfileError: bad input (exit 2).
        RuleViolationError: the preview breaks a rule (exit 2).
        FileExistsGpuinfraError: the file exists without ``force`` (exit 5).
    """
    from dataclasses import replace

    resolved = get_profile(profile or DEFAULT_PROFILE, profiles_dir)
    if not request.container_base:
        request = replace(request, container_base=resolved.container_image)
    spec = plan_bake(request, load_catalog().facts, resolved.image.gcp_image_family)
    preview = run_bake_preview(spec)
    violations = check_bake(preview.resources)
    if violations:
        raise RuleViolationError(violations)
    cost = bake_cost(spec)
    path = write_bake_stack(spec, project_dir, force=force)
    return CreatedBake(spec, path, preview.resources, preview.notes, cost)
