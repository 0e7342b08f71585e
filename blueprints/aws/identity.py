"""IAM of the nodes: the SSM Agent's Session Manager / Run Command channel (no parameter
read), the stack bucket, (when monitoring is on) the CloudWatch agent's metrics and its one
configuration parameter, and (when the nodes boot a baked image) pull from the bake's ECR
repository, nothing else.

Sources: :func:`ssm_agent_policy_document`; ``ec2:DescribeInstances`` (read-only, not
resource-scopable) lets a node find its peers for the torchrun host file.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from gpuinfra.agent.job import aws_secret_prefixes
from gpuinfra.monitoring.metrics import aws_agent_parameter_name, aws_job_log_group, aws_namespace
from gpuinfra.plan.naming import child, stack_id
from gpuinfra.plan.node_bundle import BUNDLE_PREFIX
from gpuinfra.plan.tags import aws_tags
from gpuinfra.spec import ClusterSpec

#: What the SSM Agent on a node calls to register and to serve Session Manager sessions
#: (``ssmmessages:*Channel``) and Run Command (``ec2messages:*``; ``gpuinfra`` sends
#: ``AWS-RunShellScript``, :mod:`gpuinfra.plan.fabric`): AmazonSSMManagedInstanceCore
#: (docs.aws.amazon.com/aws-managed-policy/latest/reference/AmazonSSMManagedInstanceCore.html,
#: policy v2) less its State Manager / Inventory / Patch Manager actions (gpuinfra uses none), and
#: less ``ssm:GetParameter`` / ``ssm:GetParameters`` on ``"Resource": "*"``, which let any code on
#: a node (a container too: IMDS hop limit 2) read every parameter of the account, SecureStrings
#: included. Session Manager's own minimum is ``ssm:UpdateInstanceInformation`` plus the four
#: ``ssmmessages`` actions (docs.aws.amazon.com/systems-manager/latest/userguide/
#: getting-started-create-iam-instance-profile.html; AWS managed policy
#: AWSCloud9SSMInstanceProfile has exactly those). The ``ssmmessages`` and ``ec2messages`` actions
#: define no resource type (docs.aws.amazon.com/service-authorization/latest/reference/
#: list_ssmmessages.html and list_amazonmessagedeliveryservice.html list no resource types),
#: so ``Resource: "*"`` is the only form; ``ssm:UpdateInstanceInformation`` stays on ``*`` as in
#: the AWS policies above (a node reports only its own instance). None of them reads account data.
SSM_AGENT_ACTIONS = (
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
    "ec2messages:AcknowledgeMessage",
    "ec2messages:DeleteMessage",
    "ec2messages:FailMessage",
    "ec2messages:GetEndpoint",
    "ec2messages:GetMessages",
    "ec2messages:SendReply",
)


def ssm_agent_policy_document() -> str:
    """Inline policy JSON: :data:`SSM_AGENT_ACTIONS` (``Resource: "*"``, see there), no
    ``ssm:GetParameter*``, no other SSM read."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "SsmAgentChannels", "Effect": "Allow", "Action": list(SSM_AGENT_ACTIONS), "Resource": "*"}
            ],
        }
    )


def parameter_arn(region: str, account_id: str, name: str) -> str:
    """ARN of the SSM parameter ``name`` (``/a/b`` -> ``arn:aws:ssm:<region>:<account>:parameter/a/b``:
    a hierarchical name's leading ``/`` is the ARN's separator, docs.aws.amazon.com/
    systems-manager/latest/userguide/sysman-paramstore-access.html,
    docs.aws.amazon.com/service-authorization/latest/reference/list_awssystemsmanager.html
    resource type ``parameter``: ``arn:${Partition}:ssm:${Region}:${Account}:parameter/${ParameterNameWithoutLeadingSlash}``).

    Raises:
        ValueError: ``name`` does not start with ``/``.
    """
    if not name.startswith("/"):
        raise ValueError(f"SSM parameter name {name!r} is not hierarchical (no leading '/')")
    return f"arn:aws:ssm:{region}:{account_id}:parameter{name}"


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
#: What the CloudWatch agent calls to ship a log file into a log group that exists
#: (docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/create-iam-roles-for-cloudwatch-agent.html,
#: CloudWatchAgentServerPolicy's logs actions less ``CreateLogGroup``, ``DescribeLogGroups`` and
#: ``PutRetentionPolicy``: the stack declares the group and its retention).
JOB_LOG_ACTIONS = ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]


def log_group_arns(region: str, account_id: str, group: str) -> list[str]:
    """ARNs of log group ``group`` and of its streams (resource types ``log-group``
    ``arn:${Partition}:logs:${Region}:${Account}:log-group:${LogGroupName}`` and ``log-stream``
    ``...:log-group:${LogGroupName}:log-stream:${LogStreamName}``: docs.aws.amazon.com/
    service-authorization/latest/reference/list_amazoncloudwatchlogs.html)."""
    group_arn = f"arn:aws:logs:{region}:{account_id}:log-group:{group}"
    return [group_arn, f"{group_arn}:log-stream:*"]


