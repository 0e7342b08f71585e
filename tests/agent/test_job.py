"""The node's job unit (:mod:`gpuinfra.agent.job`) against a folder bucket and a stand-in
``gpuinfra-run`` (a bash script that prints, records its argv and environment, and exits as told),
plus the agent's side: a finished job ends the node, a hang with ``restart`` asks for a restart."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuinfra.agent import job as jobmod
from gpuinfra.agent import watch as w
from gpuinfra.agent.job import JobRunner, JobSpec, final_key, log_key, secret_command, spec_key, status_key
from tests.agent.test_agent_liveness import Clock, Gpus, run, watched

STACK = "train"


class FolderBucket:
    """The node's bucket calls (``put_text``/``get_text``/``put_tree``) over a folder; a missing
    object raises OSError as the CLI's non-zero exit does."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put_text(self, key, text, timeout):
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def get_text(self, key, timeout):
        try:
            return (self.root / key).read_text()
        except FileNotFoundError:
            raise OSError(f"aws s3 cp exited 1: {key} not found") from None

    def put_tree(self, folder, key, timeout):
        for path in Path(folder).rglob("*"):
            if path.is_file():
                self.put_text(f"{key}/{path.relative_to(folder)}", path.read_text(), timeout)


#: The stand-in gpuinfra-run: records argv and the job's variables, prints progress, then exits
#: with the next code of $CODES (one per attempt) or sleeps when the code is "sleep".
FAKE_RUN = r"""#!/bin/bash
n=$(cat "$STATE/attempts" 2>/dev/null || echo 0); echo $((n + 1)) > "$STATE/attempts"
printf '%s\n' "$@" > "$STATE/argv-$n"
env > "$STATE/env-$n"
echo "starting attempt $n"
echo "step=$((n * 10 + 5)) loss=0.5$n lr=0.01"
echo '{"result": 1}' > "$GPUINFRA_OUTPUT_DIR/result.json"
code=$(echo "$CODES" | cut -d, -f$((n + 1)))
if [ "$code" = sleep ]; then sleep 60; code=0; fi
exit "${code:-0}"
"""


@pytest.fixture
def node(tmp_path, monkeypatch):
    monkeypatch.setattr(jobmod, "POLL_SECONDS", 0.2)
    monkeypatch.setattr(jobmod, "STOP_GRACE_SECONDS", 5)
    state = tmp_path / "state"
    state.mkdir()
    script = tmp_path / "gpuinfra-run"
    script.write_text(FAKE_RUN)
    script.chmod(0o755)
    monkeypatch.setenv("STATE", str(state))
    bucket = FolderBucket(tmp_path / "bucket")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    runner = JobRunner(bucket, "aws", STACK, "rank-1", "i-0abc", 2, str(scratch), tmp_path / "run", str(script))
    return runner, bucket, state


def spec(**kw) -> JobSpec:
    return JobSpec(id="j-20261127-040000-abc123", argv=("python", "train.py", "--lr", "1e-4"), **kw)


def bucket_json(bucket: FolderBucket, key: str) -> dict:
    return json.loads(bucket.get_text(key, 1))


def test_a_job_that_exits_0_is_recorded_with_its_logs_outputs_and_the_done_mark(node, monkeypatch):
    runner, bucket, state = node
    monkeypatch.setenv("CODES", "0")
    assert runner.run(spec(env={"WANDB_MODE": "offline"})) == "succeeded"
    argv = (state / "argv-0").read_text().splitlines()
    # torchrun's elastic form: the job id names the rendezvous; MIN:MAX = every node (min_nodes 0)
    assert argv[:6] == ["--name", "gpuinfra-job", "--rdzv-id", "j-20261127-040000-abc123", "--nnodes", "2:2"]
    assert argv[argv.index("--") + 1 :] == ["python", "train.py", "--lr", "1e-4"]
    env = dict(line.split("=", 1) for line in (state / "env-0").read_text().splitlines() if "=" in line)
    assert env["WANDB_MODE"] == "offline" and env["GPUINFRA_JOB_ID"] == "j-20261127-040000-abc123"
    status = bucket_json(bucket, status_key(STACK, "j-20261127-040000-abc123", "rank-1"))
    assert status["state"] == "succeeded" and status["exit_code"] == 0 and status["restarts"] == []
    assert status["progress"] == {"step": 5, "loss": 0.50, "lr": 0.01}
    log = bucket.get_text(log_key(STACK, "j-20261127-040000-abc123", "rank-1", 0), 1)
    assert log == "[rank-1] starting attempt 0\n[rank-1] step=5 loss=0.50 lr=0.01\n"
    outputs = f"jobs/{STACK}/j-20261127-040000-abc123/outputs/rank-1/result.json"
    assert json.loads(bucket.get_text(outputs, 1)) == {"result": 1}
    assert bucket_json(bucket, final_key(STACK, "j-20261127-040000-abc123"))["state"] == "succeeded"
    assert (runner.state_dir / jobmod.JOB_DONE_MARK).read_text().startswith("job j-20261127-040000-abc123 succeeded")


