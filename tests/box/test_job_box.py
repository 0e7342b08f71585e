"""``gpuinfra run`` in the box: a job spec in the bucket, a real 2-node PyTorch training job (CPU,
gloo) started by every node's ``gpuinfra-job.service`` through the real ``gpuinfra-run`` and
torchrun's c10d rendezvous, its logs and status written back to the bucket, then every node
ending itself (agent: job over -> bounded checkpoint sync -> ``shutdown -h now``).

The training job is ``tests/box/jobs/train_tiny.py`` (one place: the interrupted scenario runs it
too). The box's ``docker`` stand-in runs the job's command on the node itself.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime

import pytest

from gpuinfra.agent.constants import CHECKPOINT_COMPLETE_MARKER
from gpuinfra.agent.job import LOCAL_LOG, JobSpec, final_key, spec_key, status_key
from gpuinfra.agent.node import END_SYNC_BOUND_SECONDS
from tests.box.box import HERE, Box
from tests.box.render import stack_spec
from tests.box.scenario import aws_p5
from tests.box.test_box import BOOT_SECONDS, env_file, make_box, wait_ranked_and_passed
from tests.box.test_checkpoints_box import CKPT, latest
from tests.box.test_replacement_box import add_node

pytestmark = [pytest.mark.box]

JOB_DIR = "/opt/box-job"
#: The job: 40 steps, a checkpoint every 5, one process per node (2 cores shared by the box).
STEPS = 40
JOB_ARGV = ("python3", f"{JOB_DIR}/train_tiny.py", "--steps", str(STEPS), "--checkpoint-every", "5")
#: Boot, gate, rendezvous and 40 steps on 2 shared cores, generous.
JOB_SECONDS = 600
#: The uninterrupted run's final loss (train_tiny.py's fixed seed 1234, 40 steps, 2 ranks), as the
#: uninterrupted scenario measured it and asserts it; the interrupted scenario must end there too.
UNINTERRUPTED_FINAL_LOSS = 0.001264


def submit(box: Box, stack: str, spec: JobSpec) -> None:
    """Put the spec where ``gpuinfra run`` puts it (the stand-in bucket is a folder)."""
    path = box.state / "bucket" / box.bucket / spec_key(stack)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec.to_json())


def install_job(box: Box, nodes: list | None = None) -> None:
    """The training script on every node, or on ``nodes`` (in a real cluster: in the image or on
    shared storage)."""
    for node in box.nodes if nodes is None else nodes:
        node.write(f"{JOB_DIR}/train_tiny.py", (HERE / "jobs" / "train_tiny.py").read_text(), 0o755)


def bucket_json(box: Box, key: str) -> dict | None:
    path = box.state / "bucket" / box.bucket / key
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_aws_two_nodes_run_a_training_job_to_the_end_and_end_themselves(box_rootfs, box_timer, tmp_path):
    scenario = aws_p5()
    stack = stack_spec(scenario.stack).stack
    spec = JobSpec(id="j-box-uninterrupted", argv=JOB_ARGV, nproc_per_node=1, max_restarts=1)
    started = time.monotonic()
    with make_box(box_rootfs, scenario, tmp_path) as box:
        install_job(box)
        submit(box, stack, spec)
        box.start()
        final = box.wait_for(
            "the job's final object", lambda: bucket_json(box, final_key(stack, spec.id)), JOB_SECONDS, poll=2
        )
        over = time.monotonic()
        codes = [node.wait_exit(END_SYNC_BOUND_SECONDS + 120) for node in box.nodes]
        ended = time.monotonic() - over
        assert codes == [0, 0], [n.diagnostics() for n in box.nodes]
        assert final["state"] == "succeeded" and final["exit_code"] == 0
        statuses = [bucket_json(box, status_key(stack, spec.id, f"rank-{r}")) for r in (0, 1)]
        assert [s["state"] for s in statuses] == ["succeeded", "succeeded"]
        assert [s["restarts"] for s in statuses] == [[], []]
        progress = statuses[0]["progress"]
        assert progress["step"] == STEPS and progress["loss"] > 0
        logs = sorted((box.state / "bucket" / box.bucket / f"jobs/{stack}/{spec.id}/logs/rank-0").glob("*.log"))
        text = "".join(p.read_text() for p in logs)
        assert f"[rank-0] step={STEPS} loss=" in text and f"[rank-0] final step={STEPS} loss=" in text
        # the same lines on each node's disk, in the file the monitoring agent ships (monitoring.job_logs)
        bucket_logs = [
            "".join(
                p.read_text()
                for p in sorted(
                    (box.state / "bucket" / box.bucket / f"jobs/{stack}/{spec.id}/logs/rank-{r}").glob("*.log")
                )
            )
            for r in (0, 1)
        ]
        local_logs = [(n.dir / "upper" / LOCAL_LOG.lstrip("/")).read_text() for n in box.nodes]
        assert sorted(local_logs) == sorted(bucket_logs)
        result = bucket_json(box, f"jobs/{stack}/{spec.id}/outputs/rank-0/result.json")
        assert (
            result
            == {"step": STEPS, "loss": round(progress["loss"], 6)}
            == {"step": STEPS, "loss": UNINTERRUPTED_FINAL_LOSS}
        )
        # every 5 steps a complete checkpoint on each node; the node synced the newest before it ended
        latest = [bucket_json(box, f"checkpoints/{stack}/rank-{r}/LATEST") for r in (0, 1)]
        assert [d["checkpoint"] for d in latest] == [f"step-{STEPS}", f"step-{STEPS}"]
        shutdowns = [c for c in box.calls() if c["argv"][0] == "shutdown"]
        assert sorted(c["node"] for c in shutdowns) == sorted(n.name for n in box.nodes)
        assert ended <= END_SYNC_BOUND_SECONDS + 120
        finished = datetime.fromisoformat(statuses[0]["finished_at"])
        began = datetime.fromisoformat(statuses[0]["started_at"])
        print(
            f"box job: {STEPS} steps, final loss {progress['loss']}, job {(finished - began).total_seconds():.0f} s, "
            f"nodes ended {ended:.0f} s after the job, wall {time.monotonic() - started:.0f} s"
        )


def test_aws_a_job_that_keeps_failing_is_restarted_from_its_checkpoint_then_ends_the_nodes(
    box_rootfs, box_timer, fault_row, tmp_path
):
    scenario = aws_p5()
    stack = stack_spec(scenario.stack).stack
    argv = ("python3", f"{JOB_DIR}/train_tiny.py", "--steps", "20", "--checkpoint-every", "5", "--fail-at-step", "8")
    spec = JobSpec(id="j-box-failing", argv=argv, nproc_per_node=1, max_restarts=1)
    with make_box(box_rootfs, scenario, tmp_path) as box:
        install_job(box)
        submit(box, stack, spec)
        box.start()
        final = box.wait_for(
            "the job's final object", lambda: bucket_json(box, final_key(stack, spec.id)), JOB_SECONDS, poll=2
        )
        over = time.monotonic()
        codes = [node.wait_exit(END_SYNC_BOUND_SECONDS + 120) for node in box.nodes]
        ended = time.monotonic() - over
        assert codes == [0, 0], [n.diagnostics() for n in box.nodes]
        assert final["state"] == "failed"
        statuses = [bucket_json(box, status_key(stack, spec.id, f"rank-{r}")) for r in (0, 1)]
        assert [s["state"] for s in statuses] == ["failed", "failed"]
        # one restart on each node, caused by the exit, at the step it reached; the restart resumed
        # from the newest checkpoint (step 5) and failed at step 8 again. The cause is the
        # worker's exit status (train_tiny.py exits 3 there), which torchrun logs, not its own 1
        assert [[(r["cause"], r["step"]) for r in s["restarts"]] for s in statuses][0] == [("exit status 3", 8)]
        assert all(len(s["restarts"]) == 1 and s["restarts"][0]["cause"].startswith("exit status") for s in statuses)
        logs = sorted((box.state / "bucket" / box.bucket / f"jobs/{stack}/{spec.id}/logs/rank-0").glob("*.log"))
        text = "".join(p.read_text() for p in logs)
        assert "[rank-0] resumed from step 5" in text and text.count("[rank-0] failing at step=8 on purpose") == 2
        assert ended <= END_SYNC_BOUND_SECONDS + 120
        fault_row(
            "job crashes at step 8 every time, 1 restart allowed", "restarted from step 5, failed, nodes ended", ended
        )


class RestartWatch:
    """Polls one node's status in the stand-in bucket (a thread) and keeps the monotonic time
    its first restart was recorded: how long the node took to notice its lost peer."""

    def __init__(self, box: Box, key: str) -> None:
        self.box, self.key, self.at, self.stop = box, key, None, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            doc = bucket_json(self.box, self.key)
            if doc and doc.get("restarts"):
                self.at = time.monotonic()
                return


def interrupted_run(box_rootfs, tmp_path, lost_rank: int) -> dict:
    """The real 2-node job, interrupted: the rank-``lost_rank`` node gets a spot notice at its
    step-10 checkpoint and powers off; a replacement boots, takes that rank, restores and the job
    re-forms. Returns what the tests assert and print (every common check is made here)."""
    scenario = aws_p5()
    # a deployment id, as `gpuinfra up` gives every stack it creates: rank decisions are scoped by it
    spec0 = stack_spec(scenario.stack).model_copy(update={"deployment_id": "0c0c0c0c0c0c"})
    stack = spec0.stack
    # 1 s a step: the interruption lands mid-run (the sleep does not change the numbers)
    argv = (*JOB_ARGV, "--step-seconds", "1")
    spec = JobSpec(id=f"j-box-lost-rank-{lost_rank}", argv=argv, nproc_per_node=1, max_restarts=2)
    started = time.monotonic()
    with make_box(box_rootfs, scenario, tmp_path, spec0) as box:
        install_job(box)
        submit(box, stack, spec)
        box.start()
        envs = wait_ranked_and_passed(box)
        assert [e["NODE_RANK"] for e in envs] == ["0", "1"]
        lost = box.nodes[lost_rank]
        survivor = box.nodes[1 - lost_rank]
        survivor_rank = 1 - lost_rank
        box.wait_for(
            f"rank {lost_rank}'s step-10 checkpoint",
            lambda: lost.read(f"{CKPT}/step-10/{CHECKPOINT_COMPLETE_MARKER}"),
            JOB_SECONDS,
            poll=0.5,
        )
        box.notify(lost, "spot", {"action": "terminate", "time": "2026-11-27T12:02:00Z"})
        box.wait_for(
            f"rank {lost_rank}'s LATEST at step 10 or later",
            lambda: (d := latest(box, stack, f"rank-{lost_rank}")) and int(d["checkpoint"].split("-")[1]) >= 10,
            120,
            poll=0.5,
        )
        watch = RestartWatch(box, status_key(stack, spec.id, f"rank-{survivor_rank}"))
        interrupted = time.monotonic()
        lost.stop()  # EC2 takes the node at the notice's time; its shutdown sync may upload a newer one
        doc = latest(box, stack, f"rank-{lost_rank}")
        box.set_states("terminated", [lost.name])
        replacement = add_node(box, 2)
        install_job(box, [replacement])
        replacement.start()
        resume = box.wait_for(
            "the replacement's resume file", lambda: replacement.read("/run/gpuinfra/resume.env"), BOOT_SECONDS
        )
        (mine,) = wait_ranked_and_passed(box, [replacement])
        ranked = time.monotonic() - interrupted
        assert mine["NODE_RANK"] == str(lost_rank)
        final = box.wait_for(
            "the job's final object", lambda: bucket_json(box, final_key(stack, spec.id)), JOB_SECONDS, poll=2
        )
        resumed = time.monotonic() - interrupted
        survivor_env = env_file(survivor.read("/etc/gpuinfra/cluster.env") or "")
        watch.stop.set()
        noticed = watch.at - interrupted if watch.at else None
        over = time.monotonic()
        codes = [node.wait_exit(END_SYNC_BOUND_SECONDS + 120) for node in (survivor, replacement)]
        ended = time.monotonic() - over
        assert codes == [0, 0], [n.diagnostics() for n in box.nodes]
        assert final["state"] == "succeeded" and final["exit_code"] == 0
        restored = doc["checkpoint"]
        assert resume == f"GPUINFRA_RESUME_FROM={CKPT}/{restored}\n"
        statuses = [bucket_json(box, status_key(stack, spec.id, f"rank-{r}")) for r in (0, 1)]
        assert [s["state"] for s in statuses] == ["succeeded", "succeeded"]
        print(
            f"restarts: rank {survivor_rank} (survivor) {statuses[survivor_rank]['restarts']}, rank {lost_rank} (the replacement) {statuses[lost_rank]['restarts']}"
        )
        assert (statuses[survivor_rank]["node"], statuses[lost_rank]["node"]) == (survivor.name, replacement.name)
        # the replacement may find its first rendezvous round closed (the survivor's torchrun still
        # tearing down): such a restart redid no step
        assert all(r["step"] is None for r in statuses[lost_rank]["restarts"])
        # the survivor's job unit recorded the restart: its cause, where it resumed, the steps redone
        (restart,) = statuses[survivor_rank]["restarts"]
        assert restart["cause"].startswith("exit status") and restart["step"] >= 10
        assert restart["resumed_at_step"] >= int(restored.split("-")[1]) and restart["resumed_at_step"] % 5 == 0
        assert restart["steps_redone"] == restart["step"] - restart["resumed_at_step"]
        # the same final step and loss as the uninterrupted run. The process of global rank 0 writes
        # the result: torchrun's c10d rendezvous numbers the nodes of each round itself, so after a
        # re-forming it may run on either node (NODE_RANK only says which node hosts the store)
        job_root = box.state / "bucket" / box.bucket / f"jobs/{stack}/{spec.id}"
        (found,) = sorted(job_root.glob("outputs/rank-*/result.json"))
        result = json.loads(found.read_text())
        assert result == {"step": STEPS, "loss": UNINTERRUPTED_FINAL_LOSS}
        text = "".join(p.read_text() for p in sorted(job_root.glob("logs/rank-*/*.log")))
        assert f"] resumed from step {restart['resumed_at_step']}" in text
        shutdowns = sorted(c["node"] for c in box.calls() if c["argv"][0] == "shutdown")
        assert shutdowns == sorted([survivor.name, replacement.name])
        assert ended <= END_SYNC_BOUND_SECONDS + 120
        survivor_log = "".join(
            p.read_text()
            for p in sorted(
                (box.state / "bucket" / box.bucket / f"jobs/{stack}/{spec.id}/logs/rank-{survivor_rank}").glob("*.log")
            )
        )
        return {
            "restart": restart, "restored": restored, "result": result, "resumed": resumed, "ended": ended,
            "noticed": noticed, "ranked": ranked, "wall": time.monotonic() - started, "survivor_log": survivor_log,
            "replacement": replacement.ip, "survivor_env": survivor_env,
        }  # fmt: skip


def report(lost_rank: int, run: dict) -> str:
    """One line of what an interrupted run measured."""
    restart, noticed = run["restart"], run["noticed"]
    return (
        f"box interrupted job: rank {lost_rank} lost at step {restart['step']}, {run['restored']} restored on the "
        f"replacement, resumed at step {restart['resumed_at_step']} ({restart['steps_redone']} steps redone), final "
        f"step {run['result']['step']} loss {run['result']['loss']}; power-off to: survivor's restart "
        f"{'never seen' if noticed is None else f'{noticed:.0f} s'}, replacement ranked {run['ranked']:.0f} s, job end "
        f"{run['resumed']:.0f} s; nodes ended {run['ended']:.0f} s after the job, wall {run['wall']:.0f} s"
    )


def test_aws_training_job_survives_losing_rank_1_to_a_spot_interruption(box_rootfs, box_timer, fault_row, tmp_path):
    """The must-show of ``gpuinfra run``'s resume: the real 2-node job is interrupted mid-run. The
    rank-1 node gets a spot notice (its agent syncs its newest complete checkpoint) and powers
    off; the survivor's torchrun loses its peer and its job unit restarts the job, which waits in
    the c10d rendezvous; a replacement boots from the same boot text, takes rank 1, restores
    rank 1's newest checkpoint and joins; the job ends at the uninterrupted run's step and loss."""
    run = interrupted_run(box_rootfs, tmp_path, 1)
    print(report(1, run))
    fault_row(
        "real 2-node torchrun job: spot notice + power-off of rank 1 mid-run; replacement boots",
        f"takes rank 1, job resumes at step {run['restart']['resumed_at_step']}, same final step and loss",
        run["resumed"],
    )


def test_aws_training_job_survives_losing_rank_0_to_a_spot_interruption(box_rootfs, box_timer, fault_row, tmp_path):
    """As above with rank 0 lost, the node that hosts the rendezvous (``MASTER_ADDR``): the
    replacement takes rank 0, and the survivor's job unit reads that rank decision before its
    restart and rewrites its cluster.env's ``MASTER_ADDR`` to the replacement, so both meet in the
    replacement's rendezvous and the job ends at the uninterrupted run's step and loss."""
    run = interrupted_run(box_rootfs, tmp_path, 0)
    print(report(0, run))
    # the survivor followed rank 0 to the replacement: its cluster.env and its job log say so
    assert run["survivor_env"]["MASTER_ADDR"] == run["replacement"]
    assert run["survivor_env"]["NODE_RANK"] == "1"
    assert f"gpuinfra-job: rank 0 is now {run['replacement']}" in run["survivor_log"]
    fault_row(
        "real 2-node torchrun job: spot notice + power-off of rank 0 (rendezvous host) mid-run; replacement boots",
        f"takes rank 0, survivor follows it, job resumes at step {run['restart']['resumed_at_step']}, same final step and loss",
        run["resumed"],
    )
