"""The figures of `gpuinfra status` from small hand-made inputs: hour means, the idle run, cost so
far from the catalog's per-node price and launch times, and the sparkline."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gpuinfra.catalog.store import load_catalog
from gpuinfra.monitoring.render import sparkline, summary_lines
from gpuinfra.monitoring.status import GpuSeries, Node, build_status, idle_since
from gpuinfra.services.monitoring_sources import aws_node, gcp_node
from tests.blueprints.helpers import make_spec

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def minutes(values, end=NOW):
    start = end - timedelta(minutes=len(values) - 1)
    return tuple((start + timedelta(minutes=i), v) for i, v in enumerate(values))


def test_hour_mean_ignores_older_samples_and_now_needs_a_fresh_one():
    spec = make_spec("p4d.24xlarge", spot=False)
    old = minutes([100.0] * 30, end=NOW - timedelta(minutes=60))  # at or before now - 1 h: not counted
    series = [
        GpuSeries("i-1", "0", old + minutes([20.0] * 30 + [40.0] * 30)),
        GpuSeries("i-1", "1", minutes([50.0] * 10, end=NOW - timedelta(minutes=10))),
    ]
    status = build_status(spec, [Node("i-1", "running", NOW - timedelta(hours=3))], series, NOW, True)
    first, second = status.gpus
    assert (first.utilization_hour_mean, first.utilization_now) == (30.0, 40.0)
    assert (second.utilization_hour_mean, second.utilization_now) == (50.0, None)  # newest sample 10 min old


def test_cost_so_far_bills_each_run_from_start_to_stop_and_nothing_while_starting():
    """EC2 lifecycle: pending is not billed, a stopped or terminated instance billed from launch to its
    stop; GCP: PROVISIONING / STAGING not billed."""
    spec = make_spec("p4d.24xlarge", nodes=4)
    price = Decimal(spec.price.on_demand_price_per_hour_usd)
    nodes = [
        Node("i-1", "running", NOW - timedelta(hours=2)),
        Node("i-2", "pending", NOW - timedelta(minutes=30)),  # starting: no hours billed yet
        Node("i-3", "stopped", NOW - timedelta(hours=9), ended_at=NOW - timedelta(hours=8)),
        Node("i-4", "terminated", NOW - timedelta(hours=5), ended_at=NOW - timedelta(hours=4, minutes=30)),
    ]
    status = build_status(spec, nodes, [], NOW, True)
    assert status.cost_so_far_usd == price * Decimal("3.5")  # 2 h + 0 + 1 h + 0.5 h
    left = Decimal(int((spec.expires_at - NOW).total_seconds())) / 3600
    assert status.projected_to_ttl_usd == price * Decimal("3.5") + price * 2 * left  # running + starting
    assert status.cost_so_far_at_least_usd is None and status.notes == []
    gcp = build_status(
        make_spec("a3-megagpu-8g", cloud="gcp", nodes=2),
        [Node("a", "PROVISIONING", NOW - timedelta(minutes=5)), Node("b", "STAGING", NOW - timedelta(minutes=3))],
        [],
        NOW,
        True,
    )
    assert gcp.cost_so_far_usd == 0


def test_spending_that_cannot_be_counted_makes_the_total_unknown_with_a_lower_bound():
    spec = make_spec("p4d.24xlarge", nodes=2)
    price = Decimal(spec.price.on_demand_price_per_hour_usd)
    running = Node("i-1", "running", NOW - timedelta(hours=2))
    cases = {
        "no end time": [running, Node("i-2", "terminated", NOW - timedelta(hours=3))],
        "restarted": [running, Node("i-2", "running", NOW - timedelta(hours=1), earlier_runs=True)],
        "one node gone": [running],
    }
    for why, nodes in cases.items():
        status = build_status(spec, nodes, [], NOW, True)
        assert status.cost_so_far_usd is None and status.projected_to_ttl_usd is None, why
        counted = Decimal(2) if why != "restarted" else Decimal(3)
        assert status.cost_so_far_at_least_usd == price * counted, why
        assert status.notes, why
        assert status.to_dict()["cost_so_far_usd"] is None
        assert "unknown, at least $" in summary_lines(status)[1], why


def test_aws_end_time_and_restart_from_describe_instances():
    launched = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
    eni = [{"Attachment": {"DeviceIndex": 0, "AttachTime": launched}}]
    node = aws_node(
        {
            "InstanceId": "i-1",
            "State": {"Name": "stopped"},
            "LaunchTime": launched,
            "StateTransitionReason": "User initiated (2026-11-22 10:45:12 GMT)",
            "NetworkInterfaces": eni,
        }
    )
    assert (node.ended_at, node.earlier_runs) == (datetime(2026, 11, 22, 10, 45, 12, tzinfo=UTC), False)
    again = aws_node(
        {
            "InstanceId": "i-1",
            "State": {"Name": "running"},
            "LaunchTime": launched + timedelta(hours=3),
            "StateTransitionReason": "",
            "NetworkInterfaces": eni,
        }
    )
    assert (again.ended_at, again.earlier_runs) == (None, True)  # the primary ENI keeps the first launch
    gone = aws_node(
        {
            "InstanceId": "i-2",
            "State": {"Name": "terminated"},
            "LaunchTime": launched,
            "StateTransitionReason": "Service initiated",
        }
    )
    assert (gone.ended_at, gone.earlier_runs) == (None, None)


def test_gcp_last_stop_and_restart_from_instances_list():
    from google.cloud import compute_v1

    created = datetime(2026, 11, 22, 8, 0, tzinfo=UTC)

    def vm(status, start, stop=None):
        return gcp_node(
            compute_v1.Instance(
                name="vm",
                status=status,
                creation_timestamp=created.isoformat(),
                last_start_timestamp=start.isoformat(),
                last_stop_timestamp=stop.isoformat() if stop else "",
            )
        )

    stopped = vm("TERMINATED", created + timedelta(minutes=2), created + timedelta(hours=3))
    assert (stopped.launched_at, stopped.ended_at, stopped.earlier_runs) == (
        created + timedelta(minutes=2),
        created + timedelta(hours=3),
        False,
    )
    restarted = vm("RUNNING", created + timedelta(hours=5), created + timedelta(hours=3))
    assert (restarted.ended_at, restarted.earlier_runs) == (None, True)  # lastStartTimestamp drops the first run


def test_node_hours_are_priced_from_the_catalog_not_the_stack_file():
    """A hand-edited price in the stack file changes nothing: the p4d.24xlarge node-hour is the
    catalog's on-demand price, $21.95764 in us-east-1 (https://aws.amazon.com/ec2/pricing/on-demand/)."""
    spec = make_spec("p4d.24xlarge")
    edited = spec.model_copy(update={"price": spec.price.model_copy(update={"on_demand_price_per_hour_usd": "0.01"})})
    status = build_status(edited, [Node("i-1", "running", NOW - timedelta(hours=1))], [], NOW, True)
    assert status.price_per_node_hour_usd == Decimal("21.95764") and status.cost_so_far_usd == Decimal("21.95764")


