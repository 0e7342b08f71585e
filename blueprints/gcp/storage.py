"""GCS bucket (same region, uniform bucket-level access, public access prevention enforced,
scratch-prefix lifecycle, kept on destroy unless the stack says otherwise) and the node service
account with roles on that bucket only: read everything, write everything but the node bundle.

Sources: cluster-toolkit modules/file-system/cloud-storage-bucket/main.tf (location = region,
uniform_bucket_level_access, public_access_prevention); docs/sources/cluster-facts.md section 6 rule 11.
"""

from __future__ import annotations

import re

import pulumi
import pulumi_gcp as gcp

from gpuinfra.agent.job import gcp_secret_prefix
from gpuinfra.plan.naming import child, gcp_role_id, gcp_service_account_id, stack_id
from gpuinfra.plan.node_bundle import BUNDLE_PREFIX, NodeBundle
from gpuinfra.plan.tags import gcp_labels
from gpuinfra.spec import ClusterSpec


def build_bucket(name: str, spec: ClusterSpec, project: str, parent: pulumi.Resource) -> gcp.storage.Bucket:
    """Create the bucket (auto-named with a random suffix by Pulumi)."""
    days = spec.profile.bucket.scratch_expiry_days
    return gcp.storage.Bucket(
        child(name, "bucket"),
        location=spec.region.upper(),
        uniform_bucket_level_access=True,
        public_access_prevention="enforced",
        versioning=gcp.storage.BucketVersioningArgs(enabled=spec.profile.bucket.versioning),
        lifecycle_rules=[
            gcp.storage.BucketLifecycleRuleArgs(
                action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                    age=days, matches_prefixes=[spec.profile.bucket.scratch_prefix]
                ),
            ),
            *(
                [  # earlier versions of replaced or deleted objects (GCS lifecycle daysSinceNoncurrentTime,
                    # cloud.google.com/storage/docs/lifecycle#dayssincenoncurrenttime)
                    gcp.storage.BucketLifecycleRuleArgs(
                        action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                        condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                            days_since_noncurrent_time=spec.profile.bucket.noncurrent_version_days
                        ),
                    )
                ]
                if spec.profile.bucket.versioning
                else []
            ),
            gcp.storage.BucketLifecycleRuleArgs(
                action=gcp.storage.BucketLifecycleRuleActionArgs(type="AbortIncompleteMultipartUpload"),
                condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=7),
            ),
        ],
        force_destroy=spec.delete_bucket_on_destroy,
        labels=gcp_labels(spec),
        project=project,
        opts=pulumi.ResourceOptions(parent=parent, retain_on_delete=not spec.delete_bucket_on_destroy),
    )


