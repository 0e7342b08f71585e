"""Replacement of interrupted Spot nodes on AWS: an EventBridge rule on ``EC2 Spot Instance
Interruption Warning``, the Lambda function it invokes, the function's role and its scoped policy.

Why this mechanism rather than a ``maintain`` EC2 Fleet or an Auto Scaling group, what it costs,
and how the policy is scoped: :mod:`gpuinfra.plan.replacement` (the plan layer decides, this
module only registers). The function: :mod:`gpuinfra.plan.replace_function`.

Resources (Spot stacks only, :func:`gpuinfra.plan.replacement.replaces_lost_nodes`):

* ``<name>-replace-role`` (trusted by ``lambda.amazonaws.com``) + ``<name>-replace-launch`` inline policy;
* ``<name>-replace`` (``aws.lambda_.Function``: Python, arm64, 128 MB, 60 s, code inline as
  ``index.py``) and ``<name>-replace-retries`` (``FunctionEventInvokeConfig``: two retries, events
  older than ten minutes dropped);
* ``<name>-spot-interruption`` (``aws.cloudwatch.EventRule`` on the default bus),
  ``<name>-spot-interruption-target`` (``EventTarget`` -> the function) and
  ``<name>-spot-interruption-invoke`` (``lambda_.Permission`` for ``events.amazonaws.com``, only
  from this rule's ARN: "source_arn ... the ARN of the EventBridge rule", pulumi_aws ``lambda_.Permission``);
* ``<name>-replace-backstop`` (``aws.scheduler.Schedule``, one-time, at the fleet backstop's time:
  invokes the function with :data:`gpuinfra.plan.replacement.END_EVENT`, which terminates the
  stack's replacements) with ``<name>-replace-backstop-role`` (trusted by this account's
  EventBridge Scheduler) and ``<name>-replace-backstop-invoke`` (``lambda:InvokeFunction`` on this
  function only).
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from blueprints.aws.backstop import RETRY_MAX_ATTEMPTS, RETRY_MAX_EVENT_AGE_SECONDS, schedule_expression
from blueprints.aws.backstop import trust_policy_document as scheduler_trust_policy_document
from gpuinfra.plan import replacement as plan
from gpuinfra.plan.naming import child
from gpuinfra.plan.tags import aws_tags
from gpuinfra.spec import ClusterSpec


def build_replacement(
    name: str,
    spec: ClusterSpec,
    template: aws.ec2.LaunchTemplate,
    node_profile: aws.iam.InstanceProfile,
    parent: pulumi.Resource,
) -> aws.lambda_.Function | None:
    """The rule, function, role and permission replacing this stack's interrupted Spot nodes, or
    None when the stack is not Spot (nothing warns before an on-demand node is lost)."""
    if not plan.replaces_lost_nodes(spec):
        return None
    opts = pulumi.ResourceOptions(parent=parent)
    tags = aws_tags(spec)
    account_id = aws.get_caller_identity_output().account_id
    role = aws.iam.Role(
        child(name, "replace-role"), assume_role_policy=plan.trust_policy_document(), tags=tags, opts=opts
    )
    node_role_arn = pulumi.Output.all(account_id, node_profile.role).apply(
        lambda args: f"arn:aws:iam::{args[0]}:role/{args[1]}"
    )
    policy = aws.iam.RolePolicy(
        child(name, "replace-launch"),
        role=role.id,
        policy=pulumi.Output.all(account_id, template.arn, node_role_arn).apply(
            lambda args: plan.function_policy_document(spec, *args)
        ),
        opts=opts,
    )
    function = aws.lambda_.Function(
        child(name, "replace"),
        description=f"gpuinfra: replace an interrupted Spot node of stack {spec.stack}",
        runtime=plan.FUNCTION_RUNTIME,
        architectures=[plan.FUNCTION_ARCHITECTURE],
        handler=plan.FUNCTION_HANDLER,
        memory_size=plan.FUNCTION_MEMORY_MB,
        timeout=plan.FUNCTION_TIMEOUT_SECONDS,
        role=role.arn,
        code=pulumi.AssetArchive({"index.py": pulumi.StringAsset(plan.function_source())}),
        environment=aws.lambda_.FunctionEnvironmentArgs(
            variables=pulumi.Output.all(template.id, template.latest_version).apply(
                lambda args: plan.function_environment(spec, str(args[0]), str(args[1]))
            )
        ),
        tags=tags,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[policy]),
    )
    aws.lambda_.FunctionEventInvokeConfig(
        child(name, "replace-retries"),
        function_name=function.name,
        maximum_retry_attempts=plan.RETRY_ATTEMPTS,
        maximum_event_age_in_seconds=plan.MAX_EVENT_AGE_SECONDS,
        opts=opts,
    )
    rule = aws.cloudwatch.EventRule(
        child(name, "spot-interruption"),
        description=f"gpuinfra: Spot interruption warnings, for stack {spec.stack}'s replacement function",
        event_pattern=json.dumps(plan.SPOT_INTERRUPTION_PATTERN),
        tags=tags,
        opts=opts,
    )
    permission = aws.lambda_.Permission(
        child(name, "spot-interruption-invoke"),
        action="lambda:InvokeFunction",
        function=function.name,
        principal="events.amazonaws.com",
        source_arn=rule.arn,
        opts=opts,
    )
    aws.cloudwatch.EventTarget(
        child(name, "spot-interruption-target"),
        rule=rule.name,
        arn=function.arn,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[permission]),
    )
    scheduler_role = aws.iam.Role(
        child(name, "replace-backstop-role"),
        assume_role_policy=account_id.apply(scheduler_trust_policy_document),
        tags=tags,
        opts=opts,
    )
    invoke = aws.iam.RolePolicy(
        child(name, "replace-backstop-invoke"),
        role=scheduler_role.id,
        policy=function.arn.apply(plan.invoke_policy_document),
        opts=opts,
    )
    aws.scheduler.Schedule(
        child(name, "replace-backstop"),
        description=f"gpuinfra: end the Spot replacements of stack {spec.stack} after its TTL",
        schedule_expression=schedule_expression(spec),
        schedule_expression_timezone="UTC",
        flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
        action_after_completion="NONE",
        target=aws.scheduler.ScheduleTargetArgs(
            arn=function.arn,
            role_arn=scheduler_role.arn,
            input=json.dumps(plan.END_EVENT),
            retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                maximum_event_age_in_seconds=RETRY_MAX_EVENT_AGE_SECONDS,
                maximum_retry_attempts=RETRY_MAX_ATTEMPTS,
            ),
        ),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[invoke]),
    )
    return function
