"""Cloud rules over real offline previews: clean stacks pass, and each rule catches a stack
broken in exactly that one way (mutation tests), naming the rule."""

from __future__ import annotations

import copy
import json

import pytest

from gpuinfra.errors import RuleViolationError, SpecError
from gpuinfra.rules import RULES, check_facts_current, check_graph, check_offered_in_zone, check_preview
from gpuinfra.rules.model import ResourceGraph
from tests.blueprints.helpers import make_spec, preview

SHAPES = {
    "p5": dict(instance_type="p5.48xlarge", nodes=2, cloud="aws"),
    "g5": dict(instance_type="g5.xlarge", nodes=1, cloud="aws", profile="dev"),
    "a3mega": dict(instance_type="a3-megagpu-8g", nodes=2, cloud="gcp"),
    "a3ultra": dict(instance_type="a3-ultragpu-8g", nodes=2, cloud="gcp", spot=True),
    "a2": dict(instance_type="a2-highgpu-4g", nodes=2, cloud="gcp"),
    "p4d-spot": dict(instance_type="p4d.24xlarge", nodes=2, cloud="aws", spot=True),
    # an A3 Ultra reservation (shared, named by its owner project): RESERVATION_BOUND + BULK
    "a3ultra-res": dict(
        instance_type="a3-ultragpu-8g",
        nodes=2,
        cloud="gcp",
        spot=True,
        reservation="projects/owner-project/reservations/h200-block",
    ),
}


@pytest.fixture(scope="module")
def previews():
    built = {}
    for key, shape in SHAPES.items():
        shape = dict(shape)
        reservation = shape.pop("reservation", None)
        spec = make_spec(**shape)
        if reservation:  # what a user writes into a spot stack file to use a reservation
            spec = type(spec).model_validate(
                {
                    **spec.model_dump(),
                    "spot": False,
                    "gcp_reservation": reservation,
                    "gcp_reservation_accepts_placement": True,
                }
            )
        built[key] = (spec, preview(spec).resources)
    return built


def _graph(previews, key):
    spec, records = previews[key]
    return ResourceGraph.from_records(copy.deepcopy(records)), {spec.instance_type: spec.facts}


@pytest.mark.parametrize("key", sorted(SHAPES))
def test_generated_stacks_conform(previews, key):
    spec, records = previews[key]
    assert check_preview(spec, records) == []


def _one(graph, token, name_part=""):
    return next(r for r in graph if r.type == token and name_part in r.name)


def _lt(g):
    return _one(g, "aws:ec2/launchTemplate:LaunchTemplate")


def _fleet(g):
    return _one(g, "aws:ec2/fleet:Fleet")


def _tpl(g):
    return _one(g, "gcp:compute/instanceTemplate:InstanceTemplate")


def _mig(g):
    return _one(g, "gcp:compute/instanceGroupManager:InstanceGroupManager")


def _drop(g, token, name_part):
    g.resources.remove(_one(g, token, name_part))


def _set(obj, path, value):
    *head, last = path.split(".")
    for key in head:
        obj = obj[key]
    obj[last] = value


def _add_compact_policy(g, vm_count):
    from gpuinfra.rules.model import Resource

    g.resources.append(
        Resource(
            "gcp:compute/resourcePolicy:ResourcePolicy",
            "t-2-compact",
            {"groupPlacementPolicy": {"collocation": "COLLOCATED", "vmCount": vm_count}},
        )
    )
    _tpl(g).inputs["resourcePolicies"] = "https://www.googleapis.com/compute/v1/projects/p/resourcePolicies/t-2-compact"


