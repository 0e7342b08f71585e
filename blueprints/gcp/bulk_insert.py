"""All-or-nothing STANDARD / SPOT VMs: one ``instances.bulkInsert`` as a Pulumi dynamic resource.

A managed instance group cannot create STANDARD or SPOT VMs all at once: bulk mode "is only
supported with instance templates that specify either a reservation-bound or flex-start
provisioning model" (cloud.google.com/compute/docs/instance-groups/about-bulk-mode#limitations),
and an ordinary group keeps creating VMs after a failed ``up``. A zonal ``instances.bulkInsert``
(cloud.google.com/compute/docs/reference/rest/v1/instances/bulkInsert) with ``minCount`` =
``count`` = N is all-or-nothing: "If min_count instances cannot be created, then no instances will
be created and instances already created will be deleted" (``BulkInsertInstanceResource.minCount``,
Compute v1 reference). Slurm on GCP forms its placement-group nodes the same way (@02895bea):
cluster-toolkit ``community/modules/scheduler/schedmd-slurm-gcp-v6-controller/modules/slurm_files/
scripts/resume.py`` (``create_instances_request``: ``count`` = the nodes, ``sourceInstanceTemplate``,
``perInstanceProperties`` keyed by the node names, and no ``minCount`` with a placement group "to
force all or nothing behavior", ``minCount`` defaulting to ``count``).

:class:`BulkInsertProvider`:

* **create**: one bulkInsert of the fixed names (:func:`gpuinfra.plan.naming.gcp_bulk_instance_names`)
  from the stack's template (``sourceInstanceTemplate`` = its ``self_link_unique``), then the zone
  operation is read (``zoneOperations.get``) until ``DONE`` or until ``capacity_timeout_seconds``
  have passed. On an error, the timeout, or fewer VMs than asked for, every one of its names that
  exists is deleted and the deletes are waited for (:data:`DELETE_WAIT_SECONDS`), then it raises
  the classified error of :func:`gpuinfra.launch_errors.gcp_launch_error` (its marker starts the
  line ``gpuinfra up`` reads: capacity exit 7, quota 9, IAM 11, anything else 10). Every wait
  for a zone operation (the insert, the cleanup after its timeout, the group's resize) is
  :func:`wait_for_operation`: one deadline, one handling of a refused read.
* **delete**: deletes every name (404: already gone) and waits for the deletes, then empties the
  group's MIG (``instanceGroupManagers.resize`` to 0: its members are the replacements of lost
  nodes, nodes of the same cluster), so a replacement of the bulk insert (``up --replace-nodes``,
  another node count) leaves no node of the old cluster billing beside the new one; on ``down``
  the MIG is deleted next anyway.
* **diff**: any change of an input but the timeout replaces the VMs (``up`` refuses an update
  that replaces nodes without ``--replace-nodes``: :data:`gpuinfra.lifecycle.NODE_RESOURCE_TYPES`).

The outputs (the Pulumi state) list the names, zone and project, so ``down`` deletes exactly them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from gpuinfra.launch_errors import (
    GCP_BULK_INSERT_TYPE,
    GCP_LEFT_RUNNING_TEXT,
    GCP_TIMEOUT_CODE,
    GcpError,
    gcp_launch_error,
)

#: Type token of the resource (``dynamic.Resource`` builds it from ``module`` and ``name``).
TYPE_TOKEN = GCP_BULK_INSERT_TYPE
#: Seconds between two reads of an operation.
POLL_SECONDS = 5.0
#: Longest wait for the deletes of a failed or destroyed formation, in seconds (a product bound:
#: GPU VMs without a graceful shutdown are deleted in about a minute; ``down`` reports what is left).
DELETE_WAIT_SECONDS = 300.0
#: Inputs whose change does not replace the VMs (only how long ``up`` waits).
NOT_REPLACING = frozenset({"capacity_timeout_seconds", "machine_type", "region"})


@dataclass
class ComputeClients:
    """The Compute clients the provider calls: ``instances`` (``compute_v1.InstancesClient``) and
    ``operations`` (``compute_v1.ZoneOperationsClient``), ``groups``
    (``compute_v1.InstanceGroupManagersClient``)."""

    instances: Any
    operations: Any
    groups: Any = None


def make_clients(client_options: Any = None, credentials: Any = None) -> ComputeClients:
    """Compute REST clients (application default credentials unless ``credentials``; tests pass
    ``client_options`` with the ``api_endpoint`` of a local stand-in)."""
    from google.cloud import compute_v1

    kwargs: dict[str, Any] = {"transport": "rest"}
    if client_options is not None:
        kwargs["client_options"] = client_options
    if credentials is not None:
        kwargs["credentials"] = credentials
    return ComputeClients(
        compute_v1.InstancesClient(**kwargs),
        compute_v1.ZoneOperationsClient(**kwargs),
        compute_v1.InstanceGroupManagersClient(**kwargs),
    )


def empty_group(
    clients: ComputeClients,
    project: str,
    zone: str,
    group: str,
    wait_seconds: float = DELETE_WAIT_SECONDS,
    poll_seconds: float = POLL_SECONDS,
) -> None:
    """Resize the MIG ``group`` to 0 (``instanceGroupManagers.resize`` with size 0: the MIG deletes
    its VMs, cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/resize) and wait
    for the call's operation, at most ``wait_seconds``; a group that is gone (404) is empty.

    Raises:
        google.api_core.exceptions.GoogleAPICallError: the call or a read of its operation was refused.
    """
    from google.api_core.exceptions import NotFound

    try:
        operation = clients.groups.resize_unary(project=project, zone=zone, instance_group_manager=group, size=0)
    except NotFound:
        return
    deadline = time.monotonic() + wait_seconds
    wait_for_operation(
        clients, project, zone, operation, deadline, poll_seconds, time.monotonic, time.sleep, refused_ends_wait=True
    )


def _call_error(exc: Exception) -> GcpError:
    """A refused call (``google.api_core.exceptions.GoogleAPICallError``) as a :class:`GcpError`:
    the first of its ``errors`` (Compute's ``reason``), its message and HTTP status."""
    status = int(getattr(exc, "code", 0) or 0)
    message = " ".join(str(getattr(exc, "message", exc)).split())
    reasons = [e.get("reason", "") for e in getattr(exc, "errors", None) or [] if isinstance(e, dict)]
    code = next((r for r in reasons if r), "") or type(exc).__name__
    return GcpError(code, message, status)


def _read_operation(clients: ComputeClients, project: str, zone: str, operation: Any) -> tuple[Any, str]:
    """``(the operation as zoneOperations.get reads it now, "")``, or, the read refused (an HTTP
    error the client does not retry itself, such as Compute's 403 ``rateLimitExceeded``),
    ``(operation unchanged, the refusal as one line)``."""
    from google.api_core.exceptions import GoogleAPICallError

    try:
        return clients.operations.get(project=project, zone=zone, operation=operation.name), ""
    except GoogleAPICallError as exc:
        return operation, _call_error(exc).line()


def wait_for_operation(
    clients: ComputeClients,
    project: str,
    zone: str,
    operation: Any,
    deadline: float,
    poll_seconds: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    each_round: Callable[[], None] | None = None,
    refused_ends_wait: bool = False,
) -> tuple[Any, str]:
    """Read the zone operation ``operation`` (``zoneOperations.get``) until it is ``DONE`` or the
    clock passes ``deadline``, every ``poll_seconds`` (the last sleep cut to the deadline): the
    one wait of the insert, of the cleanup after its timeout and of :func:`empty_group`.

    A refused read (an HTTP error the client does not retry itself, such as Compute's 403
    ``rateLimitExceeded``: cloud.google.com/compute/api-quota) is no end of the operation: the
    wait reads on with the operation as last read, and the refusal, as one line, is returned
    while no later read succeeded.

    Args:
        operation: as the call that started it returned it (``compute_v1.Operation``).
        deadline: a value of ``clock`` (seconds).
        each_round: called before each look at the operation (the first one included), e.g. to
            delete what a timed-out insert still makes.
        refused_ends_wait: a refused read raises instead.

    Returns:
        (the operation as last read, the last read's refusal or "").

    Raises:
        google.api_core.exceptions.GoogleAPICallError: a read was refused and ``refused_ends_wait``.
    """
    from google.cloud import compute_v1

    refused = ""
    while True:
        if each_round is not None:
            each_round()
        if operation.status == compute_v1.Operation.Status.DONE or clock() >= deadline:
            return operation, refused
        sleep(min(poll_seconds, max(0.0, deadline - clock())))
        if refused_ends_wait:
            operation = clients.operations.get(project=project, zone=zone, operation=operation.name)
        else:
            operation, refused = _read_operation(clients, project, zone, operation)


def _operation_errors(operation: Any) -> list[GcpError]:
    """The entries of a DONE operation's ``error.errors``."""
    error = getattr(operation, "error", None)
    return [GcpError(e.code, " ".join(e.message.split())) for e in (error.errors if error else [])]


def existing(clients: ComputeClients, project: str, zone: str, names: list[str]) -> list[str]:
    """Those of ``names`` that ``instances.get`` finds (404: not there)."""
    from google.api_core.exceptions import NotFound

    found = []
    for name in names:
        try:
            clients.instances.get(project=project, zone=zone, instance=name)
        except NotFound:
            continue
        found.append(name)
    return found


def delete_all(
    clients: ComputeClients,
    project: str,
    zone: str,
    names: list[str],
    wait_seconds: float = DELETE_WAIT_SECONDS,
    poll_seconds: float = POLL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Delete every one of ``names`` that exists (``instances.delete``; 404: already gone) and wait
    until ``instances.get`` finds none of them, at most ``wait_seconds``. A refused delete (any
    other HTTP error: a VM whose own operation is not done yet, a rate limit) does not stop the
    others and is tried again at each poll while the VM exists; a failed read counts the VMs as
    still there (money: never report a VM gone that was not seen gone).

    Returns:
        The names still found (or not known gone) when the wait ended (empty: all gone).
    """
    from google.api_core.exceptions import GoogleAPICallError, NotFound

    start = clock()
    to_delete = list(names)
    while True:
        refused = []
        for name in to_delete:
            try:
                clients.instances.delete_unary(project=project, zone=zone, instance=name)
            except NotFound:
                continue
            except GoogleAPICallError:
                refused.append(name)
        left = existing_or_all(clients, project, zone, names)
        if not left or clock() - start >= wait_seconds:
            return left
        to_delete = [name for name in refused if name in left]
        sleep(poll_seconds)


def existing_or_all(clients: ComputeClients, project: str, zone: str, names: list[str]) -> list[str]:
    """:func:`existing`, or every one of ``names`` when a read fails (not known gone: fail closed)."""
    from google.api_core.exceptions import GoogleAPICallError

    try:
        return existing(clients, project, zone, names)
    except GoogleAPICallError:
        return list(names)


def form(
    clients: ComputeClients,
    props: dict[str, Any],
    poll_seconds: float | None = None,
    delete_wait_seconds: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """One all-or-nothing bulk insert of ``props["names"]`` (module docstring).

    When the capacity timeout passes with the operation still running, the VMs it made are
    deleted, and as Compute Engine has no call that cancels an operation (``zoneOperations``
    has ``delete`` -- of the record --, ``get``, ``list`` and ``wait``:
    cloud.google.com/compute/docs/reference/rest/v1/zoneOperations), the operation is read on
    until it ends, at most ``delete_wait_seconds``, deleting whatever of its names it still
    creates: ``up`` reports at the latest after the timeout plus that bound, nothing left.

    Args:
        clients: :func:`make_clients`.
        props: the resource's inputs: ``project``, ``zone``, ``region``, ``template`` (the
            template's ``self_link_unique``), ``names``, ``machine_type``,
            ``capacity_timeout_seconds``.
        poll_seconds, delete_wait_seconds: None: :data:`POLL_SECONDS`, :data:`DELETE_WAIT_SECONDS`.

    Raises:
        GpuinfraError: the classified failure (``CapacityError`` on
            ``ZONE_RESOURCE_POOL_EXHAUSTED*`` or the timeout, ``QuotaError`` on ``QUOTA_EXCEEDED``,
            ``LaunchDeniedError`` on a 403, else ``LaunchRejectedError``); nothing of it is left
            unless the deletes themselves fail (the message then names what is left).
    """
    from google.api_core.exceptions import GoogleAPICallError
    from google.cloud import compute_v1

    poll_seconds = POLL_SECONDS if poll_seconds is None else poll_seconds
    delete_wait_seconds = DELETE_WAIT_SECONDS if delete_wait_seconds is None else delete_wait_seconds
    project, zone, names = props["project"], props["zone"], list(props["names"])
    timeout = float(props["capacity_timeout_seconds"])
    start = clock()
    count, min_count = int(props["count"]), int(props["min_count"])  # what the stack declares (the rules judge it)
    if count != len(names):
        raise ValueError(f"bulk insert of {count} VMs under {len(names)} names")
    resource = compute_v1.BulkInsertInstanceResource(
        count=count,
        min_count=min_count,
        source_instance_template=props["template"],
        per_instance_properties={name: compute_v1.BulkInsertInstanceResourcePerInstanceProperties() for name in names},
    )
    errors: list[GcpError] = []
    # VMs under these names are an interrupted `up`'s (this resource is being created, so the
    # state knows none): deleted first, or the insert would fail on names that exist
    delete_all(
        clients, project, zone, existing(clients, project, zone, names), delete_wait_seconds, poll_seconds, clock, sleep
    )
    try:
        operation = clients.instances.bulk_insert_unary(
            project=project, zone=zone, bulk_insert_instance_resource_resource=resource
        )
        # a refused read is no end of the insert: read on, within the timeout
        operation, refused = wait_for_operation(
            clients, project, zone, operation, start + timeout, poll_seconds, clock, sleep
        )
        if operation.status != compute_v1.Operation.Status.DONE:
            detail = f" (the last read of its operation was refused: {refused})" if refused else ""
            errors = [
                GcpError(GCP_TIMEOUT_CODE, f"not every VM was created within --capacity-timeout {timeout:g} s{detail}")
            ]

            def drain() -> None:  # no cancel: delete what it made, and what it still makes, until it ends
                left = existing_or_all(clients, project, zone, names)
                delete_all(clients, project, zone, left, 0, poll_seconds, clock, sleep)

            operation, _ = wait_for_operation(
                clients, project, zone, operation, clock() + delete_wait_seconds, poll_seconds, clock, sleep, drain
            )
        else:
            errors = _operation_errors(operation)
    except GoogleAPICallError as exc:
        errors = [_call_error(exc)]
    created = existing_or_all(clients, project, zone, names)
    if not errors and len(created) == len(names):
        return
    left = delete_all(clients, project, zone, created, delete_wait_seconds, poll_seconds, clock, sleep)
    error = gcp_launch_error(errors, len(created), len(names), props["machine_type"], zone, props["region"])
    if left:
        error = type(error)(
            f"{error}; {GCP_LEFT_RUNNING_TEXT} {delete_wait_seconds:g} s: {', '.join(left)} (run `gpuinfra down`)"
        )
    raise error


class BulkInsertProvider(dynamic.ResourceProvider):
    """The dynamic provider of :class:`BulkInstances` (module docstring).

    Args:
        client_options, credentials: passed to the Compute clients (None: the defaults; tests
            point them at a local stand-in).
    """

    def __init__(self, client_options: Any = None, credentials: Any = None) -> None:
        self.client_options = client_options
        self.credentials = credentials

    def _clients(self) -> ComputeClients:
        return make_clients(self.client_options, self.credentials)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        """bulkInsert all names, all or nothing (:func:`form`); the id is ``<project>/<zone>/<first name>``."""
        form(self._clients(), props)
        names = list(props["names"])
        return dynamic.CreateResult(f"{props['project']}/{props['zone']}/{names[0]}", outs=dict(props))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        """Delete every name (404: gone) and wait for it.

        Raises:
            RuntimeError: some VMs still exist after :data:`DELETE_WAIT_SECONDS` (named).
        """
        wait, clients, names = DELETE_WAIT_SECONDS, self._clients(), list(props["names"])
        left = delete_all(clients, props["project"], props["zone"], names, wait, POLL_SECONDS)
        if left:
            raise RuntimeError(f"VMs not deleted within {wait:g} s: {', '.join(left)}")
        empty_group(clients, props["project"], props["zone"], names[0].rsplit("-", 1)[0], wait, POLL_SECONDS)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        """Any changed input but :data:`NOT_REPLACING` replaces the VMs, the old ones deleted
        first (their names are fixed)."""
        keys = (set(olds) | set(news)) - NOT_REPLACING - {"__provider"}
        replaces = sorted(k for k in keys if olds.get(k) != news.get(k))
        changed = bool(replaces) or any(olds.get(k) != news.get(k) for k in NOT_REPLACING)
        return dynamic.DiffResult(changes=changed, replaces=replaces, delete_before_replace=True)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        """Only :data:`NOT_REPLACING` inputs changed: nothing to do in the cloud."""
        return dynamic.UpdateResult(outs=dict(news))


class BulkInstances(dynamic.Resource, module="gcp", name="BulkInsert"):  # = TYPE_TOKEN
    """The VMs of one all-or-nothing bulk insert (:class:`BulkInsertProvider`).

    Args:
        name: logical name.
        project, zone, region: where.
        template: the instance template's ``self_link_unique``.
        names: the VM names (:func:`gpuinfra.plan.naming.gcp_bulk_instance_names`).
        machine_type: for messages.
        capacity_timeout_seconds: how long create waits for every VM (``up --capacity-timeout``).
        opts: resource options.
    """

    names: pulumi.Output[list[str]]
    zone: pulumi.Output[str]
    project: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        project: str,
        zone: str,
        region: str,
        template: pulumi.Input[str],
        names: list[str],
        machine_type: str,
        capacity_timeout_seconds: int,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "project": project,
            "zone": zone,
            "region": region,
            "template": template,
            "names": list(names),
            "count": len(names),
            "min_count": len(names),
            "machine_type": machine_type,
            "capacity_timeout_seconds": capacity_timeout_seconds,
        }
        super().__init__(BulkInsertProvider(), name, props, opts)