def test_failures_restart_until_max_restarts_with_cause_and_step(node, monkeypatch):
    runner, bucket, state = node
    monkeypatch.setenv("CODES", "3,1,0")
    assert runner.run(spec(max_restarts=2)) == "succeeded"
    status = bucket_json(bucket, status_key(STACK, "j-20261127-040000-abc123", "rank-1"))
    assert [(r["cause"], r["step"]) for r in status["restarts"]] == [("exit status 3", 5), ("exit status 1", 15)]
    monkeypatch.setenv("CODES", "3,1,0")
    (state / "attempts").unlink()
    runner.status = {}
    again = replace(spec(max_restarts=1), id="j-20261127-050000-abc123")  # a new job: its own count
    assert runner.run(again) == "failed"  # the second failure has no restart left
    status = bucket_json(bucket, status_key(STACK, again.id, "rank-1"))
    assert status["state"] == "failed" and status["exit_code"] == 1 and len(status["restarts"]) == 1


def test_restart_never_fails_at_the_first_non_zero_exit(node, monkeypatch):
    runner, bucket, _ = node
    monkeypatch.setenv("CODES", "2,0")
    assert runner.run(spec(restart="never", max_restarts=5)) == "failed"


def test_cancel_in_the_bucket_stops_a_running_job_within_seconds(node, monkeypatch):
    runner, bucket, _ = node
    monkeypatch.setenv("CODES", "sleep")
    job = spec()
    bucket.put_text(spec_key(STACK), job.to_json(), 1)
    result = []
    thread = threading.Thread(target=lambda: result.append(runner.run(job)))
    started = time.monotonic()
    thread.start()
    time.sleep(1)
    bucket.put_text(spec_key(STACK), replace(job, cancel=True).to_json(), 1)
    thread.join(30)
    assert result == ["cancelled"] and time.monotonic() - started < 15
    assert bucket_json(bucket, final_key(STACK, job.id))["state"] == "cancelled"


