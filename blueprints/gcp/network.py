"""VPCs of a GCP GPU cluster: the system network (Private Google Access, Cloud NAT egress, no
inbound except internal and optional IAP SSH) plus the GPU NIC networks of the machine's layout.

Sources: docs/sources/cluster-facts.md sections 2.3 and 6 rule 8; cluster-toolkit modules/network/vpc
(allow-internal tcp/udp/icmp on non-RoCE VPCs; RoCE VPCs take no firewall rules) and
modules/network/gpu-rdma-vpc (network profile ``<zone>-vpc-roce``).
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from gpuinfra.plan.gcp import IAP_SSH_RANGE, GcpClusterPlan
from gpuinfra.plan.naming import child
from gpuinfra.spec import ClusterSpec


def cloud_nat(
    name: str, network_id: pulumi.Input[str], region: str, project: str, opts: pulumi.ResourceOptions
) -> gcp.compute.RouterNat:
    """Egress for VMs without an external IP: a Cloud Router ``<name>-router`` on ``network_id``
    in ``region`` and a public Cloud NAT gateway ``<name>-nat`` on it for every subnet range.
    Used by the cluster's system network and by the GCP image bake's network.

    Public NAT lets VMs without external IPv4 addresses make outbound connections to the
    internet and receive their replies, never unsolicited inbound ones
    (cloud.google.com/nat/docs/overview). ``AUTO_ONLY``: Cloud NAT adds regional external
    addresses as VMs need source ports and removes one when no source port on it is in use
    (cloud.google.com/nat/docs/ports-and-addresses, "Automatic NAT IP address allocation"), so
    a network without running VMs holds none; the gateway bills per VM using it and per GB
    processed (cloud.google.com/nat/pricing; prices.yaml ``cloud_nat_per_vm_hour``,
    ``cloud_nat_per_gb``).

    Args:
        name: component name (prefix of the children's names).
        network_id: the VPC network (an output is accepted).
        region: the region of the router and the gateway (e.g. ``us-central1``).
        project: the project id.
        opts: options of both children (the component as parent).
    """
    router = gcp.compute.Router(child(name, "router"), network=network_id, region=region, project=project, opts=opts)
    return gcp.compute.RouterNat(
        child(name, "nat"),
        router=router.name,
        region=region,
        nat_ip_allocate_option="AUTO_ONLY",
        source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
        project=project,
        opts=opts,
    )


def build_networks(
    name: str, spec: ClusterSpec, plan: GcpClusterPlan, project: str, parent: pulumi.Resource
) -> list[tuple[str, list[gcp.compute.Subnetwork]]]:
    """Create the VPCs and subnets; return ``(nic_type, subnets)`` per network in NIC order."""
    opts = pulumi.ResourceOptions(parent=parent)
    result = []
    for net in plan.networks:
        network = gcp.compute.Network(
            child(name, net.role),
            auto_create_subnetworks=False,
            mtu=net.mtu,
            network_profile=(f"projects/{project}/global/networkProfiles/{spec.zone}-vpc-roce" if net.roce else None),
            routing_mode="REGIONAL",
            project=project,
            opts=opts,
        )
        subnets = [
            gcp.compute.Subnetwork(
                child(name, f"{net.role}-subnet" if len(net.subnets) == 1 else f"{net.role}-subnet-{i}"),
                network=network.id,
                ip_cidr_range=cidr,
                region=spec.region,
                private_ip_google_access=net.role == "system",
                project=project,
                opts=opts,
            )
            for i, cidr in enumerate(net.subnets)
        ]
        if net.firewall:
            gcp.compute.Firewall(
                child(name, f"{net.role}-allow-internal"),
                network=network.id,
                direction="INGRESS",
                source_ranges=list(net.subnets),
                allows=[
                    gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["0-65535"]),
                    gcp.compute.FirewallAllowArgs(protocol="udp", ports=["0-65535"]),
                    gcp.compute.FirewallAllowArgs(protocol="icmp"),
                ],
                description="gpuinfra: all traffic between cluster nodes on this network",
                project=project,
                opts=opts,
            )
        if net.role == "system":
            cloud_nat(name, network.id, spec.region, project, opts)
            if spec.network.iap_ssh:
                gcp.compute.Firewall(
                    child(name, "allow-iap-ssh"),
                    network=network.id,
                    direction="INGRESS",
                    source_ranges=[IAP_SSH_RANGE],
                    allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
                    description="gpuinfra: SSH through Identity-Aware Proxy only",
                    project=project,
                    opts=opts,
                )
        result.append((net.nic_type, subnets))
    return result
