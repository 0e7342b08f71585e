"""Operator side of the health gate: where a stack's node results are, reading them from the bucket, judging them.

A service module: it reads stack files, the Pulumi state and the bucket. What the nodes are
checked against (:func:`gpuinfra.plan.health.expectations_for`) is part of the cluster plan,
baked into the node bundle at render time.

* :func:`evaluate` is the whole decision for one node of a stack from its raw outputs.
* :func:`locate_results` decides where a stack's results are (bucket from ``--bucket``, the
  stack file or its Pulumi outputs), how many nodes must have one and since when a result is
  current (the stack's last Pulumi update, or ``--since``).
* :func:`read_health` reads every ``health/<stack>/*.json`` of that bucket (S3 with boto3, GCS
  with google-cloud-storage when installed) into a :class:`HealthReport`: current results,
  stale ones (older than the deployment: the bucket outlives ``gpuinfra down``), unreadable
  ones (with the reason, never skipped); :meth:`HealthReport.verdict` is the gate's answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpuinfra import lifecycle
from gpuinfra.credentials import cloud_storage, no_aws_credentials, no_gcp_credentials
from gpuinfra.errors import MissingDependencyError, OperationError, RequestError, SpecError
from gpuinfra.health.gate import HEALTH_PREFIX, SCHEMA_VERSION, GateOutputs, NodeHealth, decide
from gpuinfra.plan.health import expectations_for
from gpuinfra.spec import ClusterSpec, check_stack_name
from gpuinfra.stackfile import read_stack_spec, stack_file_path

_SCHEMES = {"s3": "aws", "gs": "gcp"}


# ----------------------------------------------------------------------------- judging
def evaluate(spec: ClusterSpec, outputs: GateOutputs, *, node: str, checked_at: datetime | None = None) -> NodeHealth:
    """The gate's result for one node of the stack ``spec`` (:func:`expectations_for` then
    :func:`~gpuinfra.health.gate.decide`)."""
    return decide(expectations_for(spec), outputs, stack=spec.stack, node=node, checked_at=checked_at)


# --------------------------------------------------------------------------- where to read
@dataclass(frozen=True)
class ResultsLocation:
    """Where a stack's node results are and what counts.

    Attributes:
        cloud: ``aws`` (S3) | ``gcp`` (GCS).
        bucket: bucket name.
        stack: the stack.
        expected_nodes: nodes that must each have a current, passing result.
        since: results checked before this are stale (None: none is).
        since_source: where ``since`` comes from, for messages.
        deployment: the stack's current deployment id (stack file ``deployment_id``): results
            of another deployment are stale; None: not checked.
    """

    cloud: str
    bucket: str
    stack: str
    expected_nodes: int
    since: datetime | None = None
    since_source: str = ""
    deployment: str | None = None

    @property
    def prefix(self) -> str:
        """``health/<stack>/``."""
        return f"{HEALTH_PREFIX}/{self.stack}/"

    @property
    def since_iso(self) -> str | None:
        """``since`` as ISO 8601 UTC, None when not set."""
        return _iso(self.since)

    @property
    def url(self) -> str:
        """``s3://<bucket>/health/<stack>/`` or ``gs://...``."""
        scheme = next(s for s, c in _SCHEMES.items() if c == self.cloud)
        return f"{scheme}://{self.bucket}/{self.prefix}"


def parse_since(text: str) -> datetime:
    """An ISO 8601 time (``2026-11-30T12:00:00Z``; no zone: UTC).

    Raises:
        RequestError: not an ISO 8601 time.
    """
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise RequestError(f"--since {text!r}: give an ISO 8601 time such as 2026-11-30T12:00:00Z") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _bucket_flag(bucket: str) -> tuple[str | None, str]:
    """``(cloud or None, name)`` of a ``--bucket`` value."""
    if "://" not in bucket:
        return None, bucket
    scheme, _, name = bucket.partition("://")
    name = name.rstrip("/")
    if scheme not in _SCHEMES or not name or "/" in name:
        raise RequestError(f"--bucket {bucket!r}: give s3://NAME, gs://NAME or a bare NAME (no path)")
    return _SCHEMES[scheme], name


