"""``gpuinfra:aws:ImageBake``: an EC2 Image Builder bake of one node family.

Children (``<name>-<role>``), all declared with ``pulumi_aws.imagebuilder`` / ``ecr`` / ``iam``:

* ``build-role``, ``build-core`` / ``build-ssm`` (managed policies), ``build-ecr`` (inline),
  ``build-profile``: the build instance's role. Image Builder's documented minimum is
  ``EC2InstanceProfileForImageBuilder`` + ``AmazonSSMManagedInstanceCore``
  (docs.aws.amazon.com/imagebuilder/latest/userguide/image-builder-setting-up.html, "Prerequisites":
  IAM role); container builds add ECR access, scoped here to the bake's one repository instead
  of the account-wide ``EC2InstanceProfileForImageBuilderECRContainerBuilds``
  (docs.aws.amazon.com/AmazonECR/latest/userguide/image-push-iam.html: push needs
  ``ecr:GetAuthorizationToken`` on ``*`` and the layer actions on the repository).
* ``repository``: ECR ``gpuinfra/<stack>``, tags ``IMMUTABLE`` and scan on push
  (pulumi-aws ``ecr.Repository.image_tag_mutability``: MUTABLE, IMMUTABLE, ...).
* ``vpc``, ``igw``, ``build-subnet`` (private: no public IPv4; + ``build-rt``, ``build-rta``,
  ``build-default`` to the NAT gateway), ``nat`` + ``nat-rt`` + ``nat-default`` + ``nat-rta``
  + ``nat-eip`` + ``nat-gw`` (the NAT gateway in a public /28, shared with the cluster:
  :func:`blueprints.aws.network.nat_egress`), ``s3-endpoint`` and ``build-sg`` (no inbound
  rule): the bake stack's own network (:func:`build_network`), so the build needs no default VPC. Image Builder launches the build instance in the infrastructure
  configuration's subnet with its security groups, and without them in the default VPC
  (pulumi-aws ``InfrastructureConfiguration.subnet_id``, "also requires security_group_ids";
  docs.aws.amazon.com/imagebuilder/latest/userguide/manage-infra-config.html).
* ``host-component`` + ``image-recipe`` (pinned base AMI, gp3 root volume on the base AMI's
  own root device, read with ``getAmi``) +
  ``infrastructure`` (CPU build instance, IMDSv2, terminate on failure) + ``distribution``
  (AMI name and manifest tags) + ``image``: the AMI. Its build instance also builds the training
  container from the boot path's Dockerfile (:func:`gpuinfra.bake.render.container_dockerfile`)
  on the pinned NGC base, pushes it to the repository as ``<repository>:bake-<manifest sha256[:12]>``
  and keeps it on the AMI (:func:`gpuinfra.bake.render.aws_host_phases` says why this is not an
  Image Builder container recipe: those take no nvcr.io parent).

Image Builder components and recipes are immutable per name and version, so their names carry
the manifest's SHA-256 (a changed manifest is a new name) and they are replaced delete-first.
Argument names and valid values: pulumi-aws 7 ``imagebuilder`` Args (checked in
tests/bake/test_aws_bake.py and by the ``provider-valid-values`` rule).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from blueprints.aws.network import nat_egress
from gpuinfra.bake.model import BakeSpec
from gpuinfra.bake.render import CONTAINER_PARAMETER, aws_host_phases, component_document
from gpuinfra.errors import BakeError
from gpuinfra.plan.aws import NODE_SUBNET_CIDR, VPC_CIDR
from gpuinfra.plan.naming import child

TYPE_TOKEN = "gpuinfra:aws:ImageBake"
IMAGE_BUILDER_POLICY = "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder"
SSM_MANAGED_POLICY = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
#: Recipe and component version (semantic ``major.minor.patch``; Image Builder adds the build).
RECIPE_VERSION = "1.0.0"
#: ECR actions to push and pull one repository (docs.aws.amazon.com/AmazonECR/latest/userguide/image-push-iam.html).
#: ``ecr:DescribeImages``: the build looks for the tag an earlier run of the bake pushed.
ECR_REPOSITORY_ACTIONS = [
    "ecr:BatchCheckLayerAvailability",
    "ecr:BatchGetImage",
    "ecr:CompleteLayerUpload",
    "ecr:DescribeImages",
    "ecr:GetDownloadUrlForLayer",
    "ecr:InitiateLayerUpload",
    "ecr:PutImage",
    "ecr:UploadLayerPart",
]


def ecr_policy_document(repository_arn: str) -> str:
    """Inline policy JSON: an ECR token (not scopable) and push/pull on one repository."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "EcrToken", "Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": "*"},
                {
                    "Sid": "BakeRepository",
                    "Effect": "Allow",
                    "Action": ECR_REPOSITORY_ACTIONS,
                    "Resource": [repository_arn],
                },
            ],
        }
    )


