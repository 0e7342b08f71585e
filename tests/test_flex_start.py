"""GCP flex-start end to end under mocks: the plan and preview of a 2-node A3 Ultra flex-start
stack (FLEX_START template, MIG at target size 0, one resize request for both nodes with the
run duration from the TTL), the 7-day bound, the cost priced from the flex-start market, and
``up``'s bounded wait for the resize request against a local Compute REST stand-in on 127.0.0.1
through the real google-cloud-compute client."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from gpuinfra.errors import CapacityError, ExitCode, SpecError
from gpuinfra.plan.gcp import plan_gcp_cluster
from gpuinfra.services import flex_start
from tests.blueprints.helpers import make_spec, preview
from tests.replay_server import ReplayServer
from tests.test_preflight import gcp  # noqa: F401 - the Compute REST stand-in fixture of the preflight

TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
MIG = "gcp:compute/instanceGroupManager:InstanceGroupManager"
RESIZE = "gcp:compute/resizeRequest:ResizeRequest"
#: Seven days in seconds: the longest run of a flex-start VM (about-flex-start-vms) and the
#: largest requestedRunDuration (about-resize-requests-mig: "between 10 minutes and 7 days").
SEVEN_DAYS_SECONDS = 604_800


def _flex(nodes: int = 2, **overrides):
    return make_spec(
        "a3-ultragpu-8g", nodes=nodes, cloud="gcp", gcp_project="demo-project", flex_start=True, **overrides
    )


def _written_flex_stack(run_cli, project_dir):
    """`new` writes a 2-node a3-ultragpu-8g flex-start stack "flex"; its spec as read back."""
    from gpuinfra.stackfile import read_stack_spec

    written = run_cli(
        "new", "--instance-type", "a3-ultragpu-8g", "--nodes", "2", "--flex-start", "--name", "flex",
        "--gcp-project", "demo-project", "--project-dir", str(project_dir),
    )  # fmt: skip
    assert written.exit_code == 0, written.stderr
    return read_stack_spec(project_dir, "flex")


def _edited(spec, **changes):
    return type(spec).model_validate({**spec.model_dump(), **changes})


def _with_ttl(spec, hours: int):
    return _edited(spec, profile={**spec.profile.model_dump(), "ttl_hours": hours})


def test_a3_ultra_without_a_reservation_is_planned_flex_start_not_spot():
    spec = _flex()
    assert (spec.market, spec.spot, spec.gcp_reservation) == ("flex-start", False, None)
    plan = plan_gcp_cluster(spec)
    assert plan.provisioning_model == "FLEX_START"
    assert plan.formation == "resize_request"
    assert plan.action_on_failure == "DO_NOTHING"


def test_preview_has_a_flex_start_template_an_empty_group_and_one_resize_request_for_both_nodes():
    spec = _flex()
    result = preview(spec)
    (template,) = result.of_type(TEMPLATE)
    scheduling = template.inputs["scheduling"]
    assert scheduling["provisioningModel"] == "FLEX_START"
    assert scheduling["instanceTerminationAction"] == "DELETE"
    assert scheduling["onHostMaintenance"] == "TERMINATE" and scheduling["automaticRestart"] is False
    assert scheduling.get("preemptible") is not True
    assert "maxRunDuration" not in scheduling  # the resize request carries the run duration
    (group,) = result.of_type(MIG)
    assert group.inputs["targetSize"] == 0
    assert not group.inputs.get("targetSizePolicies")
    assert group.inputs["waitForInstances"] is False
    assert group.inputs["instanceLifecyclePolicy"]["defaultActionOnFailure"] == "DO_NOTHING"
    (request,) = result.of_type(RESIZE)
    assert request.inputs["resizeBy"] == 2
    assert request.inputs["instanceGroupManager"] == group.inputs["name"]
    assert request.inputs["zone"] == spec.zone
    seconds = int(request.inputs["requestedRunDuration"]["seconds"])
    ttl_seconds = spec.profile.ttl_hours * 3600
    # from the TTL: never before the agent's TTL end, within the API's 10 min..7 days
    assert ttl_seconds <= seconds <= SEVEN_DAYS_SECONDS and seconds >= 600


def test_a_later_up_never_shrinks_the_formed_group_back_to_zero():
    (group,) = preview(_flex()).of_type(MIG)
    assert "targetSize" in (group.ignore_changes or ())


def test_a_ttl_of_exactly_seven_days_fits_the_run_duration_limit():
    spec = _with_ttl(_flex(), 168)
    (request,) = preview(spec).of_type(RESIZE)
    assert int(request.inputs["requestedRunDuration"]["seconds"]) == SEVEN_DAYS_SECONDS


def test_a_ttl_over_seven_days_is_refused_naming_the_bound():
    spec = _with_ttl(_flex(), 169)
    with pytest.raises(SpecError) as raised:
        plan_gcp_cluster(spec)
    assert raised.value.exit_code == ExitCode.BAD_INPUT
    assert "168" in str(raised.value) and "7 days" in str(raised.value)


def test_cli_new_refuses_a_ttl_over_seven_days_with_exit_2(run_cli, tmp_path):
    # llm-pretrain's TTL is 336 h: two weeks, over flex-start's 7 days
    result = run_cli(
        "new", "--instance-type", "a3-ultragpu-8g", "--nodes", "2", "--flex-start", "--name", "flex",
        "--gcp-project", "demo-project", "--profile", "llm-pretrain", "--project-dir", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == ExitCode.BAD_INPUT, result.stdout
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "ttl_hours <= 168" in lines[0] and "Traceback" not in lines[0], lines
    assert not list(tmp_path.rglob("Pulumi.flex.yaml"))


def test_cli_new_flex_start_writes_a_stack_with_an_incomplete_total(run_cli, tmp_path):
    result = run_cli(
        "new", "--instance-type", "a3-ultragpu-8g", "--nodes", "2", "--flex-start", "--name", "flex",
        "--gcp-project", "demo-project", "--project-dir", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "flex-start" in result.stdout
    assert "no flex-start price in the catalog" in result.stdout
    assert "no total" in result.stderr  # money fails closed: never the spot price as the flex price
    text = next(tmp_path.rglob("Pulumi.flex.yaml")).read_text()
    assert "gcp_flex_start: true" in text


def test_compute_is_priced_from_the_flex_start_market_and_unpriced_is_incomplete():
    from gpuinfra.verify import verify_spec

    spec = _flex()
    cost = verify_spec(spec).cost
    assert cost["pricing"] == "flex-start"
    # the shipped catalog has no flex-start price for A3 Ultra: the compute line stays unpriced
    # (never the spot or on-demand price), for both nodes of the resize request (the group is at 0)
    compute = [line for line in cost["price_not_found"] if "Instance usage (flex-start" in line]
    assert len(compute) == 1 and "no flex-start price" in compute[0]
    assert cost["hourly_usd"] is None and cost["run_usd"] is None  # incomplete: fails closed
    # the boot disks of both nodes are priced (the group at 0 does not count its nodes)
    from gpuinfra.catalog.prices import usage_for
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.cost.estimate import estimate

    verified = verify_spec(spec)
    est = estimate(verified.preview.resources, load_catalog(), spec.region, usage_for(spec.profile.name), Decimal(24))
    (boot,) = [line for line in est.lines if "boot disk" in line.component]
    assert "x 2 nodes" in boot.component and boot.unit_price_usd is not None
    assert not any(r["resource_type"].endswith("ResizeRequest") for r in cost["not_priced"])


def test_a_flex_start_price_in_the_catalog_prices_the_compute_line():
    from dataclasses import replace

    from gpuinfra.catalog import store
    from gpuinfra.catalog.prices import usage_for
    from gpuinfra.cost.estimate import estimate

    spec = _flex()
    catalog = store.load_catalog()
    here = ("gcp", spec.instance_type, spec.zone)
    priced = replace(
        catalog,
        offers=tuple(
            replace(o, flex_start_price_per_hour_usd=Decimal("20.5"))
            if (o.cloud, o.instance_type, o.zone) == here
            else o
            for o in catalog.offers
        ),
    )
    est = estimate(preview(spec).resources, priced, spec.region, usage_for(spec.profile.name), Decimal(24))
    (compute,) = [line for line in est.lines if line.component.startswith("Instance usage")]
    # the flex-start price, for the 2 nodes of the resize request; not spot's, not on-demand's
    assert (compute.unit_price_usd, compute.hourly_quantity) == (Decimal("20.5"), Decimal(2))
    assert est.alternative_compute_hourly_usd is None  # no spot/on-demand "savings" against flex


def test_flex_start_excludes_spot():
    with pytest.raises(Exception) as raised:
        make_spec("a3-ultragpu-8g", nodes=2, cloud="gcp", flex_start=True, spot=True)
    assert "--flex-start" in str(raised.value)


# --- up's wait for the resize request: a Compute REST stand-in through google-cloud-compute ---


def _request_path(spec) -> str:
    from gpuinfra.plan.flex_start import resize_request_name
    from gpuinfra.plan.naming import gcp_group_name

    return (
        f"/compute/v1/projects/demo-project/zones/{spec.zone}/instanceGroupManagers/{gcp_group_name(spec)}"
        f"/resizeRequests/{resize_request_name(spec)}"
    )


def _resize_request(spec, state: str) -> dict:
    """An instanceGroupManagerResizeRequests.get answer (Compute API v1 shape)."""
    from gpuinfra.plan.flex_start import resize_request_name

    return {
        "kind": "compute#instanceGroupManagerResizeRequest",
        "name": resize_request_name(spec),
        "resizeBy": spec.nodes,
        "requestedRunDuration": {"seconds": "259800"},
        "state": state,
    }


def _done_operation() -> dict:
    return {"kind": "compute#operation", "name": "operation-cancel", "status": "DONE", "progress": 100}


@pytest.fixture
def compute():
    """Start the stand-in answering the request in ``state``; returns (server, client)."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    servers = []

    def start(spec, state: str):
        path = _request_path(spec)
        server = ReplayServer(
            [("POST", f"{path}/cancel", None, _done_operation()), ("GET", path, None, _resize_request(spec, state))]
        ).__enter__()
        servers.append(server)
        client = compute_v1.InstanceGroupManagerResizeRequestsClient(
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=server.url),
            transport="rest",
        )
        return server, client

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def test_succeeded_request_forms_the_cluster(compute):
    spec = _flex()
    server, client = compute(spec, "SUCCEEDED")
    assert flex_start.wait_for_resize_request(spec, 2, client, "demo-project", poll_seconds=0.1) == "SUCCEEDED"
    assert [m for m, *_ in server.requests] == ["GET"]  # nothing cancelled


