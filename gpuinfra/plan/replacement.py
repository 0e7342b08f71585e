"""Replacing a lost node on AWS: an EventBridge rule on ``EC2 Spot Instance Interruption Warning``
that invokes a small Lambda function (:mod:`gpuinfra.plan.replace_function`), which launches one
replacement from the stack's launch template into the same subnet and cluster placement group.
What is declared here (no Pulumi): the event pattern, the function's settings and environment, and
its IAM policy, scoped to this stack. :mod:`blueprints.aws.replacement` registers the resources;
:mod:`gpuinfra.cost.estimate` prices them.

**Why this mechanism** (compared with the two the cloud offers ready-made):

* *A ``maintain`` EC2 Fleet* "maintains capacity by automatically replenishing any interrupted Spot
  Instances" (docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-fleet-request-type.html). But it is
  asynchronous and has no all-or-nothing start: ``MinTargetCapacity`` is "Supported only for fleets
  of type ``instant``" (API_SpotOptionsRequest / API_OnDemandOptionsRequest), so a stockout would
  bill part of a cluster that cannot train -- what the instant fleet with ``min_target_capacity`` =
  nodes prevents today (:mod:`blueprints.aws.nodes`). And it replenishes whatever ends: a node
  that ends itself (idle, TTL, the health gate, the job's end) would come back, billing until the
  fleet is deleted.
* *An Auto Scaling group* with the launch template and the placement group
  (``CreateAutoScalingGroup`` ``PlacementGroup``: "A cluster placement group is a logical grouping
  of instances within a single Availability Zone") keeps its desired capacity: an unhealthy
  instance is replaced "with a new instance to maintain the desired capacity of the group"
  (docs.aws.amazon.com/autoscaling/ec2/userguide/healthcheck.html), and "If any instance
  terminates unexpectedly, Auto Scaling detects the termination and launches a replacement
  instance" (docs.aws.amazon.com/elasticbeanstalk/latest/dg/environmentconfig-autoscaling-healthchecktype.html),
  nodes that ended themselves included, unless each node first lowers the
  desired capacity or detaches itself (more node permissions), and it has no all-or-nothing start
  either. It retries a launch until capacity comes, which this function does not.
* *This rule + function* keeps the instant fleet's all-or-nothing start, fires only on a Spot
  interruption (never on a node that ended itself), and costs nothing while nothing is
  interrupted. Its limits: EC2 emits the warning "on a best effort basis"
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html); a lost
  on-demand node (hardware failure) is not replaced; a launch that finds no capacity is tried three
  times over about three minutes (Lambda's asynchronous retries) and then given up.

**Placement group and EFA on relaunch.** The replacement comes from the same launch template --
EFA interfaces, subnet, security group and the ``cluster`` placement group -- so it lands in the
same group and zone or not at all. AWS advises launching all instances of a cluster placement
group in one request, because adding instances later raises the chance of an
``InsufficientInstanceCapacity`` error (docs.aws.amazon.com/AWSEC2/latest/UserGuide/
placement-strategies.html#placement-groups-cluster); a
replacement is such a late addition, so it can fail when the zone has no capacity near the others.
Spot Instances in a placement group must terminate on interruption, not stop or hibernate
(limitations-placement-groups.html): the replacement is one-time Spot with ``terminate``.

**Cost.** EventBridge ingests "AWS management events ... for free" and charges $0.00 per million
for them (aws.amazon.com/eventbridge/pricing/); the function bills per request and per GB-second
of its run (``prices.yaml`` ``lambda_requests_per_million``, ``lambda_duration_arm_per_gb_second``),
only when a node is interrupted. ``cost`` prices
:data:`gpuinfra.cost.estimate.PRICED_INTERRUPTIONS_PER_NODE` interruptions per node and run, each
run once plus the function's :data:`RETRY_ATTEMPTS` times for the full timeout: an
upper bound of a few thousandths of a dollar.

**Scope.** The function's role may describe instances (EC2 ``Describe*`` actions take no resource
ARNs: docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html), run instances
only from this stack's launch template (condition ``ec2:LaunchTemplate``, same reference; the
"launch template" example in docs.aws.amazon.com/AWSEC2/latest/UserGuide/ExamplePolicies_EC2.html),
tag only what that launch creates (``ec2:CreateAction`` = ``RunInstances``), pass only the
node role, only to EC2 (``iam:PassedToService``), and terminate only instances tagged with this
stack's id (``aws:ResourceTag/<key>``, as the fleet backstop's role: :mod:`blueprints.aws.backstop`).
A Spot launch through the API needs the account's ``AWSServiceRoleForEC2Spot`` service-linked role
("If you use the AWS CLI or an API to request a Spot Instance, you must first ensure that this role
exists": docs.aws.amazon.com/AWSEC2/latest/UserGuide/service-linked-roles-spot-instance-requests.html;
an account whose Spot capacity came only through EC2 Fleet may lack it), so the function may create
that one role and no other (``iam:AWSServiceName`` = ``spot.amazonaws.com``:
docs.aws.amazon.com/IAM/latest/UserGuide/using-service-linked-roles.html#service-linked-role-permissions).

**TTL backstop of replacements.** A replacement is not in the instant fleet, so the fleet
backstop (an EventBridge Scheduler schedule deleting the fleet at TTL + the backstop delay) does not
end it. A second one-time schedule at the same time invokes the function with
:data:`END_EVENT`, which terminates the stack's live replacements (Scheduler's templated Lambda
``Invoke`` target: docs.aws.amazon.com/scheduler/latest/UserGuide/managing-targets-templated.html;
its role may invoke only this function). It has no CloudWatch Logs permission (nothing to
price or to leave behind after ``down``); its record is the replacement's :data:`REPLACES_TAG`.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuinfra.agent.constants import REPLACEMENT_MIN_SECONDS_LEFT
from gpuinfra.plan import replace_function
from gpuinfra.plan.naming import AWS_STACK_ID_TAG, stack_id
from gpuinfra.plan.tags import expires_at_text
from gpuinfra.rules.aws import SPOT_INTERRUPTION_PATTERN as SPOT_INTERRUPTION_PATTERN  # the rule's event pattern
from gpuinfra.spec import ClusterSpec

REPLACES_TAG = replace_function.REPLACES_TAG
#: Lambda runtime (docs.aws.amazon.com/lambda/latest/dg/lambda-runtimes.html) and architecture
#: (arm64: the "Lambda Duration-ARM" price).
FUNCTION_RUNTIME = "python3.12"
FUNCTION_ARCHITECTURE = "arm64"
FUNCTION_HANDLER = "index.handler"
#: Lambda's smallest memory size is 128 MB (docs.aws.amazon.com/lambda/latest/dg/configuration-memory.html);
#: the function makes three EC2 calls.
FUNCTION_MEMORY_MB = 128
FUNCTION_TIMEOUT_SECONDS = 60
#: Retries of a failed launch: "between 0 and 2" (docs.aws.amazon.com/lambda/latest/dg/invocation-async-configuring.html).
RETRY_ATTEMPTS = 2
#: Drop an event older than this: a replacement ten minutes late still helps, an hour late the job
#: has gone on without it (``MaximumEventAgeInSeconds`` 60 to 21,600, same page).
MAX_EVENT_AGE_SECONDS = 600
#: No replacement in the stack's last hour (:data:`gpuinfra.agent.constants.REPLACEMENT_MIN_SECONDS_LEFT`).
MIN_SECONDS_LEFT = REPLACEMENT_MIN_SECONDS_LEFT
#: What the backstop schedule sends the function (:func:`gpuinfra.plan.replace_function.handler`).
END_EVENT = {"gpuinfra-action": "end"}
#: The service-linked role EC2 uses for Spot Instances and its service principal (module
#: docstring, "Scope"; service-linked-roles-spot-instance-requests.html).
SPOT_SERVICE = "spot.amazonaws.com"
SPOT_SERVICE_ROLE = "AWSServiceRoleForEC2Spot"


def replaces_lost_nodes(spec: ClusterSpec) -> bool:
    """True for AWS Spot stacks (the only nodes EC2 warns about before taking them)."""
    return spec.cloud == "aws" and bool(spec.spot) and not spec.capacity_block


def function_source() -> str:
    """The function's ``index.py``: :mod:`gpuinfra.plan.replace_function` as written."""
    return Path(replace_function.__file__).read_text()