def container_tag(manifest_sha256: str) -> str:
    """ECR tag of a bake's training container: ``bake-<manifest sha256[:12]>`` (one per manifest;
    the repository's tags are immutable)."""
    return f"bake-{manifest_sha256[:12]}"


#: Outbound ports of the build instance: HTTPS (Systems Manager, S3, ECR, nvcr.io, the EFA
#: installer and aws-ofi-nccl downloads) and HTTP (Ubuntu package mirrors in ``apt-get``). DNS
#: and NTP go to the Amazon resolver and time service, which security groups do not filter
#: (docs.aws.amazon.com/vpc/latest/userguide/vpc-network-acls.html, "Amazon DNS server").
BUILD_EGRESS_PORTS = (443, 80)


@dataclass(frozen=True)
class BuildNetwork:
    """The bake's own private subnet and security group (ids, outputs at deploy), and the
    resources the build waits for before Image Builder launches its instance (the subnet's
    default route through the NAT gateway, its route table association, the S3 endpoint)."""

    vpc_id: pulumi.Output[str]
    subnet_id: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    egress_ready: list[pulumi.Resource]


def build_network(name: str, spec: BakeSpec, tags: dict[str, str], kids: pulumi.ResourceOptions) -> BuildNetwork:
    """The bake stack's own VPC: a **private** subnet for the build instance (no public IPv4:
    ``map_public_ip_on_launch`` off), egress through a NAT gateway in a public /28
    (:func:`blueprints.aws.network.nat_egress`, the cluster's own), and a security group with
    **no inbound rule** and outbound HTTPS/HTTP only.

    What the build instance must reach: Image Builder drives the build through the Systems
    Manager agent on the instance, which opens outbound HTTPS connections to the SSM endpoints,
    and the instance downloads the AWSTOE component manager from S3
    (docs.aws.amazon.com/imagebuilder/latest/userguide/vpc-interface-endpoints.html: "Image
    Builder downloads the AWSTOE component manager application and accesses managed resources
    from S3 buckets"; the agent calls the ``ssm``, ``ssmmessages`` and ``ec2messages`` endpoints:
    docs.aws.amazon.com/systems-manager/latest/userguide/systems-manager-setting-up-messageAPIs.html); the build also
    pulls from nvcr.io, downloads the EFA installer and aws-ofi-nccl, runs ``apt-get`` and pushes
    to ECR. A private subnet reaches all of them through the NAT gateway, and nothing on the
    internet can open a connection to the instance (docs.aws.amazon.com/vpc/latest/userguide/vpc-nat-gateway.html).
    S3 goes through the gateway endpoint (no charge, and no NAT per-GB charge). Interface
    endpoints for SSM/ECR would bill per endpoint-hour as well and cannot reach nvcr.io: the NAT
    gateway is still needed, so there are none.

    Image Builder launches the build (and test) instance in the infrastructure configuration's
    subnet with its security groups (docs.aws.amazon.com/imagebuilder/latest/userguide/manage-infra-config.html;
    pulumi-aws ``InfrastructureConfiguration.subnet_id`` "also requires security_group_ids");
    with no inbound rule nothing can open a connection to it (security groups are stateful:
    replies to its own connections return, docs.aws.amazon.com/vpc/latest/userguide/vpc-security-groups.html).

    Cost: the NAT gateway and its Elastic IP bill every hour the bake stack exists, from the
    start of ``gpuinfra up`` until ``gpuinfra down`` (:mod:`gpuinfra.bake.cost`), plus each GB
    the build moves through it.

    Reuses the cluster's address plan (:data:`gpuinfra.plan.aws.VPC_CIDR`,
    :data:`~gpuinfra.plan.aws.NODE_SUBNET_CIDR`, :data:`~gpuinfra.plan.aws.NAT_SUBNET_CIDR`)
    and NAT egress; not the cluster's security group, which admits all traffic among its members
    (EFA).

    Args:
        name: component name; spec: the bake (its ``region``); tags: tags of every resource;
        kids: options with the component as parent.
    """

    def tagged(tag_name: str) -> dict[str, str]:
        return {**tags, "Name": tag_name}

    vpc = aws.ec2.Vpc(
        child(name, "vpc"),
        cidr_block=VPC_CIDR,
        enable_dns_hostnames=True,
        enable_dns_support=True,
        tags=tagged(child(name, "vpc")),
        opts=kids,
    )
    igw = aws.ec2.InternetGateway(child(name, "igw"), vpc_id=vpc.id, tags=tagged(child(name, "igw")), opts=kids)
    subnet = aws.ec2.Subnet(
        child(name, "build-subnet"),
        vpc_id=vpc.id,
        cidr_block=NODE_SUBNET_CIDR,
        map_public_ip_on_launch=False,
        tags=tagged(child(name, "build-subnet")),
        opts=kids,
    )
    route_table = aws.ec2.RouteTable(
        child(name, "build-rt"), vpc_id=vpc.id, tags=tagged(child(name, "build-rt")), opts=kids
    )
    # the NAT subnet in the build subnet's zone (EC2 picks that one)
    egress = nat_egress(
        name, vpc.id, igw, route_table.id, subnet.availability_zone_id, tagged, kids, route_name="build-default"
    )
    association = aws.ec2.RouteTableAssociation(
        child(name, "build-rta"), subnet_id=subnet.id, route_table_id=route_table.id, opts=kids
    )
    s3_endpoint = aws.ec2.VpcEndpoint(
        child(name, "s3-endpoint"),
        vpc_id=vpc.id,
        service_name=f"com.amazonaws.{spec.region}.s3",
        vpc_endpoint_type="Gateway",
        route_table_ids=[route_table.id],
        tags=tagged(child(name, "s3-endpoint")),
        opts=kids,
    )
    group = aws.ec2.SecurityGroup(
        child(name, "build-sg"),
        vpc_id=vpc.id,
        description=f"gpuinfra bake {spec.stack}: build instance, no inbound, outbound HTTPS/HTTP",
        tags=tagged(child(name, "build-sg")),
        opts=kids,
    )
    for port in BUILD_EGRESS_PORTS:
        aws.ec2.SecurityGroupRule(
            child(name, f"build-sg-egress-{port}"),
            type="egress",
            security_group_id=group.id,
            protocol="tcp",
            from_port=port,
            to_port=port,
            cidr_blocks=["0.0.0.0/0"],
            description=f"outbound TCP {port}: SSM, S3, ECR, registries, packages",
            opts=kids,
        )
    return BuildNetwork(
        vpc_id=vpc.id,
        subnet_id=subnet.id,
        security_group_id=group.id,
        egress_ready=[*egress.ready, association, s3_endpoint],
    )