def test_a_hang_restart_request_stops_the_job_and_runs_it_again(node, monkeypatch):
    runner, bucket, state = node
    monkeypatch.setenv("CODES", "sleep,0")
    result = []
    thread = threading.Thread(target=lambda: result.append(runner.run(spec(max_restarts=1))))
    thread.start()
    deadline = time.monotonic() + 20  # the attempt runs (a mark older than the attempt is cleared at its start)
    while not any("starting attempt 0" in line for line in runner.lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    runner.state_dir.mkdir(parents=True, exist_ok=True)  # /run/gpuinfra on a node
    (runner.state_dir / jobmod.JOB_RESTART_MARK).write_text("every GPU busy under 25% of its power limit for 30 min\n")
    thread.join(30)
    assert result == ["succeeded"]
    status = bucket_json(bucket, status_key(STACK, "j-20261127-040000-abc123", "rank-1"))
    assert [r["cause"] for r in status["restarts"]] == ["hang: every GPU busy under 25% of its power limit for 30 min"]


def test_secrets_reach_the_job_through_the_environment_never_the_command_line(node, monkeypatch, tmp_path):
    runner, _, state = node
    monkeypatch.setenv("CODES", "0")
    calls = []

    def fake_run(argv, **kw):
        calls.append(argv)
        return type("Done", (), {"stdout": "s3cr3t-token\n", "returncode": 0})()

    monkeypatch.setattr(jobmod.subprocess, "run", fake_run)
    runner.run(spec(secrets={"HF_TOKEN": "/gpuinfra/train/job/hf-token"}))
    assert calls == [secret_command("aws", STACK, "/gpuinfra/train/job/hf-token")]
    argv = (state / "argv-0").read_text()
    assert "s3cr3t-token" not in argv and "-e\nHF_TOKEN\n" in argv
    assert "HF_TOKEN=s3cr3t-token\n" in (state / "env-0").read_text()


def test_a_node_that_boots_after_the_job_is_over_does_not_start_it(node, monkeypatch):
    runner, bucket, state = node
    job = spec()
    bucket.put_text(spec_key(STACK), job.to_json(), 1)
    bucket.put_text(final_key(STACK, job.id), '{"state": "succeeded"}\n', 1)
    assert runner.serve(poll_seconds=0.1) == 0
    assert not (state / "attempts").exists() and (runner.state_dir / jobmod.JOB_DONE_MARK).exists()


def test_a_node_of_a_new_deployment_waits_for_its_own_job_instead_of_ending(node, monkeypatch):
    # the bucket outlives `down`: the job of the previous deployment is still there, over; a node
    # of the next `up` (node.env GPUINFRA_DEPLOYMENT) must not take it for its own and end itself
    runner, bucket, state = node
    runner.deployment = "0123456789ab"
    monkeypatch.setenv("CODES", "0")
    old = spec(deployment="ba9876543210")
    bucket.put_text(spec_key(STACK), old.to_json(), 1)
    bucket.put_text(final_key(STACK, old.id), '{"state": "succeeded"}\n', 1)
    served = threading.Thread(target=runner.serve, kwargs={"poll_seconds": 0.05}, daemon=True)
    served.start()
    time.sleep(0.5)
    assert served.is_alive() and not (runner.state_dir / jobmod.JOB_DONE_MARK).exists()
    new = replace(old, id="j-20261127-050000-def456", deployment="0123456789ab")
    bucket.put_text(spec_key(STACK), new.to_json(), 1)
    served.join(10)
    assert not served.is_alive() and (state / "attempts").read_text().strip() == "1"
    assert bucket_json(bucket, final_key(STACK, new.id))["state"] == "succeeded"


def test_secret_names_are_the_stacks_only():
    # aws ssm get-parameter --with-decryption / secretsmanager get-secret-value / gcloud secrets versions access
    assert secret_command("aws", STACK, "/gpuinfra/train/job/db")[:4] == [
        "aws",
        "ssm",
        "get-parameter",
        "--with-decryption",
    ]
    assert secret_command("aws", STACK, "gpuinfra/train/job/db")[:3] == ["aws", "secretsmanager", "get-secret-value"]
    assert secret_command("gcp", STACK, "gpuinfra-train_db") == [
        "gcloud", "secrets", "versions", "access", "latest", "--secret=gpuinfra-train_db",
    ]  # fmt: skip
    for cloud, name in [
        ("aws", "/prod/db"),
        ("aws", "/gpuinfra/other/job/db"),
        ("aws", "/gpuinfra/train/cloudwatch-agent"),
        ("gcp", "gpuinfra-other_db"),
    ]:
        with pytest.raises(ValueError, match="secret"):
            secret_command(cloud, STACK, name)
    # the scope is the stack id (<stack>-<suffix>): a same-named stack of another project folder
    # has another id, and on GCP "_" ends the id (a stack named train-a1b2c3-x is not this one)
    scope = "train-a1b2c3"
    assert secret_command("aws", scope, "gpuinfra/train-a1b2c3/job/db")[:3] == [
        "aws",
        "secretsmanager",
        "get-secret-value",
    ]
    assert secret_command("gcp", scope, "gpuinfra-train-a1b2c3_db")[-1] == "--secret=gpuinfra-train-a1b2c3_db"
    for cloud, name in [
        ("aws", "/gpuinfra/train/job/db"),
        ("aws", "gpuinfra/train-zzzzzz/job/db"),
        ("gcp", "gpuinfra-train-a1b2c3-x-d4e5f6_db"),
        ("gcp", "gpuinfra-train_db"),
    ]:
        with pytest.raises(ValueError, match="secret"):
            secret_command(cloud, scope, name)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": "job 1"}, "id"),
        ({"argv": ()}, "argv"),
        ({"env": {"BAD-NAME": "x"}}, "BAD-NAME"),
        ({"env": {"A": "two\nlines"}}, "'A'"),
        ({"restart": "always"}, "restart"),
        ({"image": "img; rm -rf /"}, "image"),
        ({"workdir": "../etc"}, "workdir"),
        ({"deployment": "x; reboot"}, "deployment"),
    ],
)
def test_a_spec_a_node_could_not_run_safely_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        JobSpec(**{"id": "j-1", "argv": ("python",), **change})


