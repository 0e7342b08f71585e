"""``gpuinfra run`` / ``logs`` / ``jobs`` / ``cancel`` on the laptop side: the job spec into the
stack bucket, the nodes' status and log chunks out of it (key layout and node side:
:mod:`gpuinfra.agent.job`; user docs: docs/run.md).

The bucket is reached through :class:`JobStore` (boto3 S3 or google-cloud-storage); tests pass a
store over moto or a folder.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Protocol

from gpuinfra.agent.constants import SYNC_REQUEST_WAIT_SECONDS
from gpuinfra.agent.job import STATES_FINAL, JobSpec, final_key, job_prefix, spec_key
from gpuinfra.credentials import cloud_storage, no_aws_credentials, no_gcp_credentials
from gpuinfra.errors import MissingDependencyError, OperationError, RequestError, SpecError


class JobStore(Protocol):
    """The stack bucket, as far as jobs need it."""

    def put_text(self, key: str, text: str) -> None:
        """Write one object."""

    def get_text(self, key: str) -> str | None:
        """One object's text, or None when it does not exist."""

    def keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, sorted."""


class S3Store:
    """:class:`JobStore` over boto3 (``client``: an S3 client; default a new one).

    Raises (every method): MissingDependencyError (no credentials, access denied),
    SpecError (no such bucket), OperationError (another S3 error).
    """

    def __init__(self, bucket: str, client=None) -> None:
        import boto3

        self.bucket, self.client = bucket, client or boto3.client("s3")

    def _call(self, what: str, fn):
        from botocore.exceptions import ClientError, NoCredentialsError

        try:
            return fn()
        except NoCredentialsError:
            raise no_aws_credentials() from None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404"):
                return None
            if code == "NoSuchBucket":
                raise SpecError(f"bucket {self.bucket} does not exist (is the stack up?)") from None
            if code in ("AccessDenied", "ExpiredToken", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise MissingDependencyError(
                    f"cannot {what} s3://{self.bucket}: {code}; check the AWS credentials"
                ) from None
            raise OperationError(f"{what} s3://{self.bucket} failed: {code or exc}") from None

    def put_text(self, key: str, text: str) -> None:
        self._call("write to", lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=text.encode()))

    def get_text(self, key: str) -> str | None:
        body = self._call("read", lambda: self.client.get_object(Bucket=self.bucket, Key=key))
        return None if body is None else body["Body"].read().decode()

    def keys(self, prefix: str) -> list[str]:
        def listing() -> list[str]:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

        return self._call("list", listing) or []


class GcsStore:
    """:class:`JobStore` over google-cloud-storage (errors as :class:`S3Store`)."""

    def __init__(self, bucket: str, client=None) -> None:
        storage = cloud_storage("running a job")
        self.bucket, self.client = bucket, client or storage.Client()

    def _call(self, what: str, fn):
        from google.api_core import exceptions as gexc
        from google.auth.exceptions import DefaultCredentialsError

        try:
            return fn()
        except DefaultCredentialsError:
            raise no_gcp_credentials() from None
        except gexc.NotFound:
            return None
        except gexc.Forbidden as exc:
            raise MissingDependencyError(f"cannot {what} gs://{self.bucket}: {exc.message}") from None
        except gexc.GoogleAPIError as exc:
            raise OperationError(f"{what} gs://{self.bucket} failed: {exc}") from None

    def put_text(self, key: str, text: str) -> None:
        self._call("write to", lambda: self.client.bucket(self.bucket).blob(key).upload_from_string(text))

    def get_text(self, key: str) -> str | None:
        return self._call("read", lambda: self.client.bucket(self.bucket).blob(key).download_as_text())

    def keys(self, prefix: str) -> list[str]:
        return sorted(
            self._call("list", lambda: [b.name for b in self.client.list_blobs(self.bucket, prefix=prefix)]) or []
        )


def store_for(cloud: str, bucket: str) -> JobStore:
    """The bucket of a stack on ``cloud`` (``aws`` | ``gcp``)."""
    return S3Store(bucket) if cloud == "aws" else GcsStore(bucket)


def new_job_id(now: datetime | None = None) -> str:
    """``j-<UTC yyyymmdd-hhmmss>-<6 hex>``: sortable and unique."""
    now = now or datetime.now(UTC)
    return f"j-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def parse_env(pairs: list[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments of ``flag`` as a dict.

    Raises:
        RequestError: an argument without ``=``.
    """
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise RequestError(f"{flag} {pair!r}: give KEY=VALUE")
        out[key] = value
    return out