def _first(resources, kind: str, field: str) -> str:
    """``output_resources[0].<kind>[0].<field>`` of an Image Builder image, "" before it exists."""
    for resource in resources or []:
        for item in getattr(resource, kind, None) or []:
            value = getattr(item, field, None)
            if isinstance(value, list):
                value = value[0] if value else None
            if value:
                return value
    return ""


def base_root_device(ami_id: str) -> str:
    """The root device name of the base AMI as EC2 describes it (DescribeImages
    ``RootDeviceName``: ``/dev/sda1`` on the Ubuntu DLAMIs, ``/dev/xvda`` on Amazon Linux 2023
    ones). The recipe's root volume must name it: a mapping under another name adds a second
    volume and leaves the root at the AMI's own size (pulumi_aws
    ``ImageRecipeBlockDeviceMappingArgs.device_name``).

    Raises:
        BakeError: the AMI cannot be described in the bake's region (before any resource exists).
    """
    try:
        image = aws.ec2.get_ami(
            filters=[aws.ec2.GetAmiFilterArgs(name="image-id", values=[ami_id])], include_deprecated=True
        )
    except Exception as exc:  # the provider raises a plain Exception on invoke failure
        raise BakeError(f"base AMI {ami_id} cannot be described in the bake's region ({exc})") from None
    return image.root_device_name


