"""IAM of the nodes: SSM Session Manager access, the stack bucket, (when monitoring is on)
the CloudWatch agent's metrics and configuration, and (when the nodes boot a baked image) pull
from the bake's ECR repository, nothing else.

Sources: AmazonSSMManagedInstanceCore for Session Manager
(docs.aws.amazon.com/systems-manager/latest/userguide/setup-instance-permissions.html);
``ec2:DescribeInstances`` (read-only, not resource-scopable) lets a node find its peers for the
torchrun host file.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from gpuinfra.monitoring.metrics import aws_namespace
from gpuinfra.plan.naming import child, stack_id
from gpuinfra.plan.node_bundle import BUNDLE_PREFIX
from gpuinfra.plan.tags import aws_tags
from gpuinfra.spec import ClusterSpec

SSM_MANAGED_POLICY = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"


def bucket_policy_document(bucket_arn: str) -> str:
    """Inline policy JSON scoped to one bucket (list the bucket; read/write its objects)."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ListStackBucket",
                    "Effect": "Allow",
                    "Action": ["s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
                    "Resource": [bucket_arn],
                },
                {
                    "Sid": "ReadWriteStackBucket",
                    "Effect": "Allow",
                    "Action": [
                        "s3:GetObject",
                        "s3:PutObject",
                        "s3:DeleteObject",
                        "s3:AbortMultipartUpload",
                        "s3:ListMultipartUploadParts",
                    ],
                    "Resource": [f"{bucket_arn}/*"],
                },
                {"Sid": "FindClusterPeers", "Effect": "Allow", "Action": ["ec2:DescribeInstances"], "Resource": "*"},
                # the node bundle (gpuinfra/...) is what every node runs as root at boot: Pulumi
                # writes it, the nodes only read it (an explicit Deny wins over the Allow above)
                {
                    "Sid": "NodeBundleReadOnly",
                    "Effect": "Deny",
                    "Action": ["s3:PutObject", "s3:DeleteObject"],
                    "Resource": [f"{bucket_arn}/{BUNDLE_PREFIX}*"],
                },
            ],
        }
    )


#: ECR actions a node needs to pull from the bake's repository
#: (docs.aws.amazon.com/AmazonECR/latest/userguide/image-pull-iam.html ... security_iam_id-based-policy-examples:
#: pull needs ``ecr:BatchGetImage`` and ``ecr:GetDownloadUrlForLayer``; ``docker pull`` also calls
#: ``ecr:BatchCheckLayerAvailability``, AmazonEC2ContainerRegistryReadOnly's layer action).
ECR_PULL_ACTIONS = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]


def ecr_pull_policy_document(repository_arn: str) -> str:
    """Inline policy JSON: an ECR authorization token (``ecr:GetAuthorizationToken`` takes no
    resource-level scope, so ``Resource: *``: docs.aws.amazon.com/AmazonECR/latest/userguide/
    security_iam_id-based-policy-examples.html) and pull (:data:`ECR_PULL_ACTIONS`) on the bake's
    one repository ``repository_arn`` (``arn:aws:ecr:<region>:<account>:repository/<name>``):
    no push, no other repository."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "EcrToken", "Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": "*"},
                {
                    "Sid": "PullBakeRepository",
                    "Effect": "Allow",
                    "Action": ECR_PULL_ACTIONS,
                    "Resource": [repository_arn],
                },
            ],
        }
    )


# --- GPU monitoring: the CloudWatch agent's permissions, nothing more ------------------------
def monitoring_policy_document(stack: str) -> str:
    """Inline policy JSON for the nodes' CloudWatch agent: ``cloudwatch:PutMetricData`` only
    into the stack's namespace (condition key ``cloudwatch:namespace``: docs.aws.amazon.com/
    AmazonCloudWatch/latest/monitoring/iam-cw-condition-keys-namespace.html; the action has no
    resource-level scope, so ``Resource: *``). Reading the agent's configuration parameter
    (``fetch-config -c ssm:``) needs ``ssm:GetParameter``, which the attached
    AmazonSSMManagedInstanceCore already grants on every parameter (``"Resource": "*"``), so no
    statement here could narrow it: none is added. No logs, no tags."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "PutStackMetrics",
                    "Effect": "Allow",
                    "Action": ["cloudwatch:PutMetricData"],
                    "Resource": "*",
                    "Condition": {"StringEquals": {"cloudwatch:namespace": aws_namespace(stack)}},
                },
            ],
        }
    )


# --- end GPU monitoring --------------------------------------------------------------------


def build_instance_profile(
    name: str, spec: ClusterSpec, bucket: aws.s3.Bucket, parent: pulumi.Resource
) -> aws.iam.InstanceProfile:
    """Role (EC2 trust), SSM managed policy, bucket-scoped inline policy, instance profile."""
    opts = pulumi.ResourceOptions(parent=parent)
    role = aws.iam.Role(
        child(name, "node-role"),
        assume_role_policy=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
                ],
            }
        ),
        tags=aws_tags(spec),
        opts=opts,
    )
    aws.iam.RolePolicyAttachment(child(name, "node-ssm"), role=role.name, policy_arn=SSM_MANAGED_POLICY, opts=opts)
    aws.iam.RolePolicy(
        child(name, "node-bucket"), role=role.id, policy=bucket.arn.apply(bucket_policy_document), opts=opts
    )
    repository = spec.baked_image.container_repository if spec.baked_image else ""
    if repository.startswith("arn:"):  # a baked image: pull from its ECR repository only
        aws.iam.RolePolicy(
            child(name, "node-ecr"), role=role.id, policy=ecr_pull_policy_document(repository), opts=opts
        )
    if spec.profile.monitoring.enabled:  # GPU monitoring
        aws.iam.RolePolicy(
            child(name, "node-monitoring"), role=role.id, policy=monitoring_policy_document(stack_id(spec)), opts=opts
        )
    return aws.iam.InstanceProfile(child(name, "node-profile"), role=role.name, tags=aws_tags(spec), opts=opts)