def _deployed_at(backend, project_dir: Path, stack: str) -> datetime | None:
    status = next((s for s in backend.list_stacks(project_dir) if s.name == stack), None)
    return status.last_update if status is not None else None


def locate_results(
    stack: str, project_dir: Path, *, bucket: str | None = None, nodes: int | None = None, since: str | None = None
) -> ResultsLocation:
    """Where ``stack``'s results are, how many nodes must have one and since when they count.

    * cloud and node count: the stack file (``spec.nodes``) when it exists; else ``--bucket
      s3://`` / ``gs://`` and ``--nodes`` (both required then). A ``--bucket`` scheme or
      ``--nodes`` that contradicts the stack file is refused.
    * bucket: ``--bucket``, else the stack's Pulumi output ``bucket_name``.
    * since: ``--since`` when given, else the stack's last Pulumi update
      (``StackStatus.last_update``); results checked before it come from an earlier deployment
      (the bucket is kept by ``gpuinfra down``) and are stale. With neither, the call fails:
      without a deployment time stale results cannot be told apart.
    * credentials of the cloud are checked once, here, before anything is read.

    Raises:
        SpecError: invalid stack name, unreadable stack file, no ``bucket_name`` output, no
            deployment time in the Pulumi state.
        RequestError: a malformed or contradicting ``--bucket`` / ``--nodes`` / ``--since``,
            or one that is missing without a stack file.
        MissingDependencyError: no cloud credentials; no Pulumi CLI where it is needed.
    """
    check_stack_name(stack)
    project_dir = Path(project_dir)
    flag_cloud, name = _bucket_flag(bucket) if bucket else (None, None)
    when = parse_since(since) if since is not None else None
    cloud: str
    deployment = None
    if nodes is not None and nodes < 1:
        raise RequestError(f"--nodes {nodes}: give at least 1")
    if stack_file_path(project_dir, stack).is_file():
        spec = read_stack_spec(project_dir, stack)
        if flag_cloud and flag_cloud != spec.cloud:
            raise RequestError(
                f"--bucket {bucket!r} is a {'GCS' if flag_cloud == 'gcp' else 'S3'} bucket, but stack "
                f"{stack!r} is on {spec.cloud}"
            )
        if nodes is not None and nodes != spec.nodes:
            raise RequestError(f"--nodes {nodes}, but the stack file of {stack!r} says nodes: {spec.nodes}")
        cloud, expected, deployment = spec.cloud, spec.nodes, spec.deployment_id
    else:
        if not flag_cloud or nodes is None:
            raise RequestError(
                f"no stack file for {stack!r} ({stack_file_path(project_dir, stack)}): give --bucket "
                "s3://NAME or gs://NAME and --nodes N"
            )
        cloud, expected = flag_cloud, nodes
    lifecycle.check_credentials(cloud)
    backend = None
    if name is None or when is None:
        try:
            backend = lifecycle.make_backend()
        except MissingDependencyError as exc:
            if name is None:
                raise
            raise MissingDependencyError(
                f"{exc}; or give --since TIME (the stack's deployment time) so that results "
                "of earlier deployments are not counted"
            ) from None
    if name is None:
        assert backend is not None  # made above
        name = backend.outputs(project_dir, stack).get("bucket_name")
        if not name:
            raise SpecError(
                f"stack {stack!r} has no bucket_name output (is it deployed? `gpuinfra up {stack}`); or give --bucket"
            )
    source = "--since"
    if when is None:
        when = _deployed_at(backend, project_dir, stack)
        if when is None:
            raise SpecError(
                f"stack {stack!r} has no finished Pulumi update, so results of earlier deployments cannot be "
                "told apart; give --since TIME"
            )
        source = "the stack's last Pulumi update"
    return ResultsLocation(cloud, name, stack, expected, when, source, deployment)


