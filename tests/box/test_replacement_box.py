"""A lost node's replacement in the box: a formed 2-node AWS cluster, the rank-0 node gets a spot
notice and powers off, and a replacement boots from the same rendered boot text (the box stands
in for the cloud's replacement -- the Spot replacement function on AWS, on GCP the VM the
preempted node asks the managed instance group for -- with a fresh container and disk). It takes the lost node's rank, not the one its address sorts
to, and restores the lost node's newest complete checkpoint from the stand-in bucket before
``gpuinfra-run`` starts the job; the survivor keeps its rank.

The stack runs with ``GPUINFRA_CHECKPOINT_INTERVAL_MINUTES=0``: the spot notice's sync is what
puts the checkpoints in the bucket (as in test_checkpoints_box.py).
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from gpuinfra.agent.constants import CHECKPOINT_COMPLETE_MARKER
from tests.box.box import Node
from tests.box.render import stack_spec
from tests.box.scenario import Scenario, aws_p5, gcp_a3mega
from tests.box.test_box import BOOT_SECONDS, calls_of, env_file, make_box, peer_reads, wait_ranked_and_passed
from tests.box.test_checkpoints_box import CKPT, NO_INTERVAL, latest, objects, write_checkpoints

pytestmark = [pytest.mark.box]


def add_node(box, index: int, name: str = "") -> Node:
    """A fresh node (new container, empty disk, next address) booting the box's boot text; GCP:
    ``name`` makes it a member of the managed instance group of that name (a replacement the
    group created)."""
    node = Node(box, index)
    if name:
        node.name, node.mig = name, True
    box.nodes.append(node)
    node.plumb()
    node.mount()
    node.provision()
    box.set_states("running", [node.name])
    return node


def test_aws_replacement_takes_the_lost_rank_and_restores_its_newest_checkpoint(
    box_rootfs, box_timer, fault_row, tmp_path
):
    scenario = Scenario(**{**aws_p5().__dict__, "node_env": NO_INTERVAL})
    stack = stack_spec(scenario.stack).stack
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        envs = wait_ranked_and_passed(box)
        lost, survivor = box.nodes
        assert [e["NODE_RANK"] for e in envs] == ["0", "1"]

        write_checkpoints(lost, ["step-00010", "step-00020"], writing="step-00030")
        box.notify(lost, "spot", {"action": "terminate", "time": "2026-11-26T12:02:00Z"})
        doc = box.wait_for(
            "LATEST at the newest complete checkpoint",
            lambda: (d := latest(box, stack, "rank-0")) and d["checkpoint"] == "step-00020" and d,
            120,
            poll=0.5,
        )
        in_bucket = {k[len(doc["key"]) + 1 :]: v for k, v in objects(box, doc["key"]).items()}
        assert sorted(in_bucket) == sorted(["shard-0.pt", "shard-1.pt", CHECKPOINT_COMPLETE_MARKER])

        started = time.monotonic()
        lost.stop()  # EC2 terminates it at the notice's time
        box.set_states("terminated", [lost.name])
        replacement = add_node(box, 2)  # 10.77.0.13: sorts after the survivor's 10.77.0.12
        replacement.start()
        resume = box.wait_for(
            "the replacement's resume file", lambda: replacement.read("/run/gpuinfra/resume.env"), BOOT_SECONDS
        )
        seconds = time.monotonic() - started
        assert resume == f"GPUINFRA_RESUME_FROM={CKPT}/step-00020\n"
        (mine,) = wait_ranked_and_passed(box, [replacement])
        # the lost node's rank; the world and the survivor's ranks stand
        assert (mine["NODE_RANK"], mine["NNODES"]) == ("0", "2")
        assert replacement.read("/etc/gpuinfra/hostfile") == f"{replacement.ip}\n{survivor.ip}\n"
        assert env_file(survivor.read("/etc/gpuinfra/cluster.env"))["NODE_RANK"] == "1"
        # the restored folder is the uploaded one, byte for byte; the half-written step is not there
        listing = replacement.exec(["/bin/ls", "-A", CKPT]).stdout.split()
        assert listing == ["step-00020"]
        for rel, body in in_bucket.items():
            local = replacement.exec(["/usr/bin/sha256sum", f"{CKPT}/step-00020/{rel}"]).stdout.split()[0]
            assert local == hashlib.sha256(body).hexdigest(), rel
        replacement.exec(
            ["/usr/local/bin/gpuinfra-run", "--dry-run", "--wait", "60", "--", "python", "train.py"], timeout=90
        )
        job_env = env_file(replacement.read("/run/gpuinfra/env/run.env") or "")
        assert job_env["GPUINFRA_RESUME_FROM"] == f"{CKPT}/step-00020"
        fault_row(
            "AWS spot notice + power-off of rank 0; a replacement boots from the same boot text",
            "takes rank 0, restores step-00020 before the job",
            seconds,
        )


#: A stand-in training job (standard library): a fixed-seed loss that depends on every earlier
#: step, a checkpoint folder every 5 steps (``state.json``, then the completion marker last), a
#: resume from ``GPUINFRA_RESUME_FROM``; ``final.json`` at the end. It stands in for r27's job unit
#: (torchrun over both nodes), which the box cannot run yet: one process on the lost node, then
#: one on its replacement.
STANDIN_JOB = f"""
import json, os, pathlib, sys, time
total, ckpt = int(sys.argv[1]), pathlib.Path("{CKPT}")
step, loss = 0, 1.0
resume = os.environ.get("GPUINFRA_RESUME_FROM", "")
if resume:
    state = json.loads((pathlib.Path(resume) / "state.json").read_text())
    step, loss = state["step"], state["loss"]
