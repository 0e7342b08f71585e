"""Cloud-side TTL backstop on AWS: an EventBridge Scheduler one-time schedule that terminates the
fleet's instances, with an execution role that may terminate only this stack's instances.

Why: AWS has no instance run-time limit; the node agent ends a node at its TTL, but a node whose
agent died (or whose OS hangs) would run until someone notices. The schedule fires at
:func:`blueprints.common.backstop.backstop_at` (TTL + the agent's sync bound + a margin), so the
agent normally ends the node first, with its checkpoints saved.

Facts and sources:

* one-time schedule ``at(yyyy-mm-ddThh:mm:ss)`` evaluated in ``ScheduleExpressionTimezone``;
  ``FlexibleTimeWindow`` ``OFF`` = at that minute
  (docs.aws.amazon.com/scheduler/latest/UserGuide/schedule-types.html); pulumi_aws
  ``scheduler.Schedule``: ``flexible_time_window.mode`` "One of: OFF, FLEXIBLE",
  ``action_after_completion`` "Valid values are NONE and DELETE" -- NONE keeps the schedule in
  the stack's state until ``down``;
* universal target ``arn:aws:scheduler:::aws-sdk:ec2:terminateInstances`` with the API's request
  as JSON input (docs.aws.amazon.com/scheduler/latest/UserGuide/managing-targets-universal.html);
* execution role trusted by ``scheduler.amazonaws.com`` with ``aws:SourceAccount`` against the
  confused deputy (docs.aws.amazon.com/scheduler/latest/UserGuide/setting-up.html
  #setting-up-execution-role); ``ec2:TerminateInstances`` on instances tagged with this stack
  (``aws:ResourceTag/${TagKey}``: docs.aws.amazon.com/service-authorization/latest/reference/
  list_amazonec2.html);
* retry policy: ``maximum_event_age_in_seconds`` 60..86400, ``maximum_retry_attempts`` 0..185
  (pulumi_aws ``ScheduleTargetRetryPolicyArgs``): a throttled call is retried for a day.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from blueprints.common.backstop import backstop_at
from blueprints.common.naming import child
from blueprints.common.tags import aws_tags
from gpuinfra.spec import ClusterSpec

TERMINATE_INSTANCES_TARGET = "arn:aws:scheduler:::aws-sdk:ec2:terminateInstances"
SCHEDULER_PRINCIPAL = "scheduler.amazonaws.com"
RETRY_MAX_EVENT_AGE_SECONDS = 86400
RETRY_MAX_ATTEMPTS = 185


def schedule_expression(spec: ClusterSpec) -> str:
    """``at(...)`` of the backstop, in UTC (the schedule's timezone is set to UTC)."""
    return f"at({backstop_at(spec):%Y-%m-%dT%H:%M:%S})"


def trust_policy_document(account_id: str) -> str:
    """Role trust policy: EventBridge Scheduler of this account only."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Service": SCHEDULER_PRINCIPAL},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
        }],
    })


def terminate_policy_document(spec: ClusterSpec, account_id: str) -> str:
    """Inline policy: ``ec2:TerminateInstances`` on this region's instances tagged with the stack."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "TerminateThisStacksNodes",
            "Effect": "Allow",
            "Action": "ec2:TerminateInstances",
            "Resource": f"arn:aws:ec2:{spec.region}:{account_id}:instance/*",
            "Condition": {"StringEquals": {"aws:ResourceTag/gpuinfra:stack": spec.stack}},
        }],
    })


def terminate_input(instance_ids: list[str]) -> str:
    """The TerminateInstances request body the schedule sends."""
    return json.dumps({"InstanceIds": list(instance_ids)})


def build_ttl_backstop(name: str, spec: ClusterSpec, instance_ids: pulumi.Output, parent: pulumi.Resource) -> aws.scheduler.Schedule:
    """Execution role, its scoped policy and the one-time schedule terminating ``instance_ids``."""
    opts = pulumi.ResourceOptions(parent=parent)
    account_id = aws.get_caller_identity_output().account_id
    role = aws.iam.Role(
        child(name, "backstop-role"),
        assume_role_policy=account_id.apply(trust_policy_document),
        tags=aws_tags(spec),
        opts=opts,
    )
    policy = aws.iam.RolePolicy(
        child(name, "backstop-terminate"),
        role=role.id,
        policy=account_id.apply(lambda account: terminate_policy_document(spec, account)),
        opts=opts,
    )
    return aws.scheduler.Schedule(
        child(name, "ttl-backstop"),
        description=f"gpuinfra: terminate the nodes of stack {spec.stack} after its TTL if they are still running",
        schedule_expression=schedule_expression(spec),
        schedule_expression_timezone="UTC",
        flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
        action_after_completion="NONE",
        target=aws.scheduler.ScheduleTargetArgs(
            arn=TERMINATE_INSTANCES_TARGET,
            role_arn=role.arn,
            input=instance_ids.apply(terminate_input),
            retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                maximum_event_age_in_seconds=RETRY_MAX_EVENT_AGE_SECONDS,
                maximum_retry_attempts=RETRY_MAX_ATTEMPTS,
            ),
        ),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[policy]),
    )
