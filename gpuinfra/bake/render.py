"""Text a bake runs: AWSTOE component documents, the Image Builder Dockerfile, the Packer
template and the Cloud Build steps (pure; ``templates/bake/``).

Every install step is the one the boot path uses: the container Dockerfile is
:func:`blueprints.common.fabric.efa_image_build`'s; the GCP host stack is
:func:`blueprints.common.fabric_host.gcp_host_stack`'s script run with ``--bake``; what a built
container must hold is :func:`blueprints.common.fabric.aws_fabric`'s ``image`` requirements.

Sources:

* AWSTOE documents: docs.aws.amazon.com/imagebuilder/latest/userguide/toe-use-documents.html
  (``schemaVersion`` 1.0; ``phases`` ``build`` / ``validate`` / ``test``; steps with ``name``,
  ``action``, ``onFailure``, ``maxAttempts``, ``timeoutSeconds``, ``inputs``) and
  toe-action-modules.html (``ExecuteBash`` ``inputs.commands``).
* Container recipe Dockerfile template variables ``{{{ imagebuilder:parentImage }}}``,
  ``{{{ imagebuilder:environments }}}``, ``{{{ imagebuilder:components }}}``: the pulumi-aws
  ``imagebuilder.ContainerRecipe`` example (pulumi.com/registry/packages/aws/api-docs/imagebuilder/containerrecipe)
  and docs.aws.amazon.com/imagebuilder/latest/userguide/create-container-recipes.html.
* Packer: Cluster Toolkit modules/packer/custom-image (commit in the template's header);
  Cloud Build runs ``hashicorp/packer`` (hub.docker.com/r/hashicorp/packer) as a build step
  (cloud.google.com/build/docs/building/build-vm-images-with-packer).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from gpuinfra.bake.model import MANIFEST_PATH, BakeSpec
from gpuinfra.templating import render

#: Pinned Packer: the Docker Hub image Cloud Build runs and the googlecompute plugin.
PACKER_IMAGE = "hashicorp/packer:1.11.2"
PACKER_REQUIRED_VERSION = "= 1.11.2"
GOOGLECOMPUTE_PLUGIN_VERSION = "= 1.1.6"
#: Cloud SDK image for the copy step (gcr.io/google.com/cloudsdktool/cloud-sdk, pinned tag).
CLOUD_SDK_IMAGE = "gcr.io/google.com/cloudsdktool/cloud-sdk:499.0.0-slim"
#: Cloud Build's Docker builder (cloud.google.com/build/docs/cloud-builders: gcr.io/cloud-builders/docker).
DOCKER_BUILDER_IMAGE = "gcr.io/cloud-builders/docker"
#: Seconds per AWSTOE step (the EFA installer and a 20 GB pull each take minutes).
STEP_TIMEOUT_SECONDS = 3600


@dataclass(frozen=True)
class Step:
    """One AWSTOE step: ``ExecuteBash`` with ``script``, or ``Reboot``."""

    name: str
    action: str = "ExecuteBash"
    script: str = ""
    max_attempts: int = 1
    timeout_seconds: int = STEP_TIMEOUT_SECONDS


@dataclass(frozen=True)
class Phase:
    """One AWSTOE phase (``build`` | ``validate``) and its steps, in order."""

    name: str
    steps: tuple[Step, ...]


def manifest_script(spec: BakeSpec) -> str:
    """Bash that writes the manifest to :data:`~gpuinfra.bake.model.MANIFEST_PATH`."""
    return render("bake/write-manifest.sh.j2", bake=spec.stack, manifest_path=MANIFEST_PATH,
                  manifest_dir=str(PurePosixPath(MANIFEST_PATH).parent),
                  manifest_json=json.dumps(spec.manifest.to_config(), indent=2, sort_keys=True))


#: AWSTOE parameter of the AMI component: the built container's URI, set by the image recipe
#: (``components[].parameters``), so the document itself is known before deploy
#: (docs.aws.amazon.com/imagebuilder/latest/userguide/toe-user-defined-variables.html).
CONTAINER_PARAMETER = "ContainerImage"


def component_document(name: str, description: str, phases: tuple[Phase, ...],
                       parameters: dict[str, str] | None = None) -> str:
    """An AWSTOE component document (YAML) of ``phases``; ``parameters``: name -> description
    of string parameters."""
    return render("bake/aws-component.yaml.j2", name=name, description=description, phases=phases,
                  parameters=parameters or {})


def aws_host_phases(spec: BakeSpec, container_image: str = "'{{ %s }}'" % CONTAINER_PARAMETER) -> tuple[Phase, ...]:
    """Phases of the AMI component: the training container pulled from ECR and the manifest;
    then checks: the driver branch, the base's EFA (EFA families; the DLAMI ships the EFA driver
    and installer, so the host keeps its own and only the container's user space is pinned here),
    the container on disk.

    Args:
        spec: the bake.
        container_image: shell word of the built container (default: the quoted AWSTOE
            parameter :data:`CONTAINER_PARAMETER`, which the recipe sets); "" for none.
    """
    m = spec.manifest
    build: list[Step] = []
    if container_image:
        build.append(Step("PullTrainingContainer", max_attempts=3, script=render(
            "bake/aws-pull-container.sh.j2", bake=spec.stack, container_image=container_image,
            region=shlex.quote(spec.region))))
    build.append(Step("WriteManifest", script=manifest_script(spec)))
    check = render("bake/check-host.sh.j2", bake=spec.stack, driver_branch=m.driver_branch, efa=m.fabric == "efa",
                   container_image=container_image)
    return Phase("build", tuple(build)), Phase("validate", (Step("CheckImage", script=check),))


def container_phases(spec: BakeSpec) -> tuple[Phase, ...]:
    """Phases of the container component: the manifest into the image; then what
    ``gpuinfra-run`` requires inside it (:func:`blueprints.common.fabric.aws_fabric`)."""
    from blueprints.common.fabric import aws_fabric

    efa = 1 if spec.manifest.fabric == "efa" else 0
    needs = [(shlex.quote(r.target), r.what) for r in aws_fabric(efa).requirements if r.kind == "image"]
    check = render("bake/check-container.sh.j2", bake=spec.stack, needs=needs, manifest_path=MANIFEST_PATH)
    return (Phase("build", (Step("WriteManifest", script=manifest_script(spec)),)),
            Phase("validate", (Step("CheckContainer", script=check),)))


def container_dockerfile(spec: BakeSpec) -> str:
    """The container recipe's Dockerfile template: on EFA families the boot path's own
    Dockerfile (:func:`blueprints.common.fabric.efa_image_build`) with its ``FROM`` line made
    Image Builder's parent image, the environments line after it and the components line (which
    runs :func:`container_phases`, whose checks need the EFA user space) at the end; otherwise
    just those three lines."""
    from blueprints.common.fabric import efa_image_build

    head = "FROM {{{ imagebuilder:parentImage }}}\n{{{ imagebuilder:environments }}}\n"
    tail = "{{{ imagebuilder:components }}}\n"
    if spec.manifest.fabric != "efa":
        return head + tail
    lines = efa_image_build(spec.manifest.container_base).dockerfile.splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith("FROM "))
    return "".join(lines[:index]) + head + "".join(lines[index + 1:]) + tail


@dataclass(frozen=True)
class PackerBuild:
    """What Cloud Build needs for the GCP bake: ``files`` (name -> text) uploaded next to the
    template, the template itself (``template``) and the install ``scripts`` in order."""

    template: str
    files: dict[str, str]


def packer_build(spec: BakeSpec, service_account_email: str, container_image: str, registry_host: str) -> PackerBuild:
    """The Packer template and the files it provisions for a GCP bake.

    Args:
        spec: the bake (GCP).
        service_account_email: the build VM's service account.
        container_image: the training container in Artifact Registry (``<host>/<project>/<repo>/train@sha256:...``).
        registry_host: Artifact Registry host (``<region>-docker.pkg.dev``).

    Raises:
        ValueError: a non-GCP bake.
    """
    from blueprints.common.fabric_host import HOST_SCRIPT_PATH, gcp_host_stack
    from blueprints.gcp.plan import nccl_env
    from gpuinfra.catalog.store import load_catalog

    if spec.cloud != "gcp":
        raise ValueError("packer_build is for GCP bakes")
    m = spec.manifest
    files: dict[str, str] = {}
    scripts: list[dict] = []
    uploads: list[dict] = []
    if m.fabric != "sockets":
        facts = load_catalog().fact("gcp", m.instance_types[0])
        host = gcp_host_stack(m.fabric, facts, nccl_env(m.fabric))
        files["gpuinfra-fabric-host"] = host.files[HOST_SCRIPT_PATH]
        uploads.append({"source": "gpuinfra-fabric-host", "destination": "/tmp/gpuinfra-fabric-host"})
        files["install-host.sh"] = render("bake/gcp-install-host.sh.j2", bake=spec.stack, fabric=m.fabric,
                                          upload="/tmp/gpuinfra-fabric-host", host_script_path=HOST_SCRIPT_PATH,
                                          bake_command=host.bake_command)
        scripts.append({"path": "install-host.sh", "expect_disconnect": False, "pause_before": ""})
    files["pull-container.sh"] = render("bake/gcp-pull-container.sh.j2", bake=spec.stack,
                                        container_image=shlex.quote(container_image), registry_host=registry_host)
    files["write-manifest.sh"] = manifest_script(spec)
    files["check-image.sh"] = render("bake/check-host.sh.j2", bake=spec.stack, driver_branch=m.driver_branch,
                                     efa=False, container_image=shlex.quote(container_image))
    scripts += [{"path": name, "expect_disconnect": False, "pause_before": ""}
                for name in ("pull-container.sh", "write-manifest.sh", "check-image.sh")]
    project, _, image = m.base_image.removeprefix("projects/").partition("/global/images/")
    template = render(
        "bake/gcp-image.pkr.hcl.j2", bake=spec.stack, packer_required_version=PACKER_REQUIRED_VERSION,
        googlecompute_version=GOOGLECOMPUTE_PLUGIN_VERSION, image_family=f"gpuinfra-{spec.stack}",
        project=spec.gcp_project, zone=spec.zone, machine_type=spec.build_instance_type, source_image=image,
        source_image_project=project, disk_size_gib=spec.build_volume_size_gib,
        image_description=f"gpuinfra bake {spec.stack}: manifest sha256 {m.sha256}",
        labels=m.gcp_labels(), service_account_email=service_account_email, uploads=uploads, scripts=scripts,
    )
    return PackerBuild(template=template, files=files)


def cloud_build_steps(bucket: str, prefix: str, base_container: str, container_image: str) -> list[dict]:
    """Cloud Build steps: copy the template and scripts from ``gs://<bucket>/<prefix>/``, mirror
    the pinned container base into Artifact Registry under ``container_image`` (a tag: the
    repository's tags are immutable), ``packer init``, ``packer build``.

    Returns:
        ``[{"id", "name", "args"}...]`` in Cloud Build's step shape
        (cloud.google.com/build/docs/build-config-file-schema#build_steps).
    """
    return [
        {"id": "fetch", "name": CLOUD_SDK_IMAGE,
         "args": ["gcloud", "storage", "cp", "--recursive", f"gs://{bucket}/{prefix}/*", "/workspace/"]},
        {"id": "pull", "name": DOCKER_BUILDER_IMAGE, "args": ["pull", base_container]},
        {"id": "tag", "name": DOCKER_BUILDER_IMAGE, "args": ["tag", base_container, container_image]},
        {"id": "push", "name": DOCKER_BUILDER_IMAGE, "args": ["push", container_image]},
        {"id": "init", "name": PACKER_IMAGE, "args": ["init", "image.pkr.hcl"]},
        {"id": "build", "name": PACKER_IMAGE, "args": ["build", "-color=false", "image.pkr.hcl"]},
    ]