# (rule, stack, mutation): each breaks one thing the rule protects
MUTATIONS = [
    (
        "provider-valid-values",
        "p5",
        lambda g: _set(_fleet(g).inputs, "onDemandOptions.allocationStrategy", "lowest-price"),
    ),
    ("aws-efa-sg-both-ways", "p5", lambda g: _drop(g, "aws:ec2/securityGroupRule:SecurityGroupRule", "self-egress")),
    ("aws-efa-interfaces", "p5", lambda g: _lt(g).inputs["networkInterfaces"].pop()),
    ("aws-efa-interfaces", "p5", lambda g: _set(_lt(g).inputs["networkInterfaces"][0], "interfaceType", "efa-only")),
    (
        "aws-no-public-ip-multi-nic",
        "p5",
        lambda g: _set(_lt(g).inputs["networkInterfaces"][1], "associatePublicIpAddress", "true"),
    ),
    ("aws-placement-group", "p5", lambda g: _lt(g).inputs.pop("placement")),
    ("aws-imdsv2", "p5", lambda g: _set(_lt(g).inputs, "metadataOptions.httpTokens", "optional")),
    (
        "aws-ssh-not-world",
        "p5",
        lambda g: g.resources.append(
            type(_lt(g))(
                "aws:ec2/securityGroupRule:SecurityGroupRule",
                "t-2-sg-ssh",
                {"type": "ingress", "protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/1"]},
            )
        ),
    ),
    ("aws-fleet-all-or-nothing", "p5", lambda g: _set(_fleet(g).inputs, "onDemandOptions.minTargetCapacity", 1)),
    (
        "provisioning-model-offered",
        "g5",
        lambda g: _set(_fleet(g).inputs, "targetCapacitySpecification.defaultTargetCapacityType", "capacity-block"),
    ),
    (
        "single-zone",
        "p5",
        lambda g: _set(_one(g, "aws:ec2/subnet:Subnet", "nat").inputs, "availabilityZoneId", "use1-az2"),
    ),
    (
        "bucket-not-public",
        "p5",
        lambda g: _set(
            _one(g, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs, "restrictPublicBuckets", False
        ),
    ),
    ("aws-s3-deny-insecure-transport", "p5", lambda g: _drop(g, "aws:s3/bucketPolicy:BucketPolicy", "")),
    ("aws-spot-replacement", "p4d-spot", lambda g: _drop(g, "aws:cloudwatch/eventRule:EventRule", "")),
    ("aws-spot-replacement", "p4d-spot", lambda g: _drop(g, "aws:lambda/permission:Permission", "")),
    (
        "aws-spot-replacement",
        "p4d-spot",
        lambda g: _set(_one(g, "aws:cloudwatch/eventRule:EventRule").inputs, "eventPattern", '{"source": ["aws.ec2"]}'),
    ),
    ("gcp-local-ssd-count", "a2", lambda g: _tpl(g).inputs["disks"].pop()),  # 3 of {4, 8}
    (
        "gcp-local-ssd-count",
        "a3mega",
        lambda g: (
            _tpl(g).inputs["disks"].extend([{"diskType": "local-ssd", "interface": "NVME", "type": "SCRATCH"}] * 16)
        ),
    ),
    # bulk-inserted A3 Mega nodes without the template's compact policy: nothing places them
    ("gcp-placement-supported", "a3mega", lambda g: _tpl(g).inputs.pop("resourcePolicies")),
    # the MIG of an A2 cluster names a workload policy: A2 MIGs do not take one
    (
        "gcp-placement-supported",
        "a2",
        lambda g: _set(_mig(g).inputs, "resourcePolicies", {"workloadPolicy": "https://x/resourcePolicies/w"}),
    ),
    (
        "gcp-placement-max-vms",
        "a2",
        lambda g: _set(_one(g, "gcp:compute/resourcePolicy:ResourcePolicy").inputs, "groupPlacementPolicy.vmCount", 3),
    ),
    ("gcp-mig-all-or-nothing", "a3ultra-res", lambda g: _mig(g).inputs.pop("targetSizePolicies")),
    ("gcp-mig-all-or-nothing", "a3mega", lambda g: _set(_mig(g).inputs, "targetSizePolicies", [{"mode": "BULK"}])),
    ("gcp-mig-all-or-nothing", "a2", lambda g: _set(_tpl(g).inputs, "metadata.startup-script", "#!/bin/bash\n")),
    # STANDARD nodes from an ordinary MIG of size N, a bulk insert that is not all or nothing, none
    ("gcp-mig-all-or-nothing", "a2", lambda g: _set(_mig(g).inputs, "targetSize", 2)),
    (
        "gcp-mig-all-or-nothing",
        "a2",
        lambda g: _set(_one(g, "pulumi-python:dynamic/gcp:BulkInsert").inputs, "min_count", 1),
    ),
    ("gcp-mig-all-or-nothing", "a2", lambda g: _drop(g, "pulumi-python:dynamic/gcp:BulkInsert", "")),
    (
        "gcp-mig-replaces-lost-nodes",
        "a2",
        lambda g: _set(_mig(g).inputs, "instanceLifecyclePolicy.defaultActionOnFailure", "DO_NOTHING"),
    ),
    # unset is the API's default, REPAIR
    ("gcp-mig-replaces-lost-nodes", "a3ultra-res", lambda g: _mig(g).inputs.pop("instanceLifecyclePolicy")),
    (
        "gcp-mig-replaces-lost-nodes",
        "a3ultra-res",
        lambda g: _set(_mig(g).inputs, "instanceLifecyclePolicy.defaultActionOnFailure", "REPAIR"),
    ),
    ("gcp-reservation-bound", "a3ultra-res", lambda g: _tpl(g).inputs.pop("reservationAffinity")),
    (
        "provisioning-model-offered",
        "a3ultra",
        lambda g: _set(_tpl(g).inputs, "scheduling.provisioningModel", "STANDARD"),
    ),
    (
        "gcp-reservation-bound",
        "a3ultra",
        lambda g: _set(_tpl(g).inputs, "scheduling.provisioningModel", "RESERVATION_BOUND"),
    ),
    ("gcp-host-maintenance", "a2", lambda g: _set(_tpl(g).inputs, "scheduling.onHostMaintenance", "MIGRATE")),
    (
        "gcp-roce-no-firewall",
        "a3ultra",
        lambda g: g.resources.append(
            type(_tpl(g))(
                "gcp:compute/firewall:Firewall", "t-2-roce-allow", {"network": "t-2-roce-id", "direction": "INGRESS"}
            )
        ),
    ),
    ("gcp-boot-disk-type", "a3ultra", lambda g: _set(_tpl(g).inputs["disks"][0], "diskType", "pd-balanced")),
    ("nic-layout-matches-facts", "a3mega", lambda g: _tpl(g).inputs["networkInterfaces"].pop()),
    (
        "mtu-matches-facts",
        "a3mega",
        lambda g: _set(_one(g, "gcp:compute/network:Network", "gpu-3").inputs, "mtu", 1460),
    ),
    (
        "bucket-not-public",
        "a2",
        lambda g: _set(_one(g, "gcp:storage/bucket:Bucket").inputs, "publicAccessPrevention", "inherited"),
    ),
    ("bucket-same-region", "a2", lambda g: _set(_one(g, "gcp:storage/bucket:Bucket").inputs, "location", "EU")),
    ("single-zone", "a2", lambda g: _mig(g).inputs.pop("zone")),
    # tests/rules/test_node_values.py injects the user data / startup script faults
    ("node-values-grammar", "p5", lambda g: _set(_fleet(g).inputs, "tags.gpuinfra:stack", "t-2 $(id)")),
]


