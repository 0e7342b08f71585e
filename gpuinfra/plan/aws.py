"""Pure planning of an AWS GPU cluster: what the component will build, decided and validated
before any Pulumi resource is registered. No Pulumi imports here.

Rules and sources (docs/sources/cluster-facts.md):

* EFA: one interface per network card, ``N = EfaInfo.MaximumEfaInterfaces`` (section 6 rule 5);
  card 0 / device 0 is the primary interface and is ``efa`` (EFA with ENA, carries the node's
  IP); cards 1..N-1 get ``efa-only`` at device index 0 -- the current EC2 layout
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html): EFA-only interfaces
  take no IP address, so the subnet does not run out at hundreds of p5 nodes and no per-card
  routing is needed. Never ``efa-only`` as the primary (rule 6). Types without EFA get one
  plain interface.
* No public IPv4 on multi-card types: EC2 only auto-assigns a public IPv4 to a single
  interface at device 0, so those nodes egress through a NAT gateway (rule 6; ParallelCluster
  launch templates set ``associate_public_ip_address=False`` on them).
* Placement group ``strategy=cluster`` for multi-node clusters or when the profile requires
  placement, except with a Capacity Block (none) or a targeted reservation (its own group or
  none) (section 6 rule 2; ParallelCluster PlacementGroupCapacityTypeValidator).
* Market: EC2 Fleet ``DefaultTargetCapacityType`` ``on-demand`` | ``spot`` | ``capacity-block``
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-fleet-examples.html).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuinfra.catalog.facts_model import AWS_CAPACITY_TYPES, InstanceFacts
from gpuinfra.errors import SpecError
from gpuinfra.rules.spec_rules import RuleViolationError, not_sold, rule_error
from gpuinfra.spec import ClusterSpec

VPC_CIDR = "10.0.0.0/16"
NODE_SUBNET_CIDR = "10.0.0.0/18"  # 16,379 usable addresses: one per node (EFA-only takes none)
NAT_SUBNET_CIDR = "10.0.64.0/28"  # holds only the NAT gateway
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/{ami_type}/latest/ami-id"


@dataclass(frozen=True)
class NetworkInterfacePlan:
    """One launch-template network interface."""

    network_card_index: int
    device_index: int
    interface_type: str  # "efa" | "efa-only" | "interface"
    associate_public_ip_address: bool | None


@dataclass(frozen=True)
class AwsClusterPlan:
    """Decisions for one AWS cluster (all derived from the spec and the instance facts).

    Attributes:
        interfaces: launch-template NICs in card order.
        efa_count: EFA devices per node (0 = none).
        placement_group: create a ``cluster`` placement group.
        placement_group_name: use this existing group instead (targeted reservation).
        market: EC2 Fleet target capacity type.
        egress: ``public-ip`` (single interface gets a public IPv4) or ``nat``.
        ami_parameter: SSM parameter of the DLAMI, or None when ``ami_id`` is set.
        local_nvme_count: instance-store NVMe disks that the RAID0 scratch uses.

    The root device name is not planned: it is the AMI's own ``RootDeviceName``, read from
    EC2 when the AMI is resolved (``/dev/sda1`` on Ubuntu DLAMIs, ``/dev/xvda`` on Amazon
    Linux; a wrong name adds a second volume instead of sizing the root one).
    """

    interfaces: tuple[NetworkInterfacePlan, ...]
    efa_count: int
    placement_group: bool
    placement_group_name: str | None
    market: str
    egress: str
    ami_parameter: str | None
    local_nvme_count: int


def efa_interfaces(facts: InstanceFacts, use_efa: bool) -> tuple[NetworkInterfacePlan, ...]:
    """The NIC layout for ``facts`` (see module docstring)."""
    if not use_efa or facts.max_efa_interfaces == 0:
        return (NetworkInterfacePlan(0, 0, "interface", True),)
    count = facts.max_efa_interfaces
    multi = count > 1
    first = NetworkInterfacePlan(0, 0, "efa", None if multi else True)
    rest = tuple(NetworkInterfacePlan(card, 0, "efa-only", None) for card in range(1, count))
    return (first, *rest)


def check_capacity_reservation(spec: ClusterSpec) -> None:
    """A targeted capacity reservation / Capacity Block must be of the node type, in the
    node AZ and hold every node (ParallelCluster CapacityReservationValidator;
    docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html: "the subnet must
    be in the Availability Zone of the Capacity Block").

    Raises:
        RuleViolationError: ``aws-capacity-reservation``.
    """
    if not spec.capacity_reservation_id:
        return
    rid = spec.capacity_reservation_id
    if spec.capacity_reservation_instance_type and spec.capacity_reservation_instance_type != spec.instance_type:
        raise rule_error(
            "aws-capacity-reservation",
            "",
            f"{rid} reserves {spec.capacity_reservation_instance_type}, but the nodes are {spec.instance_type}",
        )
    if spec.capacity_reservation_zone and spec.capacity_reservation_zone != spec.zone:
        raise rule_error(
            "aws-capacity-reservation",
            "",
            f"{rid} is in {spec.capacity_reservation_zone}, but the nodes' subnet is in {spec.zone}",
        )
    if spec.capacity_reservation_instance_count is not None and spec.nodes > spec.capacity_reservation_instance_count:
        raise rule_error(
            "aws-capacity-reservation",
            "",
            f"nodes={spec.nodes} but {rid} holds {spec.capacity_reservation_instance_count} instances",
        )


def plan_aws_cluster(spec: ClusterSpec) -> AwsClusterPlan:
    """Decide and validate the AWS layout for ``spec`` from the facts the spec carries.

    Args:
        spec: the cluster spec (cloud must be ``aws``).

    Raises:
        SpecError: a spec that is not AWS.
        RuleViolationError: the spec breaks a cloud rule (named in the message): a profile that
            requires EFA on a type without it, a market the type is not sold in, a capacity
            reservation that does not fit the nodes.
    """
    if spec.cloud != "aws":
        raise SpecError(f"AwsGpuCluster needs cloud aws, got {spec.cloud!r}")
    facts = spec.facts
    hbn = spec.profile.high_bandwidth_networking
    if hbn == "required" and facts.max_efa_interfaces == 0:
        raise rule_error(
            "high-bandwidth-nics",
            "",
            f"profile {spec.profile.name!r} requires EFA, but {spec.instance_type} has no EFA "
            "(EFA types include p4d.24xlarge, p5.48xlarge, g6e.48xlarge, g5.8xlarge and larger)",
        )
    market = "capacity-block" if spec.capacity_block else ("spot" if spec.spot else "on-demand")
    if unsold := not_sold("", facts, AWS_CAPACITY_TYPES[market]):
        raise RuleViolationError([unsold])
    check_capacity_reservation(spec)
    use_efa = hbn != "off" and facts.max_efa_interfaces > 0
    interfaces = efa_interfaces(facts, use_efa)
    wants_group = (spec.nodes > 1 or spec.profile.placement == "required") and facts.placement.cluster_placement_group
    group_name = None
    if spec.capacity_block:
        wants_group = False  # Capacity Blocks are placed together by EC2; a group risks ICE
    elif spec.capacity_reservation_id:
        group_name = spec.capacity_reservation_placement_group
        wants_group = False
    return AwsClusterPlan(
        interfaces=interfaces,
        efa_count=sum(1 for i in interfaces if i.interface_type in ("efa", "efa-only")),
        placement_group=wants_group,
        placement_group_name=group_name,
        market=market,
        egress="nat" if len(interfaces) > 1 else "public-ip",
        ami_parameter=None if spec.ami_id else DLAMI_PARAMETER.format(ami_type=spec.profile.image.aws_dlami_type),
        local_nvme_count=facts.local_ssd.bundled_count,
    )