def test_request_still_accepted_at_the_timeout_is_cancelled_within_the_bound(compute):
    spec = _flex()
    server, client = compute(spec, "ACCEPTED")
    started = time.monotonic()
    with pytest.raises(CapacityError) as raised:
        flex_start.wait_for_resize_request(spec, 1.5, client, "demo-project", poll_seconds=0.2)
    wall = time.monotonic() - started
    assert 1.5 <= wall < 5, wall
    assert raised.value.exit_code == ExitCode.OPERATION_FAILED  # 7: capacity
    assert str(raised.value).startswith("flex-start request not fulfilled within 1.5 s")
    posts = [path for method, path, *_ in server.requests if method == "POST"]
    assert posts == [f"{_request_path(spec)}/cancel"]  # a cancelled request creates no VM later
    assert len([m for m, *_ in server.requests if m == "GET"]) >= 3  # it polled, not one look


@pytest.mark.parametrize("state", ["FAILED", "CANCELLED"])
def test_failed_request_is_exit_7_at_once(compute, state):
    spec = _flex()
    server, client = compute(spec, state)
    started = time.monotonic()
    with pytest.raises(CapacityError) as raised:
        flex_start.wait_for_resize_request(spec, 30, client, "demo-project", poll_seconds=0.1)
    assert time.monotonic() - started < 5
    assert raised.value.exit_code == ExitCode.OPERATION_FAILED
    assert state in str(raised.value)
    assert all(method == "GET" for method, *_ in server.requests)


