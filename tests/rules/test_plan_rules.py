"""check_plan: the plan path of the conformance rules can fail, names the same rule as the
preview path, and covers every rule of the registry together with the preview-only and
refusal rules."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from gpuinfra.plan.cluster import cloud_plan
from gpuinfra.rules import RULES, check_graph, check_plan
from gpuinfra.rules.model import ResourceGraph
from gpuinfra.rules.plan_rules import PLAN_RULES, PREVIEW_ONLY_RULES, REFUSAL_RULES
from tests.blueprints.helpers import make_spec, preview

SHAPES = {
    "p5": dict(instance_type="p5.48xlarge", nodes=2, cloud="aws"),  # 32 EFA cards, cluster placement group
    "g5": dict(instance_type="g5.xlarge", nodes=1, cloud="aws", profile="dev"),  # one plain interface
    "a2": dict(instance_type="a2-highgpu-4g", nodes=2, cloud="gcp"),  # compact policy, 4 attached local SSDs
    "a3mega": dict(instance_type="a3-megagpu-8g", nodes=2, cloud="gcp"),  # 1 + 8 gVNIC VPCs, bulk insert + compact
    "a3ultra": dict(instance_type="a3-ultragpu-8g", nodes=2, cloud="gcp", spot=True),  # RoCE VPC, spot only
}


def _spec_and_plan(key):
    spec = make_spec(**SHAPES[key])
    return spec, cloud_plan(spec)


def _cards_from_one(plan):
    return replace(
        plan, interfaces=tuple(replace(n, network_card_index=n.network_card_index + 1) for n in plan.interfaces)
    )


def _public_ip_on_second(plan):
    nics = list(plan.interfaces)
    nics[1] = replace(nics[1], associate_public_ip_address=True)
    return replace(plan, interfaces=tuple(nics))


def _network(plan, role, **changes):
    return replace(plan, networks=tuple(replace(n, **changes) if n.role == role else n for n in plan.networks))


# (stack, fault on the plan, the rules check_plan names, one per violation, sorted)
PLAN_FAULTS = [
    ("p5", lambda p: replace(p, placement_group=False), ["aws-placement-group"]),
    ("p5", _cards_from_one, ["aws-efa-interfaces", "aws-efa-interfaces"]),  # cards 1..32, no primary on card 0
    ("p5", lambda p: replace(p, interfaces=p.interfaces[:-1]), ["aws-efa-interfaces"]),
    ("p5", _public_ip_on_second, ["aws-no-public-ip-multi-nic"]),
    ("p5", lambda p: replace(p, market="capacity-block"), ["aws-placement-group"]),  # EC2 places blocks itself
    ("g5", lambda p: replace(p, market="capacity-block"), ["provisioning-model-offered"]),
    ("a2", lambda p: replace(p, compact_placement=False), ["gcp-placement-supported"]),
    ("a2", lambda p: replace(p, local_ssd_listed=3), ["gcp-local-ssd-count"]),
    ("a2", lambda p: replace(p, local_ssd_interface="SCSI"), ["gcp-local-ssd-count"]),
    ("a2", lambda p: replace(p, all_or_nothing=True), ["gcp-mig-all-or-nothing"]),  # BULK with STANDARD VMs
    ("a2", lambda p: replace(p, action_on_failure="DO_NOTHING"), ["gcp-mig-replaces-lost-nodes"]),  # lost stays lost
    # bulk-inserted A3 Mega nodes: no compact policy in the template, or only the MIG's workload
    # policy (which places only the VMs the MIG creates), leaves them unplaced
    ("a3mega", lambda p: replace(p, compact_placement=False), ["gcp-placement-supported"]),
    ("a3mega", lambda p: replace(p, compact_placement=False, workload_policy=True), ["gcp-placement-supported"]),
    ("a2", lambda p: replace(p, workload_policy=True), ["gcp-placement-supported"]),  # A2 MIGs take none
    ("a3mega", lambda p: _network(p, "gpu-3", mtu=1460), ["mtu-matches-facts"]),
    ("a3mega", lambda p: replace(p, networks=p.networks[:-1]), ["nic-layout-matches-facts"]),
    ("a3ultra", lambda p: replace(p, provisioning_model="STANDARD"), ["provisioning-model-offered"]),
    (
        "a3ultra",
        lambda p: replace(p, provisioning_model="RESERVATION_BOUND"),
        ["gcp-mig-all-or-nothing", "gcp-mig-replaces-lost-nodes", "gcp-reservation-bound"],
    ),  # no BULK mode, a repairing group, no reservation named
    ("a3ultra", lambda p: _network(p, "roce", firewall=True), ["gcp-roce-no-firewall"]),
    ("a3ultra", lambda p: replace(p, boot_disk_type="pd-balanced"), ["gcp-boot-disk-type"]),
]


@pytest.mark.parametrize(
    ("key", "fault", "rules"),
    PLAN_FAULTS,
    ids=[f"{key}-{rules[0]}-{i}" for i, (key, _, rules) in enumerate(PLAN_FAULTS)],
)
def test_check_plan_names_the_broken_rule(key, fault, rules):
    spec, plan = _spec_and_plan(key)
    assert check_plan(spec, plan) == []
    found = check_plan(spec, fault(plan))
    assert [v.rule for v in found] == rules
    assert all(v.resource.startswith("plan.") and v.source == RULES[v.rule].source for v in found)


def test_every_plan_rule_has_a_fault_test():
    assert {rule for _, _, rules in PLAN_FAULTS for rule in rules} == PLAN_RULES - {"gcp-placement-max-vms"}


def test_max_vms_is_judged_on_the_plan():
    """``gcp-placement-max-vms``: the planner refuses more VMs than one policy holds, so the
    fault is a spec whose node count grew after planning (the policy's vm_count is the node
    count, judged against the machine's limit)."""
    spec, plan = _spec_and_plan("a2")
    limit = spec.facts.placement.max_vms
    grown = spec.model_copy(update={"nodes": limit + 1})
    assert [v.rule for v in check_plan(grown, plan)] == ["gcp-placement-max-vms"]


def test_rule_registry_is_split_into_plan_preview_only_and_refusal_rules():
    assert PLAN_RULES | set(PREVIEW_ONLY_RULES) | REFUSAL_RULES == set(RULES)
    assert not PLAN_RULES & set(PREVIEW_ONLY_RULES) and not PLAN_RULES & REFUSAL_RULES
    assert not set(PREVIEW_ONLY_RULES) & REFUSAL_RULES


# -- the same fault on the plan and on the preview's resources: both paths name the same rule ----


def _lt(graph):
    (lt,) = graph.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    return lt


def _tpl(graph):
    (template,) = graph.of_type("gcp:compute/instanceTemplate:InstanceTemplate")
    return template


def _mig(graph):
    (mig,) = graph.of_type("gcp:compute/instanceGroupManager:InstanceGroupManager")
    return mig


def _graph_cards_from_one(graph):
    for nic in _lt(graph).inputs["networkInterfaces"]:
        nic["networkCardIndex"] = int(nic.get("networkCardIndex", 0)) + 1


def _graph_network_mtu(graph, role, mtu):
    (net,) = [n for n in graph.of_type("gcp:compute/network:Network") if n.name.endswith(f"-{role}")]
    net.inputs["mtu"] = mtu


# (stack, fault on the plan, the same fault on the preview's resources)
BOTH_FAULTS = [
    ("p5", lambda p: replace(p, placement_group=False), lambda g: _lt(g).inputs.pop("placement")),
    ("p5", _cards_from_one, _graph_cards_from_one),
    (
        "p5",
        _public_ip_on_second,
        lambda g: _lt(g).inputs["networkInterfaces"][1].__setitem__("associatePublicIpAddress", "true"),
    ),
    ("a2", lambda p: replace(p, compact_placement=False), lambda g: _tpl(g).inputs.pop("resourcePolicies")),
    ("a2", lambda p: replace(p, local_ssd_listed=3), lambda g: _tpl(g).inputs["disks"].pop()),
    (
        "a2",
        lambda p: replace(p, all_or_nothing=True),
        lambda g: _mig(g).inputs.__setitem__("targetSizePolicies", [{"mode": "BULK"}]),
    ),
    ("a3mega", lambda p: replace(p, compact_placement=False), lambda g: _tpl(g).inputs.pop("resourcePolicies")),
    ("a3mega", lambda p: _network(p, "gpu-3", mtu=1460), lambda g: _graph_network_mtu(g, "gpu-3", 1460)),
    ("a3mega", lambda p: replace(p, networks=p.networks[:-1]), lambda g: _tpl(g).inputs["networkInterfaces"].pop()),
    (
        "a3ultra",
        lambda p: replace(p, boot_disk_type="pd-balanced"),
        lambda g: _tpl(g).inputs["disks"][0].__setitem__("diskType", "pd-balanced"),
    ),
]


@pytest.fixture(scope="module")
def previewed():
    """Stack key -> (spec, plan, preview resources) for the stacks of :data:`BOTH_FAULTS`."""
    built = {}
    for key in sorted({key for key, _, _ in BOTH_FAULTS}):
        spec, plan = _spec_and_plan(key)
        built[key] = (spec, plan, preview(spec).resources)
    return built


@pytest.mark.parametrize(
    ("key", "on_plan", "on_graph"), BOTH_FAULTS, ids=[f"{key}-{i}" for i, (key, _, _) in enumerate(BOTH_FAULTS)]
)
def test_plan_and_preview_name_the_same_rule_for_the_same_fault(previewed, key, on_plan, on_graph):
    spec, plan, resources = previewed[key]
    facts = {spec.instance_type: spec.facts}
    graph = ResourceGraph.from_records(copy.deepcopy(list(resources)))
    assert check_plan(spec, plan) == [] and check_graph(graph, facts) == []
    on_graph(graph)
    plan_rules = sorted({v.rule for v in check_plan(spec, on_plan(plan))})
    graph_rules = sorted({v.rule for v in check_graph(graph, facts)})
    assert plan_rules == graph_rules and len(plan_rules) == 1
