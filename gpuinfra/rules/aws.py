"""AWS conformance rules (names and sources in :data:`gpuinfra.rules.spec_rules.RULES`).

Each rule body is a *predicate* over plain values -- the node type's
:class:`~gpuinfra.catalog.facts_model.InstanceFacts`, the node interfaces as :class:`Nic`, the
node count, the market -- that returns :class:`~gpuinfra.rules.model.Violation` objects. Two
readers feed the same predicates:

* the ``check_*`` functions here read a preview's :class:`~gpuinfra.rules.model.ResourceGraph`
  (inputs in the provider's wire format, camelCase, as ``pulumi preview`` and CrossGuard see
  them) and take a mapping from instance type to facts;
* :func:`gpuinfra.rules.plan_rules.check_plan` reads the typed cluster plan, before any resource.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gpuinfra.catalog.facts_model import AWS_CAPACITY_TYPES, InstanceFacts
from gpuinfra.rules.model import UNKNOWN, Facts, Resource, ResourceGraph, Violation
from gpuinfra.rules.spec_rules import not_sold, violation
from gpuinfra.spec import AWS_WORLD_SSH_TAG, world_open

LT = "aws:ec2/launchTemplate:LaunchTemplate"
FLEET = "aws:ec2/fleet:Fleet"
SG = "aws:ec2/securityGroup:SecurityGroup"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
SUBNET = "aws:ec2/subnet:Subnet"
PG = "aws:ec2/placementGroup:PlacementGroup"
BUCKET = "aws:s3/bucket:Bucket"
PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
EVENT_RULE = "aws:cloudwatch/eventRule:EventRule"
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
FUNCTION = "aws:lambda/function:Function"
INVOKE_PERMISSION = "aws:lambda/permission:Permission"
#: The event EC2 emits two minutes before it interrupts a Spot Instance (its ``source`` and
#: ``detail-type``: docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
SPOT_INTERRUPTION_PATTERN = {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]}


@dataclass(frozen=True)
class Nic:
    """One launch-template network interface, as the rules read it.

    Attributes:
        card: ``networkCardIndex`` (0-based).
        device: ``deviceIndex`` on its card (0-based).
        kind: ``interfaceType``: ``efa`` | ``efa-only`` | ``interface``.
        public_ip: ``associatePublicIpAddress`` (None: not set).
    """

    card: int
    device: int
    kind: str
    public_ip: bool | None

    @classmethod
    def from_input(cls, nic: dict) -> Nic:
        """From one ``networkInterfaces`` entry of a launch template (camelCase; ``"true"`` /
        ``"false"`` strings as the provider takes them)."""
        public = nic.get("associatePublicIpAddress")
        return cls(
            int(nic.get("networkCardIndex", 0)),
            int(nic.get("deviceIndex", 0)),
            nic.get("interfaceType", "interface"),
            None if public is None else str(public).lower() == "true",
        )


EFA_KINDS = ("efa", "efa-only")


# -- predicates: one body per rule, shared by the preview and the plan path -----------------------


def efa_interface_violations(resource: str, fact: InstanceFacts, nics: Sequence[Nic]) -> list[Violation]:
    """``aws-efa-interfaces``: one EFA interface per card (``MaximumEfaInterfaces``), cards
    0..N-1 once each, card 0 / device 0 ``efa``; or a single non-EFA interface.

    Args:
        resource: name reported (the launch template; "" for a plan).
        fact: facts of the node type.
        nics: the node interfaces (empty: nothing to judge).
    """
    if not nics:
        return []
    efa = [n for n in nics if n.kind in EFA_KINDS]
    if not efa:
        if len(nics) != 1:
            return [
                violation("aws-efa-interfaces", resource, f"{len(nics)} plain interfaces; a node without EFA gets one")
            ]
        return []
    if fact.max_efa_interfaces == 0:
        return [
            violation(
                "aws-efa-interfaces",
                resource,
                f"{fact.instance_type} has no EFA, but the template asks for {len(efa)} EFA interfaces",
            )
        ]
    out = []
    cards = sorted(n.card for n in nics)
    if len(efa) != fact.max_efa_interfaces or cards != list(range(fact.max_efa_interfaces)):
        out.append(
            violation(
                "aws-efa-interfaces",
                resource,
                f"{len(efa)} EFA interfaces on cards {cards}; {fact.instance_type} takes "
                f"{fact.max_efa_interfaces}, one on each card 0..{fact.max_efa_interfaces - 1}",
            )
        )
    primary = [n for n in nics if n.card == 0 and n.device == 0]
    if not primary or primary[0].kind != "efa":
        out.append(
            violation(
                "aws-efa-interfaces",
                resource,
                "card 0 / device 0 must be the primary 'efa' interface (efa-only cannot be primary)",
            )
        )
    return out


def public_ip_violations(resource: str, nics: Sequence[Nic]) -> list[Violation]:
    """``aws-no-public-ip-multi-nic``: no auto-assigned public IPv4 with several interfaces."""
    public = [n for n in nics if n.public_ip]
    if len(nics) > 1 and public:
        return [
            violation(
                "aws-no-public-ip-multi-nic", resource, f"{len(public)} of {len(nics)} interfaces ask for a public IPv4"
            )
        ]
    return []


def placement_strategy_violations(resource: str, strategy: str | None) -> list[Violation]:
    """``aws-placement-group``: a placement group the stack creates uses ``strategy=cluster``."""
    if strategy != "cluster":
        return [violation("aws-placement-group", resource, f"strategy {strategy!r}; GPU clusters use 'cluster'")]
    return []


def placement_group_violations(
    resource: str, fact: InstanceFacts | None, nodes: int, grouped: bool, market: str | None, reserved: bool
) -> list[Violation]:
    """``aws-placement-group``: multi-node clusters use a ``cluster`` placement group where the
    type supports one (not with a Capacity Block; a targeted reservation brings its own).

    Args:
        resource: name reported (the launch template; "" for a plan).
        fact: facts of the node type (None: unknown type, only the Capacity Block part is judged).
        nodes: node count.
        grouped: the nodes launch into a placement group (created or existing).
        market: EC2 Fleet target capacity type (``on-demand`` | ``spot`` | ``capacity-block``).
        reserved: the nodes target a capacity reservation.
    """
    out = []
    if market == "capacity-block" and grouped:
        out.append(
            violation(
                "aws-placement-group",
                resource,
                "a placement group with a Capacity Block risks insufficient capacity; EC2 places "
                "Capacity Block instances together itself",
            )
        )
    if fact is None:
        return out
    if grouped and not fact.placement.cluster_placement_group:
        out.append(
            violation(
                "aws-placement-group", resource, f"{fact.instance_type} does not support cluster placement groups"
            )
        )
    if (
        nodes > 1
        and fact.placement.cluster_placement_group
        and not grouped
        and market != "capacity-block"
        and not reserved
    ):
        out.append(violation("aws-placement-group", resource, f"{nodes} nodes without a cluster placement group"))
    return out


def market_violations(resource: str, fact: InstanceFacts | None, market: str | None) -> list[Violation]:
    """``provisioning-model-offered``: EC2 sells the type in the fleet's target capacity type."""
    sold_as = AWS_CAPACITY_TYPES.get(market) if market is not None else None
    if fact is None or sold_as is None:
        return []
    unsold = not_sold(resource, fact, sold_as)
    return [unsold] if unsold else []


