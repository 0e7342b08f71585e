"""``gpuinfra up`` / ``down`` / ``image record --from-outputs`` of a bake stack.

A bake stack (``gpuinfra:bake``) goes through the same :class:`~gpuinfra.lifecycle.Backend`
(Automation API), progress printer and error mapping as a cluster, without the cluster's guards
(TTL, replacing running nodes): a bake has neither.

* AWS: the update *is* the build. ``aws.imagebuilder.Image`` is created by waiting for Image
  Builder to finish, so after ``up`` the outputs hold the AMI (``image_id``) and the container
  (``container_image``: the ECR URI with the tag the build pushed, ``<repository>:bake-<sha12>``,
  blueprints/aws/bake.py). A bake that pins its container records it by digest, looked up
  with ECR ``DescribeImages`` for that tag; then the result goes into the bake's stack file
  (:func:`gpuinfra.bake.stack.record_result`), so ``gpuinfra new --image baked:<name>`` works
  right after ``up``.
* GCP: the update creates the Cloud Build trigger; a build starts when a message is published
  to its Pub/Sub topic (cloud.google.com/build/docs/automate-builds-pubsub-events). ``up``
  publishes one (Pub/Sub REST ``projects.topics.publish``) when the update changed the bake or
  no image is recorded yet, and says how to record the image once the build finished:
  ``gpuinfra image record <name> --from-outputs`` takes the newest image of the family
  (Compute REST ``images.getFromFamily``) after checking it is ``READY`` and carries this
  manifest's SHA-256 label.
* ``down`` destroys the stack and lists what stays (:func:`leftovers`): the AMI and its
  snapshots (Image Builder ``DeleteImage`` "does not delete any EC2 AMIs or ECR container
  images that are created during the image build process":
  docs.aws.amazon.com/imagebuilder/latest/APIReference/API_DeleteImage.html), the ECR
  repository with the container (kept by the stack: cluster stacks made from the bake record
  the container by its digest there; the nodes run the copy on the AMI), and on GCP the images Packer made (created through the Compute API by the build, not
  Pulumi resources). Nothing here deletes an image: clusters that boot it keep working; the
  commands to delete them by hand are printed, with the cluster stacks that still use them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuinfra.bake import BAKE_CONFIG_KEY, IMAGE_CONFIG_KEY, gcp_api
from gpuinfra.bake.cost import BakeCostLine, bake_cost_lines
from gpuinfra.bake.gcp_api import GcpApis
from gpuinfra.bake.model import GCP_LABEL_PREFIX, BakeSpec
from gpuinfra.bake.render import image_family, image_name_prefix
from gpuinfra.bake.stack import record_result
from gpuinfra.credentials import aws_session, no_aws_credentials
from gpuinfra.errors import MissingDependencyError, OperationError, SpecError
from gpuinfra.money import Total
from gpuinfra.stackfile import STACKS_DIRNAME, read_stack_config, stack_file_path

#: ``<account>.dkr.ecr.<region>.amazonaws.com/<repository>[:<tag>]`` (ECR registry URI format,
#: docs.aws.amazon.com/AmazonECR/latest/userguide/Registries.html).
ECR_URI_RE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[a-z0-9._/-]+?)(?::(?P<tag>[\w][\w.-]{0,127}))?$"
)
_AWS_ACCESS = (
    "AccessDenied",
    "AccessDeniedException",
    "UnauthorizedOperation",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
)


def is_bake_stack(project_dir: Path, name: str) -> bool:
    """True when ``stacks/Pulumi.<name>.yaml`` holds ``gpuinfra:bake`` (parsed, not validated);
    False for a cluster stack, a missing or unreadable file."""
    try:
        config = read_stack_config(Path(project_dir), name)
    except SpecError:
        return False
    return f"gpuinfra:{BAKE_CONFIG_KEY}" in config


def ecr_digest_reference(ecr, container_uri: str) -> str:
    """``<registry>/<repository>@sha256:<hex>`` of the ECR image ``container_uri`` names by tag
    (``DescribeImages`` with ``imageIds=[{imageTag}]``; a URI that already has a digest is
    returned as it is).

    Args:
        ecr: a boto3 ECR client of the repository's region.

    Raises:
        OperationError: not an ECR URI with a tag, or the registry has no such image (exit 7).
        MissingDependencyError: no credentials or no ``ecr:DescribeImages`` permission (exit 6).
    """
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    if "@sha256:" in container_uri:
        return container_uri
    match = ECR_URI_RE.match(container_uri)
    if not match or not match["tag"]:
        raise OperationError(
            f"container_image output {container_uri!r} is not an ECR URI with a tag "
            "(<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>)"
        )
    repository = container_uri[: container_uri.rindex(":")]
    try:
        details = ecr.describe_images(
            registryId=match["account"], repositoryName=match["repository"], imageIds=[{"imageTag": match["tag"]}]
        )["imageDetails"]
    except NoCredentialsError:
        raise no_aws_credentials(" to look up the container's digest") from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in _AWS_ACCESS:
            raise MissingDependencyError(
                f"cannot read the digest of {container_uri}: {code}; the AWS credentials need "
                "ecr:DescribeImages on the repository"
            ) from None
        raise OperationError(f"looking up the digest of {container_uri} failed: {code or exc}") from None
    except BotoCoreError as exc:
        raise OperationError(f"looking up the digest of {container_uri} failed: {exc}") from None
    if not details or not details[0].get("imageDigest"):
        raise OperationError(f"ECR has no image {container_uri}")
    return f"{repository}@{details[0]['imageDigest']}"


def _output(outputs: dict, key: str, name: str) -> str:
    value = outputs.get(key)
    if not isinstance(value, str) or not value:
        raise OperationError(f"bake {name!r} has no {key} output (is it deployed? `gpuinfra up {name}`)")
    return value


def record_from_outputs(
    project_dir: Path, spec: BakeSpec, outputs: dict, ecr=None, gcp: GcpApis | None = None
) -> BakeSpec:
    """Record a finished bake from its stack's outputs (:func:`gpuinfra.bake.stack.record_result`).

    AWS: ``image_id``, and ``container_image`` by digest when the bake pins its container
    (:func:`ecr_digest_reference`), else as built (a tag of an ``IMMUTABLE`` repository). GCP:
    the newest image of the ``image_family`` output; it must be ``READY`` (Compute ``Image.status``:
    FAILED, PENDING, READY) and carry this manifest's ``gpuinfra-bake-sha256`` label (an older
    image of the family is the bake before a change). GCP records no container: clusters run the
    manifest's container base, which the bake pulled onto the image under that reference.
    The image's root disk size is recorded too (AWS: the recipe's root volume,
    ``build_volume_size_gib``; GCP: ``Image.diskSizeGb``): clusters never ask for a smaller one.

    Args:
        ecr: boto3 ECR client (default: one of the bake's region); gcp: REST session
            (default: :func:`gpuinfra.bake.gcp_api.make_gcp_apis`).

    Raises:
        OperationError: an output missing, no such ECR image, no finished image of this manifest
            (exit 7).
        MissingDependencyError: credentials or permission (exit 6).
        BakeError / SpecError: the image id is not one the bake can record (exit 2).
    """
    name = spec.stack
    if spec.cloud == "aws":
        image_id = _output(outputs, "image_id", name)
        container = _output(outputs, "container_image", name)
        if spec.manifest.container_pinned:
            ecr = ecr or aws_session(" to look up the container's digest").client("ecr", region_name=spec.region)
            container = ecr_digest_reference(ecr, container)
        # the recipe maps build_volume_size_gib onto the base AMI's root device
        # (blueprints/aws/bake.py), so the AMI's root snapshot is that size
        return record_result(project_dir, name, image_id, container, spec.build_volume_size_gib)
    family = _output(outputs, "image_family", name).rsplit("/", 1)[-1]
    project = spec.gcp_project or ""
    prefix = image_name_prefix(name)
    # the family is whatever an image's creator set; the name prefix is this bake's own
    # (render.image_name_prefix): an image of the family named otherwise is not this bake's
    own = [
        image
        for image in gcp_api.family_images(gcp or gcp_api.make_gcp_apis(), project, family)
        if str(image.get("name", "")).startswith(prefix)
        and (image.get("deprecated") or {}).get("state", "ACTIVE") == "ACTIVE"
    ]
    if not own:
        raise OperationError(
            f"project {project} has no image of family {family} named {prefix}*: the build of this bake has "
            f"not made one yet (`gcloud builds list --project {project} --limit 3`); images of the family "
            "with other names are not this bake's and are never recorded"
        )
    image = max(own, key=lambda item: str(item["name"]))  # the name ends in the build's UTC time
    label = f"{GCP_LABEL_PREFIX}sha256"
    want = spec.manifest.gcp_labels()[label]
    if image.get("status") != "READY":
        raise OperationError(
            f"image {image.get('name')} of family {family} is {image.get('status')}, not READY; "
            f"run `gpuinfra image record {name} --from-outputs` again when its build has finished"
        )
    if (image.get("labels") or {}).get(label) != want:
        raise OperationError(
            f"the newest image of this bake ({image.get('name')}) was baked from another manifest "
            f"({label}={(image.get('labels') or {}).get(label)}, this bake is {want}): the build of "
            f"this bake has not finished (`gcloud builds list --project {project} --limit 3`)"
        )
    size = str(image.get("diskSizeGb") or "")  # Compute REST Image.diskSizeGb: int64 as a string
    return record_result(
        project_dir,
        name,
        f"projects/{project}/global/images/{image['name']}",
        root_snapshot_gib=int(size) if size.isdigit() else None,
    )


@dataclass(frozen=True)
class BakeUp:
    """What ``gpuinfra up`` did to a bake.

    Attributes:
        spec: the bake as it is now (``result`` set when recorded).
        changes: the update's change summary (op -> count).
        recorded: the result was written to the stack file.
        build_message_id: GCP: the Pub/Sub message that started a build (None: none started).
        lines: what to tell the user, in order (results and the next command).
    """

    spec: BakeSpec
    changes: dict
    recorded: bool
    build_message_id: str | None
    lines: tuple[str, ...]


def _build_topic(outputs: dict, name: str) -> str:
    """``projects/P/topics/T`` from the ``build_topic`` output, else from ``run_command``
    (``gcloud pubsub topics publish T --message=bake``, blueprints/gcp/bake.py)."""
    if outputs.get("build_topic"):
        return outputs["build_topic"]
    found = re.search(r"topics publish (\S+)", outputs.get("run_command") or "")
    if not found:
        raise OperationError(
            f"bake {name!r} has neither a build_topic nor a run_command output; run `gpuinfra up {name}`"
        )
    return found.group(1)


def deploy_bake(
    backend, project_dir: Path, spec: BakeSpec, on_event: Callable[[object], None], ecr=None, gcp: GcpApis | None = None
) -> BakeUp:
    """``up`` of a bake stack (module docstring): the update, then on AWS the recorded result,
    on GCP a started build.

    Args:
        backend: the :class:`gpuinfra.lifecycle.Backend`.
        project_dir: the Pulumi project folder.
        spec: the bake (:func:`gpuinfra.bake.stack.read_bake`).
        on_event: engine event callback (progress).
        ecr, gcp: clients for :func:`record_from_outputs` / :func:`gpuinfra.bake.gcp_api.publish_build` (tests).

    Raises:
        OperationError: the update failed (exit 7); or it succeeded and recording failed, the
            message then says the image is built and how to record it again.
        MissingDependencyError: credentials (exit 6).
    """
    name = spec.stack
    changes = backend.up(project_dir, name, on_event)
    outputs = backend.outputs(project_dir, name)
    again = f"`gpuinfra image record {name} --from-outputs`"
    if spec.cloud == "aws":
        try:
            recorded = record_from_outputs(project_dir, spec, outputs, ecr=ecr)
        except (OperationError, MissingDependencyError) as exc:
            raise type(exc)(
                f"bake {name!r} is built (image {outputs.get('image_id') or '?'}), but recording it "
                f"failed: {exc}; fix that, then run {again}"
            ) from None
        result = recorded.result
        assert result is not None  # record_from_outputs sets it
        container = f", container {result.container_image}" if result.container_image else ""
        return BakeUp(
            recorded,
            changes,
            True,
            None,
            (
                f"recorded image {result.image_id}{container} in {stack_file_path(project_dir, name)}",
                f"use: gpuinfra new ... --image baked:{name}",
                f"then: gpuinfra down {name}   (the bake's NAT gateway bills every hour its stack exists; "
                "the AMI and the ECR repository stay)",
            ),
        )
    changed = any(op != "same" and count for op, count in changes.items())
    project = spec.gcp_project or ""
    topic = _build_topic(outputs, name)
    if not topic.startswith("projects/"):
        topic = f"projects/{project}/topics/{topic}"
    if not changed and spec.result is not None:
        return BakeUp(
            spec,
            changes,
            False,
            None,
            (
                f"nothing changed and image {spec.result.image_id} is recorded: no new build started",
                f"to bake again: gcloud pubsub topics publish {topic.rsplit('/', 1)[-1]} --project {project} --message=bake"
                f", then when it has finished: {again.strip('`')}",
            ),
        )
    try:
        message = gcp_api.publish_build(gcp or gcp_api.make_gcp_apis(), topic)
    except (OperationError, MissingDependencyError) as exc:
        raise type(exc)(
            f"bake {name!r} is deployed, but starting its build failed: {exc}; start it with `gcloud pubsub "
            f"topics publish {topic.rsplit('/', 1)[-1]} --project {project} --message=bake`"
        ) from None
    return BakeUp(
        spec,
        changes,
        False,
        message,
        (
            f"started the Cloud Build bake (Pub/Sub message {message} on {topic}); follow it: "
            f"gcloud builds list --project {project} --limit 3",
            f"when it has finished: gpuinfra image record {name} --from-outputs",
        ),
    )


@dataclass(frozen=True)
class Leftover:
    """One thing a bake's ``down`` leaves: what, why, and the commands that delete it by hand
    (each one a complete command line)."""

    what: str
    why: str
    commands: tuple[str, ...]


def leftovers(spec: BakeSpec, outputs: dict) -> list[Leftover]:
    """What stays after ``down`` of ``spec`` (module docstring; sources there).

    Args:
        outputs: the stack's outputs read before the destroy ({} when none); the recorded
            result fills in what they lack.
    """
    name, region = spec.stack, spec.region
    recorded = spec.result.image_id if spec.result else ""
    if spec.cloud == "aws":
        ami = outputs.get("image_id") or recorded
        why = "deleting an Image Builder image does not deregister the AMI it made"
        if ami:
            ami_item = Leftover(
                f"AMI {ami} and its EBS snapshot(s) in {region}",
                why,
                (f"aws ec2 deregister-image --image-id {ami} --delete-associated-snapshots --region {region}",),
            )
        else:
            ami_item = Leftover(
                f"any AMI the bake made in {region} (tag gpuinfra:stack={name}); list them, then "
                "deregister each with --delete-associated-snapshots",
                why,
                (
                    f"aws ec2 describe-images --owners self --filters Name=tag:gpuinfra:stack,Values={name} "
                    f"--region {region} --query 'Images[].ImageId'",
                ),
            )
        return [
            ami_item,
            Leftover(
                f"ECR repository gpuinfra/{name} and its container image(s)",
                "kept by the stack (retain on delete): cluster stacks made from the bake record the container by "
                "its digest there. A later `gpuinfra up` of this bake fails while it exists (ECR "
                "RepositoryAlreadyExistsException): delete it first, once no cluster needs it",
                (f"aws ecr delete-repository --repository-name gpuinfra/{name} --force --region {region}",),
            ),
        ]
    project = spec.gcp_project or ""
    family = image_family(name)
    why = "Packer creates the images through the Compute API during the build: they are not Pulumi resources"
    items = [
        Leftover(
            f"every image of family {family} in project {project}; list them, then delete each",
            why,
            (f"gcloud compute images list --project {project} --no-standard-images --filter=family={family}",),
        )
    ]
    if recorded:
        items.insert(
            0,
            Leftover(
                f"image {recorded} (the recorded one)",
                why,
                (f"gcloud compute images delete {recorded.rsplit('/', 1)[-1]} --project {project}",),
            ),
        )
    return items


def clusters_using(project_dir: Path, image_id: str) -> list[str]:
    """Cluster stacks of the project whose stack file records ``image_id`` (``ami_id`` /
    ``gcp_image`` of ``gpuinfra:cluster``, or ``gpuinfra:image.image_id``), by name."""
    if not image_id:
        return []
    found = []
    for path in sorted((Path(project_dir) / STACKS_DIRNAME).glob("Pulumi.*.yaml")):
        try:
            config = read_stack_config(Path(project_dir), path.name[len("Pulumi.") : -len(".yaml")])
        except SpecError:
            continue
        cluster = config.get("gpuinfra:cluster") if isinstance(config, dict) else None
        image = config.get(f"gpuinfra:{IMAGE_CONFIG_KEY}") if isinstance(config, dict) else None
        values = {(cluster or {}).get("ami_id"), (cluster or {}).get("gcp_image"), (image or {}).get("image_id")}
        if isinstance(cluster, dict) and image_id in values:
            found.append(path.name[len("Pulumi.") : -len(".yaml")])
    return found


@dataclass(frozen=True)
class BakeDown:
    """What ``gpuinfra down`` did to a bake: the change summary, what stays, what went with the
    stack that a user might look for, and the cluster stacks that boot the bake's image."""

    changes: dict
    leftovers: list[Leftover] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)
    #: the image and registry storage that stays, per month (:func:`gpuinfra.bake.cost.bake_cost_lines`)
    monthly: list[BakeCostLine] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        """The report ``down`` prints: each kept thing with why and its delete commands, then
        what was deleted, then the clusters that still boot the image."""
        out = ["kept (gpuinfra deletes no image; delete by hand once no cluster boots it):"]
        for item in self.leftovers:
            out.append(f"  {item.what}: {item.why}")
            out += [f"    {command}" for command in item.commands]
        out += [f"deleted: {text}" for text in self.deleted]
        if self.clusters:
            out.append(
                f"cluster stacks that boot this image: {', '.join(self.clusters)} (keep the image until "
                "`gpuinfra down` of each)"
            )
        if self.monthly:  # fails closed: an unpriced storage line leaves no total
            total = Total.of(line.usd for line in self.monthly)
            parts = "; ".join(
                f"{line.component} {'not found' if line.usd is None else f'${line.usd:,.2f}'}" for line in self.monthly
            )
            out.append(f"left after down, per month: {total.text(suffix='/month')} ({parts}; estimated sizes)")
        return out


