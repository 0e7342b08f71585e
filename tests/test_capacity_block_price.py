"""A Capacity Block's upfront fee: read with the real boto3 EC2 client from a local server
answering DescribeCapacityBlockOfferings in EC2's documented XML, written to the stack file with
its source and date, and priced by `cost` as one upfront line the total includes; without a fee
the total stays incomplete."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gpuinfra import capacity
from gpuinfra.capacity import quote_capacity_block
from tests.replay_server import ReplayServer
from tests.test_capacity import _cr, _factory

FIXTURES = Path(__file__).parent / "fixtures"
OFFERINGS = (FIXTURES / "ec2_describe_capacity_block_offerings.xml").read_text()
READ_AT = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
#: the us-east-1b offering of the fixture: same type, count, AZ, start and end as the block
FEE = Decimal("26429.76")


def _quote(body, block=None):
    with ReplayServer([("POST", "/", None, body)]) as server:
        price = quote_capacity_block(block or _cr(), _factory(server.url), READ_AT)
    return price, server.requests


def test_the_fee_is_the_offering_for_the_same_block_read_with_the_real_client():
    price, requests = _quote(OFFERINGS)
    assert price is not None and price.upfront_usd == FEE and price.date == "2026-11-22"
    assert "cb-0bbbbbbbbbbbbbbb2" in price.source and "cr-0123456789abcdef0" in price.source
    (request,) = requests
    form = request[3].decode()
    # what EC2 needs to find the same block (API_DescribeCapacityBlockOfferings request parameters)
    for field in (
        "Action=DescribeCapacityBlockOfferings",
        "InstanceType=p5.48xlarge",
        "InstanceCount=4",
        "CapacityDurationHours=168",
        "StartDateRange=2026-11-23T11%3A30%3A00",
        "EndDateRange=2026-11-30T11%3A30%3A00",
    ):
        assert field in form, field


def test_no_offering_of_the_same_block_no_fee():
    other_week = OFFERINGS.replace("2026-11-30T11:30:00.000Z", "2026-12-01T11:30:00.000Z")
    assert _quote(other_week)[0] is None
    assert _quote(OFFERINGS.replace("USD", "EUR"))[0] is None
    assert _quote(OFFERINGS.replace("<upfrontFee>26429.76", "<upfrontFee>n/a"))[0] is None


def test_an_ec2_error_leaves_no_fee_instead_of_failing_new():
    error = (FIXTURES / "ec2_error_capacity_reservation_not_found.xml").read_text()
    assert _quote((400, error))[0] is None
    on_demand_reservation = replace(_cr(), capacity_block=False)
    assert quote_capacity_block(on_demand_reservation, _factory("http://127.0.0.1:9"), READ_AT) is None


def _new_block(run_cli, tmp_path, monkeypatch, offerings):
    cr = _cr()
    monkeypatch.setattr(capacity, "describe_capacity_reservation", lambda rid, region, factory=None: cr)
    server = ReplayServer([("POST", "/", None, offerings)]).__enter__()
    monkeypatch.setattr(capacity, "aws_client_factory", lambda: _factory(server.url))
    try:
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
    finally:
        server.__exit__(None, None, None)
    assert result.exit_code == 0, result.stderr
    # llm-pretrain's 5,000 GB at S3's $0.023/GB-month (aws.amazon.com/s3/pricing) and at most as much
    # again in earlier versions for 7 days: $115 + $26.47
    assert "left after down: $141.47/month (the kept bucket;" in result.stdout
    return yaml.safe_load((tmp_path / "stacks" / "Pulumi.block.yaml").read_text())["config"]["gpuinfra:cluster"]


def test_new_records_the_fee_and_cost_totals_it_once(run_cli, tmp_path, monkeypatch):
    cluster = _new_block(run_cli, tmp_path, monkeypatch, OFFERINGS)
    assert Decimal(cluster["capacity_block_upfront_usd"]) == FEE
    assert "DescribeCapacityBlockOfferings cb-0bbbbbbbbbbbbbbb2" in cluster["capacity_block_price_source"]
    assert cluster["capacity_block_price_date"] == datetime.now(UTC).strftime("%Y-%m-%d")
    result = run_cli("cost", "block", "--json", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    (block,) = [x for x in doc["lines"] if x["component"].startswith("Capacity Block, paid up front")]
    assert Decimal(block["run_usd"]) == FEE and block["unit_price_usd"] == "26429.760000"
    assert not [x for x in doc["lines"] if x["component"].startswith("Instance usage")]
    others = sum(Decimal(x["run_usd"]) for x in doc["lines"] if x is not block)
    assert Decimal(doc["run_usd"]) == FEE + others
    # a longer run does not pay the block again
    longer = json.loads(run_cli("cost", "block", "--json", "--hours", "100", "--project-dir", str(tmp_path)).stdout)
    (again,) = [x for x in longer["lines"] if x["component"].startswith("Capacity Block")]
    assert Decimal(again["run_usd"]) == FEE
    text = run_cli("cost", "block", "--project-dir", str(tmp_path)).stdout
    assert "Capacity Block" in text and "total: $" in text and "incomplete" not in text


def test_without_a_fee_the_block_stays_incomplete_never_zero(run_cli, tmp_path, monkeypatch):
    cluster = _new_block(run_cli, tmp_path, monkeypatch, OFFERINGS.replace("us-east-1b", "us-east-1c"))
    assert "capacity_block_upfront_usd" not in cluster or cluster["capacity_block_upfront_usd"] is None
    result = run_cli("cost", "block", "--json", "--project-dir", str(tmp_path))
    assert result.exit_code == 4
    doc = json.loads(result.stdout)
    assert doc["run_usd"] is None and doc["lines_without_price"] >= 1


def test_a_fee_needs_a_block_and_its_source_and_date():
    from tests.blueprints.helpers import make_spec

    spec = make_spec("p5.48xlarge")
    with pytest.raises(ValidationError, match="needs capacity_block: true"):
        type(spec).model_validate(
            {
                **spec.model_dump(),
                "capacity_block_upfront_usd": "100",
                "capacity_block_price_source": "bill",
                "capacity_block_price_date": "2026-11-22",
            }
        )
    block = {**spec.model_dump(), "capacity_block": True, "capacity_reservation_id": "cr-0123456789abcdef0"}
    with pytest.raises(ValidationError, match="go together"):
        type(spec).model_validate({**block, "capacity_block_upfront_usd": "100"})
    with pytest.raises(ValidationError):
        type(spec).model_validate(
            {
                **block,
                "capacity_block_upfront_usd": "-1",
                "capacity_block_price_source": "bill",
                "capacity_block_price_date": "2026-11-22",
            }
        )


def test_the_amount_of_the_bill_written_by_hand_is_what_cost_totals(run_cli, tmp_path, monkeypatch):
    _new_block(run_cli, tmp_path, monkeypatch, OFFERINGS.replace("us-east-1b", "us-east-1c"))  # no quote
    path = tmp_path / "stacks" / "Pulumi.block.yaml"
    data = yaml.safe_load(path.read_text())
    data["config"]["gpuinfra:cluster"].update(
        capacity_block_upfront_usd="25000.5",
        capacity_block_price_source="AWS bill, invoice line for cr-0123456789abcdef0",
        capacity_block_price_date="2026-11-20",
    )
    path.write_text(yaml.safe_dump(data))
    result = run_cli("cost", "block", "--json", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    (block,) = [x for x in json.loads(result.stdout)["lines"] if x["component"].startswith("Capacity Block")]
    assert (block["run_usd"], block["price_source"], block["price_date"]) == (
        "25000.500000",
        "AWS bill, invoice line for cr-0123456789abcdef0",
        "2026-11-20",
    )