def test_up_destroys_a_new_flex_stack_whose_request_is_not_fulfilled_and_exits_7(run_cli, tmp_path, compute):
    from gpuinfra import lifecycle
    from tests.cli.test_lifecycle_cli import FakeBackend

    spec = _written_flex_stack(run_cli, tmp_path)
    server, client = compute(spec, "ACCEPTED")
    backend = FakeBackend()

    given = []

    def wait(spec, seconds):  # the timeout `up` passes on, shortened to 1 s for the test
        given.append(seconds)
        return flex_start.wait_for_resize_request(spec, 1, client, "demo-project", poll_seconds=0.2)

    started = time.monotonic()
    with pytest.raises(CapacityError) as raised:
        lifecycle.deploy(
            backend, tmp_path, spec, lambda _e: None, preflight=False, capacity_timeout_seconds=60, wait_flex_start=wait
        )
    assert given == [60]
    assert time.monotonic() - started < 5
    assert backend.calls[-2:] == [("up", "flex"), ("destroy", "flex")]  # nothing `up` made is left
    message = str(raised.value)
    assert message.startswith("flex-start request not fulfilled within 1 s") and "\n" not in message
    assert raised.value.exit_code == ExitCode.OPERATION_FAILED
    assert [p for m, p, *_ in server.requests if m == "POST"] == [f"{_request_path(spec)}/cancel"]