def test_the_spec_round_trips_and_refuses_unknown_fields():
    job = spec(env={"A": "1"}, secrets={"B": "/gpuinfra/train/b"}, min_nodes=1)
    assert JobSpec.from_json(job.to_json()) == job
    doc = json.loads(job.to_json())
    doc["surprise"] = 1
    with pytest.raises(ValueError, match="surprise"):
        JobSpec.from_json(json.dumps(doc))
    # a command written as one string is not split into its characters (torchrun would run "p")
    with pytest.raises(ValueError, match="argv"):
        JobSpec.from_json(json.dumps({**json.loads(job.to_json()), "argv": "python train.py"}))


# ------------------------------------------------------------------ the agent's side


def test_the_done_mark_makes_the_agent_sync_and_end_the_node(tmp_path):
    clock, ended = Clock(), []
    a, _ = watched(tmp_path, clock, Gpus(0, 0), ended, {})
    assert a.step() == "running"
    (tmp_path / "run" / jobmod.JOB_DONE_MARK).write_text("job j-1 succeeded (exit status 0)\n")
    assert a.step() == "job-done" and ended == ["job-done"]
    assert any("job over: job j-1 succeeded (exit status 0)" in e for e in a.events)


def test_hang_action_restart_asks_the_job_unit_once_per_hang(tmp_path):
    clock, ended = Clock(), []
    env = {"GPUINFRA_HANG_ACTION": "restart", "GPUINFRA_HANG_MINUTES": "5", "GPUINFRA_HANG_POWER_PERCENT": "25"}
    a, _ = watched(tmp_path, clock, Gpus(100, 100), ended, env)  # 70 W of 700 W: 10%
    states = run(a, clock, 300 + 30)
    assert states[-1] == "hung" and not ended
    mark = tmp_path / "run" / w.JOB_RESTART_MARK
    assert mark.read_text() == "every GPU busy under 25% of its power limit for 5 min\n"
    mark.unlink()  # the job unit took it
    run(a, clock, 60)
    assert not mark.exists()  # the same hang asks once


def test_a_restart_records_where_the_next_attempt_resumed_and_the_steps_it_redid(node, tmp_path):
    runner, bucket, state = node
    # attempt 0 reaches step 8 and crashes; attempt 1 resumes from its step-5 checkpoint (first
    # step logged: 6) and finishes at 10: 3 steps (6, 7, 8) done twice
    Path(runner.run_path).write_text(
        "#!/bin/bash\n"
        'n=$(cat "$STATE/attempts" 2>/dev/null || echo 0); echo $((n + 1)) > "$STATE/attempts"\n'
        'if [ "$n" = 0 ]; then for s in 1 2 3 4 5 6 7 8; do echo "step=$s loss=0.$s"; done; exit 1; fi\n'
        'echo "resumed"; for s in 6 7 8 9 10; do echo "step=$s loss=0.$s"; done\n'
    )
    assert runner.run(spec(max_restarts=1)) == "succeeded"
    (restart,) = bucket_json(bucket, status_key(STACK, "j-20261127-040000-abc123", "rank-1"))["restarts"]
    assert (restart["cause"], restart["step"], restart["resumed_at_step"], restart["steps_redone"]) == (
        "exit status 1",
        8,
        5,
        3,
    )


