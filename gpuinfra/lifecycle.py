"""``up`` / ``down`` / ``ls`` / ``reap``: the stack lifecycle through Pulumi's Automation API.

The Automation API (``pulumi.automation``) drives the Pulumi CLI, which must be on PATH; its
boundary is the small :class:`Backend` protocol so the command layer is tested with a recording
fake. Rules:

* nothing starts without the Pulumi CLI (:data:`PULUMI_INSTALL_HINT`, exit code 6) or without
  cloud credentials (exit 6);
* ``down`` keeps the bucket and its data (the bucket is ``retain_on_delete``); before it
  destroys, it asks the running nodes to sync their checkpoints and waits (bounded) for their
  acks, and on AWS ends the nodes and waits (bounded) until they are terminated; with
  ``--delete-data`` it counts the objects of every bucket of the stack and refuses a non-empty
  one unless confirmed (``--yes`` or an interactive yes), destroys, then deletes the buckets
  through the cloud SDK -- never a ``pulumi up``, never a change of the stack file
  (:func:`destroy_cluster`);
* ``up`` that fails because the cloud launched fewer nodes than the cluster needs (the program
  raises :class:`~gpuinfra.errors.CapacityError`) destroys what it created, bucket kept, so a
  cluster that never formed bills nothing (:func:`deploy`); running ``up`` again starts afresh;
* every ``up`` that creates the nodes (a stack not deployed, ``--replace-nodes`` when the update
  replaces them, or a rerun of an interrupted ``up`` whose node creation is pending) gives the stack a new deployment id (:func:`record_deployment`) before
  Pulumi runs; the nodes carry it (node.env ``GPUINFRA_DEPLOYMENT``, tag ``gpuinfra:deployment``)
  and scope their health results, rank decisions and peer lists to it. ``down`` then terminates
  any instance still tagged with the stack and its deployment (the fleet of an interrupted ``up``
  that Pulumi never recorded: :func:`sweep_orphans`), as such an ``up`` does for the deployment
  it replaced;
* ``reap --expired`` destroys (keeping data, after the same sync request and wait as ``down``)
  every stack whose TTL has passed; ``--dry-run``
  only lists them. One failed destroy never stops the others: every result is reported at
  the end, and any failure exits 7 (:func:`reap_error`);
* ``ls`` and ``reap`` list a stack file they cannot read as invalid, with the reason, instead of
  hiding it (:class:`InvalidStack`); ``reap`` then cannot know its expiry and exits 2 once the
  others are done;
* an image bake (``gpuinfra:bake``) is no cluster: ``up`` / ``down`` of one go through
  :mod:`gpuinfra.bake.deploy` (none of the cluster guards apply), and ``ls`` / ``reap`` leave
  bakes out, so ``reap`` never destroys one (a bake has no TTL, and clusters boot its image).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

import yaml

from gpuinfra import teardown
from gpuinfra.agent.constants import SYNC_REQUEST_WAIT_SECONDS
from gpuinfra.bake.stack import list_bakes
from gpuinfra.catalog.store import Catalog, load_catalog
from gpuinfra.credentials import aws_session, check_gcp_credentials_configured
from gpuinfra.errors import (
    LAUNCH_ERRORS,
    GpuinfraError,
    InstanceProfileNotReady,
    MissingDependencyError,
    OperationError,
    RequestError,
    SpecError,
)
from gpuinfra.fsutil import atomic_write_text
from gpuinfra.launch_errors import (
    GCP_BULK_INSERT_TYPE,
    GCP_LEFT_RUNNING_TEXT,
    PROFILE_RETRY_SECONDS,
    PROFILE_RETRY_WAIT_SECONDS,
)
from gpuinfra.money import Total, usd_json
from gpuinfra.plan.formation import (
    CAPACITY_TIMEOUT_CONFIG_KEY,
    DEFAULT_CAPACITY_TIMEOUT_SECONDS,
    MAX_CAPACITY_TIMEOUT_SECONDS,
    MIN_CAPACITY_TIMEOUT_SECONDS,
)
from gpuinfra.plan.tags import AWS_DEPLOYMENT_TAG
from gpuinfra.preflight import run_preflight
from gpuinfra.rules.gcp import RESIZE_REQUEST
from gpuinfra.spec import ClusterSpec, new_deployment_id
from gpuinfra.stackfile import STACKS_DIRNAME, purchase_stacks, read_stack_config, read_stack_spec, stack_file_path

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

    def up(
        self, project_dir: Path, stack: str, on_event: Callable[[object], None], replace_types: tuple[str, ...] = ()
    ) -> dict:
        """Create or update the stack; return the change summary. ``replace_types``: type tokens
        whose resources in the state are replaced even without a change (``pulumi up --replace``)."""

    def replacements(self, project_dir: Path, stack: str) -> list[tuple[str, str]]:
        """``(type token, logical name)`` of every resource a ``pulumi preview`` would replace."""

    def pending_creates(self, project_dir: Path, stack: str) -> list[tuple[str, str]]:
        """``(type token, logical name)`` of every create an interrupted update left pending in
        the state (the cloud may hold the resource; Pulumi does not know its id)."""

    def destroy(self, project_dir: Path, stack: str, on_event: Callable[[object], None]) -> dict:
        """Destroy the stack's resources; return the change summary."""

    def outputs(self, project_dir: Path, stack: str) -> dict:
        """The stack's outputs (plain values)."""

    def forget(self, project_dir: Path, stack: str, type_token: str) -> list[str]:
        """Drop every resource of ``type_token`` from the stack's state without deleting it in the
        cloud; return their URNs."""


