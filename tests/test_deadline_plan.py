"""`gpuinfra plan`: ways to buy a run by a deadline, read through the real boto3 EC2 client and the
real google-auth session from local stand-ins answering in the documented formats, ranked with
exact prices, starts and finishes; offline, the catalog plans and the options that need credentials."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from gpuinfra.capacity import CAPACITY_BLOCK_DURATIONS_HOURS, capacity_block_duration_hours
from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import RequestError
from gpuinfra.services.deadline import DeadlineRequest, deadline_document, parse_deadline, poisson_tail
from tests.replay_server import ReplayServer
from tests.test_capacity import _factory

FIXTURES = Path(__file__).parent / "fixtures"
OFFERINGS = (FIXTURES / "ec2_describe_capacity_block_offerings_deadline.xml").read_text()
HELD = (FIXTURES / "ec2_describe_capacity_reservations_block.xml").read_text()
NOW = datetime(2026, 11, 27, 6, 0, tzinfo=UTC)
BY = datetime(2026, 12, 12, 0, 0, tzinfo=UTC)
#: catalog p5.48xlarge in us-east-1 (use1-az1): on-demand and spot $/node-h, Spot Instance Advisor band 5-10%
P5_ON_DEMAND, P5_SPOT, BAND_UPPER = Decimal("55.04"), Decimal("52.0766"), Decimal("0.10")


def _aws_doc(by=BY, budget=None, offerings=OFFERINGS, held=HELD):
    routes = [
        ("POST", "/", "Action=DescribeCapacityBlockOfferings", offerings),
        ("POST", "/", "Action=DescribeCapacityReservations", held),
    ]
    req = DeadlineRequest("8xH100", 2, Decimal(72), by, NOW, budget, cloud="aws", region="us-east-1")
    with ReplayServer(routes) as server:
        doc = deadline_document(load_catalog(), req, aws_client_factory=_factory(server.url))
    return doc, server.requests


def test_plans_are_ranked_for_the_deadline_with_exact_prices_and_starts():
    doc, requests = _aws_doc()
    rows = [
        (p["way"], p["offering_id"] or p["reservation_id"], p["compute_cost_usd"], p["marks"]) for p in doc["plans"]
    ]
    # the run is 72 h; Poisson mean = 0.10/730 per node-h x 2 nodes x 72 h, each interruption 15 min restart
    # (assumed) + 30 min re-work (half the assumed 60 min interval)
    mean = BAND_UPPER / 730 * 2 * 72
    spot_usd = P5_SPOT * 2 * (72 + mean * Decimal("0.75"))
    assert rows[0] == ("held-reservation", "cr-0123456789abcdef0", "0.000000", [])
    assert rows[1] == ("capacity-block", "cb-0ddddddddddddddd4", "6144.000000", [])
    assert rows[2][0] == "spot" and Decimal(rows[2][2]) == spot_usd.quantize(Decimal("0.000001")) and rows[2][3] == []
    assert rows[3] == ("on-demand", None, str(P5_ON_DEMAND * 2 * 72) + "0000", [])
    # the cheaper block starts too late to finish by the deadline; the one priced in EUR has no USD price
    assert rows[4] == ("capacity-block", "cb-0ccccccccccccccc3", "5000.000000", ["misses deadline"])
    assert rows[5] == ("capacity-block", "cb-0eeeeeeeeeeeeeee5", None, ["unpriced"])
    block = doc["plans"][1]
    assert (block["start"], block["finish"], block["window_end"], block["upfront"]) == (
        "2026-11-28T11:30:00Z",
        "2026-12-01T11:30:00Z",
        "2026-12-02T11:30:00Z",
        True,
    )
    assert "cannot be modified or cancelled" in block["risk"] and block["zone"] == "us-east-1b"
    held = doc["plans"][0]
    assert (held["start"], held["finish"]) == ("2026-11-27T06:00:00Z", "2026-11-30T06:00:00Z")
    assert doc["meets_deadline"] == 4 and doc["not_seen"] == []
    forms = [r[3].decode() for r in requests]
    (ask,) = [f for f in forms if "Action=DescribeCapacityBlockOfferings" in f]
    # 72 h + EC2's 30 min lead fit the 4-day block (1-day steps up to 14 days)
    for part in (
        "InstanceType=p5.48xlarge",
        "InstanceCount=2",
        "CapacityDurationHours=96",
        "StartDateRange=2026-11-27T06%3A00%3A00",
        "EndDateRange=2026-12-12T00%3A00%3A00",
    ):
        assert part in ask, part
    (held_ask,) = [f for f in forms if "Action=DescribeCapacityReservations" in f]
    assert "p5.48xlarge" in held_ask and "scheduled" in held_ask


def test_a_budget_marks_the_plans_over_it_and_puts_them_after():
    doc, _ = _aws_doc(budget=Decimal(7000))
    marks = {(p["way"], p["offering_id"]): p["marks"] for p in doc["plans"]}
    assert marks[("on-demand", None)] == ["over budget"] and marks[("spot", None)] == ["over budget"]
    assert marks[("capacity-block", "cb-0ddddddddddddddd4")] == []
    assert [p["way"] for p in doc["plans"][:2]] == ["held-reservation", "capacity-block"]


def test_a_block_ending_before_the_run_does_not_meet_the_deadline():
    # the held block ends 2026-11-30 11:30 and EC2 ends its instances from 11:00: a 72 h run from
    # 2026-11-27 06:00 fits, an 80 h one does not
    req = DeadlineRequest("8xH100", 2, Decimal(80), BY, NOW, cloud="aws", region="us-east-1")
    routes = [
        ("POST", "/", "Action=DescribeCapacityReservations", HELD),
        ("POST", "/", "Action=DescribeCapacityBlockOfferings", OFFERINGS),
    ]
    with ReplayServer(routes) as server:
        doc = deadline_document(load_catalog(), req, aws_client_factory=_factory(server.url))
    (held,) = [p for p in doc["plans"] if p["way"] == "held-reservation"]
    assert held["marks"] == ["misses deadline"]


def test_spot_miss_probability_follows_the_poisson_model():
    assert poisson_tail(2.0, 1) == pytest.approx(1 - 3 * math.exp(-2))
    assert poisson_tail(0.5, -1) == 1.0
    # slack 0.5 h is less than one interruption (0.75 h): any interruption misses the deadline
    by = NOW + timedelta(hours=72.5)
    doc, _ = _aws_doc(by=by)
    (spot,) = [p for p in doc["plans"] if p["way"] == "spot"]
    mean = 0.10 / 730 * 2 * 72
    assert spot["miss_probability"] == pytest.approx(1 - math.exp(-mean), abs=1e-4)
    assert "Poisson" in spot["risk"] and "restart assumed" in spot["risk"]
    # a deadline shorter than the run itself: every plan misses it
    doc, _ = _aws_doc(by=NOW + timedelta(hours=70))
    assert doc["meets_deadline"] == 0 and all("misses deadline" in p["marks"] for p in doc["plans"])


def test_ec2_errors_become_notes_not_failures():
    error = (FIXTURES / "ec2_error_capacity_reservation_not_found.xml").read_text()
    doc, _ = _aws_doc(offerings=(400, error), held=(400, error))
    assert [p["way"] for p in doc["plans"]] == ["spot", "on-demand"]
    assert any("DescribeCapacityBlockOfferings in us-east-1" in n for n in doc["notes"])


def test_capacity_block_durations_are_the_documented_steps():
    # 1-day steps up to 14 days, then 7-day steps up to 182 days (capacity-blocks-purchase.html)
    assert CAPACITY_BLOCK_DURATIONS_HOURS[:3] == (24, 48, 72) and CAPACITY_BLOCK_DURATIONS_HOURS[13] == 14 * 24
    assert CAPACITY_BLOCK_DURATIONS_HOURS[14] == 21 * 24 and CAPACITY_BLOCK_DURATIONS_HOURS[-1] == 182 * 24
    assert capacity_block_duration_hours(Decimal("23.5")) == 24
    assert capacity_block_duration_hours(Decimal("23.6")) == 48
    assert capacity_block_duration_hours(Decimal(15 * 24)) == 21 * 24
    with pytest.raises(RequestError, match="182 days"):
        capacity_block_duration_hours(Decimal(182 * 24))


def test_gcp_reservations_are_read_with_the_real_google_session():
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession

    zone_url = "https://www.googleapis.com/compute/v1/projects/proj-1/zones/us-central1-a"
    answer = {  # reservations.aggregatedList, cloud.google.com/compute/docs/reference/rest/v1/reservations/aggregatedList
        "kind": "compute#reservationAggregatedList",
        "items": {
            "zones/us-central1-a": {
                "reservations": [
                    {
                        "name": "a3-res",
                        "zone": zone_url,
                        "status": "READY",
                        "specificReservation": {
                            "count": "4",
                            "inUseCount": "1",
                            "instanceProperties": {"machineType": "a3-highgpu-8g"},
                        },
                    },
                    {
                        "name": "a3-full",
                        "zone": zone_url,
                        "status": "READY",
                        "specificReservation": {
                            "count": "2",
                            "inUseCount": "1",
                            "instanceProperties": {"machineType": "a3-highgpu-8g"},
                        },
                    },
                ]
            },
            "zones/europe-west4-b": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "none"}},
        },
    }
    req = DeadlineRequest("8xH100", 2, Decimal(72), BY, NOW, cloud="gcp")
    with ReplayServer([("GET", "/compute/v1/projects/proj-1/aggregated/reservations", None, answer)]) as server:
        doc = deadline_document(
            load_catalog(),
            req,
            gcp_session=AuthorizedSession(AnonymousCredentials()),
            gcp_project="proj-1",
            compute_api=server.url,
        )
    (held,) = [p for p in doc["plans"] if p["way"] == "held-reservation"]
    # a3-highgpu-8g on demand in us-central1-a: $88.49 per node-hour (catalog) x 2 x 72 h
    assert (held["reservation_id"], held["zone"], held["compute_cost_usd"]) == (
        "a3-res",
        "us-central1-a",
        "12742.560000",
    )
    assert "not seen" not in json.dumps(doc["not_seen"]) and doc["not_seen"] == []
    assert len(server.requests) == 1


def test_offline_plan_prints_catalog_plans_and_names_what_needs_credentials(run_cli):
    by = (datetime.now(UTC) + timedelta(days=20)).strftime("%Y-%m-%d")
    result = run_cli("plan", "--gpus", "8xH100", "--nodes", "2", "--hours", "72", "--by", by)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for way in ("on-demand", "spot", "flex-start", "calendar-reservation"):
        assert way in out, way
    assert "not seen: AWS Capacity Blocks (DescribeCapacityBlockOfferings): no AWS credentials" in out
    assert "not seen: AWS reservations you hold (DescribeCapacityReservations)" in out
    assert "not seen: GCP reservations you hold" in out
    # the shipped catalog has no DWS price: flex-start is shown unpriced, never $0
    (flex,) = [line for line in out.splitlines() if " flex-start " in line]
    assert "incomplete" in flex and "[unpriced]" in flex
    doc = json.loads(run_cli("plan", "--gpus", "8xH100", "--nodes", "2", "--hours", "72", "--by", by, "--json").stdout)
    first = doc["plans"][0]
    assert first["marks"] == [] and first["compute_cost_usd"] is not None
    priced = [Decimal(p["compute_cost_usd"]) for p in doc["plans"] if not p["marks"]]
    assert priced == sorted(priced)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpus", "8xH100", "--hours", "72", "--by", "2020-01-01"), "not in the future"),
        (("--gpus", "8xH100", "--hours", "72", "--by", "soon"), "is not a date"),
        (("--gpus", "8xH100", "--by", "2099-01-01"), "--gpus needs --hours"),
        (("--model", "llama-3.1-8b", "--gpus", "8xH100", "--hours", "1", "--by", "2099-01-01"), "either --model"),
        (("--gpus", "8xH100", "--hours", "72", "--budget", "-5", "--by", "2099-01-01"), "--budget"),
        (("--gpus", "8xH100", "--hours", "72", "--by", "2099-01-01", "--cloud", "azure"), "unknown cloud 'azure'"),
        (("--gpus", "8xZ100", "--hours", "72", "--by", "2099-01-01"), "unknown GPU 'Z100'"),
        (("--gpus", "8xH100", "--hours", "72", "--by", "2099-01-01", "--restart-minutes", "-1"), "--restart-minutes"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run_cli, args, message):
    result = run_cli("plan", *args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_named_model_gives_the_hours_through_sizing(run_cli):
    by = (datetime.now(UTC) + timedelta(days=60)).strftime("%Y-%m-%d")
    result = run_cli("plan", "--model", "llama-3.1-8b", "--method", "full", "--tokens", "2B", "--by", by, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    cand = doc["sized"]["candidate"]
    assert (doc["gpus"], doc["nodes"]) == (cand["gpus"], cand["nodes"])
    assert Decimal(doc["run_hours"]) >= Decimal(str(cand["training_hours"]))


def test_deadline_parsing():
    assert parse_deadline("2026-12-20", NOW) == datetime(2026, 12, 20, tzinfo=UTC)
    assert parse_deadline("2026-12-20T18:00Z", NOW) == datetime(2026, 12, 20, 18, tzinfo=UTC)
    assert parse_deadline("2026-12-20T19:00+01:00", NOW) == datetime(2026, 12, 20, 18, tzinfo=UTC)


# --- buying: plan --buy N writes a purchase stack, only with the confirmed amount ---------------


def _buy_doc():
    doc, _ = _aws_doc()
    number = next(i for i, p in enumerate(doc["plans"], 1) if p["offering_id"] == "cb-0ddddddddddddddd4")
    return doc, number


def test_buying_is_refused_without_the_exact_confirmation(tmp_path):
    from gpuinfra.services.purchase import buy

    doc, number = _buy_doc()
    for confirm in (None, "6000", "yes", "6144.01"):
        with pytest.raises(RequestError, match=r"--confirm-non-refundable 6144\.00 to buy it \(--yes is not enough\)"):
            buy(doc, number, confirm, "train", tmp_path)
    assert not (tmp_path / "stacks").exists()
    # a plan that is no Capacity Block, an unpriced one, and a number out of range
    with pytest.raises(
        RequestError, match="buys AWS Capacity Blocks and GCP calendar-mode reservations; plan 1 is held-reservation"
    ):
        buy(doc, 1, "0", "train", tmp_path)
    unpriced = next(i for i, p in enumerate(doc["plans"], 1) if p["offering_id"] == "cb-0eeeeeeeeeeeeeee5")
    with pytest.raises(RequestError, match="no USD price"):
        buy(doc, unpriced, "5900", "train", tmp_path)
    with pytest.raises(RequestError, match="there are 6 plans"):
        buy(doc, 7, "1", "train", tmp_path)


def test_the_purchase_stack_records_the_offering_and_previews_with_zero_violations(tmp_path):
    import yaml

    from gpuinfra.plan.purchase import PurchaseSpec
    from gpuinfra.services.purchase import buy, preview_purchase

    doc, number = _buy_doc()
    path, spec = buy(doc, number, "$6,144.00", "train", tmp_path)
    assert path == tmp_path / "stacks" / "Pulumi.train-block.yaml"
    config = yaml.safe_load(path.read_text())["config"]
    assert config["aws:region"] == "us-east-1"
    recorded = PurchaseSpec.from_config(config["gpuinfra:purchase"])
    assert (recorded.offering_id, recorded.upfront_usd, recorded.confirmed_non_refundable_usd) == (
        "cb-0ddddddddddddddd4",
        "6144.000000",
        "6144.000000",
    )
    assert (recorded.start, recorded.end) == (
        datetime(2026, 11, 28, 11, 30, tzinfo=UTC),
        datetime(2026, 12, 2, 11, 30, tzinfo=UTC),
    )
    assert (
        recorded.cluster_stack == "train"
        and "DescribeCapacityBlockOfferings cb-0ddddddddddddddd4" in recorded.price_source
    )
    result, violations = preview_purchase(spec)
    assert violations == []
    (block,) = [r for r in result.resources if r.type == "aws:ec2/capacityBlockReservation:CapacityBlockReservation"]
    # pulumi-aws CapacityBlockReservation: the offering and the platform gpuinfra's nodes run
    assert block.inputs["capacityBlockOfferingId"] == "cb-0ddddddddddddddd4"
    assert block.inputs["instancePlatform"] == "Linux/UNIX"
    assert block.inputs["tags"]["gpuinfra:cluster-stack"] == "train"
    # no nodes and no TTL: `ls` and `reap` leave the purchase out (not listed as an invalid cluster)
    from gpuinfra.lifecycle import list_stacks

    listing = list_stacks(tmp_path, None)
    assert listing.rows == [] and listing.invalid == []


def test_new_prices_the_bought_block_at_the_recorded_fee(tmp_path):
    from gpuinfra.capacity import CapacityReservation
    from gpuinfra.services.purchase import buy
    from gpuinfra.stackfile import purchased_block_price

    doc, number = _buy_doc()
    buy(doc, number, "6144", "train", tmp_path)
    bought = CapacityReservation(
        reservation_id="cr-0aaaaaaaaaaaaaaa1",
        instance_type="p5.48xlarge",
        zone_id="use1-az2",
        region="us-east-1",
        total_instance_count=2,
        available_instance_count=2,
        placement_group=None,
        capacity_block=True,
        state="scheduled",
        start_date=datetime(2026, 11, 28, 11, 30, tzinfo=UTC),
        end_date=datetime(2026, 12, 2, 11, 30, tzinfo=UTC),
        availability_zone="us-east-1b",
    )
    price = purchased_block_price(tmp_path, bought)
    assert price is not None and price.upfront_usd == Decimal("6144") and "train-block" in price.source
    from dataclasses import replace

    assert purchased_block_price(tmp_path, replace(bought, availability_zone="us-east-1c")) is None


def test_plan_buy_on_the_command_line_needs_the_confirmation(run_cli, tmp_path, monkeypatch):
    from gpuinfra.services import deadline

    monkeypatch.setattr(deadline, "default_aws_client_factory", lambda: _factory(server.url))
    routes = [
        ("POST", "/", "Action=DescribeCapacityBlockOfferings", OFFERINGS),
        ("POST", "/", "Action=DescribeCapacityReservations", HELD),
    ]
    args = (
        "plan",
        "--gpus",
        "8xH100",
        "--nodes",
        "2",
        "--hours",
        "72",
        "--by",
        "2026-12-12",
        "--cloud",
        "aws",
        "--region",
        "us-east-1",
        "--project-dir",
        str(tmp_path),
    )
    monkeypatch.setattr(deadline, "utc_now", lambda: NOW)  # the recorded offerings' day
    with ReplayServer(routes) as server:
        listing = run_cli(*args, "--json")
        plans = json.loads(listing.stdout)["plans"]
        number = next(i for i, p in enumerate(plans, 1) if p["offering_id"] == "cb-0ddddddddddddddd4")
        refused = run_cli(*args, "--buy", str(number))
        bought = run_cli(*args, "--buy", str(number), "--confirm-non-refundable", "6144.00", "--name", "train")
    assert refused.exit_code == 2 and "--confirm-non-refundable 6144.00" in refused.stderr
    assert bought.exit_code == 0, bought.stderr
    assert "0 rule violations" in bought.stdout and "pulumi up --stack train-block" in bought.stdout
    assert (tmp_path / "stacks" / "Pulumi.train-block.yaml").is_file()


def test_a_bought_block_gives_new_its_fee_and_up_waits_for_its_start(run_cli, tmp_path, monkeypatch):
    """The cluster stack of a block bought with `plan --buy`: `new --capacity-reservation` records
    the purchase stack's fee (so `cost` totals the block) and the block's start, and `up` refuses
    to launch before that start (a scheduled block takes no instances)."""
    from dataclasses import replace as dc_replace

    import yaml

    from gpuinfra import capacity
    from gpuinfra.plan.purchase import PurchaseSpec
    from gpuinfra.services.purchase import write_purchase_stack
    from tests.test_capacity import _cr

    start = (datetime.now(UTC) + timedelta(days=2)).replace(hour=11, minute=30, second=0, microsecond=0)
    end = start + timedelta(days=4)
    block = dc_replace(
        _cr(), state="scheduled", start_date=start, end_date=end, total_instance_count=2, available_instance_count=2
    )
    monkeypatch.setattr(capacity, "describe_capacity_reservation", lambda rid, region, factory=None: block)
    bought = PurchaseSpec(
        stack="train-block",
        cluster_stack="train",
        region="us-east-1",
        availability_zone=block.availability_zone,
        offering_id="cb-0ddddddddddddddd4",
        instance_type="p5.48xlarge",
        instance_count=2,
        start=start,
        end=end,
        upfront_usd="6144.000000",
        price_source="EC2 DescribeCapacityBlockOfferings cb-0ddddddddddddddd4",
        price_date="2026-11-27",
        confirmed_non_refundable_usd="6144.000000",
    )
    write_purchase_stack(bought, tmp_path)
    result = run_cli(
        "new",
        "--capacity-reservation",
        "cr-0123456789abcdef0",
        "--region",
        "us-east-1",
        "--nodes",
        "2",
        "--profile",
        "llm-pretrain",
        "--name",
        "train",
        "--project-dir",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.stderr
    cluster = yaml.safe_load((tmp_path / "stacks" / "Pulumi.train.yaml").read_text())["config"]["gpuinfra:cluster"]
    assert Decimal(cluster["capacity_block_upfront_usd"]) == Decimal(6144)
    assert cluster["capacity_block_price_source"].startswith("bought with purchase stack train-block")
    assert datetime.fromisoformat(cluster["capacity_block_start"].replace("Z", "+00:00")) == start
    cost = json.loads(run_cli("cost", "train", "--json", "--project-dir", str(tmp_path)).stdout)
    (line,) = [x for x in cost["lines"] if x["component"].startswith("Capacity Block, paid up front")]
    assert Decimal(line["run_usd"]) == Decimal(6144)
    refused = run_cli("up", "train", "--project-dir", str(tmp_path))
    assert refused.exit_code == 2 and f"starts at {start:%Y-%m-%d %H:%M} UTC" in refused.stderr


def _dws_catalog(price=Decimal("40.00")):
    """The shipped catalog with a DWS (flex-start) price for a3-highgpu-8g in us-central1-a, as
    `catalog refresh --cloud gcp` would add it (the shipped snapshot has none)."""
    from dataclasses import replace as dc_replace

    catalog = load_catalog()
    offers = tuple(
        dc_replace(o, flex_start_price_per_hour_usd=price)
        if (o.cloud, o.instance_type, o.zone) == ("gcp", "a3-highgpu-8g", "us-central1-a")
        else o
        for o in catalog.offers
    )
    return dc_replace(catalog, offers=offers)


def _gcp_doc():
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession

    req = DeadlineRequest("8xH100", 2, Decimal("71.5"), BY, NOW, cloud="gcp", region="us-central1")
    empty = {"kind": "compute#reservationAggregatedList", "items": {}}
    with ReplayServer([("GET", "/compute/v1/projects/proj-1/aggregated/reservations", None, empty)]) as server:
        return deadline_document(
            _dws_catalog(),
            req,
            gcp_session=AuthorizedSession(AnonymousCredentials()),
            gcp_project="proj-1",
            compute_api=server.url,
        )


def test_flex_start_and_calendar_mode_are_priced_at_the_dws_rate():
    doc = _gcp_doc()
    by_way = {p["way"]: p for p in doc["plans"]}
    flex, calendar = by_way["flex-start"], by_way["calendar-reservation"]
    # $40/node-h x 2 nodes x 71.5 h; calendar mode bills the whole window, 72 whole hours
    assert flex["compute_cost_usd"] == "5720.000000" and flex["marks"] == []
    assert flex["finish"] == "2026-11-30T07:30:00Z"  # now + the 2 h queue bound + 71.5 h
    assert calendar["compute_cost_usd"] == "5760.000000" and calendar["marks"] == []
    assert (calendar["window_start"], calendar["window_end"]) == ("2026-12-09T00:00:00Z", "2026-12-12T00:00:00Z")
    # a run longer than flex-start's seven days misses (about-flex-start-vms)
    long = DeadlineRequest("8xH100", 2, Decimal(169), BY, NOW, cloud="gcp", region="us-central1")
    from gpuinfra.services.deadline import flex_start_plans

    (too_long,) = flex_start_plans(_dws_catalog(), long)
    assert not too_long.meets_deadline and "168 h maximum" in too_long.risk


def test_a_calendar_mode_request_is_bought_with_its_amount_and_previews_clean(tmp_path):
    from gpuinfra.services.purchase import buy, preview_purchase

    doc = _gcp_doc()
    number = next(i for i, p in enumerate(doc["plans"], 1) if p["way"] == "calendar-reservation")
    with pytest.raises(RequestError, match=r"--confirm-non-refundable 5760\.00"):
        buy(doc, number, None, "train", tmp_path)
    path, spec = buy(doc, number, "5760", "train", tmp_path, gcp_project="proj-1")
    assert (spec.cloud, spec.kind, spec.availability_zone, spec.offering_id) == (
        "gcp",
        "calendar-reservation",
        "us-central1-a",
        None,
    )
    text = path.read_text()
    assert "gcp:zone: us-central1-a" in text and "gcp:project: proj-1" in text
    result, violations = preview_purchase(spec)
    assert violations == []
    (request,) = [r for r in result.resources if r.type == "gcp:compute/futureReservation:FutureReservation"]
    assert request.inputs["reservationMode"] == "CALENDAR" and request.inputs["planningStatus"] == "SUBMITTED"
    assert request.inputs["timeWindow"] == {"startTime": "2026-12-09T00:00:00Z", "endTime": "2026-12-12T00:00:00Z"}
    sku = request.inputs["specificSkuProperties"]
    assert sku["totalCount"] == "2" and sku["instanceProperties"]["machineType"] == "a3-highgpu-8g"


def test_a_run_longer_than_any_capacity_block_is_a_note_not_a_refusal():
    # EC2 sells Capacity Blocks of at most 182 days (docs.aws.amazon.com/AWSEC2/latest/UserGuide/
    # ec2-capacity-blocks.html); a 5000 h run (208 days) still has on-demand and spot plans
    routes = [("POST", "/", "Action=DescribeCapacityReservations", HELD)]
    by = NOW + timedelta(days=400)
    req = DeadlineRequest("8xH100", 2, Decimal(5000), by, NOW, None, cloud="aws", region="us-east-1")
    with ReplayServer(routes) as server:
        doc = deadline_document(load_catalog(), req, aws_client_factory=_factory(server.url))
    assert {"spot", "on-demand"} <= {p["way"] for p in doc["plans"]}
    assert "capacity-block" not in {p["way"] for p in doc["plans"]}
    assert any("182 days" in n for n in doc["notes"]), doc["notes"]


@pytest.mark.parametrize(
    ("cloud", "kind", "region", "zone", "offering"),
    [
        # GCP regions and zones beyond the two-letter prefixes (cloud.google.com/compute/docs/regions-zones)
        ("gcp", "calendar-reservation", "europe-west4", "europe-west4-b", None),
        ("gcp", "calendar-reservation", "asia-southeast1", "asia-southeast1-c", None),
        ("gcp", "calendar-reservation", "northamerica-northeast2", "northamerica-northeast2-a", None),
        # AWS GovCloud (docs.aws.amazon.com/global-infrastructure/latest/regions/aws-regions.html)
        ("aws", "capacity-block", "us-gov-west-1", "us-gov-west-1a", "cb-0123456789abcdef0"),
    ],
)
def test_a_purchase_is_valid_in_every_region_name_form(cloud, kind, region, zone, offering):
    from gpuinfra.plan.purchase import PurchaseSpec

    spec = PurchaseSpec.model_validate(
        dict(
            stack="train-block",
            cluster_stack="train",
            cloud=cloud,
            kind=kind,
            region=region,
            availability_zone=zone,
            offering_id=offering,
            instance_type="a3-highgpu-8g" if cloud == "gcp" else "p5.48xlarge",
            instance_count=2,
            start="2026-12-09T00:00:00Z",
            end="2026-12-12T00:00:00Z",
            upfront_usd="5760.000000",
            price_source="catalog",
            price_date="2026-11-27",
            confirmed_non_refundable_usd="5760.000000",
        )
    )
    assert (spec.region, spec.availability_zone) == (region, zone)


def test_a_named_model_is_sized_on_a_configuration_that_finishes_by_the_deadline(run_cli):
    # llama-2-7b LoRA on 10B tokens: the cheapest configuration to finish (one L40S) needs about
    # 590 h; with 14 days to the deadline the plan must size a configuration that finishes in time
    by = (datetime.now(UTC) + timedelta(days=14)).strftime("%Y-%m-%d")
    args = ("plan", "--model", "llama-2-7b", "--method", "lora", "--tokens", "10B", "--by", by, "--json")
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    left_hours = (datetime.fromisoformat(doc["by"]) - datetime.fromisoformat(doc["now"])).total_seconds() / 3600
    assert Decimal(doc["run_hours"]) <= Decimal(str(left_hours)), (doc["gpus"], doc["run_hours"])
    assert doc["meets_deadline"] >= 1
    assert doc["sized"]["chosen"] == "the cheapest configuration that finishes by the deadline"


def test_a_name_without_room_for_the_purchase_suffix_is_one_clear_line(tmp_path):
    from gpuinfra.errors import SpecError
    from gpuinfra.services.purchase import buy

    doc = _gcp_doc()
    number = next(i for i, p in enumerate(doc["plans"], 1) if p["way"] == "calendar-reservation")
    # 27 characters is a valid cluster stack name; the purchase stack <name>-block is 33
    with pytest.raises(SpecError) as caught:
        buy(doc, number, "5760", "a" * 27, tmp_path, gcp_project="proj-1")
    assert "\n" not in str(caught.value) and "--name of at most 21 characters" in str(caught.value)
    assert not (tmp_path / "stacks").exists()


def test_a_calendar_mode_window_is_at_least_one_day():
    # "You can reserve resources for a period between 1 and 90 days"
    # (cloud.google.com/compute/docs/instances/create-future-reservations-calendar-mode, Limitations):
    # a 10 h run reserves, and pays for, a 24 h window at the catalog's $40/node-h DWS rate
    from gpuinfra.services.deadline import calendar_plans

    short = DeadlineRequest("8xH100", 2, Decimal(10), BY, NOW, cloud="gcp", region="us-central1")
    (plan,) = [p for p in calendar_plans(_dws_catalog(), short) if p.zone == "us-central1-a"]
    assert plan.total.amount_usd == Decimal(40) * 2 * 24
    assert plan.window_end - plan.window_start == timedelta(hours=24)


def test_a_calendar_mode_request_holds_at_most_80_vms():
    # "You can reserve between 1 and 80 GPU VMs per request"
    # (cloud.google.com/compute/docs/instances/create-future-reservations-calendar-mode, Limitations)
    from gpuinfra.services.deadline import calendar_plans

    for nodes, fits in ((80, True), (81, False)):
        req = DeadlineRequest("8xH100", nodes, Decimal(72), BY, NOW, cloud="gcp", region="us-central1")
        (plan,) = [p for p in calendar_plans(_dws_catalog(), req) if p.zone == "us-central1-a"]
        assert plan.meets_deadline is fits, nodes
        assert ("80 VMs" in plan.risk) is not fits


def test_a_purchase_counts_its_instances_by_the_limit_of_its_kind():
    from gpuinfra.plan.purchase import PurchaseSpec

    base = dict(
        stack="train-block",
        cluster_stack="train",
        instance_count=80,
        start="2026-12-09T00:00:00Z",
        end="2026-12-12T00:00:00Z",
        upfront_usd="1.000000",
        price_source="catalog",
        price_date="2026-11-27",
        confirmed_non_refundable_usd="1.000000",
    )
    gcp = dict(cloud="gcp", kind="calendar-reservation", region="us-central1", availability_zone="us-central1-a")
    assert PurchaseSpec.model_validate({**base, **gcp, "instance_type": "a3-highgpu-8g"}).instance_count == 80
    aws = dict(cloud="aws", kind="capacity-block", region="us-east-1", availability_zone="us-east-1a")
    with pytest.raises(ValueError, match="at most 64 instances"):
        PurchaseSpec.model_validate(
            {**base, **aws, "instance_type": "p5.48xlarge", "offering_id": "cb-0123456789abcdef0"}
        )