class AwsImageBake(pulumi.ComponentResource):
    """The EC2 Image Builder bake of ``spec`` (module docstring lists the children).

    Args:
        name: component name (the stack name).
        spec: the bake spec (cloud ``aws``).
        opts: Pulumi options.

    Raises:
        ValueError: a non-AWS spec.
    """

    def __init__(self, name: str, spec: BakeSpec, opts: pulumi.ResourceOptions | None = None):
        if spec.cloud != "aws":
            raise ValueError(f"AwsImageBake needs an aws bake, got {spec.cloud!r}")
        super().__init__(TYPE_TOKEN, name, None, opts)
        m = spec.manifest
        root_device = base_root_device(m.base_image)
        tags = {"gpuinfra:stack": spec.stack, "gpuinfra:kind": "bake", **m.aws_tags()}
        suffix = m.sha256[:12]
        kids = pulumi.ResourceOptions(parent=self)
        immutable = pulumi.ResourceOptions(parent=self, delete_before_replace=True)

        role = aws.iam.Role(
            child(name, "build-role"),
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
                    ],
                }
            ),
            tags=tags,
            opts=kids,
        )
        aws.iam.RolePolicyAttachment(
            child(name, "build-core"), role=role.name, policy_arn=IMAGE_BUILDER_POLICY, opts=kids
        )
        aws.iam.RolePolicyAttachment(child(name, "build-ssm"), role=role.name, policy_arn=SSM_MANAGED_POLICY, opts=kids)
        self.repository = aws.ecr.Repository(
            child(name, "repository"),
            name=f"gpuinfra/{spec.stack}",
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            tags=tags,
            # kept on destroy: clusters made from the bake pull repo@sha256 from it, and ECR refuses
            # to delete a repository that holds images unless forced (API_DeleteRepository)
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
        )
        aws.iam.RolePolicy(
            child(name, "build-ecr"), role=role.id, policy=self.repository.arn.apply(ecr_policy_document), opts=kids
        )
        profile = aws.iam.InstanceProfile(child(name, "build-profile"), role=role.name, tags=tags, opts=kids)
        network = build_network(name, spec, tags, kids)
        infrastructure = aws.imagebuilder.InfrastructureConfiguration(
            child(name, "infrastructure"),
            name=f"gpuinfra-{spec.stack}",
            description=f"gpuinfra bake {spec.stack}: CPU build instance",
            instance_profile_name=profile.name,
            instance_types=[spec.build_instance_type],
            # the bake's own subnet and security group, not the default VPC (build_network)
            subnet_id=network.subnet_id,
            security_group_ids=[network.security_group_id],
            terminate_instance_on_failure=True,
            # hop limit 1: only the host's AWS CLI reads the instance role; the container build's RUN
            # steps (in Docker's bridge network, one hop further) cannot (IMDSv2 hop limit:
            # docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-IMDS-existing-instances.html)
            instance_metadata_options=aws.imagebuilder.InfrastructureConfigurationInstanceMetadataOptionsArgs(
                http_tokens="required", http_put_response_hop_limit=1
            ),
            resource_tags=tags,
            tags=tags,
            opts=kids,
        )

        container_uri = self.repository.repository_url.apply(lambda url: f"{url}:{container_tag(m.sha256)}")

        host_component = aws.imagebuilder.Component(
            child(name, "host-component"),
            name=f"gpuinfra-{spec.stack}-host-{suffix}",
            platform="Linux",
            version=RECIPE_VERSION,
            data=component_document(
                f"gpuinfra-{spec.stack}-host",
                "gpuinfra: fabric host stack, training container and manifest on the AMI",
                aws_host_phases(spec),
                {CONTAINER_PARAMETER: "URI of the training container built by this bake"},
            ),
            tags=tags,
            opts=immutable,
        )
        recipe = aws.imagebuilder.ImageRecipe(
            child(name, "image-recipe"),
            name=f"gpuinfra-{spec.stack}-{suffix}",
            version=RECIPE_VERSION,
            parent_image=m.base_image,
            components=[
                aws.imagebuilder.ImageRecipeComponentArgs(
                    component_arn=host_component.arn,
                    parameters=[
                        aws.imagebuilder.ImageRecipeComponentParameterArgs(
                            name=CONTAINER_PARAMETER, value=container_uri
                        )
                    ],
                )
            ],
            block_device_mappings=[
                aws.imagebuilder.ImageRecipeBlockDeviceMappingArgs(
                    device_name=root_device,
                    ebs=aws.imagebuilder.ImageRecipeBlockDeviceMappingEbsArgs(
                        volume_size=spec.build_volume_size_gib,
                        volume_type="gp3",
                        delete_on_termination="true",
                        encrypted="true",
                    ),
                )
            ],
            working_directory="/tmp",
            tags=tags,
            opts=immutable,
        )
        distribution = aws.imagebuilder.DistributionConfiguration(
            child(name, "distribution"),
            name=f"gpuinfra-{spec.stack}",
            distributions=[
                aws.imagebuilder.DistributionConfigurationDistributionArgs(
                    region=spec.region,
                    ami_distribution_configuration=aws.imagebuilder.DistributionConfigurationDistributionAmiDistributionConfigurationArgs(
                        name=f"gpuinfra-{spec.stack}-{{{{ imagebuilder:buildDate }}}}",
                        description=f"gpuinfra bake {spec.stack} (manifest sha256 {m.sha256})",
                        ami_tags=tags,
                    ),
                )
            ],
            tags=tags,
            opts=kids,
        )
        self.image = aws.imagebuilder.Image(
            child(name, "image"),
            image_recipe_arn=recipe.arn,
            infrastructure_configuration_arn=infrastructure.arn,
            distribution_configuration_arn=distribution.arn,
            image_tests_configuration=aws.imagebuilder.ImageImageTestsConfigurationArgs(image_tests_enabled=True),
            # the provider waits 60 min by default (terraform-provider-aws imagebuilder_image
            # "Timeouts"); this build also builds and pushes the container (7,200 s step limit)
            tags=tags,
            # the build instance starts with this: its subnet must already route out through the NAT
            opts=pulumi.ResourceOptions(
                parent=self, custom_timeouts=pulumi.CustomTimeouts(create="4h"), depends_on=network.egress_ready
            ),
        )
        self.image_id = self.image.output_resources.apply(lambda r: _first(r, "amis", "image"))
        self.container_uri = container_uri
        self.stack_name = spec.stack
        self.register_outputs(
            {"image_id": self.image_id, "container_image": self.container_uri, "manifest_sha256": m.sha256}
        )

    def exports(self) -> dict[str, object]:
        """Stack outputs: ``image_id`` (the AMI), ``container_image`` (ECR URI), ``manifest_sha256``,
        and the command that records them for ``gpuinfra new --image baked:<name>``."""
        return {
            "image_id": self.image_id,
            "container_image": self.container_uri,
            "record_command": f"gpuinfra image record {self.stack_name} --from-outputs",
        }