class PulumiAutomation:
    """:class:`Backend` over ``pulumi.automation.LocalWorkspace`` on the project folder.

    Raises:
        MissingDependencyError: the Pulumi CLI is not on PATH.
    """

    def __init__(self) -> None:
        if shutil.which("pulumi") is None:
            raise MissingDependencyError(PULUMI_INSTALL_HINT)

    @staticmethod
    def _stack(project_dir: Path, stack: str, create: bool = False):
        """The Automation API stack; ``create``: make its Pulumi state on the first ``up``
        (``select_stack`` "returns an error if the given Stack does not exist";
        ``create_or_select_stack`` creates it: pulumi.automation ``Stack.select`` /
        ``create_or_select_stack``)."""
        from pulumi import automation as auto

        if create:
            return auto.create_or_select_stack(stack_name=stack, work_dir=str(project_dir))
        try:
            return auto.select_stack(stack_name=stack, work_dir=str(project_dir))
        except auto.StackNotFoundError:
            raise SpecError(
                f"stack {stack!r} is not deployed (no Pulumi state); run `gpuinfra up {stack}` first"
            ) from None

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

    def up(self, project_dir: Path, stack: str, on_event, replace_types: tuple[str, ...] = ()) -> dict:
        selected = self._stack(project_dir, stack, create=True)
        replace = None
        if replace_types:  # `pulumi up --replace <urn>` (pulumi.automation Stack.up ``replace``)
            resources = (selected.export_stack().deployment or {}).get("resources") or []
            replace = [r["urn"] for r in resources if r.get("type") in replace_types] or None
        return _run(lambda: selected.up(on_event=on_event, color="never", replace=replace), stack)

    def replacements(self, project_dir: Path, stack: str) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []

        def collect(event) -> None:
            pre = getattr(event, "resource_pre_event", None)
            if pre is not None and pre.metadata.op in REPLACE_OPS:
                found.append((pre.metadata.type, pre.metadata.urn.split("::")[-1]))

        _run(lambda: self._stack(project_dir, stack).preview(on_event=collect, color="never"), stack)
        return sorted(set(found))

    def pending_creates(self, project_dir: Path, stack: str) -> list[tuple[str, str]]:
        # the checkpoint's pending_operations (apitype OperationV2: {"resource": {"urn", "type"},
        # "type": "creating" | ...}); pulumi.com/docs/iac/troubleshooting/common-issues/interrupted-updates
        deployment = self._stack(project_dir, stack).export_stack().deployment or {}
        return sorted(
            {
                (op["resource"]["type"], op["resource"]["urn"].split("::")[-1])
                for op in deployment.get("pending_operations") or []
                if op.get("type") == "creating" and isinstance(op.get("resource"), dict)
            }
        )

    def destroy(self, project_dir: Path, stack: str, on_event) -> dict:
        """``pulumi destroy --refresh``: the state is read back from the cloud first, so a resource
        already gone (the instant fleet the AWS TTL backstop deleted, a VM that ended itself) is
        dropped from the state instead of failing its delete (pulumi.com/docs/iac/cli/commands/
        pulumi_destroy: ``--refresh`` "Refresh the state of the stack's resources before this
        update"; terraform-provider-aws reads a fleet in a ``deleted*`` state as gone:
        ``internal/service/ec2/find.go`` ``findFleetByID``)."""
        return _run(
            lambda: self._stack(project_dir, stack).destroy(on_event=on_event, color="never", refresh=True), stack
        )

    def outputs(self, project_dir: Path, stack: str) -> dict:
        return {k: v.value for k, v in self._stack(project_dir, stack).outputs().items()}

    def forget(self, project_dir: Path, stack: str, type_token: str) -> list[str]:
        """Export the state, drop the resources (:func:`forget_resources`), import it again: the
        state edit Pulumi documents (pulumi.com/docs/iac/operations/stack-management/
        editing-state-files/: ``pulumi stack export``, edit, ``pulumi stack import``)."""
        from pulumi import automation as auto

        selected = self._stack(project_dir, stack)
        exported = selected.export_stack()
        deployment, removed = forget_resources(dict(exported.deployment or {}), type_token)
        if removed:
            selected.import_stack(auto.Deployment(version=exported.version, deployment=deployment))
        return removed


def forget_resources(deployment: dict, type_token: str) -> tuple[dict, list[str]]:
    """``deployment`` (the ``deployment`` object of ``pulumi stack export``) without the resources
    of ``type_token`` and without every reference to them (``dependencies``,
    ``propertyDependencies``, ``deletedWith``), so the import does not refuse a dangling URN.

    Returns:
        (the new deployment, the removed URNs).
    """
    resources = deployment.get("resources") or []
    removed = [r["urn"] for r in resources if r.get("type") == type_token]
    kept = []
    for resource in resources:
        if resource.get("urn") in removed:
            continue
        resource = dict(resource)
        if resource.get("dependencies"):
            resource["dependencies"] = [u for u in resource["dependencies"] if u not in removed]
        if resource.get("propertyDependencies"):
            resource["propertyDependencies"] = {
                key: [u for u in urns if u not in removed] for key, urns in resource["propertyDependencies"].items()
            }
        if resource.get("deletedWith") in removed:
            resource.pop("deletedWith")
        kept.append(resource)
    return {**deployment, "resources": kept}, removed


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
        launch = launch_failure(text)
        if launch is not None:
            raise launch from None
        if any(
            marker in text
            for marker in (
                "ExpiredToken",
                "token included in the request is expired",
                "invalid_grant",
                "Reauthentication",
            )
        ):
            raise MissingDependencyError(
                f"cloud credentials for stack {stack!r} are expired: log in again "
                "(`aws sso login` / `gcloud auth application-default login`)"
            ) from None
        # the provider's own line when a fleet could not be deleted (destroy_cluster acts on it)
        fleet = [line for line in text.splitlines() if FLEET_DELETE_ERROR in line][:1]
        last = fleet or [line for line in text.splitlines() if line.strip()][-1:] or ["unknown error"]
        raise OperationError(f"pulumi failed on stack {stack!r}: {last[0].strip()}") from None
    summary = getattr(result, "summary", None)
    return dict(getattr(summary, "resource_changes", None) or {})