# ----------------------------------------------------------------------------------- report
@dataclass(frozen=True)
class InvalidResult:
    """A ``health/<stack>/`` object that is not a readable :class:`NodeHealth` (key, reason)."""

    key: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    """The gate's answer for the stack: ``reason`` is one line, None when it passed."""

    passed: bool
    reason: str | None


@dataclass(frozen=True)
class HealthReport:
    """The stack's results.

    Attributes:
        location: where they were read and what counts.
        nodes: current readable results, sorted by node.
        stale: readable results checked before ``location.since`` (ignored).
        invalid: unreadable results.
    """

    location: ResultsLocation
    nodes: tuple[NodeHealth, ...]
    stale: tuple[NodeHealth, ...]
    invalid: tuple[InvalidResult, ...]

    @property
    def missing(self) -> int:
        """Nodes without a current result."""
        return max(0, self.location.expected_nodes - len(self.nodes))

    @property
    def failed(self) -> tuple[NodeHealth, ...]:
        """Current results that failed."""
        return tuple(n for n in self.nodes if not n.passed)

    @property
    def pending(self) -> tuple[NodeHealth, ...]:
        """Current results that passed their local checks but have no cluster all-reduce yet."""
        return tuple(n for n in self.nodes if n.passed and n.stage == "local")

    @property
    def passed(self) -> bool:
        """Every expected node has a current result of the ``cluster`` stage, every result is
        readable and passed."""
        return not self.missing and not self.invalid and not self.failed and not self.pending

    def verdict(self) -> Verdict:
        """Passed, or the one-line reason (``gpuinfra check`` exits 8 with it)."""
        if self.passed:
            return Verdict(True, None)
        if not self.nodes and not self.invalid and not self.stale:
            return Verdict(
                False,
                f"no health results under {self.location.url} yet: each node writes its result there "
                "after its boot checks; run this again when the nodes are up",
            )
        reasons = []
        bad = [n.node for n in self.failed] + [i.key for i in self.invalid]
        if bad:
            reasons.append(
                f"{len(bad)} of {len(self.nodes) + len(self.invalid)} nodes failed the health gate or have "
                f"an unreadable result: {', '.join(bad)}"
            )
        if self.pending:
            reasons.append(
                f"{len(self.pending)} node(s) passed their local checks but the cluster all-reduce has not "
                f"run yet: {', '.join(n.node for n in self.pending)}"
            )
        if self.missing:
            stale = (
                f" ({len(self.stale)} stale result(s) from before {self.location.since_iso} ignored)"
                if self.stale
                else ""
            )
            reasons.append(f"{self.missing} of {self.location.expected_nodes} nodes have no current result{stale}")
        return Verdict(False, "; ".join(reasons))

    def to_dict(self) -> dict:
        """JSON form (``gpuinfra check --json``)."""
        loc = self.location
        return {
            "schema_version": SCHEMA_VERSION,
            "stack": loc.stack,
            "results": loc.url,
            "expected_nodes": loc.expected_nodes,
            "since": loc.since_iso,
            "since_source": loc.since_source,
            "passed": self.passed,
            "missing": self.missing,
            "nodes": [n.to_dict() for n in self.nodes],
            "stale": [{"node": n.node, "checked_at": n.checked_at} for n in self.stale],
            "invalid": [{"key": i.key, "reason": i.reason} for i in self.invalid],
        }


def _iso(when: datetime | None) -> str | None:
    return when.astimezone(UTC).isoformat(timespec="seconds") if when else None