first = step
while step < total:
    step += 1
    loss = round(loss * 0.97 + ((step * 7919) % 13) / 13000, 12)
    time.sleep(0.3)
    if step % 5 == 0:
        folder = ckpt / f"step-{{step:05d}}"
        folder.mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({{"step": step, "loss": loss}}))
        (folder / "{CHECKPOINT_COMPLETE_MARKER}").write_text("")
pathlib.Path("/var/lib/box-job").mkdir(exist_ok=True)
pathlib.Path("/var/lib/box-job/final.json").write_text(json.dumps({{"first": first, "step": step, "loss": loss}}))
"""


def reference_run(total: int) -> dict:
    """The uninterrupted run, computed here with the same arithmetic."""
    step, loss = 0, 1.0
    while step < total:
        step += 1
        loss = round(loss * 0.97 + ((step * 7919) % 13) / 13000, 12)
    return {"first": 0, "step": step, "loss": loss}


def test_aws_standin_job_resumed_on_the_replacement_ends_like_an_uninterrupted_run(
    box_rootfs, box_timer, fault_row, tmp_path
):
    total = 60
    scenario = Scenario(**{**aws_p5().__dict__, "node_env": NO_INTERVAL})
    stack = stack_spec(scenario.stack).stack
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        wait_ranked_and_passed(box)
        lost = box.nodes[0]
        lost.exec(["/bin/sh", "-c", f"cat > /root/job.py <<'PY'\n{STANDIN_JOB}\nPY"])
        lost.exec(["systemd-run", "--unit", "box-job", "/usr/bin/python3", "/root/job.py", str(total)])
        box.wait_for(
            "the job's step-00025 checkpoint", lambda: lost.read(f"{CKPT}/step-00025/state.json"), 60, poll=0.3
        )
        box.notify(lost, "spot", {"action": "terminate", "time": "2026-11-26T12:02:00Z"})
        box.wait_for("LATEST in the bucket", lambda: latest(box, stack, "rank-0"), 120, poll=0.5)
        lost.exec(["systemctl", "kill", "--signal=SIGKILL", "box-job"], check=False)  # EC2 takes the node
        reached = max(
            int(p.split("-")[1]) for p in lost.exec(["/bin/ls", CKPT]).stdout.split() if p.startswith("step-")
        )
        started = time.monotonic()
        lost.stop()  # its shutdown sync may upload a newer checkpoint than the notice's first one
        doc = latest(box, stack, "rank-0")
        box.set_states("terminated", [lost.name])
        replacement = add_node(box, 2)
        replacement.start()
        resume = box.wait_for(
            "the replacement's resume file", lambda: replacement.read("/run/gpuinfra/resume.env"), BOOT_SECONDS
        )
        assert resume == f"GPUINFRA_RESUME_FROM={CKPT}/{doc['checkpoint']}\n"
        replacement.exec(["/bin/sh", "-c", f"cat > /root/job.py <<'PY'\n{STANDIN_JOB}\nPY"])
        replacement.exec(
            ["/bin/sh", "-c", f"set -a; . /run/gpuinfra/resume.env; exec /usr/bin/python3 /root/job.py {total}"],
            timeout=120,
        )
        seconds = time.monotonic() - started
        final = json.loads(replacement.read("/var/lib/box-job/final.json"))
        resumed_at = int(doc["checkpoint"].split("-")[1])
        assert final == {**reference_run(total), "first": resumed_at}  # same final step and loss
        assert resumed_at >= 25 and reached >= resumed_at
        fault_row(
            f"stand-in job: spot notice + power-off (newest checkpoint on the node: step {reached})",
            f"replacement resumed at step {resumed_at}; final step {total} and loss as uninterrupted",
            seconds,
        )


def test_gcp_preempted_bulk_vm_asks_the_group_for_a_replacement_which_takes_its_rank_and_checkpoint(
    box_rootfs, box_timer, fault_row, tmp_path
):
    """GCP, the laptop off: the VMs of a bulk insert are no members of the stack's managed instance
    group, so nothing recreates a preempted one by itself. On the preemption (the ``preempted``
    flag and the ACPI soft-off come together) its agent asks the group for a replacement
    (``create-instance`` with a new ``<group>-xxxx`` name) while it syncs its checkpoints. The box
    boots that replacement when the stand-in records the call: a group member with a new name and
    address, which takes the lost node's rank 0 through the newest rank decision and restores
    step-00020; the survivor keeps rank 1."""
    scenario = Scenario(**{**gcp_a3mega().__dict__, "node_env": NO_INTERVAL, "gcp_bulk": True})
    stack = stack_spec(scenario.stack).stack
    zone = stack_spec(scenario.stack).zone
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        wait_ranked_and_passed(box)
        lost, survivor = box.nodes
        assert not lost.mig and not survivor.mig
        write_checkpoints(lost, ["step-00010", "step-00020"])
        started = time.monotonic()
        box.notify(lost, "preempted", True)
        lost.exec(["systemctl", "poweroff", "--no-block"], check=False)  # the ACPI soft-off
        create = ["gcloud", "compute", "instance-groups", "managed", "create-instance", box.boot.group]
        # within the notice's 30 s (cloud.google.com/compute/docs/instances/spot#preemption-process)
        asked = box.wait_for("the replacement request", lambda: calls_of(box, create), 30, poll=0.5)
        ((who, argv),) = asked
        new = argv[6].removeprefix("--instance=")
        assert who == lost.name and argv[7:] == [f"--zone={zone}"]
        suffix = new.removeprefix(f"{box.boot.group}-")
        assert len(suffix) == 4 and suffix.isalnum() and new not in box.boot.bulk_names
        box.wait_for(
            "LATEST at the newest complete checkpoint",
            lambda: (d := latest(box, stack, "rank-0")) and d["checkpoint"] == "step-00020",
            30,
            poll=0.5,
        )
        assert lost.wait_exit(60) == 0
        box.set_states("terminated", [lost.name])  # Compute Engine deletes it (DELETE on preemption)
        replacement = add_node(box, 2, name=new)  # 10.77.0.13: sorts after the survivor's 10.77.0.12
        assert replacement.mig  # the group created it: created-by set, listed by the group
        replacement.start()
        resume = box.wait_for(
            "the replacement's resume file", lambda: replacement.read("/run/gpuinfra/resume.env"), BOOT_SECONDS
        )
        seconds = time.monotonic() - started
        assert resume == f"GPUINFRA_RESUME_FROM={CKPT}/step-00020\n"
        (mine,) = wait_ranked_and_passed(box, [replacement])
        # the lost node's rank; the world and the survivor's rank stand
        assert (mine["NODE_RANK"], mine["NNODES"]) == ("0", "2")
        assert replacement.read("/etc/gpuinfra/hostfile") == f"{replacement.ip}\n{survivor.ip}\n"
        assert env_file(survivor.read("/etc/gpuinfra/cluster.env"))["NODE_RANK"] == "1"
        # one request, from the lost node only; the formation watchdog released nothing
        assert len(calls_of(box, create)) == 1
        assert not [c for c in box.calls() if "resize" in c["argv"]]
        # peers are read by name, a name seen RUNNING again only in the deciding round; never a
        # project-wide list (the node role may not list the project's VMs)
        for node in (survivor, replacement):
            rounds, lists, describes = peer_reads(box, node.name)
            assert lists == 0 and describes <= 2 * 2 + rounds, (node.name, rounds, describes)
        fault_row(
            "GCP preemption of a bulk VM (laptop off)",
            "asks the group for a replacement; it takes rank 0, restores step-00020 (s: notice to restore)",
            seconds,
        )
