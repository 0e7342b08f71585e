"""Checkpoint selection, completeness, ordering, restore and sync requests (gpuinfra.agent.checkpoints),
with fake clocks, real files and a fake CLI with injected faults (tests/agent/fakecli.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpuinfra.agent import checkpoints as ck
from gpuinfra.agent.constants import CHECKPOINT_COMPLETE_MARKER, sync_ack_key
from tests.agent.fakecli import FakeCli

T0 = 1_800_000_000.0  # epoch seconds of the fake wall clock


class Clock:
    def __init__(self, t=T0):
        self.t = t

    def __call__(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds


def write(folder: Path, name: str, body: bytes, at: float) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    os.utime(path, (at, at))
    return path


def checkpoint(root: Path, name: str, at: float, marker: str | None = CHECKPOINT_COMPLETE_MARKER, shards=2) -> Path:
    for i in range(shards):
        write(root / name, f"shard-{i}.pt", f"{name}-{i}".encode() * 10, at)
    if marker:
        write(root / name, marker, b"", at + 1)
    return root / name


def make_sync(tmp_path, clock, cli=None, cloud="aws", cluster_env=None):
    cli = cli or FakeCli(sleep=clock.sleep)
    env = cluster_env or tmp_path / "cluster.env"
    sync = ck.CheckpointSync(
        tmp_path / "ckpt",
        ck.Bucket(cloud, "bkt", run=cli),
        "st",
        "i-0abc",
        state_file=tmp_path / "state.json",
        clock=clock,
        wall=clock,
        cluster_env=env,
    )
    return sync, cli


def latest(cli, part="rank-0"):
    return json.loads(cli.objects[f"bkt/checkpoints/st/{part}/LATEST"])


def test_completeness_by_each_marker_and_by_the_quiet_period(tmp_path):
    root = tmp_path / "ckpt"
    checkpoint(root, "marked", T0 - 10)
    checkpoint(root, "dcp", T0 - 10, marker=".metadata")
    checkpoint(root, "checkpoint-500", T0 - 10, marker="trainer_state.json")
    checkpoint(root, "other-500", T0 - 10, marker="trainer_state.json")  # not an HF Trainer folder name
    checkpoint(root, "quiet", T0 - ck.QUIET_SECONDS, marker=None)
    checkpoint(root, "fresh", T0 - ck.QUIET_SECONDS + 1, marker=None)
    stale = checkpoint(root, "rewritten", T0 - 100)
    write(stale, "shard-0.pt", b"new bytes", T0 - 5)  # rewritten after its marker
    (root / "empty").mkdir()
    got = {f.name: (f.complete, f.why) for f in ck.scan(root, T0)}
    assert got == {
        "marked": (True, CHECKPOINT_COMPLETE_MARKER),
        "dcp": (True, ".metadata"),
        "checkpoint-500": (True, "trainer_state.json"),
        "other-500": (False, "being written"),
        "quiet": (False, "no completion file (its siblings have one)"),  # the job marks its checkpoints
        "fresh": (False, "being written"),
        "rewritten": (False, f"{CHECKPOINT_COMPLETE_MARKER} older than the folder's newest file (being rewritten)"),
        "empty": (False, "empty"),
    }


def test_newest_complete_goes_first_and_latest_points_at_it(tmp_path):
    clock = Clock()
    sync, cli = make_sync(tmp_path, clock)
    (tmp_path / "cluster.env").write_text("NNODES=2\nNODE_RANK=0\n")
    root = sync.root
    for n in range(1, 6):
        checkpoint(root, f"step-{n:05d}", T0 - 1000 + n * 100)
    checkpoint(root, "step-00006", T0 - 1, marker=None)  # being written
    result = sync.sync(clock() + 60)
    uploads = [c[-1] for c in cli.calls if c[1:3] == ["s3", "sync"]]
    assert [u.split("/")[-2] for u in uploads] == [f"step-{n:05d}" for n in (5, 4, 3, 2, 1)]
    assert result.uploaded == [f"step-{n:05d}" for n in (5, 4, 3, 2, 1)] and result.complete
    assert latest(cli)["checkpoint"] == "step-00005"
    assert not [k for k in cli.keys("bkt/") if "step-00006" in k]
    # LATEST is written after the newest folder's upload and never moves back to an older one
    puts = [i for i, c in enumerate(cli.calls) if c[-1].endswith("/LATEST")]
    assert puts == [1]
    assert sync.sync(clock() + 60).uploaded == []  # nothing new


def test_the_window_ends_mid_way_and_the_newest_is_already_in(tmp_path):
    clock = Clock()
    cli = FakeCli(sleep=clock.sleep)
    cli.seconds_per_call = 7.0  # every CLI call (a folder, LATEST)
    sync, _ = make_sync(tmp_path, clock, cli)
    for n in range(1, 7):
        checkpoint(sync.root, f"step-{n}", T0 - 1000 + n * 100)
    started = clock()
    result = sync.sync(started + 22.5)  # GCP: 30 s notice x 0.75
    # step-6 (7 s), LATEST (7 s), step-5 (7 s), LATEST not newer; step-4 killed at the deadline
    assert result.uploaded == ["step-6", "step-5"] and not result.complete
    assert latest(cli, "node-i-0abc")["checkpoint"] == "step-6"
    assert clock() - started == 22.5


def test_an_upload_failing_mid_way_is_retried_and_latest_waits(tmp_path):
    clock = Clock()
    sync, cli = make_sync(tmp_path, clock)
    checkpoint(sync.root, "step-1", T0 - 500)
    checkpoint(sync.root, "step-2", T0 - 100)
    cli.fail = lambda argv: argv[1:3] == ["s3", "sync"] and "step-2" in argv[-2]
    result = sync.sync(clock() + 60)
    assert result.uploaded == ["step-1"] and not result.complete
    assert latest(cli, "node-i-0abc")["checkpoint"] == "step-1"
    cli.fail = lambda argv: False
    assert sync.sync(clock() + 60).uploaded == ["step-2"]
    assert latest(cli, "node-i-0abc")["checkpoint"] == "step-2"


def test_a_folder_rewritten_during_its_upload_replaces_nothing(tmp_path):
    clock = Clock()
    sync, cli = make_sync(tmp_path, clock)
    good = checkpoint(sync.root, "latest", T0 - 500)
    assert sync.sync(clock() + 60).uploaded == ["latest"]
    good_doc = latest(cli, "node-i-0abc")
    good_objects = {k: v for k, v in cli.objects.items() if good_doc["key"] in k}
    clock.t += 600
    write(good, "shard-0.pt", b"rewritten", clock())  # the trainer saves again ...
    write(good, CHECKPOINT_COMPLETE_MARKER, b"", clock() + 1)

    def torn(folder):  # ... and is rewriting a shard while it uploads
        write(folder, "shard-1.pt", b"half", clock() + 2)

    cli.during_upload = torn
    result = sync.sync(clock() + 60)
    assert result.uploaded == [] and not result.complete
    assert latest(cli, "node-i-0abc") == good_doc  # still the good copy
    assert {k: v for k, v in cli.objects.items() if good_doc["key"] in k} == good_objects


def test_a_hanging_cli_is_killed_at_the_deadline(tmp_path):
    clock = Clock()
    cli = FakeCli(sleep=clock.sleep)
    cli.seconds_per_call = 1e6
    sync, _ = make_sync(tmp_path, clock, cli)
    checkpoint(sync.root, "step-1", T0 - 500)
    started = clock()
    result = sync.sync(started + 25)
    assert not result.complete and clock() - started <= 25 + 1e-6


def test_restore_puts_latest_back_and_names_it_for_the_job(tmp_path):
    clock = Clock()
    sync, cli = make_sync(tmp_path, clock, cloud="gcp")
    (tmp_path / "cluster.env").write_text("NODE_RANK=1\n")
    checkpoint(sync.root, "step-1", T0 - 500)
    checkpoint(sync.root, "step-2", T0 - 100)
    sync.sync(clock() + 60)
    # a replacement node: empty scratch, no state, the same rank
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "cluster.env").write_text("NODE_RANK=1\n")
    other, _ = make_sync(fresh, clock, cli, cloud="gcp")
    resume = fresh / "resume.env"
    found = ck.restore(other, 60, resume)
    assert found == fresh / "ckpt" / "step-2"
    assert sorted(p.name for p in found.iterdir()) == sorted(p.name for p in (sync.root / "step-2").iterdir())
    assert resume.read_text() == f"GPUINFRA_RESUME_FROM={found}\n"
    assert other.sync(clock() + 60).uploaded == []  # the restored folder is not uploaded again
    assert cli.calls[-1][1:3] == ["storage", "rsync"] and cli.calls[-1][-2].startswith(
        "gs://bkt/checkpoints/st/rank-1/step-2/"
    )


def test_restore_without_latest_writes_an_empty_resume(tmp_path):
    clock = Clock()
    sync, _ = make_sync(tmp_path, clock)
    resume = tmp_path / "resume.env"
    assert ck.restore(sync, 60, resume) is None
    assert resume.read_text() == "GPUINFRA_RESUME_FROM=\n"


def test_a_sync_request_is_answered_once_with_an_ack(tmp_path):
    clock = Clock()
    sync, cli = make_sync(tmp_path, clock, cloud="gcp")
    checkpoint(sync.root, "step-1", T0 - 500)
    answers = {"instance/attributes/gpuinfra-sync-request": (200, "down-1a2b")}
    requests = ck.Requests(sync, "gcp", lambda path: answers.get(path, (404, "")))
    assert requests.poll() == "down-1a2b"
    ack = json.loads(cli.objects["bkt/" + sync_ack_key("st", "down-1a2b", "i-0abc")])
    assert ack == {
        "request": "down-1a2b",
        "node": "i-0abc",
        "uploaded_files": 3,
        "complete": True,
        "finished_at": "2027-01-15T08:00:00Z",
    }
    assert requests.poll() is None  # the same id: not again
    answers["instance/attributes/gpuinfra-sync-request"] = (200, "Bad Id!")
    assert requests.poll() is None


def test_aws_rebalance_recommendation_starts_a_sync(tmp_path):
    clock = Clock()
    sync, cli = make_sync(tmp_path, clock)
    checkpoint(sync.root, "step-1", T0 - 500)
    answers = {"events/recommendations/rebalance": (200, '{"noticeTime": "2027-01-15T08:00:00Z"}')}
    ck.Requests(sync, "aws", lambda path: answers.get(path, (404, ""))).poll()
    assert latest(cli, "node-i-0abc")["checkpoint"] == "step-1"


def test_the_watcher_wakes_on_a_marker(tmp_path):
    root = tmp_path / "ckpt"
    (root / "step-1").mkdir(parents=True)
    watcher = ck.Watcher(root)
    assert watcher.fd >= 0  # Linux: inotify
    watcher._add_watches()
    (root / "step-1" / CHECKPOINT_COMPLETE_MARKER).write_text("")
    assert watcher.wait(5, set) is True
    assert watcher.wait(0.1, set) is False


def test_a_notice_during_a_background_upload_sends_the_newest_at_once(tmp_path):
    import threading
    import time

    cli = FakeCli()
    sync = ck.CheckpointSync(
        tmp_path / "ckpt",
        ck.Bucket("aws", "bkt", run=cli),
        "st",
        "i-0abc",
        state_file=tmp_path / "state.json",
        cluster_env=tmp_path / "cluster.env",
    )
    now = time.time()
    checkpoint(sync.root, "step-1", now - 500)
    release, started = threading.Event(), threading.Event()

    def slow(folder):  # the background pass's upload of step-1 is still running
        if folder.name == "step-1":
            started.set()
            release.wait(30)

    cli.during_upload = slow
    background = threading.Thread(target=sync.sync, args=(time.monotonic() + 60,))
    background.start()
    assert started.wait(10)
    checkpoint(sync.root, "step-2", now - 10)  # completes meanwhile; then the spot notice
    t0 = time.monotonic()
    result = sync.sync(t0 + 2)
    assert result.uploaded == ["step-2"] and not result.complete  # step-1 still in flight at the deadline
    assert 1.9 < time.monotonic() - t0 < 5
    assert latest(cli, "node-i-0abc")["checkpoint"] == "step-2"
    release.set()
    background.join(10)
    assert latest(cli, "node-i-0abc")["checkpoint"] == "step-2"  # the older upload does not move it back
    assert sync.uploaded.keys() == {"step-1", "step-2"}


def test_quiet_never_completes_a_folder_whose_kind_says_how_complete_looks(tmp_path):
    """A job killed mid-save leaves a quiet folder: one of a kind with a completion file (HF
    ``checkpoint-N``, DCP ``*.distcp``, a folder with a stale marker, or any folder of a job
    that marks its checkpoints) never counts as complete by the quiet period alone."""
    quiet_at = T0 - ck.QUIET_SECONDS - 60
    root = tmp_path / "ckpt"
    checkpoint(root, "checkpoint-700", quiet_at, marker=None)  # HF: no trainer_state.json
    write(root / "dcp-7", "__0_0.distcp", b"shard", quiet_at)  # DCP: no .metadata
    stale = checkpoint(root, "step-7", quiet_at - 60)
    write(stale, "shard-0.pt", b"rewrite cut off", quiet_at)  # marker older than a shard
    got = {f.name: (f.complete, f.why) for f in ck.scan(root, T0)}
    assert {name: complete for name, (complete, _) in got.items()} == {
        "checkpoint-700": False,
        "dcp-7": False,
        "step-7": False,
    }
    # a job that marks its checkpoints: an unmarked quiet sibling is an unfinished one
    checkpoint(root, "step-6", quiet_at - 600)  # marked
    checkpoint(root, "step-8", quiet_at, marker=None)  # quiet, unmarked
    got = {f.name: (f.complete, f.why) for f in ck.scan(root, T0)}
    assert got["step-6"] == (True, CHECKPOINT_COMPLETE_MARKER)
    assert got["step-8"] == (False, "no completion file (its siblings have one)")
    # with no completion file anywhere, quiet is the only sign there is
    bare = tmp_path / "bare"
    checkpoint(bare, "run-1", quiet_at, marker=None)
    assert [(f.name, f.complete, f.why) for f in ck.scan(bare, T0)] == [("run-1", True, "quiet")]


def test_a_sync_started_on_top_of_its_own_threads_upload_takes_that_folder_over(tmp_path):
    """SIGTERM arrives while the main thread's end sync is uploading the newest folder: the
    handler's sync runs on the same thread, above the suspended upload, which can never finish.
    It uploads that folder itself and moves LATEST to it, instead of waiting for it."""
    clock = Clock()
    cli = FakeCli(sleep=clock.sleep)
    sync, _ = make_sync(tmp_path, clock, cli)
    (tmp_path / "cluster.env").write_text("NNODES=1\nNODE_RANK=0\n")
    checkpoint(sync.root, "step-1", T0 - 500)
    checkpoint(sync.root, "step-2", T0 - 100)
    nested: list = []
    signalled: list = []

    def signal_during_upload(folder):
        if folder.name == "step-2" and not signalled:
            signalled.append(True)
            nested.append(sync.sync(clock() + 25))  # the SIGTERM handler's bounded sync

    cli.during_upload = signal_during_upload
    sync.sync(clock() + 300)
    stop = nested[0]
    assert stop.uploaded[0] == "step-2" and stop.complete
    assert latest(cli)["checkpoint"] == "step-2"
    assert clock() - T0 < 25  # it never waited for its own suspended upload


def test_sync_requests_are_answered_while_a_long_background_pass_uploads(tmp_path, monkeypatch):
    """A background pass may upload for most of an hour; ``down`` waits minutes for the ack: the
    request poll runs beside the pass, not between passes."""
    import threading
    import time

    monkeypatch.setattr(ck, "REQUEST_POLL_SECONDS", 0.05)
    release, uploading, polls = threading.Event(), threading.Event(), []
    cli = FakeCli()

    def slow_upload(folder):  # a 1 TB checkpoint: the pass holds here until the test ends it
        uploading.set()
        release.wait(10)

    cli.during_upload = slow_upload
    sync = ck.CheckpointSync(
        tmp_path / "ckpt", ck.Bucket("aws", "bkt", run=cli), "st", "i-0abc", state_file=tmp_path / "s.json"
    )
    checkpoint(sync.root, "step-1", time.time() - 10)
    stop = threading.Event()
    loop = threading.Thread(target=ck.keep_syncing, args=(sync, 0.01, lambda: polls.append(1), stop), daemon=True)
    loop.start()
    try:
        assert uploading.wait(10)
        before = len(polls)
        time.sleep(0.5)
        assert len(polls) > before + 3  # answered while the upload runs
    finally:
        release.set()
        stop.set()
        loop.join(10)


def test_a_folder_the_restore_recorded_after_the_agent_started_is_not_uploaded_again(tmp_path):
    """The agent's sync is built before ``gpuinfra-restore.service`` runs in its own process and
    records the folder it put back: the agent reads that record and uploads nothing."""
    clock = Clock()
    agent_sync, cli = make_sync(tmp_path, clock)  # the agent's, built first
    (tmp_path / "cluster.env").write_text("NNODES=1\nNODE_RANK=0\n")
    folder = checkpoint(agent_sync.root, "step-9", T0 - 300)
    restore_sync, _ = make_sync(tmp_path, clock, cli)  # the restore's process
    restore_sync.uploaded["step-9"] = ck.inspect_folder(folder, T0).signature
    restore_sync.latest_ns = ck.inspect_folder(folder, T0).newest_ns
    restore_sync._save_state()
    assert agent_sync.sync(clock() + 60).uploaded == [] and not cli.calls