def function_environment(spec: ClusterSpec, launch_template_id: str, launch_template_version: str) -> dict[str, str]:
    """The function's environment variables (all strings, as Lambda takes them)."""
    max_price = spec.spot_max_price_per_hour_usd
    return {
        "GPUINFRA_STACK_ID": stack_id(spec),
        "GPUINFRA_STACK_ID_TAG": AWS_STACK_ID_TAG,
        "GPUINFRA_NODES": str(spec.nodes),
        "GPUINFRA_EXPIRES_AT": expires_at_text(spec),
        "GPUINFRA_MIN_SECONDS_LEFT": str(MIN_SECONDS_LEFT),
        "GPUINFRA_LAUNCH_TEMPLATE_ID": launch_template_id,
        "GPUINFRA_LAUNCH_TEMPLATE_VERSION": launch_template_version,
        "GPUINFRA_SPOT_MAX_PRICE": "" if max_price is None else format(max_price, "f"),
    }


def invoke_policy_document(function_arn: str) -> str:
    """The backstop schedule's role: invoke this function only."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "InvokeTheReplacementFunction",
                    "Effect": "Allow",
                    "Action": "lambda:InvokeFunction",
                    "Resource": function_arn,
                }
            ],
        }
    )


def trust_policy_document() -> str:
    """Execution role trust: the Lambda service."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
            ],
        }
    )


