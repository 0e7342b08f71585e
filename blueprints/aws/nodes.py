"""GPU nodes: AMI, placement group, launch template (EFA NICs, IMDSv2, encrypted gp3 root,
user data) and one EC2 Fleet of type ``instant`` for all nodes.

One request for all nodes keeps the Pulumi resource count independent of the node count and
gives all-or-nothing capacity (``min_target_capacity`` = nodes with a single instance type in
a single AZ). Instances are not replaced by the fleet, so a node that ends itself (idle/TTL
watchdog, instance-initiated shutdown = terminate) stays gone.
Sources: docs.aws.amazon.com/AWSEC2/latest/UserGuide/instant-fleet.html; docs/sources/cluster-facts.md
section 6 rules 2, 5, 6; ParallelCluster queues_stack.py launch templates.

Lifecycle:

* an instant fleet that launched fewer than ``nodes`` instances "succeeds" in the provider; the
  program reads ``fleet_instance_sets``, then the fleet's errors (``DescribeFleets``), and fails
  the update with the class of the cause (:mod:`gpuinfra.launch_errors`: capacity, quota, invalid
  parameter, IAM; ``gpuinfra up`` then destroys what was created, keeping the bucket);
* an instant fleet cannot be modified (ModifyFleet takes only ``maintain`` fleets:
  docs.aws.amazon.com/AWSEC2/latest/APIReference/API_ModifyFleet.html), so any change replaces
  it, the old one deleted first (its instances terminated) so two clusters never bill at once;
* an AMI resolved from the DLAMI SSM parameter is kept after the first ``up``
  (``ignore_changes`` on the launch template's image) so a new DLAMI release does not replace a
  running cluster; an ``ami_id`` in the stack file is applied as written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from blueprints.aws.network import Network
from gpuinfra.launch_errors import FleetError, describe_fleet_errors, fleet_launch_error
from gpuinfra.plan.aws import AwsClusterPlan
from gpuinfra.plan.boot_aws import encode_user_data, render_user_data
from gpuinfra.plan.naming import child
from gpuinfra.plan.node_bundle import NodeBundle
from gpuinfra.plan.tags import aws_tags
from gpuinfra.spec import ClusterSpec


def launched_instance_ids(
    fleet_instance_sets: Sequence | None,
    spec: ClusterSpec,
    read_errors: Callable[[], list[FleetError]] | None = None,
    fleet_id: str = "",
) -> list[str]:
    """Instance ids the instant fleet launched, when it launched all ``spec.nodes``.

    Args:
        fleet_instance_sets: the fleet's ``fleet_instance_sets`` output (SDK objects with
            ``instance_ids``).
        read_errors: reads the fleet's launch errors (``DescribeFleets``:
            :func:`gpuinfra.launch_errors.describe_fleet_errors`); None: none are read (a
            preview, where nothing launched).
        fleet_id: the fleet's id, for the message when its errors cannot be read.

    Raises:
        CapacityError: fewer than ``spec.nodes`` instances for lack of capacity (with
            ``min_target_capacity`` = nodes EC2 launches none when it cannot launch all).
        QuotaError, LaunchRejectedError, LaunchDeniedError, InstanceProfileNotReady: fewer
            for another cause (:func:`gpuinfra.launch_errors.launch_error`).
    """
    ids = [i for item in fleet_instance_sets or [] for i in (item.instance_ids or [])]
    if len(ids) < spec.nodes:
        raise fleet_launch_error(
            read_errors or list,
            len(ids),
            spec.nodes,
            spec.instance_type,
            spec.zone,
            spec.region,
            spec.stack,
            fleet_id,
        )
    return sorted(ids)


def fleet_errors_reader(region: str, fleet_id: str) -> Callable[[], list[FleetError]]:
    """Reads the launch errors of fleet ``fleet_id`` with boto3 (the credentials ``pulumi up`` runs
    with; 10 s timeouts, 2 attempts)."""

    def read() -> list[FleetError]:
        import boto3
        from botocore.config import Config

        ec2 = boto3.client(
            "ec2",
            region_name=region,
            config=Config(connect_timeout=10, read_timeout=10, retries={"max_attempts": 2}),
        )
        return describe_fleet_errors(ec2, fleet_id)

    return read


#: Fleet inputs that terraform-provider-aws updates through ModifyFleet (not ForceNew:
#: internal/service/ec2/ec2_fleet.go), which EC2 accepts only for ``maintain`` fleets; the other
#: inputs (type, on-demand/spot options, capacity type) are ForceNew in the provider already.
FLEET_REPLACE_ON_CHANGES = (
    "launchTemplateConfigs",
    "targetCapacitySpecification",
    "terminateInstances",
    "excessCapacityTerminationPolicy",
    "context",
)

#: gp3 baseline IOPS and throughput (MiB/s), included in the gp3 price
#: (docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html#gp3-ebs-volume-type).
GP3_IOPS = 3000
GP3_THROUGHPUT_MIBPS = 125


def build_launch_template(
    name: str,
    spec: ClusterSpec,
    plan: AwsClusterPlan,
    network: Network,
    ami_id: str,
    root_device_name: str,
    instance_profile: aws.iam.InstanceProfile,
    bucket: aws.s3.Bucket,
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource] | None = None,
    bundle: NodeBundle | None = None,
) -> tuple[aws.ec2.LaunchTemplate, aws.ec2.PlacementGroup | None]:
    """Placement group (when planned) and the launch template of the nodes; the template waits
    for ``depends_on`` (the node bundle object: no node boots before its bundle exists). The user
    data pins ``bundle``'s SHA-256 (the bundle object's; None: rendered from the spec)."""
    opts = pulumi.ResourceOptions(parent=parent)
    group = None
    group_name: pulumi.Input[str] | None = plan.placement_group_name
    if plan.placement_group:
        group = aws.ec2.PlacementGroup(child(name, "pg"), strategy="cluster", tags=aws_tags(spec), opts=opts)
        group_name = group.name
    interfaces = [
        aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            network_card_index=nic.network_card_index,
            device_index=nic.device_index,
            interface_type=nic.interface_type,
            subnet_id=network.subnet_id,
            security_groups=[network.security_group_id],
            delete_on_termination="true",
            associate_public_ip_address=(
                None if nic.associate_public_ip_address is None else str(nic.associate_public_ip_address).lower()
            ),
        )
        for nic in plan.interfaces
    ]
    user_data = bucket.bucket.apply(
        lambda bucket_name: encode_user_data(render_user_data(spec, plan, bucket_name, bundle))
    )
    capacity = None
    if spec.capacity_reservation_id:
        capacity = aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
            capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                capacity_reservation_id=spec.capacity_reservation_id,
            )
        )
    tags = aws_tags(spec)
    template = aws.ec2.LaunchTemplate(
        child(name, "lt"),
        image_id=ami_id,
        instance_type=spec.instance_type,
        iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=instance_profile.arn),
        network_interfaces=interfaces,
        placement=aws.ec2.LaunchTemplatePlacementArgs(group_name=group_name) if group_name else None,
        metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
            http_endpoint="enabled",
            http_tokens="required",  # IMDSv2 only
            http_put_response_hop_limit=2,  # containers on the node can reach IMDS
            instance_metadata_tags="enabled",  # the node agent reads gpuinfra:expires-at from IMDS
        ),
        block_device_mappings=[
            aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=root_device_name,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=spec.profile.root_disk_gib,
                    volume_type="gp3",
                    iops=GP3_IOPS,
                    throughput=GP3_THROUGHPUT_MIBPS,
                    encrypted="true",
                    delete_on_termination="true",
                ),
            )
        ],
        instance_initiated_shutdown_behavior="terminate",
        capacity_reservation_specification=capacity,
        instance_market_options=(
            aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")
            if spec.capacity_block
            else None
        ),
        user_data=user_data,
        tag_specifications=[
            aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags={**tags, "Name": child(name, "node")})
            for kind in ("instance", "volume", "network-interface")
        ],
        update_default_version=True,
        tags=tags,
        # a DLAMI resolved at the first `up` stays; an explicit ami_id is applied as written
        opts=pulumi.ResourceOptions(
            parent=parent, ignore_changes=None if spec.ami_id else ["imageId"], depends_on=depends_on
        ),
    )
    return template, group


def build_fleet(
    name: str, spec: ClusterSpec, plan: AwsClusterPlan, template: aws.ec2.LaunchTemplate, parent: pulumi.Resource
) -> aws.ec2.Fleet:
    """One instant EC2 Fleet launching all nodes in one request (all or nothing)."""
    single: dict[str, Any] = {
        "single_instance_type": True,
        "single_availability_zone": True,
        "min_target_capacity": spec.nodes,
    }
    on_demand = None
    spot = None
    max_price = spec.spot_max_price_per_hour_usd if plan.market == "spot" else None
    if plan.market == "spot":
        # MaxTotalPrice: the most the fleet pays per hour for all its Spot Instances
        # (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_SpotOptionsRequest.html); with
        # MaxPrice per instance-hour in the override below, a node never bills above the price
        # the budget was checked against. AWS advises against a maximum price because it can
        # raise interruptions (same page); here it is the price the budget rests on, by design.
        spot = aws.ec2.FleetSpotOptionsArgs(
            allocation_strategy="price-capacity-optimized",
            instance_interruption_behavior="terminate",
            max_total_price=None if max_price is None else format(max_price * spec.nodes, "f"),
            **single,
        )
    else:
        on_demand = aws.ec2.FleetOnDemandOptionsArgs(
            # the provider's spelling, not the EC2 API's "lowest-price" (pulumi_aws ec2/_inputs.py
            # FleetOnDemandOptionsArgs: "Valid values: `lowestPrice`, `prioritized`")
            allocation_strategy="lowestPrice",
            # an ODCR is used first; a Capacity Block is targeted by the launch template alone
            # (EC2 rejects CapacityReservationOptions with capacity-block: docs.aws.amazon.com/AWSEC2/
            # latest/UserGuide/ec2-fleet-launch-instances-capacity-blocks-walkthrough.html)
            capacity_reservation_options=(
                aws.ec2.FleetOnDemandOptionsCapacityReservationOptionsArgs(
                    usage_strategy="use-capacity-reservations-first"
                )
                if spec.capacity_reservation_id and not spec.capacity_block
                else None
            ),
            **single,
        )
    return aws.ec2.Fleet(
        child(name, "fleet"),
        type="instant",
        launch_template_configs=[
            aws.ec2.FleetLaunchTemplateConfigArgs(
                launch_template_specification=aws.ec2.FleetLaunchTemplateConfigLaunchTemplateSpecificationArgs(
                    launch_template_id=template.id,
                    version=template.latest_version.apply(str),
                ),
                # MaxPrice per instance-hour (docs.aws.amazon.com/AWSEC2/latest/APIReference/
                # API_FleetLaunchTemplateOverridesRequest.html)
                overrides=None
                if max_price is None
                else [aws.ec2.FleetLaunchTemplateConfigOverrideArgs(max_price=format(max_price, "f"))],
            )
        ],
        target_capacity_specification=aws.ec2.FleetTargetCapacitySpecificationArgs(
            default_target_capacity_type=plan.market,
            total_target_capacity=spec.nodes,
        ),
        on_demand_options=on_demand,
        spot_options=spot,
        terminate_instances=True,  # pulumi destroy terminates the nodes with the fleet
        tags=aws_tags(spec),
        # an instant fleet cannot be modified: a change the provider would send to ModifyFleet
        # replaces it instead, the old one (and its instances) deleted first so the cluster is
        # never billed twice; tags are still updated in place (tagging API, not ModifyFleet)
        opts=pulumi.ResourceOptions(
            parent=parent, replace_on_changes=list(FLEET_REPLACE_ON_CHANGES), delete_before_replace=True
        ),
    )
