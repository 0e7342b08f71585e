"""The stack's S3 bucket: same region, all public access blocked, encrypted, scratch-prefix
lifecycle, versioning per profile (on wherever the profile allows spot, with earlier versions
expiring after ``bucket.noncurrent_version_days``: S3 lifecycle ``NoncurrentVersionExpiration``,
docs.aws.amazon.com/AmazonS3/latest/userguide/lifecycle-configuration-examples.html), kept on
destroy unless the stack says otherwise.

Sources: awsome-distributed-training 1.architectures/0.common/0.private-bucket.yaml (all four
PublicAccessBlock flags); docs/sources/cluster-facts.md section 6 rule 11; the deny-non-TLS bucket policy of
docs.aws.amazon.com/AmazonS3/latest/userguide/security-best-practices.html ("Enforce encryption
of data in transit": Deny ``s3:*`` when ``aws:SecureTransport`` is false).
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from gpuinfra.plan.naming import child, dns_safe
from gpuinfra.plan.node_bundle import NodeBundle
from gpuinfra.plan.tags import aws_tags
from gpuinfra.spec import ClusterSpec

INCOMPLETE_UPLOAD_DAYS = 7


def deny_insecure_transport_policy(bucket_arn: str) -> str:
    """Bucket policy JSON denying every S3 action over plain HTTP (``aws:SecureTransport`` false)
    on the bucket and its objects."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyInsecureTransport",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": [bucket_arn, f"{bucket_arn}/*"],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ],
        }
    )


def build_bucket(name: str, spec: ClusterSpec, parent: pulumi.Resource) -> aws.s3.Bucket:
    """Create the bucket and its public-access block, encryption, versioning and lifecycle."""
    keep = not spec.delete_bucket_on_destroy
    opts = pulumi.ResourceOptions(parent=parent)
    bucket = aws.s3.Bucket(
        child(name, "bucket"),
        bucket_prefix=f"gpuinfra-{dns_safe(spec.stack, 27)}-",  # S3 allows a 37-character prefix
        force_destroy=spec.delete_bucket_on_destroy,
        tags=aws_tags(spec),
        opts=pulumi.ResourceOptions(parent=parent, retain_on_delete=keep),
    )
    aws.s3.BucketPublicAccessBlock(
        child(name, "bucket-pab"),
        bucket=bucket.id,
        block_public_acls=True,
        block_public_policy=True,
        ignore_public_acls=True,
        restrict_public_buckets=True,
        opts=opts,
    )
    aws.s3.BucketPolicy(
        child(name, "bucket-tls-only"),
        bucket=bucket.id,
        policy=bucket.arn.apply(deny_insecure_transport_policy),
        opts=opts,
    )
    aws.s3.BucketServerSideEncryptionConfiguration(
        child(name, "bucket-sse"),
        bucket=bucket.id,
        rules=[
            {
                "apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"},
                "bucket_key_enabled": True,
            }
        ],
        opts=opts,
    )
    aws.s3.BucketVersioning(
        child(name, "bucket-versioning"),
        bucket=bucket.id,
        versioning_configuration={"status": "Enabled" if spec.profile.bucket.versioning else "Suspended"},
        opts=opts,
    )
    days = spec.profile.bucket.scratch_expiry_days
    rules: list[aws.s3.BucketLifecycleConfigurationRuleArgsDict] = [
        {
            "id": "expire-scratch",
            "status": "Enabled",
            "filter": {"prefix": spec.profile.bucket.scratch_prefix},
            "expiration": {"days": days},
            "noncurrent_version_expiration": {"noncurrent_days": days},
        },
        {
            "id": "abort-incomplete-uploads",
            "status": "Enabled",
            "filter": {"prefix": ""},
            "abort_incomplete_multipart_upload": {"days_after_initiation": INCOMPLETE_UPLOAD_DAYS},
        },
    ]
    if spec.profile.bucket.versioning:  # earlier versions of replaced or deleted objects (LATEST, pruned checkpoints)
        rules.insert(
            1,
            {
                "id": "expire-noncurrent-versions",
                "status": "Enabled",
                "filter": {"prefix": ""},
                "noncurrent_version_expiration": {"noncurrent_days": spec.profile.bucket.noncurrent_version_days},
            },
        )
    aws.s3.BucketLifecycleConfiguration(child(name, "bucket-lifecycle"), bucket=bucket.id, rules=rules, opts=opts)
    return bucket


def build_bundle_object(
    name: str, spec: ClusterSpec, bucket: aws.s3.Bucket, bundle: NodeBundle, parent: pulumi.Resource
) -> aws.s3.BucketObjectv2:
    """The node bundle (:mod:`gpuinfra.plan.node_bundle`) as ``gpuinfra/node-bundle-<sha256>.json``
    (:attr:`NodeBundle.key`) in the stack bucket (outside the expiring scratch prefix); nodes
    fetch it at boot and check it against the SHA-256 their user data pins. A changed bundle is
    a new key, so the object is replaced, never rewritten under a running node."""
    return aws.s3.BucketObjectv2(
        child(name, "node-bundle"),
        bucket=bucket.id,
        key=bundle.key,
        content=bundle.to_json(),
        content_type="application/json",
        tags=aws_tags(spec),
        opts=pulumi.ResourceOptions(parent=parent),
    )
