"""``new --capacity-reservation``: the real boto3 EC2 client against a local server answering
DescribeCapacityReservations in EC2's documented XML."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
import yaml

from gpuinfra.capacity import describe_capacity_reservation
from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import MissingDependencyError, RequestError, RuleViolationError
from gpuinfra.planner import PlanRequest, plan_cluster
from gpuinfra.profiles import get_profile
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
