"""The CrossGuard policy pack's validators, run in-process on pulumi_policy's own argument
objects built from offline previews (props wrapped in pulumi-policy's unknown-checking proxy,
with the ids Pulumi does not know during ``pulumi preview`` left unknown)."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

pulumi_policy = pytest.importorskip("pulumi_policy")
from pulumi_policy import PolicyResource, PolicyResourceOptions, StackValidationArgs  # noqa: E402
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy  # noqa: E402

from gpuinfra.rules.crossguard import policies  # noqa: E402
from tests.blueprints.helpers import make_spec, preview  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _as_policy_resources(records, unknown_ids: bool):
    """PolicyResources as the analyzer builds them; ``unknown_ids`` blanks every ``*-id``
    reference as Pulumi does for resources not created yet."""
    out = []
    for record in records:
        props = copy.deepcopy(record.inputs)
        if unknown_ids:
            props = _blank_ids(props)
        opts = PolicyResourceOptions(False, [], False, [], None, [])
        out.append(
            PolicyResource(
                record.type,
                unknown_checking_proxy(props),
                f"urn:pulumi:s::gpuinfra::{record.type}::{record.name}",
                record.name,
                opts,
                None,
                None,
                [],
                {},
            )
        )
    return out


def _blank_ids(value):
    """What a first ``pulumi preview`` does not know: ids, ARNs, self links, generated names,
    and every value computed from them (bucket policy JSON, startup script, user data)."""
    if isinstance(value, dict):
        return {k: _blank_ids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank_ids(v) for v in value]
    if isinstance(value, str) and (
        value.endswith("-id") or "preview" in value or value.startswith(("arn:", "https://"))
    ):
        return UNKNOWN_STRING_VALUE
    return value


def _run(policy_name, resources, config=None):
    policy = next(p for p in policies() if p.name == policy_name)
    found = []
    args = StackValidationArgs(resources, config or {})
    try:
        policy.validate(args, lambda message, urn=None: found.append((message, urn)))
    except Exception as exc:  # not_applicable raises pulumi_policy's own error
        if type(exc).__name__ != "_NotApplicableError":
            raise
        found.append(("not applicable", None))
    return found


@pytest.fixture(scope="module")
def p5_records():
    return preview(make_spec("p5.48xlarge", nodes=2)).resources


@pytest.fixture(scope="module")
def gcp_records():
    return {t: preview(make_spec(t, nodes=2, cloud="gcp")).resources for t in ("a3-megagpu-8g", "a2-highgpu-4g")}


@pytest.mark.parametrize("unknown_ids", [False, True])
def test_clean_stacks_pass_the_rule_policy(p5_records, gcp_records, unknown_ids):
    assert _run("gpuinfra-cloud-rules", _as_policy_resources(p5_records, unknown_ids)) == []
    for records in gcp_records.values():
        assert _run("gpuinfra-cloud-rules", _as_policy_resources(records, unknown_ids)) == []


def test_unknown_values_are_really_unknown_to_the_rules(p5_records, gcp_records):
    # the blanking reaches what a first `pulumi preview` cannot know, so the test above means something
    aws = _as_policy_resources(p5_records, unknown_ids=True)
    policy = next(r for r in aws if r.resource_type == "aws:s3/bucketPolicy:BucketPolicy")
    assert policy.props["__target"]["policy"] == UNKNOWN_STRING_VALUE
    a2 = _as_policy_resources(gcp_records["a2-highgpu-4g"], unknown_ids=True)
    template = next(r for r in a2 if r.resource_type.endswith("instanceTemplate:InstanceTemplate"))
    assert template.props["__target"]["resourcePolicies"] == UNKNOWN_STRING_VALUE
    assert template.props["__target"]["metadata"]["__target"]["startup-script"] == UNKNOWN_STRING_VALUE


def test_rule_policy_reports_the_same_violation_as_preview(p5_records):
    broken = copy.deepcopy(p5_records)
    fleet = next(r for r in broken if r.type == "aws:ec2/fleet:Fleet")
    fleet.inputs["onDemandOptions"]["allocationStrategy"] = "lowest-price"  # the EC2 API spelling the provider rejects
    sg_egress = next(r for r in broken if r.name.endswith("sg-self-egress"))
    broken.remove(sg_egress)
    found = _run("gpuinfra-cloud-rules", _as_policy_resources(broken, unknown_ids=True))
    messages = [m for m, _ in found]
    assert any(m.startswith("provider-valid-values: t-2-fleet:") and "lowestPrice" in m for m in messages)
    assert any(
        m.startswith("aws-efa-sg-both-ways: t-2-sg: no self-referencing all-traffic egress rule") for m in messages
    )
    assert "urn:pulumi:s::gpuinfra::aws:ec2/fleet:Fleet::t-2-fleet" in {u for _, u in found}


def test_budget_policy(p5_records):
    resources = _as_policy_resources(p5_records, unknown_ids=True)
    assert _run("gpuinfra-budget", resources) == [("not applicable", None)]
    assert _run("gpuinfra-budget", resources, {"maxPricePerHourUsd": 1000}) == []
    (over,) = _run("gpuinfra-budget", resources, {"maxPricePerHourUsd": 50})
    # 2 x p5.48xlarge on demand in use1-az1 at $55.04/h (catalog) plus NAT, IPv4 and storage
    assert over[0].startswith("the stack costs $1") and "over maxPricePerHourUsd $50.00/h" in over[0]
    (bad,) = _run("gpuinfra-budget", resources, {"maxPricePerHourUsd": "lots"})
    assert "not set to a number" in bad[0]


def test_budget_policy_fails_closed_on_a_missing_price(p5_records):
    moved = copy.deepcopy(p5_records)
    for record in moved:
        if record.type == "aws:ec2/subnet:Subnet":
            record.inputs["availabilityZoneId"] = "use1-az9"  # no catalog offer there
    found = _run("gpuinfra-budget", _as_policy_resources(moved, unknown_ids=True), {"maxPricePerHourUsd": 1000})
    assert found and all("a missing price is never $0" in m for m, _ in found)


def test_policy_pack_program_serves_these_policies():
    main = ROOT / "policy" / "__main__.py"
    tree = ast.parse(main.read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "gpuinfra.rules.crossguard"
        for alias in node.names
    }
    assert imported == {"policies"}
    assert "runtime:" in (ROOT / "policy" / "PulumiPolicy.yaml").read_text()
    assert "pulumi-policy" in (ROOT / "policy" / "requirements.txt").read_text()


def test_budget_policy_reads_the_stacks_own_budget_tag():
    spec = make_spec("p5.48xlarge", nodes=2, max_price_per_hour_usd="100")
    records = preview(spec).resources
    fleet = next(r for r in records if r.type == "aws:ec2/fleet:Fleet")
    assert fleet.inputs["tags"]["gpuinfra:max-price-per-hour-usd"] == "100"
    (over,) = _run("gpuinfra-budget", _as_policy_resources(records, unknown_ids=True))
    assert "over maxPricePerHourUsd $100.00/h" in over[0]
    gcp = preview(make_spec("a2-highgpu-4g", cloud="gcp", max_price_per_hour_usd="5.125")).resources
    bucket = next(r for r in gcp if r.type == "gcp:storage/bucket:Bucket")
    assert bucket.inputs["labels"]["gpuinfra-max-price-per-hour-usd"] == "5_125"  # labels take no '.'
    assert bucket.inputs["labels"]["gpuinfra-run-hours"] == "24"
    (over,) = _run("gpuinfra-budget", _as_policy_resources(gcp, unknown_ids=True))
    assert "over maxPricePerHourUsd $5.12/h" in over[0] or "over maxPricePerHourUsd $5.13/h" in over[0]


def test_budget_policy_and_preview_agree_on_the_price(p5_records):
    from decimal import Decimal

    from gpuinfra.cost.report import cost_summary

    spec = make_spec("p5.48xlarge", nodes=2, max_price_per_hour_usd="1000")
    records = preview(spec).resources
    hourly = Decimal(cost_summary(spec, records)["hourly_usd"])
    just_below = hourly - Decimal("0.01")
    tagged = copy.deepcopy(records)
    for record in tagged:
        if "tags" in record.inputs and "gpuinfra:max-price-per-hour-usd" in record.inputs["tags"]:
            record.inputs["tags"]["gpuinfra:max-price-per-hour-usd"] = str(just_below)
    (over,) = _run("gpuinfra-budget", _as_policy_resources(tagged, unknown_ids=True))
    assert f"the stack costs ${hourly:.2f}/h" in over[0]
    for record in tagged:
        if "tags" in record.inputs and "gpuinfra:max-price-per-hour-usd" in record.inputs["tags"]:
            record.inputs["tags"]["gpuinfra:max-price-per-hour-usd"] = str(hourly + Decimal("0.01"))  # cents rounding
    assert _run("gpuinfra-budget", _as_policy_resources(tagged, unknown_ids=True)) == []