@pytest.mark.parametrize(
    ("rule", "key", "mutate"), MUTATIONS, ids=[f"{rule}-{key}-{i}" for i, (rule, key, _) in enumerate(MUTATIONS)]
)
def test_each_rule_catches_its_mutation(previews, rule, key, mutate):
    graph, facts = _graph(previews, key)
    assert check_graph(graph, facts) == []
    mutate(graph)
    found = check_graph(graph, facts)
    assert rule in {v.rule for v in found}, [v.line() for v in found]
    hit = next(v for v in found if v.rule == rule)
    assert hit.line().startswith(f"{rule}: ") and hit.source and hit.source in hit.line()
    if rule != "provider-valid-values":  # that one cites the SDK class and property it read
        assert hit.source == RULES[rule].source


# Rules a spec breaks before any resource exists: the blueprint's planner refuses, naming the rule.
SPEC_MUTATIONS = [
    ("high-bandwidth-nics", dict(instance_type="g5.xlarge", nodes=1, cloud="aws", profile="dev", hbn="required")),
    # A3 High's TCPX needs a kernel the DLVM image lacks: `required` (hand-edited) without a baked image
    ("fabric-installable-at-boot", dict(instance_type="a3-highgpu-8g", nodes=2, cloud="gcp", hbn="required")),
    (
        "provisioning-model-offered",
        dict(instance_type="a3-ultragpu-8g", nodes=1, cloud="gcp", spot=True, spot_off=True),
    ),
    (
        "gcp-placement-supported",
        dict(
            instance_type="n1-standard-8",
            gpus="1xT4",
            nodes=1,
            cloud="gcp",
            profile="dev",
            set_nodes=2,
            profile_updates={"placement": "required"},
        ),
    ),
    ("gcp-local-ssd-count", dict(instance_type="a2-highgpu-4g", nodes=1, cloud="gcp", scratch_gib=4000)),
    # a hand-edited stack whose root disk is below the baked image's root snapshot
    (
        "baked-image",
        dict(
            instance_type="p4d.24xlarge",
            nodes=1,
            cloud="aws",
            ami_id="ami-0fedcba9876543210",
            baked_image={"bake": "bake-p4d", "region": "us-east-1", "root_snapshot_gib": 300},
        ),
    ),
    (
        "aws-capacity-reservation",
        dict(
            instance_type="p5.48xlarge",
            nodes=2,
            cloud="aws",
            capacity_reservation_id="cr-0123456789abcdef0",
            capacity_reservation_zone="use1-az9",
        ),
    ),
]


