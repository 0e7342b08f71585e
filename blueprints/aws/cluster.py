"""``AwsGpuCluster``: the AWS GPU training cluster as one Pulumi ComponentResource."""

from __future__ import annotations

import ipaddress

import pulumi
import pulumi_aws as aws

from blueprints.aws.backstop import build_ttl_backstop, schedule_expression
from blueprints.aws.identity import build_instance_profile
from blueprints.aws.monitoring import build_monitoring
from blueprints.aws.network import build_network
from blueprints.aws.nodes import build_fleet, build_launch_template, fleet_errors_reader, launched_instance_ids
from blueprints.aws.replacement import build_replacement
from blueprints.aws.storage import build_bucket, build_bundle_object
from gpuinfra.errors import SpecError
from gpuinfra.money import usd_json
from gpuinfra.plan.aws import AwsClusterPlan
from gpuinfra.plan.cluster import plan_cluster
from gpuinfra.plan.tags import aws_selection_tags
from gpuinfra.spec import ClusterSpec

TYPE_TOKEN = "gpuinfra:aws:GpuCluster"


def resolve_ami(spec: ClusterSpec, plan: AwsClusterPlan) -> tuple[str, str]:
    """The AMI id (``spec.ami_id``, else the DLAMI SSM parameter resolved now) and its root
    device name as EC2 describes the image (``RootDeviceName``: a hard-coded
    ``/dev/sda1`` adds a second volume on AMIs whose root is ``/dev/xvda``).

    Raises:
        SpecError: the parameter or the image does not resolve in the region (before any
            resource exists).
    """
    ami_id = spec.ami_id
    if not ami_id:
        try:
            ami_id = aws.ssm.get_parameter(name=plan.ami_parameter).value
        except Exception as exc:  # the provider raises a plain Exception on invoke failure
            raise SpecError(
                f"DLAMI parameter {plan.ami_parameter} does not resolve in {spec.region} ({exc}); "
                "fix profile.image.aws_dlami_type (see docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html) "
                "or set ami_id"
            ) from None
    try:
        image = aws.ec2.get_ami(
            filters=[aws.ec2.GetAmiFilterArgs(name="image-id", values=[ami_id])], include_deprecated=True
        )
    except Exception as exc:
        raise SpecError(f"AMI {ami_id} cannot be described in {spec.region} ({exc}); check ami_id") from None
    return ami_id, image.root_device_name


def check_existing_subnet(spec: ClusterSpec) -> None:
    """An existing subnet must be in the spec's AZ (EFA and cluster placement groups are single-AZ).

    Raises:
        SpecError: the subnet is in another AZ or cannot be read.
    """
    if not spec.network.subnet_id:
        return
    try:
        subnet = aws.ec2.get_subnet(id=spec.network.subnet_id)
    except Exception as exc:
        raise SpecError(f"cannot read subnet {spec.network.subnet_id}: {exc}") from None
    if subnet.availability_zone_id != spec.zone:
        raise SpecError(
            f"subnet {spec.network.subnet_id} is in {subnet.availability_zone_id}, but the cluster's zone is "
            f"{spec.zone}: all nodes must share one AZ (EFA does not cross AZs); use a subnet in {spec.zone}"
        )
    if spec.network.vpc_id and subnet.vpc_id != spec.network.vpc_id:
        raise SpecError(f"subnet {spec.network.subnet_id} belongs to {subnet.vpc_id}, not {spec.network.vpc_id}")