def _parse(key: str, body: bytes, location: ResultsLocation) -> NodeHealth | InvalidResult:
    try:
        health = NodeHealth.from_dict(json.loads(body))
        checked = datetime.fromisoformat(health.checked_at)
    except (ValueError, UnicodeDecodeError) as exc:
        return InvalidResult(key, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    if health.stack != location.stack:
        return InvalidResult(key, f"written for stack {health.stack!r}")
    if checked.tzinfo is None:
        return InvalidResult(key, f"checked_at {health.checked_at!r} has no time zone")
    return health


def _s3_objects(bucket: str, prefix: str, client) -> list[tuple[str, bytes]]:
    import boto3
    from botocore.exceptions import ClientError, NoCredentialsError

    client = client or boto3.client("s3")
    try:
        keys = [
            o["Key"]
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])
            if o["Key"].endswith(".json")
        ]
        return [(key, client.get_object(Bucket=bucket, Key=key)["Body"].read()) for key in sorted(keys)]
    except NoCredentialsError:
        raise no_aws_credentials() from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            raise SpecError(f"bucket {bucket} does not exist (is the stack up? give the right --bucket)") from None
        if code in ("AccessDenied", "ExpiredToken", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise MissingDependencyError(
                f"cannot read s3://{bucket}/{prefix}: {code}; check the AWS credentials "
                "and their s3:ListBucket / s3:GetObject permissions"
            ) from None
        raise OperationError(f"reading s3://{bucket}/{prefix} failed: {code or exc}") from None


def _gcs_objects(bucket: str, prefix: str, client) -> list[tuple[str, bytes]]:
    storage = cloud_storage("reading a GCS bucket")
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import DefaultCredentialsError

    try:
        client = client or storage.Client()
        blobs = sorted(
            (b for b in client.list_blobs(bucket, prefix=prefix) if b.name.endswith(".json")), key=lambda b: b.name
        )
        return [(b.name, b.download_as_bytes()) for b in blobs]
    except DefaultCredentialsError:
        raise no_gcp_credentials() from None
    except gexc.NotFound:
        raise SpecError(f"bucket {bucket} does not exist (is the stack up? give the right --bucket)") from None
    except gexc.Forbidden as exc:
        raise MissingDependencyError(
            f"cannot read gs://{bucket}/{prefix}: {exc.message}; check the GCP credentials "
            "and their storage.objects.list / storage.objects.get permissions"
        ) from None
    except gexc.GoogleAPIError as exc:
        raise OperationError(f"reading gs://{bucket}/{prefix} failed: {exc}") from None


def read_health(location: ResultsLocation, client=None) -> HealthReport:
    """Every node result under ``location`` (``<bucket>/health/<stack>/*.json``), sorted into
    current, stale (checked before ``location.since``, or of another deployment than
    ``location.deployment``) and unreadable ones. A current result
    written for another node count than ``location.expected_nodes`` is unreadable (its
    expectations were not the cluster's).

    Args:
        location: from :func:`locate_results` (or built directly).
        client: a boto3 S3 client / ``google.cloud.storage.Client`` (default: a new one).

    Raises:
        MissingDependencyError: no credentials or no permission; GCS without
            google-cloud-storage.
        SpecError: the bucket does not exist (exit 2).
        OperationError: another storage error.
    """
    objects = (_s3_objects if location.cloud == "aws" else _gcs_objects)(location.bucket, location.prefix, client)
    current, stale, invalid = [], [], []
    for key, body in objects:
        result = _parse(key, body, location)
        if isinstance(result, InvalidResult):
            invalid.append(result)
        elif location.since is not None and datetime.fromisoformat(result.checked_at) < location.since:
            stale.append(result)
        elif location.deployment and result.deployment != location.deployment:
            stale.append(result)  # an earlier deployment's (up --replace-nodes, down + up)
        elif result.nodes != location.expected_nodes:
            invalid.append(
                InvalidResult(
                    key, f"written for a {result.nodes}-node cluster, the stack has {location.expected_nodes}"
                )
            )
        else:
            current.append(result)
    return HealthReport(
        location,
        tuple(sorted(current, key=lambda n: n.node)),
        tuple(sorted(stale, key=lambda n: n.node)),
        tuple(invalid),
    )
