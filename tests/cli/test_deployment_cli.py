"""Every ``gpuinfra up`` that creates the nodes gives the stack a new deployment id (in the stack
file, where the program reads it; on the nodes' node.env and tags), and ``down`` ends what an
interrupted ``up`` left of its deployment. The Automation API is replaced at its boundary (the
recording fake of test_lifecycle_cli); EC2 is moto on 127.0.0.1."""

from __future__ import annotations

import boto3
import pytest
import yaml

from gpuinfra.plan.boot_aws import aws_node_boot
from gpuinfra.plan.cluster import cloud_plan
from gpuinfra.plan.tags import aws_tags
from gpuinfra.stackfile import read_stack_spec
from tests.cli.test_lifecycle_cli import FakeBackend, _use

FLEET = [("aws:ec2/fleet:Fleet", "train-fleet")]


@pytest.fixture
def project(run_cli, tmp_path, monkeypatch):
    """A project with the 2 x p4d.24xlarge stack ``train`` (as test_lifecycle_cli's)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    args = ("new", "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "train")
    assert run_cli(*args, "--project-dir", str(tmp_path)).exit_code == 0
    return tmp_path


def deployment(project):
    return read_stack_spec(project, "train").deployment_id


def test_up_replace_nodes_and_down_then_up_each_start_a_new_deployment(run_cli, project, monkeypatch):
    backend = FakeBackend()
    _use(monkeypatch, backend)
    assert deployment(project) is None  # `new` writes none: no nodes yet
    assert run_cli("up", "train", "--project-dir", str(project)).exit_code == 0
    first = deployment(project)
    assert first and len(first) == 12
    # an update that leaves the nodes alone keeps their deployment
    assert run_cli("up", "train", "--project-dir", str(project)).exit_code == 0
    assert deployment(project) == first
    # an update that replaces them is a new deployment
    backend.replaced = FLEET
    assert run_cli("up", "train", "--replace-nodes", "--project-dir", str(project)).exit_code == 0
    second = deployment(project)
    assert second not in (None, first)
    # down, then up of the same stack file: another one
    backend.replaced = []
    assert run_cli("down", "train", "--project-dir", str(project)).exit_code == 0
    assert run_cli("up", "train", "--project-dir", str(project)).exit_code == 0
    third = deployment(project)
    assert third not in (None, first, second)
    # the nodes carry it: node.env, which scopes the health gate, and the tags peers are listed by
    spec = read_stack_spec(project, "train")
    boot = aws_node_boot(spec, cloud_plan(spec), "bkt")
    node_env = next(f.content for f in boot.all_files() if f.path == "/etc/gpuinfra/node.env")
    assert f"GPUINFRA_DEPLOYMENT={third}\n" in node_env
    assert aws_tags(spec)["gpuinfra:deployment"] == third


def test_a_refused_update_keeps_the_deployment(run_cli, project, monkeypatch):
    backend = FakeBackend()
    _use(monkeypatch, backend)
    assert run_cli("up", "train", "--project-dir", str(project)).exit_code == 0
    first = deployment(project)
    backend.replaced = FLEET
    assert run_cli("up", "train", "--project-dir", str(project)).exit_code == 2
    assert deployment(project) == first


@pytest.fixture
def ec2(moto_url, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", moto_url)
    return boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_url)


def _launch(ec2, tags):
    image = ec2.describe_images()["Images"][0]["ImageId"]
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    answer = ec2.run_instances(
        ImageId=image, MinCount=1, MaxCount=1, InstanceType="p4d.24xlarge", TagSpecifications=spec
    )
    return answer["Instances"][0]["InstanceId"]


def _state(ec2, instance_id):
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"]["Name"]


def test_down_ends_the_fleet_an_interrupted_up_left_and_nothing_else(run_cli, project, monkeypatch, ec2):
    """An interrupted ``up`` created a fleet Pulumi never recorded; its instances carry the
    stack's tags and deployment. ``down`` destroys the stack and then terminates them. A
    same-named stack of another checkout (another deployment) and another stack run on."""
    backend = FakeBackend()
    _use(monkeypatch, backend, ec2)
    assert run_cli("up", "train", "--project-dir", str(project)).exit_code == 0
    mine = deployment(project)
    orphan = _launch(ec2, {"gpuinfra:stack": "train", "gpuinfra:deployment": mine})
    colleague = _launch(ec2, {"gpuinfra:stack": "train", "gpuinfra:deployment": "0c0c0c0c0c0c"})
    other = _launch(ec2, {"gpuinfra:stack": "dev", "gpuinfra:deployment": mine})
    result = run_cli("down", "train", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert backend.calls[-1] == ("destroy", "train")
    assert f"ended 1 instance(s) of deployment {mine}" in result.stdout and orphan in result.stdout
    assert _state(ec2, orphan) in ("shutting-down", "terminated")
    assert _state(ec2, colleague) == "running" and _state(ec2, other) == "running"


def test_up_replace_nodes_ends_what_the_replaced_deployment_left(run_cli, project, monkeypatch, ec2):
    backend = FakeBackend()
    _use(monkeypatch, backend, ec2)
    assert run_cli("up", "train", "--project-dir", str(project)).exit_code == 0
    old = deployment(project)
    orphan = _launch(ec2, {"gpuinfra:stack": "train", "gpuinfra:deployment": old})
    backend.replaced = FLEET
    assert run_cli("up", "train", "--replace-nodes", "--project-dir", str(project)).exit_code == 0
    assert _state(ec2, orphan) in ("shutting-down", "terminated")
    new = _launch(ec2, {"gpuinfra:stack": "train", "gpuinfra:deployment": deployment(project)})
    assert _state(ec2, new) == "running"


def test_a_failed_ec2_listing_in_down_is_exit_7_with_what_to_check(run_cli, project, monkeypatch):
    from botocore.exceptions import EndpointConnectionError

    class Down:
        def get_paginator(self, name):
            raise EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com/")

    backend = FakeBackend()
    _use(monkeypatch, backend, Down())
    assert run_cli("up", "train", "--project-dir", str(project)).exit_code == 0
    result = run_cli("down", "train", "--project-dir", str(project))
    assert result.exit_code == 7 and ("destroy", "train") in backend.calls
    assert "could not look for or end instances of stack 'train'" in result.stderr
    assert f"Name=tag:gpuinfra:deployment,Values={deployment(project)}" in result.stderr
    assert yaml.safe_load((project / "stacks" / "Pulumi.train.yaml").read_text())


def test_up_after_an_interrupted_up_is_a_new_deployment_and_ends_the_orphan(run_cli, project, monkeypatch, ec2):
    """The first ``up`` was killed after EC2 created the fleet and before Pulumi recorded it: the
    state holds a pending create of the fleet, the cloud its running instances. The next ``up``
    creates the fleet as a new deployment (its nodes never list the orphan as peers) and then
    terminates the orphan's instances."""
    backend = FakeBackend()
    _use(monkeypatch, backend, ec2)
    assert run_cli("up", "train", "--project-dir", str(project)).exit_code == 0
    interrupted = deployment(project)
    orphan = _launch(ec2, {"gpuinfra:stack": "train", "gpuinfra:deployment": interrupted})
    backend.pending = FLEET
    result = run_cli("up", "train", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert deployment(project) not in (None, interrupted)
    assert _state(ec2, orphan) in ("shutting-down", "terminated")


def test_pending_creates_are_read_from_the_exported_checkpoint(monkeypatch, tmp_path):
    """The Automation API's ``export_stack()`` checkpoint after an interrupted ``up``:
    ``pending_operations`` with the resource and the operation (Pulumi's apitype OperationV2)."""
    import shutil

    from pulumi import automation as auto

    from gpuinfra.lifecycle import PulumiAutomation

    urn = "urn:pulumi:train::gpuinfra::gpuinfra:aws:GpuCluster$aws:ec2/fleet:Fleet::train-fleet"
    checkpoint = {
        "manifest": {},
        "resources": [],
        "pending_operations": [
            {"resource": {"urn": urn, "type": "aws:ec2/fleet:Fleet", "custom": True}, "type": "creating"},
            {"resource": {"urn": urn.replace("train-fleet", "train-lt"), "type": "x:y:Z"}, "type": "updating"},
        ],
    }

    class _Stack:
        def export_stack(self):
            return auto.Deployment(version=3, deployment=checkpoint)

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/pulumi")
    monkeypatch.setattr(auto, "select_stack", lambda **kw: _Stack())
    assert PulumiAutomation().pending_creates(tmp_path, "train") == [("aws:ec2/fleet:Fleet", "train-fleet")]


def test_reap_ends_the_orphan_of_an_expired_stack_too(run_cli, project, monkeypatch, ec2):
    backend = FakeBackend()
    _use(monkeypatch, backend, ec2)
    assert run_cli("up", "train", "--project-dir", str(project)).exit_code == 0
    orphan = _launch(ec2, {"gpuinfra:stack": "train", "gpuinfra:deployment": deployment(project)})
    path = project / "stacks" / "Pulumi.train.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["created_at"] = "2026-01-01T00:00:00Z"  # long expired
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run_cli("reap", "--expired", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert ("destroy", "train") in backend.calls and _state(ec2, orphan) in ("shutting-down", "terminated")
