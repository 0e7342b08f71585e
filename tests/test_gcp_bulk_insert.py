"""The GCP all-or-nothing formation of STANDARD / SPOT clusters: one ``instances.bulkInsert`` with
``minCount`` = ``count`` = N (blueprints/gcp/bulk_insert.py), run through the real
google-cloud-compute client against a local Compute REST stand-in (tests/gce_standin.py).

Faults injected: full capacity, k < N VMs then ``ZONE_RESOURCE_POOL_EXHAUSTED``, an operation
still RUNNING when the capacity timeout passes, ``QUOTA_EXCEEDED``, a 403 refusal. Codes:
cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability,
cloud.google.com/docs/quotas/troubleshoot.
"""

from __future__ import annotations

import time

import pytest

from blueprints.gcp.bulk_insert import BulkInsertProvider
from gpuinfra.errors import CapacityError, ExitCode, LaunchDeniedError, QuotaError
from gpuinfra.lifecycle import launch_failure
from gpuinfra.plan.naming import gcp_bulk_instance_names
from tests.gce_standin import Capacity, ComputeStandin

GROUP = "demo--ab12-node"
ZONE = "us-central1-a"
TEMPLATE = "https://www.googleapis.com/compute/v1/projects/demo-project/global/instanceTemplates/t-1?uniqueId=42"


def _props(nodes: int, timeout: float = 900) -> dict:
    names = list(gcp_bulk_instance_names(GROUP, nodes))
    return {
        "project": "demo-project",
        "zone": ZONE,
        "region": "us-central1",
        "template": TEMPLATE,
        "names": names,
        "count": nodes,
        "min_count": nodes,
        "machine_type": "a3-highgpu-8g",
        "capacity_timeout_seconds": timeout,
    }


@pytest.fixture
def standin():
    with ComputeStandin() as server:
        yield server


