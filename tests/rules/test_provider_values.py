"""``provider-valid-values``: allowed values read from the installed pulumi-aws / pulumi-gcp
docstrings, the check over synthetic graphs, and a smoke run over the example stacks."""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuinfra.errors import GpuinfraError
from gpuinfra.rules.model import ResourceGraph
from gpuinfra.rules.provider_values import (
    DOCSTRING_GAPS,
    RULE_NAME,
    allowed_values,
    check_provider_values,
    checked_inputs,
    field_at,
    parse_allowed_values,
)

ROOT = Path(__file__).resolve().parents[2]
FLEET = "aws:ec2/fleet:Fleet"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
CORS = "aws:s3/bucketCorsConfiguration:BucketCorsConfiguration"
IGM = "gcp:compute/instanceGroupManager:InstanceGroupManager"
IT = "gcp:compute/instanceTemplate:InstanceTemplate"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"


@dataclass
class Record:
    """What the preview records: type token, logical name, camelCase inputs."""

    type: str
    name: str
    inputs: dict[str, Any] = field(default_factory=dict)
    parent: str | None = None


def graph(*records: Record) -> ResourceGraph:
    return ResourceGraph.from_records(records)


# --------------------------------------------------------------------------- values from the SDKs


@pytest.mark.parametrize(
    ("token", "path", "expected"),
    [
        # pulumi_aws ec2/_inputs.py FleetOnDemandOptionsArgs: "Valid values: `lowestPrice`, `prioritized`."
        (FLEET, ("onDemandOptions", "allocationStrategy"), {"lowestPrice", "prioritized"}),
        # FleetSpotOptionsArgs: "Valid values: `diversified`, `lowestPrice`, `capacity-optimized`,
        # `capacity-optimized-prioritized` and `price-capacity-optimized`."
        (
            FLEET,
            ("spotOptions", "allocationStrategy"),
            {
                "diversified",
                "lowestPrice",
                "capacity-optimized",
                "capacity-optimized-prioritized",
                "price-capacity-optimized",
            },
        ),
        (FLEET, ("type",), {"maintain", "request", "instant"}),
        # pulumi_gcp compute InstanceGroupManagerTargetSizePolicyArgs: 'Values: "BULK", "INDIVIDUAL".'
        (IGM, ("targetSizePolicies", "mode"), {"BULK", "INDIVIDUAL"}),
        # ResourcePolicyWorkloadPolicyArgs: "Possible values are: `HIGH_AVAILABILITY`, `HIGH_THROUGHPUT`."
        (POLICY, ("workloadPolicy", "type"), {"HIGH_AVAILABILITY", "HIGH_THROUGHPUT"}),
        # InstanceTemplateSchedulingArgs: "This field accepts the value `STANDARD`, `SPOT`,
        # `FLEX_START`, or `RESERVATION_BOUND`."
        (IT, ("scheduling", "provisioningModel"), {"STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND"}),
        # InstanceTemplateNetworkInterfaceArgs (unquoted):
        # "Possible values:GVNIC, VIRTIO_NET, IDPF, MRDMA, IRDMA and IDPF"
        (IT, ("networkInterfaces", "nicType"), {"GVNIC", "VIRTIO_NET", "IDPF", "MRDMA", "IRDMA"}),
        # LaunchTemplateMetadataOptionsArgs: 'Can be `"optional"` or `"required"`.'
        (LT, ("metadataOptions", "httpTokens"), {"optional", "required"}),
        # LaunchTemplateBlockDeviceMappingEbsArgs:
        # "Can be one of `standard`, `gp2`, `gp3`, `io1`, `io2`, `sc1` or `st1`."
        (LT, ("blockDeviceMappings", "ebs", "volumeType"), {"standard", "gp2", "gp3", "io1", "io2", "sc1", "st1"}),
        # SecurityGroupRuleArgs: "Valid options are `ingress` (inbound)\n or `egress` (outbound)." (wrapped)
        (SG_RULE, ("type",), {"ingress", "egress"}),
    ],
)
def test_allowed_values_from_installed_sdk_docstrings(token, path, expected):
    assert allowed_values(token, path) == expected


@pytest.mark.parametrize(
    ("token", "path"),
    [
        # LaunchTemplateNetworkInterfaceArgs: "To create an Elastic Fabric Adapter (EFA), specify `efa`." -- no list
        (LT, ("networkInterfaces", "interfaceType")),
        (LT, ("instanceMarketOptions", "marketType")),  # "Can be `spot`." -- one value after "can be"
        (FLEET, ("tags",)),  # a map, not an enum
        (FLEET, ("onDemandOptions",)),  # a nested object
        (FLEET, ("onDemandOptions", "noSuchInput")),
        (FLEET, ("noSuchInput", "allocationStrategy")),
        ("aws:ec2/noSuchThing:NoSuchThing", ("type",)),
        ("gpuinfra:aws:GpuCluster", ("type",)),
        ("kubernetes:core/v1:Pod", ("kind",)),
    ],
)
def test_no_allowed_values(token, path):
    assert allowed_values(token, path) is None


