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
            router = gcp.compute.Router(
                child(name, "router"), network=network.id, region=spec.region, project=project, opts=opts
            )
            gcp.compute.RouterNat(
                child(name, "nat"),
                router=router.name,
                region=spec.region,
                nat_ip_allocate_option="AUTO_ONLY",
                source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
                project=project,
                opts=opts,
            )
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
