"""`gpuinfra run` / `logs` / `jobs` / `cancel` with the Automation API replaced at its boundary
(the recording fake of the lifecycle tests) and the stack bucket in moto S3 on 127.0.0.1; the
nodes are played by writing what :mod:`gpuinfra.agent.job` writes (status, log chunks, final)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
import yaml

from gpuinfra.agent.job import JobSpec, final_key, log_key, spec_key, status_key
from gpuinfra.services import jobs
from gpuinfra.services import run as run_service
from tests.cli.test_lifecycle_cli import FakeBackend, _use, project  # noqa: F401  (fixture)

BUCKET = "gpuinfra-train-abc"


@pytest.fixture
def s3(moto_url, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # moto's: the fixture works whatever ran before
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_url)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=o["Key"])
    client.delete_bucket(Bucket=BUCKET)


def put(s3, key, body):
    s3.put_object(Bucket=BUCKET, Key=key, Body=body.encode())


def nodes_finish(s3, monkeypatch, exit_codes=(0, 0), restarts=()):
    """Once the spec is submitted, both nodes 'run' it: logs, status, final (what the job unit writes)."""
    submit = jobs.submit
    seen = {}

    def submit_and_run(store, stack, spec):
        submit(store, stack, spec)
        seen["spec"] = spec
        for rank, code in enumerate(exit_codes):
            part = f"rank-{rank}"
            put(s3, log_key(stack, spec.id, part, 0), f"[{part}] step=10 loss=0.25\n[{part}] done\n")
            state = "succeeded" if code == 0 else "failed"
            doc = {
                "state": state,
                "exit_code": code,
                "restarts": list(restarts) if rank == 0 else [],
                "progress": {"step": 10},
            }
            put(s3, status_key(stack, spec.id, part), json.dumps(doc))
        put(s3, final_key(stack, spec.id), json.dumps({"state": "succeeded" if not any(exit_codes) else "failed"}))

    monkeypatch.setattr(jobs, "submit", submit_and_run)
    monkeypatch.setattr(run_service, "wait_for_health", lambda *a, **k: None)
    return seen


def test_run_submits_streams_rank_prefixed_logs_prints_where_data_is_and_downs(run_cli, project, monkeypatch, s3):  # noqa: F811
    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    seen = nodes_finish(s3, monkeypatch)
    result = run_cli(
        "run", "train", "--project-dir", str(project), "-e", "SEED=1", "--", "python", "train.py", "--lr", "3e-4"
    )
    assert result.exit_code == 0, result.stderr
    spec = JobSpec.from_json(s3.get_object(Bucket=BUCKET, Key=spec_key("train"))["Body"].read().decode())
    assert spec.argv == ("python", "train.py", "--lr", "3e-4") and spec.env == {"SEED": "1"} and spec == seen["spec"]
    for line in (
        "[rank-0] step=10 loss=0.25",
        "[rank-1] done",
        f"job {spec.id} succeeded, exit status 0, 0 restart(s)",
    ):
        assert line in result.stdout
    assert f"checkpoints: s3://{BUCKET}/checkpoints/train/" in result.stdout
    assert f"outputs: s3://{BUCKET}/jobs/train/{spec.id}/outputs/" in result.stdout
    assert "cluster: destroyed, bucket kept" in result.stdout
    assert ("destroy", "train") in backend.calls and ("up", "train") not in backend.calls
    assert f"job {spec.id} succeeded: 0/" in result.stderr  # the status line, on stderr


class NotUpYet(FakeBackend):
    """A backend whose stacks have outputs (the bucket) only once they are up."""

    def outputs(self, project_dir, stack):
        self.calls.append(("outputs", stack))
        return {"bucket_name": BUCKET} if stack in self.deployed else {}


def test_run_brings_a_stack_that_is_not_up_up_first(run_cli, project, monkeypatch, s3):  # noqa: F811
    backend = NotUpYet()
    _use(monkeypatch, backend)
    nodes_finish(s3, monkeypatch)
    result = run_cli("run", "train", "--keep", "--project-dir", str(project), "--", "python", "train.py")
    assert result.exit_code == 0, result.stderr
    assert backend.calls.index(("up", "train")) < len(backend.calls) - 1
    assert ("destroy", "train") not in backend.calls and "cluster: kept (--keep)" in result.stdout


def test_a_failed_job_exits_7_after_down_with_its_restarts(run_cli, project, monkeypatch, s3):  # noqa: F811
    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    restart = {"at": "2026-11-27T04:00:00+00:00", "cause": "exit status 1", "step": 5}
    nodes_finish(s3, monkeypatch, exit_codes=(0, 1), restarts=[restart])
    result = run_cli("run", "train", "--project-dir", str(project), "--json", "--", "python", "train.py")
    assert result.exit_code == 7
    doc = json.loads(result.stdout)
    assert doc["state"] == "failed" and doc["exit_code"] == 1 and doc["destroyed"] is True
    assert doc["cost"].startswith("$") or doc["cost"] == "cost unknown (no catalog price)"
    assert doc["restarts"] == [{**restart, "part": "rank-0"}]
    assert result.stderr.strip().endswith(f"error: job {doc['job']} failed (exit status 1)")


def test_ctrl_c_detaches_and_leaves_the_cluster_running(run_cli, project, monkeypatch, s3):  # noqa: F811
    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    monkeypatch.setattr(run_service, "wait_for_health", lambda *a, **k: None)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs, "read_view", interrupted)
    result = run_cli("run", "train", "--project-dir", str(project), "--", "python", "train.py")
    assert result.exit_code == 0, result.stderr
    assert "detached; job j-" in result.stdout and "`gpuinfra logs train -f`" in result.stdout
    assert ("destroy", "train") not in backend.calls
    assert s3.get_object(Bucket=BUCKET, Key=spec_key("train"))  # the job stays submitted


def test_bad_job_input_is_refused_before_anything_is_deployed(run_cli, project, monkeypatch, s3):  # noqa: F811
    backend = FakeBackend()
    _use(monkeypatch, backend)
    for args, message in [
        (["-e", "NOEQUALS"], "--env 'NOEQUALS': give KEY=VALUE"),
        (["--restart", "always"], "restart 'always' is not one of"),
        (["--min-nodes", "3"], "--min-nodes 3: the stack has 2 node(s)"),
        # the node may read only the stack's own names (/gpuinfra/<stack>/... in SSM Parameter Store)
        (["--secret", "TOKEN=/prod/token"], "--secret: secret '/prod/token': AWS names are /gpuinfra/train-"),
    ]:
        result = run_cli("run", "train", "--project-dir", str(project), *args, "--", "python", "train.py")
        assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert ("up", "train") not in backend.calls


def test_logs_jobs_and_cancel(run_cli, project, monkeypatch, s3):  # noqa: F811
    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    spec = JobSpec(id="j-20261127-040000-abc123", argv=("python", "train.py"))
    put(s3, spec_key("train"), spec.to_json())
    put(s3, log_key("train", spec.id, "rank-1", 0), "[rank-1] step=3 loss=1.0\n")
    put(s3, log_key("train", spec.id, "rank-0", 0), "[rank-0] step=3 loss=1.0\n")
    put(s3, status_key("train", spec.id, "rank-0"), json.dumps({"state": "running", "progress": {"step": 3}}))
    logs = run_cli("logs", "train", "--project-dir", str(project))
    assert logs.exit_code == 0 and logs.stdout == "[rank-0] step=3 loss=1.0\n[rank-1] step=3 loss=1.0\n"
    listed = run_cli("jobs", "train", "--project-dir", str(project), "--json")
    assert json.loads(listed.stdout)[0] | {"nodes": None} == {
        "job": spec.id,
        "argv": ["python", "train.py"],
        "state": "running",
        "exit_code": None,
        "submitted_at": "",
        "restarts": [],
        "restart_count": 0,
        "nodes": None,
    }
    monkeypatch.setattr(jobs, "CANCEL_WAIT_SECONDS", 0.05)  # the nodes never finish here
    monkeypatch.setattr(jobs, "CANCEL_POLL_SECONDS", 0.01)
    cancelled = run_cli("cancel", "train", "--project-dir", str(project))
    assert cancelled.exit_code == 0, cancelled.stderr
    after = JobSpec.from_json(s3.get_object(Bucket=BUCKET, Key=spec_key("train"))["Body"].read().decode())
    assert after.cancel is True and after.id == spec.id
    assert ("destroy", "train") in backend.calls


class DestroyRecorder(FakeBackend):
    """The recording fake that notes, at ``destroy``, whether the job's final object was there."""

    def __init__(self, s3, job_id, **kwargs):
        super().__init__(**kwargs)
        self.s3, self.job_id, self.final_at_destroy = s3, job_id, None

    def destroy(self, project_dir, stack, on_event):
        listed = self.s3.list_objects_v2(Bucket=BUCKET, Prefix=final_key(stack, self.job_id))
        self.final_at_destroy = bool(listed.get("Contents"))
        return super().destroy(project_dir, stack, on_event)


