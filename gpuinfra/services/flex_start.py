"""``up`` of a flex-start cluster: wait, bounded, for its MIG resize request to be fulfilled.

Creating the ``gcp.compute.ResizeRequest`` (blueprints/gcp/resize_request.py) returns once the
request exists; the Dynamic Workload Scheduler then creates all VMs at once when capacity is
there, or never. ``gpuinfra up`` therefore polls the request through the Compute API
(``instanceGroupManagerResizeRequests.get``, google-cloud-compute
``InstanceGroupManagerResizeRequestsClient``) until it is ``SUCCEEDED`` or the capacity timeout
passes. States (Compute API ``InstanceGroupManagerResizeRequest.State``): ``CREATING`` ("being
created and may still fail creation"), ``ACCEPTED`` ("accepted for provisioning when the capacity
becomes available"), ``SUCCEEDED``, ``FAILED`` ("If the request fails during provisioning, any
VMs that were created during provisioning are rolled back and removed from the MIG"),
``CANCELLED``.

Not fulfilled in time (still CREATING / ACCEPTED): the request is cancelled
(``instanceGroupManagerResizeRequests.cancel``: "Cancel resize requests to stop the MIG from
creating the requested number of virtual machine (VM) instances",
cloud.google.com/compute/docs/instance-groups/manage-resize-requests-mig), so no VM comes later,
unattended; ``up`` then destroys the stack (:func:`gpuinfra.lifecycle.deploy`) and exits 7.
FAILED or CANCELLED: nothing was left running (the rollback above), same exit.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from gpuinfra.credentials import gcp_credentials
from gpuinfra.errors import CapacityError, MissingDependencyError
from gpuinfra.plan.flex_start import resize_request_name
from gpuinfra.plan.formation import DEFAULT_CAPACITY_TIMEOUT_SECONDS
from gpuinfra.plan.naming import gcp_group_name
from gpuinfra.spec import ClusterSpec

#: The request's terminal state that means every node exists.
SUCCEEDED = "SUCCEEDED"
#: States in which the request can still create VMs (so it is cancelled on a timeout).
PENDING_STATES = ("CREATING", "ACCEPTED")
#: Terminal states in which it created none (or rolled back what it made).
FAILED_STATES = ("FAILED", "CANCELLED")
#: Seconds between two polls of the request (a product choice: one cheap GET every 10 s).
POLL_SECONDS = 10.0
#: Longest wait for the cancel operation to finish, in seconds (a product bound).
CANCEL_TIMEOUT_SECONDS = 120
#: Timeout of one HTTP request to the Compute API, in seconds (a product bound).
REQUEST_TIMEOUT_SECONDS = 30


def make_resize_requests_client(project: str | None) -> tuple[Any, str]:
    """``(InstanceGroupManagerResizeRequestsClient, project)`` of google-cloud-compute with
    Application Default Credentials.

    Raises:
        MissingDependencyError: no client library, no credentials or no project (exit 6).
    """
    try:  # google-cloud-compute is an optional extra
        from google.cloud import compute_v1
    except ImportError:
        raise MissingDependencyError(
            "waiting for a flex-start request needs google-cloud-compute (pip install 'gpuinfra[gcp-monitoring]')"
        ) from None
    credentials, default_project = gcp_credentials()
    project = project or default_project
    if not project:
        raise MissingDependencyError("no GCP project for the flex-start request (gcp:project / --gcp-project)")
    return compute_v1.InstanceGroupManagerResizeRequestsClient(credentials=credentials), project


def not_fulfilled(seconds: float, detail: str = "") -> CapacityError:
    """The one-line capacity error (exit 7) of a flex-start request that did not form the cluster."""
    return CapacityError(f"flex-start request not fulfilled within {seconds:g} s{detail}")


def wait_for_resize_request(
    spec: ClusterSpec,
    capacity_timeout_seconds: float = DEFAULT_CAPACITY_TIMEOUT_SECONDS,
    client: Any = None,
    project: str | None = None,
    poll_seconds: float = POLL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Poll the stack's resize request until ``SUCCEEDED`` or ``capacity_timeout_seconds`` pass.

    Args:
        spec: a flex-start stack (:attr:`ClusterSpec.gcp_flex_start`).
        capacity_timeout_seconds: how long to wait for every node (``up --capacity-timeout``).
        client, project: an ``InstanceGroupManagerResizeRequestsClient`` and the project (default:
            :func:`make_resize_requests_client` with ``spec.gcp_project``).
        poll_seconds: seconds between polls (the last wait is cut to the deadline).
        clock, sleep: time source and wait (tests).

    Returns:
        ``SUCCEEDED``.

    Raises:
        CapacityError: not SUCCEEDED within the timeout (the request is cancelled first; a failed
            cancel is the same error, so ``up`` destroys the stack and the group with it), or FAILED /
            CANCELLED (exit 7): "flex-start request not fulfilled within N s".
            A Compute API error while reading the request counts as not fulfilled (cancelled, best
            effort), so ``up`` destroys the stack rather than leave a request that may create VMs.
    """
    if client is None:
        client, project = make_resize_requests_client(project or spec.gcp_project)
    project = project or spec.gcp_project
    where = {
        "project": project,
        "zone": spec.zone,
        "instance_group_manager": gcp_group_name(spec),
        "resize_request": resize_request_name(spec),
    }
    # google-api-core comes with the optional google-cloud-compute extra: imported on use
    from google.api_core.exceptions import GoogleAPIError
    from google.api_core.retry import Retry, if_transient_error

    deadline = clock() + capacity_timeout_seconds
    while True:
        # transient errors are retried, but never past the capacity timeout (the client's own
        # default retry would go on for minutes)
        retry = Retry(predicate=if_transient_error, initial=0.5, maximum=5.0, timeout=max(1.0, deadline - clock()))
        try:
            state = str(client.get(**where, retry=retry, timeout=REQUEST_TIMEOUT_SECONDS).state)
        except GoogleAPIError as exc:  # unknown is not formed: cancel (best effort) so nothing comes later
            _cancel_quietly(client, where)
            raise not_fulfilled(capacity_timeout_seconds, f": reading it failed ({exc}); cancelled") from None
        if state == SUCCEEDED:
            return state
        if state in FAILED_STATES:
            raise not_fulfilled(capacity_timeout_seconds, f": it is {state}")
        left = deadline - clock()
        if left <= 0:
            # a pending request must not create the VMs later, unattended; wait for the cancel to be done
            try:
                client.cancel(**where).result(timeout=CANCEL_TIMEOUT_SECONDS)
            except (GoogleAPIError, TimeoutError) as exc:  # still the capacity error: `up` destroys the group
                said = " ".join(str(exc).split())
                raise not_fulfilled(
                    capacity_timeout_seconds, f" (it was {state}; cancelling it failed: {said})"
                ) from None
            raise not_fulfilled(capacity_timeout_seconds, f" (it was {state}; cancelled)")
        sleep(min(poll_seconds, left))


def _cancel_quietly(client: Any, where: dict[str, str | None]) -> None:
    """Cancel the request, ignoring a failure (the caller destroys the stack, which deletes the
    group and so its requests)."""
    from google.api_core.exceptions import GoogleAPIError  # optional extra, as above

    with contextlib.suppress(GoogleAPIError):
        client.cancel(**where).result(timeout=CANCEL_TIMEOUT_SECONDS)
