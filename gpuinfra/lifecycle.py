"""``up`` / ``down`` / ``ls`` / ``reap``: the stack lifecycle through Pulumi's Automation API.

The Automation API (``pulumi.automation``) drives the Pulumi CLI, which must be on PATH; its
boundary is the small :class:`Backend` protocol so the command layer is tested with a recording
fake. Rules:

* nothing starts without the Pulumi CLI (:data:`PULUMI_INSTALL_HINT`, exit code 6) or without
  cloud credentials (exit 6);
* ``down`` keeps the bucket and its data (the bucket is ``retain_on_delete``); with
  ``--delete-data`` it first counts the bucket's objects and refuses a non-empty bucket unless
  confirmed (``--yes`` or an interactive yes), then marks the stack ``delete_bucket_on_destroy``,
  applies that (``up``) and destroys;
* ``reap --expired`` destroys (keeping data) every stack whose TTL has passed; ``--dry-run``
  only lists them.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Callable, Protocol

import yaml

from gpuinfra.errors import MissingDependencyError, OperationError, SpecError
from gpuinfra.fsutil import atomic_write_text
from gpuinfra.spec import ClusterSpec
from gpuinfra.stackfile import STACKS_DIRNAME, read_stack_spec, stack_file_path

PULUMI_INSTALL_HINT = (
    "the Pulumi CLI is not installed: install it with `curl -fsSL https://get.pulumi.com | sh` "
    "(see https://www.pulumi.com/docs/iac/download-install/) and make sure `pulumi` is on PATH"
)


@dataclass(frozen=True)
class StackStatus:
    """What the backend knows about a deployed stack."""

    name: str
    update_in_progress: bool
    last_update: datetime | None
    resource_count: int | None


class Backend(Protocol):
    """The Automation API boundary."""

    def list_stacks(self, project_dir: Path) -> list[StackStatus]:
        """Stacks of the project known to the Pulumi backend."""

    def up(self, project_dir: Path, stack: str, on_event: Callable[[object], None]) -> dict:
        """Create or update the stack; return the change summary."""

    def destroy(self, project_dir: Path, stack: str, on_event: Callable[[object], None]) -> dict:
        """Destroy the stack's resources; return the change summary."""

    def outputs(self, project_dir: Path, stack: str) -> dict:
        """The stack's outputs (plain values)."""


class PulumiAutomation:
    """:class:`Backend` over ``pulumi.automation.LocalWorkspace`` on the project folder.

    Raises:
        MissingDependencyError: the Pulumi CLI is not on PATH.
    """

    def __init__(self) -> None:
        if shutil.which("pulumi") is None:
            raise MissingDependencyError(PULUMI_INSTALL_HINT)

    @staticmethod
    def _stack(project_dir: Path, stack: str):
        from pulumi import automation as auto

        try:
            return auto.select_stack(stack_name=stack, work_dir=str(project_dir))
        except auto.StackNotFoundError:
            raise SpecError(f"stack {stack!r} is not deployed (no Pulumi state); run `gpuinfra up {stack}` first") from None

    def list_stacks(self, project_dir: Path) -> list[StackStatus]:
        from pulumi import automation as auto

        workspace = auto.LocalWorkspace(work_dir=str(project_dir))
        result = []
        for s in workspace.list_stacks():
            last = None
            if s.last_update:
                try:
                    last = datetime.fromisoformat(str(s.last_update).replace("Z", "+00:00"))
                except ValueError:
                    last = None
            result.append(StackStatus(s.name, bool(s.update_in_progress), last, s.resource_count))
        return result

    def up(self, project_dir: Path, stack: str, on_event) -> dict:
        return _run(lambda: self._stack(project_dir, stack).up(on_event=on_event, color="never"), stack)

    def destroy(self, project_dir: Path, stack: str, on_event) -> dict:
        return _run(lambda: self._stack(project_dir, stack).destroy(on_event=on_event, color="never"), stack)

    def outputs(self, project_dir: Path, stack: str) -> dict:
        return {k: v.value for k, v in self._stack(project_dir, stack).outputs().items()}


