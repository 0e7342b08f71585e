"""``new --capacity-reservation``: the real boto3 EC2 client against a local server answering
DescribeCapacityReservations in EC2's documented XML."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
import yaml

from gpuinfra.agent.node import END_SYNC_BOUND_SECONDS, Agent, AgentConfig
from gpuinfra.capacity import describe_capacity_reservation
from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import MissingDependencyError, RequestError, RuleViolationError
from gpuinfra.plan.node_files import node_env
from gpuinfra.plan.tags import aws_tags
from gpuinfra.planner import PlanRequest, plan_cluster
from gpuinfra.profiles import get_profile
from gpuinfra.stackfile import read_stack_spec
from tests.conftest import without_aws_credentials
from tests.replay_server import ReplayServer

FIXTURES = Path(__file__).parent / "fixtures"
NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
BLOCK = (FIXTURES / "ec2_describe_capacity_reservations_block.xml").read_text()
NOT_FOUND = (400, (FIXTURES / "ec2_error_capacity_reservation_not_found.xml").read_text())


def _factory(url):
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
    return lambda service, region: session.client(service, region_name=region, endpoint_url=url)


def test_reads_the_reservation_with_the_real_client():
    with ReplayServer([("POST", "/", None, BLOCK)]) as server:
        cr = describe_capacity_reservation("cr-0123456789abcdef0", "us-east-1", _factory(server.url))
    assert (cr.instance_type, cr.zone_id, cr.available_instance_count, cr.capacity_block, cr.state) == (
        "p5.48xlarge",
        "use1-az6",
        4,
        True,
        "active",
    )
    body = server.requests[0][3].decode()
    assert "Action=DescribeCapacityReservations" in body and "CapacityReservationId.1=cr-0123456789abcdef0" in body


def test_unknown_reservation_and_bad_ids_are_bad_input():
    with (
        ReplayServer([("POST", "/", None, NOT_FOUND)]) as server,
        pytest.raises(RequestError, match="cr-0000000000000000f does not exist in us-east-1"),
    ):
        describe_capacity_reservation("cr-0000000000000000f", "us-east-1", _factory(server.url))
    with pytest.raises(RequestError, match="not a reservation id"):
        describe_capacity_reservation("cr-nothex", "us-east-1", _factory("http://127.0.0.1:9"))


def test_no_credentials_is_exit_6(monkeypatch, tmp_path):
    without_aws_credentials(monkeypatch, tmp_path)
    with pytest.raises(MissingDependencyError) as info:
        describe_capacity_reservation("cr-0123456789abcdef0", "us-east-1")
    assert info.value.exit_code == 6


def _cr():
    with ReplayServer([("POST", "/", None, BLOCK)]) as server:
        return describe_capacity_reservation("cr-0123456789abcdef0", "us-east-1", _factory(server.url))


def test_plan_takes_type_zone_and_capacity_from_the_reservation():
    plan = plan_cluster(
        load_catalog(), PlanRequest(gpus=None, nodes=2, capacity_reservation=_cr()), get_profile("llm-pretrain"), NOW
    )
    spec = plan.spec
    assert (spec.cloud, spec.instance_type, spec.zone, spec.region) == ("aws", "p5.48xlarge", "use1-az6", "us-east-1")
    assert (spec.capacity_reservation_id, spec.capacity_block, spec.capacity_reservation_instance_count) == (
        "cr-0123456789abcdef0",
        True,
        4,
    )


def test_plan_refuses_more_nodes_than_the_reservation_and_contradicting_flags():
    with pytest.raises(
        RuleViolationError, match="^aws-capacity-reservation: nodes=5 but cr-0123456789abcdef0 has 4 of 4"
    ):
        plan_cluster(
            load_catalog(),
            PlanRequest(gpus=None, nodes=5, capacity_reservation=_cr()),
            get_profile("llm-pretrain"),
            NOW,
        )
    with pytest.raises(RequestError, match="--zone use1-az1 contradicts capacity reservation"):
        plan_cluster(
            load_catalog(),
            PlanRequest(gpus=None, zone="use1-az1", capacity_reservation=_cr()),
            get_profile("llm-pretrain"),
            NOW,
        )


def test_new_with_a_capacity_reservation_writes_and_previews(run_cli, tmp_path, monkeypatch):
    from gpuinfra import capacity

    cr = _cr()
    monkeypatch.setattr(capacity, "describe_capacity_reservation", lambda rid, region, factory=None: cr)
    monkeypatch.setattr(capacity, "quote_capacity_block", lambda block, factory=None, now=None: None)
    result = run_cli(
        "new",
        "--capacity-reservation",
        "cr-0123456789abcdef0",
        "--region",
        "us-east-1",
        "--nodes",
        "4",
        "--profile",
        "llm-pretrain",
        "--name",
        "block",
        "--project-dir",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.stderr
    cluster = yaml.safe_load((tmp_path / "stacks" / "Pulumi.block.yaml").read_text())["config"]["gpuinfra:cluster"]
    assert cluster["capacity_block"] is True and cluster["zone"] == "use1-az6"
    missing_region = run_cli("new", "--capacity-reservation", "cr-0123456789abcdef0", "--project-dir", str(tmp_path))
    assert missing_region.exit_code == 2 and "needs --region" in missing_region.stderr


def test_scheduled_block_counts_all_its_instances_and_windows_reservations_are_refused():
    scheduled = BLOCK.replace("<state>active</state>", "<state>scheduled</state>").replace(
        "<availableInstanceCount>4</availableInstanceCount>", "<availableInstanceCount>0</availableInstanceCount>"
    )
    with ReplayServer([("POST", "/", None, scheduled)]) as server:
        cr = describe_capacity_reservation("cr-0123456789abcdef0", "us-east-1", _factory(server.url))
    assert (cr.state, cr.available_instance_count) == ("scheduled", 4)
    windows = BLOCK.replace(
        "<instancePlatform>Linux/UNIX</instancePlatform>", "<instancePlatform>Windows</instancePlatform>"
    )
    with (
        ReplayServer([("POST", "/", None, windows)]) as server,
        pytest.raises(RequestError, match="is for Windows with default tenancy"),
    ):
        describe_capacity_reservation("cr-0123456789abcdef0", "us-east-1", _factory(server.url))


#: The fixture block's EndDate.
BLOCK_END = datetime(2026, 11, 30, 11, 30, tzinfo=UTC)
#: EC2 begins to end a Capacity Block's instances 30 minutes before its end ("Forty minutes before
#: your Capacity Block reservation ends ... will begin to terminate in 10 minutes":
#: docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html).
EC2_ENDS_INSTANCES = BLOCK_END - timedelta(minutes=30)


def test_the_blocks_end_is_read_and_the_ttl_ends_the_nodes_before_ec2_does():
    cr = _cr()
    assert cr.end_date == BLOCK_END
    profile = get_profile("llm-pretrain")
    assert NOW + timedelta(hours=profile.ttl_hours) > BLOCK_END  # the profile's TTL alone runs past it
    spec = plan_cluster(load_catalog(), PlanRequest(gpus=None, nodes=2, capacity_reservation=cr), profile, NOW).spec
    assert spec.capacity_block_end == BLOCK_END
    # the agent ends the node at expires_at and syncs for at most END_SYNC_BOUND_SECONDS after it
    assert spec.expires_at + timedelta(seconds=END_SYNC_BOUND_SECONDS) <= EC2_ENDS_INSTANCES
    assert spec.expires_at > EC2_ENDS_INSTANCES - timedelta(hours=1, seconds=END_SYNC_BOUND_SECONDS)  # not far off
    spec.check_ttl_within_block()  # what `new` writes passes `preview`
    # an on-demand reservation (no block) keeps the profile's TTL
    odcr = replace(cr, capacity_block=False)
    plain = plan_cluster(load_catalog(), PlanRequest(gpus=None, nodes=2, capacity_reservation=odcr), profile, NOW)
    assert plain.spec.capacity_block_end is None and plain.spec.profile.ttl_hours == profile.ttl_hours


def test_a_block_that_ends_too_soon_is_refused():
    soon = replace(_cr(), end_date=NOW + timedelta(minutes=80))
    with pytest.raises(RequestError, match="less than 1 h from now"):
        plan_cluster(
            load_catalog(), PlanRequest(gpus=None, nodes=2, capacity_reservation=soon), get_profile("llm-pretrain"), NOW
        )


def test_preview_refuses_a_ttl_past_the_block_and_the_agent_ends_the_node_before_ec2(run_cli, tmp_path, monkeypatch):
    from gpuinfra import capacity

    cr = _cr()
    monkeypatch.setattr(capacity, "describe_capacity_reservation", lambda rid, region, factory=None: cr)
    args = ("--capacity-reservation", "cr-0123456789abcdef0", "--region", "us-east-1", "--nodes", "2")
    result = run_cli("new", *args, "--profile", "llm-pretrain", "--name", "block", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    path = tmp_path / "stacks" / "Pulumi.block.yaml"
    doc = yaml.safe_load(path.read_text())
    cluster = doc["config"]["gpuinfra:cluster"]
    assert datetime.fromisoformat(cluster["capacity_block_end"].replace("Z", "+00:00")) == BLOCK_END
    cluster["profile"]["ttl_hours"] = 24 * 30  # edited past the block's end
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    refused = run_cli("preview", "block", "--project-dir", str(tmp_path))
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1
    assert "past capacity block cr-0123456789abcdef0" in refused.stderr and "set ttl_hours to at most" in refused.stderr
    # deployed anyway (`up` does not preview): node.env and the expires-at tag end the nodes first
    spec = read_stack_spec(tmp_path, "block")
    assert spec.expires_at == BLOCK_END - timedelta(minutes=30, seconds=END_SYNC_BOUND_SECONDS)
    env_file = tmp_path / "node.env"
    env_file.write_text(node_env(spec, "aws", "bkt", "/scratch"))
    assert aws_tags(spec)["gpuinfra:expires-at"] == f"{spec.expires_at:%Y-%m-%dT%H:%M:%SZ}"
    ended = []

    class NoMetadata:
        def interruption(self):
            return None

        def expires_at(self):
            return None

    class Busy:
        def utilizations(self):
            return [95] * 8

    t = [spec.expires_at - timedelta(minutes=1)]
    agent = Agent(
        AgentConfig.from_env_file(env_file),
        Busy(),
        NoMetadata(),
        None,
        ended.append,
        now=lambda: t[0],
        clock=lambda: 0.0,
    )
    agent.state_dir = tmp_path / "run"
    agent.step()
    assert ended == []
    t[0] = spec.expires_at
    agent.step()
    assert ended == ["expired"] and t[0] + timedelta(seconds=END_SYNC_BOUND_SECONDS) <= EC2_ENDS_INSTANCES
