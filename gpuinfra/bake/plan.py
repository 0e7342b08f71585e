"""``gpuinfra image bake`` request -> a validated :class:`~gpuinfra.bake.model.BakeSpec` (pure).

Checks, each one clear line and exit 2 (:class:`BakeError`), before anything is written:

* the family is a catalog family of the cloud (``p5`` or ``p5.48xlarge`` on AWS: every type
  ``p5.*``; ``a3-megagpu-8g`` on GCP);
* the base image is pinned: an ``ami-...`` id on AWS, a GCP image *name*
  ``projects/P/global/images/NAME`` (not a ``.../images/family/F``, which moves). Use the image
  the boot path uses (AWS: the profile's DLAMI; GCP: an image of the profile's DLVM family in
  ``deeplearning-platform-release``): the bake's scripts need its Docker, NVIDIA container
  toolkit, gcloud / AWS CLI and, on AWS, its EFA driver (checked when the bake runs, not here);
* the base image's architecture is the family's: every GPU type in gpuinfra's catalog is
  ``x86_64`` (EC2 DescribeInstanceTypes ``ProcessorInfo.SupportedArchitectures`` as bundled in
  moto 5 ``moto/ec2/resources/instance_types.json.gz``, checked for every AWS catalog type by
  tests/bake/test_bake_plan.py; GCP A2/A3/A4/G2/N1 are Intel/AMD machine series:
  cloud.google.com/compute/docs/accelerator-optimized-machines); a GCP image name that says
  ``arm64`` is arm64 (Ubuntu's ``ubuntu-accelerator-2404-arm64-...`` naming);
* the container base carries a digest (``@sha256:<64 hex>``) unless pinning is turned off;
* an A3 High (GPUDirect-TCPX) bake starts from the user's own image: the linux-gcp-tcpx kernel
  it needs is in no public image (:data:`PUBLIC_IMAGE_PROJECTS`), and the bake's host script
  fails without it (``templates/fabric/gcp-tcpx-host.sh.j2``).

Fabric per family and the versions pinned come from the family's :class:`gpuinfra.fabrics.Fabric`
record (EFA installer, aws-ofi-nccl, TCPX/TCPXO images, dmabuf-import-helper, nccl-gib), never
from a copy here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuinfra import __version__
from gpuinfra.bake.model import DIGEST_RE, BakeSpec, SoftwareManifest
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.errors import BakeError
from gpuinfra.fabrics import FABRICS
from gpuinfra.spec import AMI_ID_RE, GCP_IMAGE_RE, check_gcp_project_id, check_new_stack_name

#: Architecture of every GPU type in gpuinfra's catalog (module docstring gives the sources).
CATALOG_ARCHITECTURE = "x86_64"
#: CPU-only build machines per cloud and architecture: nothing in a bake needs a GPU (the EFA
#: installer, DKMS builds and ``docker build`` run without one), so the bake does not pay GPU
#: hours. m7i.large (2 vCPU, 8 GiB, x86_64) / m7g.large (Graviton3, arm64): moto's
#: DescribeInstanceTypes data; n1-standard-8 (8 vCPU, 30 GB; cloud.google.com/compute/docs/general-purpose-machines#n1_machines).
#: Chosen among the types whose prices gpuinfra/catalog/data/prices.yaml carries with a source.
BUILD_INSTANCE_TYPES = {
    ("aws", "x86_64"): "m7i.large",
    ("aws", "arm64"): "m7g.large",
    ("gcp", "x86_64"): "n1-standard-8",
}
#: Root volume of the build instance = size of the image's disk (GiB): the base (the DLAMI's
#: snapshot is 75 GiB in its block device mapping; DLVM images 50 GiB) plus the training container
#: (NGC PyTorch ~20 GiB compressed, ~2x unpacked) and build space.
BUILD_VOLUME_SIZE_GIB = 200
#: NVIDIA branch of the Deep Learning Base OSS Nvidia Driver GPU AMIs (the profiles' DLAMI type):
#: driver 580.105.08 in the Ubuntu 22.04 release of 2026-01-02
#: (docs.amazonaws.cn/dlami/latest/devguide/aws-deep-learning-ami-gpubasesinglecuda-ul2204-2026-01-02.md,
#: quoted in docs/sources/cluster-facts.md section 3.7). The bake's check fails on another branch.
DLAMI_DRIVER_BRANCH = "580"
_DRIVER_RE = re.compile(r"nvidia-(\d{3})(?:\D|$)")
#: Public GCP image projects (the DLVM, Ubuntu accelerator and plain Ubuntu images): none carries
#: the linux-gcp-tcpx kernel A3 High's GPUDirect-TCPX needs (rule fabric-installable-at-boot).
#: The list is Google's public image projects (cloud.google.com/compute/docs/images/os-details and
#: .../images#os-compute-support); an image from any other project is the user's own.
PUBLIC_IMAGE_PROJECTS = frozenset(
    {
        "deeplearning-platform-release",
        "ubuntu-os-accelerator-images",
        "ubuntu-os-cloud",
        "ubuntu-os-pro-cloud",
        "debian-cloud",
        "cos-cloud",
        "rocky-linux-cloud",
        "rocky-linux-accelerator-cloud",
        "rhel-cloud",
        "rhel-sap-cloud",
        "centos-cloud",
        "fedora-coreos-cloud",
        "opensuse-cloud",
        "suse-cloud",
        "suse-sap-cloud",
        "oracle-linux-cloud",
        "almalinux-cloud",
        "windows-cloud",
        "windows-sql-cloud",
        "ml-images",
    }
)


@dataclass(frozen=True)
class BakeRequest:
    """What ``gpuinfra image bake`` was asked for.

    Attributes:
        cloud: ``aws`` | ``gcp``.
        family: AWS family (``p5``) or type (``p5.48xlarge``); GCP machine type (``a3-megagpu-8g``).
        region: build and image region; zone: GCP build zone (default ``<region>-a``).
        base_image: pinned base (``ami-...`` / ``projects/P/global/images/NAME``).
        base_architecture: the base image's architecture (AWS: as ``aws ec2 describe-images``
            says; GCP: read from the name when not given).
        container_base: training container base (default: the profile's ``container_image``).
        require_digest: refuse a ``container_base`` without ``@sha256:``.
        driver_branch: NVIDIA driver branch the base must carry (default: AWS
            :data:`DLAMI_DRIVER_BRANCH`; GCP the ``nvidia-NNN`` of the base image's name, else of
            the profile's DLVM image family).
        name: bake (stack) name (default ``bake-<family>``).
        gcp_project: GCP project (GCP only; required there).
    """

    cloud: str
    family: str
    region: str
    base_image: str | None
    container_base: str
    zone: str | None = None
    base_architecture: str | None = None
    require_digest: bool = True
    driver_branch: str | None = None
    name: str | None = None
    gcp_project: str | None = None


def family_types(facts: dict[tuple[str, str], InstanceFacts], cloud: str, family: str) -> list[InstanceFacts]:
    """The catalog types of ``family`` (module docstring), largest GPU count first.

    Raises:
        BakeError: an unknown cloud or family (the message lists the known families).
    """
    if cloud not in ("aws", "gcp"):
        raise BakeError(f"unknown cloud {cloud!r}; allowed: aws, gcp")
    types = [
        f
        for (c, t), f in facts.items()
        if c == cloud and f.gpu_count and (t == family or (cloud == "aws" and t.split(".")[0] == family))
    ]
    if not types:
        known = sorted(
            {t.split(".")[0] if cloud == "aws" else t for (c, t), f in facts.items() if c == cloud and f.gpu_count}
        )
        raise BakeError(f"unknown {cloud} family {family!r}; known: {', '.join(known)}")
    return sorted(types, key=lambda f: (-f.gpu_count, f.instance_type))


def base_architecture(cloud: str, base_image: str, given: str | None) -> str:
    """The base image's architecture: ``given``, or read from a GCP image name.

    Raises:
        BakeError: an unpinned or malformed image, an unknown architecture, or a GCP name
            that contradicts ``given``.
    """
    if given is not None and given not in ("x86_64", "arm64"):
        raise BakeError(f"--base-arch {given!r}: allowed x86_64, arm64")
    if cloud == "aws":
        if not AMI_ID_RE.match(base_image):
            raise BakeError(
                f"--base-image {base_image!r} is not an AMI id (ami- and 8 or 17 hex digits); "
                "a bake pins its base: resolve the DLAMI once with `aws ssm get-parameter --name "
                "/aws/service/deeplearning/ami/x86_64/<type>/latest/ami-id`"
            )
        return given or CATALOG_ARCHITECTURE
    match = GCP_IMAGE_RE.match(base_image)
    if not match or match.group("family"):  # a bake pins its base: an image, not a family
        raise BakeError(
            f"--base-image {base_image!r} is not a pinned GCP image: use projects/PROJECT/global/images/NAME "
            "(an image name; a family moves: `gcloud compute images describe-from-family F --project P`)"
        )
    named = "arm64" if "arm64" in match.group("name") else "x86_64"
    if given and given != named:
        raise BakeError(f"--base-arch {given} contradicts image {match.group('name')} ({named})")
    return named


def plan_bake(
    request: BakeRequest, facts: dict[tuple[str, str], InstanceFacts], profile_gcp_image_family: str
) -> BakeSpec:
    """Validate ``request`` and build the bake spec (module docstring lists the checks).

    Args:
        request: the options.
        facts: catalog facts by ``(cloud, type)`` (:attr:`gpuinfra.catalog.store.Catalog.facts`).
        profile_gcp_image_family: the profile's DLVM family, whose ``nvidia-NNN`` gives the
            GCP default driver branch when the base image's name has none.

    Raises:
        BakeError: any check fails (exit 2).
        SpecError: an invalid name or GCP project (exit 2).
    """
    types = family_types(facts, request.cloud, request.family)
    lead = types[0]
    if not request.base_image:
        raise BakeError(
            "--base-image is required: a bake pins its base image (AWS ami-...; GCP "
            "projects/PROJECT/global/images/NAME)"
        )
    arch = base_architecture(request.cloud, request.base_image, request.base_architecture)
    if arch != CATALOG_ARCHITECTURE:
        raise BakeError(
            f"base image {request.base_image} is {arch}, but {request.cloud} family {request.family} "
            f"({lead.instance_type}) is {CATALOG_ARCHITECTURE}; use an {CATALOG_ARCHITECTURE} image"
        )
    pinned = bool(DIGEST_RE.match(request.container_base))
    if request.require_digest and not pinned:
        raise BakeError(
            f"container base {request.container_base!r} has no digest; pin it as "
            "repo:tag@sha256:<64 hex> (`docker buildx imagetools inspect IMAGE`), or pass --no-require-digest"
        )
    named = _driver_branch(request.base_image) if request.cloud == "gcp" else None
    default = DLAMI_DRIVER_BRANCH if request.cloud == "aws" else named or _driver_branch(profile_gcp_image_family)
    branch = request.driver_branch or default
    if not re.fullmatch(r"\d{3}", branch or ""):
        raise BakeError(f"--driver-branch {branch!r}: give the three-digit NVIDIA branch, e.g. 580")
    if request.cloud == "gcp":
        if named and named != branch:
            raise BakeError(f"base image {request.base_image} carries NVIDIA {named}, not the pinned branch {branch}")
        if not request.gcp_project:
            raise BakeError("--gcp-project is required for a GCP bake (the image and repository live in it)")
        check_gcp_project_id(request.gcp_project)
    name = check_new_stack_name(request.name or f"bake-{request.family.replace('.', '-')}")
    versions = _fabric_versions(lead)
    gcp_image = GCP_IMAGE_RE.match(request.base_image) if request.cloud == "gcp" else None  # checked above
    base_project = gcp_image.group("project") if gcp_image else ""
    if versions["fabric"] == "tcpx" and base_project in PUBLIC_IMAGE_PROJECTS:
        raise BakeError(
            f"{request.family}'s GPUDirect-TCPX needs the linux-gcp-tcpx kernel, which no public image "
            f"carries ({base_project} does not; Google gives access to it on request: cluster-toolkit "
            "examples/machine-learning/a3-highgpu-8g/README.md); bake from your own image that runs it "
            "(--base-image projects/YOUR_PROJECT/global/images/NAME)"
        )
    manifest = SoftwareManifest(
        bake=name,
        cloud=request.cloud,
        family=request.family,
        instance_types=tuple(f.instance_type for f in types),
        architecture=arch,
        base_image=request.base_image,
        driver_branch=branch,
        container_base=request.container_base,
        container_pinned=pinned,
        gpuinfra_version=__version__,
        **versions,
    )
    zone = request.zone or (f"{request.region}-a" if request.cloud == "gcp" else "")
    if request.cloud == "gcp" and not zone.startswith(request.region + "-"):
        raise BakeError(f"--zone {zone} is not in region {request.region}")
    return BakeSpec(
        stack=name,
        region=request.region,
        zone=zone,
        gcp_project=request.gcp_project,
        build_instance_type=BUILD_INSTANCE_TYPES[(request.cloud, arch)],
        build_volume_size_gib=BUILD_VOLUME_SIZE_GIB,
        manifest=manifest,
    )


def _driver_branch(text: str) -> str | None:
    match = _DRIVER_RE.search(text)
    return match.group(1) if match else None


def _fabric_versions(lead: InstanceFacts) -> dict[str, str]:
    """Fabric and pinned images and versions of the family's lead type, from its
    :class:`~gpuinfra.fabrics.Fabric` record (``<package>_version`` per pinned package)."""
    fab = FABRICS[lead.nic_layout]
    if fab.plugin is None:
        return {"fabric": "sockets"}
    images = {"rxdm_image": fab.host.rxdm_image, "plugin_installer_image": fab.host.plugin_installer_image}
    return {
        "fabric": fab.runtime,
        **{key: image for key, image in images.items() if image},
        **{f"{package.replace('-', '_')}_version": version for package, version in fab.host.versions.items()},
    }