def launch_failure(text: str) -> GpuinfraError | None:
    """The launch error the cluster program raised, found by its class's marker in Pulumi's output
    (:data:`gpuinfra.errors.LAUNCH_ERRORS`, most specific class first), or None."""
    for cls in LAUNCH_ERRORS:
        marker = cls.marker
        line = next((line for line in text.splitlines() if marker in line), None)
        if line is not None:
            return cls(line[line.index(marker) + len(marker) :].strip())
    return None


#: terraform-provider-aws's message when DeleteFleets fails (``resourceFleetDelete``:
#: "deleting EC2 Fleet (%s): %s"; it passes over only ``InvalidFleetId.NotFound``).
FLEET_DELETE_ERROR = "deleting EC2 Fleet"
FLEET_TYPE = "aws:ec2/fleet:Fleet"
#: Engine step ops of a replacement (pulumi.automation.events.OpType).
REPLACE_OPS = frozenset({"replace", "create-replacement", "delete-replaced"})
#: Resources whose replacement ends the running nodes: an instant fleet cannot be modified, so
#: any change that reaches it replaces it (blueprints/aws/nodes.py); a GCP group in bulk mode is
#: replaced when its size changes, and a GCP bulk insert when any of its inputs but the capacity
#: timeout changes (blueprints/gcp/nodes.py, blueprints/gcp/bulk_insert.py).
NODE_RESOURCE_TYPES = frozenset(
    {"aws:ec2/fleet:Fleet", "gcp:compute/instanceGroupManager:InstanceGroupManager", GCP_BULK_INSERT_TYPE}
)
#: ``up`` refuses a stack with less TTL left than this: the nodes would end (and the AWS
#: backstop schedule would be set in the past) before a cluster is of any use.
MIN_TTL_LEFT = timedelta(minutes=30)