def test_the_job_output_also_goes_to_the_local_log_the_agent_ships(node, monkeypatch, tmp_path):
    """Every line of every attempt, prefixed as in the bucket chunks, is appended to the local
    file (the one the monitoring agent's ``collect_list`` / ``files`` receiver names)."""
    runner, bucket, state = node
    runner.local_log = tmp_path / "var" / "log" / "gpuinfra" / "job.log"  # a folder that does not exist yet
    monkeypatch.setenv("CODES", "3,0")
    assert runner.run(spec(max_restarts=1)) == "succeeded"
    assert runner.local_log.read_text() == (
        "[rank-1] starting attempt 0\n[rank-1] step=5 loss=0.50 lr=0.01\n"
        "[rank-1] starting attempt 1\n[rank-1] step=15 loss=0.51 lr=0.01\n"
    )
    chunks = sorted((bucket.root / f"jobs/{STACK}/j-20261127-040000-abc123/logs/rank-1").iterdir())
    assert "".join(c.read_text() for c in chunks) == runner.local_log.read_text()  # the same lines as the bucket


def test_the_local_log_is_bounded_by_one_rotation(node, monkeypatch, tmp_path):
    runner, bucket, state = node
    monkeypatch.setattr(jobmod, "LOCAL_LOG_BYTES", 100)
    runner.local_log = tmp_path / "job.log"
    for n in range(20):
        runner._add(f"[rank-1] line {n:02d} " + "x" * 20 + "\n")  # 37 bytes a line
    rotated = tmp_path / "job.log.1"
    assert sorted(p.name for p in tmp_path.glob("job.log*")) == ["job.log", "job.log.1"]
    assert rotated.stat().st_size <= 100 + 37 and runner.local_log.stat().st_size < 100
    assert runner.local_log.read_text().endswith("line 19 " + "x" * 20 + "\n")
    assert len(runner.lines) == 20  # the bucket still gets every line


def test_the_local_log_stays_on_when_the_output_reader_and_the_unit_write_at_once(node, monkeypatch, tmp_path):
    """The output reader thread and the unit's own notes (a failed worker, rank 0 moved) both
    append; across a rotation the second writer found the file renamed already and turned the
    local log -- what the monitoring agent ships -- off for the rest of the job."""
    runner, bucket, state = node
    monkeypatch.setattr(jobmod, "LOCAL_LOG_BYTES", 64)
    runner.local_log = tmp_path / "job.log"
    errors: list[BaseException] = []

    def write(tag: str) -> None:
        try:
            for n in range(3000):
                runner._add(f"[rank-1] {tag} {n}\n")
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(tag,)) for tag in ("reader", "unit")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and runner.local_log == tmp_path / "job.log"
    assert len(runner.lines) == 6000


def test_an_unwritable_local_log_never_stops_the_job(node, monkeypatch, tmp_path, capsys):
    runner, bucket, state = node
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    runner.local_log = blocker / "job.log"
    monkeypatch.setenv("CODES", "0")
    assert runner.run(spec()) == "succeeded"
    assert runner.local_log is None and "local log" in capsys.readouterr().out
    assert bucket.get_text(log_key(STACK, "j-20261127-040000-abc123", "rank-1", 0), 1).startswith("[rank-1] starting")


def test_the_node_unit_writes_the_local_log_where_the_agents_read_it():
    from gpuinfra.monitoring.metrics import aws_agent_config, gcp_ops_agent_config

    entry = aws_agent_config("t-1-abc", job_logs=True)["logs"]["logs_collected"]["files"]["collect_list"][0]
    receiver = gcp_ops_agent_config(job_logs=True)["logging"]["receivers"]["gpuinfra_job"]
    assert entry["file_path"] == receiver["include_paths"][0] == jobmod.LOCAL_LOG == "/var/log/gpuinfra/job.log"


