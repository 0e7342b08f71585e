"""Network of an AWS GPU cluster: one VPC, the node subnet in exactly one AZ, egress, the S3
gateway endpoint, and the security group EFA needs.

Sources: awsome-distributed-training 1.architectures/1.vpc_network/2.vpc-one-az.yaml (one-AZ
VPC for EFA clusters: public subnet with a NAT gateway, private subnet for the nodes, S3 gateway
endpoint, SG with self-referencing rules); ParallelCluster EfaSecurityGroupValidator ("An EFA
requires a security group that allows all inbound and outbound traffic to and from the
security group itself").
"""

from __future__ import annotations

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
            _nat_egress(name, spec, vpc, igw, route_table, opts)
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


def _nat_egress(name, spec, vpc, igw, route_table, opts) -> None:
    """Multi-card nodes get no public IPv4: egress through a NAT gateway in a /28 of the same AZ."""
    nat_subnet = aws.ec2.Subnet(
        child(name, "nat"),
        vpc_id=vpc.id,
        cidr_block=NAT_SUBNET_CIDR,
        availability_zone_id=spec.zone,
        tags=aws_tags(spec, Name=child(name, "nat")),
        opts=opts,
    )
    public_rt = aws.ec2.RouteTable(
        child(name, "nat-rt"), vpc_id=vpc.id, tags=aws_tags(spec, Name=child(name, "nat-rt")), opts=opts
    )
    aws.ec2.Route(
        child(name, "nat-default"),
        route_table_id=public_rt.id,
        destination_cidr_block="0.0.0.0/0",
        gateway_id=igw.id,
        opts=opts,
    )
    aws.ec2.RouteTableAssociation(
        child(name, "nat-rta"), subnet_id=nat_subnet.id, route_table_id=public_rt.id, opts=opts
    )
    eip = aws.ec2.Eip(child(name, "nat-eip"), domain="vpc", tags=aws_tags(spec, Name=child(name, "nat-eip")), opts=opts)
    nat = aws.ec2.NatGateway(
        child(name, "nat-gw"),
        subnet_id=nat_subnet.id,
        allocation_id=eip.id,
        tags=aws_tags(spec, Name=child(name, "nat-gw")),
        opts=opts,
    )
    aws.ec2.Route(
        child(name, "nodes-default"),
        route_table_id=route_table.id,
        destination_cidr_block="0.0.0.0/0",
        nat_gateway_id=nat.id,
        opts=opts,
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