def deploy(
    backend: Backend,
    project_dir: Path,
    spec: ClusterSpec,
    on_event: Callable[[object], None],
    replace_nodes: bool = False,
    now: datetime | None = None,
    notes: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    preflight: bool = True,
    capacity_timeout_seconds: int | None = None,
    wait_flex_start: Callable[[ClusterSpec, float], object] | None = None,
) -> dict:
    """``up``, refusing what would surprise: a TTL already (nearly) over, and an update of a
    deployed stack that would replace its running nodes unless ``replace_nodes``. An ``up`` that
    creates the nodes (the stack is not deployed, its update replaces them, or an interrupted
    ``up`` left their creation pending) records a new deployment id in the stack file first
    (:func:`record_deployment`); after that ``up``, instances of the replaced deployment that
    Pulumi did not know are terminated (:func:`sweep_orphans`). When the cloud
    launched fewer nodes than the cluster needs, a stack that did not exist before is destroyed
    again (its new, empty bucket is ``retain_on_delete`` and stays); a deployed stack is left as
    it is, with the fix in the message. The same holds for every classified launch failure
    (:data:`gpuinfra.errors.LAUNCH_ERRORS`: capacity exit 7, quota 9, invalid parameter 10, IAM
    11). A fleet refused because its new instance profile has not propagated yet is launched again
    (the fleet replaced, everything else kept) every
    :data:`~gpuinfra.launch_errors.PROFILE_RETRY_WAIT_SECONDS` for at most
    :data:`~gpuinfra.launch_errors.PROFILE_RETRY_SECONDS`.

    Before Pulumi creates the nodes of a stack not deployed yet, the quota and availability
    preflight runs (:func:`gpuinfra.preflight.run_preflight`): a shortfall refuses with
    nothing created. ``up --fallback`` runs it itself for each rung (a rung it refuses is
    skipped, not failed: :func:`gpuinfra.services.ladder.form_first_rung`) and passes
    ``preflight=False``.

    Args:
        backend: the Automation API boundary.
        project_dir: the Pulumi project folder.
        spec: the stack's spec (``stack``, ``expires_at``).
        on_event: engine event callback (progress).
        replace_nodes: allow an update that replaces the running nodes.
        now: the current time (UTC; tests).
        notes: receives the preflight's note lines and each relaunch (default: dropped).
        sleep: waits between relaunches (tests).
        preflight: run the preflight (False: the caller ran it for this stack).
        capacity_timeout_seconds: ``up --capacity-timeout`` (None:
            :data:`~gpuinfra.plan.formation.DEFAULT_CAPACITY_TIMEOUT_SECONDS`): how long the
            creation of a GCP bulk-insert formation waits for every node before it deletes what it
            made and fails with capacity (written into the stack file, where the program reads it:
            :func:`record_capacity_timeout`); and how long a flex-start stack whose nodes this
            ``up`` creates waits for its resize request
            (:func:`gpuinfra.services.flex_start.wait_for_resize_request`: cancelled when not
            fulfilled, then handled as a capacity failure: the new stack is destroyed, exit 7).
        wait_flex_start: that wait (tests; default :func:`gpuinfra.services.flex_start.wait_for_resize_request`).

    Returns:
        The change summary of the ``up``.

    Raises:
        SpecError: less than :data:`MIN_TTL_LEFT` of the TTL is left, or the stack file has no
            ``name_suffix`` (:meth:`ClusterSpec.check_name_suffix`) (exit 2).
        RequestError: the update would replace running nodes and ``replace_nodes`` is False, or a
            GCP stack deployed with its nodes in its MIG would gain a bulk insert's (exit 2).
        CapacityError: not all nodes launched for lack of capacity (exit 7).
        QuotaError: the preflight found a shortfall, or EC2 refused the launch for a quota (exit 9).
        NotOfferedError: the preflight found the type / accelerator not offered in the zone (exit 4).
        LaunchRejectedError, LaunchDeniedError: EC2 refused the launch's parameters (exit 10) or
            permissions (exit 11; also a profile still not usable after the retries).
        OperationError: any other failure, or the clean-up failed too (then says to run ``down``).
    """
    notes = notes or (lambda _line: None)
    stack = spec.stack
    if capacity_timeout_seconds is not None:
        check_capacity_timeout(capacity_timeout_seconds)  # bad input: refused before anything runs
    spec.check_name_suffix()  # an old stack file would share its cloud names with any stack of its name
    now = now or datetime.now(UTC)
    if spec.expires_at - now < MIN_TTL_LEFT:
        raise SpecError(
            f"stack {stack!r} ends at {spec.expires_at:%Y-%m-%d %H:%M} UTC (its TTL counts from when it was written), "
            f"less than {int(MIN_TTL_LEFT.total_seconds() // 60)} min from now: raise gpuinfra:cluster.profile.ttl_hours "
            f"in the stack file, or write it again with `gpuinfra new ... --name {stack} --force`"
        )
    status = next((s for s in backend.list_stacks(project_dir) if s.name == stack), None)
    deployed = bool(status and status.resource_count)
    replacing = backend.replacements(project_dir, stack) if deployed else []  # one preview
    nodes = [name for rtype, name in replacing if rtype in NODE_RESOURCE_TYPES]
    if deployed and _gains_bulk_nodes(backend, project_dir, spec):
        raise RequestError(
            f"stack {stack!r} was deployed with its nodes in its managed instance group; this gpuinfra forms "
            "them with one all-or-nothing bulk insert, and an `up` now would add that insert's nodes next to the "
            f"group's: run `gpuinfra down {stack}`, then `gpuinfra up {stack}`"
        )
    if any(rtype == RESIZE_REQUEST for rtype, _ in replacing):
        # a resize request cannot be updated, and its replacement's resizeBy adds every node again
        # to the kept group, which holds them already (blueprints/gcp/resize_request.py)
        raise RequestError(
            f"this update of flex-start stack {stack!r} would replace its resize request (node count or TTL "
            "changed): a new request adds all its nodes to the group next to the running ones; run "
            f"`gpuinfra down {stack}`, then `gpuinfra up {stack}`, or undo the change in the stack file"
        )
    if nodes and not replace_nodes:
        raise RequestError(
            f"this update of stack {stack!r} would replace its running nodes ({', '.join(nodes)}: the change "
            "reaches the fleet / group, which cannot be updated in place), ending any training on them; "
            f"run `gpuinfra up {stack} --replace-nodes` to do it, or undo the change in the stack file"
        )
    # an interrupted `up` may have created nodes Pulumi never recorded (a pending create): this
    # `up` creates them again, as a new deployment, and then ends the ones left behind
    orphaned = (
        [name for rtype, name in backend.pending_creates(project_dir, stack) if rtype in NODE_RESOURCE_TYPES]
        if deployed
        else []
    )
    replaced = spec.deployment_id if deployed else None
    if preflight and not deployed:  # nothing of it runs yet: all its nodes add to the quotas' usage
        for line in run_preflight(spec):
            notes(f"preflight: {line}")
    if not deployed or nodes or orphaned:  # the nodes are created: a new deployment
        record_deployment(project_dir, stack, new_deployment_id())
    if spec.cloud == "gcp":  # only the GCP program waits on a bulk insert
        record_capacity_timeout(project_dir, stack, capacity_timeout_seconds)
    try:
        changes = _up_retrying_profile(backend, project_dir, spec, on_event, notes, sleep)
        if spec.gcp_flex_start and (not deployed or nodes or orphaned):  # the resize request was (re)created
            timeout = DEFAULT_CAPACITY_TIMEOUT_SECONDS if capacity_timeout_seconds is None else capacity_timeout_seconds
            notes(f"flex-start: waiting up to {timeout:g} s for all {spec.nodes} nodes")
            # function-local: gpuinfra.services imports this module, so a module-level import is a package cycle
            from gpuinfra.services.flex_start import wait_for_resize_request

            (wait_flex_start or wait_for_resize_request)(spec, timeout)
    except LAUNCH_ERRORS as exc:
        kind = type(exc)
        if deployed:
            raise kind(
                f"{exc}. The stack's other resources are unchanged; run `gpuinfra up {stack}` to try "
                f"again, or `gpuinfra down {stack}` so nothing keeps billing"
            ) from None
        try:
            backend.destroy(project_dir, stack, on_event)
        except OperationError as cleanup:
            raise OperationError(
                f"{exc}; removing the half-created stack failed too ({cleanup}): run "
                f"`gpuinfra down {stack}` so nothing keeps billing"
            ) from None
        if GCP_LEFT_RUNNING_TEXT in str(exc):  # the VMs it names outlive the stack: `down` deletes them
            raise kind(
                f"{exc}. The stack's resources were destroyed again, but those VMs may still bill: run "
                f"`gpuinfra down {stack}` (it deletes VMs under the stack's bulk-insert names), then "
                f"`gpuinfra up {stack}` to try again"
            ) from None
        raise kind(
            f"{exc}. Everything `up` created was destroyed again, so nothing bills (its new bucket "
            f"is empty and kept); run `gpuinfra up {stack}` to try again"
        ) from None
    if (nodes or orphaned) and replaced:  # Pulumi deleted the replaced nodes: any left are an interrupted up's
        sweep_orphans(spec, replaced)
    return changes


def _gains_bulk_nodes(backend: Backend, project_dir: Path, spec: ClusterSpec) -> bool:
    """A deployed GCP stack of a bulk-insert formation whose outputs have no
    ``bulk_instance_names``: deployed by an earlier gpuinfra, its nodes are its MIG's (whose
    ``targetSize`` Pulumi now ignores), so an ``up`` would create the bulk insert's as well. A
    stack with no outputs at all is none of those: its first ``up`` never completed (interrupted,
    or failed before the program's end), so no MIG of it holds nodes and ``up`` may try again."""
    if spec.cloud != "gcp":
        return False
    from gpuinfra.plan.gcp import plan_gcp_cluster  # GCP stacks only

    if not plan_gcp_cluster(spec).bulk_insert:
        return False
    outputs = backend.outputs(project_dir, spec.stack)
    return bool(outputs) and "bulk_instance_names" not in outputs