def _decision(ranked, deployment, decided_at):
    from gpuinfra.health.ranks import DecisionScope, RankDecision

    scope = DecisionScope(STACK, tuple(ranked), None, deployment)
    decision = scope.propose(list(ranked), {}, "i-0a", ranked[0], "replacement")
    return scope.key, RankDecision(**{**decision.__dict__, "decided_at": decided_at}).to_json().encode()


LOST, SURVIVOR, NEWCOMER = "10.0.0.7", "10.0.0.9", "10.0.0.20"


@pytest.fixture
def survivor(node, tmp_path, monkeypatch):
    """Rank 1 of [LOST, SURVIVOR] (the formation's decision), deployment 0d0d0d0d0d0d; LOST hosts
    the rendezvous on a port where nothing listens."""
    runner, bucket, state = node
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "cluster.env").write_text(
        f"NNODES=2\nNODE_RANK=1\nNPROC_PER_NODE=8\nMASTER_ADDR={LOST}\nMASTER_PORT=29500\n"
    )
    (etc / "hostfile").write_text(f"{LOST}\n{SURVIVOR}\n")
    docs = dict([_decision([LOST, SURVIVOR], "0d0d0d0d0d0d", "2026-11-27T04:00:00+00:00")])
    runner.deployment, runner.cluster_env, runner.hostfile = "0d0d0d0d0d0d", etc / "cluster.env", etc / "hostfile"
    runner.decisions = lambda: dict(docs)
    probes = []

    def connect(address, timeout):
        probes.append(address)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(jobmod.socket, "create_connection", connect)
    return runner, docs, etc, probes


def test_a_survivor_follows_rank_0_to_the_replacement_that_took_it(survivor):
    runner, docs, etc, _ = survivor
    assert not runner.follow_rank0()  # the formation's ranking: rank 0 is where cluster.env says
    docs.update([_decision([NEWCOMER, SURVIVOR], "0d0d0d0d0d0d", "2026-11-27T05:00:00+00:00")])
    assert runner.follow_rank0()
    assert (etc / "cluster.env").read_text() == (
        f"NNODES=2\nNODE_RANK=1\nNPROC_PER_NODE=8\nMASTER_ADDR={NEWCOMER}\nMASTER_PORT=29500\n"
    )
    assert (etc / "hostfile").read_text() == f"{NEWCOMER}\n{SURVIVOR}\n"
    assert not list(etc.glob("*.tmp"))
    assert runner.lines == [f"[rank-1] gpuinfra-job: rank 0 is now {NEWCOMER} (was {LOST}): MASTER_ADDR rewritten\n"]
    assert not runner.follow_rank0()  # once


@pytest.mark.parametrize(
    "ranked, deployment",
    [
        ([SURVIVOR, NEWCOMER], "0d0d0d0d0d0d"),  # it would move this node's rank: not this node's ranking
        ([NEWCOMER, SURVIVOR], "0e0e0e0e0e0e"),  # another deployment's
        (["10.0.0.20;reboot", SURVIVOR], "0d0d0d0d0d0d"),  # not an address
        # an IPv6 scope id may hold any character but "%" (Python's ipaddress takes it), and the
        # nodes' addresses are IPv4 (the cluster-env units sort them by four octets)
        (["fe80::1%$(reboot)", SURVIVOR], "0d0d0d0d0d0d"),
    ],
)
def test_a_decision_that_is_not_this_nodes_ranking_or_names_no_address_is_not_followed(survivor, ranked, deployment):
    runner, docs, etc, _ = survivor
    before = (etc / "cluster.env").read_text()
    docs.update([_decision(ranked, deployment, "2026-11-27T05:00:00+00:00")])
    assert not runner.follow_rank0()
    assert (etc / "cluster.env").read_text() == before


