"""Checkpoints in the box: a spot notice, a GCP preemption, an operator's sync request, a
power-off and a reboot, each with checkpoint folders on a node, against the real agent, restore
unit and ``gpuinfra-run`` (through the ``aws`` / ``gcloud`` stand-ins' bucket).

The stacks run with ``GPUINFRA_CHECKPOINT_INTERVAL_MINUTES=0`` (no background syncs), so each
fault's own path is what puts the checkpoints in the bucket.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from gpuinfra.agent.constants import CHECKPOINT_COMPLETE_MARKER, SYNC_REQUEST_TAG, sync_ack_key
from tests.box.box import EXIT_REBOOT, Box, Node
from tests.box.render import stack_spec
from tests.box.scenario import Scenario, aws_p5, gcp_a3mega
from tests.box.test_box import env_file, make_box, wait_ranked_and_passed

pytestmark = [pytest.mark.box]

CKPT = "/scratch/checkpoints"
NO_INTERVAL = {"GPUINFRA_CHECKPOINT_INTERVAL_MINUTES": "0"}


def write_checkpoints(node: Node, names: list[str], writing: str | None = None) -> None:
    """Complete checkpoint folders (two shards, then the completion marker), oldest first, one
    second apart; ``writing``: a folder a background writer keeps appending to (no marker)."""
    script = "".join(
        f"mkdir -p {CKPT}/{n} && head -c 200000 /dev/urandom > {CKPT}/{n}/shard-0.pt && "
        f"head -c 100000 /dev/urandom > {CKPT}/{n}/shard-1.pt && : > {CKPT}/{n}/{CHECKPOINT_COMPLETE_MARKER} && sleep 1 && "
        for n in names
    )
    node.exec(["/bin/sh", "-c", script + "true"], timeout=60)
    if writing:
        loop = f"mkdir -p {CKPT}/{writing}; while :; do head -c 4096 /dev/urandom >> {CKPT}/{writing}/shard-0.pt; sleep 0.2; done"
        node.exec(["systemd-run", "--unit", "box-trainer", "/bin/sh", "-c", loop])


def objects(box: Box, prefix: str) -> dict[str, bytes]:
    """Bucket objects under ``prefix``: key -> bytes."""
    root = box.state / "bucket" / box.bucket
    return (
        {str(p.relative_to(root)): p.read_bytes() for p in (root / prefix).rglob("*") if p.is_file()}
        if (root / prefix).exists()
        else {}
    )


def latest(box: Box, stack: str, part: str) -> dict | None:
    """The node part's LATEST document, or None."""
    path = box.state / "bucket" / box.bucket / "checkpoints" / stack / part / "LATEST"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def assert_uploaded_intact(box: Box, node: Node, doc: dict) -> None:
    """Every file of the folder LATEST names is in the bucket, byte for byte (sha256 on the node)."""
    name = doc["checkpoint"]
    uploaded = {k[len(doc["key"]) + 1 :]: v for k, v in objects(box, doc["key"]).items()}
    assert sorted(uploaded) == sorted(["shard-0.pt", "shard-1.pt", CHECKPOINT_COMPLETE_MARKER])
    for rel, body in uploaded.items():
        local = node.exec(["/usr/bin/sha256sum", f"{CKPT}/{name}/{rel}"]).stdout.split()[0]
        assert local == hashlib.sha256(body).hexdigest(), rel


