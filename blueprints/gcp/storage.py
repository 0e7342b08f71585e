"""GCS bucket (same region, uniform bucket-level access, public access prevention enforced,
scratch-prefix lifecycle, kept on destroy unless the stack says otherwise) and the node service
account with a role on that bucket only.

Sources: cluster-toolkit modules/file-system/cloud-storage-bucket/main.tf (location = region,
uniform_bucket_level_access, public_access_prevention); cluster-facts.md section 6 rule 11.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from blueprints.common.naming import child, dns_safe
from blueprints.common.tags import gcp_labels
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


def build_service_account(name: str, spec: ClusterSpec, bucket: gcp.storage.Bucket, project: str,
                          parent: pulumi.Resource) -> gcp.serviceaccount.Account:
    """Node service account; ``roles/storage.objectAdmin`` on the stack bucket only."""
    opts = pulumi.ResourceOptions(parent=parent)
    account = gcp.serviceaccount.Account(
        child(name, "nodes-sa"),
        account_id=dns_safe(f"gi-{spec.stack}", 30).ljust(6, "0"),
        display_name=f"gpuinfra nodes of {spec.stack}",
        project=project,
        opts=opts,
    )
    gcp.storage.BucketIAMMember(
        child(name, "nodes-bucket-access"),
        bucket=bucket.name,
        role="roles/storage.objectAdmin",
        member=account.email.apply(lambda email: f"serviceAccount:{email}"),
        opts=opts,
    )
    return account


def build_peer_discovery_role(name: str, account: gcp.serviceaccount.Account, project: str,
                              parent: pulumi.Resource) -> gcp.projects.IAMMember:
    """``roles/compute.viewer`` (read-only) so a node can list its peers for the torchrun host
    file -- the GCP counterpart of ``ec2:DescribeInstances`` on AWS."""
    return gcp.projects.IAMMember(
        child(name, "nodes-peer-discovery"),
        project=project,
        role="roles/compute.viewer",
        member=account.email.apply(lambda email: f"serviceAccount:{email}"),
        opts=pulumi.ResourceOptions(parent=parent),
    )


def build_self_delete_role(name: str, spec: ClusterSpec, account: gcp.serviceaccount.Account, project: str,
                           group_name: str, parent: pulumi.Resource) -> gcp.projects.IAMMember:
    """Let a node delete itself from its managed instance group (idle/TTL watchdog): Compute
    Instance Admin, conditioned on this group and its VMs only (IAM conditions on
    ``resource.name``: cloud.google.com/iam/docs/conditions-resource-attributes#resource-name)."""
    zone_path = f"projects/{project}/zones/{spec.zone}"
    expression = (
        f'resource.name.startsWith("{zone_path}/instanceGroupManagers/{group_name}") || '
        f'resource.name.startsWith("{zone_path}/instances/{group_name}-")'
    )
    return gcp.projects.IAMMember(
        child(name, "nodes-self-delete"),
        project=project,
        role="roles/compute.instanceAdmin.v1",
        member=account.email.apply(lambda email: f"serviceAccount:{email}"),
        condition=gcp.projects.IAMMemberConditionArgs(
            title="gpuinfra-own-group-only", expression=expression,
            description="nodes may only remove themselves from their own managed instance group",
        ),
        opts=pulumi.ResourceOptions(parent=parent),
    )