#: The node service account's roles on the stack bucket (permissions of the roles:
#: cloud.google.com/iam/docs/roles-permissions/storage). Read, unconditionally: every object, the
#: node bundle included (``gpuinfra-bundle.service`` fetches it at boot). Create: under
#: :func:`bundle_write_exclusion` (everything but the node bundle, which every node runs as root:
#: Pulumi writes it). Overwrite and delete: under :func:`overwrite_condition`, which also leaves
#: out the checkpoint data under ``checkpoints/``: replacing an existing object needs
#: ``storage.objects.delete`` as well as ``create`` (cloud.google.com/storage/docs/access-control/
#: iam-permissions: "storage.objects.delete ... also required ... to overwrite an existing
#: object"), and delete is what removes a noncurrent version, so a node (or a container on it)
#: can neither rewrite nor delete any version of an uploaded checkpoint.
#: objectViewer: storage.objects.get / list; objectCreator: storage.objects.create,
#: storage.multipartUploads.create / abort / listParts; objectUser: storage.objects.create /
#: delete / get / list / restore / update, storage.multipartUploads.*.
NODE_BUCKET_READ_ROLE = "roles/storage.objectViewer"
NODE_BUCKET_CREATE_ROLE = "roles/storage.objectCreator"
NODE_BUCKET_WRITE_ROLE = "roles/storage.objectUser"
NODE_BUNDLE_CONDITION_TITLE = "gpuinfra-node-bundle-read-only"
NODE_BUNDLE_CONDITION_DESCRIPTION = (
    f"nodes may create any object of the stack bucket except under {BUNDLE_PREFIX} "
    "(the node bundle every node runs at boot; Pulumi writes it)"
)
NODE_OVERWRITE_CONDITION_TITLE = "gpuinfra-checkpoints-write-once"
#: Prefix of the agent's checkpoint uploads (:mod:`gpuinfra.agent.checkpoints` key layout).
CHECKPOINT_PREFIX = "checkpoints/"
NODE_OVERWRITE_CONDITION_DESCRIPTION = (
    f"nodes may overwrite and delete objects except under {BUNDLE_PREFIX} and the checkpoint data "
    f"under {CHECKPOINT_PREFIX} (its LATEST pointers and sync acks stay writable)"
)
#: IAM resource type of a Cloud Storage object
#: (cloud.google.com/iam/docs/conditions-resource-attributes#resource-type).
GCS_OBJECT_TYPE = "storage.googleapis.com/Object"
#: IAM resource type of a Compute Engine VM (same page).
GCE_INSTANCE_TYPE = "compute.googleapis.com/Instance"
_GCS_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_GCE_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def _object_path(bucket_name: str) -> str:
    """``projects/_/buckets/<bucket>/objects/``: the ``resource.name`` prefix of the bucket's
    objects (cloud.google.com/iam/docs/conditions-resource-attributes#resource-name).

    Raises:
        ValueError: ``bucket_name`` holds a character outside ``a-z 0-9 . _ -``
            (cloud.google.com/storage/docs/buckets#naming), so it cannot go into a CEL literal.
    """
    if not _GCS_NAME.fullmatch(bucket_name):
        raise ValueError(f"bucket name {bucket_name!r}: only a-z 0-9 . _ - allowed")
    return f"projects/_/buckets/{bucket_name}/objects/"


def bundle_write_exclusion(bucket_name: str) -> str:
    """The IAM condition (CEL) of the node service account's create role: true for every resource
    of ``bucket_name`` except objects whose name starts with :data:`BUNDLE_PREFIX`.

    Args:
        bucket_name: the stack bucket's name (checked by :func:`_object_path`).

    Returns:
        ``resource.type != "storage.googleapis.com/Object" ||
        !resource.name.startsWith("projects/_/buckets/<bucket>/objects/gpuinfra/")``.

    Raises:
        ValueError: see :func:`_object_path`.

    Why this shape (sources):

    * An object's ``resource.name`` is ``projects/_/buckets/<bucket>/objects/<object name>``
      (cloud.google.com/iam/docs/conditions-resource-attributes#resource-name; Google's sample
      ``storage_add_bucket_conditional_iam_binding``). The prefix keeps its trailing ``/``, so the
      nodes' own ``gpuinfra-peers/`` objects stay writable.
    * ``storage.objects.list`` (and every other bucket-level check) is evaluated against the
      bucket, ``projects/_/buckets/<bucket>``, not an object (cloud.google.com/storage/docs/
      access-control/iam-xml: ``GET bucket`` needs ``storage.objects.list``): the type guard keeps
      them granted, so listing, which the health gate and peer discovery do, is never denied.
    * Creating an object (simple, resumable, multipart, compose, copy / rewrite destination) needs
      ``storage.objects.create`` on that object, and replacing an existing one also
      ``storage.objects.delete`` (iam-xml and iam-json tables): both are checked against the
      object's name, so no write path into the prefix is left. Metadata updates, restoring a
      soft-deleted version and moves are object-level permissions too.
    * IAM Conditions on a bucket's policy need uniform bucket-level access
      (cloud.google.com/iam/docs/resource-types-with-conditional-roles, footnote 1):
      :func:`build_bucket` turns it on.
    """
    prefix = _object_path(bucket_name) + BUNDLE_PREFIX
    return f'resource.type != "{GCS_OBJECT_TYPE}" || !resource.name.startsWith("{prefix}")'


