"""Text a bake runs: AWSTOE component documents, the training container's Dockerfile, the Packer
template and the Cloud Build steps (pure; ``templates/bake/``).

Every install step is the one the boot path uses: the container Dockerfile is
:func:`gpuinfra.plan.fabric.efa_image_build`'s; the GCP host stack is
:func:`gpuinfra.plan.fabric_host.gcp_host_stack`'s script run with ``--bake``; what a built
container must hold is :func:`gpuinfra.plan.fabric.aws_fabric`'s ``image`` requirements.

Sources:

* AWSTOE documents: docs.aws.amazon.com/imagebuilder/latest/userguide/toe-use-documents.html
  (``schemaVersion`` 1.0; ``phases`` ``build`` / ``validate`` / ``test``; steps with ``name``,
  ``action``, ``onFailure``, ``maxAttempts``, ``timeoutSeconds``, ``inputs``) and
  toe-action-modules.html (``ExecuteBash`` ``inputs.commands``).
* AWSTOE parameters (``{{ ContainerImage }}``):
  docs.aws.amazon.com/imagebuilder/latest/userguide/toe-user-defined-variables.html.
* Packer: Cluster Toolkit modules/packer/custom-image (commit in the template's header);
  Cloud Build runs ``hashicorp/packer`` (hub.docker.com/r/hashicorp/packer) as a build step
  (cloud.google.com/build/docs/building/build-vm-images-with-packer).
* The Packer VM's network (:func:`packer_build`): the googlecompute builder's ``subnetwork``,
  ``omit_external_ip``, ``use_internal_ip``, ``use_iap``, ``tags`` and ``instance_name``
  (developer.hashicorp.com/packer/integrations/hashicorp/googlecompute/latest/components/builder/googlecompute;
  hashicorp/packer-plugin-googlecompute v1.1.6 builder/googlecompute/config.go: "'use_internal_ip'
  must be true if 'omit_external_ip' is true", and without ``network``/``subnetwork`` the VM goes
  to ``default``; step_start_tunnel.go: ``use_iap`` runs ``gcloud compute start-iap-tunnel``, so
  "You must have the gcloud sdk installed on the computer running Packer").

Quoting: every value reaching a script is validated (the bake spec's grammar,
:mod:`gpuinfra.bake.model`; image references with :func:`gpuinfra.oci.check_image_reference`)
and written as one shell word (:func:`shlex.quote`); every value in the Packer template is an
HCL string literal (:func:`hcl_string`).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from gpuinfra.bake.model import MANIFEST_PATH, BakeSpec
from gpuinfra.catalog.store import load_catalog
from gpuinfra.oci import check_image_reference
from gpuinfra.plan.fabric import aws_fabric, efa_image_build
from gpuinfra.plan.fabric_host import HOST_SCRIPT_PATH, gcp_host_stack
from gpuinfra.plan.gcp import nccl_env
from gpuinfra.templating import render

#: Pinned Packer: the Docker Hub image Cloud Build runs and the googlecompute plugin.
PACKER_IMAGE = "hashicorp/packer:1.11.2"
PACKER_REQUIRED_VERSION = "= 1.11.2"
GOOGLECOMPUTE_PLUGIN_VERSION = "= 1.1.6"
#: Where the ``hashicorp/packer`` image keeps its binary (its ``ENTRYPOINT ["/bin/packer"]``,
#: github.com/hashicorp/packer Dockerfile) and where the build copies it, so Packer runs in the
#: Cloud SDK image: ``use_iap`` needs ``gcloud`` next to Packer (module docstring).
PACKER_BINARY = "/bin/packer"
WORKSPACE_PACKER = "/workspace/packer"
#: Cloud SDK image for the copy step and the Packer steps (gcr.io/google.com/cloudsdktool/cloud-sdk, pinned tag).
CLOUD_SDK_IMAGE = "gcr.io/google.com/cloudsdktool/cloud-sdk:499.0.0-slim"
#: Cloud Build's Docker builder (cloud.google.com/build/docs/cloud-builders: gcr.io/cloud-builders/docker).
DOCKER_BUILDER_IMAGE = "gcr.io/cloud-builders/docker"
#: Seconds per AWSTOE step (the EFA installer and a 20 GB pull each take minutes).
STEP_TIMEOUT_SECONDS = 3600
#: Seconds for the container build step: a ~20 GB NGC pull plus the aws-ofi-nccl compile on the
#: 2-vCPU build instance (AWSTOE ``timeoutSeconds``; the image's own limit is Image Builder's).
CONTAINER_BUILD_TIMEOUT_SECONDS = 7200


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
    return render(
        "bake/write-manifest.sh.j2",
        bake=spec.stack,
        manifest_path=shlex.quote(MANIFEST_PATH),
        manifest_dir=shlex.quote(str(PurePosixPath(MANIFEST_PATH).parent)),
        manifest_json=json.dumps(spec.manifest.to_config(), indent=2, sort_keys=True),
    )


#: AWSTOE parameter of the AMI component: the built container's URI, set by the image recipe
#: (``components[].parameters``), so the document itself is known before deploy
#: (docs.aws.amazon.com/imagebuilder/latest/userguide/toe-user-defined-variables.html).
CONTAINER_PARAMETER = "ContainerImage"


def component_document(
    name: str, description: str, phases: tuple[Phase, ...], parameters: dict[str, str] | None = None
) -> str:
    """An AWSTOE component document (YAML) of ``phases``; ``parameters``: name -> description
    of string parameters."""
    return render(
        "bake/aws-component.yaml.j2", name=name, description=description, phases=phases, parameters=parameters or {}
    )


def aws_host_phases(spec: BakeSpec, container_image: str = "'{{ " + CONTAINER_PARAMETER + " }}'") -> tuple[Phase, ...]:
    """Phases of the AMI component. Build: the training container (:func:`container_dockerfile`)
    built on the build instance and pushed to the bake's ECR repository, or pulled when an
    earlier run of the bake pushed it (tags are immutable); then the manifest. Validate: the
    driver branch, the base's EFA (EFA families: the DLAMI ships the EFA driver and installer, so
    the host keeps its own and only the container's user space is pinned), the container on
    disk, and inside the container what ``gpuinfra-run`` requires.

    Why the build instance builds the container and not a container recipe: an Image Builder
    container recipe's parent image is a managed image, an ECR image or a Docker Hub image (the
    console's three base image sources, docs.aws.amazon.com/imagebuilder/latest/userguide/create-container-recipes.html;
    aws-games/cloud-game-development-toolkit#558 hit the same wall with ghcr.io), and ECR pull
    through cache cannot front nvcr.io either (its upstreams: ECR Public, registry.k8s.io, Quay,
    Docker Hub, Azure, GitHub, GitLab, Chainguard;
    docs.aws.amazon.com/AmazonECR/latest/userguide/pull-through-cache.html). The profile's base
    is NGC on nvcr.io, which the build instance's Docker pulls like any node does.

    Args:
        spec: the bake.
        container_image: shell word of the container's ECR URI with its tag (default: the
            quoted AWSTOE parameter :data:`CONTAINER_PARAMETER`, which the recipe sets).
    """
    m = spec.manifest
    efa = 1 if m.fabric == "efa" else 0
    build = (
        Step(
            "BuildTrainingContainer",
            max_attempts=3,
            timeout_seconds=CONTAINER_BUILD_TIMEOUT_SECONDS,
            script=render(
                "bake/aws-build-container.sh.j2",
                bake=spec.stack,
                container_image=container_image,
                region=shlex.quote(spec.region),
                dockerfile=container_dockerfile(spec),
                context_manifest=CONTEXT_MANIFEST,
                manifest_json=json.dumps(m.to_config(), indent=2, sort_keys=True),
            ),
        ),
        Step("WriteManifest", script=manifest_script(spec)),
    )
    check_host = render(
        "bake/check-host.sh.j2",
        bake=spec.stack,
        driver_branch=shlex.quote(m.driver_branch),
        efa=efa == 1,
        container_image=container_image,
    )
    check_container = render(
        "bake/aws-check-container.sh.j2",
        bake=spec.stack,
        container_image=container_image,
        check=shlex.quote(container_check_script(spec, efa)),
    )
    return Phase("build", build), Phase(
        "validate", (Step("CheckImage", script=check_host), Step("CheckContainer", script=check_container))
    )


def container_check_script(spec: BakeSpec, efa: int) -> str:
    """Bash run inside the built container: what ``gpuinfra-run`` requires there
    (:func:`gpuinfra.plan.fabric.aws_fabric`'s ``image`` requirements) and the manifest."""
    needs = [
        (shlex.quote(r.target), shlex.quote(f"gpuinfra bake: {r.what} missing ({r.target})"))
        for r in aws_fabric(efa).requirements
        if r.kind == "image"
    ]
    return render("bake/check-container.sh.j2", bake=spec.stack, needs=needs, manifest_path=shlex.quote(MANIFEST_PATH))


#: File name of the manifest in the container's build context (copied to ``MANIFEST_PATH``).
CONTEXT_MANIFEST = "gpuinfra-manifest.json"


def container_dockerfile(spec: BakeSpec) -> str:
    """The training container's Dockerfile: on EFA families the boot path's own
    (:func:`gpuinfra.plan.fabric.efa_image_build`, same EFA installer and aws-ofi-nccl
    steps on the pinned base), otherwise ``FROM`` the base; then the manifest copied to
    :data:`~gpuinfra.bake.model.MANIFEST_PATH`."""
    m = spec.manifest
    body = efa_image_build(m.container_base).dockerfile if m.fabric == "efa" else f"FROM {m.container_base}\n"
    return body.rstrip("\n") + f"\nCOPY {CONTEXT_MANIFEST} {MANIFEST_PATH}\n"


@dataclass(frozen=True)
class PackerBuild:
    """What Cloud Build needs for the GCP bake: ``files`` (name -> text) uploaded next to the
    template, the template itself (``template``) and the install ``scripts`` in order."""

    template: str
    files: dict[str, str]


#: Network tag of the Packer VM: the bake network's only ingress rule (SSH from IAP's range)
#: targets it (googlecompute ``tags``: "Assign network tags to apply firewall rules to VM instance").
BUILD_VM_TAG = "gpuinfra-bake-build"


def packer_instance_name(stack: str) -> str:
    """Name of the Packer VM, and of its boot disk (googlecompute ``disk_name``: "if unset the
    instance name will be used"): ``gpuinfra-bake-<stack>``, one fixed name, so the build
    service account's compute role is granted on exactly this instance and disk
    (:func:`blueprints.gcp.bake.build_vm_condition`); a second build of the same bake started
    while one runs fails at instance creation instead of racing it. At most 41 characters for a
    27-character stack name (GCE names: 63)."""
    return f"gpuinfra-bake-{stack}"


def image_family(stack: str) -> str:
    """Image family of a GCP bake: ``gpuinfra-<stack>``. A family is an attribute whoever creates
    an image chooses, so it says nothing about who made the image: :func:`image_name_prefix` does."""
    return f"gpuinfra-{stack}"


def image_name_prefix(stack: str) -> str:
    """Prefix of every image name a GCP bake makes: ``gpuinfra-<stack>--`` (the Packer template
    appends the build's UTC time, ``YYYYMMDDtHHMMSSz``, so names sort in build order).

    The prefix is self-delimiting: a stack name never holds ``--`` and never ends with ``-``
    (:data:`gpuinfra.spec.NEW_STACK_NAME_RE` and :func:`gpuinfra.spec.check_new_stack_name`), so
    the first ``--`` after ``gpuinfra-`` ends the stack name, and no image of another bake starts
    with this prefix. That is what lets the build account's IAM condition (a ``startsWith`` on the
    name: :func:`blueprints.gcp.bake.build_vm_condition`) and ``image record`` tell this bake's
    images from every other bake's.

    Raises:
        ValueError: ``stack`` holds ``--`` or ends with ``-`` (the prefix would not delimit it).
    """
    if "--" in stack or stack.endswith("-"):
        raise ValueError(f"bake name {stack!r}: a bake name never holds '--' nor ends with '-'")
    return f"{image_family(stack)}--"


def hcl_string(value: object) -> str:
    """``value`` as one HCL double-quoted string literal: JSON escapes (quotes, backslashes,
    control characters) plus HCL's own template sequences doubled (``$${`` and ``%%{`` are the
    literal ``${`` / ``%{``: developer.hashicorp.com/terraform/language/expressions/strings#escape-sequences)."""
    return json.dumps(str(value)).replace("${", "$${").replace("%{", "%%{")


def packer_build(
    spec: BakeSpec, service_account_email: str, container_image: str, registry_host: str, subnetwork: str
) -> PackerBuild:
    """The Packer template and the files it provisions for a GCP bake.

    The Packer VM has no external IP and sits in the bake stack's own ``subnetwork`` (Cloud NAT
    for its downloads, Private Google Access for Google APIs); Packer reaches it over an IAP TCP
    tunnel (``omit_external_ip``, ``use_internal_ip``, ``use_iap``; module docstring).

    Args:
        spec: the bake (GCP).
        service_account_email: the service account the Packer VM runs as.
        container_image: the training container in Artifact Registry (``<host>/<project>/<repo>/train:<tag>``).
        registry_host: Artifact Registry host (``<region>-docker.pkg.dev``).
        subnetwork: the bake's subnetwork, ``projects/P/regions/R/subnetworks/N`` (used as is:
            googlecompute expands only a value without ``/``, lib/common/networking.go).

    Raises:
        ValueError: a non-GCP bake.
        SpecError: ``container_image`` is not an OCI image reference.
    """
    if spec.cloud != "gcp":
        raise ValueError("packer_build is for GCP bakes")
    check_image_reference(container_image, "container image")
    m = spec.manifest
    files: dict[str, str] = {}
    scripts: list[dict] = []
    uploads: list[dict] = []
    if m.fabric != "sockets":
        facts = load_catalog().fact("gcp", m.instance_types[0])
        assert facts is not None  # the bake's types come from the catalog (bake plan)
        host = gcp_host_stack(m.fabric, facts, nccl_env(m.fabric))
        files["gpuinfra-fabric-host"] = host.files[HOST_SCRIPT_PATH]
        uploads.append({"source": "gpuinfra-fabric-host", "destination": "/tmp/gpuinfra-fabric-host"})
        files["install-host.sh"] = render(
            "bake/gcp-install-host.sh.j2",
            bake=spec.stack,
            fabric=m.fabric,
            upload=shlex.quote("/tmp/gpuinfra-fabric-host"),
            host_script_path=shlex.quote(HOST_SCRIPT_PATH),
            bake_command=host.bake_command,
        )
        scripts.append({"path": "install-host.sh", "expect_disconnect": False, "pause_before": ""})
    files["pull-container.sh"] = render(
        "bake/gcp-pull-container.sh.j2",
        bake=spec.stack,
        container_image=shlex.quote(container_image),
        container_base=shlex.quote(m.container_base),
        registry_host=shlex.quote(registry_host),
    )
    files["write-manifest.sh"] = manifest_script(spec)
    files["check-image.sh"] = render(
        "bake/check-host.sh.j2",
        bake=spec.stack,
        driver_branch=shlex.quote(m.driver_branch),
        efa=False,
        container_image=shlex.quote(container_image),
    )
    scripts += [
        {"path": name, "expect_disconnect": False, "pause_before": ""}
        for name in ("pull-container.sh", "write-manifest.sh", "check-image.sh")
    ]
    project, _, image = m.base_image.removeprefix("projects/").partition("/global/images/")
    hcl = {
        "bake": spec.stack,
        "packer_required_version": PACKER_REQUIRED_VERSION,
        "googlecompute_version": GOOGLECOMPUTE_PLUGIN_VERSION,
        "image_family": image_family(spec.stack),
        "image_name_prefix": image_name_prefix(spec.stack),
        "project": spec.gcp_project,
        "zone": spec.zone,
        "region": spec.region,
        "machine_type": spec.build_instance_type,
        "source_image": image,
        "source_image_project": project,
        "image_description": f"gpuinfra bake {spec.stack}: manifest sha256 {m.sha256}",
        "service_account_email": service_account_email,
        "subnetwork": subnetwork,
        "instance_name": packer_instance_name(spec.stack),
        "tag": BUILD_VM_TAG,
    }
    template = render(
        "bake/gcp-image.pkr.hcl.j2",
        **{key: hcl_string(value) for key, value in hcl.items()},
        disk_size_gib=int(spec.build_volume_size_gib),
        labels={hcl_string(k): hcl_string(v) for k, v in m.gcp_labels().items()},
        uploads=[{k: hcl_string(v) for k, v in u.items()} for u in uploads],
        scripts=[{**s, "path": hcl_string(s["path"])} for s in scripts],
    )
    return PackerBuild(template=template, files=files)


def cloud_build_steps(bucket: str, prefix: str, base_container: str, container_image: str) -> list[dict]:
    """Cloud Build steps: copy the template and scripts from ``gs://<bucket>/<prefix>/``, mirror
    the pinned container base into Artifact Registry under ``container_image`` (a tag: the
    repository's tags are immutable), copy the pinned Packer binary out of its image, then
    ``packer init`` and ``packer build`` in the Cloud SDK image, where ``use_iap`` finds
    ``gcloud`` (module docstring). Every argument is one ``args`` item, never a shell line.

    Returns:
        ``[{"id", "name", "args"[, "entrypoint"]}...]`` in Cloud Build's step shape
        (cloud.google.com/build/docs/build-config-file-schema#build_steps, ``entrypoint``:
        "the entrypoint to be used instead of the build step's default").

    Raises:
        SpecError: ``base_container`` or ``container_image`` is not an OCI image reference.
    """
    check_image_reference(base_container, "container base")
    check_image_reference(container_image, "container image")
    return [
        {
            "id": "fetch",
            "name": CLOUD_SDK_IMAGE,
            "args": ["gcloud", "storage", "cp", "--recursive", f"gs://{bucket}/{prefix}/*", "/workspace/"],
        },
        {"id": "pull", "name": DOCKER_BUILDER_IMAGE, "args": ["pull", base_container]},
        {"id": "tag", "name": DOCKER_BUILDER_IMAGE, "args": ["tag", base_container, container_image]},
        {"id": "push", "name": DOCKER_BUILDER_IMAGE, "args": ["push", container_image]},
        {"id": "packer", "name": PACKER_IMAGE, "entrypoint": "cp", "args": [PACKER_BINARY, WORKSPACE_PACKER]},
        {"id": "init", "name": CLOUD_SDK_IMAGE, "entrypoint": WORKSPACE_PACKER, "args": ["init", "image.pkr.hcl"]},
        {
            "id": "build",
            "name": CLOUD_SDK_IMAGE,
            "entrypoint": WORKSPACE_PACKER,
            "args": ["build", "-color=false", "image.pkr.hcl"],
        },
    ]
