"""AWS conformance checks over a preview's resources (rule names and sources in
:data:`gpuinfra.rules.spec_rules.RULES`).

Each check takes the :class:`~gpuinfra.rules.model.ResourceGraph` and a mapping from
instance type to :class:`~gpuinfra.catalog.facts_model.InstanceFacts`, and returns
:class:`~gpuinfra.rules.model.Violation` objects. Inputs are read in the provider's wire
format (camelCase), as ``pulumi preview`` and CrossGuard see them.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from gpuinfra.catalog.facts_model import AWS_CAPACITY_TYPES, InstanceFacts
from gpuinfra.rules.model import UNKNOWN, Facts, Resource, ResourceGraph, Violation
from gpuinfra.rules.spec_rules import not_sold, violation

LT = "aws:ec2/launchTemplate:LaunchTemplate"
FLEET = "aws:ec2/fleet:Fleet"
SG = "aws:ec2/securityGroup:SecurityGroup"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
SUBNET = "aws:ec2/subnet:Subnet"
PG = "aws:ec2/placementGroup:PlacementGroup"
BUCKET = "aws:s3/bucket:Bucket"
PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"


def _node_facts(lt: Resource, facts: Facts) -> InstanceFacts | None:
    return facts.get(str(lt.inputs.get("instanceType", "")))


def _fleet_nodes(graph: ResourceGraph) -> int:
    return graph.whole_number(FLEET, "targetCapacitySpecification.totalTargetCapacity")


def check_efa_interfaces(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-efa-interfaces``: one EFA interface per card (``MaximumEfaInterfaces``), cards
    0..N-1 once each, card 0 / device 0 ``efa``; or a single non-EFA interface."""
    out = []
    for lt in graph.of_type(LT):
        fact = _node_facts(lt, facts)
        nics = lt.inputs.get("networkInterfaces") or []
        if fact is None or not nics:
            continue
        kinds = [n.get("interfaceType", "interface") for n in nics]
        efa = [k for k in kinds if k in ("efa", "efa-only")]
        if not efa:
            if len(nics) != 1:
                out.append(violation("aws-efa-interfaces", lt.name,
                                     f"{len(nics)} plain interfaces; a node without EFA gets one"))
            continue
        if fact.max_efa_interfaces == 0:
            out.append(violation("aws-efa-interfaces", lt.name, f"{fact.instance_type} has no EFA, but the "
                                 f"template asks for {len(efa)} EFA interfaces"))
            continue
        cards = sorted(int(n.get("networkCardIndex", 0)) for n in nics)
        if len(efa) != fact.max_efa_interfaces or cards != list(range(fact.max_efa_interfaces)):
            out.append(violation("aws-efa-interfaces", lt.name,
                                 f"{len(efa)} EFA interfaces on cards {cards}; {fact.instance_type} takes "
                                 f"{fact.max_efa_interfaces}, one on each card 0..{fact.max_efa_interfaces - 1}"))
        primary = [n for n in nics if int(n.get("networkCardIndex", 0)) == 0 and int(n.get("deviceIndex", 0)) == 0]
        if not primary or primary[0].get("interfaceType") != "efa":
            out.append(violation("aws-efa-interfaces", lt.name,
                                 "card 0 / device 0 must be the primary 'efa' interface (efa-only cannot be primary)"))
    return out