def _up_retrying_profile(
    backend: Backend,
    project_dir: Path,
    spec: ClusterSpec,
    on_event: Callable[[object], None],
    notes: Callable[[str], None],
    sleep: Callable[[float], None],
) -> dict:
    """``backend.up``, relaunched while EC2 calls the stack's new instance profile invalid
    (:class:`InstanceProfileNotReady`): the fleet (which launched nothing) is replaced, everything
    else is kept, every :data:`PROFILE_RETRY_WAIT_SECONDS` for at most :data:`PROFILE_RETRY_SECONDS`
    (terraform-provider-aws retries RunInstances on the same error within the same 2 minutes:
    ``internal/service/ec2/ec2_instance.go``, ``iamPropagationTimeout`` in ``wait.go``).

    Raises:
        InstanceProfileNotReady: still refused when the time is up (exit 11).
    """
    waited = 0.0
    try:
        return backend.up(project_dir, spec.stack, on_event)
    except InstanceProfileNotReady as exc:
        last = exc
    while waited + PROFILE_RETRY_WAIT_SECONDS <= PROFILE_RETRY_SECONDS:
        notes(
            f"the new instance profile is not usable yet ({last}); launching the fleet again in "
            f"{PROFILE_RETRY_WAIT_SECONDS} s ({waited:g} of {PROFILE_RETRY_SECONDS} s waited)"
        )
        sleep(PROFILE_RETRY_WAIT_SECONDS)
        waited += PROFILE_RETRY_WAIT_SECONDS
        try:
            return backend.up(project_dir, spec.stack, on_event, replace_types=(FLEET_TYPE,))
        except InstanceProfileNotReady as exc:
            last = exc
    raise InstanceProfileNotReady(f"{last} (still refused after {PROFILE_RETRY_SECONDS} s of relaunches)")


def record_deployment(project_dir: Path, stack: str, deployment_id: str) -> None:
    """Write ``gpuinfra:cluster.deployment_id`` into the stack file (atomically), where the stack
    program reads it (:attr:`gpuinfra.spec.ClusterSpec.deployment_id`)."""
    path = stack_file_path(project_dir, stack)
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["deployment_id"] = deployment_id
    atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))


def check_capacity_timeout(seconds: int) -> int:
    """``--capacity-timeout``, within :data:`~gpuinfra.plan.formation.MIN_CAPACITY_TIMEOUT_SECONDS`
    .. :data:`~gpuinfra.plan.formation.MAX_CAPACITY_TIMEOUT_SECONDS`.

    Raises:
        RequestError: outside the bounds (exit 2).
    """
    if not MIN_CAPACITY_TIMEOUT_SECONDS <= seconds <= MAX_CAPACITY_TIMEOUT_SECONDS:
        raise RequestError(
            f"--capacity-timeout {seconds}: give {MIN_CAPACITY_TIMEOUT_SECONDS} to {MAX_CAPACITY_TIMEOUT_SECONDS} "
            "seconds (how long `up` waits for every node before it reports no capacity)"
        )
    return seconds


def record_capacity_timeout(project_dir: Path, stack: str, seconds: int | None) -> None:
    """Write ``gpuinfra:capacity_timeout_seconds`` (``seconds``, None: the default) into the stack
    file (atomically), where the GCP program reads it for its bulk insert; unchanged files are not
    rewritten.

    Raises:
        RequestError: ``seconds`` out of bounds (:func:`check_capacity_timeout`).
    """
    seconds = check_capacity_timeout(DEFAULT_CAPACITY_TIMEOUT_SECONDS if seconds is None else seconds)
    path = stack_file_path(project_dir, stack)
    doc = yaml.safe_load(path.read_text())
    key = f"gpuinfra:{CAPACITY_TIMEOUT_CONFIG_KEY}"
    if doc["config"].get(key) != seconds:
        doc["config"][key] = seconds
        atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))


#: Instance states that still bill or can (``shutting-down`` / ``terminated`` are on their way out).


def make_ec2_client(region: str):
    """The EC2 client :func:`sweep_orphans` uses (tests replace this function).

    Raises:
        MissingDependencyError: no AWS credentials.
    """
    return aws_session(" to look for instances of an interrupted `up`").client("ec2", region_name=region)