def test_docstring_gaps_are_still_gaps():
    """Each DOCSTRING_GAPS value is one the SDK docstring's own list lacks: once pulumi-aws lists
    it, this fails and the entry goes."""
    for (module, class_name, attr), (extra, _source) in DOCSTRING_GAPS.items():
        cls = getattr(importlib.import_module(module), class_name)
        documented = parse_allowed_values(getattr(cls, attr).__doc__, attr)
        assert documented and not extra & documented, (class_name, attr, documented)
    spec = field_at(FLEET, ("targetCapacitySpecification", "defaultTargetCapacityType"))
    assert spec.allowed == {"on-demand", "spot", "capacity-block"}
    assert "API_TargetCapacitySpecificationRequest" in spec.source


# --------------------------------------------------------------------------- docstring phrasings


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            "The order. Valid values: `lowestPrice`, `prioritized`. Default: `lowestPrice`.",
            {"lowestPrice", "prioritized"},
        ),
        ("Valid values are `a`, `b`, and `c`", {"a", "b", "c"}),
        ("Valid options are: `MANUAL`, `SCALE_OUT_POOL`.", {"MANUAL", "SCALE_OUT_POOL"}),
        (
            "Structure is documented below.\nPossible values are: `HIGH_AVAILABILITY`, `HIGH_THROUGHPUT`.",
            {"HIGH_AVAILABILITY", "HIGH_THROUGHPUT"},
        ),
        ('The mode of target size policy. Values: "BULK", "INDIVIDUAL".', {"BULK", "INDIVIDUAL"}),
        ("Can be one of `x`, `y` or `z`.", {"x", "y", "z"}),
        ("Default value is `X`.\nPossible values are: `X`, `Y`.", {"X", "Y"}),
        ("Possible values are `ENABLED` and `DISABLED`, default is `ENABLED`.", {"ENABLED", "DISABLED"}),
        ("Valid values are `a` (default) and `b`.", {"a", "b"}),
        ("The only valid value is `sigv4`.", {"sigv4"}),
        ("Valid values: `ENABLED`,\n`DISABLED`.", {"ENABLED", "DISABLED"}),
        (
            "Possible values are STANDARD, SPOT, FLEX_START, and RESERVATION_BOUND.",
            {"STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND"},
        ),
        ("Each value may be one of: `MONDAY`, `TUESDAY`.", {"MONDAY", "TUESDAY"}),
    ],
)
def test_parse_recognized_phrasings(doc, expected):
    assert parse_allowed_values(doc) == expected


@pytest.mark.parametrize(
    "doc",
    [
        "Valid values include `optional` or `required`.",
        "Valid values include: `a`, `b`.",
        "The disk type, such as `pd-ssd` or `pd-balanced`.",
        "A type, e.g. `a`, `b`.",
        "For example `a` or `b`.",
        "If `type` is set to `S3`, valid values are `NONE` or `ZIP`.",
        "Valid values are `300` to `3600`.",
        "Valid values are `HTTP`, `HTTPS`, or `#{protocol}`.",
        "Valid values are `*`, `GET`.",
        "Valid values are `KMS` or the ARN of a customer managed key.",
        "Possible values: TIER_1 or an ARN.",
        "Possible values are lowercase, words.",
        "Day must be one of `Mon`, `Tue`.",  # about part of the value, not the property
        "Exactly one of `foo` or `bar` must be specified.",
        "Can be `spot`.",
        "Valid values: `a`, `b`. Valid values: `c`, `d`.",  # two lists: ambiguous
        "",
        None,
    ],
)
def test_parse_skipped_phrasings(doc):
    assert parse_allowed_values(doc, "preferred_maintenance_window") is None


def test_modal_subject_may_name_the_property():
    doc = "Strategy can only be one of BLUE_GREEN or SURGE."
    assert parse_allowed_values(doc, "strategy") == {"BLUE_GREEN", "SURGE"}
    assert parse_allowed_values(doc, "node_count") is None


# --------------------------------------------------------------------------- the check


def fleet(allocation_strategy: Any) -> Record:
    return Record(
        FLEET,
        "nodes-fleet",
        {
            "onDemandOptions": {"allocationStrategy": allocation_strategy, "singleInstanceType": True},
            "targetCapacitySpecification": {"defaultTargetCapacityType": "on-demand", "totalTargetCapacity": 2},
            "type": "instant",
        },
    )


def test_lowest_price_is_flagged_with_path_value_and_allowed_values():
    found = check_provider_values(graph(fleet("lowest-price")))
    assert len(found) == 1
    violation = found[0]
    assert violation.rule == RULE_NAME == "provider-valid-values"
    assert violation.resource == "nodes-fleet"
    for part in ("onDemandOptions.allocationStrategy", "'lowest-price'", "lowestPrice", "prioritized"):
        assert part in violation.message
    assert violation.source.startswith("pulumi_aws 7.")
    assert "FleetOnDemandOptionsArgs.allocation_strategy docstring" in violation.source


def test_lowest_price_camel_case_passes():
    g = graph(fleet("lowestPrice"))
    assert check_provider_values(g) == []
    assert checked_inputs(g) == 3  # allocationStrategy, defaultTargetCapacityType, type


