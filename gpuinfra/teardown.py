"""What ``gpuinfra down`` / ``reap`` do around ``pulumi destroy`` of a cluster stack, with the
cloud SDKs: ask the running nodes to sync their checkpoints and wait for their acks; on AWS,
end the nodes and wait until EC2 reports them terminated; delete the stack's bucket for
``down --delete-data``.

Facts and sources:

* Sync request (the node side reads it, :mod:`gpuinfra.agent.constants`): AWS, the instance tag
  :data:`~gpuinfra.agent.constants.SYNC_REQUEST_TAG` set with EC2 ``CreateTags``, readable on the
  node from IMDS once instance metadata tags are enabled (docs.aws.amazon.com/AWSEC2/latest/
  UserGuide/work-with-tags-in-IMDS.html); GCP, the instance metadata attribute
  :data:`~gpuinfra.agent.constants.SYNC_REQUEST_ATTRIBUTE` set with ``instances.setMetadata``,
  which needs the metadata's current ``fingerprint`` (a stale one fails with 412
  conditionNotMet: cloud.google.com/compute/docs/reference/rest/v1/instances/setMetadata).
  Each node answers with the ack object :func:`~gpuinfra.agent.constants.sync_ack_key`.
* Which nodes: the stack's own fleet (the ``instance_ids`` output) or its own MIG
  (``instanceGroupManagers.listManagedInstances`` of the group named
  :func:`gpuinfra.plan.boot_gcp.node_prefix`), never a tag search across the region.
* AWS termination: deleting an instant fleet terminates its instances, but terraform-provider-aws
  does not wait for it ("Limiting waiter to non-instant fleet types": ``internal/service/ec2/
  ec2_fleet.go`` ``resourceFleetDelete``) and then deletes the placement group, which EC2
  refuses while instances are in it ("you must terminate all instances in the placement group":
  docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeletePlacementGroup.html), and the
  provider does not retry that. So the nodes are terminated first (``TerminateInstances``) and
  ``DescribeInstances`` is polled until each is ``terminated`` (instance states:
  docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html). The ids go in a
  ``instance-id`` filter, not ``InstanceIds``: EC2 drops a terminated instance after about an
  hour, and one unknown id in ``InstanceIds`` fails the whole call.
* GCP needs no wait: ``instanceGroupManagers.delete`` "Deletes the specified managed instance
  group and all of the instances in that group" (cloud.google.com/compute/docs/reference/rest/v1/
  instanceGroupManagers/delete) as one operation, and terraform-provider-google waits for that
  operation, and while the group still shrinks past the timeout, waits again
  (``resourceComputeInstanceGroupManagerDelete``), before the placement policy, template and
  network that the group depends on are deleted.
* Deleting data: S3 deletes a bucket only when "all objects (including all object versions and
  delete markers) in the bucket must be deleted" (docs.aws.amazon.com/AmazonS3/latest/API/
  API_DeleteBucket.html), so every version and delete marker is deleted first
  (``ListObjectVersions`` + ``DeleteObjects``, at most 1000 keys a call: API_DeleteObjects.html);
  GCS deletes a bucket only when it is empty, noncurrent versions included
  (cloud.google.com/storage/docs/deleting-buckets), so every generation is deleted first.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from gpuinfra.agent.constants import SYNC_REQUEST_ATTRIBUTE, SYNC_REQUEST_ID_PATTERN, SYNC_REQUEST_TAG, sync_ack_key
from gpuinfra.credentials import aws_session, cloud_storage, gcp_credentials
from gpuinfra.errors import MissingDependencyError, OperationError, RequestError
from gpuinfra.plan.boot_gcp import node_prefix
from gpuinfra.plan.naming import AWS_STACK_ID_TAG, GCP_STACK_ID_LABEL, dns_safe, gcp_bulk_name_pattern, stack_id
from gpuinfra.plan.replacement import REPLACES_TAG, replaces_lost_nodes
from gpuinfra.plan.tags import gcp_labels
from gpuinfra.spec import ClusterSpec

#: How long ``down`` waits for EC2 to report the ended nodes ``terminated`` before ``pulumi
#: destroy`` deletes their placement group and network (GPU instances take minutes to shut down).
TERMINATION_WAIT_SECONDS = 900
#: Seconds between two looks at the acks / instance states.
POLL_SECONDS = 10
#: EC2 instance states of a node that still runs (or may run again): what a sync request and the
#: termination go to. ``shutting-down`` and ``terminated`` are on their way out already.
AWS_LIVE_STATES = ("pending", "running", "stopping", "stopped")
#: At most this many keys per S3 ``DeleteObjects`` call.
S3_DELETE_BATCH = 1000


def wait_seconds(seconds: float) -> None:
    """Sleep between two looks (tests replace it with a fake clock)."""
    time.sleep(seconds)


def clock_seconds() -> float:
    """A monotonic clock in seconds (tests replace it)."""
    return time.monotonic()


@dataclass(frozen=True, order=True)
class Node:
    """One node of the stack: ``name`` is the instance id (AWS) or VM name (GCP), as the node
    names itself in its ack; ``state`` the cloud's word (EC2 state name, GCE instance status)."""

    name: str
    state: str

    @property
    def running(self) -> bool:
        """It can sync: EC2 ``running`` or GCE ``RUNNING``."""
        return self.state.lower() == "running"