@pytest.fixture
def provider(standin, monkeypatch):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    from blueprints.gcp import bulk_insert

    monkeypatch.setattr(bulk_insert, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(bulk_insert, "DELETE_WAIT_SECONDS", 1.0)
    return BulkInsertProvider(ClientOptions(api_endpoint=standin.url), AnonymousCredentials())


def _bulk_requests(standin) -> list[dict]:
    return [body for method, path, body in standin.requests if path.endswith("/instances/bulkInsert")]


def test_the_insert_sends_the_declared_count_and_min_count_the_rules_judge(standin, provider):
    # the gcp-mig-all-or-nothing rule reads the resource's count / min_count: they are what is sent
    provider.create({**_props(2), "min_count": 1})
    (body,) = _bulk_requests(standin)
    assert (body["count"], body["minCount"]) == ("2", "1")
    with pytest.raises(ValueError, match="bulk insert of 3 VMs under 2 names"):
        provider.create({**_props(2), "count": 3})


def test_full_capacity_creates_every_node_under_its_fixed_name_in_one_call(standin, provider):
    result = provider.create(_props(4))
    names = ["demo--ab12-node-n000", "demo--ab12-node-n001", "demo--ab12-node-n002", "demo--ab12-node-n003"]
    assert sorted(standin.instances) == names
    (body,) = _bulk_requests(standin)  # one call: all or nothing
    assert body["count"] == body["minCount"] == "4"  # int64 travels as a JSON string
    assert sorted(body["perInstanceProperties"]) == names
    assert body["sourceInstanceTemplate"] == TEMPLATE
    assert result.outs["names"] == names
    assert (result.outs["zone"], result.outs["project"]) == (ZONE, "demo-project")
    assert result.id == f"demo-project/{ZONE}/demo--ab12-node-n000"


def test_partial_capacity_leaves_no_vm_and_reports_the_stockout_as_capacity(standin, provider):
    standin.capacity = Capacity(creates=3, error="ZONE_RESOURCE_POOL_EXHAUSTED")
    with pytest.raises(CapacityError) as raised:
        provider.create(_props(4))
    assert standin.instances == {}  # the 3 it made are deleted again
    deleted = sorted(path.rsplit("/", 1)[1] for method, path, _ in standin.requests if method == "DELETE")
    assert deleted == ["demo--ab12-node-n000", "demo--ab12-node-n001", "demo--ab12-node-n002"]
    text = str(raised.value)
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in text and "created 3 of 4" in text and "\n" not in text
    assert raised.value.exit_code == ExitCode.OPERATION_FAILED == 7
    # `up` finds it by its marker in Pulumi's output and keeps the class
    found = launch_failure(f"error: Exception: {text}\n    more output")
    assert isinstance(found, CapacityError) and "ZONE_RESOURCE_POOL_EXHAUSTED" in str(found)


def test_a_bulk_insert_still_running_at_the_capacity_timeout_is_undone_within_the_bound(standin, provider):
    """The operation never ends: what it made is deleted, and `up` reports after the timeout plus
    the bounded wait for the operation's end (DELETE_WAIT_SECONDS, 1 s here)."""
    standin.capacity = Capacity(creates=2, running=True)
    timeout = 1.5
    start = time.monotonic()
    with pytest.raises(CapacityError) as raised:
        provider.create(_props(4, timeout=timeout))
    took = time.monotonic() - start
    assert standin.instances == {}
    assert timeout <= took < timeout + 1.0 + 1.0, took  # timeout + the drain bound + 1 s of slack
    assert "CAPACITY_TIMEOUT" in str(raised.value) and "1.5 s" in str(raised.value)


def test_vms_a_timed_out_insert_still_makes_are_deleted_until_it_ends(standin, provider):
    """Compute Engine cannot cancel the operation: after the timeout's deletes it creates two more
    VMs, then ends with ZONE_RESOURCE_POOL_EXHAUSTED; none of them is left."""
    standin.capacity = Capacity(
        creates=1, running=True, late=True, ends_after_reads=4, error="ZONE_RESOURCE_POOL_EXHAUSTED"
    )
    start = time.monotonic()
    with pytest.raises(CapacityError) as raised:
        provider.create(_props(3, timeout=1))
    took = time.monotonic() - start
    made = {path.rsplit("/", 1)[1] for method, path, _ in standin.requests if method == "DELETE"}
    assert made == {"demo--ab12-node-n000", "demo--ab12-node-n001", "demo--ab12-node-n002"}  # the late ones too
    assert standin.instances == {}
    assert standin.operations["operation-1"]["status"] == "DONE"  # it was read until it ended
    assert took < 1 + 1.0 + 1.0, took
    assert "CAPACITY_TIMEOUT" in str(raised.value)


def test_a_delete_refused_during_the_cleanup_is_retried_and_the_stockout_keeps_its_class(standin, provider):
    """A VM of the failed insert refuses its first delete (HTTP 400 resourceNotReady, as for an
    instance whose own creation is not done): the other VMs are still deleted, the refused one is
    deleted again on the next poll, and `up` still gets the capacity error (exit 7)."""
    standin.capacity = Capacity(creates=3, error="ZONE_RESOURCE_POOL_EXHAUSTED")
    standin.refuse_deletes = {"demo--ab12-node-n000": 1}
    with pytest.raises(CapacityError) as raised:
        provider.create(_props(4))
    assert standin.instances == {}
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in str(raised.value)


def test_a_delete_refused_until_the_bound_is_named_with_the_capacity_error(standin, provider):
    """A VM whose deletes are refused throughout the bounded wait: the error keeps its class and
    names that VM and `gpuinfra down`, and the other VMs are deleted."""
    standin.capacity = Capacity(creates=2, error="ZONE_RESOURCE_POOL_EXHAUSTED")
    standin.refuse_deletes = {"demo--ab12-node-n001": 10_000}
    with pytest.raises(CapacityError) as raised:
        provider.create(_props(3))
    assert sorted(standin.instances) == ["demo--ab12-node-n001"]
    text = str(raised.value)
    assert "demo--ab12-node-n001" in text and "gpuinfra down" in text and "\n" not in text


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        # the JSON API's reasons are camelCase: "Error 403: Quota 'SSD_TOTAL_GB' exceeded. Limit:
        # 100.0, quotaExceeded" (github.com/openshift-evangelists/openshifter/issues/15) and "Error
        # 403: Quota exceeded for quota group 'ReadGroup' ..., rateLimitExceeded"
        # (github.com/hashicorp/terraform-provider-google/issues/8360)
        ("quotaExceeded", "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally."),
        ("rateLimitExceeded", "Quota exceeded for quota group 'WriteGroup' of service 'compute.googleapis.com'"),
    ],
)
def test_a_call_refused_with_the_json_apis_quota_reason_is_quota_not_iam(standin, provider, reason, message):
    standin.capacity = Capacity(refuse=(403, reason))
    standin.refusal_message = message
    with pytest.raises(QuotaError) as raised:
        provider.create(_props(2))
    assert raised.value.exit_code == ExitCode.QUOTA_EXCEEDED == 9
    assert reason in str(raised.value) and standin.instances == {}


def test_a_refused_read_of_the_running_insert_does_not_end_a_formation_that_completes(standin, provider):
    """A read of the operation is refused once (Compute's 403 rateLimitExceeded) while the insert
    runs: that is no failure of the insert, which goes on and creates every VM -- reading on, the
    formation completes; ending there would have deleted the VMs it made and left the ones it
    still makes."""
    standin.capacity = Capacity(creates=3, running=True)
    standin.refuse_operation_reads = 1
    standin._advance = lambda op, zone: op.update(status="DONE")  # the next read that is answered: done
    result = provider.create(_props(3))
    assert sorted(standin.instances) == list(result.outs["names"])


