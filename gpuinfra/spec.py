"""The cluster spec: the one contract between the CLI, the stack file and the blueprints.

``gpuinfra new`` builds a :class:`ClusterSpec`, the stack file stores it as the structured
config value ``gpuinfra:cluster``, and ``blueprints/__main__.py`` reads it back with
:func:`ClusterSpec.from_config` and hands it to the cloud's component. It is validated once,
here, with errors naming the field and what is allowed.

The spec records the *resolved* profile (every setting, not just its name): values edited
in the stack file win over the profile's defaults because the program only reads the file.
"""

from __future__ import annotations

import ipaddress
import math
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpuinfra.agent.node import END_SYNC_BOUND_SECONDS
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.gpus import GpuModel
from gpuinfra.errors import RequestError, SpecError
from gpuinfra.profiles import Profile
from gpuinfra.requests import CLOUD_NODE_LIMITS

#: 2: the spec carries the facts it was planned from (``facts``, ``gpu_facts``).
SCHEMA_VERSION: Literal[2] = 2

#: Pulumi stack names: "alphanumeric characters, hyphens, underscores, or periods"
#: (pulumi.com/learn/building-with-pulumi/understanding-stacks), at most 100 characters
#: (pulumi/pulumi sdk/go/common/tokens: ValidateStackName).
STACK_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_AWS_ZONE_ID_RE = re.compile(r"^[a-z]{2,}\d+-[a-z0-9-]+$")
# Grammars of the values a node's boot text, peer-discovery script or a stack output's command
# carries (every character a plain shell word, no YAML indicator at the start): checked when the
# spec is built (`new`) and read back (`preview`, the program), and by the rule
# ``node-values-grammar`` (gpuinfra/rules/node_values.py).
#: Region names: AWS ``us-east-1``, ``us-gov-west-1``, ``ap-southeast-2``
#: (docs.aws.amazon.com/global-infrastructure/latest/regions/aws-regions.html), GCP
#: ``us-central1``, ``europe-west4`` (cloud.google.com/compute/docs/regions-zones).
REGION_RE = re.compile(r"^[a-z]+(?:-[a-z0-9]+){1,3}$")
#: How far ``created_at`` may lie ahead of this machine's clock (two clocks differ a little); a
#: later time is a hand edit that would move the TTL, the cluster's main watchdog.
CREATED_AT_CLOCK_SKEW = timedelta(minutes=10)
#: AWS region names: ``us-east-1``, ``ap-southeast-2``, ``us-gov-west-1``
#: (docs.aws.amazon.com/global-infrastructure/latest/regions/aws-regions.html).
AWS_REGION = re.compile(r"^[a-z]{2}(?:-gov)?-[a-z]+-\d$")
#: GCP region names: ``us-central1``, ``europe-west4``, ``northamerica-northeast2``
#: (cloud.google.com/compute/docs/regions-zones).
GCP_REGION = re.compile(r"^[a-z]+-[a-z]+\d+$")
#: Cloud Storage multi-regions and predefined dual-regions with the continent they sit in
#: (cloud.google.com/storage/docs/locations#location-mr, #location-dr).
GCS_MULTI_REGIONS: dict[str, str] = {
    "us": "us",
    "eu": "europe",
    "asia": "asia",
    "nam4": "us",
    "eur4": "europe",
    "eur5": "europe",
    "eur7": "europe",
    "eur8": "europe",
    "asia1": "asia",
}
#: Zones: AWS AZ IDs ``use1-az4`` (docs.aws.amazon.com/ram/latest/userguide/working-with-az-ids.html),
#: GCP zones ``us-central1-a`` (a region, ``-``, a letter: cloud.google.com/compute/docs/regions-zones).
ZONE_RE = re.compile(r"^[a-z]+[a-z0-9]*(?:-[a-z0-9]+){1,4}$")
#: Instance / machine types: EC2 ``p5.48xlarge`` (family, generation, attributes, ``.``, size:
#: docs.aws.amazon.com/ec2/latest/instancetypes/instance-type-names.html), GCE ``a3-highgpu-8g``
#: (cloud.google.com/compute/docs/machine-resource).
INSTANCE_TYPE_RE = re.compile(r"^[a-z0-9]+(?:[.-][a-z0-9]+){1,4}$")
#: What each grammar allows, for the one-line error.
REGION_FORM = "lowercase words joined by '-', e.g. us-east-1 or us-central1"
ZONE_FORM = "an AWS AZ ID such as use1-az4 or a GCP zone such as us-central1-a"
INSTANCE_TYPE_FORM = "lowercase letters and digits joined by '.' or '-', e.g. p5.48xlarge or a3-highgpu-8g"

