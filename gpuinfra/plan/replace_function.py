"""The AWS Lambda function that replaces an interrupted Spot node (shipped as the function's
``index.py``; :mod:`gpuinfra.plan.replacement` says why this mechanism and declares its settings).

Standard library plus boto3, which the Lambda Python runtime provides ("Your code runs in an
environment that includes the SDK for Python (Boto3)": docs.aws.amazon.com/lambda/latest/dg/lambda-python.html); it
imports nothing else of gpuinfra, because Lambda runs this file alone.

**End** (event ``{"gpuinfra-action": "end"}``, from the stack's one-time EventBridge Scheduler
schedule at the TTL backstop time): terminate this stack's live replacements. They are not in the
stack's instant fleet, so the fleet backstop (deleting the fleet) does not reach them.

**Replace**: one call per ``EC2 Spot Instance Interruption Warning`` event of the account and region
(``detail.instance-id``: docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
The function launches one replacement from the stack's launch template -- same AMI, user data,
EFA NICs, subnet, security group and cluster placement group -- unless:

* the instance is not a node of this stack (its ``GPUINFRA_STACK_ID_TAG`` differs): every Spot
  interruption of the region reaches every stack's rule, and EventBridge cannot match on tags;
* the stack's TTL is less than ``GPUINFRA_MIN_SECONDS_LEFT`` away: the replacement could not
  boot, restore and train before the agents end the cluster;
* the stack already has ``GPUINFRA_NODES`` live nodes besides the interrupted one: a repeated
  event ("it's possible for it to receive the same event from Lambda multiple times because the
  queue itself is eventually consistent": docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html).

The launch is idempotent per interrupted instance (``ClientToken``, EC2 API ``RunInstances``:
"Unique, case-sensitive identifier you provide to ensure the idempotency of the request"), Spot one-time
with interruption behaviour ``terminate`` (a Spot Instance set to stop or hibernate cannot be in a
placement group: docs.aws.amazon.com/AWSEC2/latest/UserGuide/limitations-placement-groups.html),
at the stack's maximum price, and tagged with the interrupted node's tags plus
``gpuinfra:replaces=<instance id>`` -- the record of the restart and its cause. A launch error
(``InsufficientInstanceCapacity`` in the placement group's zone) raises, and Lambda runs the
event "two more times, with a one-minute wait between the first two attempts, and two minutes
between the second and third attempts" (invocation-async-error-handling.html); after that the
node stays lost and the job goes on with the nodes it has (:mod:`gpuinfra.plan.replacement`).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

#: Instance states that count as a live node.
LIVE_STATES = ("pending", "running")
#: The tag naming the node a replacement stands in for (also in :mod:`gpuinfra.plan.replacement`).
REPLACES_TAG = "gpuinfra:replaces"


def decide(
    tags: dict[str, str],
    live_others: int,
    nodes: int,
    stack_id: str,
    expires_at: datetime,
    now: datetime,
    min_left_s: int,
) -> str:
    """Why no replacement is launched, or ``""`` to launch one.

    Args:
        tags: the interrupted instance's tags; live_others: this stack's live instances besides it;
        nodes: the stack's node count; stack_id: this stack's id tag value; expires_at: the stack's
        TTL (UTC); now: the time of the decision (UTC); min_left_s: seconds of TTL a replacement needs.
    """
    if tags.get(os.environ.get("GPUINFRA_STACK_ID_TAG", "gpuinfra:stack-id")) != stack_id:
        return "not a node of this stack"
    if (expires_at - now).total_seconds() < min_left_s:
        return f"the stack ends at {expires_at:%Y-%m-%dT%H:%M:%SZ}, under {min_left_s} s away"
    if live_others >= nodes:
        return f"{live_others} live nodes besides it already (of {nodes}): replaced before"
    return ""


def _tags(instance: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags") or []}


def end_replacements(ec2: Any, stack_id: str, stack_tag: str) -> dict:
    """Terminate this stack's live instances that carry :data:`REPLACES_TAG`; ``{"ended": [ids]}``."""
    found = ec2.describe_instances(
        Filters=[
            {"Name": f"tag:{stack_tag}", "Values": [stack_id]},
            {"Name": "tag-key", "Values": [REPLACES_TAG]},
            {"Name": "instance-state-name", "Values": [*LIVE_STATES, "stopping", "stopped"]},
        ]
    )
    ids = sorted(i["InstanceId"] for r in found.get("Reservations") or [] for i in r.get("Instances") or [])
    if ids:
        ec2.terminate_instances(InstanceIds=ids)
    print(f"gpuinfra-replace: TTL backstop: ended {', '.join(ids) or 'no replacement'}")
    return {"ended": ids}


