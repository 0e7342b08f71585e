"""IAM of the nodes: SSM Session Manager access and the stack bucket, nothing else.

Sources: AmazonSSMManagedInstanceCore for Session Manager
(docs.aws.amazon.com/systems-manager/latest/userguide/setup-instance-permissions.html);
``ec2:DescribeInstances`` (read-only, not resource-scopable) lets a node find its peers for the
torchrun host file.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from blueprints.common.naming import child
from blueprints.common.tags import aws_tags
from gpuinfra.spec import ClusterSpec

SSM_MANAGED_POLICY = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"


def bucket_policy_document(bucket_arn: str) -> str:
    """Inline policy JSON scoped to one bucket (list the bucket; read/write its objects)."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ListStackBucket", "Effect": "Allow",
             "Action": ["s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
             "Resource": [bucket_arn]},
            {"Sid": "ReadWriteStackBucket", "Effect": "Allow",
             "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                        "s3:ListMultipartUploadParts"],
             "Resource": [f"{bucket_arn}/*"]},
            {"Sid": "FindClusterPeers", "Effect": "Allow", "Action": ["ec2:DescribeInstances"], "Resource": "*"},
        ],
    })


def build_instance_profile(name: str, spec: ClusterSpec, bucket: aws.s3.Bucket, parent: pulumi.Resource) -> aws.iam.InstanceProfile:
    """Role (EC2 trust), SSM managed policy, bucket-scoped inline policy, instance profile."""
    opts = pulumi.ResourceOptions(parent=parent)
    role = aws.iam.Role(
        child(name, "node-role"),
        assume_role_policy=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
        }),
        tags=aws_tags(spec),
        opts=opts,
    )
    aws.iam.RolePolicyAttachment(child(name, "node-ssm"), role=role.name, policy_arn=SSM_MANAGED_POLICY, opts=opts)
    aws.iam.RolePolicy(
        child(name, "node-bucket"), role=role.id, policy=bucket.arn.apply(bucket_policy_document), opts=opts
    )
    return aws.iam.InstanceProfile(child(name, "node-profile"), role=role.name, tags=aws_tags(spec), opts=opts)