def test_reads_refused_until_the_timeout_end_as_the_capacity_timeout_with_nothing_left(standin, provider):
    standin.capacity = Capacity(creates=2, running=True)
    standin.refuse_operation_reads = 10_000
    with pytest.raises(CapacityError) as raised:
        provider.create(_props(3, timeout=1))
    text = str(raised.value)
    assert "CAPACITY_TIMEOUT" in text and "rateLimitExceeded" in text and "\n" not in text
    assert standin.instances == {}


def test_quota_exceeded_is_the_quota_class(standin, provider):
    standin.capacity = Capacity(creates=0, error="QUOTA_EXCEEDED")
    with pytest.raises(QuotaError) as raised:
        provider.create(_props(2))
    assert raised.value.exit_code == ExitCode.QUOTA_EXCEEDED == 9
    assert "QUOTA_EXCEEDED" in str(raised.value)
    assert standin.instances == {}


def test_a_call_refused_with_403_quota_is_quota_and_without_it_is_iam(standin, provider):
    standin.capacity = Capacity(refuse=(403, "QUOTA_EXCEEDED"))
    with pytest.raises(QuotaError):
        provider.create(_props(2))
    standin.capacity = Capacity(refuse=(403, "forbidden"))
    with pytest.raises(LaunchDeniedError) as raised:
        provider.create(_props(2))
    assert raised.value.exit_code == ExitCode.LAUNCH_DENIED == 11
    assert standin.instances == {}


def test_delete_removes_every_name_and_passes_over_the_gone_ones(standin, provider):
    result = provider.create(_props(3))
    del standin.instances["demo--ab12-node-n001"]  # a VM that ended itself
    provider.delete(result.id, result.outs)
    assert standin.instances == {}


def test_replacing_the_nodes_also_ends_the_replacements_the_group_holds(standin, provider):
    """A preempted bulk VM's replacement is a member of the group; replacing the bulk insert
    (``up --replace-nodes``, another node count) must not leave it billing beside the new nodes."""
    result = provider.create(_props(2))
    del standin.instances["demo--ab12-node-n001"]  # preempted; the group made its replacement
    standin.instances["demo--ab12-node-x7k2"] = {"kind": "compute#instance", "name": "demo--ab12-node-x7k2"}
    standin.groups[GROUP] = ["demo--ab12-node-x7k2"]
    provider.delete(result.id, result.outs)
    assert standin.instances == {} and standin.groups[GROUP] == []
    (resize,) = [(p, b) for m, p, b in standin.requests if p.endswith("/resize")]
    assert resize == (
        f"/compute/v1/projects/demo-project/zones/{ZONE}/instanceGroupManagers/{GROUP}/resize",
        {"__query__": {"size": "0"}},
    )
    standin.groups.clear()  # on `down` the group may be gone already: nothing to empty
    provider.delete(provider.create(_props(1)).id, _props(1))
    assert standin.instances == {}


def test_only_a_change_of_the_timeout_does_not_replace_the_nodes(provider):
    old = _props(2)
    assert provider.diff("id", old, {**old, "capacity_timeout_seconds": 60}).replaces == []
    changed = provider.diff("id", old, {**old, "template": TEMPLATE.replace("42", "43")})
    assert changed.replaces == ["template"] and changed.delete_before_replace


def test_vms_an_interrupted_up_left_under_the_names_are_deleted_before_the_insert(standin, provider):
    standin.instances["demo--ab12-node-n001"] = {"name": "demo--ab12-node-n001", "status": "RUNNING", "old": True}
    provider.create(_props(2))
    assert sorted(standin.instances) == ["demo--ab12-node-n000", "demo--ab12-node-n001"]
    assert "old" not in standin.instances["demo--ab12-node-n001"]  # the new one
    methods = [(m, p.rsplit("/", 1)[1]) for m, p, _ in standin.requests if m != "GET"]
    assert methods == [("DELETE", "demo--ab12-node-n001"), ("POST", "bulkInsert")]


class _NoGroup:
    """``instanceGroupManagers.listManagedInstances`` of a group that does not exist."""

    def list_managed_instances(self, **kwargs):
        from google.api_core.exceptions import NotFound

        raise NotFound("no group")