def _run(operation, stack: str) -> dict:
    from pulumi import automation as auto

    try:
        result = operation()
    except auto.ConcurrentUpdateError:
        raise OperationError(
            f"stack {stack!r} is locked by another update in progress; wait for it, or if it died run "
            f"`pulumi cancel -s {stack}`"
        ) from None
    except auto.CommandError as exc:
        text = str(exc)
        if any(marker in text for marker in ("ExpiredToken", "token included in the request is expired",
                                             "invalid_grant", "Reauthentication")):
            raise MissingDependencyError(f"cloud credentials for stack {stack!r} are expired: log in again "
                                         "(`aws sso login` / `gcloud auth application-default login`)") from None
        last = [line for line in text.splitlines() if line.strip()][-1:] or ["unknown error"]
        raise OperationError(f"pulumi failed on stack {stack!r}: {last[0].strip()}") from None
    summary = getattr(result, "summary", None)
    return dict(getattr(summary, "resource_changes", None) or {})


def check_credentials(cloud: str) -> None:
    """Fail early, with the fix, when no cloud credentials are configured.

    Raises:
        MissingDependencyError: none found.
    """
    if cloud == "aws":
        import boto3

        if boto3.Session().get_credentials() is None:
            raise MissingDependencyError(
                "no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (`aws configure`)"
            )
        return
    adc = Path(os.environ.get("CLOUDSDK_CONFIG", Path.home() / ".config" / "gcloud")) / "application_default_credentials.json"
    if not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") and not adc.is_file():
        raise MissingDependencyError(
            "no GCP credentials found: run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"
        )


def count_bucket_objects(cloud: str, bucket: str, client=None) -> int:
    """Objects in the stack's bucket (S3 via boto3; GCS via google-cloud-storage when installed).

    Raises:
        MissingDependencyError: GCS check without google-cloud-storage.
    """
    if cloud == "aws":
        import boto3

        client = client or boto3.client("s3")
        return sum(page.get("KeyCount", 0) for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket))
    try:
        from google.cloud import storage
    except ImportError:
        raise MissingDependencyError("checking a GCS bucket needs google-cloud-storage: pip install google-cloud-storage") from None
    return sum(1 for _ in (client or storage.Client()).list_blobs(bucket))


def mark_delete_data(project_dir: Path, stack: str) -> None:
    """Set ``delete_bucket_on_destroy: true`` in the stack file (written atomically)."""
    path = stack_file_path(project_dir, stack)
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["delete_bucket_on_destroy"] = True
    atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))


def stack_names(project_dir: Path) -> list[str]:
    """Stacks that have a stack file in ``<project_dir>/stacks``."""
    folder = Path(project_dir) / STACKS_DIRNAME
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in folder.glob("Pulumi.*.yaml"))


@dataclass
class StackRow:
    """One line of ``gpuinfra ls``."""

    spec: ClusterSpec
    status: StackStatus | None
    now: datetime

    @property
    def price_per_hour_usd(self) -> Decimal | None:
        """Cluster $/h recorded in the stack file."""
        return self.spec.price_per_hour_usd

    @property
    def deployed(self) -> bool | None:
        """True/False from the backend; None when unknown (no Pulumi CLI)."""
        if self.status is None:
            return None
        return (self.status.resource_count or 0) > 0

    @property
    def cost_so_far_usd(self) -> Decimal | None:
        """$/h x hours since the last update, for deployed stacks."""
        if not self.deployed or self.status.last_update is None or self.price_per_hour_usd is None:
            return None
        hours = Decimal(str(max(0.0, (self.now - self.status.last_update).total_seconds() / 3600)))
        return (self.price_per_hour_usd * hours).quantize(Decimal("0.01"))

    @property
    def expired(self) -> bool:
        """TTL passed."""
        return self.now >= self.spec.expires_at


def list_rows(project_dir: Path, backend: Backend | None, now: datetime | None = None) -> list[StackRow]:
    """Rows for ``ls`` from the stack files, joined with the backend's view when available."""
    now = now or datetime.now(timezone.utc)
    statuses = {s.name: s for s in backend.list_stacks(project_dir)} if backend is not None else {}
    rows = []
    for name in stack_names(project_dir):
        try:
            spec = read_stack_spec(project_dir, name)
        except SpecError:
            continue  # not a gpuinfra stack file
        status = statuses.get(name, StackStatus(name, False, None, 0)) if backend is not None else None
        rows.append(StackRow(spec, status, now))
    return rows


def make_backend() -> Backend:
    """The real backend (tests replace this function).

    Raises:
        MissingDependencyError: no Pulumi CLI.
    """
    return PulumiAutomation()