@dataclass
class CloudClients:
    """The SDK clients teardown uses: ``ec2`` / ``s3`` (boto3) on AWS; ``groups``
    (``InstanceGroupManagersClient``), ``instances`` (``InstancesClient``) and ``storage``
    (``google.cloud.storage.Client``) on GCP. Unused ones stay None."""

    ec2: Any = None
    s3: Any = None
    groups: Any = None
    instances: Any = None
    storage: Any = None


def make_clients(spec: ClusterSpec) -> CloudClients:
    """Clients of the stack's cloud from the environment's credentials (tests replace this).

    Raises:
        MissingDependencyError: no credentials, or the GCP client libraries are missing (exit 6).
    """
    if spec.cloud == "aws":
        session = aws_session(" to end the stack's nodes")
        return CloudClients(
            ec2=session.client("ec2", region_name=spec.region), s3=session.client("s3", region_name=spec.region)
        )
    try:
        from google.cloud import compute_v1
    except ImportError:
        raise MissingDependencyError(
            "gpuinfra down on GCP needs google-cloud-compute: pip install 'gpuinfra[gcp-monitoring]'"
        ) from None
    credentials, _ = gcp_credentials(" to reach the stack's nodes")
    return CloudClients(
        groups=compute_v1.InstanceGroupManagersClient(credentials=credentials),
        instances=compute_v1.InstancesClient(credentials=credentials),
        storage=cloud_storage("reading the sync acks").Client(project=spec.gcp_project, credentials=credentials),
    )


def with_gcp_project(spec: ClusterSpec, outputs: dict) -> ClusterSpec:
    """``spec`` with ``gcp_project`` filled in from the ``instance_group`` output
    (``.../projects/<project>/zones/...``) when the stack file leaves it to ``gcp:project``."""
    if spec.cloud != "gcp" or spec.gcp_project:
        return spec
    found = re.search(r"/projects/([^/]+)/", str(outputs.get("instance_group") or ""))
    return spec.model_copy(update={"gcp_project": found.group(1)}) if found else spec


def new_request_id(kind: str, now_seconds: float | None = None) -> str:
    """``<kind>-<unix seconds>``, e.g. ``down-1764158400``.

    Raises:
        RequestError: it does not match :data:`SYNC_REQUEST_ID_PATTERN`.
    """
    request_id = f"{kind}-{int(time.time() if now_seconds is None else now_seconds)}"
    if not re.fullmatch(SYNC_REQUEST_ID_PATTERN, request_id):
        raise RequestError(f"sync request id {request_id!r} does not match {SYNC_REQUEST_ID_PATTERN}")
    return request_id