def monitoring_policy_document(stack: str, region: str, account_id: str, job_logs: bool = False) -> str:
    """``stack`` is the stack's id in physical names (:func:`gpuinfra.plan.naming.stack_id`).
    Inline policy JSON for the nodes' CloudWatch agent: ``cloudwatch:PutMetricData`` only
    into the stack's namespace (condition key ``cloudwatch:namespace``: docs.aws.amazon.com/
    AmazonCloudWatch/latest/monitoring/iam-cw-condition-keys-namespace.html; the action has no
    resource-level scope, so ``Resource: *``), and ``ssm:GetParameter`` on the stack's one agent
    configuration parameter (:func:`gpuinfra.monitoring.metrics.aws_agent_parameter_name`, read by
    ``amazon-cloudwatch-agent-ctl -a fetch-config -c ssm:<name>``; CloudWatchAgentServerPolicy
    grants the agent ``ssm:GetParameter`` for this: docs.aws.amazon.com/aws-managed-policy/latest/
    reference/CloudWatchAgentServerPolicy.html) in ``region`` of ``account_id``. The parameter is a
    ``String``, so no ``kms:Decrypt``. No tags; logs only with ``job_logs`` (the profile's
    ``monitoring.job_logs``): :data:`JOB_LOG_ACTIONS` on the stack's job log group and its
    streams (:func:`log_group_arns` of :func:`gpuinfra.monitoring.metrics.aws_job_log_group`)."""
    logs = [
        {
            "Sid": "ShipJobLog",
            "Effect": "Allow",
            "Action": JOB_LOG_ACTIONS,
            "Resource": log_group_arns(region, account_id, aws_job_log_group(stack)),
        }
    ]
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
                {
                    "Sid": "ReadAgentConfiguration",
                    "Effect": "Allow",
                    "Action": ["ssm:GetParameter"],
                    "Resource": [parameter_arn(region, account_id, aws_agent_parameter_name(stack))],
                },
                *(logs if job_logs else []),
            ],
        }
    )


# --- end GPU monitoring --------------------------------------------------------------------


def job_secrets_policy_document(stack: str, region: str, account_id: str) -> str:
    """Inline policy JSON: the secrets a job may name (``gpuinfra run --secret``, read on the node
    by :func:`gpuinfra.agent.job.secret_command`), and nothing else: ``ssm:GetParameter`` on
    ``parameter/gpuinfra/<stack id>/job/*`` (:func:`parameter_arn`) and ``secretsmanager:GetSecretValue``
    on ``secret:gpuinfra/<stack id>/job/*`` (:func:`gpuinfra.agent.job.aws_secret_prefixes`) (resource type ``secret``,
    ``arn:${Partition}:secretsmanager:${Region}:${Account}:secret:${SecretId}``, whose id ends in
    ``-`` and 6 random characters: docs.aws.amazon.com/service-authorization/latest/reference/
    list_awssecretsmanager.html) in ``region`` of ``account_id``. ``stack`` is the stack id
    (:func:`gpuinfra.plan.naming.stack_id`, ``GPUINFRA_STACK_ID`` on the node): unlike the stack
    name, no stack of another project folder has it. Values under the AWS managed keys ``aws/ssm`` /
    ``aws/secretsmanager`` need no ``kms:Decrypt`` grant (their key policies allow use through
    the service by the account's principals: docs.aws.amazon.com/secretsmanager/latest/userguide/
    security-encryption.html); a customer managed key needs its own grant, which this does not give."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ReadJobParameters",
                    "Effect": "Allow",
                    "Action": ["ssm:GetParameter"],
                    "Resource": [parameter_arn(region, account_id, f"{aws_secret_prefixes(stack)[0]}*")],
                },
                {
                    "Sid": "ReadJobSecrets",
                    "Effect": "Allow",
                    "Action": ["secretsmanager:GetSecretValue"],
                    "Resource": [
                        f"arn:aws:secretsmanager:{region}:{account_id}:secret:{aws_secret_prefixes(stack)[1]}*"
                    ],
                },
            ],
        }
    )


def build_instance_profile(
    name: str, spec: ClusterSpec, bucket: aws.s3.Bucket, parent: pulumi.Resource
) -> aws.iam.InstanceProfile:
    """Role (EC2 trust) with inline policies: the SSM Agent's channels
    (:func:`ssm_agent_policy_document`), the bucket (:func:`bucket_policy_document`), ECR pull from
    a bake's repository, monitoring (:func:`monitoring_policy_document`), the job's secrets
    (:func:`job_secrets_policy_document`); its instance profile.
    No managed policy is attached."""
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
    aws.iam.RolePolicy(child(name, "node-ssm"), role=role.id, policy=ssm_agent_policy_document(), opts=opts)
    aws.iam.RolePolicy(
        child(name, "node-bucket"), role=role.id, policy=bucket.arn.apply(bucket_policy_document), opts=opts
    )
    repository = spec.baked_image.container_repository if spec.baked_image else ""
    if repository.startswith("arn:"):  # a baked image: pull from its ECR repository only
        aws.iam.RolePolicy(
            child(name, "node-ecr"), role=role.id, policy=ecr_pull_policy_document(repository), opts=opts
        )
    if spec.profile.monitoring.enabled:  # GPU monitoring
        account_id = aws.get_caller_identity_output().account_id
        aws.iam.RolePolicy(
            child(name, "node-monitoring"),
            role=role.id,
            policy=account_id.apply(
                lambda account: monitoring_policy_document(
                    stack_id(spec), spec.region, account, spec.profile.monitoring.job_logs
                )
            ),
            opts=opts,
        )
    aws.iam.RolePolicy(
        child(name, "node-job-secrets"),
        role=role.id,
        policy=aws.get_caller_identity_output().account_id.apply(
            lambda account: job_secrets_policy_document(stack_id(spec), spec.region, account)
        ),
        opts=opts,
    )
    return aws.iam.InstanceProfile(child(name, "node-profile"), role=role.name, tags=aws_tags(spec), opts=opts)