def single_subnet_violations(resource: str, subnets: Collection[object]) -> list[Violation]:
    """``single-zone``: every node interface is in one subnet (``subnets``: the distinct ones)."""
    if len(subnets) > 1:
        return [
            violation("single-zone", resource, f"interfaces in {len(subnets)} subnets; EFA works within one subnet")
        ]
    return []


def single_zone_violations(zones: Collection[str | None]) -> list[Violation]:
    """``single-zone``: the node subnets share one AZ (``zones``: their AZ ids; None = not set)."""
    if len(set(zones) - {None}) > 1:
        return [violation("single-zone", "", f"subnets in {len(set(zones))} AZs: {sorted(z for z in set(zones) if z)}")]
    return []


# -- readers of a preview's resources ------------------------------------------------------------


def _node_facts(lt: Resource, facts: Facts) -> InstanceFacts | None:
    return facts.get(str(lt.inputs.get("instanceType", "")))


def _fleet_nodes(graph: ResourceGraph) -> int:
    return graph.whole_number(FLEET, "targetCapacitySpecification.totalTargetCapacity")


def _nics(lt: Resource) -> list[Nic]:
    return [Nic.from_input(n) for n in (lt.inputs.get("networkInterfaces") or [])]


def check_efa_interfaces(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-efa-interfaces`` on each launch template (:func:`efa_interface_violations`)."""
    out = []
    for lt in graph.of_type(LT):
        fact = _node_facts(lt, facts)
        if fact is not None:
            out += efa_interface_violations(lt.name, fact, _nics(lt))
    return out


def check_no_public_ip_multi_nic(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-no-public-ip-multi-nic`` on each launch template (:func:`public_ip_violations`)."""
    return [v for lt in graph.of_type(LT) for v in public_ip_violations(lt.name, _nics(lt))]


def _efa_security_groups(graph: ResourceGraph) -> list[Resource]:
    ids = {
        sg
        for lt in graph.of_type(LT)
        for n in (lt.inputs.get("networkInterfaces") or [])
        if n.get("interfaceType") in EFA_KINDS
        for sg in (n.get("securityGroups") or [])
    }
    if not ids:
        return []
    found = [graph.referenced(i, SG) for i in ids]
    return [g for g in found if g is not None] or graph.of_type(SG)


def check_efa_security_group(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-efa-sg-both-ways``: the SG of EFA interfaces has a self-referencing all-traffic
    (protocol ``-1``) rule for ingress and one for egress."""
    out = []
    rules = graph.of_type(SG_RULE)
    for group in _efa_security_groups(graph):
        own = [r for r in rules if graph.referenced(r.inputs.get("securityGroupId"), SG) in (group, None)]
        for direction in ("ingress", "egress"):
            if not any(
                r.inputs.get("type") == direction
                and r.inputs.get("self") is True
                and str(r.inputs.get("protocol")) in ("-1", "all")
                for r in own
            ):
                out.append(
                    violation(
                        "aws-efa-sg-both-ways",
                        group.name,
                        f"no self-referencing all-traffic {direction} rule; EFA needs both directions",
                    )
                )
    return out


def check_placement_group(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-placement-group`` (:func:`placement_strategy_violations`,
    :func:`placement_group_violations`) on each launch template."""
    out = []
    fleet = graph.first(FLEET)
    market = fleet.get("targetCapacitySpecification.defaultTargetCapacityType") if fleet else None
    for lt in graph.of_type(LT):
        for pg in graph.of_type(PG):
            out += placement_strategy_violations(pg.name, pg.inputs.get("strategy"))
        reserved = lt.get("capacityReservationSpecification.capacityReservationTarget.capacityReservationId")
        out += placement_group_violations(
            lt.name,
            _node_facts(lt, facts),
            _fleet_nodes(graph),
            bool(lt.get("placement.groupName")),
            market,
            bool(reserved),
        )
    return out


def check_imdsv2(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-imdsv2``: ``metadataOptions.httpTokens = required``."""
    return [
        violation("aws-imdsv2", lt.name, f"httpTokens is {lt.get('metadataOptions.httpTokens')!r}, not 'required'")
        for lt in graph.of_type(LT)
        if lt.get("metadataOptions.httpTokens") != "required"
    ]


def check_fleet(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-fleet-all-or-nothing`` and ``provisioning-model-offered`` (:func:`market_violations`)
    on the EC2 Fleet."""
    out = []
    lt = graph.first(LT)
    fact = _node_facts(lt, facts) if lt else None
    for fleet in graph.of_type(FLEET):
        total = fleet.get("targetCapacitySpecification.totalTargetCapacity")
        market = fleet.get("targetCapacitySpecification.defaultTargetCapacityType")
        options = fleet.inputs.get("spotOptions") if market == "spot" else fleet.inputs.get("onDemandOptions")
        options = options or {}
        if fleet.inputs.get("type") != "instant":
            out.append(
                violation(
                    "aws-fleet-all-or-nothing",
                    fleet.name,
                    f"fleet type {fleet.inputs.get('type')!r}; one launch request needs 'instant'",
                )
            )
        if not (
            options.get("singleInstanceType")
            and options.get("singleAvailabilityZone")
            and options.get("minTargetCapacity") == total
        ):
            out.append(
                violation(
                    "aws-fleet-all-or-nothing",
                    fleet.name,
                    f"{market} options need singleInstanceType, singleAvailabilityZone and "
                    f"minTargetCapacity = {total} (got {options.get('minTargetCapacity')})",
                )
            )
        out += market_violations(fleet.name, fact, market)
    return out


def check_single_zone(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``single-zone`` (:func:`single_subnet_violations`, :func:`single_zone_violations`)."""
    out = []
    lts = graph.of_type(LT)
    subnets = {n.get("subnetId") for lt in lts for n in (lt.inputs.get("networkInterfaces") or [])}
    if lts:
        out += single_subnet_violations(lts[0].name, subnets)
    out += single_zone_violations(
        [s.inputs.get("availabilityZoneId") or s.inputs.get("availabilityZone") for s in graph.of_type(SUBNET)]
    )
    return out


def check_bucket(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``bucket-not-public`` (all four PublicAccessBlock flags) and
    ``aws-s3-deny-insecure-transport`` (a Deny on ``aws:SecureTransport`` false)."""
    out = []
    for bucket in graph.of_type(BUCKET):
        blocks = graph.of_type(PAB)
        flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
        if not any(all(b.inputs.get(f) is True for f in flags) for b in blocks):
            out.append(violation("bucket-not-public", bucket.name, "no public access block with all four flags true"))
        if not any(_denies_insecure_transport(p.inputs.get("policy")) for p in graph.of_type(BUCKET_POLICY)):
            out.append(
                violation(
                    "aws-s3-deny-insecure-transport",
                    bucket.name,
                    "no bucket policy denying requests without TLS (aws:SecureTransport false)",
                )
            )
    return out


def _denies_insecure_transport(policy: object) -> bool:
    if policy == UNKNOWN:
        return True  # built from the bucket ARN, unknown before the bucket exists: judged at `up`
    if not isinstance(policy, str):
        return False
    try:
        statements = json.loads(policy).get("Statement", [])
    except (ValueError, AttributeError):
        return False
    return any(
        s.get("Effect") == "Deny"
        and str(s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport")).lower() == "false"
        for s in statements
        if isinstance(s, dict)
    )


#: The SSH port, and the protocols that reach it (``-1``/``all``: every protocol and port).
SSH_PORT = 22
_SSH_PROTOCOLS = ("tcp", "6", "-1", "all")


def ssh_from_world_violations(resource: str, rule: dict, allowed: bool) -> list[Violation]:
    """``aws-ssh-not-world`` for one ingress rule (``protocol``, ``fromPort``, ``toPort``,
    ``cidrBlocks``, ``ipv6CidrBlocks``; a security group rule's inputs or one ``ingress`` entry
    of a security group): a world-open block (:func:`gpuinfra.spec.world_open`) that reaches
    TCP 22, unless the stack ``allowed`` it. Unknown or malformed blocks are skipped."""
    if allowed or str(rule.get("protocol")).lower() not in _SSH_PROTOCOLS:
        return []
    if str(rule.get("protocol")).lower() in ("tcp", "6"):
        low, high = rule.get("fromPort"), rule.get("toPort")
        if not (isinstance(low, int) and isinstance(high, int) and low <= SSH_PORT <= high):
            return []
    out = []
    for cidr in [*(rule.get("cidrBlocks") or []), *(rule.get("ipv6CidrBlocks") or [])]:
        try:
            wide = isinstance(cidr, str) and world_open(cidr)
        except ValueError:
            continue
        if wide:
            out.append(
                violation(
                    "aws-ssh-not-world",
                    resource,
                    f"SSH (TCP 22) is open to {cidr}; allow your own network, or write the stack with "
                    "`gpuinfra new --allow-world-ssh` (network.allow_world_ssh)",
                )
            )
    return out


def check_ssh_not_world(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-ssh-not-world`` (:func:`ssh_from_world_violations`) on every ingress security group
    rule and every inline ``ingress`` of a security group; allowed when a resource of the stack
    carries the tag :data:`gpuinfra.spec.AWS_WORLD_SSH_TAG` ``= "true"``."""
    allowed = any(
        isinstance(r.inputs.get("tags"), dict) and r.inputs["tags"].get(AWS_WORLD_SSH_TAG) == "true" for r in graph
    )
    out = []
    for rule in graph.of_type(SG_RULE):
        if rule.inputs.get("type") == "ingress":
            out += ssh_from_world_violations(rule.name, rule.inputs, allowed)
    for group in graph.of_type(SG):
        for entry in group.inputs.get("ingress") or []:
            if isinstance(entry, dict):
                out += ssh_from_world_violations(group.name, entry, allowed)
    return out


def spot_replacement_violations(resource: str, missing: Sequence[str]) -> list[Violation]:
    """``aws-spot-replacement``: a Spot fleet's stack has the interruption rule, its target, the
    function and EventBridge's permission to invoke it (``missing``: the parts not found)."""
    if not missing:
        return []
    return [
        violation(
            "aws-spot-replacement",
            resource,
            f"Spot fleet without {', '.join(missing)}: an interrupted node is never replaced",
        )
    ]


def _pattern(rule: Resource) -> object:
    text = rule.inputs.get("eventPattern")
    if text == UNKNOWN or not isinstance(text, str):
        return UNKNOWN
    try:
        return json.loads(text)
    except ValueError:
        return None


def check_spot_replacement(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-spot-replacement`` on each Spot fleet (:func:`spot_replacement_violations`)."""
    out = []
    for fleet in graph.of_type(FLEET):
        if fleet.get("targetCapacitySpecification.defaultTargetCapacityType") != "spot":
            continue
        rules = [r for r in graph.of_type(EVENT_RULE) if _pattern(r) in (SPOT_INTERRUPTION_PATTERN, UNKNOWN)]
        names = {n for r in rules for n in (r.name, str(r.inputs.get("name", "")))} - {""}
        targets = [
            t for t in graph.of_type(EVENT_TARGET) if t.inputs.get("rule") in names or t.inputs.get("rule") == UNKNOWN
        ]
        permits = [p for p in graph.of_type(INVOKE_PERMISSION) if p.inputs.get("principal") == "events.amazonaws.com"]
        missing = [
            what
            for what, found in (
                ("the Spot interruption rule", rules),
                ("its target", targets),
                ("the replacement function", graph.of_type(FUNCTION)),
                ("EventBridge's invoke permission", permits),
            )
            if not found
        ]
        out += spot_replacement_violations(fleet.name, missing)
    return out


CHECKS: tuple[Callable[[ResourceGraph, Facts], list[Violation]], ...] = (
    check_efa_interfaces,
    check_no_public_ip_multi_nic,
    check_efa_security_group,
    check_placement_group,
    check_imdsv2,
    check_fleet,
    check_single_zone,
    check_bucket,
    check_ssh_not_world,
    check_spot_replacement,
)