def overwrite_condition(bucket_name: str, stack: str) -> str:
    """The IAM condition (CEL) of the node service account's overwrite / delete role
    (:data:`NODE_BUCKET_WRITE_ROLE`): :func:`bundle_write_exclusion`, and no object under
    :data:`CHECKPOINT_PREFIX` except the two kinds the agent rewrites
    (:mod:`gpuinfra.agent.checkpoints`, :func:`gpuinfra.agent.constants.sync_ack_key`):
    ``checkpoints/<stack>/<part>/LATEST`` (rewritten after every upload; ``<part>`` is
    ``rank-<N>`` or ``node-<vm>``) and ``checkpoints/<stack>/.sync/...`` (the acks of sync
    requests). The checkpoint folders themselves are write-once by design (a rewritten folder
    goes to a new ``<signature>`` key), so the agent never needs to replace or delete them.

    Only functions IAM documents for ``resource.name`` are used (``startsWith`` and ``endsWith``:
    cloud.google.com/iam/docs/conditions-attribute-reference#resource-name). Without an
    anchored pattern, "a LATEST of a part" is written as "under ``checkpoints/<stack>/`` and
    ending in ``/LATEST``": it also admits an object named ``LATEST`` deeper in an uploaded
    checkpoint folder, the one piece of checkpoint data a node could still replace.

    What the node runtime overwrites or deletes elsewhere, all still allowed: the health gate's
    ``health/<stack>/<node>.json`` (rewritten on each boot), the peer entries
    ``gpuinfra-peers/<group>/<vm>/<ip>`` (``gcloud storage rm`` of the VM's old entries) and
    ``.formed`` markers, the temporary parts of gcloud's parallel composite uploads (files from
    150 MiB; deleted after the compose: cloud.google.com/storage/docs/parallel-composite-uploads;
    named under gcloud's ``storage/parallel_composite_upload_component_prefix``, by default at
    the bucket root, outside ``checkpoints/``), and whatever the job writes outside
    ``checkpoints/``.

    Args:
        bucket_name: the stack bucket; stack: the stack name the agent writes under
            (``GPUINFRA_STACK``, :mod:`gpuinfra.plan.node_files`).

    Raises:
        ValueError: see :func:`_object_path`; a stack name with a character outside
            ``a-z A-Z 0-9 . _ -`` (:data:`gpuinfra.spec.STACK_NAME_RE`), which could not go into the
            CEL literal as is.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", stack):
        raise ValueError(f"stack {stack!r}: only letters, digits and . _ - allowed in the overwrite condition")
    objects = _object_path(bucket_name)
    checkpoints = objects + CHECKPOINT_PREFIX
    own = f"{checkpoints}{stack}/"
    return (
        f"({bundle_write_exclusion(bucket_name)}) && "
        f'(!resource.name.startsWith("{checkpoints}") || resource.name.startsWith("{own}.sync/") || '
        f'(resource.name.startsWith("{own}") && resource.name.endsWith("/LATEST")))'
    )


def build_service_account(
    name: str, spec: ClusterSpec, bucket: gcp.storage.Bucket, project: str, parent: pulumi.Resource
) -> gcp.serviceaccount.Account:
    """Node service account with three bindings on the stack bucket only:
    :data:`NODE_BUCKET_READ_ROLE` (unconditional), :data:`NODE_BUCKET_CREATE_ROLE` under
    :func:`bundle_write_exclusion` and :data:`NODE_BUCKET_WRITE_ROLE` under
    :func:`overwrite_condition` (``BucketIAMMemberConditionArgs`` title / expression /
    description, pulumi_gcp 10.2.0). The provider identifies a binding by role and condition
    contents, so on a stack deployed with the earlier ``objectAdmin`` binding ``pulumi up``
    replaces it."""
    opts = pulumi.ResourceOptions(parent=parent)
    account = gcp.serviceaccount.Account(
        child(name, "nodes-sa"),
        account_id=gcp_service_account_id(spec),
        display_name=f"gpuinfra nodes of {spec.stack}",
        project=project,
        opts=opts,
    )
    member = account.email.apply(lambda email: f"serviceAccount:{email}")
    gcp.storage.BucketIAMMember(
        child(name, "nodes-bucket-read"),
        bucket=bucket.name,
        role=NODE_BUCKET_READ_ROLE,
        member=member,
        opts=opts,
    )
    gcp.storage.BucketIAMMember(
        child(name, "nodes-bucket-access"),
        bucket=bucket.name,
        role=NODE_BUCKET_CREATE_ROLE,
        member=member,
        condition=gcp.storage.BucketIAMMemberConditionArgs(
            title=NODE_BUNDLE_CONDITION_TITLE,
            expression=bucket.name.apply(bundle_write_exclusion),
            description=NODE_BUNDLE_CONDITION_DESCRIPTION,
        ),
        opts=opts,
    )
    gcp.storage.BucketIAMMember(
        child(name, "nodes-bucket-overwrite"),
        bucket=bucket.name,
        role=NODE_BUCKET_WRITE_ROLE,
        member=member,
        condition=gcp.storage.BucketIAMMemberConditionArgs(
            title=NODE_OVERWRITE_CONDITION_TITLE,
            expression=bucket.name.apply(lambda bucket_name: overwrite_condition(bucket_name, spec.stack)),
            description=NODE_OVERWRITE_CONDITION_DESCRIPTION,
        ),
        opts=opts,
    )
    build_registry_reader(name, spec, member, parent)
    return account


#: Role of the nodes on a bake's Artifact Registry repository: pull only
#: (cloud.google.com/artifact-registry/docs/access-control#roles: "Artifact Registry Reader ...
#: View and get artifacts").
NODE_REGISTRY_ROLE = "roles/artifactregistry.reader"


def build_registry_reader(
    name: str, spec: ClusterSpec, member: pulumi.Input[str], parent: pulumi.Resource
) -> gcp.artifactregistry.RepositoryIamMember | None:
    """:data:`NODE_REGISTRY_ROLE` for the node service account ``member`` on the baked image's
    repository only (``spec.baked_image.container_repository``,
    ``projects/P/locations/R/repositories/ID``), or None when the nodes boot no bake."""
    repository = spec.baked_image.container_repository if spec.baked_image else ""
    if not repository.startswith("projects/"):
        return None
    _, project, _, location, _, repository_id = repository.split("/")
    return gcp.artifactregistry.RepositoryIamMember(
        child(name, "nodes-registry-read"),
        project=project,
        location=location,
        repository=repository_id,
        role=NODE_REGISTRY_ROLE,
        member=member,
        opts=pulumi.ResourceOptions(parent=parent),
    )


#: What a node may do in its project, and nothing else: list its own MIG's VMs and read their
#: IPs (peer discovery), and delete itself from its MIG (idle/TTL watchdog). Permissions from
#: cloud.google.com/compute/docs/access/iam-permissions (instanceGroupManagers.get covers
#: listManagedInstances; deleteInstances needs instanceGroupManagers.update and instances.delete).
NODE_ROLE_PERMISSIONS = (
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.update",
    "compute.instances.get",
    "compute.instances.delete",
)


def own_group_condition(project: str, zone: str, group_name: str) -> str:
    """The IAM condition (CEL) of the node role: the group ``group_name`` itself (its exact
    ``resource.name``) and the VMs it names, instances whose name starts with ``<group_name>-``,
    in ``zone`` of ``project``. The VM clause also checks the resource type
    (``compute.googleapis.com/Instance``); the group clause names the group's full resource name,
    which no other type has.

    Only functions IAM documents for ``resource.name`` are used (``==`` and ``startsWith``:
    cloud.google.com/iam/docs/conditions-attribute-reference#resource-name); IAM's CEL has no
    anchored pattern, so the prefix must end where the group's name ends. It does:
    :func:`gpuinfra.plan.naming.gcp_group_name` of a stack with a name suffix (``preview`` and
    ``up`` refuse one without) is ``<stack>--<suffix>-node`` with a stack part
    holding no ``--`` and not ending in ``-``, and a 6-character suffix of ``a-z 0-9``. In
    another stack's group or VM name the first ``--`` ends that stack's part, so the name starts
    with ``<stack>--`` only for the same stack part, and then with ``<stack>--<suffix>-node-``
    only for the same suffix: no other stack's group or VM (``exp`` vs ``exp-node-2`` vs a stack
    named ``exp-<suffix>-node-2``) is granted. What the prefix still admits is a VM someone names
    ``<group_name>-...`` by hand in that zone.

    Sources: ``resource.name`` of Compute Engine resources is
    ``projects/<project>/zones/<zone>/instances/<name>`` and a VM's type is
    ``compute.googleapis.com/Instance`` (cloud.google.com/iam/docs/conditions-resource-attributes); a MIG names its VMs by appending
    "a hyphen and a random four-character string to the base instance name" (Compute API
    InstanceGroupManager.baseInstanceName, cloud.google.com/compute/docs/reference/rest/v1/
    instanceGroupManagers); :mod:`blueprints.gcp.nodes` uses ``group_name`` as both the group's
    name and its base instance name.

    Args:
        project: project ID; zone: e.g. ``us-east4-a``; group_name: the MIG's name
            (:func:`gpuinfra.plan.boot_gcp.node_prefix`).

    Raises:
        ValueError: a value holds a character outside ``a-z 0-9 -`` (GCE names and project IDs
            never do), so it cannot go into the CEL literal as is.
    """
    for what, value in (("project", project), ("zone", zone), ("group", group_name)):
        if not _GCE_NAME.fullmatch(value):
            raise ValueError(f"{what} {value!r}: only a-z 0-9 - allowed in the node role's condition")
    zone_path = f"projects/{project}/zones/{zone}"
    return (
        f'resource.name == "{zone_path}/instanceGroupManagers/{group_name}" || '
        f'(resource.type == "{GCE_INSTANCE_TYPE}" && resource.name.startsWith("{zone_path}/instances/{group_name}-"))'
    )


def build_node_role(
    name: str,
    spec: ClusterSpec,
    account: gcp.serviceaccount.Account,
    project: str,
    group_name: str,
    parent: pulumi.Resource,
) -> gcp.projects.IAMMember:
    """A custom role with :data:`NODE_ROLE_PERMISSIONS`, granted to the node service account on
    this stack's MIG and its VMs only (IAM condition on ``resource.name``,
    cloud.google.com/iam/docs/conditions-resource-attributes#resource-name). Replaces the
    project-wide ``compute.viewer`` (every VM's metadata) and ``compute.instanceAdmin.v1``
    (set metadata on peers) of gpuinfra 0.1. ``instanceGroupManagers.update`` (needed to delete
    itself, and to release the group when the cluster never formed) also lets a node resize or
    re-template its own group -- its own cluster only."""
    opts = pulumi.ResourceOptions(parent=parent)
    role = gcp.projects.IAMCustomRole(
        child(name, "node-role"),
        role_id=gcp_role_id(spec),
        title=f"gpuinfra nodes of {spec.stack}"[:100],
        description="list own MIG VMs, read their IPs, delete self from the MIG",
        permissions=list(NODE_ROLE_PERMISSIONS),
        project=project,
        opts=opts,
    )
    return gcp.projects.IAMMember(
        child(name, "node-role-binding"),
        project=project,
        role=role.name,
        member=account.email.apply(lambda email: f"serviceAccount:{email}"),
        condition=gcp.projects.IAMMemberConditionArgs(
            title="gpuinfra-own-group-only",
            expression=own_group_condition(project, spec.zone, group_name),
            description="nodes may only see and remove VMs of their own managed instance group",
        ),
        opts=opts,
    )


# --- the job's secrets (gpuinfra run --secret) ----------------------------------------------
#: What a node needs to read a secret's value (``gcloud secrets versions access``): Secret
#: Manager Secret Accessor, "Allows accessing the payload of secrets" (secretmanager.versions.access;
#: cloud.google.com/secret-manager/docs/access-control).
NODE_SECRET_ROLE = "roles/secretmanager.secretAccessor"
NODE_SECRET_CONDITION_TITLE = "gpuinfra-own-job-secrets-only"


def job_secrets_condition(project_number: str, scope: str) -> str:
    """The IAM condition (CEL) of :data:`NODE_SECRET_ROLE`: the secrets (and their versions) whose
    id starts with :func:`gpuinfra.agent.job.gcp_secret_prefix` (``gpuinfra-<stack id>_``).

    ``resource.name`` of a secret is ``projects/<project number>/secrets/<id>``, with the project
    *number*, not its id (Secret Manager answers with the number; conditions match that name:
    cloud.google.com/iam/docs/conditions-resource-attributes#resource-name, "Secret Manager" rows;
    the note "this requires the project number, not the project ID" in HashiCorp Vault's
    website/content/docs/sync/gcpsm.mdx, hashicorp/vault#25645); a version's name continues it
    with ``/versions/<n>``. ``startsWith`` is a documented ``resource.name`` function
    (cloud.google.com/iam/docs/conditions-attribute-reference#resource-name).

    Raises:
        ValueError: ``project_number`` is not digits, or ``scope`` holds a character that could
            end the CEL string literal.
    """
    if not project_number.isdigit():
        raise ValueError(f"project number {project_number!r} is not a number")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", scope):
        raise ValueError(f"stack id {scope!r}: only letters, digits, '_', '.' and '-' can go into the condition")
    return f'resource.name.startsWith("projects/{project_number}/secrets/{gcp_secret_prefix(scope)}")'


def build_secret_reader(
    name: str, spec: ClusterSpec, account: gcp.serviceaccount.Account, project: str, parent: pulumi.Resource
) -> gcp.projects.IAMMember:
    """:data:`NODE_SECRET_ROLE` for the node service account in ``project``, limited by
    :func:`job_secrets_condition` to this stack's job secrets (``gpuinfra run --secret``). A
    project-level binding with a condition, not one binding per secret: the secrets are the
    user's, made before or after ``up``. The project number comes from ``getProject``
    (``gcp.organizations.get_project``)."""
    number = gcp.organizations.get_project_output(project_id=project).number
    return gcp.projects.IAMMember(
        child(name, "node-job-secrets"),
        project=project,
        role=NODE_SECRET_ROLE,
        member=account.email.apply(lambda email: f"serviceAccount:{email}"),
        condition=gcp.projects.IAMMemberConditionArgs(
            title=NODE_SECRET_CONDITION_TITLE,
            expression=number.apply(lambda n: job_secrets_condition(str(n), stack_id(spec))),
            description="nodes may read the payload of this stack's job secrets only",
        ),
        opts=pulumi.ResourceOptions(parent=parent),
    )


# --- GPU monitoring --------------------------------------------------------------------------
#: What the Ops Agent needs to write its metrics (defined once in
#: :data:`gpuinfra.monitoring.metrics.METRIC_WRITER_ROLE`, which the cost estimate also reads);
#: ``logging.logWriter`` (:data:`gpuinfra.monitoring.metrics.LOG_WRITER_ROLE`) only with the
#: profile's ``monitoring.job_logs``: otherwise the agent's logging pipeline is off
#: (:func:`gpuinfra.monitoring.metrics.gcp_ops_agent_config`).
from gpuinfra.monitoring.metrics import LOG_WRITER_ROLE  # noqa: E402
from gpuinfra.monitoring.metrics import METRIC_WRITER_ROLE as MONITORING_ROLE  # noqa: E402


def build_monitoring_role(
    name: str, spec: ClusterSpec, account: gcp.serviceaccount.Account, project: str, parent: pulumi.Resource
) -> gcp.projects.IAMMember | None:
    """Grant the node service account :data:`MONITORING_ROLE` on the project (metric writes
    are project-level: the role cannot be scoped to resources), and :data:`LOG_WRITER_ROLE` when
    the profile ships the job log (``monitoring.job_logs``; log writes are project-level too);
    returns the metric writer binding, None when monitoring is off."""
    if not spec.profile.monitoring.enabled:
        return None
    member = account.email.apply(lambda email: f"serviceAccount:{email}")
    if spec.profile.monitoring.job_logs:
        gcp.projects.IAMMember(
            child(name, "nodes-log-writer"),
            project=project,
            role=LOG_WRITER_ROLE,
            member=member,
            opts=pulumi.ResourceOptions(parent=parent),
        )
    return gcp.projects.IAMMember(
        child(name, "nodes-metric-writer"),
        project=project,
        role=MONITORING_ROLE,
        member=member,
        opts=pulumi.ResourceOptions(parent=parent),
    )


# --- end GPU monitoring ----------------------------------------------------------------------


def build_bundle_object(
    name: str, bucket: gcp.storage.Bucket, bundle: NodeBundle, parent: pulumi.Resource
) -> gcp.storage.BucketObject:
    """The node bundle (:mod:`gpuinfra.plan.node_bundle`) as ``gpuinfra/node-bundle-<sha256>.json``
    (:attr:`NodeBundle.key`) in the stack bucket (outside the expiring scratch prefix); nodes
    fetch it at boot, check it against the SHA-256 their startup script pins, and cannot rewrite
    it (:func:`bundle_write_exclusion`)."""
    return gcp.storage.BucketObject(
        child(name, "node-bundle"),
        bucket=bucket.name,
        name=bundle.key,
        content=bundle.to_json(),
        content_type="application/json",
        opts=pulumi.ResourceOptions(parent=parent),
    )
