"""The bake spec (``gpuinfra:bake``) and the pinned software manifest of a baked image.

Pure data, no Pulumi imports. The manifest lists every version the bake pins; it goes into the
image's tags (AWS) or labels (GCP), into a file on the image
(:data:`MANIFEST_PATH`), and into the stack file of every cluster made with
``gpuinfra new --image baked:<name>`` (config ``gpuinfra:image``).

Tag and label rules:

* AWS tags: at most 50 per resource, keys up to 128 and values up to 256 characters of
  letters, digits, spaces and ``+ - = . _ : / @``
  (docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html#tag-conventions).
* GCP labels: keys and values up to 63 characters of lowercase letters, digits, ``_`` and ``-``;
  keys start with a letter (cloud.google.com/compute/docs/labeling-resources#requirements). The
  full manifest does not fit (image references hold ``/ : @ .``), so labels carry the short
  fields and the manifest's SHA-256; the full text is in the image description and on disk.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuinfra.errors import SpecError
from gpuinfra.oci import check_image_reference
from gpuinfra.spec import GCP_PROJECT_ID_RE, NEW_STACK_NAME_RE, model_from_config

#: Where the bake writes the manifest on the image (and, for the container, in the image).
MANIFEST_PATH = "/etc/gpuinfra/bake-manifest.json"
#: AWS tag key prefix of manifest fields.
AWS_TAG_PREFIX = "gpuinfra:bake:"
#: GCP label key prefix of manifest fields.
GCP_LABEL_PREFIX = "gpuinfra-bake-"
#: A container reference pinned by digest: ``<repo>[:tag]@sha256:<64 hex>``
#: (github.com/distribution/reference: ``digest := algorithm ":" hex``; sha256 has 64 hex digits).
DIGEST_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
_GCP_LABEL_VALUE = re.compile(r"[^a-z0-9_-]")
#: A pinned image: an AMI id or a GCP image *name* (EC2 ``ami-`` + 8 or 17 hex digits; GCE
#: ``projects/P/global/images/NAME``, cloud.google.com/compute/docs/reference/rest/v1/images "name").
IMAGE_ID_PATTERN = r"^(ami-(?:[0-9a-f]{8}|[0-9a-f]{17})|projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/global/images/[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)$"
#: Grammar of the short values a bake writes into its scripts, template and labels (names,
#: regions, zones, machine types, versions): no quote, space, ``$``, ``;`` or line break, so
#: each is one word wherever it lands (the scripts still quote them: gpuinfra/bake/render.py).
TOKEN_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$"

Architecture = Literal["x86_64", "arm64"]
Fabric = Literal["efa", "sockets", "tcpx", "tcpxo", "gib"]


class SoftwareManifest(BaseModel):
    """What a bake pins, field by field (module docstring says where it goes).

    Attributes:
        bake: the bake's name (its stack name).
        cloud: ``aws`` | ``gcp``.
        family: the node family baked for (``p5``, ``a3-megagpu-8g``) and ``instance_types`` it
            covers (from the catalog).
        fabric: the GPU fabric installed (``efa``, ``tcpx``, ``tcpxo``, ``gib``; ``sockets`` =
            none), :class:`gpuinfra.plan.fabric.FabricRuntime.fabric`.
        architecture: CPU architecture of base image and family.
        base_image: pinned base image (``ami-...``; ``projects/P/global/images/NAME``).
        driver_branch: NVIDIA driver branch the base image must carry (``570``); the bake fails
            when the installed module is another branch.
        container_base: the training container's base, ``repo:tag@sha256:...`` when pinned.
        container_pinned: ``container_base`` carries a digest.
        efa_installer_version, aws_ofi_nccl_version: EFA user space built into the training
            container (AWS EFA families); the host keeps the base DLAMI's EFA driver.
        rxdm_image, plugin_installer_image: GPUDirect-TCPX(O) host images (GCP A3 High / Mega).
        dmabuf_import_helper_version: A3 Mega kernel module; nccl_gib_version: A3 Ultra / A4.
        gpuinfra_version: the gpuinfra that wrote the bake.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    bake: str = Field(pattern=NEW_STACK_NAME_RE.pattern)
    cloud: Literal["aws", "gcp"]
    family: str = Field(pattern=TOKEN_PATTERN)
    instance_types: tuple[str, ...] = Field(min_length=1)
    fabric: Fabric
    architecture: Architecture
    base_image: str = Field(pattern=IMAGE_ID_PATTERN)
    driver_branch: str = Field(pattern=r"^\d{3}$")
    container_base: str = Field(min_length=1)
    container_pinned: bool
    efa_installer_version: str | None = Field(default=None, pattern=TOKEN_PATTERN)
    aws_ofi_nccl_version: str | None = Field(default=None, pattern=TOKEN_PATTERN)
    rxdm_image: str | None = None
    plugin_installer_image: str | None = None
    dmabuf_import_helper_version: str | None = Field(default=None, pattern=TOKEN_PATTERN)
    nccl_gib_version: str | None = Field(default=None, pattern=TOKEN_PATTERN)
    gpuinfra_version: str = Field(pattern=TOKEN_PATTERN)

    @field_validator("instance_types")
    @classmethod
    def _types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not re.fullmatch(TOKEN_PATTERN, item):
                raise ValueError(f"instance type {item!r} is not a machine type name")
        return value

    @field_validator("container_base", "rxdm_image", "plugin_installer_image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        """An OCI image reference (:func:`gpuinfra.oci.check_image_reference`): it lands in
        ``FROM``, ``docker pull`` and the build's arguments."""
        if value is not None:
            try:
                check_image_reference(value, "")
            except SpecError as exc:  # pydantic reports ValueError with the field's path
                raise ValueError(str(exc)) from None
        return value

    def to_config(self) -> dict[str, Any]:
        """JSON-compatible mapping without unset fields."""
        return self.model_dump(mode="json", exclude_none=True)

    @property
    def sha256(self) -> str:
        """SHA-256 of the canonical JSON (sorted keys) of :meth:`to_config`."""
        return hashlib.sha256(json.dumps(self.to_config(), sort_keys=True).encode()).hexdigest()

    def aws_tags(self) -> dict[str, str]:
        """``gpuinfra:bake:<field>`` -> value for every set field, plus ``gpuinfra:bake:sha256``
        (lists joined with ``,``; booleans ``true``/``false``)."""
        tags = {}
        for key, value in self.to_config().items():
            text = (
                ",".join(value)
                if isinstance(value, list)
                else str(value).lower()
                if isinstance(value, bool)
                else str(value)
            )
            tags[f"{AWS_TAG_PREFIX}{key}"] = text
        tags[f"{AWS_TAG_PREFIX}sha256"] = self.sha256
        return tags

    def gcp_labels(self) -> dict[str, str]:
        """Short fields as GCP labels (module docstring): bake, family, fabric, architecture,
        driver branch, pinned versions with ``.`` as ``_``, and the first 32 hex of the SHA-256."""
        fields = {
            "bake": self.bake,
            "family": self.family,
            "fabric": self.fabric,
            "arch": self.architecture,
            "driver": self.driver_branch,
            "dmabuf": self.dmabuf_import_helper_version,
            "gib": self.nccl_gib_version,
            "sha256": self.sha256[:32],
        }
        return {
            f"{GCP_LABEL_PREFIX}{key}": _GCP_LABEL_VALUE.sub("_", str(value).lower())[:63]
            for key, value in fields.items()
            if value is not None
        }


class BakeResult(BaseModel):
    """What a finished bake produced, recorded by ``gpuinfra image record`` from the bake
    stack's outputs (``image_id``, ``container_image``).

    Attributes:
        image_id: the AMI id (``ami-...``) or GCP image (``projects/P/global/images/NAME``).
        container_image: the training container, ``repo@sha256:...``; "" when none was built.
        root_snapshot_gib: size of the image's root disk in GiB (AWS: the root block device's
            ``Ebs.VolumeSize`` in EC2 DescribeImages; GCP: ``Image.diskSizeGb``), read when the
            result is recorded from the outputs; None in results recorded before it was read
            (then the bake's ``build_volume_size_gib``, the size the recipe gave the root).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    image_id: str = Field(pattern=IMAGE_ID_PATTERN)
    container_image: str = ""
    root_snapshot_gib: int | None = Field(default=None, ge=1, le=65536)


class BakeSpec(BaseModel):
    """One bake stack (``gpuinfra:bake``).

    Attributes:
        stack: the stack name (= ``manifest.bake``).
        region: AWS region / GCP region of the build and the image.
        zone: GCP zone of the Packer build VM ("" on AWS).
        gcp_project: GCP project of the image and repository (GCP only).
        build_instance_type: instance / machine type that runs the build (CPU only: nothing in
            the bake needs a GPU; see :data:`gpuinfra.bake.plan.BUILD_INSTANCE_TYPES`).
        build_volume_size_gib: root volume / boot disk of the build instance and image (GiB).
        manifest: the pinned software manifest.
        result: the finished bake, None until ``gpuinfra image record``.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    stack: str = Field(pattern=NEW_STACK_NAME_RE.pattern)
    region: str = Field(pattern=r"^[a-z]+(?:-[a-z]+)+-?[0-9]{1,2}$")
    zone: str = Field(default="", pattern=r"^(?:[a-z]+(?:-[a-z]+)+[0-9]{1,2}-[a-z])?$")
    gcp_project: str | None = Field(default=None, pattern=GCP_PROJECT_ID_RE.pattern)
    build_instance_type: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{0,39}$")
    build_volume_size_gib: int = Field(ge=8, le=16384)
    manifest: SoftwareManifest
    result: BakeResult | None = None

    @property
    def cloud(self) -> str:
        """``aws`` | ``gcp`` (the manifest's)."""
        return self.manifest.cloud

    def to_config(self) -> dict[str, Any]:
        """The JSON-compatible mapping stored under ``gpuinfra:bake``."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_config(cls, value: Any) -> BakeSpec:
        """Parse ``gpuinfra:bake``.

        Raises:
            SpecError: not a mapping, or the first invalid field with its path.
        """
        return model_from_config(cls, value, "gpuinfra:bake", "gpuinfra image bake")