def make_spec(argv: list[str], **fields) -> JobSpec:
    """A new job spec with a new id.

    Raises:
        RequestError: a field a node could not run (the spec's own check, one message).
    """
    try:
        return JobSpec(id=new_job_id(), argv=tuple(argv), submitted_at=_utc(), **fields)
    except ValueError as exc:
        raise RequestError(str(exc)) from None


def _utc() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def submit(store: JobStore, stack: str, spec: JobSpec) -> None:
    """Write ``spec`` as the stack's job (replaces the previous spec: its nodes stop it)."""
    store.put_text(spec_key(stack), spec.to_json())


def current_spec(store: JobStore, stack: str) -> JobSpec | None:
    """The stack's job spec, or None.

    Raises:
        SpecError: the object is not a job spec.
    """
    text = store.get_text(spec_key(stack))
    if text is None:
        return None
    try:
        return JobSpec.from_json(text)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"{spec_key(stack)} is not a job spec: {exc}") from None


#: How long ``gpuinfra cancel`` waits for the nodes to finish a cancelled job before ``down``:
#: a node stops the job within about 10 s, uploads its outputs (at most
#: ``gpuinfra.agent.job.OUTPUT_SYNC_SECONDS``, 240 s), then its status and ``final.json`` (60 s
#: each at most); ``down``'s own sync wait (``SYNC_REQUEST_WAIT_SECONDS``, 360 s) covers that.
CANCEL_WAIT_SECONDS: float = SYNC_REQUEST_WAIT_SECONDS
#: How often ``gpuinfra cancel`` looks for the final object while it waits.
CANCEL_POLL_SECONDS = 5.0


def still_running(view: JobView) -> list[str]:
    """The parts (``rank-N``) whose last status still says ``running``."""
    return sorted(part for part, status in view.statuses.items() if status.get("state") == "running")