def test_up_of_a_fulfilled_flex_stack_keeps_it(run_cli, tmp_path, compute):
    from gpuinfra import lifecycle
    from tests.cli.test_lifecycle_cli import FakeBackend

    spec = _written_flex_stack(run_cli, tmp_path)
    _server, client = compute(spec, "SUCCEEDED")
    backend = FakeBackend()
    lifecycle.deploy(
        backend,
        tmp_path,
        spec,
        lambda _e: None,
        preflight=False,
        wait_flex_start=lambda s, t: flex_start.wait_for_resize_request(s, t, client, "demo-project", poll_seconds=0.1),
    )
    assert ("destroy", "flex") not in backend.calls and ("up", "flex") in backend.calls


def test_an_unreadable_request_is_cancelled_and_not_taken_as_formed(compute):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    spec = _flex()
    path = _request_path(spec)
    error = (503, '{"error": {"code": 503, "message": "backend unavailable", "status": "UNAVAILABLE"}}')
    with ReplayServer([("POST", f"{path}/cancel", None, _done_operation()), ("GET", path, None, error)]) as server:
        client = compute_v1.InstanceGroupManagerResizeRequestsClient(
            credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=server.url), transport="rest"
        )
        started = time.monotonic()
        with pytest.raises(CapacityError) as raised:
            flex_start.wait_for_resize_request(spec, 2, client, "demo-project", poll_seconds=0.1)
        wall = time.monotonic() - started
        posts = [p for m, p, *_ in server.requests if m == "POST"]
    assert wall < 10, wall  # the client's retries of the 503 stop at the capacity timeout
    assert raised.value.exit_code == ExitCode.OPERATION_FAILED and "reading it failed" in str(raised.value)
    assert posts == [f"{path}/cancel"]