def test_a_restart_waits_for_the_replacement_of_a_lost_rank_0_then_runs_against_it(survivor, monkeypatch):
    """Rank 0 answers before the first attempt; the attempt fails (rank 0 is lost); before the
    restart the survivor probes rank 0's rendezvous port (refused) and reads the decisions until
    the replacement's appears, then restarts against the replacement."""
    runner, docs, etc, probes = survivor
    monkeypatch.setenv("CODES", "1,0")

    def lost_after_the_first_probe(address, timeout):
        probes.append(address)
        if len(probes) == 1:
            return socket.socket()  # rank 0's rendezvous is up
        if len(probes) == 4:
            docs.update([_decision([NEWCOMER, SURVIVOR], "0d0d0d0d0d0d", "2026-11-27T05:00:00+00:00")])
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(jobmod.socket, "create_connection", lost_after_the_first_probe)
    original = runner.await_rank0
    monkeypatch.setattr(runner, "await_rank0", lambda: original(wait_seconds=5, poll_seconds=0.01))
    assert runner.run(spec(max_restarts=1)) == "succeeded"
    assert probes == [(LOST, 29500)] * 4
    assert f"MASTER_ADDR={NEWCOMER}\n" in (etc / "cluster.env").read_text()
    (restart,) = bucket_json(runner.bucket, status_key(STACK, "j-20261127-040000-abc123", "rank-1"))["restarts"]
    assert restart["cause"] == "exit status 1"


def test_waiting_for_rank_0_is_bounded_and_skipped_on_rank_0(survivor, monkeypatch):
    runner, docs, etc, probes = survivor
    started = time.monotonic()
    runner.await_rank0(wait_seconds=0.3, poll_seconds=0.05)
    assert 0.3 <= time.monotonic() - started < 3 and len(probes) >= 3
    assert runner.lines[-1] == f"[rank-1] gpuinfra-job: rank 0 ({LOST}) still unreachable after 0 s\n"
    probes.clear()
    (etc / "cluster.env").write_text((etc / "cluster.env").read_text().replace("NODE_RANK=1", "NODE_RANK=0"))
    runner.await_rank0(wait_seconds=5)
    assert probes == []  # rank 0 hosts the rendezvous itself


def test_a_replacement_continues_the_restarts_of_the_rank_it_took(node, monkeypatch):
    """The lost node of rank 1 had restarted once; its replacement's failure is the job's second
    restart, and with max_restarts 1 the job fails instead of starting the count again."""
    runner, bucket, _ = node
    job = spec(max_restarts=1)
    earlier = {"at": "2026-11-27T04:00:00+00:00", "cause": "exit status 1", "step": 8}
    bucket.put_text(
        status_key(STACK, job.id, "rank-1"),
        json.dumps({"job": job.id, "node": "i-0lost", "state": "running", "restarts": [earlier]}),
        1,
    )
    monkeypatch.setenv("CODES", "1,0")
    assert runner.run(job) == "failed"
    status = bucket_json(bucket, status_key(STACK, job.id, "rank-1"))
    assert status["restarts"] == [earlier] and status["replaces"] == "i-0lost" and status["node"] == "i-0abc"
    # another job's status (or none) is not taken over
    bucket.put_text(status_key(STACK, job.id, "rank-1"), json.dumps({"job": "j-other", "restarts": [earlier]}), 1)
    runner.status = {}
    assert runner.inherited(job) == {}


def test_a_failed_worker_ends_the_attempt_without_waiting_out_torchruns_exit_barrier(node, monkeypatch):
    """torchrun logs the failed worker and then waits up to 300 s in its exit barrier for the other
    nodes' agents (a lost node never comes): the job unit stops it after the grace and records the
    worker's exit status."""
    runner, bucket, state = node
    monkeypatch.setattr(jobmod, "WORKER_FAILED_GRACE_SECONDS", 0.5)
    Path(runner.run_path).write_text(
        "#!/bin/bash\n"
        'n=$(cat "$STATE/attempts" 2>/dev/null || echo 0); echo $((n + 1)) > "$STATE/attempts"\n'
        'if [ "$n" = 1 ]; then echo "step=9 loss=0.1"; exit 0; fi\n'
        'echo "step=7 loss=0.2"\n'
        # torch 1.13's line (torch.distributed.elastic.multiprocessing.api), on stderr
        "echo 'ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 4242)"
        " of binary: /usr/bin/python3' >&2\n"
        "sleep 300\n"
    )
    started = time.monotonic()
    assert runner.run(spec(max_restarts=1)) == "succeeded"
    assert time.monotonic() - started < 15  # 0.5 s grace, then SIGTERM (the stand-in dies at once)
    (restart,) = bucket_json(bucket, status_key(STACK, "j-20261127-040000-abc123", "rank-1"))["restarts"]
    assert (restart["cause"], restart["step"]) == ("exit status 1", 7)
    log = "".join(
        bucket.get_text(log_key(STACK, "j-20261127-040000-abc123", "rank-1", n), 1) for n in range(runner.seq)
    )
    assert "[rank-1] gpuinfra-job: a worker failed (exit status 1); stopping torchrun's exit barrier\n" in log