def sweep_orphans(spec: ClusterSpec, deployment_id: str | None = None) -> list[str]:
    """Terminate every live instance tagged with ``spec``'s stack and ``deployment_id`` (default:
    the spec's): after ``down`` (or an ``up`` that replaced that deployment's nodes) Pulumi has
    deleted the fleet it knew, so such instances belong to a fleet an interrupted ``up`` created
    without recording it (a pending CREATE: pulumi.com/docs/iac/troubleshooting/common-issues/
    interrupted-updates). Nothing outside this stack's own deployment is touched: a same-named
    stack of another checkout has another deployment id. GCP and stacks without a deployment id:
    nothing to do.

    Returns:
        The ids of the instances terminated.

    Raises:
        OperationError: EC2 refused the listing or the termination (the message says what to check).
        MissingDependencyError: no AWS credentials.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    deployment_id = deployment_id or spec.deployment_id
    if spec.cloud != "aws" or not deployment_id:
        return []
    filters = [
        {"Name": "tag:gpuinfra:stack", "Values": [spec.stack]},
        {"Name": f"tag:{AWS_DEPLOYMENT_TAG}", "Values": [deployment_id]},
        {"Name": "instance-state-name", "Values": list(teardown.AWS_LIVE_STATES)},
    ]
    ec2 = make_ec2_client(spec.region)
    try:
        ids = sorted(
            instance["InstanceId"]
            for page in ec2.get_paginator("describe_instances").paginate(Filters=filters)
            for reservation in page.get("Reservations", [])
            for instance in reservation.get("Instances", [])
        )
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
    except (BotoCoreError, ClientError) as exc:
        raise OperationError(
            f"could not look for or end instances of stack {spec.stack!r} deployment {deployment_id} left by an "
            f"interrupted `up` ({exc}); check with `aws ec2 describe-instances --region {spec.region} --filters "
            f"Name=tag:{AWS_DEPLOYMENT_TAG},Values={deployment_id}` and terminate what runs"
        ) from None
    return ids


def check_credentials(cloud: str) -> None:
    """Fail early, with the fix, when no cloud credentials are configured.

    Raises:
        MissingDependencyError: none found.
    """
    if cloud == "aws":
        aws_session()
    else:
        check_gcp_credentials_configured()


def destroy_cluster(
    backend: Backend,
    project_dir: Path,
    spec: ClusterSpec,
    on_event: Callable[[object], None],
    say: Callable[[str], None],
    *,
    delete_data: bool = False,
    confirm: Callable[[str], bool] = lambda question: False,
    sync_timeout_seconds: float = SYNC_REQUEST_WAIT_SECONDS,
    request_kind: str = "down",
    clients: teardown.CloudClients | None = None,
) -> dict:
    """``down`` / ``reap`` of a cluster stack: ask the running nodes to sync and wait for their
    acks (bounded; skipped with ``delete_data``), end the nodes and wait until the cloud reports
    them terminated (bounded), ``pulumi destroy`` (refreshing first, so what the TTL backstop or
    the nodes themselves already deleted drops out of the state instead of failing its delete),
    then, with ``delete_data``, delete every bucket of the stack through the cloud SDK.

    Data is never deleted through a ``pulumi up``: the stack file is not changed, nothing is
    deployed, and a failure leaves no flag behind; the bucket is deleted only after the destroy
    succeeded (a failed destroy keeps the data), and a stack whose resources a plain ``down``
    already destroyed still has its kept bucket(s) found by tag / label and deleted. Why the
    cloud SDK: the bucket is ``retain_on_delete``, and Pulumi deletes a retained resource only
    after "Set ``retainOnDelete: false`` and then run ``pulumi up``" -- a deploy of the whole
    program -- while a retained resource that a destroy already dropped "will be removed from
    the Pulumi state", so Pulumi cannot delete it at all; for that case the docs say to "use
    your provider's manual interface to find and delete the resource"
    (pulumi.com/docs/iac/concepts/resources/options/retainondelete/).

    Args:
        say: prints one line of progress.
        delete_data: delete the stack's buckets too.
        confirm: asked ``question`` when the buckets hold objects; False refuses.
        sync_timeout_seconds: bound of the wait for the acks (0: no sync request).
        request_kind: first word of the sync request id (``down`` / ``reap``).
        clients: cloud clients (default :func:`gpuinfra.teardown.make_clients`).

    Returns:
        The destroy's change summary ({} when the stack had no resources).

    Raises:
        RequestError: non-empty buckets and ``confirm`` said no (nothing done; exit 2).
        OperationError: the destroy or a bucket deletion failed (exit 7).
        MissingDependencyError: ``delete_data`` without the cloud's client libraries or credentials.
    """
    stack = spec.stack
    status = next((s for s in backend.list_stacks(project_dir) if s.name == stack), None)
    deployed = status is not None and (status.resource_count is None or status.resource_count > 0)
    outputs = backend.outputs(project_dir, stack) if deployed else {}
    spec = teardown.with_gcp_project(spec, outputs)
    if spec.cloud == "gcp" and not spec.gcp_project and stack_file_path(project_dir, stack).exists():
        # no outputs to read it from (a first `up` destroyed or interrupted): the project the
        # program itself falls back to, the stack's `gcp:project` (blueprints/gcp/cluster.py project_id)
        configured = read_stack_config(project_dir, stack).get("gcp:project")
        spec = spec.model_copy(update={"gcp_project": str(configured)}) if configured else spec
    if clients is None:
        try:
            clients = teardown.make_clients(spec)
        except MissingDependencyError as exc:
            if delete_data:
                raise
            say(f"sync: skipped ({exc})")
    buckets: list[str] = []
    if delete_data:
        assert clients is not None  # make_clients raised otherwise
        buckets = teardown.stack_buckets(spec, outputs, clients)
        counts = {b: teardown.count_objects(spec, clients, b) for b in buckets}
        total = sum(counts.values())
        names = ", ".join(buckets) or "none found"
        if total and not confirm(f"bucket(s) {names} hold {total} object version(s); delete them all?"):
            raise RequestError(
                f"bucket(s) {names} are not empty ({total} object versions); nothing was destroyed. "
                "Pass --yes to delete the data with the cluster, or drop --delete-data to keep it"
            )
        say(
            f"down {stack}: destroying the cluster, then deleting bucket(s) {names} with {total} object version(s)"
            if buckets
            else f"down {stack}: no bucket of the stack found (already deleted?); destroying the cluster"
        )
    changes: dict = {}
    orphan_error: OperationError | None = None
    if deployed:
        nodes_gone = clients is not None and _before_destroy(
            spec, outputs, clients, say, delete_data, sync_timeout_seconds, request_kind
        )
        # after the sync and the known nodes' end: instances an interrupted `up` of this
        # deployment left (their fleet is not in the state) would hold the placement group too
        try:
            orphans = sweep_orphans(spec)
        except OperationError as exc:  # reported after the destroy, which must run all the same
            orphans, orphan_error = [], exc
        if orphans:
            say(
                f"ended {len(orphans)} instance(s) of deployment {spec.deployment_id} that Pulumi did not know "
                f"(left by an interrupted `up`): {', '.join(orphans)}"
            )
            if clients is not None:
                try:
                    teardown.end_nodes_and_wait(spec, {"instance_ids": orphans}, clients)
                except OperationError as exc:
                    say(f"waiting for those instances to end failed ({exc}); destroying anyway")
        try:
            changes = backend.destroy(project_dir, stack, on_event)
        except OperationError as exc:
            if not (spec.cloud == "aws" and FLEET_DELETE_ERROR in str(exc) and nodes_gone):
                raise
            # EC2 refused to delete a fleet whose nodes are all terminated: the TTL backstop
            # deleted it already (an instant fleet's state can lag: the refresh still saw it)
            removed = backend.forget(project_dir, stack, FLEET_TYPE)
            say(
                f"the fleet was already deleted ({exc}) and its nodes are terminated: dropped "
                f"{', '.join(u.rsplit('::', 1)[-1] for u in removed)} from the Pulumi state; destroying the rest"
            )
            changes = backend.destroy(project_dir, stack, on_event)
    else:
        say(f"stack {stack!r} has no deployed resources: nothing to destroy")
    if clients is not None and clients.instances is not None and spec.cloud == "gcp" and spec.gcp_project:
        try:  # VMs under the stack's fixed bulk-insert names that an interrupted `up` left
            leftovers = teardown.delete_gcp_bulk_leftovers(spec, clients)
        except OperationError as exc:
            orphan_error = orphan_error or exc
            leftovers = []
        if leftovers:
            say(
                f"deleting {len(leftovers)} VM(s) an interrupted `up` left, which Pulumi did not know: {', '.join(leftovers)}"
            )
    if orphan_error is not None:
        raise orphan_error
    for bucket in buckets:
        assert clients is not None  # make_clients raised otherwise
        deleted = teardown.delete_bucket(spec, clients, bucket)
        say(f"deleted bucket {bucket} and its {deleted} object version(s)")
    return changes


def _before_destroy(spec, outputs, clients, say, delete_data, sync_timeout_seconds, request_kind) -> bool:
    """The sync request and the wait for termination; a cloud error is reported and the destroy
    goes on (it ends the nodes all the same, and leaving them running costs money). True when
    the stack's nodes are known (AWS ``instance_ids``) and EC2 reports every one terminated."""
    if delete_data:
        say("sync: skipped (--delete-data deletes the bucket)")
    else:
        try:
            report = teardown.sync_nodes(
                spec,
                outputs,
                clients,
                teardown.new_request_id(request_kind),
                sync_timeout_seconds,
            )
            for line in report.lines():
                say(line)
        except OperationError as exc:
            say(f"sync: not asked ({exc}); destroying anyway")
    try:
        left = teardown.end_nodes_and_wait(spec, outputs, clients)
    except OperationError as exc:
        say(f"ending the nodes before the destroy failed ({exc}); the destroy ends them")
        return False
    if left:
        say(
            f"still not terminated after {teardown.TERMINATION_WAIT_SECONDS} s: "
            + ", ".join(f"{n.name} ({n.state})" for n in left)
            + "; if the destroy fails on the placement group, run the command again"
        )
    return spec.cloud == "aws" and bool(outputs.get("instance_ids")) and not left