def _running_job(s3):
    spec = JobSpec(id="j-20261127-040000-abc123", argv=("python", "train.py"))
    put(s3, spec_key("train"), spec.to_json())
    put(s3, status_key("train", spec.id, "rank-0"), json.dumps({"state": "running"}))
    return spec


def test_cancel_waits_for_the_nodes_final_object_before_down(run_cli, project, monkeypatch, s3):  # noqa: F811
    spec = _running_job(s3)
    backend = DestroyRecorder(s3, spec.id, deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    monkeypatch.setattr(jobs, "CANCEL_POLL_SECONDS", 0.01)
    read_view, reads = jobs.read_view, []

    def node_ends_on_the_third_look(store, stack, job):
        reads.append(job.id)
        if len(reads) == 3:  # the node stopped the job, uploaded its outputs, then status and final
            put(s3, status_key("train", spec.id, "rank-0"), json.dumps({"state": "cancelled", "exit_code": 143}))
            put(s3, final_key("train", spec.id), json.dumps({"job": spec.id, "state": "cancelled"}))
        return read_view(store, stack, job)

    monkeypatch.setattr(jobs, "read_view", node_ends_on_the_third_look)
    result = run_cli("cancel", "train", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert backend.final_at_destroy is True
    assert f"waiting up to {jobs.CANCEL_WAIT_SECONDS} s for the nodes' final.json" in result.stdout
    assert "job over: cancelled" in result.stdout


def test_cancel_goes_on_to_down_after_its_bound_and_says_what_is_missing(run_cli, project, monkeypatch, s3):  # noqa: F811
    spec = _running_job(s3)
    backend = DestroyRecorder(s3, spec.id, deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    monkeypatch.setattr(jobs, "CANCEL_POLL_SECONDS", 0.01)
    monkeypatch.setattr(jobs, "CANCEL_WAIT_SECONDS", 0.05)
    result = run_cli("cancel", "train", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert "no final.json after 0.05 s (still running: rank-0)" in result.stdout
    assert ("destroy", "train") in backend.calls and backend.final_at_destroy is False


def test_cancel_without_a_job_says_so_and_leaves_the_stack_up(run_cli, project, monkeypatch, s3):  # noqa: F811
    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    result = run_cli("cancel", "train", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert "train: no job to cancel; the stack stays up (`gpuinfra down train` destroys it)" in result.stdout
    assert ("destroy", "train") not in backend.calls


def test_logs_of_a_stack_without_a_job_says_so(run_cli, project, monkeypatch, s3):  # noqa: F811
    _use(monkeypatch, FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET}))
    result = run_cli("logs", "train", "--project-dir", str(project))
    assert result.exit_code == 2 and "has no job: `gpuinfra run train -- CMD`" in result.stderr


def test_reap_job_over_destroys_a_stack_whose_job_is_over_and_keeps_a_running_one(run_cli, project, monkeypatch, s3):  # noqa: F811
    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    spec = JobSpec(id="j-20261127-040000-abc123", argv=("python", "train.py"))
    put(s3, spec_key("train"), spec.to_json())
    put(s3, status_key("train", spec.id, "rank-0"), json.dumps({"state": "running"}))
    running = run_cli("reap", "--job-over", "--project-dir", str(project))
    assert running.exit_code == 0, running.stderr
    assert "no deployed stack has expired or a job that is over" in running.stdout
    assert ("destroy", "train") not in backend.calls
    put(s3, status_key("train", spec.id, "rank-0"), json.dumps({"state": "succeeded", "exit_code": 0}))
    put(s3, final_key("train", spec.id), json.dumps({"state": "succeeded"}))
    dry = run_cli("reap", "--job-over", "--dry-run", "--project-dir", str(project))
    assert "would destroy train (job succeeded)" in dry.stdout and ("destroy", "train") not in backend.calls
    reaped = run_cli("reap", "--job-over", "--project-dir", str(project))
    assert reaped.exit_code == 0, reaped.stderr
    assert "destroying train (job succeeded); data kept" in reaped.stdout and ("destroy", "train") in backend.calls


def test_run_gpus_writes_the_stack_first_then_ups_and_runs_it(run_cli, tmp_path, monkeypatch, s3):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")

    backend = NotUpYet()
    _use(monkeypatch, backend)
    nodes_finish(s3, monkeypatch)
    args = ("--gpus", "4xA100", "--cloud", "aws", "--nodes", "2", "--name", "ft", "--project-dir", str(tmp_path))
    result = run_cli("run", *args, "--", "python", "train.py")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "stacks" / "Pulumi.ft.yaml").is_file()
    assert ("up", "ft") in backend.calls and ("destroy", "ft") in backend.calls
    spec = JobSpec.from_json(s3.get_object(Bucket=BUCKET, Key=spec_key("ft"))["Body"].read().decode())
    assert spec.argv == ("python", "train.py")
    # the stack exists now: new refuses to overwrite it (exit 5), nothing else runs
    again = run_cli("run", *args, "--", "python", "train.py")
    assert again.exit_code == 5 and backend.calls.count(("up", "ft")) == 1


def test_run_form_errors(run_cli, tmp_path):
    for args, message in [
        (["--gpus", "4xA100", "--", "python"], "--gpus needs --name NAME"),
        ([], "give STACK -- CMD, or --gpus SPEC --name NAME -- CMD"),
        (["train", "--nodes", "2", "--", "python"], "--nodes: only with --gpus"),
        (["train"], "no command: give it after `--`"),
    ]:
        result = run_cli("run", *args, "--project-dir", str(tmp_path))
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
    assert not (tmp_path / "stacks").exists()


@pytest.mark.parametrize("over", [True, False], ids=["previous-job-over", "previous-job-running"])
def test_second_job_on_a_deployment_is_refused(run_cli, project, monkeypatch, s3, over):  # noqa: F811
    # the nodes end themselves once a job is over, and a node that sees the spec change under its
    # running job stops that job as cancelled and ends too (gpuinfra/agent/job.py): a second job
    # written into either stack would never start and `run` would follow it forever
    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    monkeypatch.setattr(run_service, "wait_for_health", lambda *a, **k: None)

    def never_started(*a, **k):
        raise AssertionError("a job was submitted that no node will run")

    monkeypatch.setattr(jobs, "follow", never_started)
    old = JobSpec(id="j-20261127-040000-abc123", argv=("python", "train.py"))
    put(s3, spec_key("train"), old.to_json())
    put(s3, status_key("train", old.id, "rank-0"), json.dumps({"state": "succeeded" if over else "running"}))
    if over:
        put(s3, final_key("train", old.id), json.dumps({"state": "succeeded"}))
    result = run_cli("run", "train", "--project-dir", str(project), "--", "python", "train.py")
    assert result.exit_code == 2, result.stderr
    hint = "`gpuinfra down train`, then run again" if over else "`gpuinfra logs train -f`"
    assert f"job {old.id}" in result.stderr and hint in result.stderr and "Traceback" not in result.stderr
    assert JobSpec.from_json(s3.get_object(Bucket=BUCKET, Key=spec_key("train"))["Body"].read().decode()) == old
    assert ("destroy", "train") not in backend.calls


def test_reap_job_over_spares_a_new_deployment(run_cli, project, monkeypatch, s3):  # noqa: F811
    # the bucket outlives `down`: after `up` again, the previous deployment's finished job is still
    # the current spec; that deployment is gone, the new one has no job yet and must not be reaped
    from gpuinfra import lifecycle

    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    lifecycle.record_deployment(project, "train", "0123456789ab")
    old = JobSpec(id="j-20261127-040000-abc123", argv=("python", "train.py"), deployment="ba9876543210")
    put(s3, spec_key("train"), old.to_json())
    put(s3, status_key("train", old.id, "rank-0"), json.dumps({"state": "succeeded", "exit_code": 0}))
    put(s3, final_key("train", old.id), json.dumps({"state": "succeeded"}))
    result = run_cli("reap", "--job-over", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert "no deployed stack has expired or a job that is over" in result.stdout
    assert ("destroy", "train") not in backend.calls
    # the same job submitted to this deployment is over: reaped
    put(s3, spec_key("train"), JobSpec(id=old.id, argv=old.argv, deployment="0123456789ab").to_json())
    reaped = run_cli("reap", "--job-over", "--project-dir", str(project))
    assert reaped.exit_code == 0 and ("destroy", "train") in backend.calls, reaped.stderr


def test_the_runs_cost_counts_the_health_wait_the_nodes_billed_through(project, monkeypatch, s3):  # noqa: F811
    # the nodes bill from boot; a run that waited 50 min for the health verdict and trained 10 min
    # cost an hour of the cluster, not 10 minutes
    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET})
    _use(monkeypatch, backend)
    nodes_finish(s3, monkeypatch)
    now = [0.0]
    monkeypatch.setattr(run_service, "wait_for_health", lambda *a, **k: now.__setitem__(0, now[0] + 3000))

    def follow_10_minutes(*a, **k):
        now[0] += 600
        return jobs.read_view(run_service.jobs.store_for("aws", BUCKET), "train", k.get("spec") or a[2])

    monkeypatch.setattr(jobs, "follow", follow_10_minutes)
    monkeypatch.setattr(run_service, "hourly_usd", lambda spec: run_service.Decimal("10"))
    result = run_service.run(
        project, "train", {}, ["python", "train.py"], keep=True, say=print, on_line=print,
        on_status=print, on_event=print, clock=lambda: now[0], sleep=lambda s: None,
    )  # fmt: skip
    assert result.seconds == 3600 and result.cost == "$10.00"


def test_an_unreadable_final_object_is_one_message_not_a_traceback(run_cli, project, monkeypatch, s3):  # noqa: F811
    _use(monkeypatch, FakeBackend(deployed={"train"}, outputs={"bucket_name": BUCKET}))
    spec = JobSpec(id="j-20261127-040000-abc123", argv=("python", "train.py"))
    put(s3, spec_key("train"), spec.to_json())
    put(s3, final_key("train", spec.id), '{"state": "succ')  # cut short
    listed = run_cli("jobs", "train", "--project-dir", str(project))
    assert listed.exit_code == 2 and f"{final_key('train', spec.id)} is not JSON" in listed.stderr
    reaped = run_cli("reap", "--job-over", "--project-dir", str(project))
    assert reaped.exit_code == 0 and "train: job state unknown, not reaped" in reaped.stdout


@pytest.mark.parametrize("gate", ["enforce", "report"])
def test_a_failed_node_stops_the_run_only_when_the_gate_enforces(monkeypatch, gate):
    # docs/health-gate.md: with `report` the gate records and warns, and gpuinfra-run starts anyway
    from types import SimpleNamespace

    from gpuinfra.errors import HealthGateError

    failed = SimpleNamespace(
        passed=False,
        failed=("node-1",),
        nodes=("node-0", "node-1"),
        verdict=lambda: SimpleNamespace(reason="node-1 failed ECC"),
    )
    monkeypatch.setattr(run_service, "locate_results", lambda *a, **k: SimpleNamespace(expected_nodes=2))
    monkeypatch.setattr(run_service, "read_health", lambda location: failed)
    said = []
    call = lambda: run_service.wait_for_health(  # noqa: E731
        "train", None, "s3://b", said.append, 60, 1, gate=gate, clock=lambda: 0.0, sleep=lambda s: None
    )
    if gate == "enforce":
        with pytest.raises(HealthGateError, match="node-1 failed ECC"):
            call()
    else:
        call()
        assert said == ["health gate (report): node-1 failed ECC; the job is submitted anyway"]


def _sample(param, tmp_path):
    """A command-line value of the type of new's parameter (None: a bare flag)."""
    import typing

    kind = {a for a in typing.get_args(param.annotation) if a is not type(None)} or {param.annotation}
    (kind,) = kind
    if kind is bool:
        return None
    return {int: "2", float: "1.5", Path: str(tmp_path)}.get(kind, "x")


def test_run_gpus_accepts_every_option_of_new_and_hands_it_to_new(run_cli, tmp_path, monkeypatch):
    """Read from new's own signature: every option `gpuinfra new` has (but the ones run has itself,
    ``RUN_OWN``) is an option of `run`, and `run --gpus ... -- CMD` hands each one given to `new`."""
    import inspect

    from gpuinfra.cli import new as new_module
    from gpuinfra.cli import run as run_module

    new_params = inspect.signature(new_module.new, eval_str=True).parameters
    import typer

    from gpuinfra.cli import app

    # the flags of the command Typer builds from run's signature: what the command line accepts
    run_flags = {opt for param in typer.main.get_command(app).commands["run"].params for opt in param.opts}
    new_flags = {p.default.param_decls[0]: p for name, p in new_params.items()}
    assert {"image", "project_dir", "as_json"} == run_module.RUN_OWN  # the only ones with run's own definition
    assert set(new_flags) <= run_flags  # --image, --project-dir, --json too: run's own
    given = {flag: _sample(p, tmp_path) for flag, p in new_flags.items() if p.name not in run_module.RUN_OWN}
    assert len(given) >= 28  # new's whole option list, not a copy of part of it
    argv = [part for flag, value in given.items() for part in ([flag] if value is None else [flag, value])]
    seen = {}

    def fake_write(project_dir, new_args):
        seen.update(new_args)
        raise SystemExit(0)

    monkeypatch.setattr(run_module, "_write_stack", fake_write)
    result = run_cli("run", *argv, "--image", "ghcr.io/x/y:1", "--project-dir", str(tmp_path), "--", "python", "t.py")
    assert result.exit_code == 0, result.stderr
    assert seen == {flag: True if value is None else _typed(new_flags[flag], value) for flag, value in given.items()}


def _typed(param, text):
    """``text`` as click hands it over for ``param``'s type."""
    import typing

    (kind,) = {a for a in typing.get_args(param.annotation) if a is not type(None)} or {param.annotation}
    return kind(text)


def test_run_without_a_request_refuses_any_of_new_options(run_cli, tmp_path):
    for option in (["--max-price-per-hour", "3"], ["--strict"], ["--name", "x"]):
        result = run_cli("run", "train", *option, "--project-dir", str(tmp_path), "--", "python")
        assert result.exit_code == 2 and f"{option[0]}: only with --gpus" in result.stderr, result.stderr
    written = run_cli("run", "--instance-type", "p5.48xlarge", "--", "python", "--project-dir", str(tmp_path))
    assert written.exit_code == 2 and "needs --name NAME" in written.stderr  # --instance-type asks new too


def test_the_jobs_restart_count_is_the_clusters_not_the_sum_over_nodes():
    """One crash restarts the job on both nodes (one record each): 1 restart of the job, as the
    status line and `jobs` say; a replacement that continued rank 1's records and then failed its
    first attempt makes it 2."""
    from gpuinfra.agent.job import JobSpec

    crash = {"at": "2026-11-27T04:00:00+00:00", "cause": "exit status 1", "step": 8}
    view = jobs.JobView(
        JobSpec(id="j-x", argv=("python", "train.py")),
        {"rank-0": {"state": "running", "restarts": [crash]}, "rank-1": {"state": "running", "restarts": [crash]}},
    )
    assert view.restart_count == 1 and len(view.restarts) == 2
    assert ", 1 restart, " in jobs.status_line(view, 2, 60, None)
    assert view.to_json()["restart_count"] == 1
    view.statuses["rank-1"]["restarts"] = [crash, {**crash, "step": None}]
    assert view.restart_count == 2 and ", 2 restarts, " in jobs.status_line(view, 2, 60, None)
    assert jobs.JobView(view.spec).restart_count == 0


def test_run_gpus_with_a_ladder_forms_the_next_rung_when_the_first_is_out_of_capacity(
    run_cli, tmp_path, monkeypatch, s3
):
    """`run --gpus ... --fallback 2` writes the ladder and forms it as `up --fallback` does: rung 0
    out of capacity is destroyed, rung 1 forms, the job runs there and rung 1 is downed."""
    from gpuinfra.errors import CapacityError
    from tests.cli.test_fallback_ladder_cli import _refusing_preflight

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    _refusing_preflight(monkeypatch, {})

    class StockoutNotUpYet(NotUpYet):
        def up(self, project_dir, stack, on_event):
            self.calls.append(("up", stack))
            if stack == "ft":
                raise CapacityError("launched 0 of 2 for ft: InsufficientInstanceCapacity")
            self.deployed.add(stack)
            return {"create": 41}

    backend = StockoutNotUpYet()
    _use(monkeypatch, backend)
    nodes_finish(s3, monkeypatch)
    args = ("--gpus", "8xH100", "--cloud", "aws", "--nodes", "2", "--name", "ft", "--fallback", "2")
    result = run_cli("run", *args, "--project-dir", str(tmp_path), "--", "python", "train.py")
    assert result.exit_code == 0, result.stderr
    assert [c for c in backend.calls if c[0] in ("up", "destroy")] == [
        ("up", "ft"),
        ("destroy", "ft"),
        ("up", "ft-fb1"),
        ("destroy", "ft-fb1"),
    ]
    assert "rung 1 formed; the job runs on ft-fb1" in result.stdout
    spec = JobSpec.from_json(s3.get_object(Bucket=BUCKET, Key=spec_key("ft-fb1"))["Body"].read().decode())
    assert spec.argv == ("python", "train.py")
    record = yaml.safe_load((tmp_path / "ladders" / "ft.yaml").read_text())
    assert record["formed"]["stack"] == "ft-fb1"


def test_run_stack_without_a_ladder_is_a_plain_up(run_cli, project, monkeypatch, s3):  # noqa: F811
    class NotUpYet(FakeBackend):
        def outputs(self, project_dir, stack):
            return {"bucket_name": BUCKET} if stack in self.deployed else {}

    backend = NotUpYet()
    _use(monkeypatch, backend)
    nodes_finish(s3, monkeypatch)
    result = run_cli("run", "train", "--project-dir", str(project), "--", "python", "train.py")
    assert result.exit_code == 0, result.stderr
    assert "forming its fallback ladder" not in result.stdout
    assert [c for c in backend.calls if c[0] in ("up", "destroy")] == [("up", "train"), ("destroy", "train")]


def test_run_refuses_a_secret_that_a_rung_of_its_ladder_could_not_read_before_anything_is_up(
    run_cli, tmp_path, monkeypatch, s3
):
    """A job secret's name is scoped to one stack id (the nodes' grants and their own check), and
    every rung of a fallback ladder is a stack of its own: a secret named for rung 0 is refused
    before any rung is brought up, not found unreadable on the nodes of the rung that formed."""
    from gpuinfra.plan.naming import stack_id
    from gpuinfra.stackfile import read_stack_spec
    from tests.cli.test_fallback_ladder_cli import _refusing_preflight

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    _refusing_preflight(monkeypatch, {})

    backend = NotUpYet()
    _use(monkeypatch, backend)
    nodes_finish(s3, monkeypatch)
    made = run_cli(
        "new", "--gpus", "8xH100", "--cloud", "aws", "--nodes", "2", "--name", "ft", "--fallback", "2",
        "--project-dir", str(tmp_path),
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    scope = stack_id(read_stack_spec(tmp_path, "ft"))
    result = run_cli(
        "run", "ft", "--secret", f"TOKEN=/gpuinfra/{scope}/job/token", "--project-dir", str(tmp_path),
        "--", "python", "train.py",
    )  # fmt: skip
    assert result.exit_code == 2, result.stdout + result.stderr
    assert "ft-fb1" in result.stderr and "Traceback" not in result.stderr
    assert [c for c in backend.calls if c[0] in ("up", "destroy")] == []


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--nodes", "0", "--nodes must be a whole number from 1 to 1,000"),
        ("--max-price-per-hour", "0", "max_price_per_hour_usd: Input should be greater than 0"),
    ],
)
def test_run_gpus_hands_a_zero_to_new_which_refuses_it(run_cli, tmp_path, monkeypatch, s3, flag, value, message):
    """A number the user gave goes to `new` even when it is 0: dropped, `--nodes 0` became new's
    default of 1 node and `--max-price-per-hour 0` no budget at all, and the cluster was brought up."""
    backend = FakeBackend()
    _use(monkeypatch, backend)
    nodes_finish(s3, monkeypatch)
    args = ("--gpus", "8xH100", "--cloud", "aws", "--nodes", "2", "--name", "ft")
    result = run_cli("run", *args, flag, value, "--project-dir", str(tmp_path), "--", "python", "train.py")
    assert result.exit_code == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "stacks").exists() or not list((tmp_path / "stacks").iterdir())
    assert [c for c in backend.calls if c[0] == "up"] == []
