"""SSH open to the world: refused by the spec (``network.ssh_cidr``) and by the rule
``aws-ssh-not-world`` over a preview, unless the stack file allows it
(``network.allow_world_ssh``, written by ``gpuinfra new --allow-world-ssh``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuinfra.rules import check_preview
from gpuinfra.rules.aws import ssh_from_world_violations
from gpuinfra.spec import ClusterSpec, NetworkSettings
from tests.blueprints.helpers import make_spec, preview


@pytest.mark.parametrize(
    "cidr",
    [
        "0.0.0.0/0",
        "0.0.0.0/1",  # half the internet: with 128.0.0.0/1, 0.0.0.0/0 in two rules
        "128.0.0.0/1",
        "64.0.0.0/7",
    ],
)
def test_the_spec_refuses_a_world_open_ssh_cidr_unless_allowed(cidr):
    with pytest.raises(ValidationError, match=r"opens SSH \(TCP 22\) to the internet.*--allow-world-ssh"):
        NetworkSettings(ssh_cidr=cidr)
    assert NetworkSettings(ssh_cidr=cidr, allow_world_ssh=True).ssh_cidr == cidr


@pytest.mark.parametrize(("cidr", "kept"), [("203.0.113.7/32", "203.0.113.7/32"), ("10.1.2.3/8", "10.0.0.0/8")])
def test_the_spec_keeps_a_network_of_ones_own(cidr, kept):
    assert NetworkSettings(ssh_cidr=cidr).ssh_cidr == kept


@pytest.mark.parametrize("cidr", ["::/0", "2001:db8::/32", "203.0.113.7/33", "example.com", "0.0.0.0/0; touch /x"])
def test_the_spec_takes_ipv4_cidr_blocks_only(cidr):
    with pytest.raises(ValidationError, match="not an IPv4 CIDR block"):
        NetworkSettings(ssh_cidr=cidr)


def test_allow_world_ssh_is_an_aws_setting():
    spec = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp")
    doc = spec.model_dump()
    doc["network"]["allow_world_ssh"] = True
    with pytest.raises(ValidationError, match="AWS settings"):
        ClusterSpec.model_validate(doc)


SSH = {"protocol": "tcp", "fromPort": 22, "toPort": 22}


@pytest.mark.parametrize(
    ("rule", "refused"),
    [
        ({**SSH, "cidrBlocks": ["0.0.0.0/0"]}, True),
        ({**SSH, "ipv6CidrBlocks": ["::/0"]}, True),
        ({**SSH, "ipv6CidrBlocks": ["2000::/3"]}, True),  # all of today's global unicast space
        ({"protocol": "-1", "fromPort": 0, "toPort": 0, "cidrBlocks": ["0.0.0.0/0"]}, True),  # every port
        ({"protocol": "6", "fromPort": 0, "toPort": 65535, "cidrBlocks": ["0.0.0.0/0"]}, True),
        ({**SSH, "cidrBlocks": ["203.0.113.0/24", "10.0.0.0/8"]}, False),
        ({**SSH, "ipv6CidrBlocks": ["2600::/12"]}, False),  # one registry's block, the bound
        ({"protocol": "tcp", "fromPort": 443, "toPort": 443, "cidrBlocks": ["0.0.0.0/0"]}, False),
        ({"protocol": "udp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}, False),
    ],
)
def test_the_rule_judges_each_ingress_rule(rule, refused):
    found = ssh_from_world_violations("sg", rule, allowed=False)
    assert bool(found) == refused and all(v.rule == "aws-ssh-not-world" for v in found)
    assert ssh_from_world_violations("sg", rule, allowed=True) == []


def _with_ssh(cidr: str, allow: bool):
    spec = make_spec("g5.xlarge", nodes=1, profile="dev")
    doc = spec.model_dump()
    doc["network"].update({"ssh_cidr": cidr, "allow_world_ssh": allow})
    return ClusterSpec.model_validate(doc)


def test_a_preview_opens_world_ssh_only_when_the_stack_allows_it():
    """The real network component: an allowed world-open ssh_cidr passes the rule because the
    stack's resources carry the allow tag; the same security group rule without it is refused."""
    spec = _with_ssh("0.0.0.0/0", allow=True)
    result = preview(spec)
    (rule,) = [r for r in result.of_type("aws:ec2/securityGroupRule:SecurityGroupRule") if r.name.endswith("sg-ssh")]
    assert rule.inputs["cidrBlocks"] == ["0.0.0.0/0"] and rule.inputs["fromPort"] == 22
    assert [v for v in check_preview(spec, result.resources) if v.rule == "aws-ssh-not-world"] == []
    for record in result.resources:  # the same resources without the stack's allow tag
        tags = record.inputs.get("tags")
        if isinstance(tags, dict):
            tags.pop("gpuinfra:allow-world-ssh", None)
    found = [v for v in check_preview(spec, result.resources) if v.rule == "aws-ssh-not-world"]
    assert [v.resource for v in found] == [rule.name]
    own = _with_ssh("203.0.113.7/32", allow=False)
    assert [v for v in check_preview(own, preview(own).resources) if v.rule == "aws-ssh-not-world"] == []