def stack_names(project_dir: Path) -> list[str]:
    """Stacks that have a stack file in ``<project_dir>/stacks``."""
    folder = Path(project_dir) / STACKS_DIRNAME
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in folder.glob("Pulumi.*.yaml"))


@dataclass
class StackRow:
    """One line of ``gpuinfra ls``."""

    spec: ClusterSpec
    status: StackStatus | None
    now: datetime
    #: The catalog to price from (default: the one in use).
    catalog: Catalog | None = None

    @property
    def price_per_hour_usd(self) -> Decimal | None:
        """Cluster compute $/h from the catalog for the stack's instance type, zone, market and
        nodes (:meth:`gpuinfra.catalog.store.Catalog.node_hour_price_usd`; never the price recorded in
        the stack file, which anyone may edit); None when the catalog has no price."""
        per_node = (self.catalog or load_catalog()).node_hour_price_usd(self.spec)
        return None if per_node is None else per_node * self.spec.nodes

    @property
    def deployed(self) -> bool | None:
        """True/False from the backend; None when unknown (no Pulumi CLI)."""
        if self.status is None:
            return None
        return (self.status.resource_count or 0) > 0

    @property
    def cost_so_far_usd(self) -> Decimal | None:
        """$/h x hours since the last update, for deployed stacks (None when not deployed or
        the catalog has no price)."""
        hourly = self.price_per_hour_usd
        if not self.deployed or self.status is None or self.status.last_update is None or hourly is None:
            return None
        hours = Decimal(str(max(0.0, (self.now - self.status.last_update).total_seconds() / 3600)))
        return hourly * hours

    def price_text(self) -> str:
        """``$/h`` for people: the amount, or "incomplete: 1 line without a price"."""
        return Total.of([self.price_per_hour_usd]).text()

    def cost_so_far_text(self) -> str:
        """``so far`` for people: ``-`` when not deployed (or unknown since when), the amount,
        or "incomplete: 1 line without a price" when the catalog has no price."""
        if not self.deployed or self.status is None or self.status.last_update is None:
            return "-"
        return Total.of([self.cost_so_far_usd]).text()

    @property
    def catalog_date(self) -> str:
        """Date of the catalog the row is priced from."""
        return (self.catalog or load_catalog()).date_for(self.spec.cloud)

    @property
    def expired(self) -> bool:
        """TTL passed."""
        return self.now >= self.spec.expires_at

    def to_json(self) -> dict[str, Any]:
        """The ``gpuinfra ls --json`` row (keys :data:`LS_ROW_KEYS` plus ``stack`` and
        ``invalid``: null; USD as :func:`gpuinfra.money.usd_json` strings). The USD figures are
        compute only, as their keys say: the nodes' instance-hours priced from the catalog
        (``gpuinfra cost`` prices every line from the stack's preview, too slow for a listing)."""
        spec = self.spec
        return {
            "stack": spec.stack,
            "cloud": spec.cloud,
            "gpus": f"{spec.gpu_count}x{spec.gpu}",
            "nodes": spec.nodes,
            "instance_type": spec.instance_type,
            "zone": spec.zone,
            "created_at": spec.created_at.isoformat(),
            "age_hours": round((self.now - spec.created_at).total_seconds() / 3600, 2),
            "expires_at": spec.expires_at.isoformat(),
            "expired": self.expired,
            "deployed": self.deployed,
            "compute_price_per_hour_usd": usd_json(self.price_per_hour_usd),
            "compute_cost_so_far_usd": usd_json(self.cost_so_far_usd),
            "catalog_date": self.catalog_date,
            "invalid": None,
        }