@pytest.mark.parametrize(("rule", "shape"), SPEC_MUTATIONS, ids=[r for r, _ in SPEC_MUTATIONS])
def test_blueprint_refuses_spec_naming_the_rule(rule, shape):
    shape = dict(shape)
    spot_off = shape.pop("spot_off", False)
    set_nodes = shape.pop("set_nodes", None)
    scratch_gib = shape.pop("scratch_gib", None)
    hbn = shape.pop("hbn", None)
    overrides = {k: shape.pop(k) for k in list(shape) if k.startswith("capacity_reservation")}
    spec = make_spec(**shape)
    data = spec.model_dump()
    data.update(overrides)
    if spot_off:
        data["spot"] = False
    if set_nodes:
        data["nodes"] = set_nodes
    if scratch_gib:
        data["profile"]["scratch"]["min_gib"] = scratch_gib
    if hbn:  # a hand edit of the stack file's profile
        data["profile"]["high_bandwidth_networking"] = hbn
    spec = type(spec).model_validate(data)
    with pytest.raises(RuleViolationError) as info:
        preview(spec)
    assert str(info.value).startswith(f"{rule}: ")
    assert isinstance(info.value, SpecError) and info.value.exit_code == 2


def test_stack_level_rules(previews):
    from gpuinfra.catalog.store import load_catalog

    spec, _ = previews["a2"]
    catalog = load_catalog()
    moved = type(spec).model_validate({**spec.model_dump(), "zone": f"{spec.region}-z"})
    assert [v.rule for v in check_offered_in_zone(moved, catalog)] == ["offered-in-zone"]
    edited = spec.model_dump()
    edited["facts"]["local_ssd"]["attach_counts"] = (2, 4, 8)
    stale = type(spec).model_validate(edited)
    found = check_facts_current(stale, catalog)
    assert [v.rule for v in found] == ["facts-current"] and "local_ssd" in found[0].message
    assert check_facts_current(spec, catalog) == [] and check_offered_in_zone(spec, catalog) == []


def _no_spot_price_offer():
    from gpuinfra.catalog.store import load_catalog

    return next(
        o
        for o in load_catalog().offers
        if o.spot_price_per_hour_usd is None
        and not o.local_zone
        and o.on_demand_price_per_hour_usd is not None
        and o.cloud == "aws"
    )


# Rules the planner applies at `new`, before any stack exists: (rule, request, profile)
PLANNER_REFUSALS = [
    (
        "price-known",
        lambda: dict(
            instance_type=_no_spot_price_offer().instance_type, zone=_no_spot_price_offer().zone, cloud="aws", spot=True
        ),
        "llm-finetune",
    ),
    ("scratch-capacity", lambda: dict(instance_type="g5.xlarge", cloud="aws"), "llm-finetune"),  # 232 GiB < 500 GiB
    ("profile-spot-policy", lambda: dict(instance_type="g5.xlarge", cloud="aws", spot=True), "inference"),
    ("high-bandwidth-nics", lambda: dict(instance_type="g5.xlarge", cloud="aws", nodes=2), "llm-pretrain"),
    ("provisioning-model-offered", lambda: dict(instance_type="a3-highgpu-1g", cloud="gcp", spot=False), "dev"),
]