def function_policy_document(spec: ClusterSpec, account_id: str, launch_template_arn: str, node_role_arn: str) -> str:
    """The function's inline policy (module docstring, "Scope")."""
    ec2 = f"arn:aws:ec2:{spec.region}:{account_id}"
    from_template = {"ArnLike": {"ec2:LaunchTemplate": launch_template_arn}}
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "ReadInstances", "Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
                {
                    "Sid": "LaunchFromThisStacksTemplate",
                    "Effect": "Allow",
                    "Action": "ec2:RunInstances",
                    "Resource": [
                        f"{ec2}:instance/*",
                        f"{ec2}:network-interface/*",
                        f"{ec2}:volume/*",
                        f"{ec2}:subnet/*",
                        f"{ec2}:security-group/*",
                        f"{ec2}:placement-group/*",
                        f"{ec2}:spot-instances-request/*",
                        launch_template_arn,
                        f"arn:aws:ec2:{spec.region}::image/*",
                    ],
                    "Condition": from_template,
                },
                {
                    "Sid": "TagWhatTheLaunchCreates",
                    "Effect": "Allow",
                    "Action": "ec2:CreateTags",
                    "Resource": [
                        f"{ec2}:instance/*",
                        f"{ec2}:volume/*",
                        f"{ec2}:network-interface/*",
                        f"{ec2}:spot-instances-request/*",
                    ],
                    "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances"}},
                },
                {
                    "Sid": "EndThisStacksReplacementsAtTheBackstop",
                    "Effect": "Allow",
                    "Action": "ec2:TerminateInstances",
                    "Resource": f"{ec2}:instance/*",
                    "Condition": {"StringEquals": {f"aws:ResourceTag/{AWS_STACK_ID_TAG}": stack_id(spec)}},
                },
                {
                    "Sid": "CreateTheSpotServiceLinkedRoleIfMissing",
                    "Effect": "Allow",
                    "Action": "iam:CreateServiceLinkedRole",
                    "Resource": f"arn:aws:iam::{account_id}:role/aws-service-role/{SPOT_SERVICE}/{SPOT_SERVICE_ROLE}",
                    "Condition": {"StringEquals": {"iam:AWSServiceName": SPOT_SERVICE}},
                },
                {
                    "Sid": "PassTheNodeRoleToEc2",
                    "Effect": "Allow",
                    "Action": "iam:PassRole",
                    "Resource": node_role_arn,
                    "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
                },
            ],
        }
    )
