"""Operator side of the health gate: expectations from the catalog, results from the bucket.

* :func:`expectations_for` turns a type's :class:`~gpuinfra.catalog.facts_model.InstanceFacts`
  (GPU count, ``max_efa_interfaces`` = ``EfaInfo.MaximumEfaInterfaces``, ``nvswitch``,
  ``nic_layout``) and the baseline table into the :class:`~gpuinfra.health.gate.Expectations`
  a node is checked against; the facts are not repeated here.
* :func:`evaluate` is the whole decision for one node from its instance type and raw outputs.
* :func:`read_health` reads every ``health/<stack>/*.json`` of the stack's bucket (S3 with
  boto3, GCS with google-cloud-storage when installed); a document it cannot read is reported as
  invalid with the reason, never skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.errors import GpuinfraError, MissingDependencyError, OperationError
from gpuinfra.health.baselines import find_baseline
from gpuinfra.health.gate import (BUSBW_PASS_FRACTION, HEALTH_PREFIX, Expectations, GateOutputs, NodeHealth,
                                  decide)


def expectations_for(facts: InstanceFacts, nodes: int, gpu_count: int | None = None,
                     busbw_pass_fraction: float = BUSBW_PASS_FRACTION) -> Expectations:
    """What every node of a cluster of ``nodes`` x ``facts.instance_type`` must show.

    Args:
        facts: the type's catalog facts (the stack's ``gpuinfra:cluster.facts``).
        nodes: nodes in the cluster: 2+ compares with the ``inter_node`` baseline, 1 with
            ``intra_node``.
        gpu_count: GPUs per node when the type has none built in (GCP N1 with attached GPUs);
            default ``facts.gpu_count``.
        busbw_pass_fraction: share of the baseline a node must reach.

    Raises:
        ValueError: ``nodes`` < 1, or no GPU count is known.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, not {nodes}")
    gpus = gpu_count if gpu_count is not None else facts.gpu_count
    if gpus < 1:
        raise ValueError(f"{facts.instance_type} has no built-in GPU: give gpu_count")
    scope = "inter_node" if nodes > 1 else "intra_node"
    return Expectations(cloud=facts.cloud, instance_type=facts.instance_type, nodes=nodes, gpu_count=gpus,
                        efa_count=facts.max_efa_interfaces, nvswitch=facts.nvswitch, nic_layout=facts.nic_layout,
                        baseline=find_baseline(facts.cloud, facts.instance_type, scope),
                        busbw_pass_fraction=busbw_pass_fraction)


def evaluate(instance_type: str, outputs: GateOutputs, *, nodes: int, stack: str, node: str, cloud: str | None = None,
             checked_at: datetime | None = None) -> NodeHealth:
    """The gate's result for one node of ``instance_type``, facts from the catalog in use.

    Raises:
        CatalogError: the catalog cannot be loaded.
        ValueError: the catalog has no facts for ``instance_type`` (in ``cloud`` when given).
    """
    from gpuinfra.catalog.store import load_catalog

    catalog = load_catalog()
    found = [f for (c, t), f in catalog.facts.items() if t == instance_type and cloud in (None, c)]
    if not found:
        raise ValueError(f"the catalog has no facts for {instance_type!r}")
    return decide(expectations_for(found[0], nodes), outputs, stack=stack, node=node, checked_at=checked_at)


@dataclass(frozen=True)
class InvalidResult:
    """A ``health/<stack>/`` object that is not a readable :class:`NodeHealth` (key, reason)."""

    key: str
    reason: str


@dataclass(frozen=True)
class HealthReport:
    """The stack's results: readable ones sorted by node, and unreadable ones."""

    stack: str
    bucket: str
    nodes: tuple[NodeHealth, ...]
    invalid: tuple[InvalidResult, ...]

    @property
    def passed(self) -> bool:
        """Results exist, all are readable and every node passed."""
        return bool(self.nodes or self.invalid) and not self.invalid and all(n.passed for n in self.nodes)

    @property
    def prefix(self) -> str:
        """``health/<stack>/``."""
        return f"{HEALTH_PREFIX}/{self.stack}/"