@pytest.mark.parametrize(("rule", "request_args", "profile"), PLANNER_REFUSALS, ids=[r for r, _, _ in PLANNER_REFUSALS])
def test_new_refuses_naming_the_rule(rule, request_args, profile):
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.errors import GpuinfraError
    from gpuinfra.planner import PlanRequest, plan_cluster
    from gpuinfra.profiles import get_profile
    from tests.blueprints.helpers import NOW

    with pytest.raises(GpuinfraError) as info:
        plan_cluster(load_catalog(), PlanRequest(gpus=None, **request_args()), get_profile(profile), NOW)
    assert rule in str(info.value) and len(str(info.value).splitlines()) == 1


def test_every_rule_has_a_mutation_test():
    covered = {r for r, _, _ in MUTATIONS} | {r for r, _ in SPEC_MUTATIONS} | {"offered-in-zone", "facts-current"}
    covered |= {r for r, _, _ in PLANNER_REFUSALS} | {
        "budget-max-price"
    }  # test_budget_rule_with_the_stacks_own_max_price
    assert covered == set(RULES)


def test_rule_lines_are_one_line_with_source(previews):
    graph, facts = _graph(previews, "p5")
    _lt(graph).inputs["metadataOptions"]["httpTokens"] = "optional"
    (found,) = check_graph(graph, facts)
    assert "\n" not in found.line() and "configuring-IMDS-new-instances" in found.line()
    json.dumps(found.__dict__)


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_default_4xa100_stacks_pass_the_provider_values_check(run_cli, tmp_path, cloud):
    from gpuinfra.rules.provider_values import check_provider_values, checked_inputs
    from gpuinfra.stackfile import read_stack_spec

    result = run_cli(
        "new", "--gpus", "4xA100", "--cloud", cloud, "--name", f"d-{cloud}", "--project-dir", str(tmp_path)
    )
    assert result.exit_code == 0, result.stderr
    spec = read_stack_spec(tmp_path, f"d-{cloud}")
    graph = ResourceGraph.from_records(preview(spec).resources)
    assert checked_inputs(graph) >= 10  # not vacuous: e.g. the fleet's allocation strategy, NIC types
    assert check_provider_values(graph) == []


def test_budget_rule_with_the_stacks_own_max_price(previews):
    from gpuinfra.rules import check_budget

    spec, records = previews["p5"]  # 2 x p5.48xlarge on demand: $110.08/h of compute alone
    assert check_budget(spec, records) == []  # no budget set
    within = type(spec).model_validate({**spec.model_dump(), "max_price_per_hour_usd": "1000"})
    assert check_budget(within, records) == []
    over = type(spec).model_validate({**spec.model_dump(), "max_price_per_hour_usd": "100"})
    (found,) = check_budget(over, records)
    assert found.rule == "budget-max-price" and "over its max_price_per_hour_usd $100.00/h" in found.message
    moved = copy.deepcopy(records)
    for record in moved:
        if record.type == "aws:ec2/subnet:Subnet":
            record.inputs["availabilityZoneId"] = "use1-az9"  # no p5 price in that AZ
    found = check_budget(over, moved)
    assert found and all("a missing price is never $0" in v.message for v in found)


def test_new_refuses_a_stack_over_its_budget(run_cli, tmp_path):
    over = run_cli(
        "new", "--gpus", "8xH100", "--cloud", "aws", "--max-price-per-hour", "10", "--project-dir", str(tmp_path)
    )
    assert over.exit_code == 2 and over.stderr.startswith("error: budget-max-price: the stack costs $")
    assert not (tmp_path / "stacks").exists() or list((tmp_path / "stacks").iterdir()) == []
    nan = run_cli(
        "new", "--gpus", "8xH100", "--cloud", "aws", "--max-price-per-hour", "nan", "--project-dir", str(tmp_path)
    )
    assert nan.exit_code == 2 and "max_price_per_hour_usd" in nan.stderr
    ok = run_cli(
        "new",
        "--gpus",
        "8xH100",
        "--cloud",
        "aws",
        "--max-price-per-hour",
        "100",
        "--name",
        "ok",
        "--project-dir",
        str(tmp_path),
    )
    assert ok.exit_code == 0, ok.stderr
