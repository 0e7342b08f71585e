"""`down` / `reap` around the destroy, with the Automation API replaced at its boundary (a
recording fake that checks what the cloud would check when Pulumi deletes) and the clouds
stood in for: moto EC2 + S3 on 127.0.0.1 (AWS); a local Compute Engine + Cloud Storage REST
stand-in reached through Google's real clients (GCP).

Faults injected: nodes that never ack, a sync request the cloud refuses, nodes EC2 keeps in
``shutting-down``, a destroy that fails, instances the TTL backstop already ended (one already
gone from EC2), a bucket kept by an earlier plain `down`."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

import boto3
import pytest
import yaml

from gpuinfra import lifecycle, teardown
from gpuinfra.agent.constants import SYNC_REQUEST_ATTRIBUTE, SYNC_REQUEST_ID_PATTERN, SYNC_REQUEST_TAG, sync_ack_key
from gpuinfra.errors import OperationError
from tests.cli.test_lifecycle_cli import FakeBackend


class Clock:
    """A fake clock for the waits; ``on_wait`` runs at each wait (the nodes' side of the world)."""

    def __init__(self):
        self.now = 0.0
        self.on_wait = []

    def wait(self, seconds):
        self.now += seconds
        for step in self.on_wait:
            step(self.now)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(teardown, "wait_seconds", c.wait)
    monkeypatch.setattr(teardown, "clock_seconds", lambda: c.now)
    return c


@pytest.fixture
def aws(moto_url, monkeypatch, run_cli, tmp_path):
    """AWS credentials and endpoint (moto), and a function writing a 2-node p4d stack file."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)

    def new(name):
        made = run_cli(
            "new", "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", name, "--project-dir", str(tmp_path)
        )
        assert made.exit_code == 0, made.stderr
        return tmp_path

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_url)
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_url)
    return new, ec2, s3


def _launch(ec2, stack, count):
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    made = ec2.run_instances(
        ImageId=ami,
        MinCount=count,
        MaxCount=count,
        InstanceType="p4d.24xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "gpuinfra:stack", "Value": stack}]}],
    )
    return [i["InstanceId"] for i in made["Instances"]]


def _states(ec2, ids):
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[{"Name": "instance-id", "Values": ids}])
    return {i["InstanceId"]: i["State"]["Name"] for p in pages for r in p["Reservations"] for i in r["Instances"]}


def _tag(ec2, instance_id):
    tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_id]}])["Tags"]
    return next((t["Value"] for t in tags if t["Key"] == SYNC_REQUEST_TAG), None)


class PlacementGroupBackend(FakeBackend):
    """A deployed stack whose destroy does what EC2 checks when Pulumi deletes the placement group:
    it fails while any node is not ``terminated`` (DeletePlacementGroup); records the clock and
    what EC2 said at that moment."""

    def __init__(self, ec2, ids, clock, outputs, fail=None):
        super().__init__(deployed={outputs["stack"]}, outputs={k: v for k, v in outputs.items() if k != "stack"})
        self.ec2, self.ids, self.clock, self.destroy_fail = ec2, ids, clock, fail
        self.seen = None

    def destroy(self, project_dir, stack, on_event):
        self.calls.append(("destroy", stack))
        self.seen = (self.clock.now, _states(self.ec2, self.ids))
        if self.destroy_fail:
            raise self.destroy_fail
        alive = [i for i, state in self.seen[1].items() if state != "terminated"]
        if alive:
            raise OperationError(
                f"pulumi failed on stack {stack!r}: deleting EC2 Placement Group: InvalidPlacementGroup.InUse: "
                f"instances {alive} are in it"
            )
        self.deployed.discard(stack)
        return {"delete": 30}


def _use(monkeypatch, backend):
    monkeypatch.setattr(lifecycle, "make_backend", lambda: backend)


# ------------------------------------------------------------------------------ sync request
def test_down_asks_the_running_nodes_to_sync_and_waits_for_their_acks(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("syncs")
    s3.create_bucket(Bucket="gpuinfra-syncs-b1")
    acking, silent, ended = _launch(ec2, "syncs", 3)
    ec2.terminate_instances(InstanceIds=[ended])  # ended itself (idle) before `down`

    def node_side(now):  # the acking node answers the request 20 s after it is set
        request = _tag(ec2, acking)
        if request and now >= 20:
            ack = {"request": request, "node": acking, "uploaded_files": 3, "complete": True, "finished_at": "t"}
            s3.put_object(Bucket="gpuinfra-syncs-b1", Key=sync_ack_key("syncs", request, acking), Body=json.dumps(ack))

    clock.on_wait.append(node_side)
    ids = [acking, silent, ended]
    backend = PlacementGroupBackend(
        ec2, ids, clock, {"stack": "syncs", "bucket_name": "gpuinfra-syncs-b1", "instance_ids": ids}
    )
    _use(monkeypatch, backend)
    result = run_cli("down", "syncs", "--sync-timeout-seconds", "60", "--project-dir", str(project))
    assert result.exit_code == 0, result.stdout + result.stderr
    request = _tag(ec2, acking)
    assert re.fullmatch(SYNC_REQUEST_ID_PATTERN, request) and request.startswith("down-")
    assert _tag(ec2, silent) == request and _tag(ec2, ended) is None  # only running nodes are asked
    assert f"sync {acking}: complete, 3 file(s) uploaded, finished t" in result.stdout
    assert f"sync {silent}: no ack within 60 s; unsynced checkpoints are lost" in result.stdout
    waited, states = backend.seen
    assert waited >= 60  # the destroy came after the bound for the silent node
    assert set(states.values()) == {"terminated"}
    assert backend.calls[-1] == ("destroy", "syncs")


def test_a_deployed_stacks_nodes_are_asked_to_sync_before_anything_ends_them(run_cli, aws, clock, monkeypatch):
    """A stack ``up`` deployed carries a deployment id, and every node of its fleet the deployment
    tag: the nodes Pulumi knows are asked to sync while they run, and only then are they (and an
    instance an interrupted ``up`` left under the same deployment) ended, before the destroy."""
    new, ec2, s3 = aws
    project = new("dep")
    lifecycle.record_deployment(project, "dep", "0c0c0c0c0c0c")
    monkeypatch.setattr(lifecycle, "make_ec2_client", lambda region: ec2)
    s3.create_bucket(Bucket="gpuinfra-dep-b1")
    ids = _launch(ec2, "dep", 3)
    ec2.create_tags(Resources=ids, Tags=[{"Key": "gpuinfra:deployment", "Value": "0c0c0c0c0c0c"}])
    known, orphan = ids[:2], ids[2]
    asked_while_running = {}

    def node_side(now):  # each known node acks once it sees the request, noting its own state
        for node in known:
            request = _tag(ec2, node)
            if request and node not in asked_while_running:
                asked_while_running[node] = _states(ec2, [node])[node]
                ack = {"request": request, "node": node, "uploaded_files": 1, "complete": True, "finished_at": "t"}
                s3.put_object(Bucket="gpuinfra-dep-b1", Key=sync_ack_key("dep", request, node), Body=json.dumps(ack))

    clock.on_wait.append(node_side)
    backend = PlacementGroupBackend(
        ec2, ids, clock, {"stack": "dep", "bucket_name": "gpuinfra-dep-b1", "instance_ids": known}
    )
    _use(monkeypatch, backend)
    result = run_cli("down", "dep", "--sync-timeout-seconds", "60", "--project-dir", str(project))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert asked_while_running == dict.fromkeys(known, "running")
    assert _tag(ec2, orphan) is None  # not the stack's known node: never asked
    assert "ended 1 instance(s) of deployment 0c0c0c0c0c0c that Pulumi did not know" in result.stdout
    waited, states = backend.seen
    assert states == dict.fromkeys(ids, "terminated")  # the orphan too, before the placement group went
    assert backend.calls[-1] == ("destroy", "dep")


def test_down_stops_waiting_once_every_node_acked(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("fast")
    s3.create_bucket(Bucket="gpuinfra-fast-b1")
    ids = _launch(ec2, "fast", 2)

    def node_side(now):
        for node in ids:
            request = _tag(ec2, node)
            body = {"request": request, "node": node, "uploaded_files": 0, "complete": False, "finished_at": "t"}
            s3.put_object(Bucket="gpuinfra-fast-b1", Key=sync_ack_key("fast", request, node), Body=json.dumps(body))

    clock.on_wait.append(node_side)
    backend = PlacementGroupBackend(
        ec2, ids, clock, {"stack": "fast", "bucket_name": "gpuinfra-fast-b1", "instance_ids": ids}
    )
    _use(monkeypatch, backend)
    result = run_cli("down", "fast", "--project-dir", str(project))  # default bound: 360 s
    assert result.exit_code == 0, result.stderr
    assert backend.seen[0] < 60  # one poll, not the whole bound
    assert all(f"sync {node}: INCOMPLETE, 0 file(s) uploaded" in result.stdout for node in ids)


def test_down_with_no_running_nodes_asks_nothing_and_waits_for_nothing(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("idle")
    s3.create_bucket(Bucket="gpuinfra-idle-b1")
    ids = _launch(ec2, "idle", 2)
    ec2.terminate_instances(InstanceIds=ids)
    backend = PlacementGroupBackend(
        ec2, ids, clock, {"stack": "idle", "bucket_name": "gpuinfra-idle-b1", "instance_ids": ids}
    )
    _use(monkeypatch, backend)
    result = run_cli("down", "idle", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert "sync: no running nodes: nothing to sync" in result.stdout
    assert backend.seen[0] == 0 and all(_tag(ec2, i) is None for i in ids)


def test_a_refused_sync_request_is_reported_and_the_destroy_goes_on(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("denied")
    s3.create_bucket(Bucket="gpuinfra-denied-b1")
    ids = _launch(ec2, "denied", 1)

    class NoTagging:
        def __init__(self, real):
            self.real = real

        def create_tags(self, **kwargs):
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "not allowed"}}, "CreateTags")

        def __getattr__(self, name):
            return getattr(self.real, name)

    monkeypatch.setattr(teardown, "make_clients", lambda spec: teardown.CloudClients(ec2=NoTagging(ec2), s3=s3))
    backend = PlacementGroupBackend(
        ec2, ids, clock, {"stack": "denied", "bucket_name": "gpuinfra-denied-b1", "instance_ids": ids}
    )
    _use(monkeypatch, backend)
    result = run_cli("down", "denied", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert f"sync {ids[0]}: the request could not be set (CreateTags failed: ClientError:" in result.stdout
    assert backend.seen[0] == 0  # nobody to wait for


def test_sync_timeout_zero_skips_the_request(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("nosync")
    ids = _launch(ec2, "nosync", 1)
    backend = PlacementGroupBackend(ec2, ids, clock, {"stack": "nosync", "bucket_name": "b", "instance_ids": ids})
    _use(monkeypatch, backend)
    result = run_cli("down", "nosync", "--sync-timeout-seconds", "0", "--project-dir", str(project))
    assert result.exit_code == 0 and "sync: skipped (--sync-timeout-seconds 0)" in result.stdout
    assert _tag(ec2, ids[0]) is None
    bad = run_cli("down", "nosync", "--sync-timeout-seconds", "-1", "--project-dir", str(project))
    assert bad.exit_code == 2


def test_reap_asks_the_nodes_of_each_expired_stack_to_sync(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("old")
    path = project / "stacks" / "Pulumi.old.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["created_at"] = "2026-01-01T00:00:00Z"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    s3.create_bucket(Bucket="gpuinfra-old-b1")
    ids = _launch(ec2, "old", 1)
    backend = PlacementGroupBackend(
        ec2, ids, clock, {"stack": "old", "bucket_name": "gpuinfra-old-b1", "instance_ids": ids}
    )
    _use(monkeypatch, backend)
    result = run_cli("reap", "--expired", "--sync-timeout-seconds", "30", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert _tag(ec2, ids[0]).startswith("reap-")
    assert f"  sync {ids[0]}: no ack within 30 s" in result.stdout and "destroyed old" in result.stdout


# ------------------------------------------------------------------------------ termination
class SlowShutdown:
    """EC2 as it is for GPU instances: a terminated instance is ``shutting-down`` for
    ``seconds`` (of the fake clock) before it reads ``terminated``."""

    def __init__(self, real, clock, seconds):
        self.real, self.clock, self.seconds = real, clock, seconds

    def get_paginator(self, name):
        paginator = self.real.get_paginator(name)
        if name != "describe_instances":
            return paginator
        outer = self

        class Slow:
            def paginate(self, **kwargs):
                for page in paginator.paginate(**kwargs):
                    for reservation in page["Reservations"]:
                        for instance in reservation["Instances"]:
                            if instance["State"]["Name"] == "terminated" and outer.clock.now < outer.seconds:
                                instance["State"]["Name"] = "shutting-down"
                    yield page

        return Slow()

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_destroy_waits_until_ec2_reports_the_nodes_terminated(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("slow")
    ids = _launch(ec2, "slow", 2)
    slow = SlowShutdown(ec2, clock, 180)
    monkeypatch.setattr(teardown, "make_clients", lambda spec: teardown.CloudClients(ec2=slow, s3=s3))
    backend = PlacementGroupBackend(slow, ids, clock, {"stack": "slow", "instance_ids": ids})
    _use(monkeypatch, backend)
    result = run_cli("down", "slow", "--sync-timeout-seconds", "0", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    waited, states = backend.seen
    assert 180 <= waited < 180 + teardown.POLL_SECONDS + 1 and set(states.values()) == {"terminated"}


def test_the_wait_for_termination_is_bounded(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("stuck")
    ids = _launch(ec2, "stuck", 1)
    slow = SlowShutdown(ec2, clock, 10**9)  # never terminates
    monkeypatch.setattr(teardown, "make_clients", lambda spec: teardown.CloudClients(ec2=slow, s3=s3))
    backend = PlacementGroupBackend(slow, ids, clock, {"stack": "stuck", "instance_ids": ids})
    _use(monkeypatch, backend)
    result = run_cli("down", "stuck", "--sync-timeout-seconds", "0", "--project-dir", str(project))
    assert result.exit_code == 7 and "InvalidPlacementGroup.InUse" in result.stderr
    assert backend.seen[0] == teardown.TERMINATION_WAIT_SECONDS
    assert (
        f"still not terminated after {teardown.TERMINATION_WAIT_SECONDS} s: {ids[0]} (shutting-down); if the "
        "destroy fails on the placement group, run the command again" in result.stdout
    )


# ------------------------------------------------------------------------- after the backstop
def test_down_after_the_backstop_ended_the_nodes(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("late")
    ids = _launch(ec2, "late", 1)
    ec2.terminate_instances(InstanceIds=ids)  # the backstop's DeleteFleets terminated it
    gone = "i-0aaaaaaaaaaaaaaaa"  # terminated over an hour ago: EC2 no longer knows the id
    backend = PlacementGroupBackend(
        ec2, ids, clock, {"stack": "late", "bucket_name": "b", "instance_ids": [*ids, gone]}
    )
    _use(monkeypatch, backend)
    result = run_cli("down", "late", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert "sync: no running nodes: nothing to sync" in result.stdout and backend.calls[-1] == ("destroy", "late")


def test_the_destroy_refreshes_so_a_fleet_the_backstop_deleted_is_not_deleted_again(monkeypatch, tmp_path):
    """The Automation API boundary: a stack whose fleet the backstop deleted. Without a refresh
    the engine calls DeleteFleets again and the provider fails on EC2's answer; with it, the
    provider reads the fleet as gone (``deleted*`` state) and drops it from the state."""
    import shutil

    from pulumi import automation as auto
    from pulumi.automation._cmd import CommandResult

    class _Stack:
        def destroy(self, **kwargs):
            if not kwargs.get("refresh"):
                raise auto.CommandError(
                    CommandResult(
                        "",
                        "error: deleting EC2 Fleet (fleet-0123): fleetIdDoesNotExist: The fleet ID does not exist",
                        255,
                    )
                )
            return

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/pulumi")
    monkeypatch.setattr(auto, "select_stack", lambda **kw: _Stack())
    assert lifecycle.PulumiAutomation().destroy(tmp_path, "late", lambda event: None) == {}


# ------------------------------------------------------------------------------- delete data
def _stack_id(project, stack: str) -> str:
    """``<stack>-<name suffix>``: the id `new` gave ``stack`` (tag ``gpuinfra:stack-id``)."""
    from gpuinfra.stackfile import read_stack_spec

    return f"{stack}-{read_stack_spec(project, stack).name_suffix}"


def _versioned_bucket(s3, name, stack, stack_id=None):
    """A versioned bucket tagged as a bucket of ``stack`` (and its id ``stack_id``) by the blueprint."""
    s3.create_bucket(Bucket=name)
    tags = [{"Key": "gpuinfra:stack", "Value": stack}]
    tags += [{"Key": "gpuinfra:stack-id", "Value": stack_id}] if stack_id else []
    s3.put_bucket_tagging(Bucket=name, Tagging={"TagSet": tags})
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=name, Key="checkpoints/a/step-1/model.pt", Body=b"v1")
    s3.put_object(Bucket=name, Key="checkpoints/a/step-1/model.pt", Body=b"v2")
    s3.delete_object(Bucket=name, Key="checkpoints/a/step-1/model.pt")  # a delete marker: 3 versions


def _buckets(s3):
    return {b["Name"] for b in s3.list_buckets()["Buckets"]}


def test_delete_data_after_a_plain_down_deploys_nothing_and_deletes_the_kept_bucket(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("gone")
    _versioned_bucket(s3, "gpuinfra-gone-kept1", "gone", _stack_id(project, "gone"))
    s3.create_bucket(Bucket="gpuinfra-gone-someone-else")  # same prefix, not the stack's tag
    _versioned_bucket(s3, "gpuinfra-gone-twin", "gone", "gone-zz9zz9")  # a stack `gone` of another folder
    _versioned_bucket(s3, "gpuinfra-gone2-x", "gone2")  # another stack
    before = (project / "stacks" / "Pulumi.gone.yaml").read_text()
    backend = FakeBackend(deployed=set())  # the plain `down` destroyed every resource
    _use(monkeypatch, backend)
    refused = run_cli("down", "gone", "--delete-data", "--project-dir", str(project))
    assert (
        refused.exit_code == 2 and "bucket(s) gpuinfra-gone-kept1 are not empty (3 object versions)" in refused.stderr
    )
    result = run_cli("down", "gone", "--delete-data", "--yes", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert not [c for c in backend.calls if c[0] in ("up", "destroy")]  # nothing deployed, nothing to destroy
    assert "deleted bucket gpuinfra-gone-kept1 and its 3 object version(s)" in result.stdout
    assert "gpuinfra-gone-kept1" not in _buckets(s3)
    assert {"gpuinfra-gone-someone-else", "gpuinfra-gone2-x", "gpuinfra-gone-twin"} <= _buckets(s3)
    assert (project / "stacks" / "Pulumi.gone.yaml").read_text() == before


def test_a_failed_delete_data_keeps_the_data_and_leaves_no_flag(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("fails")
    _versioned_bucket(s3, "gpuinfra-fails-b1", "fails", _stack_id(project, "fails"))
    before = (project / "stacks" / "Pulumi.fails.yaml").read_text()
    ids = _launch(ec2, "fails", 1)
    outputs = {"stack": "fails", "bucket_name": "gpuinfra-fails-b1", "instance_ids": ids}
    failing = PlacementGroupBackend(ec2, ids, clock, outputs, fail=OperationError("pulumi failed on stack 'fails': x"))
    _use(monkeypatch, failing)
    result = run_cli("down", "fails", "--delete-data", "--yes", "--project-dir", str(project))
    assert result.exit_code == 7 and ("up", "fails") not in failing.calls
    assert "gpuinfra-fails-b1" in _buckets(s3)  # the destroy failed: the data stays
    assert len(s3.list_object_versions(Bucket="gpuinfra-fails-b1")["Versions"]) == 2
    assert (project / "stacks" / "Pulumi.fails.yaml").read_text() == before
    _use(monkeypatch, PlacementGroupBackend(ec2, ids, clock, outputs))
    plain = run_cli("down", "fails", "--project-dir", str(project))
    assert plain.exit_code == 0 and "the bucket and its data are kept" in plain.stdout
    assert "gpuinfra-fails-b1" in _buckets(s3)


def test_plain_down_says_so_when_the_stack_file_deletes_the_bucket(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("wipe")
    path = project / "stacks" / "Pulumi.wipe.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["delete_bucket_on_destroy"] = True
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    _use(monkeypatch, FakeBackend(deployed={"wipe"}))
    result = run_cli("down", "wipe", "--project-dir", str(project))
    assert result.exit_code == 0 and "data are kept" not in result.stdout
    assert "the stack file sets delete_bucket_on_destroy: true, so the bucket and its data are deleted" in result.stdout


# ------------------------------------------------------------------------------------- GCP
class GcpStandIn:
    """Compute Engine (``listManagedInstances``, ``instances.list`` / ``get`` / ``setMetadata`` with the
    fingerprint check) and Cloud Storage (object list and media download) over REST on
    127.0.0.1, with state; ``acking`` nodes write their ack when the request attribute appears."""

    def __init__(self, project, zone, group, vms, bucket, stack):
        self.project, self.zone, self.group, self.bucket, self.stack = project, zone, group, bucket, stack
        self.vms = {
            name: {"status": status, "items": [{"key": "startup-script", "value": "#!"}], "fp": 1}
            for name, status in vms
        }
        self.objects: dict[str, bytes] = {}  # the stack bucket: acks
        self.kept: dict[str, dict] = {}  # other buckets: name -> {"labels", "versions": {(key, generation)}}
        self.calls: list[tuple[str, str]] = []
        self.stale_fingerprint_once: set[str] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status, body):
                payload = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self):  # noqa: N802
                self._reply(*outer.answer("GET", self.path, b""))

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._reply(*outer.answer("POST", self.path, body))

            def do_DELETE(self):  # noqa: N802
                self._reply(*outer.answer("DELETE", self.path, b""))

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, method, raw_path, body):
        url = urlparse(raw_path)
        path, query = unquote(url.path), parse_qs(url.query)
        self.calls.append((method, path))
        zone = f"/compute/v1/projects/{self.project}/zones/{self.zone}"
        if method == "POST" and path == f"{zone}/instanceGroupManagers/{self.group}/listManagedInstances":
            return 200, {
                "managedInstances": [
                    {"instance": f"https://compute.googleapis.com{zone}/instances/{n}", "instanceStatus": vm["status"]}
                    for n, vm in self.vms.items()
                ]
            }
        if method == "GET" and path == f"{zone}/instances":
            # instances.list with ``filter`` ``name eq "<RE2>"``, matching the whole name
            # (cloud.google.com/compute/docs/reference/rest/v1/instances/list)
            found = re.fullmatch(r'name eq "([^"]*)"', query.get("filter", [""])[0])
            names = [n for n in self.vms if found is None or re.fullmatch(found.group(1), n)]
            return 200, {
                "kind": "compute#instanceList",
                "items": [{"name": n, "status": self.vms[n]["status"]} for n in names],
            }
        match = re.fullmatch(rf"{zone}/instances/([^/]+)(/setMetadata)?", path)
        if match and match.group(1) in self.vms:
            vm = self.vms[match.group(1)]
            if method == "GET":
                return 200, {"name": match.group(1), "metadata": {"fingerprint": str(vm["fp"]), "items": vm["items"]}}
            sent = json.loads(body)
            if sent.get("fingerprint") != str(vm["fp"]) or match.group(1) in self.stale_fingerprint_once:
                self.stale_fingerprint_once.discard(match.group(1))
                vm["fp"] += 1  # someone else changed the metadata in between
                return 412, {
                    "error": {"code": 412, "message": "conditionNotMet", "errors": [{"reason": "conditionNotMet"}]}
                }
            vm["items"], vm["fp"] = sent["items"], vm["fp"] + 1
            return 200, {"name": "op-1", "status": "DONE", "kind": "compute#operation"}
        if method == "GET" and path == "/storage/v1/b" and query.get("project") == [self.project]:
            items = [{"name": b, "labels": kept["labels"]} for b, kept in self.kept.items()]
            return 200, {"kind": "storage#buckets", "items": items}
        kept = re.fullmatch(r"/storage/v1/b/([^/]+)(?:/o(?:/(.+))?)?", path)
        if kept and kept.group(1) in self.kept:
            bucket, versions = kept.group(1), self.kept[kept.group(1)]["versions"]
            if method == "GET" and path.endswith("/o"):
                if [v.lower() for v in query.get("versions", [])] != ["true"]:
                    return 400, {"error": {"code": 400, "message": "this stand-in lists versions only"}}
                items = [{"name": k, "bucket": bucket, "generation": str(g)} for k, g in sorted(versions)]
                return 200, {"kind": "storage#objects", "items": items}
            if method == "DELETE" and kept.group(2):
                versions.remove((kept.group(2), int(query["generation"][0])))  # KeyError: a wrong generation
                return 204, b""
            if method == "DELETE" and versions:
                return 409, {"error": {"code": 409, "message": "The bucket you tried to delete is not empty."}}
            if method == "DELETE":
                del self.kept[bucket]
                return 204, b""
        if method == "GET" and path == f"/storage/v1/b/{self.bucket}/o":
            prefix = query.get("prefix", [""])[0]
            items = [
                {"name": k, "bucket": self.bucket, "generation": "1"} for k in self.objects if k.startswith(prefix)
            ]
            return 200, {"kind": "storage#objects", "items": items}
        if method == "GET" and path.startswith(f"/download/storage/v1/b/{self.bucket}/o/"):
            return 200, self.objects[path.split("/o/", 1)[1]]
        return 404, {"error": {"code": 404, "message": f"no route {method} {path}"}}

    def attribute(self, name):
        return next((i["value"] for i in self.vms[name]["items"] if i["key"] == SYNC_REQUEST_ATTRIBUTE), None)

    def node_side(self, acking):
        def step(now):
            for name in acking:
                request = self.attribute(name)
                if request:
                    ack = {"request": request, "node": name, "uploaded_files": 2, "complete": True, "finished_at": "t"}
                    self.objects[sync_ack_key(self.stack, request, name)] = json.dumps(ack).encode()

        return step

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_gcp_down_sets_the_metadata_attribute_on_the_migs_vms_and_waits_for_acks(run_cli, tmp_path, clock, monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1, storage

    from gpuinfra.plan.boot_gcp import node_prefix
    from gpuinfra.stackfile import read_stack_spec

    made = run_cli(
        "new",
        "--instance-type",
        "a3-megagpu-8g",
        "--nodes",
        "3",
        "--name",
        "gsync",
        "--gcp-project",
        "proj-1",
        "--project-dir",
        str(tmp_path),
    )
    assert made.exit_code == 0, made.stderr
    spec = read_stack_spec(tmp_path, "gsync")
    group = node_prefix(spec)
    vms = [(f"{group}-a1", "RUNNING"), (f"{group}-b2", "RUNNING"), (f"{group}-c3", "STOPPING")]
    cloud = GcpStandIn("proj-1", spec.zone, group, vms, "gsync-bucket-1", "gsync")
    cloud.stale_fingerprint_once.add(f"{group}-a1")  # a concurrent metadata change: 412, read again
    clock.on_wait.append(cloud.node_side([f"{group}-a1"]))
    try:
        options = {"api_endpoint": cloud.url}
        creds = AnonymousCredentials()
        clients = teardown.CloudClients(
            groups=compute_v1.InstanceGroupManagersClient(credentials=creds, client_options=options),
            instances=compute_v1.InstancesClient(credentials=creds, client_options=options),
            storage=storage.Client(project="proj-1", credentials=creds, client_options=options),
        )
        monkeypatch.setattr(teardown, "make_clients", lambda spec: clients)
        monkeypatch.setattr(lifecycle, "check_credentials", lambda cloud: None)
        backend = FakeBackend(deployed={"gsync"}, outputs={"bucket_name": "gsync-bucket-1"})
        _use(monkeypatch, backend)
        result = run_cli("down", "gsync", "--sync-timeout-seconds", "40", "--project-dir", str(tmp_path))
    finally:
        cloud.close()
    assert result.exit_code == 0, result.stderr
    request = cloud.attribute(f"{group}-a1")
    assert request.startswith("down-") and cloud.attribute(f"{group}-b2") == request
    assert cloud.attribute(f"{group}-c3") is None  # not running: not asked
    assert {"key": "startup-script", "value": "#!"} in cloud.vms[f"{group}-a1"]["items"]  # other metadata kept
    assert f"sync {group}-a1: complete, 2 file(s) uploaded" in result.stdout
    assert f"sync {group}-b2: no ack within 40 s" in result.stdout
    assert backend.calls[-1] == ("destroy", "gsync")


def test_gcp_down_of_a_stack_whose_mig_is_gone_asks_nobody(run_cli, tmp_path, clock, monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    made = run_cli(
        "new",
        "--instance-type",
        "a3-megagpu-8g",
        "--nodes",
        "1",
        "--name",
        "gnone",
        "--gcp-project",
        "proj-1",
        "--project-dir",
        str(tmp_path),
    )
    assert made.exit_code == 0, made.stderr
    cloud = GcpStandIn("proj-1", "none", "none", [], "gnone-bucket", "gnone")  # every compute path is 404
    try:
        options = {"api_endpoint": cloud.url}
        clients = teardown.CloudClients(
            groups=compute_v1.InstanceGroupManagersClient(credentials=AnonymousCredentials(), client_options=options)
        )
        monkeypatch.setattr(teardown, "make_clients", lambda spec: clients)
        monkeypatch.setattr(lifecycle, "check_credentials", lambda cloud: None)
        backend = FakeBackend(deployed={"gnone"}, outputs={"bucket_name": "gnone-bucket"})
        _use(monkeypatch, backend)
        result = run_cli("down", "gnone", "--project-dir", str(tmp_path))
    finally:
        cloud.close()
    assert result.exit_code == 0, result.stderr
    assert "sync: no running nodes: nothing to sync" in result.stdout and backend.calls[-1] == ("destroy", "gnone")


def test_gcp_delete_data_deletes_every_generation_of_the_labelled_buckets(run_cli, tmp_path, clock, monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1, storage

    made = run_cli(
        "new",
        "--instance-type",
        "a3-megagpu-8g",
        "--nodes",
        "1",
        "--name",
        "gdel",
        "--gcp-project",
        "proj-1",
        "--project-dir",
        str(tmp_path),
    )
    assert made.exit_code == 0, made.stderr
    before = (tmp_path / "stacks" / "Pulumi.gdel.yaml").read_text()
    cloud = GcpStandIn("proj-1", "none", "none", [], "unused", "gdel")
    cloud.kept["gdel-bucket-old"] = {
        "labels": {"gpuinfra-stack": "gdel", "gpuinfra-stack-id": _stack_id(tmp_path, "gdel")},
        "versions": {("ckpt/a.pt", 1), ("ckpt/a.pt", 2)},
    }
    cloud.kept["other-bucket"] = {"labels": {"gpuinfra-stack": "gdel2"}, "versions": {("x", 1)}}
    # a stack gdel of another project folder in the same project: its own id, so its bucket stays
    cloud.kept["twin-bucket"] = {
        "labels": {"gpuinfra-stack": "gdel", "gpuinfra-stack-id": "gdel-zz9zz9"},
        "versions": {("y", 1)},
    }
    try:
        options = {"api_endpoint": cloud.url}
        creds = AnonymousCredentials()
        clients = teardown.CloudClients(
            groups=compute_v1.InstanceGroupManagersClient(credentials=creds, client_options=options),
            storage=storage.Client(project="proj-1", credentials=creds, client_options=options),
        )
        monkeypatch.setattr(teardown, "make_clients", lambda spec: clients)
        monkeypatch.setattr(lifecycle, "check_credentials", lambda cloud: None)
        backend = FakeBackend(deployed=set())  # a plain `down` already destroyed the resources
        _use(monkeypatch, backend)
        result = run_cli("down", "gdel", "--delete-data", "--yes", "--project-dir", str(tmp_path))
    finally:
        cloud.close()
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "deleted bucket gdel-bucket-old and its 2 object version(s)" in result.stdout
    assert list(cloud.kept) == ["other-bucket", "twin-bucket"]  # another stack's buckets stay
    assert not [c for c in backend.calls if c[0] in ("up", "destroy")]
    assert (tmp_path / "stacks" / "Pulumi.gdel.yaml").read_text() == before


def test_request_ids_match_the_documented_pattern():
    assert teardown.new_request_id("down", 1764158400) == "down-1764158400"
    assert re.fullmatch(SYNC_REQUEST_ID_PATTERN, teardown.new_request_id("reap"))
    with pytest.raises(Exception, match="does not match"):
        teardown.new_request_id("Down_X")


def test_the_gcp_project_comes_from_the_instance_group_output_when_the_stack_file_has_none(run_cli, tmp_path):
    from gpuinfra.stackfile import read_stack_spec

    made = run_cli(
        "new", "--instance-type", "a3-megagpu-8g", "--name", "gp", "--gcp-project", "proj-1",
        "--project-dir", str(tmp_path),
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    spec = read_stack_spec(tmp_path, "gp").model_copy(update={"gcp_project": None})
    group = "https://www.googleapis.com/compute/v1/projects/proj-9/zones/us-central1-a/instanceGroups/gp-node"
    assert teardown.with_gcp_project(spec, {"instance_group": group}).gcp_project == "proj-9"
    assert teardown.with_gcp_project(spec, {}).gcp_project is None


def test_a_bucket_deletion_that_fails_half_way_is_finished_by_running_it_again(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("half")
    _versioned_bucket(s3, "gpuinfra-half-b1", "half", _stack_id(project, "half"))

    class RefusesOnce:
        """S3 answering the first DeleteObjects with a per-key error (HTTP 200, ``Errors``)."""

        def __init__(self, real):
            self.real, self.refused = real, False

        def delete_objects(self, **kwargs):
            if not self.refused:
                self.refused = True
                key = kwargs["Delete"]["Objects"][0]["Key"]
                return {
                    "Errors": [{"Key": key, "Code": "InternalError", "Message": "We encountered an internal error"}]
                }
            return self.real.delete_objects(**kwargs)

        def __getattr__(self, name):
            return getattr(self.real, name)

    flaky = RefusesOnce(s3)
    monkeypatch.setattr(teardown, "make_clients", lambda spec: teardown.CloudClients(ec2=ec2, s3=flaky))
    backend = FakeBackend(deployed={"half"}, outputs={"bucket_name": "gpuinfra-half-b1"})
    _use(monkeypatch, backend)
    first = run_cli("down", "half", "--delete-data", "--yes", "--project-dir", str(project))
    assert first.exit_code == 7 and "deleting bucket gpuinfra-half-b1: 1 object(s) not deleted" in first.stderr
    assert "gpuinfra-half-b1" in _buckets(s3) and ("destroy", "half") in backend.calls  # the cluster is gone already
    again = run_cli("down", "half", "--delete-data", "--yes", "--project-dir", str(project))
    assert again.exit_code == 0, again.stderr
    assert "nothing to destroy" in again.stdout and "gpuinfra-half-b1" not in _buckets(s3)


FLEET_URN = "urn:pulumi:late2::gpuinfra::gpuinfra:aws:GpuCluster$aws:ec2/fleet:Fleet::late2-fleet"
SCHEDULE_URN = "urn:pulumi:late2::gpuinfra::gpuinfra:aws:GpuCluster$aws:scheduler/schedule:Schedule::late2-ttl-backstop"
PG_URN = "urn:pulumi:late2::gpuinfra::gpuinfra:aws:GpuCluster$aws:ec2/placementGroup:PlacementGroup::late2-pg"
# What the engine prints when DeleteFleets fails on an instant fleet the backstop deleted while
# DescribeFleets still says active (the provider ignores only InvalidFleetId.NotFound).
FLEET_GONE_OUTPUT = (
    "Diagnostics:\n  aws:ec2:Fleet (late2-fleet):\n    error: deleting EC2 Fleet (fleet-0123): "
    "fleetNotInDeletableState: The fleet is not in a deletable state\n\nResources:\n    3 unchanged\n"
)


class FleetAlreadyDeleted(PlacementGroupBackend):
    """A state holding the fleet the backstop deleted: every destroy fails on it until ``forget``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.state = [FLEET_URN, SCHEDULE_URN, PG_URN]

    def destroy(self, project_dir, stack, on_event):
        if FLEET_URN in self.state:
            self.calls.append(("destroy", stack))
            raise OperationError(f"pulumi failed on stack {stack!r}: {FLEET_GONE_OUTPUT.splitlines()[2].strip()}")
        return super().destroy(project_dir, stack, on_event)

    def forget(self, project_dir, stack, type_token):
        self.calls.append(("forget", type_token))
        gone = [u for u in self.state if f"${type_token}::" in u]
        self.state = [u for u in self.state if u not in gone]
        return gone


def test_down_after_the_backstop_drops_a_fleet_ec2_will_not_delete_again(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("late2")
    ids = _launch(ec2, "late2", 2)
    ec2.terminate_instances(InstanceIds=ids)  # the backstop's DeleteFleets ended them
    backend = FleetAlreadyDeleted(ec2, ids, clock, {"stack": "late2", "bucket_name": "b", "instance_ids": ids})
    _use(monkeypatch, backend)
    result = run_cli("down", "late2", "--project-dir", str(project))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert backend.calls[-3:] == [("destroy", "late2"), ("forget", "aws:ec2/fleet:Fleet"), ("destroy", "late2")]
    assert (
        "and its nodes are terminated: dropped late2-fleet from the Pulumi state; destroying the rest" in result.stdout
    )


def test_a_fleet_that_fails_to_delete_while_a_node_runs_is_never_dropped(run_cli, aws, clock, monkeypatch):
    new, ec2, s3 = aws
    project = new("late3")
    ids = _launch(ec2, "late3", 1)
    slow = SlowShutdown(ec2, clock, 10**9)  # EC2 never reports it terminated
    monkeypatch.setattr(teardown, "make_clients", lambda spec: teardown.CloudClients(ec2=slow, s3=s3))
    backend = FleetAlreadyDeleted(slow, ids, clock, {"stack": "late3", "instance_ids": ids})
    _use(monkeypatch, backend)
    result = run_cli("down", "late3", "--sync-timeout-seconds", "0", "--project-dir", str(project))
    assert result.exit_code == 7 and "deleting EC2 Fleet (fleet-0123)" in result.stderr
    assert ("forget", "aws:ec2/fleet:Fleet") not in backend.calls  # a node may still bill: keep it in the state


def test_forget_drops_the_fleet_and_every_reference_to_it_through_export_and_import(monkeypatch, tmp_path):
    import shutil

    from pulumi import automation as auto
    from pulumi.automation._cmd import CommandResult

    exported = {
        "manifest": {"time": "t"},
        "resources": [
            {"urn": PG_URN, "type": "aws:ec2/placementGroup:PlacementGroup"},
            {"urn": FLEET_URN, "type": "aws:ec2/fleet:Fleet", "dependencies": [PG_URN]},
            {
                "urn": SCHEDULE_URN,
                "type": "aws:scheduler/schedule:Schedule",
                "dependencies": [FLEET_URN, PG_URN],
                "propertyDependencies": {"target": [FLEET_URN], "description": []},
                "deletedWith": FLEET_URN,
            },
        ],
    }
    imported = []

    class _Stack:
        def export_stack(self):
            return auto.Deployment(version=3, deployment=exported)

        def import_stack(self, state):
            imported.append(state)

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/pulumi")
    monkeypatch.setattr(auto, "select_stack", lambda **kw: _Stack())
    assert lifecycle.PulumiAutomation().forget(tmp_path, "late2", "aws:ec2/fleet:Fleet") == [FLEET_URN]
    (state,) = imported
    assert state.version == 3 and state.deployment["manifest"] == {"time": "t"}
    urns = json.dumps(state.deployment["resources"])
    assert FLEET_URN not in urns and urns.count(PG_URN) == 2  # the group itself and the schedule's dependency
    assert [r["urn"] for r in exported["resources"]] == [PG_URN, FLEET_URN, SCHEDULE_URN]  # the export untouched

    failed = auto.CommandError(CommandResult(FLEET_GONE_OUTPUT, "error: destroy failed", 255))
    with pytest.raises(OperationError, match=r"deleting EC2 Fleet \(fleet-0123\): fleetNotInDeletableState"):
        lifecycle._run(lambda: (_ for _ in ()).throw(failed), "late2")