def handler(event: dict, context: object = None, ec2: Any = None) -> dict:
    """Lambda entry point (``index.handler``); ``ec2``: a boto3 EC2 client (tests pass one).

    Returns:
        ``{"replacement": <new instance id>, "replaces": <id>}`` or ``{"skipped": <why>, ...}``.

    Raises:
        botocore.exceptions.ClientError: the launch failed (no capacity, limits): Lambda retries.
    """
    env = os.environ
    if ec2 is None:  # pragma: no cover - in Lambda
        import boto3

        ec2 = boto3.client("ec2")
    if event.get("gpuinfra-action") == "end":
        return end_replacements(ec2, env["GPUINFRA_STACK_ID"], env.get("GPUINFRA_STACK_ID_TAG", "gpuinfra:stack-id"))
    interrupted = str((event.get("detail") or {}).get("instance-id") or "")
    if not interrupted.startswith("i-"):
        return {"skipped": "no instance id in the event"}
    found = ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": [interrupted]}])
    instances = [i for r in found.get("Reservations") or [] for i in r.get("Instances") or []]
    if not instances:
        return {"skipped": "instance not found", "replaces": interrupted}
    tags = _tags(instances[0])
    stack_id = env["GPUINFRA_STACK_ID"]
    live = ec2.describe_instances(
        Filters=[
            {"Name": f"tag:{env.get('GPUINFRA_STACK_ID_TAG', 'gpuinfra:stack-id')}", "Values": [stack_id]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
        ]
    )
    others = [
        i["InstanceId"]
        for r in live.get("Reservations") or []
        for i in r.get("Instances") or []
        if i["InstanceId"] != interrupted
    ]
    expires_at = datetime.strptime(env["GPUINFRA_EXPIRES_AT"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    why = decide(
        tags,
        len(others),
        int(env["GPUINFRA_NODES"]),
        stack_id,
        expires_at,
        datetime.now(UTC),
        int(env["GPUINFRA_MIN_SECONDS_LEFT"]),
    )
    if why:
        print(f"gpuinfra-replace: {interrupted}: no replacement: {why}")
        return {"skipped": why, "replaces": interrupted}
    spot: dict = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
    if env.get("GPUINFRA_SPOT_MAX_PRICE"):
        spot["MaxPrice"] = env["GPUINFRA_SPOT_MAX_PRICE"]
    kept = [{"Key": k, "Value": v} for k, v in sorted(tags.items()) if not k.startswith("aws:") and k != REPLACES_TAG]
    launched = ec2.run_instances(
        LaunchTemplate={
            "LaunchTemplateId": env["GPUINFRA_LAUNCH_TEMPLATE_ID"],
            "Version": env["GPUINFRA_LAUNCH_TEMPLATE_VERSION"],
        },
        MinCount=1,
        MaxCount=1,
        ClientToken=f"gpuinfra-replace-{interrupted}",
        InstanceMarketOptions={"MarketType": "spot", "SpotOptions": spot},
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [*kept, {"Key": REPLACES_TAG, "Value": interrupted}]},
        ],
    )
    new_id = launched["Instances"][0]["InstanceId"]
    print(f"gpuinfra-replace: {interrupted} interrupted; launched {new_id}")
    return {"replacement": new_id, "replaces": interrupted}