def test_flex_start_fallback_rungs_stay_flex_start_on_gcp(run_cli, tmp_path):
    import yaml

    result = run_cli(
        "new", "--instance-type", "a3-ultragpu-8g", "--nodes", "2", "--flex-start", "--name", "flex",
        "--gcp-project", "demo-project", "--fallback", "2", "--project-dir", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    files = sorted(tmp_path.rglob("Pulumi.flex*.yaml"))
    assert len(files) == 3
    zones = set()
    for path in files:
        cluster = yaml.safe_load(path.read_text())["config"]["gpuinfra:cluster"]
        assert (cluster["cloud"], cluster.get("gcp_flex_start"), cluster.get("spot", False)) == ("gcp", True, False)
        zones.add(cluster["zone"])
    assert len(zones) == 3  # each rung another zone: a stockout of one pool is not retried


def test_preflight_of_a_flex_stack_reads_the_preemptible_gpu_quota(gcp):  # noqa: F811 - the imported fixture
    from gpuinfra import preflight
    from gpuinfra.errors import QuotaError
    from tests.test_preflight import _gcp_routes

    spec = _flex()  # 2 x 8 H200
    # plenty of on-demand H200 quota, too little preemptible: flex-start VMs "consume preemptible quota"
    gcp(
        _gcp_routes(
            spec,
            [
                {"metric": "NVIDIA_H200_GPUS", "limit": 64, "usage": 0},
                {"metric": "PREEMPTIBLE_NVIDIA_H200_GPUS", "limit": 8, "usage": 0},
            ],
            [{"metric": "GPUS_ALL_REGIONS", "limit": 64, "usage": 0}],
            accelerator="nvidia-h200-141gb",
        )
    )
    with pytest.raises(QuotaError) as raised:
        preflight.run_preflight(spec)
    assert "PREEMPTIBLE_NVIDIA_H200_GPUS" in str(raised.value) and "16 GPUs" in str(raised.value)


@pytest.mark.parametrize("replace_nodes", [False, True])
def test_up_refuses_a_change_that_replaces_the_resize_request_of_a_deployed_stack(run_cli, tmp_path, replace_nodes):
    """A resize request cannot be updated (instanceGroupManagerResizeRequests has insert, get, list,
    cancel and delete only), so a changed node count or TTL replaces it, and the new request's
    ``resizeBy`` ("The group's target size will be increased by this number", pulumi-gcp
    ``ResizeRequest``) adds every node again to a group that already holds them, while the group
    itself is kept: refused before Pulumi runs, even with --replace-nodes."""
    from gpuinfra import lifecycle
    from gpuinfra.errors import RequestError
    from gpuinfra.rules.gcp import RESIZE_REQUEST
    from tests.cli.test_lifecycle_cli import FakeBackend

    spec = _written_flex_stack(run_cli, tmp_path)
    backend = FakeBackend(deployed={"flex"}, outputs={"bucket_name": "b"}, replaced=[(RESIZE_REQUEST, "flex-resize")])
    waited = []
    with pytest.raises(RequestError) as raised:
        lifecycle.deploy(
            backend,
            tmp_path,
            spec,
            lambda _e: None,
            preflight=False,
            replace_nodes=replace_nodes,
            wait_flex_start=lambda s, t: waited.append(t),
        )
    assert ("up", "flex") not in backend.calls and waited == []
    assert raised.value.exit_code == ExitCode.BAD_INPUT == 2
    assert "gpuinfra down flex" in str(raised.value) and "\n" not in str(raised.value)


def test_a_refused_cancel_at_the_timeout_is_still_the_capacity_error_that_destroys_the_stack():
    """The cancel at the timeout is refused (here HTTP 400): the wait still ends with the capacity
    error (exit 7) that makes `up` destroy the new stack -- deleting the group, and with it the
    request that could otherwise create the VMs later, unattended -- not with the client's error,
    which `up` would not handle and which would leave the stack and its pending request."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    spec = _flex()
    path = _request_path(spec)
    refused = (400, {"error": {"code": 400, "message": "cannot cancel now (stand-in)", "errors": []}})
    with ReplayServer(
        [("POST", f"{path}/cancel", None, refused), ("GET", path, None, _resize_request(spec, "ACCEPTED"))]
    ) as server:
        client = compute_v1.InstanceGroupManagerResizeRequestsClient(
            credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=server.url), transport="rest"
        )
        with pytest.raises(CapacityError) as raised:
            flex_start.wait_for_resize_request(spec, 0.5, client, "demo-project", poll_seconds=0.2)
    assert raised.value.exit_code == ExitCode.OPERATION_FAILED
    text = str(raised.value)
    assert text.startswith("flex-start request not fulfilled within 0.5 s") and "cancel" in text and "\n" not in text
