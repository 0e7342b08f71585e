"""Checkpoint sync and restore on the node: the checkpoint folder to and from the stack bucket.

Standard library only (the node bundle ships it, :data:`gpuinfra.plan.node_bundle.NODE_MODULES`);
the agent (:mod:`gpuinfra.agent.node`) imports it once the bundle is installed. Documented for
users in README.md, "Checkpoints: sync, shutdown, restore".

**A checkpoint** is a folder directly under the checkpoint dir (``GPUINFRA_CHECKPOINT_DIR``,
default ``<scratch>/checkpoints``); files directly in the dir are not synced. A folder is
*complete* when one of these files is in it and no other file of the folder is newer
(:func:`inspect_folder`; a marker older than another file means the folder is being rewritten):

* :data:`~gpuinfra.agent.constants.CHECKPOINT_COMPLETE_MARKER` (``.gpuinfra-complete``), which
  the job writes last;
* ``.metadata``: torch.distributed.checkpoint's ``FileSystemWriter.finish`` writes it once every
  rank's data is written (pytorch ``torch/distributed/checkpoint/filesystem.py``; it is what
  ``dcp.load`` reads first);
* ``trainer_state.json`` in a ``checkpoint-<N>`` folder: Hugging Face ``Trainer._save_checkpoint``
  writes it after the model, optimizer and scheduler (transformers ``src/transformers/trainer.py``);

or else when no file of it changed for :data:`QUIET_SECONDS`.

**Key layout** (one *part* per node: ``rank-<NODE_RANK>`` from ``/etc/gpuinfra/cluster.env``,
else ``node-<instance id or VM name>``, so a rebooted or replaced node with the same rank finds
its own part)::

    checkpoints/<stack>/<part>/<folder>/<signature>/<files...>   one complete upload
    checkpoints/<stack>/<part>/LATEST                            written last (JSON, below)

``<signature>`` is a hash of the folder's file names, sizes and modification times: a folder
rewritten later goes to a new key, so an upload never overwrites a complete copy. ``LATEST`` =
``{"checkpoint", "key", "signature", "files", "bytes", "newest_mtime", "node", "written_at"}``
points at the newest complete folder; it is written only after that folder's upload finished and
the folder did not change during it.

**Sync** (:class:`CheckpointSync`): complete folders, newest first, each once per signature;
the AWS CLI (``aws s3 sync``) or ``gcloud storage rsync``, one process per folder, killed at the
deadline. It runs every ``GPUINFRA_CHECKPOINT_INTERVAL_MINUTES`` and when a marker appears
(inotify, else a poll) (:func:`keep_syncing`), and bounded on a spot notice, a rebalance
recommendation, SIGTERM, an operator's sync request and before the agent ends the node.

**Restore** (:func:`restore`, ``python3 -m gpuinfra.agent.checkpoints restore``, unit
``gpuinfra-restore.service``): the folder ``LATEST`` names is copied back to the checkpoint dir
and its path written to ``/run/gpuinfra/resume.env`` as ``GPUINFRA_RESUME_FROM=<path>``, which
``gpuinfra-run`` passes to the job.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from gpuinfra.agent.constants import (
    CHECKPOINT_COMPLETE_MARKER,
    RESUME_ENV,
    RESUME_FILE_PATH,
    SYNC_REQUEST_ATTRIBUTE,
    SYNC_REQUEST_BOUND_SECONDS,
    SYNC_REQUEST_ID_PATTERN,
    SYNC_REQUEST_TAG,
    sync_ack_key,
)

LOG = logging.getLogger("gpuinfra-agent")
#: Seconds without a change after which a folder with no completion file counts as complete.
QUIET_SECONDS = 120
#: Seconds between reads of the operator's sync request and the AWS rebalance recommendation.
REQUEST_POLL_SECONDS = 10
#: Seconds between scans for a new completion file where inotify is not available.
POLL_SECONDS = 30
#: Seconds one ``LATEST`` write may take (a small object: a slow write is a failing one).
LATEST_WRITE_SECONDS = 30
#: Seconds one background pass may take (a pass that outlives it resumes at the next trigger).
BACKGROUND_PASS_SECONDS = 3600
CLUSTER_ENV = Path("/etc/gpuinfra/cluster.env")
RESUME_FILE = Path(RESUME_FILE_PATH)
STATE_FILE = Path("/var/lib/gpuinfra/checkpoint-sync.json")
_NAME = re.compile(r"[A-Za-z0-9._=+-]{1,200}")


def _utc(seconds: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if seconds is None else seconds, timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


@dataclass(frozen=True)
class Folder:
    """One checkpoint folder as scanned.

    Attributes:
        name: folder name (directly under the checkpoint dir).
        path: the folder.
        files: ``(relative path, size bytes, mtime ns)``, sorted.
        newest_ns: newest modification time of the folder's files (ns since the epoch; 0: empty).
        complete: safe to upload (module docstring).
        why: what made it complete (the file's name, ``quiet``) or not.
    """

    name: str
    path: Path
    files: tuple[tuple[str, int, int], ...]
    newest_ns: int
    complete: bool
    why: str

    @property
    def signature(self) -> str:
        """12 hex digits over :attr:`files` (another content, another signature)."""
        return hashlib.sha256(json.dumps(self.files).encode()).hexdigest()[:12]

    @property
    def size_bytes(self) -> int:
        """Total size of the folder's files."""
        return sum(f[1] for f in self.files)


def completion_files(name: str) -> tuple[str, ...]:
    """The files whose presence (newest in the folder) marks folder ``name`` complete."""
    hf = ("trainer_state.json",) if re.fullmatch(r"checkpoint-\d+", name) else ()
    return (CHECKPOINT_COMPLETE_MARKER, ".metadata", *hf)


def inspect_folder(path: Path, now_s: float, quiet_seconds: float = QUIET_SECONDS) -> Folder:
    """Scan one folder (symlinks skipped): its files and whether it is complete at ``now_s``
    (epoch seconds)."""
    files = []
    for dirpath, dirnames, names in os.walk(path):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for n in names:
            full = os.path.join(dirpath, n)
            try:
                st = os.lstat(full)
            except OSError:
                continue  # removed while scanned
            if os.path.isfile(full) and not os.path.islink(full):
                files.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
    files.sort()
    newest = max((f[2] for f in files), default=0)
    mtimes = {f[0]: f[2] for f in files}
    why = "empty" if not files else "being written"
    complete = False
    for marker in completion_files(path.name):
        if marker in mtimes:
            others = max((m for r, m in mtimes.items() if r != marker), default=0)
            if mtimes[marker] >= others:
                complete, why = True, marker
                break
            why = f"{marker} older than the folder's newest file (being rewritten)"
    # quiet only where nothing says how complete looks: never a folder whose marker is stale, a
    # Hugging Face checkpoint-N without trainer_state.json, or a DCP folder (*.distcp) without .metadata
    known_kind = bool(completion_files(path.name)[2:]) or any(r.endswith(".distcp") for r in mtimes)
    if not complete and why == "being written" and not known_kind and now_s - newest / 1e9 >= quiet_seconds:
        complete, why = True, "quiet"
    return Folder(path.name, path, tuple(files), newest, complete, why)


def scan(root: Path, now_s: float, quiet_seconds: float = QUIET_SECONDS) -> list[Folder]:
    """Every checkpoint folder under ``root``, newest first (empty when ``root`` is missing)."""
    try:
        entries = [
            p
            for p in root.iterdir()
            if p.is_dir() and not p.is_symlink() and _NAME.fullmatch(p.name) and p.name[0] != "."
        ]
    except OSError:
        return []
    folders = [inspect_folder(p, now_s, quiet_seconds) for p in entries]
    if any(f.complete and f.why != "quiet" for f in folders):
        # a job that marks its checkpoints marks every one: an unmarked folder is an unfinished one
        folders = [
            replace(f, complete=False, why="no completion file (its siblings have one)") if f.why == "quiet" else f
            for f in folders
        ]
    return sorted(folders, key=lambda f: (f.newest_ns, f.name), reverse=True)


class Bucket:
    """The stack bucket through the cloud's CLI (``aws`` on the Deep Learning AMI, ``gcloud`` on
    the GCP images): one process per call, killed when ``timeout`` passes.

    Args:
        cloud: ``aws`` | ``gcp``.
        bucket: bucket name.
        run: :func:`subprocess.run` (tests pass a fake).
    """

    def __init__(self, cloud: str, bucket: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run):
        self.cloud, self.bucket, self._run = cloud, bucket, run
        self.scheme = "s3" if cloud == "aws" else "gs"

    def url(self, key: str) -> str:
        """``s3://bucket/key`` / ``gs://bucket/key``."""
        return f"{self.scheme}://{self.bucket}/{key}"

    def _call(self, argv: list[str], timeout: float, stdin: str | None = None) -> str:
        if timeout <= 0:
            raise TimeoutError(f"no time left for {argv[:3]}")
        done = self._run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise OSError(f"{' '.join(argv[:3])} exited {done.returncode}: {(done.stderr or '').strip()[-300:]}")
        return done.stdout or ""

    def put_tree(self, folder: Path, key: str, timeout: float) -> None:
        """Upload every file under ``folder`` to ``key/<relative path>``.

        Raises:
            OSError: the CLI failed; subprocess.TimeoutExpired / TimeoutError: out of time.
        """
        if self.cloud == "aws":
            argv = ["aws", "s3", "sync", "--only-show-errors", str(folder), self.url(key)]
        else:
            argv = ["gcloud", "storage", "rsync", "--recursive", str(folder), self.url(key)]
        self._call(argv, timeout)

    def get_tree(self, key: str, folder: Path, timeout: float) -> None:
        """Download every object under ``key/`` into ``folder`` (errors as :meth:`put_tree`)."""
        if self.cloud == "aws":
            argv = ["aws", "s3", "sync", "--only-show-errors", self.url(key), str(folder)]
        else:
            argv = ["gcloud", "storage", "rsync", "--recursive", self.url(key), str(folder)]
        self._call(argv, timeout)

    def put_text(self, key: str, text: str, timeout: float) -> None:
        """Write one object from ``text`` (stdin of ``cp -``; errors as :meth:`put_tree`)."""
        tool = ["aws", "s3", "cp", "--only-show-errors"] if self.cloud == "aws" else ["gcloud", "storage", "cp"]
        self._call([*tool, "-", self.url(key)], timeout, stdin=text)

    def get_text(self, key: str, timeout: float) -> str:
        """One object's text (``cp <url> -``; errors as :meth:`put_tree`, a missing object too)."""
        tool = ["aws", "s3", "cp", "--only-show-errors"] if self.cloud == "aws" else ["gcloud", "storage", "cp"]
        return self._call([*tool, self.url(key), "-"], timeout)


def node_part(node: str, cluster_env: Path = CLUSTER_ENV) -> str:
    """This node's part of the key layout: ``rank-<NODE_RANK>`` from cluster.env, else
    ``node-<node>``."""
    try:
        for line in cluster_env.read_text().splitlines():
            if line.startswith("NODE_RANK=") and line[10:].strip().isdigit():
                return f"rank-{int(line[10:].strip())}"
    except OSError:
        pass
    return f"node-{node}"


@dataclass
class SyncResult:
    """What one sync did: ``uploaded`` folder names (newest first), ``files`` uploaded,
    ``complete``: every complete folder is in the bucket."""

    uploaded: list[str] = field(default_factory=list)
    files: int = 0
    complete: bool = True


class CheckpointSync:
    """Complete checkpoint folders to the bucket, newest first, and ``LATEST`` after each
    newer one (module docstring).

    Args:
        root: the checkpoint dir.
        bucket: where to (:class:`Bucket`).
        stack: stack name (the key layout's first level under ``checkpoints/``).
        node: this node's instance id / VM name.
        state_file: what was uploaded (folder -> signature), kept across agent restarts and
            reboots (a restored folder is recorded too, so it is not uploaded again).
        clock: deadlines' clock (monotonic seconds); wall: epoch seconds (file times).
        cluster_env: where the node's rank is read (:func:`node_part`).
    """

    def __init__(
        self,
        root: Path,
        bucket: Bucket,
        stack: str,
        node: str,
        state_file: Path = STATE_FILE,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        quiet_seconds: float = QUIET_SECONDS,
        cluster_env: Path = CLUSTER_ENV,
    ) -> None:
        self.root, self.bucket, self.stack, self.node = root, bucket, stack, node
        self.state_file, self.clock, self.wall, self.quiet_seconds = state_file, clock, wall, quiet_seconds
        self.cluster_env = cluster_env
        self.changed = threading.Condition()  # guards uploaded, latest_ns, in_flight
        #: folder -> ident of the thread uploading it (a SIGTERM handler runs on top of a sync
        #: of its own thread: it takes over that thread's folders instead of waiting for them)
        self.in_flight: dict[str, int] = {}
        self.latest_lock = threading.RLock()  # one LATEST write at a time, outside ``changed``
        self.uploaded: dict[str, str] = {}
        self.latest_ns = 0
        self._load_state()

    def _load_state(self) -> None:
        """Merge the state file into :attr:`uploaded` and :attr:`latest_ns`: another process (the
        restore at boot) may have recorded a folder since this one started."""
        try:
            state = json.loads(self.state_file.read_text())
            self.uploaded.update({str(k): str(v) for k, v in dict(state["uploaded"]).items()})
            self.latest_ns = max(self.latest_ns, int(state["latest_ns"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass

    def prefix(self) -> str:
        """``checkpoints/<stack>/<part>``."""
        return f"checkpoints/{self.stack}/{node_part(self.node, self.cluster_env)}"

    def _save_state(self) -> None:
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"uploaded": self.uploaded, "latest_ns": self.latest_ns}))
            os.replace(tmp, self.state_file)
        except OSError as exc:
            LOG.info("cannot record the checkpoint sync state in %s: %s", self.state_file, exc)

    def pending(self) -> list[Folder]:
        """Complete folders not in the bucket with their current content, newest first."""
        self._load_state()
        folders = scan(self.root, self.wall(), self.quiet_seconds)
        return [f for f in folders if f.complete and self.uploaded.get(f.name) != f.signature]

    def sync(self, deadline: float) -> SyncResult:
        """Upload :meth:`pending` folders, newest first, until ``deadline`` (:attr:`clock`
        seconds). Calls may overlap (a spot notice during a background pass): each takes the
        newest folder no other call is uploading, and waits (until ``deadline``) for the ones
        another call is uploading. Failures are logged, never raised.

        Returns:
            What this call uploaded; ``complete`` False when a complete folder is not in the
            bucket (out of time, an upload failed, or the folder changed during its upload).
        """
        result = SyncResult()
        tried: set[str] = set()
        while True:
            with self.changed:
                pending = self.pending()
                me = threading.get_ident()
                todo = [f for f in pending if self.in_flight.get(f.name, me) == me and f.name not in tried]
                elsewhere = [f for f in pending if self.in_flight.get(f.name, me) != me]
                left = deadline - self.clock()
                if left <= 0 or not (todo or elsewhere):
                    result.complete = result.complete and not pending
                    break
                if not todo:  # only other calls' uploads left: wait for them
                    self.changed.wait(min(left, 1.0))
                    continue
                folder = todo[0]
                tried.add(folder.name)
                owner = self.in_flight.get(folder.name)
                self.in_flight[folder.name] = me
            try:
                self._upload(folder, deadline, result)
            finally:
                with self.changed:
                    if owner is None:
                        self.in_flight.pop(folder.name, None)
                    self.changed.notify_all()
        if result.uploaded:
            LOG.info("synced checkpoint(s) %s to %s", ", ".join(result.uploaded), self.bucket.url(self.prefix()))
        return result

    def _upload(self, folder: Folder, deadline: float, result: SyncResult) -> None:
        key = f"{self.prefix()}/{folder.name}/{folder.signature}"
        try:
            self.bucket.put_tree(folder.path, key, deadline - self.clock())
        except (OSError, subprocess.SubprocessError) as exc:
            LOG.info("checkpoint %s not uploaded: %r", folder.name, exc)
            result.complete = False
            return
        after = inspect_folder(folder.path, self.wall(), self.quiet_seconds)
        if after.signature != folder.signature or not after.complete:
            LOG.info("checkpoint %s changed during its upload: not recorded, LATEST kept", folder.name)
            result.complete = False
            return
        with self.changed:
            self.uploaded[folder.name] = folder.signature
            result.uploaded.append(folder.name)
            result.files += len(folder.files)
            self._save_state()
        # LATEST outside ``changed`` (a slow write must not hold a notice's or SIGTERM's sync),
        # one write at a time, and never back to an older folder than the last one written
        if not self.latest_lock.acquire(timeout=max(0.0, deadline - self.clock())):
            result.complete = False
            return
        try:
            if folder.newest_ns > self.latest_ns:
                left = min(deadline - self.clock(), LATEST_WRITE_SECONDS)
                if not self._write_latest(folder, key, left):
                    result.complete = False
                with self.changed:
                    self._save_state()
        finally:
            self.latest_lock.release()

    def _write_latest(self, folder: Folder, key: str, left: float) -> bool:
        """Point ``LATEST`` at ``folder`` (its upload at ``key`` is complete); False when the
        write failed (the folder stays recorded; the next newer folder writes it again)."""
        doc = {
            "checkpoint": folder.name,
            "key": key,
            "signature": folder.signature,
            "files": len(folder.files),
            "bytes": folder.size_bytes,
            "newest_mtime": _utc(folder.newest_ns / 1e9),
            "node": self.node,
            "written_at": _utc(self.wall()),
        }
        try:
            self.bucket.put_text(f"{self.prefix()}/LATEST", json.dumps(doc) + "\n", max(left, 1.0))
        except (OSError, subprocess.SubprocessError) as exc:
            LOG.info("LATEST not written for %s: %r", folder.name, exc)
            return False
        self.latest_ns = folder.newest_ns
        return True


def restore(sync: CheckpointSync, timeout: float, resume_file: Path = RESUME_FILE) -> Path | None:
    """Put the folder ``LATEST`` names back under the checkpoint dir and write
    ``GPUINFRA_RESUME_FROM=<path>`` (empty: nothing to resume from) to ``resume_file``. A local
    folder that a completion file marks complete and that is newer than ``LATEST``'s (a reboot
    that kept scratch) is used instead of a download. Never raises: a failure is logged and the
    job starts without a checkpoint.

    Returns:
        The folder the job resumes from, or None.
    """
    found: Path | None = None
    try:
        found = _restore(sync, sync.clock() + timeout)
    except Exception as exc:  # noqa: BLE001 - the job must start whatever the bucket did
        LOG.info("checkpoint restore failed, the job starts without one: %r", exc)
    resume_file.parent.mkdir(parents=True, exist_ok=True)
    resume_file.write_text(f"{RESUME_ENV}={found or ''}\n")
    LOG.info("resume from: %s", found or "nothing (no complete checkpoint)")
    return found


def _restore(sync: CheckpointSync, deadline: float) -> Path | None:
    marked = [f for f in scan(sync.root, sync.wall(), sync.quiet_seconds) if f.complete and f.why != "quiet"]
    local = marked[0] if marked else None
    try:
        doc = json.loads(sync.bucket.get_text(f"{sync.prefix()}/LATEST", deadline - sync.clock()))
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        LOG.info("no LATEST under %s: %s", sync.bucket.url(sync.prefix()), exc)
        return local.path if local else None
    name, key = str(doc["checkpoint"]), str(doc["key"])
    if not _NAME.fullmatch(name) or name in (".", "..") or not key.startswith(sync.prefix() + "/"):
        raise ValueError(f"LATEST names {name!r} at {key!r}: not a checkpoint of this node")
    newest_s = datetime.strptime(doc["newest_mtime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    if local is not None and (local.name == name or local.newest_ns / 1e9 > newest_s):
        return local.path  # scratch kept it (or something newer) across the reboot
    target = sync.root / name
    staging = sync.root / f".{name}.restoring"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    sync.bucket.get_tree(key, staging, deadline - sync.clock())
    if target.exists():  # an older or partial copy: kept aside, never deleted
        target.rename(sync.root / f".{name}.replaced-{int(sync.wall())}")
    staging.rename(target)
    restored = inspect_folder(target, sync.wall(), sync.quiet_seconds)
    sync.uploaded[name] = restored.signature  # not uploaded again
    sync.latest_ns = max(sync.latest_ns, restored.newest_ns)
    sync._save_state()
    LOG.info("restored checkpoint %s from %s", name, sync.bucket.url(key))
    return target


class Watcher:
    """Wakes the background sync when a file is written or moved in the checkpoint dir or one
    of its folders: inotify(7) through libc (``inotify_init1``, ``inotify_add_watch``), else a
    scan every :data:`POLL_SECONDS` for a changed set of complete folders."""

    MASK = 0x00000008 | 0x00000080 | 0x00000100  # IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fd = -1
        self.watched: set[str] = set()
        self._seen: set[tuple[str, str]] = set()
        try:
            self.libc = ctypes.CDLL(None, use_errno=True)
            self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            self.fd = -1

    def _add_watches(self) -> None:
        for path in [self.root, *(p for p in self.root.glob("*") if p.is_dir())] if self.root.is_dir() else []:
            if (
                str(path) not in self.watched
                and self.libc.inotify_add_watch(self.fd, os.fsencode(path), self.MASK) >= 0
            ):
                self.watched.add(str(path))

    def wait(self, timeout: float, complete: Callable[[], set[tuple[str, str]]]) -> bool:
        """Wait up to ``timeout`` seconds; True when something was written (inotify) or the
        set ``complete()`` returns changed (poll)."""
        if self.fd < 0:
            time.sleep(min(timeout, POLL_SECONDS))
            now = complete()
            changed, self._seen = now != self._seen, now
            return changed
        self._add_watches()
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        offset = 0
        while offset + 16 <= len(data):  # struct inotify_event: wd, mask, cookie, len, name
            _, _, _, length = struct.unpack_from("iIII", data, offset)
            offset += 16 + length
        return True


def keep_syncing(
    sync: CheckpointSync,
    interval_seconds: float,
    poll: Callable[[], object] = lambda: None,
    stop: threading.Event | None = None,
) -> None:
    """The background loop: a sync every ``interval_seconds`` and after a write in the
    checkpoint dir (0: neither, only ``poll``), and, in a thread of its own so that a long pass
    never delays an answer, ``poll()`` (sync requests, rebalance recommendations) every
    :data:`REQUEST_POLL_SECONDS`. Runs until ``stop`` is set."""
    stop = stop or threading.Event()

    def answer() -> None:
        while not stop.is_set():
            try:
                poll()
            except Exception as exc:  # noqa: BLE001 - the loop never dies
                LOG.info("sync request poll: %r", exc)
            stop.wait(REQUEST_POLL_SECONDS)

    threading.Thread(target=answer, name="gpuinfra-sync-requests", daemon=True).start()
    watcher = Watcher(sync.root)
    next_pass = sync.clock() + interval_seconds
    while not stop.is_set():
        try:
            if interval_seconds > 0:
                wait = max(0.0, min(REQUEST_POLL_SECONDS, next_pass - sync.clock()))
                written = watcher.wait(wait, lambda: {(f.name, f.signature) for f in sync.pending()})
                if (written and sync.pending()) or sync.clock() >= next_pass:
                    sync.sync(sync.clock() + BACKGROUND_PASS_SECONDS)
                    next_pass = sync.clock() + interval_seconds
            else:
                stop.wait(REQUEST_POLL_SECONDS)
        except Exception as exc:  # noqa: BLE001 - the loop never dies
            LOG.info("background checkpoint sync: %r", exc)
            stop.wait(REQUEST_POLL_SECONDS)


def read_sync_request(cloud: str, get: Callable[[str], tuple[int, str]]) -> str | None:
    """The operator's sync request id, or None (absent, or not a valid id). ``get`` reads one
    metadata path: IMDS ``tags/instance/gpuinfra:sync-request`` (AWS, instance metadata tags
    on: docs.aws.amazon.com/AWSEC2/latest/UserGuide/work-with-tags-in-IMDS.html) or GCE
    ``instance/attributes/gpuinfra-sync-request``."""
    path = f"tags/instance/{SYNC_REQUEST_TAG}" if cloud == "aws" else f"instance/attributes/{SYNC_REQUEST_ATTRIBUTE}"
    status, body = get(path)
    value = body.strip() if status == 200 else ""
    return value if re.fullmatch(SYNC_REQUEST_ID_PATTERN, value) else None


class Requests:
    """Answers the operator's sync requests and AWS rebalance recommendations (one sync each).

    Args:
        sync: the node's :class:`CheckpointSync`.
        cloud: ``aws`` | ``gcp``.
        get: one metadata read (path -> (HTTP status, body)); AWS paths under
            ``/latest/meta-data/``, GCP under ``/computeMetadata/v1/``.
        bound_seconds: one requested sync's bound.
    """

    def __init__(
        self,
        sync: CheckpointSync,
        cloud: str,
        get: Callable[[str], tuple[int, str]],
        bound_seconds: float = SYNC_REQUEST_BOUND_SECONDS,
    ) -> None:
        self.sync, self.cloud, self.get, self.bound_seconds = sync, cloud, get, bound_seconds
        self.answered: set[str] = set()
        self.rebalance_seen = False

    def poll(self) -> str | None:
        """Read the request (and on AWS the rebalance recommendation, which EC2 may send before
        the spot notice: docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html);
        on a new request id: a bounded sync, then the ack object. Returns the id answered."""
        if self.cloud == "aws" and not self.rebalance_seen:
            status, _ = self.get("events/recommendations/rebalance")
            if status == 200:
                self.rebalance_seen = True
                LOG.info("rebalance recommendation: syncing checkpoints")
                self.sync.sync(self.sync.clock() + self.bound_seconds)
        request = read_sync_request(self.cloud, self.get)
        if request is None or request in self.answered:
            return None
        LOG.info("sync request %s: syncing checkpoints", request)
        started = self.sync.clock()
        result = self.sync.sync(started + self.bound_seconds)
        ack = {
            "request": request,
            "node": self.sync.node,
            "uploaded_files": result.files,
            "complete": result.complete,
            "finished_at": _utc(self.sync.wall()),
        }
        self.sync.bucket.put_text(sync_ack_key(self.sync.stack, request, self.sync.node), json.dumps(ack) + "\n", 60)
        self.answered.add(request)
        return request


def main(argv: list[str] | None = None) -> int:
    """``python3 -m gpuinfra.agent.checkpoints restore [--config /etc/gpuinfra/node.env]``: the
    restore at boot (``gpuinfra-restore.service``); always exits 0 with ``resume.env`` written."""
    import argparse

    from gpuinfra.agent import node as agent_node  # node imports this module lazily: no cycle at import

    parser = argparse.ArgumentParser(description="gpuinfra checkpoint restore")
    parser.add_argument("command", choices=["restore"])
    parser.add_argument("--config", type=Path, default=Path("/etc/gpuinfra/node.env"))
    parser.add_argument("--timeout-seconds", type=float, default=1800)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpuinfra-restore %(message)s", stream=sys.stdout)
    config = agent_node.AgentConfig.from_env_file(args.config)
    metadata = agent_node.AwsMetadata() if config.cloud == "aws" else agent_node.GcpMetadata()
    sync = for_node(config.cloud, config.bucket, config.stack, config.checkpoint_dir, agent_node.node_name(metadata))
    deadline = sync.clock() + args.timeout_seconds
    # the part to restore is the node's rank's: wait (bounded) for the ranks instead of taking
    # the node-<id> part, which a new node never has (cluster-env may still be waiting for peers)
    while not node_part(sync.node, sync.cluster_env).startswith("rank-"):
        if sync.clock() >= deadline:
            LOG.info(
                "no NODE_RANK in %s after %.0f s: the job starts without a checkpoint",
                sync.cluster_env,
                args.timeout_seconds,
            )
            RESUME_FILE.parent.mkdir(parents=True, exist_ok=True)
            RESUME_FILE.write_text(f"{RESUME_ENV}=\n")
            return 0
        time.sleep(5)
    restore(sync, max(0.0, deadline - sync.clock()))
    return 0


def for_node(cloud: str, bucket: str, stack: str, root: Path, node: str) -> CheckpointSync:
    """The node's :class:`CheckpointSync` with the real CLI and state file."""
    return CheckpointSync(root, Bucket(cloud, bucket), stack, node)


if __name__ == "__main__":
    sys.exit(main())