def test_a_bucket_call_that_hangs_neither_delays_nor_fails_the_attempt(node, monkeypatch):
    """The cancel poll's ``aws s3 cp`` may hang until its 60 s timeout (the box saw it): the
    attempt still ends when the job ends, and the timeout is no job failure."""
    import subprocess
    import threading

    runner, bucket, _ = node
    hung, released = [], threading.Event()

    def hanging_get(key, timeout):
        if key != spec_key(STACK):
            raise OSError(f"{key} not found")
        hung.append(key)
        released.wait(30)  # hangs until the test has seen the attempt end
        raise subprocess.TimeoutExpired(["aws", "s3", "cp", key, "-"], timeout)

    monkeypatch.setattr(bucket, "get_text", hanging_get)
    Path(runner.run_path).write_text("#!/bin/bash\necho step=1 loss=0.5\nsleep 1\nexit 0\n")
    started = time.monotonic()
    try:
        assert runner.run(spec()) == "succeeded"
        # the poll still hangs (up to 30 s); the attempt ended with its 1 s job, not with the poll
        assert time.monotonic() - started < 15 and hung and not released.is_set()
    finally:
        released.set()
    assert runner.read_spec() is None  # a timed-out read is "no spec", never an error out of the loop


def test_a_replacement_appends_to_the_log_of_the_rank_it_took_instead_of_overwriting_it(node, monkeypatch):
    """The lost node of rank 1 wrote chunks 0..4 (its crash is in them); the replacement writes
    the same part, so its chunks come after them: `logs -f` remembers the chunk keys it printed
    and would never show a chunk written again under a key it saw."""
    runner, bucket, _ = node
    job = spec()
    lost = [f"[rank-1] lost node line {n}\n" for n in range(5)]
    for seq, text in enumerate(lost):
        bucket.put_text(log_key(STACK, job.id, "rank-1", seq), text, 1)
    monkeypatch.setenv("CODES", "0")
    assert runner.run(job) == "succeeded"
    assert [bucket.get_text(log_key(STACK, job.id, "rank-1", seq), 1) for seq in range(5)] == lost
    assert "starting attempt 0" in bucket.get_text(log_key(STACK, job.id, "rank-1", 5), 1)
    for count in (0, 1, 2, 3, 8, 9, 33):  # any number of earlier chunks
        other = JobSpec(id=f"j-20261127-040000-n{count}", argv=("true",))
        for seq in range(count):
            bucket.put_text(log_key(STACK, other.id, "rank-1", seq), "x\n", 1)
        assert runner.next_log_seq(other) == count


def test_a_cancel_ends_the_wait_for_a_lost_rank_0(survivor, monkeypatch):
    """Rank 0 is lost and no replacement comes (the stack's last hour gets none): the survivor
    waits up to RANK0_WAIT_SECONDS before each attempt, and `gpuinfra cancel` must not leave it
    billing through that wait: the job is cancelled within a few polls, no attempt started."""
    runner, docs, etc, probes = survivor
    job = spec()
    runner.bucket.put_text(spec_key(STACK), replace(job, cancel=True).to_json(), 1)
    monkeypatch.setattr(jobmod.time, "sleep", lambda seconds: original_sleep(min(seconds, 0.05)))
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(runner.run(job)), daemon=True)
    worker.start()
    worker.join(20)
    assert result == ["cancelled"]
    assert not (Path(os.environ["STATE"]) / "attempts").exists()  # the job never started
    assert bucket_json(runner.bucket, final_key(STACK, job.id))["state"] == "cancelled"


original_sleep = time.sleep
