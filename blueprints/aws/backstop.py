"""Cloud-side TTL backstop on AWS: an EventBridge Scheduler one-time schedule that deletes the
stack's instant EC2 Fleet -- EC2 then terminates every instance the fleet still has -- with an
execution role that may delete only that fleet and terminate only this stack's instances.

Why: AWS has no instance run-time limit; the node agent ends a node at its TTL, but a node whose
agent died (or whose OS hangs) would run until someone notices. The schedule fires at
:func:`gpuinfra.plan.backstop.backstop_at` (TTL + the agent's sync bound + a margin), so the
agent normally ends the node first, with its checkpoints saved.

Facts and sources:

* one-time schedule ``at(yyyy-mm-ddThh:mm:ss)`` evaluated in ``ScheduleExpressionTimezone``;
  ``FlexibleTimeWindow`` ``OFF`` = at that minute
  (docs.aws.amazon.com/scheduler/latest/UserGuide/schedule-types.html); pulumi_aws
  ``scheduler.Schedule``: ``flexible_time_window.mode`` "One of: OFF, FLEXIBLE",
  ``action_after_completion`` "Valid values are NONE and DELETE" -- NONE keeps the schedule in
  the stack's state until ``down``;
* universal target ``arn:aws:scheduler:::aws-sdk:ec2:deleteFleets`` with the API's request as
  JSON input (docs.aws.amazon.com/scheduler/latest/UserGuide/managing-targets-universal.html).
  DeleteFleets, not TerminateInstances: "When you delete an instant fleet, Amazon EC2
  automatically terminates all its instances" (EC2 API reference, DeleteFleets), whichever are
  left, while a TerminateInstances call naming a node that already ended itself fails for all:
  "If you specify multiple instances and the request fails (for example, because of a single
  incorrect instance ID), none of the instances are terminated" (TerminateInstances);
  ``TerminateInstances: true`` is the only value an instant fleet takes;
* execution role trusted by ``scheduler.amazonaws.com`` with ``aws:SourceAccount`` against the
  confused deputy (docs.aws.amazon.com/scheduler/latest/UserGuide/setting-up.html
  #setting-up-execution-role); ``ec2:DeleteFleets`` on this fleet's ARN and
  ``ec2:TerminateInstances`` on instances tagged with this stack (``aws:ResourceTag/${TagKey}``:
  docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html; EC2 user
  guide ExamplePolicies_EC2 "terminate only instances ... with the resource tag");
* retry policy: ``maximum_event_age_in_seconds`` 60..86400, ``maximum_retry_attempts`` 0..185
  (pulumi_aws ``ScheduleTargetRetryPolicyArgs``): a throttled call is retried for a day.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from gpuinfra.plan.backstop import backstop_at
from gpuinfra.plan.naming import AWS_STACK_ID_TAG, child, stack_id
from gpuinfra.plan.tags import aws_tags
from gpuinfra.spec import ClusterSpec

DELETE_FLEETS_TARGET = "arn:aws:scheduler:::aws-sdk:ec2:deleteFleets"
SCHEDULER_PRINCIPAL = "scheduler.amazonaws.com"
RETRY_MAX_EVENT_AGE_SECONDS = 86400
RETRY_MAX_ATTEMPTS = 185


def schedule_expression(spec: ClusterSpec) -> str:
    """``at(...)`` of the backstop, in UTC (the schedule's timezone is set to UTC)."""
    return f"at({backstop_at(spec):%Y-%m-%dT%H:%M:%S})"


def trust_policy_document(account_id: str) -> str:
    """Role trust policy: EventBridge Scheduler of this account only."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": SCHEDULER_PRINCIPAL},
                    "Action": "sts:AssumeRole",
                    "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
                }
            ],
        }
    )


def terminate_policy_document(spec: ClusterSpec, account_id: str, fleet_arn: str) -> str:
    """Inline policy: delete this fleet; terminate this region's instances tagged with this stack's
    own :data:`gpuinfra.plan.naming.AWS_STACK_ID_TAG` (stack name and random name suffix: a stack of
    the same name from another folder carries the same ``gpuinfra:stack`` but another stack id).
    ``aws:ResourceTag/<key>`` on ``ec2:TerminateInstances``: docs.aws.amazon.com/service-authorization/
    latest/reference/list_amazonec2.html (instance resource condition keys)."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DeleteThisStacksFleet",
                    "Effect": "Allow",
                    "Action": "ec2:DeleteFleets",
                    "Resource": fleet_arn,
                },
                {
                    "Sid": "TerminateThisStacksNodes",
                    "Effect": "Allow",
                    "Action": "ec2:TerminateInstances",
                    "Resource": f"arn:aws:ec2:{spec.region}:{account_id}:instance/*",
                    "Condition": {"StringEquals": {f"aws:ResourceTag/{AWS_STACK_ID_TAG}": stack_id(spec)}},
                },
            ],
        }
    )


def delete_fleet_input(fleet_id: str) -> str:
    """The DeleteFleets request body the schedule sends (an instant fleet takes only ``true``)."""
    return json.dumps({"FleetIds": [fleet_id], "TerminateInstances": True})


def build_ttl_backstop(
    name: str, spec: ClusterSpec, fleet: aws.ec2.Fleet, instance_ids: pulumi.Output, parent: pulumi.Resource
) -> aws.scheduler.Schedule:
    """Execution role, its scoped policy and the one-time schedule deleting ``fleet``; the schedule
    waits for ``instance_ids`` (the capacity check), so a fleet that launched too few nodes fails
    the update before the schedule exists."""
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
        policy=pulumi.Output.all(account_id, fleet.arn).apply(lambda args: terminate_policy_document(spec, *args)),
        opts=opts,
    )
    return aws.scheduler.Schedule(
        child(name, "ttl-backstop"),
        description=f"gpuinfra: delete the fleet of stack {spec.stack} (terminating its nodes) after its TTL",
        schedule_expression=schedule_expression(spec),
        schedule_expression_timezone="UTC",
        flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
        action_after_completion="NONE",
        target=aws.scheduler.ScheduleTargetArgs(
            arn=DELETE_FLEETS_TARGET,
            role_arn=role.arn,
            input=pulumi.Output.all(fleet.id, instance_ids).apply(lambda args: delete_fleet_input(args[0])),
            retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                maximum_event_age_in_seconds=RETRY_MAX_EVENT_AGE_SECONDS,
                maximum_retry_attempts=RETRY_MAX_ATTEMPTS,
            ),
        ),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[policy]),
    )
