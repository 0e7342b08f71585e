"""GCP nodes read the node bundle but cannot rewrite it; they create anything else, and
overwrite or delete everything but uploaded checkpoint data (blueprints/gcp/storage.py
``build_service_account``).

The bindings are pinned exactly under Pulumi mocks, then their effect is checked the way IAM
decides it (a permission is granted when any binding of a role holding it applies: it has no
condition, or its condition is true for the resource; cloud.google.com/iam/docs/conditions-overview)
against the resources the nodes really touch: the bundle object they fetch, the bucket they list
(``storage.objects.list`` is checked on the bucket: cloud.google.com/storage/docs/access-control/
iam-xml), and the objects they write (health results, checkpoints, peer entries, scratch).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from blueprints.aws.identity import bucket_policy_document
from gpuinfra.agent.checkpoints import node_part
from gpuinfra.agent.constants import sync_ack_key
from gpuinfra.agent.node import AgentConfig
from gpuinfra.health.gate import health_key
from gpuinfra.plan.node_bundle import BUNDLE_PREFIX
from tests.blueprints.helpers import make_spec, preview
from tests.iam_cel import resource_allowed as cel_true

MEMBER_TYPE = "gcp:storage/bucketIAMMember:BucketIAMMember"
BUCKET = "t-2-bucket-0000preview"  # the offline preview's name for the auto-named bucket
ACCOUNT = "serviceAccount:gi-t-2-t3st0a@gpuinfra-preview.iam.gserviceaccount.com"
#: Cloud Storage IAM resource types and names (cloud.google.com/iam/docs/conditions-resource-attributes)
OBJECT, BUCKET_TYPE = "storage.googleapis.com/Object", "storage.googleapis.com/Bucket"
BUCKET_NAME = f"projects/_/buckets/{BUCKET}"
#: Predefined roles that can create, overwrite or delete objects
#: (cloud.google.com/iam/docs/roles-permissions/storage: storage.objects.create / delete).
WRITE_ROLES = {
    "roles/storage.objectAdmin",
    "roles/storage.objectUser",
    "roles/storage.objectCreator",
    "roles/storage.admin",
    "roles/storage.legacyBucketWriter",
    "roles/storage.legacyBucketOwner",
}


def object_name(key: str) -> str:
    return f"{BUCKET_NAME}/objects/{key}"


#: Permissions of the predefined roles the nodes hold, as Google lists them
#: (cloud.google.com/iam/docs/roles-permissions/storage; object-level subset).
ROLE_PERMISSIONS = {
    "roles/storage.objectViewer": {"storage.objects.get", "storage.objects.list"},
    "roles/storage.objectCreator": {"storage.objects.create", "storage.multipartUploads.create"},
    "roles/storage.objectUser": {
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
        "storage.objects.restore",
        "storage.objects.update",
        "storage.multipartUploads.create",
    },
    "roles/storage.objectAdmin": {
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
        "storage.objects.update",
    },
}


def granted(bindings: list[dict], roles: set[str], resource_type: str, resource_name: str) -> bool:
    """Whether any binding of one of ``roles`` applies to the resource."""
    return any(
        b["role"] in roles
        and ("condition" not in b or cel_true(b["condition"]["expression"], resource_type, resource_name))
        for b in bindings
    )


def permitted(bindings: list[dict], permission: str, resource_type: str, resource_name: str) -> bool:
    """Whether IAM grants ``permission`` on the resource: some binding whose role holds it applies."""
    roles = {role for role, perms in ROLE_PERMISSIONS.items() if permission in perms}
    assert all(b["role"] in ROLE_PERMISSIONS for b in bindings), "a role this test does not know"
    return granted(bindings, roles, resource_type, resource_name)


@pytest.fixture(scope="module")
def result():
    return preview(make_spec("a2-highgpu-8g", nodes=2, cloud="gcp"))


@pytest.fixture(scope="module")
def bindings(result):
    return [r.inputs for r in result.of_type(MEMBER_TYPE)]


def test_exact_bindings(result):
    members = {r.name: r.inputs for r in result.of_type(MEMBER_TYPE)}
    not_bundle = (
        'resource.type != "storage.googleapis.com/Object" || '
        f'!resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/gpuinfra/")'
    )
    assert members == {
        "t-2-nodes-bucket-read": {"bucket": BUCKET, "member": ACCOUNT, "role": "roles/storage.objectViewer"},
        "t-2-nodes-bucket-access": {
            "bucket": BUCKET,
            "member": ACCOUNT,
            "role": "roles/storage.objectCreator",
            "condition": {
                "title": "gpuinfra-node-bundle-read-only",
                "expression": not_bundle,
                "description": "nodes may create any object of the stack bucket except under "
                "gpuinfra/ (the node bundle every node runs at boot; Pulumi writes it)",
            },
        },
        "t-2-nodes-bucket-overwrite": {
            "bucket": BUCKET,
            "member": ACCOUNT,
            "role": "roles/storage.objectUser",
            "condition": {
                "title": "gpuinfra-checkpoints-write-once",
                "expression": f"({not_bundle}) && "
                f'(!resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/checkpoints/") || '
                f'resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/checkpoints/t-2/.sync/") || '
                f'(resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/checkpoints/t-2/") && '
                'resource.name.endsWith("/LATEST")))',
                "description": "nodes may overwrite and delete objects except under gpuinfra/ and the checkpoint "
                "data under checkpoints/ (its LATEST pointers and sync acks stay writable)",
            },
        },
    }
    assert all(r.parent == "t-2" for r in result.of_type(MEMBER_TYPE))


def test_no_unconditional_write_role(bindings):
    assert [b["role"] for b in bindings if "condition" not in b] == ["roles/storage.objectViewer"]
    assert all(b["role"] not in WRITE_ROLES for b in bindings if "condition" not in b)


def test_conditions_need_uniform_bucket_level_access(result):
    """IAM Conditions on a bucket's policy only with uniform bucket-level access
    (cloud.google.com/iam/docs/resource-types-with-conditional-roles, footnote 1)."""
    (bucket,) = result.of_type("gcp:storage/bucket:Bucket")
    assert bucket.inputs["uniformBucketLevelAccess"] is True


def test_bundle_object_is_under_the_protected_prefix(result):
    (bundle,) = result.of_type("gcp:storage/bucketObject:BucketObject")
    assert bundle.inputs["bucket"] == BUCKET
    assert re.fullmatch(r"gpuinfra/node-bundle-[0-9a-f]{64}\.json", bundle.inputs["name"])
    assert bundle.inputs["name"].startswith(BUNDLE_PREFIX)


@pytest.mark.parametrize(
    ("resource_type", "resource_name"),
    [
        (OBJECT, object_name("gpuinfra/node-bundle-" + "0" * 64 + ".json")),  # overwrite / delete the bundle
        (OBJECT, object_name("gpuinfra/extra-unit.json")),  # add a file next to it
        (OBJECT, object_name("gpuinfra/")),  # the "folder" placeholder itself
    ],
)
def test_nodes_read_but_cannot_write_the_bundle(bindings, resource_type, resource_name):
    assert granted(bindings, {"roles/storage.objectViewer"}, resource_type, resource_name)  # get
    assert not granted(bindings, WRITE_ROLES, resource_type, resource_name)  # create / delete / update


def node_written_keys(result) -> list[str]:
    """Object keys the nodes write: the health gate's result, the agent's checkpoint sync, the
    scratch prefix of the profile, and every gs:// path of this bucket in the startup script
    except the bundle URL the fetch unit reads."""
    spec = make_spec("a2-highgpu-8g", nodes=2, cloud="gcp")
    config = AgentConfig(
        cloud="gcp",
        stack=spec.stack,
        bucket=BUCKET,
        expires_at=None,
        idle_timeout_seconds=60,
        idle_utilization_percent=5,
        checkpoint_dir=Path("/scratch/checkpoints"),
    )
    (template,) = result.of_type("gcp:compute/instanceTemplate:InstanceTemplate")
    script = template.inputs["metadata"]["startup-script"]
    (bundle,) = result.of_type("gcp:storage/bucketObject:BucketObject")
    key = bundle.inputs["name"]
    script_keys = set(re.findall(rf"gs://{re.escape(BUCKET)}/([^\s\"']+)", script)) - {key}
    assert script_keys, "the startup script names no bucket path besides the bundle"
    return sorted(script_keys) + [
        health_key(spec.stack, "t-2-node-x1y2"),
        f"checkpoints/{config.stack}/{node_part('t-2-node-x1y2')}/step-100/0123456789ab/model.pt",
        f"checkpoints/{config.stack}/{node_part('t-2-node-x1y2')}/LATEST",
        sync_ack_key(config.stack, "down-1", "t-2-node-x1y2"),
        f"{spec.profile.bucket.scratch_prefix}dataset/shard-0",
    ]


def test_nodes_keep_writing_everything_else(result, bindings):
    """Every key the runtime writes can be created; every key it rewrites (health result,
    LATEST, sync acks, peer entries and markers, scratch) can also be overwritten and deleted,
    which GCS requires for a replace (cloud.google.com/storage/docs/access-control/iam-permissions)."""
    keys = node_written_keys(result)
    assert any(k.startswith("gpuinfra-peers/") for k in keys)  # shares the stem, not the prefix
    for key in keys:
        assert not key.startswith(BUNDLE_PREFIX), key
        assert permitted(bindings, "storage.objects.create", OBJECT, object_name(key)), key
        assert permitted(bindings, "storage.objects.get", OBJECT, object_name(key)), key
        if not key.startswith("checkpoints/"):  # a folder stem of the startup script: its entries
            assert permitted(bindings, "storage.objects.delete", OBJECT, object_name(key + "/peer-entry")), key
        if "/step-100/" not in key:  # not checkpoint data: rewritten by the runtime
            assert permitted(bindings, "storage.objects.delete", OBJECT, object_name(key)), key
    # listing (health gate read_prefix, peer discovery `gcloud storage ls`) is checked on the bucket
    assert permitted(bindings, "storage.objects.list", BUCKET_TYPE, BUCKET_NAME)
    assert permitted(bindings, "storage.objects.create", BUCKET_TYPE, BUCKET_NAME)


@pytest.mark.parametrize(
    "key",
    [
        "checkpoints/t-2/rank-0/step-100/0123456789ab/model.pt",  # an uploaded checkpoint file
        "checkpoints/t-2/rank-0/step-100/0123456789ab/.metadata",
        "checkpoints/t-2/rank-0/LATEST-old",  # not the pointer itself
        "checkpoints/t-2/.syncx/model.pt",
        "checkpoints/t-2/rank-0/.sync/model.pt",  # .sync/ only right under the stack
        "checkpoints/LATEST",
        "checkpoints/t-2-other/.sync/r/n.json",  # another stack's folder in the bucket
        "checkpoints/t-2-other/rank-0/LATEST",
        "checkpoints/t-2-other/LATEST",
    ],
)
def test_nodes_cannot_overwrite_or_delete_checkpoint_data(bindings, key):
    """Deleting (any generation: a noncurrent version too) and replacing both need
    storage.objects.delete on the object; the nodes hold it nowhere under checkpoints/ but on the
    LATEST pointers and sync acks, so versioning keeps every uploaded checkpoint. Creating new
    checkpoint objects stays allowed."""
    assert not permitted(bindings, "storage.objects.delete", OBJECT, object_name(key))
    assert not permitted(bindings, "storage.objects.update", OBJECT, object_name(key))
    assert permitted(bindings, "storage.objects.create", OBJECT, object_name(key))


def test_same_prefix_as_aws():
    """Both clouds keep the nodes out of the same prefix (AWS: an explicit Deny)."""
    doc = json.loads(bucket_policy_document("arn:aws:s3:::b"))
    (deny,) = [s for s in doc["Statement"] if s["Effect"] == "Deny"]
    assert deny["Resource"] == [f"arn:aws:s3:::b/{BUNDLE_PREFIX}*"]


def test_what_the_overwrite_condition_still_admits_under_checkpoints(bindings):
    """IAM's CEL has no anchored pattern for resource.name, so "the LATEST of a part" is written
    as "under checkpoints/<stack>/ and ending in /LATEST": a checkpoint file named exactly
    LATEST inside an uploaded folder is the one piece of checkpoint data still replaceable."""
    key = "checkpoints/t-2/rank-0/step-100/0123456789ab/LATEST"
    assert permitted(bindings, "storage.objects.delete", OBJECT, object_name(key))
    assert not permitted(bindings, "storage.objects.delete", OBJECT, object_name(key + ".pt"))