def test_no_catalog_price_is_incomplete_never_zero():
    spec = make_spec("p4d.24xlarge")
    catalog = load_catalog()
    without = replace(catalog, offers=tuple(o for o in catalog.offers if o.instance_type != spec.instance_type))
    status = build_status(spec, [Node("i-1", "running", NOW - timedelta(hours=1))], [], NOW, True, catalog=without)
    assert (status.cost_so_far_usd, status.projected_to_ttl_usd) == (None, None)
    assert status.to_dict()["cost_so_far_usd"] is None and status.to_dict()["price_per_node_hour_usd"] is None
    cost_line = next(line for line in summary_lines(status) if line.startswith("compute cost so far"))
    assert "incomplete: 1 line without a price" in cost_line and "$" not in cost_line


def test_idle_run_is_the_trailing_minutes_under_the_threshold():
    t = [NOW - timedelta(minutes=4 - i) for i in range(5)]
    assert idle_since([(t[0], 9, 9), (t[1], 2, 6), (t[2], 1, 4), (t[3], 0, 0), (t[4], 1, 3)], 5) == t[2]
    assert idle_since([(t[0], 1, 1), (t[1], 9, 9)], 5) is None
    assert idle_since([], 5) is None


def test_sparkline_levels():
    assert sparkline([0.0, 12.5, 50.0, 99.9, 100.0, None]) == "▁▂▅██ "