def check_no_public_ip_multi_nic(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-no-public-ip-multi-nic``: no auto-assigned public IPv4 with several interfaces."""
    out = []
    for lt in graph.of_type(LT):
        nics = lt.inputs.get("networkInterfaces") or []
        public = [n for n in nics if str(n.get("associatePublicIpAddress", "")).lower() == "true"]
        if len(nics) > 1 and public:
            out.append(violation("aws-no-public-ip-multi-nic", lt.name,
                                 f"{len(public)} of {len(nics)} interfaces ask for a public IPv4"))
    return out


def _efa_security_groups(graph: ResourceGraph) -> list[Resource]:
    ids = {sg for lt in graph.of_type(LT) for n in (lt.inputs.get("networkInterfaces") or [])
           if n.get("interfaceType") in ("efa", "efa-only") for sg in (n.get("securityGroups") or [])}
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
            if not any(r.inputs.get("type") == direction and r.inputs.get("self") is True
                       and str(r.inputs.get("protocol")) in ("-1", "all") for r in own):
                out.append(violation("aws-efa-sg-both-ways", group.name,
                                     f"no self-referencing all-traffic {direction} rule; EFA needs both directions"))
    return out


def check_placement_group(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-placement-group``: multi-node clusters use a ``cluster`` placement group where the
    type supports one (not with a Capacity Block; a targeted reservation brings its own)."""
    out = []
    fleet = graph.first(FLEET)
    market = fleet.get("targetCapacitySpecification.defaultTargetCapacityType") if fleet else None
    for lt in graph.of_type(LT):
        fact = _node_facts(lt, facts)
        group = lt.get("placement.groupName")
        reserved = lt.get("capacityReservationSpecification.capacityReservationTarget.capacityReservationId")
        for pg in graph.of_type(PG):
            if pg.inputs.get("strategy") != "cluster":
                out.append(violation("aws-placement-group", pg.name, f"strategy {pg.inputs.get('strategy')!r}; "
                                     "GPU clusters use 'cluster'"))
        if market == "capacity-block" and group:
            out.append(violation("aws-placement-group", lt.name,
                                 "a placement group with a Capacity Block risks insufficient capacity; EC2 places "
                                 "Capacity Block instances together itself"))
        if fact is None:
            continue
        if group and not fact.placement.cluster_placement_group:
            out.append(violation("aws-placement-group", lt.name,
                                 f"{fact.instance_type} does not support cluster placement groups"))
        if (_fleet_nodes(graph) > 1 and fact.placement.cluster_placement_group and not group
                and market != "capacity-block" and not reserved):
            out.append(violation("aws-placement-group", lt.name,
                                 f"{_fleet_nodes(graph)} nodes without a cluster placement group"))
    return out


def check_imdsv2(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-imdsv2``: ``metadataOptions.httpTokens = required``."""
    return [violation("aws-imdsv2", lt.name, f"httpTokens is {lt.get('metadataOptions.httpTokens')!r}, not 'required'")
            for lt in graph.of_type(LT) if lt.get("metadataOptions.httpTokens") != "required"]


def check_fleet(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``aws-fleet-all-or-nothing`` and ``provisioning-model-offered`` on the EC2 Fleet."""
    out = []
    lt = graph.first(LT)
    fact = _node_facts(lt, facts) if lt else None
    for fleet in graph.of_type(FLEET):
        total = fleet.get("targetCapacitySpecification.totalTargetCapacity")
        market = fleet.get("targetCapacitySpecification.defaultTargetCapacityType")
        options = fleet.inputs.get("spotOptions") if market == "spot" else fleet.inputs.get("onDemandOptions")
        options = options or {}
        if fleet.inputs.get("type") != "instant":
            out.append(violation("aws-fleet-all-or-nothing", fleet.name,
                                 f"fleet type {fleet.inputs.get('type')!r}; one launch request needs 'instant'"))
        if not (options.get("singleInstanceType") and options.get("singleAvailabilityZone")
                and options.get("minTargetCapacity") == total):
            out.append(violation("aws-fleet-all-or-nothing", fleet.name,
                                 f"{market} options need singleInstanceType, singleAvailabilityZone and "
                                 f"minTargetCapacity = {total} (got {options.get('minTargetCapacity')})"))
        sold_as = AWS_CAPACITY_TYPES.get(market)
        if fact is not None and sold_as is not None and (unsold := not_sold(fleet.name, fact, sold_as)):
            out.append(unsold)
    return out


def check_single_zone(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``single-zone``: every node interface is in one subnet, and node subnets share one AZ."""
    out = []
    subnets = {n.get("subnetId") for lt in graph.of_type(LT) for n in (lt.inputs.get("networkInterfaces") or [])}
    if len(subnets) > 1:
        out.append(violation("single-zone", graph.of_type(LT)[0].name, f"interfaces in {len(subnets)} subnets; EFA "
                             "works within one subnet"))
    zones = {s.inputs.get("availabilityZoneId") or s.inputs.get("availabilityZone") for s in graph.of_type(SUBNET)}
    if len(zones - {None}) > 1:
        out.append(violation("single-zone", "", f"subnets in {len(zones)} AZs: {sorted(z for z in zones if z)}"))
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
            out.append(violation("aws-s3-deny-insecure-transport", bucket.name,
                                 "no bucket policy denying requests without TLS (aws:SecureTransport false)"))
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
    return any(s.get("Effect") == "Deny" and str(s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport"))
               .lower() == "false" for s in statements if isinstance(s, dict))


CHECKS: tuple[Callable[[ResourceGraph, Facts], list[Violation]], ...] = (
    check_efa_interfaces, check_no_public_ip_multi_nic, check_efa_security_group, check_placement_group,
    check_imdsv2, check_fleet, check_single_zone, check_bucket,
)