def test_list_of_strings_checks_each_element():
    g = graph(
        Record(
            CORS,
            "cors",
            {
                "bucket": "b",
                "corsRules": [
                    {"allowedMethods": ["GET", "FETCH"], "allowedOrigins": ["*"]},
                    {"allowedMethods": ["PUT"], "allowedOrigins": ["https://example.com"]},
                ],
            },
        )
    )
    found = check_provider_values(g)
    assert checked_inputs(g) == 3
    assert [v.message.split(" is not")[0] for v in found] == [f"{CORS} input corsRules[0].allowedMethods[1] = 'FETCH'"]


def test_nested_lists_of_args():
    lt = Record(
        LT,
        "nodes-lt",
        {
            "blockDeviceMappings": [{"deviceName": "/dev/sda1", "ebs": {"volumeType": "gp4", "volumeSize": 200}}],
            "metadataOptions": {"httpTokens": "required", "httpEndpoint": "enabled"},
            "networkInterfaces": [
                {"interfaceType": "efa", "networkCardIndex": 0},
                {"interfaceType": "efa-only", "networkCardIndex": 1},
            ],
        },
    )
    template = Record(
        IT,
        "nodes-template",
        {
            "networkInterfaces": [{"nicType": "GVNIC"}, {"nicType": "RDMA"}],
            "scheduling": {"provisioningModel": "FLEX_START", "instanceTerminationAction": "DELETE"},
        },
    )
    found = check_provider_values(graph(lt, template))
    assert sorted((v.resource, v.message.split(" = ")[0].split(" input ")[1]) for v in found) == [
        ("nodes-lt", "blockDeviceMappings[0].ebs.volumeType"),
        ("nodes-template", "networkInterfaces[1].nicType"),
    ]
    assert "GVNIC, IDPF, IRDMA, MRDMA, VIRTIO_NET" in next(v.message for v in found if v.resource == "nodes-template")


def test_unknown_tokens_inputs_and_values_are_skipped():
    g = graph(
        Record("gpuinfra:aws:GpuCluster", "cluster", {"type": "whatever"}),
        Record("aws:ec2/noSuchThing:NoSuchThing", "x", {"type": "whatever"}),
        Record("random:index/randomId:RandomId", "r", {"byteLength": 4}),
        Record("pulumi:providers:aws", "provider", {"region": "us-east-1"}),
        Record(
            FLEET,
            "fleet",
            {
                "noSuchInput": "lowest-price",
                "onDemandOptions": {"allocationStrategy": 3, "noSuchNested": {"x": "y"}},
                "spotOptions": {"allocationStrategy": "04da6b54-80e4-46f7-96ec-b56ff0331ba9"},  # unknown
                "type": "",
                "tags": {"type": "not-a-fleet-type"},  # a map: keys are not inputs
                "excessCapacityTerminationPolicy": None,
            },
        ),
        Record(LT, "lt", {"metadataOptions": {"httpTokens": "true"}}),  # a boolean as a string
        Record(IT, "tpl", {"networkInterfaces": "not-a-list-of-objects", "scheduling": ["odd"]}),
    )
    assert check_provider_values(g) == []
    assert checked_inputs(g) == 0


def test_capacity_block_fleet_passes():
    record = fleet("lowestPrice")
    record.inputs["targetCapacitySpecification"]["defaultTargetCapacityType"] = "capacity-block"
    assert check_provider_values(graph(record)) == []


# --------------------------------------------------------------------------- smoke over real previews


def _example_stacks() -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))


def _example_preview(stack: str):
    """The offline preview of ``stacks/Pulumi.<stack>.yaml``; when the stack file no longer
    loads (written by an older gpuinfra), the preview of a fresh plan of the same shape."""
    from gpuinfra.stackfile import provider_config, read_stack_spec
    from tests.blueprints.helpers import make_spec, preview

    try:
        spec = read_stack_spec(ROOT, stack)
    except GpuinfraError as exc:
        print(f"{stack}: stack file does not load ({str(exc).splitlines()[0][:120]}); previewing a fresh plan")
        cluster = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"]["gpuinfra:cluster"]
        spec = make_spec(
            cluster["instance_type"],
            cluster["nodes"],
            cluster["profile"]["name"],
            cluster["cloud"],
            spot=bool(cluster.get("spot")),
        )
        return preview(spec)
    from gpuinfra.preview import run_preview

    return run_preview(spec, provider_config(spec))


@pytest.mark.parametrize("stack", _example_stacks())
def test_smoke_example_stack(stack):
    result = _example_preview(stack)
    g = ResourceGraph.from_records(result.resources)
    started = time.perf_counter()
    found = check_provider_values(g)
    elapsed = time.perf_counter() - started
    count = checked_inputs(g)
    print(
        f"{stack}: {len(g.resources)} resources, {count} inputs compared in {elapsed * 1000:.1f} ms, "
        f"{len(found)} violation(s)"
    )
    for violation in found:
        print("  " + violation.line())
    assert count > 0
    assert elapsed < 1.0