def test_down_finds_the_bulk_nodes_and_deletes_what_an_interrupted_up_left(standin, provider):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    from gpuinfra import teardown
    from gpuinfra.plan.boot_gcp import node_prefix
    from tests.blueprints.helpers import make_spec

    spec = make_spec("a2-highgpu-8g", nodes=2, cloud="gcp", spot=True, gcp_project="demo-project")
    names = list(gcp_bulk_instance_names(node_prefix(spec), 2))
    clients = teardown.CloudClients(
        groups=_NoGroup(),
        instances=compute_v1.InstancesClient(
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=standin.url),
            transport="rest",
        ),
    )
    for name in names:
        standin.instances[name] = {"name": name, "status": "RUNNING"}
    found = teardown.list_nodes(spec, {"bulk_instance_names": names}, clients)
    assert [(n.name, n.state) for n in found] == [(names[0], "RUNNING"), (names[1], "RUNNING")]
    assert teardown.delete_gcp_bulk_leftovers(spec, clients) == names
    assert standin.instances == {}
    assert teardown.list_nodes(spec, {"bulk_instance_names": names}, clients) == []


def test_down_deletes_the_leftovers_of_a_stack_whose_project_is_the_gcp_project_config(
    standin, run_cli, tmp_path, monkeypatch
):
    """The stack file leaves the project to ``gcp:project`` (as the program reads it) and the
    stack has no resources left (its failed first `up` was destroyed) or no outputs (interrupted):
    `down` still finds and deletes the VMs under the stack's bulk-insert names in that project."""
    import yaml
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    from gpuinfra import lifecycle, teardown
    from gpuinfra.plan.boot_gcp import node_prefix
    from gpuinfra.stackfile import read_stack_spec, stack_file_path
    from tests.cli.test_lifecycle_cli import FakeBackend

    made = run_cli(
        "new", "--instance-type", "a2-highgpu-8g", "--nodes", "2", "--cloud", "gcp", "--spot", "--name", "train",
        "--project-dir", str(tmp_path),
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    path = stack_file_path(tmp_path, "train")
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gcp:project"] = "demo-project"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    spec = read_stack_spec(tmp_path, "train")
    assert spec.gcp_project is None
    names = list(gcp_bulk_instance_names(node_prefix(spec), 2))
    for name in names:
        standin.instances[name] = {"name": name, "status": "RUNNING"}
    clients = teardown.CloudClients(
        groups=_NoGroup(),
        instances=compute_v1.InstancesClient(
            credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=standin.url), transport="rest"
        ),
    )
    said = []
    lifecycle.destroy_cluster(FakeBackend(), tmp_path, spec, lambda _e: None, said.append, clients=clients)
    assert standin.instances == {}
    assert any(names[0] in line for line in said)
    assert {p.split("/projects/")[1].split("/")[0] for m, p, _ in standin.requests} == {"demo-project"}


def test_down_sweeps_every_bulk_name_of_the_stack_whatever_its_node_count_now_says(standin):
    """A 4-node stack whose file now says 2 nodes (lowered after `up`, or edited): `down`'s sweep
    still deletes n002 and n003, with one filtered ``instances.list``; the VMs of another stack
    whose group name differs only in its suffix, a group member and a VM named by hand under the
    group's prefix are not touched."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    from gpuinfra import teardown
    from gpuinfra.plan.boot_gcp import node_prefix
    from tests.blueprints.helpers import make_spec

    deployed = make_spec("a2-highgpu-8g", nodes=4, cloud="gcp", spot=True, gcp_project="demo-project")
    spec = deployed.model_copy(update={"nodes": 2})
    group = node_prefix(spec)
    other = node_prefix(spec.model_copy(update={"name_suffix": "zz9zz9"}))
    own = list(gcp_bulk_instance_names(group, 4))
    strangers = [*gcp_bulk_instance_names(other, 4), f"{group}-x7q2", f"{group}-n0001", f"{group}x-n000"]
    for name in own + strangers:
        standin.instances[name] = {"name": name, "status": "RUNNING"}
    clients = teardown.CloudClients(
        groups=_NoGroup(),
        instances=compute_v1.InstancesClient(
            credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=standin.url), transport="rest"
        ),
    )
    assert sorted(teardown.delete_gcp_bulk_leftovers(spec, clients)) == own
    assert sorted(standin.instances) == sorted(strangers)
    assert len(standin.lists) == 1  # one list, not one read per name
    # a second sweep finds nothing left
    assert teardown.delete_gcp_bulk_leftovers(spec, clients) == []


def test_a_failed_sweep_list_is_one_operation_error(standin):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    from gpuinfra import teardown
    from gpuinfra.errors import OperationError
    from tests.blueprints.helpers import make_spec

    spec = make_spec("a2-highgpu-8g", nodes=2, cloud="gcp", spot=True, gcp_project="demo-project")
    clients = teardown.CloudClients(
        instances=compute_v1.InstancesClient(
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=standin.url + "/nowhere"),
            transport="rest",
        )
    )
    with pytest.raises(OperationError, match="listing the stack's bulk-insert VMs failed"):
        teardown.delete_gcp_bulk_leftovers(spec, clients)