def _parse(key: str, body: bytes, stack: str) -> NodeHealth | InvalidResult:
    try:
        health = NodeHealth.from_dict(json.loads(body))
    except (ValueError, UnicodeDecodeError) as exc:
        return InvalidResult(key, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    if health.stack != stack:
        return InvalidResult(key, f"written for stack {health.stack!r}")
    return health


def _s3_objects(bucket: str, prefix: str, client) -> list[tuple[str, bytes]]:
    import boto3
    from botocore.exceptions import ClientError, NoCredentialsError

    client = client or boto3.client("s3")
    try:
        keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for o in page.get("Contents", []) if o["Key"].endswith(".json")]
        return [(key, client.get_object(Bucket=bucket, Key=key)["Body"].read()) for key in sorted(keys)]
    except NoCredentialsError:
        raise MissingDependencyError("no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
                                     "AWS_SECRET_ACCESS_KEY (`aws configure`)") from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            raise GpuinfraError(f"bucket {bucket} does not exist (is the stack up? give the right --bucket)") from None
        if code in ("AccessDenied", "ExpiredToken", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise MissingDependencyError(f"cannot read s3://{bucket}/{prefix}: {code}; check the AWS credentials "
                                         "and their s3:ListBucket / s3:GetObject permissions") from None
        raise OperationError(f"reading s3://{bucket}/{prefix} failed: {code or exc}") from None


def _gcs_objects(bucket: str, prefix: str, client) -> list[tuple[str, bytes]]:
    try:
        from google.cloud import storage
    except ImportError:
        raise MissingDependencyError("reading a GCS bucket needs google-cloud-storage: pip install "
                                     "google-cloud-storage") from None
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import DefaultCredentialsError

    try:
        client = client or storage.Client()
        blobs = sorted((b for b in client.list_blobs(bucket, prefix=prefix) if b.name.endswith(".json")),
                       key=lambda b: b.name)
        return [(b.name, b.download_as_bytes()) for b in blobs]
    except DefaultCredentialsError:
        raise MissingDependencyError("no GCP credentials found: run `gcloud auth application-default login` or set "
                                     "GOOGLE_APPLICATION_CREDENTIALS") from None
    except gexc.NotFound:
        raise GpuinfraError(f"bucket {bucket} does not exist (is the stack up? give the right --bucket)") from None
    except gexc.Forbidden as exc:
        raise MissingDependencyError(f"cannot read gs://{bucket}/{prefix}: {exc.message}; check the GCP credentials "
                                     "and their storage.objects.list / storage.objects.get permissions") from None
    except gexc.GoogleAPIError as exc:
        raise OperationError(f"reading gs://{bucket}/{prefix} failed: {exc}") from None


def read_health(cloud: str, bucket: str, stack: str, client=None) -> HealthReport:
    """Every node result the stack's nodes uploaded (``<bucket>/health/<stack>/*.json``).

    Args:
        cloud: ``aws`` (S3) | ``gcp`` (GCS).
        client: a boto3 S3 client / ``google.cloud.storage.Client`` (default: a new one).

    Raises:
        MissingDependencyError: no credentials or no permission; GCS without
            google-cloud-storage.
        GpuinfraError: the bucket does not exist (exit 2).
        OperationError: another storage error.
    """
    prefix = f"{HEALTH_PREFIX}/{stack}/"
    objects = (_s3_objects if cloud == "aws" else _gcs_objects)(bucket, prefix, client)
    parsed = [_parse(key, body, stack) for key, body in objects]
    nodes = tuple(sorted((r for r in parsed if isinstance(r, NodeHealth)), key=lambda n: n.node))
    invalid = tuple(r for r in parsed if isinstance(r, InvalidResult))
    return HealthReport(stack, bucket, nodes, invalid)