def _cloud_error(what: str, exc: Exception) -> OperationError:
    return OperationError(f"{what} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


# ------------------------------------------------------------------------------------- nodes
def list_nodes(spec: ClusterSpec, outputs: dict, clients: CloudClients) -> list[Node]:
    """The stack's nodes that EC2 / GCE still lists: AWS, the fleet's ``instance_ids`` output (an
    instance terminated over about an hour ago is gone) and, on a Spot stack, the replacements the
    stack's replacement function launched (tagged with this stack's id and
    :data:`~gpuinfra.plan.replacement.REPLACES_TAG`; they are not in the fleet, so deleting the
    fleet does not end them); GCP, the VMs of the stack's MIG (none when the group does not exist).

    Raises:
        OperationError: the cloud call failed (exit 7).
    """
    if spec.cloud == "aws":
        ids = [str(i) for i in outputs.get("instance_ids") or []]
        nodes = _aws_nodes(clients.ec2, _ids(ids)) if ids else []
        if replaces_lost_nodes(spec):
            nodes += _aws_nodes(
                clients.ec2,
                [
                    {"Name": f"tag:{AWS_STACK_ID_TAG}", "Values": [stack_id(spec)]},
                    {"Name": "tag-key", "Values": [REPLACES_TAG]},
                ],
            )
        return sorted(set(nodes))
    from google.api_core.exceptions import NotFound

    bulk = _gcp_bulk_nodes(spec, [str(n) for n in outputs.get("bulk_instance_names") or []], clients)
    try:
        managed = clients.groups.list_managed_instances(
            project=spec.gcp_project, zone=spec.zone, instance_group_manager=node_prefix(spec)
        )
        members = [
            Node(m.instance.rsplit("/", 1)[-1], m.instance_status or "PROVISIONING") for m in managed if m.instance
        ]
    except NotFound:
        members = []
    except Exception as exc:  # noqa: BLE001 -- any client error is one line with its cause
        raise _cloud_error(f"listing the VMs of MIG {node_prefix(spec)}", exc) from None
    return sorted(set(bulk + members))


def _gcp_bulk_nodes(spec: ClusterSpec, names: list[str], clients: CloudClients) -> list[Node]:
    """Those of the bulk-inserted ``names`` (the ``bulk_instance_names`` output) that still exist
    (``instances.get``; 404: gone), with their status.

    Raises:
        OperationError: another cloud error.
    """
    from google.api_core.exceptions import NotFound

    nodes = []
    for name in names:
        try:
            vm = clients.instances.get(project=spec.gcp_project, zone=spec.zone, instance=name)
        except NotFound:
            continue
        except Exception as exc:  # noqa: BLE001 -- any client error is one line with its cause
            raise _cloud_error(f"reading VM {name}", exc) from None
        nodes.append(Node(name, vm.status or "PROVISIONING"))
    return nodes


def delete_gcp_bulk_leftovers(spec: ClusterSpec, clients: CloudClients) -> list[str]:
    """After ``down``'s destroy of a GCP stack: delete every VM of the zone named like the stack's
    bulk insert (:func:`gpuinfra.plan.naming.gcp_bulk_name_pattern`: ``<group>-n`` and 3 digits,
    whatever node count the stack file says now: a count lowered after ``up`` or an edited file
    misses none; the stack's name suffix in the group name makes them its own). Pulumi deleted
    the ones it knew; these are an interrupted ``up``'s, whose create never reached the state.
    One ``instances.list`` with ``filter`` ``name eq "<pattern>"`` finds them ("The literal value
    is interpreted as a regular expression using Google RE2 library syntax. The literal value
    must match the entire field": cloud.google.com/compute/docs/reference/rest/v1/instances/list),
    pages followed by the client. Returns the names deleted (the deletes are started,
    ``instances.delete``; 404: gone).

    Raises:
        OperationError: a cloud call failed.
    """
    if spec.cloud != "gcp":
        return []
    from google.api_core.exceptions import NotFound
    from google.cloud import compute_v1

    pattern = gcp_bulk_name_pattern(node_prefix(spec))
    try:
        request = compute_v1.ListInstancesRequest(
            project=spec.gcp_project, zone=spec.zone, filter=f'name eq "{pattern}"'
        )
        listed = clients.instances.list(request=request)
        # the server applies the filter; the names are checked again here (money: never delete a
        # VM that is not the stack's)
        left = sorted(vm.name for vm in listed if re.fullmatch(pattern, vm.name))
    except Exception as exc:  # noqa: BLE001 -- any client error is one line with its cause
        raise _cloud_error("listing the stack's bulk-insert VMs", exc) from None
    deleted = []
    for name in left:
        try:
            clients.instances.delete(project=spec.gcp_project, zone=spec.zone, instance=name)
        except NotFound:
            continue
        except Exception as exc:  # noqa: BLE001 -- any client error is one line with its cause
            raise _cloud_error(f"deleting VM {name}", exc) from None
        deleted.append(name)
    return deleted


def _aws_nodes(ec2, filters: list[dict]) -> list[Node]:
    try:
        pages = ec2.get_paginator("describe_instances").paginate(Filters=filters)
        return sorted(
            Node(i["InstanceId"], i["State"]["Name"])
            for page in pages
            for reservation in page["Reservations"]
            for i in reservation["Instances"]
        )
    except Exception as exc:  # noqa: BLE001 -- any client error is one line with its cause
        raise _cloud_error("describing the stack's instances", exc) from None


# ------------------------------------------------------------------------------ sync request
@dataclass
class SyncReport:
    """What became of a sync request: ``acks`` node -> the ack object; ``failed`` node -> why
    the request could not be set; ``waited_seconds``; ``skipped``: why nothing was asked."""

    request_id: str
    nodes: list[str] = field(default_factory=list)
    acks: dict[str, dict] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    waited_seconds: float = 0.0
    skipped: str | None = None

    def lines(self) -> list[str]:
        """One line per node: synced (files, complete or not), request failed, or no ack."""
        if self.skipped:
            return [f"sync: {self.skipped}"]
        out = []
        for node in self.nodes:
            ack = self.acks.get(node)
            if node in self.failed:
                out.append(f"sync {node}: the request could not be set ({self.failed[node]})")
            elif ack is None:
                out.append(f"sync {node}: no ack within {self.waited_seconds:.0f} s; unsynced checkpoints are lost")
            else:
                files = ack.get("uploaded_files")
                state = "complete" if ack.get("complete") is True else "INCOMPLETE"
                out.append(f"sync {node}: {state}, {files} file(s) uploaded, finished {ack.get('finished_at')}")
        return out


def request_sync(spec: ClusterSpec, clients: CloudClients, nodes: list[str], request_id: str) -> dict[str, str]:
    """Set the sync request on ``nodes``; returns node -> error for those where it failed."""
    if not nodes:
        return {}
    if spec.cloud == "aws":
        try:
            clients.ec2.create_tags(Resources=nodes, Tags=[{"Key": SYNC_REQUEST_TAG, "Value": request_id}])
            return {}
        except Exception as exc:  # noqa: BLE001 -- reported per node, the destroy goes on
            return dict.fromkeys(nodes, str(_cloud_error("CreateTags", exc)))
    failed = {}
    for name in nodes:
        try:
            _set_gcp_attribute(spec, clients.instances, name, request_id)
        except Exception as exc:  # noqa: BLE001 -- reported per node, the destroy goes on
            failed[name] = str(_cloud_error("setMetadata", exc))
    return failed


def _set_gcp_attribute(spec: ClusterSpec, instances, name: str, request_id: str, attempts: int = 2) -> None:
    """``instances.setMetadata`` with the current fingerprint; a 412 (someone else changed the
    metadata in between) reads it again, ``attempts`` times in all."""
    from google.api_core.exceptions import PreconditionFailed
    from google.cloud import compute_v1

    for attempt in range(attempts):
        metadata = instances.get(project=spec.gcp_project, zone=spec.zone, instance=name).metadata
        items = [item for item in metadata.items if item.key != SYNC_REQUEST_ATTRIBUTE]
        items.append(compute_v1.Items(key=SYNC_REQUEST_ATTRIBUTE, value=request_id))
        try:
            instances.set_metadata(
                project=spec.gcp_project,
                zone=spec.zone,
                instance=name,
                metadata_resource=compute_v1.Metadata(fingerprint=metadata.fingerprint, items=items),
            ).result(timeout=120)
            return
        except PreconditionFailed:
            if attempt == attempts - 1:
                raise


def read_acks(spec: ClusterSpec, clients: CloudClients, bucket: str, request_id: str) -> dict[str, dict]:
    """node -> ack object of every ack of ``request_id`` in the bucket (an unreadable one is
    ``{"unreadable": reason}``).

    Raises:
        OperationError: the listing failed.
    """
    prefix = sync_ack_key(spec.stack, request_id, "").removesuffix(".json")
    found: dict[str, dict] = {}
    try:
        if spec.cloud == "aws":
            pages = clients.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
            bodies = {k: (lambda k=k: clients.s3.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in keys}
        else:
            blobs = list(clients.storage.list_blobs(bucket, prefix=prefix))
            bodies = {b.name: b.download_as_bytes for b in blobs}
    except Exception as exc:  # noqa: BLE001 -- one line with its cause
        raise _cloud_error(f"listing the sync acks in {bucket}", exc) from None
    for key, body in bodies.items():
        node = key[len(prefix) :].removesuffix(".json")
        try:
            ack = json.loads(body())
            found[node] = ack if isinstance(ack, dict) else {"unreadable": "not a JSON object"}
        except Exception as exc:  # noqa: BLE001 -- an unreadable ack counts as an answer, with why
            found[node] = {"unreadable": f"{type(exc).__name__}: {exc}"}
    return found


def sync_nodes(
    spec: ClusterSpec,
    outputs: dict,
    clients: CloudClients,
    request_id: str,
    timeout_seconds: float,
) -> SyncReport:
    """Ask every running node of the stack to sync, then wait until each has acked or
    ``timeout_seconds`` pass. Never raises for a node that does not answer: the caller destroys
    anyway and prints :meth:`SyncReport.lines`.

    Raises:
        OperationError: the nodes or the acks cannot be listed.
    """
    report = SyncReport(request_id)
    bucket = outputs.get("bucket_name")
    if timeout_seconds <= 0:
        report.skipped = "skipped (--sync-timeout-seconds 0)"
        return report
    if not bucket:
        report.skipped = "the stack has no bucket output: nothing to sync to"
        return report
    report.nodes = [n.name for n in list_nodes(spec, outputs, clients) if n.running]
    if not report.nodes:
        report.skipped = "no running nodes: nothing to sync"
        return report
    report.failed = request_sync(spec, clients, report.nodes, request_id)
    waiting = set(report.nodes) - set(report.failed)
    start = clock_seconds()
    while True:
        acks = read_acks(spec, clients, bucket, request_id) if waiting else {}
        report.acks.update({n: a for n, a in acks.items() if n in waiting})
        waiting -= set(acks)
        report.waited_seconds = clock_seconds() - start
        if not waiting or report.waited_seconds >= timeout_seconds:
            return report
        wait_seconds(min(POLL_SECONDS, max(0.0, timeout_seconds - report.waited_seconds)))


# ------------------------------------------------------------------------------ termination
def end_nodes_and_wait(
    spec: ClusterSpec,
    outputs: dict,
    clients: CloudClients,
    timeout_seconds: float = TERMINATION_WAIT_SECONDS,
) -> list[Node]:
    """AWS: terminate the stack's live nodes and wait, at most ``timeout_seconds``, until EC2
    reports every one ``terminated``; returns the nodes that are not (empty: all gone). GCP:
    nothing to do (the MIG's delete waits for its VMs), returns [].

    Raises:
        OperationError: a cloud call failed.
    """
    if spec.cloud != "aws":
        return []
    nodes = list_nodes(spec, outputs, clients)
    live = [n.name for n in nodes if n.state in AWS_LIVE_STATES]
    if live:
        try:
            clients.ec2.terminate_instances(InstanceIds=live)
        except Exception as exc:  # noqa: BLE001 -- one line with its cause
            raise _cloud_error(f"terminating {', '.join(live)}", exc) from None
        nodes = _aws_nodes(clients.ec2, _ids(n.name for n in nodes))
    start = clock_seconds()
    while True:
        left = [n for n in nodes if n.state != "terminated"]
        if not left or clock_seconds() - start >= timeout_seconds:
            return left
        wait_seconds(POLL_SECONDS)
        nodes = _aws_nodes(clients.ec2, _ids(n.name for n in left))


def _ids(names) -> list[dict]:
    """The ``DescribeInstances`` filter selecting these instance ids."""
    return [{"Name": "instance-id", "Values": list(names)}]


# ------------------------------------------------------------------------------------- data
def aws_bucket_prefix(stack: str) -> str:
    """The name prefix of the stack's S3 buckets (``bucket_prefix`` of blueprints/aws/storage.py)."""
    return f"gpuinfra-{dns_safe(stack, 27)}-"


def stack_buckets(spec: ClusterSpec, outputs: dict, clients: CloudClients) -> list[str]:
    """Every bucket of the stack: the ``bucket_name`` output and, since a plain ``down`` keeps the
    bucket but drops it from the state (``retain_on_delete``) and each later ``up`` makes a new
    one, every bucket carrying the stack's tag (AWS, with the stack's name prefix) or label (GCP,
    in the stack's project): its own id (``gpuinfra:stack-id`` / ``gpuinfra-stack-id``,
    :func:`gpuinfra.plan.naming.stack_id`), so the buckets of a same-named stack from another
    folder are never deleted; a stack file without ``name_suffix`` (written before it existed)
    matches ``gpuinfra:stack`` / ``gpuinfra-stack`` as before.

    Raises:
        OperationError: the listing failed.
    """
    found = {outputs["bucket_name"]} if outputs.get("bucket_name") else set()
    tag, key = (AWS_STACK_ID_TAG, GCP_STACK_ID_LABEL) if spec.name_suffix else ("gpuinfra:stack", "gpuinfra-stack")
    try:
        if spec.cloud == "aws":
            for bucket in clients.s3.list_buckets().get("Buckets", []):
                name = bucket["Name"]
                if name.startswith(aws_bucket_prefix(spec.stack)) and _s3_tag(clients.s3, name, tag) == stack_id(spec):
                    found.add(name)
        else:
            label = gcp_labels(spec)[key]
            for bucket in clients.storage.list_buckets(project=spec.gcp_project):
                if (bucket.labels or {}).get(key) == label:
                    found.add(bucket.name)
    except Exception as exc:  # noqa: BLE001 -- one line with its cause
        raise _cloud_error("listing the stack's buckets", exc) from None
    return sorted(found)


def _s3_tag(s3, bucket: str, key: str) -> str | None:
    from botocore.exceptions import ClientError

    try:
        tags = s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
    except ClientError:  # NoSuchTagSet, or a bucket of someone else
        return None
    return next((t["Value"] for t in tags if t["Key"] == key), None)


def count_objects(spec: ClusterSpec, clients: CloudClients, bucket: str) -> int:
    """Objects in ``bucket``, every version counted (what deleting it deletes)."""
    try:
        if spec.cloud == "aws":
            pages = clients.s3.get_paginator("list_object_versions").paginate(Bucket=bucket)
            return sum(len(p.get("Versions", [])) + len(p.get("DeleteMarkers", [])) for p in pages)
        return sum(1 for _ in clients.storage.list_blobs(bucket, versions=True))
    except Exception as exc:  # noqa: BLE001 -- one line with its cause
        raise _cloud_error(f"counting the objects of {bucket}", exc) from None


def delete_bucket(spec: ClusterSpec, clients: CloudClients, bucket: str) -> int:
    """Delete every object version of ``bucket``, then the bucket; returns the versions deleted.

    Raises:
        OperationError: a delete failed (what is deleted stays deleted; running it again goes on).
    """
    deleted = 0
    try:
        if spec.cloud == "aws":
            s3 = clients.s3
            for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
                keys = [
                    {"Key": v["Key"], "VersionId": v["VersionId"]}
                    for v in page.get("Versions", []) + page.get("DeleteMarkers", [])
                ]
                for i in range(0, len(keys), S3_DELETE_BATCH):
                    batch = keys[i : i + S3_DELETE_BATCH]
                    errors = s3.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True}).get("Errors")
                    if errors:
                        raise OperationError(f"{len(errors)} object(s) not deleted, e.g. {errors[0]}")
                    deleted += len(batch)
            s3.delete_bucket(Bucket=bucket)
        else:
            for blob in clients.storage.list_blobs(bucket, versions=True):
                blob.delete()
                deleted += 1
            clients.storage.bucket(bucket).delete()
    except OperationError as exc:
        raise OperationError(f"deleting bucket {bucket}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 -- one line with its cause
        raise _cloud_error(f"deleting bucket {bucket} ({deleted} object version(s) deleted so far)", exc) from None
    return deleted
