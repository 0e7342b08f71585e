"""`up --capacity-timeout` on a GCP stack: bounds checked before anything runs, passed to the
Pulumi program through the stack file (``gpuinfra:capacity_timeout_seconds``), and a bulk
insert's classified failure ends `up` with its exit code and nothing left (the Automation API
replaced at its boundary by a recording fake)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import yaml

from gpuinfra import lifecycle
from gpuinfra.errors import CapacityError
from gpuinfra.launch_errors import GcpError, gcp_launch_error
from gpuinfra.lifecycle import StackStatus
from gpuinfra.plan.formation import DEFAULT_CAPACITY_TIMEOUT_SECONDS


class RecordingBackend:
    """Records calls; ``up`` reads the timeout the program would read, then raises ``fail``."""

    def __init__(self, project, fail_text=None):
        self.project, self.fail_text, self.calls, self.timeouts = project, fail_text, [], []
        self.deployed: set[str] = set()

    def list_stacks(self, project_dir):
        return [StackStatus(n, False, datetime.now(UTC) - timedelta(hours=1), 30) for n in sorted(self.deployed)]

    def up(self, project_dir, stack, on_event):
        self.calls.append("up")
        doc = yaml.safe_load((self.project / "stacks" / f"Pulumi.{stack}.yaml").read_text())
        self.timeouts.append(doc["config"].get("gpuinfra:capacity_timeout_seconds"))
        if self.fail_text:  # the Automation API's error, read as the real backend reads it
            from pulumi import automation as auto

            def failed():
                raise auto.CommandError(auto.CommandResult(stdout="", stderr=self.fail_text, code=255))

            return lifecycle._run(failed, stack)
        self.deployed.add(stack)
        return {"create": 20}

    def replacements(self, project_dir, stack):
        return []

    def outputs(self, project_dir, stack):
        return {"bucket_name": "b", "bulk_instance_names": [f"{stack}-n000"]}

    def pending_creates(self, project_dir, stack):
        return []

    def destroy(self, project_dir, stack, on_event):
        self.calls.append("destroy")
        self.deployed.discard(stack)
        return {"delete": 20}


@pytest.fixture
def gcp_project(run_cli, tmp_path, monkeypatch):
    result = run_cli(
        "new", "--instance-type", "a2-highgpu-8g", "--nodes", "2", "--cloud", "gcp", "--spot",
        "--name", "train", "--project-dir", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    monkeypatch.setattr(lifecycle, "check_credentials", lambda cloud: None)
    monkeypatch.setattr(lifecycle, "run_preflight", lambda spec: [])
    return tmp_path


def _use(monkeypatch, backend):
    monkeypatch.setattr(lifecycle, "make_backend", lambda: backend)


@pytest.mark.parametrize("seconds", ["59", "86401", "0"])
def test_a_capacity_timeout_out_of_bounds_is_refused_before_anything_runs(run_cli, gcp_project, monkeypatch, seconds):
    backend = RecordingBackend(gcp_project)
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--capacity-timeout", seconds, "--project-dir", str(gcp_project))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "--capacity-timeout" in result.stderr and "Traceback" not in result.stderr
    assert backend.calls == []


def test_the_capacity_timeout_reaches_the_program_and_defaults_when_not_given(run_cli, gcp_project, monkeypatch):
    backend = RecordingBackend(gcp_project)
    _use(monkeypatch, backend)
    assert run_cli("up", "train", "--capacity-timeout", "120", "--project-dir", str(gcp_project)).exit_code == 0
    assert run_cli("up", "train", "--project-dir", str(gcp_project)).exit_code == 0
    assert backend.timeouts == [120, DEFAULT_CAPACITY_TIMEOUT_SECONDS]


@pytest.mark.parametrize(
    ("code", "exit_code"),
    [("ZONE_RESOURCE_POOL_EXHAUSTED", 7), ("QUOTA_EXCEEDED", 9), ("INVALID_FIELD_VALUE", 10)],
)
def test_a_failed_bulk_insert_ends_up_with_its_class_and_destroys_the_new_stack(
    run_cli, gcp_project, monkeypatch, code, exit_code
):
    error = gcp_launch_error([GcpError(code, "stand-in")], 1, 2, "a2-highgpu-8g", "us-central1-a", "us-central1")
    # the engine's report of a dynamic provider whose create raised: the marker line is what `up` reads
    text = (
        f"error: update failed\n  train-bulk (pulumi-python:dynamic/gcp:BulkInsert):\n    error: Exception: {error}\n"
    )
    backend = RecordingBackend(gcp_project, fail_text=text)
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--capacity-timeout", "60", "--project-dir", str(gcp_project))
    assert result.exit_code == exit_code, result.stderr
    assert backend.calls == ["up", "destroy"]
    assert code in result.stderr and result.stderr.count("\n") == 1


def test_run_checks_the_capacity_timeout_before_it_writes_or_starts_anything(run_cli, tmp_path, monkeypatch):
    backend = RecordingBackend(tmp_path)
    _use(monkeypatch, backend)
    result = run_cli(
        "run", "--gpus", "8xA100", "--cloud", "gcp", "--name", "job", "--capacity-timeout", "30",
        "--project-dir", str(tmp_path), "--", "python", "train.py",
    )  # fmt: skip
    assert result.exit_code == 2 and "--capacity-timeout 30" in result.stderr
    assert not (tmp_path / "stacks").exists() and backend.calls == []


def test_up_fallback_passes_the_timeout_to_each_rung_and_a_bulk_stockout_moves_on(run_cli, tmp_path, monkeypatch):
    from gpuinfra.services import ladder

    made = run_cli(
        "new", "--gpus", "8xA100", "--nodes", "2", "--cloud", "gcp", "--spot", "--name", "lad", "--fallback", "1",
        "--project-dir", str(tmp_path),
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    monkeypatch.setattr(ladder, "check_credentials", lambda cloud: None)
    monkeypatch.setattr(ladder, "run_preflight", lambda spec: [])
    stockout = gcp_launch_error(
        [GcpError("ZONE_RESOURCE_POOL_EXHAUSTED", "stand-in")], 1, 2, "a2-highgpu-8g", "us-central1-a", "us-central1"
    )
    text = f"error: update failed\n    error: Exception: {stockout}\n"

    class FirstRungOut(RecordingBackend):
        def up(self, project_dir, stack, on_event):
            self.fail_text = text if stack == "lad" else None
            return super().up(project_dir, stack, on_event)

    backend = FirstRungOut(tmp_path)
    _use(monkeypatch, backend)
    result = run_cli("up", "lad", "--fallback", "--capacity-timeout", "300", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert backend.calls == ["up", "destroy", "up"] and backend.deployed == {"lad-fb1"}
    assert backend.timeouts == [300, 300]  # each rung's program got the bound
    assert "formed rung 1: lad-fb1" in result.stdout and "ZONE_RESOURCE_POOL_EXHAUSTED" in result.stdout


def test_up_refuses_a_stack_deployed_with_its_nodes_in_the_group(run_cli, gcp_project, monkeypatch):
    """Deployed by an earlier gpuinfra (MIG at size N, no bulk insert): an `up` would add the bulk
    insert's N nodes next to the group's N, so it refuses before Pulumi runs."""
    backend = RecordingBackend(gcp_project)
    backend.deployed.add("train")
    backend.outputs = lambda project_dir, stack: {"bucket_name": "b", "instance_group": "g"}
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--project-dir", str(gcp_project))
    assert result.exit_code == 2 and "gpuinfra down train" in result.stderr
    assert backend.calls == []
    backend.outputs = lambda project_dir, stack: {"bucket_name": "b", "bulk_instance_names": ["x"]}
    assert run_cli("up", "train", "--project-dir", str(gcp_project)).exit_code == 0
    assert backend.calls == ["up"]


def test_up_retries_a_bulk_stack_whose_first_up_never_finished(run_cli, gcp_project, monkeypatch):
    """A first `up` that was interrupted (or failed other than on a launch) leaves resources but no
    outputs at all, as the program never completed: that is no earlier gpuinfra's stack, and `up`
    must try again (creating the bulk insert then), not send the user to `down`."""
    backend = RecordingBackend(gcp_project)
    backend.deployed.add("train")
    backend.outputs = lambda project_dir, stack: {}
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--project-dir", str(gcp_project))
    assert result.exit_code == 0, result.stderr
    assert backend.calls == ["up"]


def test_a_failed_bulk_insert_that_left_vms_does_not_claim_nothing_bills(run_cli, gcp_project, monkeypatch):
    """The provider could not delete every VM it made within its bound and names them: `up`
    destroys the new stack as usual, but must not say that nothing bills; it points to `down`,
    which deletes VMs under the stack's bulk-insert names."""
    from blueprints.gcp import bulk_insert

    class Clients:
        def __init__(self):
            self.instances, self.operations = self, self

        def get(self, **kwargs):  # every VM exists, and keeps existing
            return object()

        def delete_unary(self, **kwargs):
            return None

        def bulk_insert_unary(self, **kwargs):  # made both VMs, then ran out of capacity
            from google.cloud import compute_v1

            error = compute_v1.Errors(code="ZONE_RESOURCE_POOL_EXHAUSTED", message="x")
            return compute_v1.Operation(status=compute_v1.Operation.Status.DONE, error=compute_v1.Error(errors=[error]))

    with pytest.raises(CapacityError) as raised:
        bulk_insert.form(
            Clients(),
            {"project": "p", "zone": "z", "region": "r", "template": "t", "names": ["a", "b"], "count": 2,
             "min_count": 2, "machine_type": "a2-highgpu-8g", "capacity_timeout_seconds": 60},
            poll_seconds=0, delete_wait_seconds=0,
        )  # fmt: skip
    text = f"error: update failed\n    error: Exception: {raised.value}\n"
    backend = RecordingBackend(gcp_project, fail_text=text)
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--project-dir", str(gcp_project))
    assert result.exit_code == 7, result.stderr
    assert backend.calls == ["up", "destroy"]
    assert "nothing bills" not in result.stderr and "gpuinfra down train" in result.stderr
    assert result.stderr.count("\n") == 1