def deleted_with_stack(spec: BakeSpec) -> list[str]:
    """What ``down`` deletes that a user may expect to stay: GCP's Artifact Registry repository
    goes with its content ("Deletes a repository and all of its contents":
    cloud.google.com/artifact-registry/docs/reference/rest/v1/projects.locations.repositories/delete).
    A GCP cluster made from the bake does not use it (a GCP bake records no container)."""
    if spec.cloud != "gcp":
        return []
    return [
        f"Artifact Registry repository gpuinfra-{spec.stack} in {spec.region} with the container mirrored into it "
        "(clusters made from the bake do not use it: they run the profile's container)"
    ]


def destroy_bake(backend, project_dir: Path, spec: BakeSpec, on_event: Callable[[object], None]) -> BakeDown:
    """``down`` of a bake stack: read the outputs (the AMI id), destroy, report what stays.

    Raises:
        SpecError: the stack is not deployed (exit 2).
        OperationError: the destroy failed (exit 7).
    """
    outputs = backend.outputs(project_dir, spec.stack)
    changes = backend.destroy(project_dir, spec.stack, on_event)
    image = (outputs.get("image_id") if spec.cloud == "aws" else "") or (spec.result.image_id if spec.result else "")
    monthly = [line for line in bake_cost_lines(spec) if line.when == "monthly"]
    return BakeDown(
        changes, leftovers(spec, outputs), deleted_with_stack(spec), clusters_using(project_dir, image), monthly
    )