class AwsGpuCluster(pulumi.ComponentResource):
    """GPU nodes in one AZ with EFA, cluster placement, NVMe scratch, an S3 bucket and a DLAMI.

    Args:
        name: component name (the stack name); children are named ``<name>-<role>``.
        spec: the validated cluster spec (``cloud == "aws"``).
        opts: Pulumi resource options.

    Raises:
        SpecError: invalid combinations (see :func:`gpuinfra.plan.cluster.plan_cluster`), an
            existing subnet in another AZ, or a DLAMI parameter that does not resolve -- all
            before any resource is registered.
    """

    def __init__(self, name: str, spec: ClusterSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        cluster_plan = plan_cluster(spec)
        plan = cluster_plan.aws
        assert plan is not None  # plan_cluster of an AWS spec always carries the AWS plan
        check_existing_subnet(spec)
        ami_id, root_device_name = resolve_ami(spec, plan)
        super().__init__(TYPE_TOKEN, name, None, opts)
        self.spec = spec
        self.cluster_plan = cluster_plan
        self.plan = plan
        network = build_network(name, spec, plan, self)
        self.bucket = build_bucket(name, spec, self)
        profile = build_instance_profile(name, spec, self.bucket, self)
        self.node_bundle = build_bundle_object(name, spec, self.bucket, cluster_plan.node_bundle, self)
        self.launch_template, self.placement_group = build_launch_template(
            name,
            spec,
            plan,
            network,
            ami_id,
            root_device_name,
            profile,
            self.bucket,
            self,
            depends_on=[self.node_bundle],
            bundle=cluster_plan.node_bundle,
        )
        self.fleet = build_fleet(name, spec, plan, self.launch_template, self)
        instances = aws.ec2.get_instances_output(
            # this stack's own instances (its unique stack-id tag and deployment), never every
            # instance of a stack with the same name in the region
            instance_tags=aws_selection_tags(spec),
            instance_state_names=["pending", "running"],
            opts=pulumi.InvokeOutputOptions(depends_on=[self.fleet]),
        )
        # numeric order, as the nodes sort (sort -t . -k1,1n ...): 10.0.0.20 before 10.0.0.100, not as strings
        self.private_ips = instances.private_ips.apply(lambda ips: sorted(ips or [], key=ipaddress.ip_address))
        # fails the update when the fleet launched fewer than `nodes` instances, with the class of
        # its errors (read from EC2 only in a real update: a preview launches nothing)
        fleet_instance_sets = self.fleet.fleet_instance_sets

        def instance_ids(fleet_id: str) -> pulumi.Output[list[str]]:
            reader = None if pulumi.runtime.is_dry_run() else fleet_errors_reader(spec.region, fleet_id)
            return fleet_instance_sets.apply(lambda sets: launched_instance_ids(sets, spec, reader, fleet_id or ""))

        self.instance_ids: pulumi.Output[list[str]] = self.fleet.id.apply(instance_ids)
        self.ttl_backstop = build_ttl_backstop(name, spec, self.fleet, self.instance_ids, self)
        # Spot stacks: an interrupted node is replaced from the same launch template
        self.replacement = build_replacement(name, spec, self.launch_template, profile, self)
        port = cluster_plan.outputs.torchrun_port
        first_instance = self.instance_ids.apply(lambda ids: ids[0] if ids else None)
        self.outputs = {
            "bucket_name": self.bucket.bucket,
            "bucket_url": self.bucket.bucket.apply(lambda b: f"s3://{b}"),
            "fleet_id": self.fleet.id,
            "instance_ids": self.instance_ids,
            "ami_id": self.launch_template.image_id,
            "ttl_backstop_at": schedule_expression(spec),
            "private_ips": self.private_ips,
            "ssm_connect_command": first_instance.apply(
                lambda i: f"aws ssm start-session --region {spec.region} --target {i or '<instance-id>'}"
            ),
            "nccl_env": cluster_plan.outputs.nccl_env,
            "run_command": cluster_plan.outputs.run_command,
            "torchrun_rendezvous_endpoint": self.private_ips.apply(
                lambda ips: f"{ips[0]}:{port}" if ips else f"<rank-0 private IP>:{port}"
            ),
            "price_per_hour_usd": usd_json(spec.price_per_hour_usd),
            "zone_id": spec.zone,
            # AZ names differ per account: resolve the ID with the provider's data source
            "availability_zone": aws.get_availability_zone_output(zone_id=spec.zone).name,
            "efa_interfaces_per_node": cluster_plan.network.efa_per_node,
        }
        # GPU monitoring: agent config, dashboard, idle alarm; its outputs feed `gpuinfra status`
        self.monitoring = build_monitoring(name, spec, self)
        if self.monitoring is not None:
            self.outputs.update(self.monitoring.outputs)
        self.register_outputs(self.outputs)

    def exports(self) -> dict:
        """Stack outputs (``pulumi stack output``)."""
        return self.outputs