def wait_until_over(
    store: JobStore,
    stack: str,
    spec: JobSpec,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> JobView:
    """Wait, at most :data:`CANCEL_WAIT_SECONDS`, until the job's ``final.json`` is written and no
    node's status still says ``running`` (a node writes both after its outputs upload); returns
    the last view read, over or not (the caller says which)."""
    deadline = clock() + CANCEL_WAIT_SECONDS
    while True:
        view = read_view(store, stack, spec)
        if view.final is not None and not still_running(view):
            return view
        left = deadline - clock()
        if left <= 0:
            return view
        sleep(min(CANCEL_POLL_SECONDS, left))


def cancel(store: JobStore, stack: str) -> JobSpec | None:
    """Mark the stack's job cancelled (the nodes stop it, then end themselves); None when there
    is no job."""
    spec = current_spec(store, stack)
    if spec is not None and not spec.cancel:
        spec = replace(spec, cancel=True)
        submit(store, stack, spec)
    return spec


@dataclass
class JobView:
    """What the nodes wrote for one job: per-part status, the final object, the spec."""

    spec: JobSpec
    statuses: dict[str, dict] = field(default_factory=dict)
    final: dict | None = None

    @property
    def state(self) -> str:
        """``submitted`` (no node yet) | ``running`` | a final state (``succeeded`` only when every
        node that reported succeeded)."""
        if self.final is not None:
            states = {s.get("state") for s in self.statuses.values()}
            for state in ("failed", "cancelled"):
                if state in states:
                    return state
            return self.final.get("state", "failed")
        if self.spec.cancel:
            return "cancelling"
        return "running" if self.statuses else "submitted"

    @property
    def restarts(self) -> list[dict]:
        """Every node's restarts, each with its ``part``."""
        return [{**r, "part": p} for p, s in sorted(self.statuses.items()) for r in s.get("restarts") or []]

    @property
    def restart_count(self) -> int:
        """The job's restarts: the most any part recorded. A restart of the job restarts every
        node once, so each restart is one record on each node; a replacement continues its part's
        records (:meth:`gpuinfra.agent.job.JobRunner.inherited`)."""
        return max((len(s.get("restarts") or []) for s in self.statuses.values()), default=0)

    @property
    def exit_code(self) -> int | None:
        """The first non-zero exit code of a node, else 0 once over, else None."""
        if self.final is None:
            return None
        codes = [s.get("exit_code") for s in self.statuses.values() if s.get("exit_code") is not None]
        return next((c for c in codes if c != 0), 0 if codes else self.final.get("exit_code"))

    def to_json(self) -> dict:
        """``gpuinfra jobs --json``'s document for this job."""
        return {
            "job": self.spec.id,
            "argv": list(self.spec.argv),
            "state": self.state,
            "exit_code": self.exit_code,
            "submitted_at": self.spec.submitted_at,
            "restarts": self.restarts,
            "restart_count": self.restart_count,
            "nodes": self.statuses,
        }


def read_view(store: JobStore, stack: str, spec: JobSpec) -> JobView:
    """The nodes' status documents and the final object of ``spec``'s job (a status that is not a
    JSON object is skipped: the node rewrites it).

    Raises:
        SpecError: the final object is not a JSON object.
    """
    statuses = {}
    for key in store.keys(f"{job_prefix(stack, spec.id)}/status/"):
        text = store.get_text(key)
        try:
            doc = json.loads(text or "")
        except ValueError:
            continue
        if isinstance(doc, dict):
            statuses[key.rsplit("/", 1)[1].removesuffix(".json")] = doc
    final_text = store.get_text(final_key(stack, spec.id))
    try:
        final = json.loads(final_text) if final_text else None
    except ValueError:
        final = None
    if final_text and not isinstance(final, dict):
        raise SpecError(f"{final_key(stack, spec.id)} is not JSON (a node writes it once the job is over)")
    return JobView(spec, statuses, final)


def new_log_lines(store: JobStore, stack: str, job_id: str, seen: set[str]) -> list[str]:
    """Log lines of chunks not in ``seen`` (added to it), node by node in chunk order."""
    lines = []
    for key in store.keys(f"{job_prefix(stack, job_id)}/logs/"):
        if key not in seen:
            seen.add(key)
            lines.extend((store.get_text(key) or "").splitlines())
    return lines


def follow(
    store: JobStore,
    stack: str,
    spec: JobSpec,
    on_line: Callable[[str], None],
    on_view: Callable[[JobView], None] = lambda view: None,
    poll_seconds: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> JobView:
    """Print the job's log lines as they arrive until the job is over; returns its last view.
    Ctrl-C (KeyboardInterrupt) propagates: the caller detaches."""
    seen: set[str] = set()
    while True:
        view = read_view(store, stack, spec)
        for line in new_log_lines(store, stack, spec.id, seen):
            on_line(line)
        on_view(view)
        if view.final is not None and view.state in STATES_FINAL:
            for line in new_log_lines(store, stack, spec.id, seen):  # chunks a slower node wrote last
                on_line(line)
            return view
        sleep(poll_seconds)


def status_line(view: JobView, nodes: int, elapsed_seconds: float, hourly_usd: Decimal | None) -> str:
    """``job j-... running: 2/2 nodes, step 120, 1 restart, 0:12:03, $4.21 so far``."""
    reporting = sum(1 for s in view.statuses.values() if s.get("state") == "running")
    steps = [s.get("progress", {}).get("step") for s in view.statuses.values()]
    steps = [s for s in steps if isinstance(s, int)]
    h, rest = divmod(int(elapsed_seconds), 3600)
    parts = [
        f"job {view.spec.id} {view.state}: {reporting}/{nodes} nodes running",
        *([f"step {max(steps)}"] if steps else []),
        f"{view.restart_count} restart{'s' if view.restart_count != 1 else ''}",
        f"{h}:{rest // 60:02d}:{rest % 60:02d}",
        cost_text(hourly_usd, elapsed_seconds),
    ]
    return ", ".join(parts)


def cost_text(hourly_usd: Decimal | None, seconds: float) -> str:
    """``$4.21 so far`` from the catalog's hourly price of the whole cluster; money fails closed:
    ``cost unknown (no catalog price)`` without one."""
    if hourly_usd is None:
        return "cost unknown (no catalog price)"
    return f"${hourly_usd * Decimal(seconds) / Decimal(3600):,.2f} so far"


def job_over(backend, project_dir, spec) -> str | None:
    """The final state of a deployed stack's current job (``gpuinfra reap --job-over``), or None
    while it runs, when there is none, when the stack has no bucket output, or when the job is an
    earlier deployment's (the bucket outlives ``down``; ``spec.deployment_id`` is the current one).

    Raises:
        MissingDependencyError, SpecError, OperationError: the bucket cannot be read.
    """
    bucket = backend.outputs(project_dir, spec.stack).get("bucket_name")
    if not bucket:
        return None
    store = store_for(spec.cloud, bucket)
    current = current_spec(store, spec.stack)
    if current is None or (current.deployment and spec.deployment_id and current.deployment != spec.deployment_id):
        return None
    view = read_view(store, spec.stack, current)
    return view.state if view.final is not None else None
