"""Network of an AWS GPU cluster: one VPC, the node subnet in exactly one AZ, egress, the S3
gateway endpoint, and the security group EFA needs.

Sources: awsome-distributed-training 1.architectures/1.vpc_network/2.vpc-one-az.yaml (one-AZ
VPC for EFA clusters: public subnet with a NAT gateway, private subnet for the nodes, S3 gateway
endpoint, SG with self-referencing rules); ParallelCluster EfaSecurityGroupValidator ("An EFA
requires a security group that allows all inbound and outbound traffic to and from the
security group itself").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpuinfra.plan.aws import NAT_SUBNET_CIDR, NODE_SUBNET_CIDR, VPC_CIDR, AwsClusterPlan
from gpuinfra.plan.naming import child
from gpuinfra.plan.tags import aws_tags
from gpuinfra.spec import ClusterSpec


@dataclass
class Network:
    """What the nodes need from the network."""

    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    security_group_id: pulumi.Output[str]


def build_network(name: str, spec: ClusterSpec, plan: AwsClusterPlan, parent: pulumi.Resource) -> Network:
    """Create (or reuse) the VPC and subnet, egress, S3 endpoint and the cluster SG."""
    opts = pulumi.ResourceOptions(parent=parent)
    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    if spec.network.vpc_id:
        assert spec.network.subnet_id is not None  # ClusterSpec: vpc_id comes with subnet_id
        vpc_id, subnet_id = spec.network.vpc_id, spec.network.subnet_id
    else:
        vpc = aws.ec2.Vpc(
            child(name, "vpc"),
            cidr_block=VPC_CIDR,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags=aws_tags(spec, Name=child(name, "vpc")),
            opts=opts,
        )
        igw = aws.ec2.InternetGateway(
            child(name, "igw"), vpc_id=vpc.id, tags=aws_tags(spec, Name=child(name, "igw")), opts=opts
        )
        subnet = aws.ec2.Subnet(
            child(name, "nodes"),
            vpc_id=vpc.id,
            cidr_block=NODE_SUBNET_CIDR,
            availability_zone_id=spec.zone,
            map_public_ip_on_launch=False,
            tags=aws_tags(spec, Name=child(name, "nodes")),
            opts=opts,
        )
        route_table = aws.ec2.RouteTable(
            child(name, "nodes-rt"), vpc_id=vpc.id, tags=aws_tags(spec, Name=child(name, "nodes-rt")), opts=opts
        )
        if plan.egress == "nat":
            nat_egress(
                name, vpc.id, igw, route_table.id, spec.zone, lambda tag_name: aws_tags(spec, Name=tag_name), opts
            )
        else:
            aws.ec2.Route(
                child(name, "nodes-default"),
                route_table_id=route_table.id,
                destination_cidr_block="0.0.0.0/0",
                gateway_id=igw.id,
                opts=opts,
            )
        aws.ec2.RouteTableAssociation(
            child(name, "nodes-rta"), subnet_id=subnet.id, route_table_id=route_table.id, opts=opts
        )
        aws.ec2.VpcEndpoint(
            child(name, "s3-endpoint"),
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{spec.region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[route_table.id],
            tags=aws_tags(spec, Name=child(name, "s3-endpoint")),
            opts=opts,
        )
        vpc_id, subnet_id = vpc.id, subnet.id
    security_group = _security_group(name, spec, vpc_id, opts)
    return Network(vpc_id=vpc_id, subnet_id=subnet_id, security_group_id=security_group.id)


@dataclass(frozen=True)
class NatEgress:
    """What :func:`nat_egress` made that callers wait for: the gateway, the private route
    table's default route through it, and the NAT subnet's own way out (its default route to
    the internet gateway and that route table's association): a build that must reach the
    internet depends on all of them (:attr:`ready`)."""

    nat_gateway: aws.ec2.NatGateway
    default_route: aws.ec2.Route
    public_route: aws.ec2.Route
    public_association: aws.ec2.RouteTableAssociation

    @property
    def ready(self) -> list[pulumi.Resource]:
        """The resources after which instances of the private route table reach the internet."""
        return [self.nat_gateway, self.default_route, self.public_route, self.public_association]


def nat_egress(
    name: str,
    vpc_id: pulumi.Input[str],
    igw: aws.ec2.InternetGateway,
    route_table_id: pulumi.Input[str],
    zone_id: pulumi.Input[str] | None,
    tags: Callable[[str], dict[str, str]],
    opts: pulumi.ResourceOptions,
    route_name: str = "nodes-default",
) -> NatEgress:
    """Egress without a public address on the instances: a public NAT gateway with an Elastic IP
    in its own /28 (:data:`~gpuinfra.plan.aws.NAT_SUBNET_CIDR`) whose route table sends
    ``0.0.0.0/0`` to the internet gateway, and ``0.0.0.0/0`` of the private route table
    ``route_table_id`` to that NAT gateway. Used by the cluster (multi-card nodes, which get no
    public IPv4) and by the AWS image bake (its build instance).

    A public NAT gateway must sit in a public subnet and have an Elastic IP; instances in a
    private subnet reach the internet through it, and nothing on the internet can open a
    connection to them (docs.aws.amazon.com/vpc/latest/userguide/vpc-nat-gateway.html,
    "Public NAT gateways"; its scenario page nat-gateway-scenarios.html, "Access the internet
    from a private subnet"). A NAT gateway serves one Availability Zone: ``zone_id`` keeps its
    subnet in the instances' zone (cross-zone traffic would bill as inter-AZ transfer).

    Children (``<name>-<role>``): ``nat`` (subnet), ``nat-rt`` + ``nat-default`` (to the
    internet gateway) + ``nat-rta``, ``nat-eip``, ``nat-gw``, and ``route_name`` (the private
    default route). Billing: the gateway per hour and per GB processed, its Elastic IP as a
    public IPv4 address per hour (prices.yaml ``nat_gateway_per_hour``, ``nat_gateway_per_gb``,
    ``public_ipv4_per_hour``), for as long as the gateway exists.

    Args:
        name: component name (prefix of the children's names).
        vpc_id, igw, route_table_id: the VPC, its internet gateway (the resource: the Elastic IP
            and the NAT gateway wait for it, since a NAT gateway created in a VPC with no
            internet gateway attached fails with ``Gateway.NotAttached``:
            docs.aws.amazon.com/AWSEC2/latest/APIReference/API_NatGateway.html, ``failureCode``),
            the private route table.
        zone_id: AZ id of the NAT subnet (e.g. ``use1-az4``; an output is accepted), None to let
            EC2 choose.
        tags: tags of a child from its ``Name``.
        opts: options of every child (the component as parent).
        route_name: role of the private default route (the cluster's ``nodes-default``).
    """
    nat_subnet = aws.ec2.Subnet(
        child(name, "nat"),
        vpc_id=vpc_id,
        cidr_block=NAT_SUBNET_CIDR,
        availability_zone_id=zone_id,
        tags=tags(child(name, "nat")),
        opts=opts,
    )
    public_rt = aws.ec2.RouteTable(child(name, "nat-rt"), vpc_id=vpc_id, tags=tags(child(name, "nat-rt")), opts=opts)
    public_route = aws.ec2.Route(
        child(name, "nat-default"),
        route_table_id=public_rt.id,
        destination_cidr_block="0.0.0.0/0",
        gateway_id=igw.id,
        opts=opts,
    )
    public_association = aws.ec2.RouteTableAssociation(
        child(name, "nat-rta"), subnet_id=nat_subnet.id, route_table_id=public_rt.id, opts=opts
    )
    after_igw = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[igw]))
    eip = aws.ec2.Eip(child(name, "nat-eip"), domain="vpc", tags=tags(child(name, "nat-eip")), opts=after_igw)
    nat = aws.ec2.NatGateway(
        child(name, "nat-gw"),
        subnet_id=nat_subnet.id,
        allocation_id=eip.id,
        tags=tags(child(name, "nat-gw")),
        opts=after_igw,
    )
    route = aws.ec2.Route(
        child(name, route_name),
        route_table_id=route_table_id,
        destination_cidr_block="0.0.0.0/0",
        nat_gateway_id=nat.id,
        opts=opts,
    )
    return NatEgress(
        nat_gateway=nat, default_route=route, public_route=public_route, public_association=public_association
    )


def _security_group(name: str, spec: ClusterSpec, vpc_id, opts) -> aws.ec2.SecurityGroup:
    group = aws.ec2.SecurityGroup(
        child(name, "sg"),
        vpc_id=vpc_id,
        description=f"gpuinfra {spec.stack}: all traffic within the cluster (EFA), egress to the internet",
        tags=aws_tags(spec, Name=child(name, "sg")),
        opts=opts,
    )
    aws.ec2.SecurityGroupRule(
        child(name, "sg-self-ingress"),
        type="ingress",
        security_group_id=group.id,
        protocol="-1",
        from_port=0,
        to_port=0,
        self=True,
        description="EFA/NCCL: all traffic from members of this group",
        opts=opts,
    )
    aws.ec2.SecurityGroupRule(
        child(name, "sg-self-egress"),
        type="egress",
        security_group_id=group.id,
        protocol="-1",
        from_port=0,
        to_port=0,
        self=True,
        description="EFA/NCCL: all traffic to members of this group",
        opts=opts,
    )
    aws.ec2.SecurityGroupRule(
        child(name, "sg-egress-internet"),
        type="egress",
        security_group_id=group.id,
        protocol="-1",
        from_port=0,
        to_port=0,
        cidr_blocks=["0.0.0.0/0"],
        description="outbound: packages, container registries, SSM",
        opts=opts,
    )
    if spec.network.ssh_cidr:
        aws.ec2.SecurityGroupRule(
            child(name, "sg-ssh"),
            type="ingress",
            security_group_id=group.id,
            protocol="tcp",
            from_port=22,
            to_port=22,
            cidr_blocks=[spec.network.ssh_cidr],
            description="SSH from the CIDR given in the stack config",
            opts=opts,
        )
    return group