def set_scenario(box: Box, update) -> None:
    """Rewrite the server's scenario.json (what ``down`` does to the instance's tag / attribute)."""
    path = box.state / "scenario.json"
    doc = json.loads(path.read_text())
    update(doc)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def test_aws_spot_notice_sync_request_reboot_restore_and_power_off(box_rootfs, box_timer, fault_row, tmp_path):
    scenario = Scenario(**{**aws_p5().__dict__, "node_env": NO_INTERVAL})
    stack = stack_spec(scenario.stack).stack
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        wait_ranked_and_passed(box)
        first, second = box.nodes

        # (a) spot notice: 6 folders, the newest complete one and one being written
        names = [f"step-{n:05d}" for n in range(1, 6)]
        write_checkpoints(first, names, writing="step-00006")
        box.notify(first, "spot", {"action": "terminate", "time": "2026-11-26T12:02:00Z"})
        started = time.monotonic()
        doc = box.wait_for(
            "LATEST at the newest complete checkpoint",
            lambda: (d := latest(box, stack, "rank-0")) and d["checkpoint"] == "step-00005" and d,
            120,
            poll=0.5,
        )
        seconds = time.monotonic() - started
        assert seconds < 120
        assert_uploaded_intact(box, first, doc)
        assert not [k for k in objects(box, f"checkpoints/{stack}") if "step-00006" in k]
        fault_row("AWS spot notice (120 s), 6 checkpoints, one being written", "newest complete in the bucket", seconds)

        # (d) the operator's sync request (the instance tag `down` sets), unsynced checkpoints
        write_checkpoints(second, ["step-00100", "step-00200"])
        set_scenario(box, lambda d: d["aws"]["tags"].update({SYNC_REQUEST_TAG: "down-7f3a"}))
        started = time.monotonic()
        ack_path = box.state / "bucket" / box.bucket / sync_ack_key(stack, "down-7f3a", second.name)
        ack = box.wait_for("the sync request's ack", lambda: ack_path.exists() and json.loads(ack_path.read_text()), 60)
        seconds = time.monotonic() - started
        assert ack["request"] == "down-7f3a" and ack["node"] == second.name and ack["complete"] is True
        assert ack["uploaded_files"] == 6
        assert latest(box, stack, "rank-1")["checkpoint"] == "step-00200"
        fault_row("sync request (down) with unsynced checkpoints", "acked, uploaded", seconds)
        set_scenario(box, lambda d: d["aws"]["tags"].pop(SYNC_REQUEST_TAG))

        # (e) a reboot onto empty scratch restores the newest checkpoint and the job env names it
        second.exec(["/bin/sh", "-c", f"rm -rf {CKPT}/*"])
        started = time.monotonic()
        second.exec(["systemctl", "reboot"], check=False)
        assert second.wait_exit(120) == EXIT_REBOOT
        second.start()
        resume = box.wait_for("the restore's resume file", lambda: second.read("/run/gpuinfra/resume.env"), 240)
        seconds = time.monotonic() - started
        assert resume == f"GPUINFRA_RESUME_FROM={CKPT}/step-00200\n"
        wait_ranked_and_passed(box, [second])
        second.exec(
            ["/usr/local/bin/gpuinfra-run", "--dry-run", "--wait", "60", "--", "python", "train.py"], timeout=90
        )
        job_env = env_file(second.read("/run/gpuinfra/env/run.env") or "")
        assert job_env["GPUINFRA_RESUME_FROM"] == f"{CKPT}/step-00200"
        assert second.read(f"{CKPT}/step-00200/{CHECKPOINT_COMPLETE_MARKER}") == ""
        fault_row("reboot mid-run onto empty scratch", "newest checkpoint restored, job env names it", seconds)

        # (c) power-off (SIGTERM, as `machinectl poweroff`) with an unsynced checkpoint
        write_checkpoints(second, ["step-00300"])
        started = time.monotonic()
        second.stop()
        assert not second.running()
        seconds = time.monotonic() - started
        doc = latest(box, stack, "rank-1")
        assert doc is not None and doc["checkpoint"] == "step-00300"
        assert len(objects(box, doc["key"])) == 3
        fault_row("power-off (SIGTERM) with an unsynced checkpoint", "in the bucket before the node stopped", seconds)


def test_gcp_preemption_syncs_the_newest_complete_checkpoint_within_30_seconds(
    box_rootfs, box_timer, fault_row, tmp_path
):
    scenario = Scenario(**{**gcp_a3mega().__dict__, "node_env": NO_INTERVAL})
    stack = stack_spec(scenario.stack).stack
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        wait_ranked_and_passed(box)
        node = box.nodes[0]
        write_checkpoints(node, [f"step-{n:05d}" for n in range(1, 6)], writing="step-00006")
        # GCE flips instance/preempted and sends the ACPI soft-off together: 30 s to the hard off
        box.notify(node, "preempted", True)
        node.exec(["systemctl", "poweroff", "--no-block"], check=False)
        started = time.monotonic()
        doc = box.wait_for(
            "LATEST at the newest complete checkpoint",
            lambda: (d := latest(box, stack, "rank-0")) and d["checkpoint"] == "step-00005" and d,
            30,
            poll=0.5,
        )
        seconds = time.monotonic() - started
        assert len(objects(box, doc["key"])) == 3
        assert not [k for k in objects(box, f"checkpoints/{stack}") if "step-00006" in k]
        assert node.wait_exit(60) == 0
        # a member of the managed instance group (created-by set): its repair recreates it, the
        # node asks for no replacement
        assert not [c for c in box.calls() if "create-instance" in c["argv"]]
        fault_row(
            "GCP preemption (30 s) + ACPI soft-off, 6 checkpoints, one being written",
            "newest complete in the bucket",
            seconds,
        )