#: Keys of an ``ls --json`` row besides ``stack`` and ``invalid`` (null for an invalid stack).
LS_ROW_KEYS = (
    "cloud",
    "gpus",
    "nodes",
    "instance_type",
    "zone",
    "created_at",
    "age_hours",
    "expires_at",
    "expired",
    "deployed",
    "compute_price_per_hour_usd",
    "compute_cost_so_far_usd",
    "catalog_date",
)


@dataclass(frozen=True)
class InvalidStack:
    """A stack file ``ls`` / ``reap`` cannot read.

    Attributes:
        name: the stack name from the file name.
        reason: why, one line (the :class:`~gpuinfra.errors.SpecError` message).
    """

    name: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        """The ``gpuinfra ls --json`` row of an unreadable stack: every :data:`LS_ROW_KEYS` null."""
        return {"stack": self.name, **dict.fromkeys(LS_ROW_KEYS), "invalid": self.reason}


@dataclass
class StackListing:
    """The stacks of a project: rows of the readable ones, and the invalid ones."""

    rows: list[StackRow]
    invalid: list[InvalidStack]

    @property
    def expired_deployed(self) -> list[StackRow]:
        """Rows ``reap --expired`` destroys: TTL passed and deployed."""
        return [r for r in self.rows if r.expired and r.deployed]


def list_stacks(project_dir: Path, backend: Backend | None, now: datetime | None = None) -> StackListing:
    """Every cluster stack file of the project, joined with the backend's view when available; a
    file that cannot be read is listed as invalid with the reason. Bake stacks (``gpuinfra image
    ls`` lists them) and purchase stacks (``gpuinfra plan --buy``) are left out: they have no nodes,
    TTL or price per hour."""
    now = now or datetime.now(UTC)
    statuses = {s.name: s for s in backend.list_stacks(project_dir)} if backend is not None else {}
    listing = StackListing([], [])
    catalog = load_catalog()
    bakes = {b.stack for b in list_bakes(project_dir)}
    bakes |= purchase_stacks(project_dir)  # `gpuinfra plan --buy` purchases: no nodes, no TTL
    for name in stack_names(project_dir):
        if name in bakes:
            continue
        try:
            spec = read_stack_spec(project_dir, name)
        except SpecError as exc:
            listing.invalid.append(InvalidStack(name, str(exc).replace("\n", "; ")))
            continue
        status = statuses.get(name, StackStatus(name, False, None, 0)) if backend is not None else None
        listing.rows.append(StackRow(spec, status, now, catalog))
    return listing


@dataclass(frozen=True)
class ReapResult:
    """What ``reap`` did with one expired stack: destroyed (``error`` None) or not, and why."""

    stack: str
    error: str | None = None


def reap_expired(
    project_dir: Path,
    backend: Backend,
    rows: Iterable[StackRow],
    on_event: Callable[[object], None],
    on_start: Callable[[StackRow], None] = lambda row: None,
    say: Callable[[str], None] = lambda line: None,
    sync_timeout_seconds: float = SYNC_REQUEST_WAIT_SECONDS,
) -> list[ReapResult]:
    """Destroy (keeping data; :func:`destroy_cluster`: sync request first, then the instances an
    interrupted ``up`` left) each stack of ``rows``;
    a failure is recorded and the next stack is destroyed all the same (a stack left running
    costs money every hour).

    Args:
        on_event: the Automation API event printer.
        on_start: called before each stack is destroyed (progress).
        say: prints a line of progress (sync acks, termination).
        sync_timeout_seconds: bound of each stack's wait for its nodes' sync acks (0: no request).
    """
    results = []
    for row in rows:
        on_start(row)
        try:
            check_credentials(row.spec.cloud)
            destroy_cluster(
                backend,
                Path(project_dir),
                row.spec,
                on_event,
                say,
                sync_timeout_seconds=sync_timeout_seconds,
                request_kind="reap",
            )
        except GpuinfraError as exc:
            results.append(ReapResult(row.spec.stack, str(exc).replace("\n", "; ")))
        except Exception as exc:  # noqa: BLE001 -- a bug in one destroy must not keep the others running
            results.append(ReapResult(row.spec.stack, f"internal error: {type(exc).__name__}: {exc}"))
        else:
            results.append(ReapResult(row.spec.stack))
    return results


def reap_error(results: list[ReapResult], invalid: list[InvalidStack]) -> GpuinfraError | None:
    """The one error ``reap`` ends with, or None when every expired stack was destroyed and
    every stack file could be read.

    Returns:
        :class:`OperationError` (exit 7) when a destroy failed, naming each failed stack and
        reason (and the unreadable files); else :class:`SpecError` (exit 2) naming the stack
        files whose expiry could not be read; else None.
    """
    failed = [r for r in results if r.error]
    unread = "; ".join(f"{i.name} ({i.reason})" for i in invalid)
    unread = f"{len(invalid)} stack file(s) could not be read, so their expiry is unknown: {unread}" if invalid else ""
    if failed:
        detail = "; ".join(f"{r.stack} ({r.error})" for r in failed)
        return OperationError(
            "; ".join(
                filter(None, [f"{len(failed)} of {len(results)} expired stacks were not destroyed: {detail}", unread])
            )
        )
    return SpecError(unread) if invalid else None


def make_backend() -> Backend:
    """The real backend (tests replace this function).

    Raises:
        MissingDependencyError: no Pulumi CLI.
    """
    return PulumiAutomation()