#: Where a stack's ``max_price_per_hour_usd`` travels with its resources for the CrossGuard
#: budget policy: an AWS tag ``12.5``, a GCP label ``12_5`` (label values take no '.':
#: cloud.google.com/compute/docs/labeling-resources#requirements).
AWS_BUDGET_TAG = "gpuinfra:max-price-per-hour-usd"
GCP_BUDGET_LABEL = "gpuinfra-max-price-per-hour-usd"
#: With a budget, the run length travels too, so per-run transfer is spread as in ``preview``.
AWS_RUN_HOURS_TAG = "gpuinfra:run-hours"
#: AWS tag (value ``true``) of a stack written with ``network.allow_world_ssh``: the rule
#: ``aws-ssh-not-world`` reads it, in ``gpuinfra preview`` and in the CrossGuard pack alike.
AWS_WORLD_SSH_TAG = "gpuinfra:allow-world-ssh"
GCP_RUN_HOURS_LABEL = "gpuinfra-run-hours"
#: EC2 starts ending the instances of a Capacity Block 30 minutes before the block ends ("Forty
#: minutes before your Capacity Block reservation ends ... any instances running in the reservation
#: will begin to terminate in 10 minutes": docs.aws.amazon.com/AWSEC2/latest/UserGuide/
#: capacity-blocks-monitor.html). A stack in a block ends its nodes earlier by this lead plus the
#: agent's checkpoint sync bound, so they are ended by the agent, with their checkpoints saved.
CAPACITY_BLOCK_TERMINATION_LEAD = timedelta(minutes=30)
CAPACITY_BLOCK_END_MARGIN = CAPACITY_BLOCK_TERMINATION_LEAD + timedelta(seconds=END_SYNC_BOUND_SECONDS)
#: A deployment id (:func:`new_deployment_id`): 12 lowercase hex digits, valid as an AWS tag value,
#: a GCP label value and a bucket key part.
DEPLOYMENT_ID_RE = re.compile(r"^[0-9a-f]{12}$")
#: A stack's name suffix (:func:`new_name_suffix`): 6 lowercase letters or digits. ``gpuinfra new``
#: writes one into the stack file once; every fixed physical name of the stack carries it
#: (:func:`gpuinfra.plan.naming.stack_id`), so two stacks with the same name (two project folders,
#: two users) in one account or project never share a resource. The alphabet is the intersection
#: of what those names allow: GCE names ``[a-z]([-a-z0-9]*[a-z0-9])?``
#: (cloud.google.com/compute/docs/naming-resources#resource-name-format), IAM custom role ids
#: ``[a-zA-Z0-9_.]`` (cloud.google.com/iam/docs/reference/rest/v1/projects.roles/create), AWS tag
#: values, SSM parameter names, CloudWatch dashboard / alarm and SNS topic names.
NAME_SUFFIX_RE = re.compile(r"^[a-z0-9]{6}$")
_GCP_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_GCP_PROJECT = r"[a-z][-a-z0-9]{4,28}[a-z0-9]"
#: EC2 resource ids: the resource's prefix, ``-``, then 8 (older) or 17 lowercase hex digits
#: (docs.aws.amazon.com/AWSEC2/latest/UserGuide/resource-ids.html). Prefixes: ``ami`` (an AMI,
#: docs.aws.amazon.com/AWSEC2/latest/UserGuide/finding-an-ami.html), ``vpc``, ``subnet``
#: (docs.aws.amazon.com/vpc/latest/userguide/how-it-works.html).
AMI_ID_RE = re.compile(r"^ami-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
VPC_ID_RE = re.compile(r"^vpc-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
SUBNET_ID_RE = re.compile(r"^subnet-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
#: A GCE image by name, ``projects/PROJECT/global/images/NAME``, or the newest of a family,
#: ``projects/PROJECT/global/images/family/FAMILY`` (cloud.google.com/compute/docs/images/image-families-best-practices,
#: cloud.google.com/compute/docs/reference/rest/v1/instances/insert ``initializeParams.sourceImage``);
#: PROJECT a project ID, NAME and FAMILY GCE names (cloud.google.com/compute/docs/naming-resources).
GCP_IMAGE_RE = re.compile(
    rf"^projects/(?P<project>{_GCP_PROJECT})/global/images/(?:family/(?P<family>{_GCP_NAME})|(?P<name>{_GCP_NAME}))$"
)
_GCP_RESERVATION_RE = re.compile(rf"^(?:projects/{_GCP_PROJECT}/reservations/)?{_GCP_NAME}$")


#: Names of new stacks (``gpuinfra new --name``). The name becomes part of cloud resource names,
#: so it follows the stricter rules of both clouds, and is never silently rewritten:
#:
#: * GCP resource names match ``[a-z]([-a-z0-9]*[a-z0-9])?`` in at most 63 characters
#:   (cloud.google.com/compute/docs/naming-resources#resource-name-format; the longest,
#:   ``<stack>-system-allow-internal`` plus Pulumi's 8-character random suffix, stays within it),
#:   and the nodes' service account ID ``gi-<stack>`` has 6 to 30 characters
#:   (cloud.google.com/iam/docs/service-accounts-create): at most 27 for the stack;
#: * AWS: the bucket prefix ``gpuinfra-<stack>-`` holds lowercase letters, digits and hyphens
#:   (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html) in at most 37
#:   characters (pulumi-aws ``Bucket.bucket_prefix``): at most 27 for the stack.
#:
#: (``gpuinfra/plan/naming.py`` ``dns_safe`` would lower-case and cut longer names; refusing
#: them keeps the resource names exactly the stack's.) Stack files read back only need
#: :data:`STACK_NAME_RE`, so stacks written before this rule can still be previewed and destroyed.
NEW_STACK_NAME_MAX = 27
NEW_STACK_NAME_RE = re.compile(rf"^[a-z](?:[-a-z0-9]{{0,{NEW_STACK_NAME_MAX - 2}}}[a-z0-9])?$")
#: GCP project IDs: "6 to 30 lowercase letters, digits, or hyphens. It must start with a letter.
#: Trailing hyphens are prohibited." (cloud.google.com/resource-manager/docs/creating-managing-projects;
#: Resource Manager API ``Project.projectId``). Restricted words (google, ssl ...) are checked by
#: Google when the project is created, not here.
GCP_PROJECT_ID_RE = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
#: Names a new stack may not take: sub-commands of a command whose first argument is otherwise
#: a stack name (``gpuinfra cost diff STACK_A STACK_B`` vs ``gpuinfra cost STACK``).
RESERVED_STACK_NAMES = frozenset({"diff"})

#: Shortest run a cost may be asked for (:data:`MIN_RUN_HOURS` in hours): one minute, the billing minimum of both clouds. EC2
#: bills Linux instances per second with a 60-second minimum
#: (https://aws.amazon.com/ec2/pricing/on-demand/, "Per-second billing";
#: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html), Compute
#: Engine per second with a 1-minute minimum
#: (https://cloud.google.com/compute/vm-instance-pricing, "Billing model for virtual machine
#: instances"). A shorter run is billed as this minimum, so its cost is the cost of this one;
#: refusing it keeps 1e-9 h from printing billions per hour (per-run charges spread over the run).
MIN_RUN_SECONDS = 60
MIN_RUN_HOURS = Decimal(MIN_RUN_SECONDS) / Decimal(3600)
#: Longest run a cost may be asked for (``new --hours``, ``cost --hours``, ``run_hours`` in the
#: stack file): one year, the longest TTL a stack may have (``Profile.ttl_hours`` <= 8760), so no
#: run is priced that its nodes could not live through.
MAX_RUN_HOURS = 8760


def check_run_hours(hours: float | None, flag: str = "--hours") -> Decimal | None:
    """A run length in hours (``--hours`` of ``new`` and ``cost``) as a Decimal; None stays None.

    Args:
        hours: the run length in hours, as given (a float from the command line).
        flag: how the value is named in the message.

    Raises:
        RequestError: not a number from :data:`MIN_RUN_HOURS` (one minute) to
            :data:`MAX_RUN_HOURS` (nan and inf included).
    """
    if hours is None:
        return None
    # compared in whole milliseconds, so 1/60 h written as a float (0.01666...6) is one minute
    ok = math.isfinite(hours) and 0 < hours <= MAX_RUN_HOURS and round(Decimal(str(hours)) * 3600, 3) >= MIN_RUN_SECONDS
    if not ok:
        raise RequestError(
            f"{flag} must be at least 1 minute (0.0167 h, the billing minimum) and at most "
            f"{MAX_RUN_HOURS} (one year), got {hours}"
        )
    return Decimal(str(hours))


def _shown(value: object) -> str:
    """``value`` for a one-line message: its repr, cut to 80 characters (a hostile value may be
    long or hold line breaks; repr writes them as escapes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def new_deployment_id() -> str:
    """A fresh deployment id (48 random bits as 12 hex digits, :data:`DEPLOYMENT_ID_RE`): ``gpuinfra
    up`` gives one to every deployment whose nodes it creates (:func:`gpuinfra.lifecycle.deploy`)."""
    import secrets

    return secrets.token_hex(6)


def new_name_suffix() -> str:
    """A fresh stack name suffix (:data:`NAME_SUFFIX_RE`): 6 random lowercase letters or digits
    (36^6, about 2.2e9 values), drawn once by ``gpuinfra new``."""
    import secrets
    import string

    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(6))


def check_stack_name(name: str) -> str:
    """Return ``name`` if it is a valid Pulumi stack name, else raise :class:`SpecError`."""
    if not isinstance(name, str) or not STACK_NAME_RE.fullmatch(name):
        raise SpecError(
            f"invalid stack name {name!r}: use 1-100 letters, digits, '-', '_' or '.' (Pulumi's stack-name rule)"
        )
    return name


def check_new_stack_name(name: str) -> str:
    """Return ``name`` if a new stack may take it (:data:`NEW_STACK_NAME_RE`, no ``--``: see
    :func:`gpuinfra.bake.render.image_name_prefix`; not one of :data:`RESERVED_STACK_NAMES`), else raise.

    Raises:
        SpecError: the name says what is wrong and what is allowed.
    """
    check_stack_name(name)
    if not NEW_STACK_NAME_RE.fullmatch(name):
        size = f" ({len(name)} characters)" if len(name) > NEW_STACK_NAME_MAX else ""
        raise SpecError(
            f"invalid stack name {name!r}{size}: use 1-{NEW_STACK_NAME_MAX} lowercase letters, digits or '-', starting "
            "with a letter and not ending with '-' (it becomes part of cloud resource names: GCE names and the "
            "service account gi-<stack> on GCP, the S3 bucket prefix gpuinfra-<stack>- on AWS)"
        )
    if "--" in name:
        raise SpecError(
            f"invalid stack name {name!r}: '--' is not allowed in a stack name (gpuinfra ends the stack name with "
            "'--' in the GCP node group's name and a GCP bake's image names, so that no other stack's names start "
            "the same way)"
        )
    if name in RESERVED_STACK_NAMES:
        raise SpecError(
            f"stack name {name!r} is reserved (`gpuinfra cost {name}` is a sub-command); choose another --name"
        )
    return name


def check_gcp_project_id(project: str, flag: str = "--gcp-project") -> str:
    """Return ``project`` if it is a valid GCP project ID (:data:`GCP_PROJECT_ID_RE`), else raise.

    Args:
        project: the value given.
        flag: what to call it in the message (``--gcp-project``, ``gcp_project``).

    Raises:
        SpecError: with the rule and where it comes from.
    """
    if not isinstance(project, str) or not GCP_PROJECT_ID_RE.fullmatch(project):
        raise SpecError(
            f"{flag} {project!r} is not a GCP project ID: use 6-30 lowercase letters, digits or '-', starting with "
            "a letter and not ending with '-' (the project ID, not its display name: `gcloud projects list`; "
            "cloud.google.com/resource-manager/docs/creating-managing-projects)"
        )
    return project


#: A pydantic model validated from a stack-file config value (:func:`model_from_config`).
ModelT = TypeVar("ModelT", bound=BaseModel)


#: Prefix lengths below which an address block counts as open to the world, by IP version. A
#: shorter prefix spans more than one of the blocks IANA hands out one at a time (IPv4: the /8
#: entries of www.iana.org/assignments/ipv4-address-space; IPv6: the /12 blocks given to the
#: regional registries, www.iana.org/assignments/ipv6-unicast-address-assignments): wider than
#: the network of anyone SSH should come from. 0.0.0.0/1 + 128.0.0.0/1 is 0.0.0.0/0 in two rules.
WORLD_PREFIX_BELOW = {4: 8, 6: 12}
WORLD_SSH_REFUSED = (
    "network.ssh_cidr {cidr} opens SSH (TCP 22) to the internet: give your own network (e.g. "
    "203.0.113.7/32) or none (SSM Session Manager); to open it anyway, write the stack with "
    "`gpuinfra new ... --ssh-cidr {cidr} --allow-world-ssh` (network.allow_world_ssh: true)"
)


def world_open(cidr: str) -> bool:
    """Whether the IPv4 or IPv6 block ``cidr`` is open to the world (:data:`WORLD_PREFIX_BELOW`).

    Raises:
        ValueError: not a CIDR block.
    """
    network = ipaddress.ip_network(cidr, strict=False)
    return network.prefixlen < WORLD_PREFIX_BELOW[network.version]


class NetworkSettings(BaseModel):
    """Networking overrides.

    Attributes:
        vpc_id: reuse an existing AWS VPC (with ``subnet_id``) instead of creating one.
        subnet_id: existing AWS subnet; must be in the spec's AZ (checked by the blueprint).
        ssh_cidr: AWS: allow inbound SSH (TCP 22) from this IPv4 CIDR only; None (default) = no
            SSH, access through SSM Session Manager. A block open to the world
            (:func:`world_open`) is refused unless ``allow_world_ssh``.
        allow_world_ssh: AWS: ``true``: ``ssh_cidr`` may be open to the world; written by
            ``gpuinfra new --allow-world-ssh`` so the stack file shows it was asked for (None,
            the default, is left out of the file).
        iap_ssh: GCP: allow SSH from Identity-Aware Proxy's range 35.235.240.0/20 only
            (OS Login decides who). ``gpuinfra new`` turns it on for GCP stacks: the nodes have
            no public IP, so IAP is the only way in (as SSM is on AWS).
    """

    model_config = ConfigDict(extra="forbid")

    vpc_id: str | None = None
    subnet_id: str | None = None
    ssh_cidr: str | None = None
    allow_world_ssh: bool | None = None
    iap_ssh: bool = False

    @field_validator("ssh_cidr")
    @classmethod
    def _cidr(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:  # IPv4: the rule's CidrIp is "the IPv4 address range, in CIDR format"
            # (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_AuthorizeSecurityGroupIngress.html)
            return str(ipaddress.IPv4Network(value, strict=False))
        except ValueError:
            raise ValueError(f"not an IPv4 CIDR block: {value!r} (e.g. 203.0.113.7/32)") from None

    @field_validator("vpc_id", "subnet_id")
    @classmethod
    def _aws_id(cls, value: str | None, info: ValidationInfo) -> str | None:
        grammar, prefix = (VPC_ID_RE, "vpc") if info.field_name == "vpc_id" else (SUBNET_ID_RE, "subnet")
        if value is not None and not grammar.fullmatch(value):
            raise ValueError(f"{_shown(value)} is not a {prefix} id: {prefix}- and 8 or 17 lowercase hex digits")
        return value

    @model_validator(mode="after")
    def _pair(self) -> NetworkSettings:
        if (self.vpc_id is None) != (self.subnet_id is None):
            raise ValueError("vpc_id and subnet_id go together: give both or neither")
        if self.ssh_cidr and world_open(self.ssh_cidr) and not self.allow_world_ssh:
            raise ValueError(WORLD_SSH_REFUSED.format(cidr=self.ssh_cidr))
        return self


class PriceSnapshot(BaseModel):
    """Per-node prices of the chosen offer when the stack was written (informational).

    Money is kept as decimal strings (USD per node-hour); None = not offered that way.
    """

    model_config = ConfigDict(extra="forbid")

    on_demand_price_per_hour_usd: str | None = None
    spot_price_per_hour_usd: str | None = None
    #: GCP flex-start (DWS) price per node-hour; None where the catalog has none.
    flex_start_price_per_hour_usd: str | None = None
    catalog_date: str

    @field_validator(
        "on_demand_price_per_hour_usd", "spot_price_per_hour_usd", "flex_start_price_per_hour_usd", mode="before"
    )
    @classmethod
    def _price(cls, value: Any) -> Any:
        """A price is a decimal number of USD per node-hour above 0 (catalog gate ``price > 0``);
        a YAML number is taken as its decimal text."""
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        try:
            price = Decimal(value) if isinstance(value, str) else None
        except ArithmeticError:
            price = None
        if price is None or not price.is_finite() or price <= 0:
            raise ValueError(
                f"not a price: {value!r}; use a decimal number of USD per node-hour above 0, "
                "e.g. '14.69354' (or remove the line: prices here are informational)"
            )
        return value


class DataSource(BaseModel):
    """The training data set a stack was planned for (``--data`` / ``--data-region``).

    Attributes:
        cloud: ``aws`` | ``gcp``.
        location: bucket region, or a Cloud Storage multi-/dual-region (``us``, ``nam4``).
        size_gb: decimal GB (10^9 bytes), as transfer is priced.
        uri: ``s3://`` / ``gs://`` URI, or "" when only a region was given.
    """

    model_config = ConfigDict(extra="forbid")

    cloud: Literal["aws", "gcp"]
    location: str = Field(min_length=1)
    size_gb: Decimal = Field(gt=0, allow_inf_nan=False)
    uri: str = ""

    @model_validator(mode="after")
    def _location_of_its_cloud(self) -> DataSource:
        known = (
            AWS_REGION.fullmatch(self.location)
            if self.cloud == "aws"
            else (GCP_REGION.fullmatch(self.location) or self.location in GCS_MULTI_REGIONS)
        )
        if not known:
            allowed = (
                "an AWS region like us-east-1"
                if self.cloud == "aws"
                else f"a GCP region like us-central1 or a Cloud Storage multi-/dual-region ({', '.join(GCS_MULTI_REGIONS)})"
            )
            raise ValueError(f"data location {self.location!r} is not {allowed}")
        return self

    def describe(self) -> str:
        """``2000 GB in s3://bucket/prefix (aws us-east-1)``."""
        where = f"{self.uri} ({self.cloud} {self.location})" if self.uri else f"{self.cloud} {self.location}"
        return f"{self.size_gb:f} GB in {where}"


class BakedImageRef(BaseModel):
    """The bake a cluster boots (``gpuinfra new --image baked:<name>`` writes it; the blueprints and
    the node boot read it, never the bake's own stack file).

    Attributes:
        bake: the bake's (stack) name.
        region: the region the bake's image lives in; the cluster's ``region`` must equal it (an
            AMI is regional: docs.aws.amazon.com/AWSEC2/latest/UserGuide/CopyingAMIs.html; the
            bake's Artifact Registry repository is regional too).
        root_snapshot_gib: size of the image's root disk (AWS: the root block device snapshot's
            ``Ebs.VolumeSize`` in DescribeImages; GCP: ``Image.diskSizeGb``). EC2 refuses a
            smaller root volume ("Volume of size ... is smaller than snapshot"), GCE a smaller boot
            disk, so the profile's ``root_disk_gib`` is never below it (rule ``baked-root-disk``).
        container_repository: where the bake's container can be pulled from, and the only
            repository the node identity may read: AWS the ECR repository ARN
            (``arn:aws:ecr:<region>:<account>:repository/<name>``), GCP the Artifact Registry
            repository (``projects/<p>/locations/<region>/repositories/<id>``); "" for none.
    """

    model_config = ConfigDict(extra="forbid")

    bake: str = Field(min_length=1)
    region: str = Field(min_length=1)
    root_snapshot_gib: int = Field(ge=1, le=65536)
    container_repository: str = Field(
        default="",
        pattern=r"^(|arn:aws[a-z-]*:ecr:[a-z0-9-]+:\d{12}:repository/[a-z0-9._/-]+"
        r"|projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/locations/[a-z0-9-]+/repositories/[a-z][-a-z0-9]{0,62})$",
    )

    @property
    def registry_host(self) -> str:
        """The registry Docker logs in to: ``<account>.dkr.ecr.<region>.amazonaws.com`` (ECR
        registry URI: docs.aws.amazon.com/AmazonECR/latest/userguide/Registries.html) or
        ``<region>-docker.pkg.dev`` (cloud.google.com/artifact-registry/docs/docker/names); ""
        without a repository."""
        repo = self.container_repository
        if repo.startswith("arn:"):
            parts = repo.split(":")
            suffix = ".cn" if parts[1] == "aws-cn" else ""  # China regions: amazonaws.com.cn
            return f"{parts[4]}.dkr.ecr.{parts[3]}.amazonaws.com{suffix}"
        if repo.startswith("projects/"):
            return f"{repo.split('/')[3]}-docker.pkg.dev"
        return ""


class ClusterSpec(BaseModel):
    """A GPU cluster as one validated object (stored as ``gpuinfra:cluster``).

    Attributes:
        schema_version: 2.
        stack: Pulumi stack name.
        cloud: ``aws`` | ``gcp``.
        region: region name.
        zone: AWS AZ ID (``use1-az4``) or GCP zone (``us-central1-a``): every node is here.
        instance_type: EC2 instance type / GCE machine type.
        gpu: canonical GPU model; gpu_count: GPUs per node; nodes: node count.
        spot: spot / preemptible capacity.
        capacity_reservation_id: target an On-Demand Capacity Reservation or Capacity Block
            (``cr-...``).
        capacity_reservation_instance_count: instances the reservation holds
            (``aws ec2 describe-capacity-reservations``); nodes may not exceed it.
        capacity_reservation_placement_group: the reservation's cluster placement group, if it
            has one (a targeted reservation uses its own group or none).
        capacity_reservation_zone: AZ ID of the reservation (``aws ec2
            describe-capacity-reservations``: ``AvailabilityZoneId``); must equal ``zone``.
        capacity_reservation_instance_type: instance type it reserves; must equal ``instance_type``.
        capacity_block: the reservation is an EC2 Capacity Block for ML.
        capacity_block_end: the Capacity Block's ``EndDate`` (UTC, EC2
            ``DescribeCapacityReservations``); :attr:`expires_at` ends the nodes
            :data:`CAPACITY_BLOCK_END_MARGIN` before it.
        capacity_block_start: the Capacity Block's ``StartDate`` (UTC): it takes no instances before
            it (state ``scheduled``, API_CapacityReservation ``State``), so ``up`` refuses to run
            earlier (:meth:`check_block_started`). None for other stacks.
        capacity_block_upfront_usd: the Capacity Block's upfront fee for the whole block (USD,
            a plain decimal string as :func:`gpuinfra.money.usd_json` writes it); ``cost``
            shows it as one upfront line and the total includes it. ``new`` writes the quote
            of ``DescribeCapacityBlockOfferings`` for the same block
            (:func:`gpuinfra.capacity.quote_capacity_block`); replace it with the amount on the
            purchase's bill when known. None: the total stays incomplete (never $0).
        capacity_block_price_source / capacity_block_price_date: where that fee comes from and
            the day it was read (``YYYY-MM-DD``); set together with the fee.
        profile: the resolved workload profile.
        run_hours: expected training time, for cost estimates.
        created_at: when the stack file was written (UTC); TTL counts from here.
        deployment_id: the current deployment (:func:`new_deployment_id`), written by ``gpuinfra
            up`` when it creates the nodes (first ``up``, ``up`` after ``down``, ``up
            --replace-nodes``); the nodes' node.env (``GPUINFRA_DEPLOYMENT``) and tags carry it,
            and health results, rank decisions and peer lists are scoped to it. None until then.
        name_suffix: the stack's random name suffix (:data:`NAME_SUFFIX_RE`), written once by
            ``gpuinfra new`` and never changed (``up`` and ``new --force`` keep it): physical names,
            the ``gpuinfra:stack-id`` tag / ``gpuinfra-stack-id`` label and node selection use
            ``<stack>-<suffix>`` (:func:`gpuinfra.plan.naming.stack_id`). None in stack files
            written before it existed: ``preview`` and ``up`` refuse those
            (:meth:`check_name_suffix`).
        gcp_project: GCP project id (GCP only; may also come from ``gcp:project``).
        gcp_reservation: consume this GCP reservation (specific reservation affinity): its name,
            or ``projects/OWNER_PROJECT/reservations/NAME`` for a shared reservation. On types not
            sold on demand (A3 Ultra, A4) the VMs are ``RESERVATION_BOUND``.
        gcp_reservation_accepts_placement: the reservation is a dense/block reservation that
            takes an external compact placement policy (vanilla reservations do not).
        gcp_reservation_bound: the reservation is a calendar-mode / future reservation whose VMs
            are ``RESERVATION_BOUND`` (cloud.google.com/compute/docs/instances/about-reservation-bound-vms);
            None (default): bound exactly when the type is not sold on demand (A3 Ultra, A4).
        gcp_flex_start: GCP only: the VMs are ``FLEX_START`` (Dynamic Workload Scheduler
            flex-start, cloud.google.com/compute/docs/instances/about-flex-start-vms), created
            all at once by a MIG resize request that runs them for at most seven days
            (``gpuinfra new --flex-start``; :mod:`gpuinfra.plan.flex_start`). Excludes spot and
            reservations.
        network: networking overrides.
        ami_id: AWS AMI override (else the DLAMI SSM parameter of the profile).
        gcp_image: GCP image override (else the DLVM family of the profile).
        baked_image: the bake ``ami_id`` / ``gcp_image`` comes from (:class:`BakedImageRef`), or
            None: the node then keeps Docker's image store where the bake put it, logs Docker in
            to the bake's repository, and its identity may read that repository only.
        delete_bucket_on_destroy: destroy the bucket with the stack (default: keep data).
        price: prices when the stack was written.
        max_price_per_hour_usd: the stack's budget: ``preview`` / ``new`` refuse a stack whose
            priced $/h is over it or has an unpriced line (rule ``budget-max-price``), and the
            nodes carry it as a tag / label for the CrossGuard budget policy.
        spot_max_price_per_hour_usd: AWS spot only: the most the EC2 Fleet may pay per
            instance-hour (the fleet's launch template override ``MaxPrice``; ``MaxTotalPrice``
            is this times ``nodes``), so a node never bills above the price its budget was
            checked against. ``gpuinfra new`` sets it to the budgeted spot price (the catalog's
            spot price of the offer) unless ``--spot-max-price`` gives another, positive and
            not above on-demand. None: no maximum (AWS then caps at the on-demand price).
            docs.aws.amazon.com/AWSEC2/latest/APIReference/API_FleetLaunchTemplateOverridesRequest.html,
            docs.aws.amazon.com/AWSEC2/latest/APIReference/API_SpotOptionsRequest.html. GCP
            Spot VMs have no maximum price (cloud.google.com/compute/docs/instances/spot).
        facts: the hardware facts of ``instance_type`` the plan was built from (copied from the
            catalog by ``gpuinfra new``); the blueprints read these, never the catalog.
        gpu_facts: the GPU model's facts (memory, GCP accelerator type).
        data: the data set the offer was chosen for; the cost preview prices moving it once.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[2] = SCHEMA_VERSION
    stack: str
    cloud: Literal["aws", "gcp"]
    region: str = Field(min_length=1)
    zone: str = Field(min_length=1)
    instance_type: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    gpu_count: int = Field(ge=1, le=64, strict=True)
    nodes: int = Field(ge=1, strict=True)
    spot: bool = False
    capacity_reservation_id: str | None = Field(default=None, pattern=r"^cr-[0-9a-f]{8,17}$")
    capacity_reservation_instance_count: int | None = Field(default=None, ge=1)
    capacity_reservation_placement_group: str | None = None
    capacity_reservation_zone: str | None = None
    capacity_reservation_instance_type: str | None = None
    capacity_block: bool = False
    capacity_block_end: datetime | None = None
    capacity_block_start: datetime | None = None
    capacity_block_upfront_usd: str | None = Field(default=None, pattern=r"^[0-9]{1,12}(\.[0-9]{1,6})?$")
    capacity_block_price_source: str | None = Field(default=None, min_length=1, max_length=300)
    capacity_block_price_date: str | None = Field(default=None, pattern=r"^20[0-9]{2}-[01][0-9]-[0-3][0-9]$")
    profile: Profile
    run_hours: float = Field(ge=float(MIN_RUN_HOURS), le=MAX_RUN_HOURS)
    created_at: datetime
    deployment_id: str | None = Field(default=None, pattern=DEPLOYMENT_ID_RE.pattern)
    name_suffix: str | None = Field(default=None, pattern=NAME_SUFFIX_RE.pattern)
    gcp_project: str | None = None
    gcp_reservation: str | None = None
    gcp_reservation_accepts_placement: bool = False
    gcp_reservation_bound: bool | None = None
    gcp_flex_start: bool = False
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    ami_id: str | None = None
    gcp_image: str | None = None
    baked_image: BakedImageRef | None = None
    delete_bucket_on_destroy: bool = False
    price: PriceSnapshot | None = None
    max_price_per_hour_usd: Decimal | None = Field(default=None, gt=0, allow_inf_nan=False)
    spot_max_price_per_hour_usd: Decimal | None = Field(default=None, gt=0, allow_inf_nan=False)
    facts: InstanceFacts
    gpu_facts: GpuModel
    data: DataSource | None = None

    @field_validator("schema_version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        if value == 1:
            raise ValueError(
                "this stack file was written by gpuinfra 0.1 (schema 1, without the facts the plan "
                "was built from); write it again with `gpuinfra new ... --force`"
            )
        return value

    @field_validator("gcp_reservation")
    @classmethod
    def _reservation(cls, value: str | None) -> str | None:
        # A reservation of this project is named by its name; a shared one by
        # projects/OWNER_PROJECT/reservations/NAME (cloud.google.com/compute/docs/instances/reservations-consume)
        if value is not None and not _GCP_RESERVATION_RE.fullmatch(value):
            raise ValueError(f"{value!r} is neither a reservation name nor projects/OWNER_PROJECT/reservations/NAME")
        return value

    @field_validator("ami_id")
    @classmethod
    def _ami_id(cls, value: str | None) -> str | None:
        if value is not None and not AMI_ID_RE.fullmatch(value):
            raise ValueError(f"{_shown(value)} is not an AMI id: ami- and 8 or 17 lowercase hex digits")
        return value

    @field_validator("gcp_image")
    @classmethod
    def _gcp_image(cls, value: str | None) -> str | None:
        if value is not None and not GCP_IMAGE_RE.fullmatch(value):
            raise ValueError(
                f"{_shown(value)} is not a GCE image: projects/PROJECT/global/images/NAME or "
                "projects/PROJECT/global/images/family/FAMILY"
            )
        return value

    @field_validator("gcp_project")
    @classmethod
    def _gcp_project(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                check_gcp_project_id(value, "")
            except SpecError as exc:
                raise ValueError(str(exc).strip()) from None
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not REGION_RE.fullmatch(value):
            raise ValueError(f"{_shown(value)} is not a region name: use {REGION_FORM}")
        return value

    @field_validator("zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if not ZONE_RE.fullmatch(value):
            raise ValueError(f"{_shown(value)} is not a zone: use {ZONE_FORM}")
        return value

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        if not INSTANCE_TYPE_RE.fullmatch(value):
            raise ValueError(f"{_shown(value)} is not an instance type: use {INSTANCE_TYPE_FORM}")
        return value

    @field_validator("stack")
    @classmethod
    def _stack(cls, value: str) -> str:
        if not STACK_NAME_RE.fullmatch(value):
            raise ValueError("use 1-100 letters, digits, '-', '_' or '.' (Pulumi's stack-name rule)")
        return value

    @field_validator("created_at", "capacity_block_end", "capacity_block_start")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    @model_validator(mode="after")
    def _cross_field(self) -> ClusterSpec:
        limit = CLOUD_NODE_LIMITS[self.cloud]
        if self.nodes > limit.nodes:
            raise ValueError(
                f"nodes {self.nodes} is over the {self.cloud.upper()} limit of {limit.nodes} {limit.what} "
                f"(source: {limit.source})"
            )
        if self.created_at > datetime.now(UTC) + CREATED_AT_CLOCK_SKEW:
            raise ValueError(
                f"created_at {self.created_at.isoformat()} is in the future: the TTL and the age count from it "
                "(write the stack again with `gpuinfra new ... --force`)"
            )
        # a GCP zone is its region, '-', one letter (cloud.google.com/compute/docs/regions-zones)
        if self.cloud == "gcp" and not re.fullmatch(re.escape(self.region) + r"-[a-z]", self.zone):
            raise ValueError(f"zone {self.zone!r} is not in region {self.region!r} (use {self.region}-a, -b ...)")
        if self.cloud == "aws" and not _AWS_ZONE_ID_RE.fullmatch(self.zone):
            raise ValueError(f"AWS zone must be an AZ ID such as use1-az4, got {self.zone!r}")
        if self.capacity_block and not self.capacity_reservation_id:
            raise ValueError("capacity_block needs capacity_reservation_id (the Capacity Block's cr-... id)")
        if self.capacity_block_start is not None and not self.capacity_block:
            raise ValueError("capacity_block_start is the start of a Capacity Block: it needs capacity_block: true")
        if self.capacity_block_end is not None and not self.capacity_block:
            raise ValueError("capacity_block_end is the end of a Capacity Block: it needs capacity_block: true")
        price = (self.capacity_block_upfront_usd, self.capacity_block_price_source, self.capacity_block_price_date)
        if any(x is not None for x in price):
            if not self.capacity_block:
                raise ValueError(
                    "capacity_block_upfront_usd is the fee of a Capacity Block: it needs capacity_block: true"
                )
            if any(x is None for x in price):
                raise ValueError(
                    "capacity_block_upfront_usd, capacity_block_price_source and capacity_block_price_date go together"
                )
            if Decimal(str(self.capacity_block_upfront_usd)) <= 0:
                raise ValueError(
                    f"capacity_block_upfront_usd must be above 0 (a Capacity Block is paid up front), "
                    f"got {self.capacity_block_upfront_usd}"
                )
            try:
                datetime.strptime(str(self.capacity_block_price_date), "%Y-%m-%d")
            except ValueError:
                raise ValueError(
                    f"capacity_block_price_date {self.capacity_block_price_date!r} is not a date (YYYY-MM-DD)"
                ) from None
        if (
            self.capacity_reservation_instance_count
            or self.capacity_reservation_placement_group
            or self.capacity_reservation_zone
            or self.capacity_reservation_instance_type
        ) and not self.capacity_reservation_id:
            raise ValueError(
                "capacity_reservation_instance_count/placement_group/zone/instance_type need capacity_reservation_id"
            )
        if self.spot and self.capacity_reservation_id:
            raise ValueError("spot and capacity_reservation_id exclude each other")
        if self.spot and self.profile.spot.policy == "forbidden":
            raise ValueError(f"profile {self.profile.name!r} forbids spot capacity")
        if self.cloud == "gcp" and (
            self.network.vpc_id
            or self.ami_id
            or self.network.ssh_cidr
            or self.network.allow_world_ssh
            or self.capacity_reservation_id
        ):
            raise ValueError(
                "network.vpc_id/subnet_id/ssh_cidr/allow_world_ssh, ami_id and capacity_reservation_id are AWS settings"
            )
        if self.baked_image and not (self.ami_id or self.gcp_image):
            raise ValueError("baked_image needs the bake's image id in ami_id (AWS) or gcp_image (GCP)")
        if self.gcp_reservation_bound and not self.gcp_reservation:
            raise ValueError("gcp_reservation_bound needs gcp_reservation (the reservation the VMs are bound to)")
        if self.spot and (self.gcp_reservation or self.gcp_reservation_bound):
            raise ValueError("spot and gcp_reservation / gcp_reservation_bound exclude each other")
        if self.gcp_flex_start and (self.cloud != "gcp" or self.spot or self.gcp_reservation):
            raise ValueError("gcp_flex_start is a GCP market of its own: it excludes spot and gcp_reservation")
        if self.cloud == "aws" and (self.gcp_reservation or self.network.iap_ssh):
            raise ValueError("gcp_reservation and network.iap_ssh are GCP settings")
        if self.cloud == "aws" and self.gcp_image:
            raise ValueError("gcp_image is a GCP setting")
        if (self.facts.cloud, self.facts.instance_type) != (self.cloud, self.instance_type):
            raise ValueError(
                f"facts describe {self.facts.cloud} {self.facts.instance_type}, not "
                f"{self.cloud} {self.instance_type}; write the stack again with `gpuinfra new`"
            )
        if not self.facts.guest_accelerators and (self.facts.gpu, self.facts.gpu_count) != (self.gpu, self.gpu_count):
            raise ValueError(
                f"{self.instance_type} carries {self.facts.gpu_count}x{self.facts.gpu}, not {self.gpu_count}x{self.gpu}"
            )
        if self.gpu_facts.name != self.gpu:
            raise ValueError(f"gpu_facts describe {self.gpu_facts.name}, not {self.gpu}")
        if self.facts.guest_accelerators and not self.gpu_facts.gcp_accelerator_type:
            raise ValueError(f"{self.gpu} cannot be attached to {self.instance_type} (no GCP accelerator type)")
        return self

    def check_name_suffix(self) -> None:
        """Refuse a stack file without :attr:`name_suffix` (written before it existed): its
        physical names (SSM parameter, dashboard, alarm, topic; GCP group, service account, role)
        and node selection would be those of every other stack with the same name in the account
        or project. ``preview`` and ``up`` call it; ``down`` does not, so old stacks can still be
        destroyed.

        Raises:
            SpecError: with the line to add (exit 2).
        """
        if self.name_suffix is None:
            raise SpecError(
                f"stack {self.stack!r} has no gpuinfra:cluster.name_suffix (written before stack files had one), so "
                "its cloud names would collide with any other stack of that name in the account or project: add "
                f"`name_suffix: {new_name_suffix()}` (any 6 lowercase letters or digits) under gpuinfra:cluster; on a "
                "stack that is up, this renames and so replaces its monitoring resources (AWS) or its node group, "
                "service account and role (GCP), so run `gpuinfra down` first if it is running"
            )

    @property
    def ttl_end(self) -> datetime:
        """created_at + profile TTL (UTC), before any cap."""
        return self.created_at + timedelta(hours=self.profile.ttl_hours)

    @property
    def expires_at(self) -> datetime:
        """When the node agent and ``reap`` end the cluster (UTC): :attr:`ttl_end`, capped in a
        Capacity Block to :attr:`capacity_block_end` minus :data:`CAPACITY_BLOCK_END_MARGIN` (EC2's
        30-minute lead and the agent's sync bound)."""
        if self.capacity_block_end is None:
            return self.ttl_end
        return min(self.ttl_end, self.capacity_block_end - CAPACITY_BLOCK_END_MARGIN)

    def check_block_started(self, now: datetime) -> None:
        """Refuse ``up`` before the Capacity Block's start (:attr:`capacity_block_start`): until then
        the block is ``scheduled`` and takes no instances, so the launch would fail.

        Raises:
            SpecError: with the start time (exit 2).
        """
        if self.capacity_block_start is not None and now < self.capacity_block_start:
            raise SpecError(
                f"capacity block {self.capacity_reservation_id} starts at {self.capacity_block_start:%Y-%m-%d %H:%M} UTC "
                f"and takes no instances before: run `gpuinfra up {self.stack}` then or later"
            )

    def check_ttl_within_block(self) -> None:
        """Refuse a TTL that runs past the Capacity Block's end less :data:`CAPACITY_BLOCK_END_MARGIN`
        (``preview`` and ``new``: the nodes would otherwise be ended by EC2, without the agent's
        checkpoint sync, instead of by the agent).

        Raises:
            SpecError: with the latest TTL that fits (exit 2).
        """
        if self.capacity_block_end is None or self.ttl_end <= self.expires_at:
            return
        fits = int((self.capacity_block_end - CAPACITY_BLOCK_END_MARGIN - self.created_at).total_seconds() // 3600)
        raise SpecError(
            f"gpuinfra:cluster.profile.ttl_hours {self.profile.ttl_hours} ends at {self.ttl_end:%Y-%m-%d %H:%M} UTC, "
            f"past capacity block {self.capacity_reservation_id} (it ends at {self.capacity_block_end:%Y-%m-%d %H:%M} "
            f"UTC and EC2 begins to end its instances 30 min before): set ttl_hours to at most {max(fits, 0)}, "
            "so the nodes are ended by the agent with their checkpoints saved"
        )

    @property
    def market(self) -> str:
        """The catalog market the nodes are bought in (:data:`gpuinfra.catalog.model.MARKETS`):
        ``flex-start``, ``spot`` or ``on-demand``."""
        return "flex-start" if self.gcp_flex_start else ("spot" if self.spot else "on-demand")

    @property
    def price_per_hour_usd(self) -> Decimal | None:
        """Cluster $/h recorded when the stack was written (spot or on-demand as planned), or
        None when unknown."""
        if self.price is None:
            return None
        per_node = {
            "flex-start": self.price.flex_start_price_per_hour_usd,
            "spot": self.price.spot_price_per_hour_usd,
            "on-demand": self.price.on_demand_price_per_hour_usd,
        }[self.market]
        return None if per_node is None else Decimal(per_node) * self.nodes

    @property
    def total_gpus(self) -> int:
        """GPUs over all nodes."""
        return self.gpu_count * self.nodes

    def to_config(self) -> dict[str, Any]:
        """The JSON-compatible mapping stored under ``gpuinfra:cluster``."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_config(cls, value: Any) -> ClusterSpec:
        """Parse ``gpuinfra:cluster`` from a stack file or ``pulumi.Config``.

        Raises:
            SpecError: with the first invalid field's path and message.
        """
        return model_from_config(cls, value, "gpuinfra:cluster", "gpuinfra new")


def model_from_config(model: type[ModelT], value: Any, key: str, written_by: str) -> ModelT:
    """Validate the stack-file config value ``key`` (``gpuinfra:cluster``, ``gpuinfra:bake``) as
    ``model``.

    Args:
        written_by: the command that writes the value (named in the error).

    Raises:
        SpecError: not a mapping, or the first invalid field with its path
            (:func:`format_validation_error`).
    """
    if not isinstance(value, dict):
        raise SpecError(f"{key} must be a mapping (see `{written_by}`)")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, key)) from None


def format_validation_error(exc: ValidationError, root: str) -> str:
    """One line naming the first failing field (``root.a.b``) and pydantic's reason."""
    first = exc.errors()[0]
    path = ".".join([root, *(str(p) for p in first["loc"])])
    message = first["msg"].removeprefix("Value error, ")
    extra = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{path}: {message}{extra}"
