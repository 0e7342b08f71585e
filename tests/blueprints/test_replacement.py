"""Replacement of interrupted Spot nodes on AWS (blueprints/aws/replacement.py): the rule, the
function and its permissions are in the previewed stack, scoped to the stack, priced by ``cost``;
the function replaces an interrupted node of its own stack only (moto's EC2, in process)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from gpuinfra.catalog.store import load_catalog
from gpuinfra.cost.estimate import estimate
from gpuinfra.plan import replace_function
from gpuinfra.preview import PREVIEW_ACCOUNT
from tests.blueprints.helpers import make_spec, preview
from tests.blueprints.iam_policy import Decision, evaluate

RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
FUNCTION = "aws:lambda/function:Function"
PERMISSION = "aws:lambda/permission:Permission"
RETRIES = "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ROLE = "aws:iam/role:Role"
USAGE = {"bucket_storage_gb": Decimal(0), "internet_egress_gb": Decimal(0), "nat_processed_gb": Decimal(0)}
#: Lambda arm64 in the regions the test stacks land in (us-east-1, ap-southeast-2): $0.20 per million
#: requests, $0.0000133334 per GB-second (the AWS pricing-page feed as QuinnyPig/aws-price-watcher
#: processed/lambda.json stores it, "Lambda Requests-ARM" / "Lambda Duration-ARM")
REQUEST_USD_PER_MILLION = Decimal("0.2")
GB_SECOND_USD = Decimal("0.0000133334")


def _one(result, token):
    found = result.of_type(token)
    assert len(found) == 1, [r.name for r in found]
    return found[0]


@pytest.fixture(scope="module")
def spot():
    spec = make_spec("p4d.24xlarge", nodes=2, spot=True, cloud="aws")
    return spec, preview(spec)


def test_spot_stack_has_the_rule_the_function_and_the_invoke_permission(spot):
    spec, result = spot
    rule = _one(result, RULE)
    # the event EC2 emits two minutes before a Spot interruption (spot-instance-termination-notices.html)
    assert json.loads(rule.inputs["eventPattern"]) == {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Spot Instance Interruption Warning"],
    }
    assert "eventBusName" not in rule.inputs  # the default bus, where EC2's events arrive
    function = _one(result, FUNCTION)
    target = _one(result, TARGET)
    assert target.inputs == {
        "rule": rule.name,
        "arn": f"arn:aws:lambda:{spec.region}:{PREVIEW_ACCOUNT}:function:{function.name}",
    }
    permission = _one(result, PERMISSION)
    assert permission.inputs == {
        "action": "lambda:InvokeFunction",
        "function": function.name,
        "principal": "events.amazonaws.com",
        "sourceArn": f"arn:aws:events:{spec.region}:{PREVIEW_ACCOUNT}:rule/{rule.name}",  # only this rule
    }
    assert _one(result, RETRIES).inputs == {
        "functionName": function.name,
        "maximumRetryAttempts": 2,
        "maximumEventAgeInSeconds": 600,
    }
    fn = function.inputs
    assert (fn["runtime"], fn["architectures"], fn["handler"], fn["memorySize"], fn["timeout"]) == (
        "python3.12",
        ["arm64"],
        "index.handler",
        128,
        60,
    )
    lt = next(r for r in result.resources if r.type == "aws:ec2/launchTemplate:LaunchTemplate")
    assert fn["environment"]["variables"] == {
        "GPUINFRA_STACK_ID": f"{spec.stack}-{spec.name_suffix}",
        "GPUINFRA_STACK_ID_TAG": "gpuinfra:stack-id",
        "GPUINFRA_NODES": "2",
        "GPUINFRA_EXPIRES_AT": spec.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "GPUINFRA_MIN_SECONDS_LEFT": "3600",
        "GPUINFRA_LAUNCH_TEMPLATE_ID": f"{lt.name}-id",
        "GPUINFRA_LAUNCH_TEMPLATE_VERSION": "1",
        "GPUINFRA_SPOT_MAX_PRICE": ""
        if spec.spot_max_price_per_hour_usd is None
        else format(spec.spot_max_price_per_hour_usd, "f"),
    }
    role = next(r for r in result.of_type(ROLE) if r.name.endswith("-replace-role"))
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"] == [
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ]
    assert fn["role"] == f"arn:aws:iam::{PREVIEW_ACCOUNT}:role/{role.name}"
    backstop = next(r for r in result.resources if r.name.endswith("-replace-backstop"))
    fleet_backstop = next(r for r in result.resources if r.name.endswith("-ttl-backstop"))
    # at the fleet backstop's time, the function with the end event; its role may invoke only it
    assert backstop.inputs["scheduleExpression"] == fleet_backstop.inputs["scheduleExpression"]
    assert backstop.inputs["target"]["arn"] == target.inputs["arn"]
    assert json.loads(backstop.inputs["target"]["input"]) == {"gpuinfra-action": "end"}
    invoke = next(r for r in result.of_type(ROLE_POLICY) if r.name.endswith("-replace-backstop-invoke"))
    assert json.loads(invoke.inputs["policy"])["Statement"] == [
        {
            "Sid": "InvokeTheReplacementFunction",
            "Effect": "Allow",
            "Action": "lambda:InvokeFunction",
            "Resource": target.inputs["arn"],
        }
    ]
    for resource in (rule, function, role):
        assert resource.inputs["tags"]["gpuinfra:stack-id"] == f"{spec.stack}-{spec.name_suffix}"


@pytest.mark.parametrize(
    "kw",
    [
        {"instance_type": "p5.48xlarge", "nodes": 2},  # on demand: EC2 warns before no loss
        {"instance_type": "a2-highgpu-8g", "nodes": 2, "spot": True, "cloud": "gcp"},  # the MIG repairs
    ],
)
def test_no_replacement_function_where_nothing_warns_or_the_cloud_replaces(kw):
    result = preview(make_spec(**kw))
    assert not [r for r in result.resources if r.type in (RULE, TARGET, FUNCTION, PERMISSION, RETRIES)]


def _policy(result) -> dict:
    return json.loads(
        next(r for r in result.of_type(ROLE_POLICY) if r.name.endswith("-replace-launch")).inputs["policy"]
    )


def test_the_functions_permissions_are_exactly_these_statements(spot):
    spec, result = spot
    ec2 = f"arn:aws:ec2:{spec.region}:{PREVIEW_ACCOUNT}"
    lt = next(r for r in result.resources if r.type == "aws:ec2/launchTemplate:LaunchTemplate")
    lt_arn = f"{ec2}:launch-template/{lt.name}-id"
    node_role = next(r for r in result.of_type(ROLE) if r.name.endswith("-node-role"))
    assert _policy(result)["Statement"] == [
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
                lt_arn,
                f"arn:aws:ec2:{spec.region}::image/*",
            ],
            "Condition": {"ArnLike": {"ec2:LaunchTemplate": lt_arn}},
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
            "Condition": {"StringEquals": {"aws:ResourceTag/gpuinfra:stack-id": f"{spec.stack}-{spec.name_suffix}"}},
        },
        {
            "Sid": "CreateTheSpotServiceLinkedRoleIfMissing",
            "Effect": "Allow",
            "Action": "iam:CreateServiceLinkedRole",
            "Resource": f"arn:aws:iam::{PREVIEW_ACCOUNT}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot",
            "Condition": {"StringEquals": {"iam:AWSServiceName": "spot.amazonaws.com"}},
        },
        {
            "Sid": "PassTheNodeRoleToEc2",
            "Effect": "Allow",
            "Action": "iam:PassRole",
            "Resource": f"arn:aws:iam::{PREVIEW_ACCOUNT}:role/{node_role.name}",
            "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
        },
    ]


def test_the_policy_allows_only_this_stacks_launch(spot):
    """IAM's evaluation (tests/blueprints/iam_policy.py) of what the function may and may not do."""
    spec, result = spot
    doc = _policy(result)
    ec2 = f"arn:aws:ec2:{spec.region}:{PREVIEW_ACCOUNT}"
    lt = next(r for r in result.resources if r.type == "aws:ec2/launchTemplate:LaunchTemplate")
    mine = {"ec2:LaunchTemplate": f"{ec2}:launch-template/{lt.name}-id"}
    other = {"ec2:LaunchTemplate": f"{ec2}:launch-template/lt-0another0stack"}
    node_role = next(r for r in result.of_type(ROLE) if r.name.endswith("-node-role"))
    cases = [
        ("ec2:RunInstances", f"{ec2}:instance/i-new", mine, Decision.ALLOW),
        ("ec2:RunInstances", f"{ec2}:instance/i-new", other, Decision.IMPLICIT_DENY),  # another stack's template
        ("ec2:RunInstances", f"{ec2}:instance/i-new", {}, Decision.IMPLICIT_DENY),  # no template at all
        ("ec2:RunInstances", f"arn:aws:ec2:eu-north-1:{PREVIEW_ACCOUNT}:instance/i-new", mine, Decision.IMPLICIT_DENY),
        ("ec2:CreateTags", f"{ec2}:instance/i-new", {"ec2:CreateAction": "RunInstances"}, Decision.ALLOW),
        ("ec2:CreateTags", f"{ec2}:instance/i-0running", {}, Decision.IMPLICIT_DENY),  # retagging a live node
        ("ec2:TerminateInstances", f"{ec2}:instance/i-0running", {}, Decision.IMPLICIT_DENY),
        ("ec2:TerminateInstances", f"{ec2}:instance/i-0mine", {"aws:ResourceTag/gpuinfra:stack-id": f"{spec.stack}-{spec.name_suffix}"}, Decision.ALLOW),
        ("ec2:TerminateInstances", f"{ec2}:instance/i-0other", {"aws:ResourceTag/gpuinfra:stack-id": f"{spec.stack}-zz9zz9"}, Decision.IMPLICIT_DENY),
        ("iam:PassRole", f"arn:aws:iam::{PREVIEW_ACCOUNT}:role/{node_role.name}", {"iam:PassedToService": "ec2.amazonaws.com"}, Decision.ALLOW),
        ("iam:PassRole", f"arn:aws:iam::{PREVIEW_ACCOUNT}:role/{node_role.name}", {"iam:PassedToService": "lambda.amazonaws.com"}, Decision.IMPLICIT_DENY),
        ("iam:PassRole", f"arn:aws:iam::{PREVIEW_ACCOUNT}:role/admin", {"iam:PassedToService": "ec2.amazonaws.com"}, Decision.IMPLICIT_DENY),
        # a Spot launch through the API needs AWSServiceRoleForEC2Spot (service-linked-roles-spot-instance-requests.html)
        ("iam:CreateServiceLinkedRole", f"arn:aws:iam::{PREVIEW_ACCOUNT}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot", {"iam:AWSServiceName": "spot.amazonaws.com"}, Decision.ALLOW),
        ("iam:CreateServiceLinkedRole", f"arn:aws:iam::{PREVIEW_ACCOUNT}:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling", {"iam:AWSServiceName": "autoscaling.amazonaws.com"}, Decision.IMPLICIT_DENY),
    ]  # fmt: skip
    for action, resource, context, want in cases:
        assert evaluate([doc], action, resource, context) == want, (action, resource, context)


def _lines(result, region, resources=None):
    est = estimate(resources or result.resources, load_catalog(), region, USAGE, Decimal(24))
    return est, [line for line in est.lines if line.resource_type == FUNCTION]


def test_cost_prices_the_function_and_lists_the_rest_as_free(spot):
    spec, result = spot
    est, lines = _lines(result, spec.region)
    # (2 nodes x 1 interruption + 1 backstop call) x (1 + 2 retries) = 9 invocations, once per 24 h run
    requests, duration = lines
    assert (requests.component, requests.unit, requests.one_time) == (
        "Lambda requests (Spot replacement)",
        "million requests",
        True,
    )
    assert requests.hourly_quantity == Decimal(9) / Decimal(1_000_000) / 24
    assert requests.unit_price_usd == REQUEST_USD_PER_MILLION
    assert duration.unit == "GB-seconds"
    assert duration.hourly_quantity == Decimal(9) * Decimal(128) / 1024 * 60 / 24  # whole 60 s timeout, 0.125 GB
    # the backstop schedule itself is one EventBridge Scheduler invocation, priced as the fleet's
    schedule = next(r for r in result.resources if r.name.endswith("-replace-backstop"))
    (scheduler_line,) = [line for line in est.lines if line.resource == schedule.name]
    assert scheduler_line.unit_price_usd is not None and scheduler_line.one_time
    assert duration.unit_price_usd == GB_SECOND_USD
    assert "lambda.json" in requests.source and "Lambda Requests-ARM" in requests.source
    names = {r.name for r in result.resources if r.type in (RULE, TARGET, PERMISSION, RETRIES)}
    assert names <= set(est.free) and len(names) == 4
    assert not [n for n in est.not_priced if n[1] in (RULE, TARGET, FUNCTION, PERMISSION, RETRIES)]


def test_cost_fails_closed_without_a_price(spot):
    spec, result = spot
    _est, lines = _lines(result, "il-central-1")  # no Lambda price in the table there
    assert [line.unit_price_usd for line in lines] == [None, None]
    resources = []
    for r in result.resources:
        if r.type == FUNCTION:
            r = dataclasses.replace(r, inputs={**r.inputs, "architectures": ["x86_64"]})
        resources.append(r)
    _est, lines = _lines(result, spec.region, resources=resources)  # only arm64 prices are in the table
    assert [line.unit_price_usd for line in lines] == [None, None]
    assert "no Lambda price for architecture ['x86_64']" in lines[0].source


# -- the function, against moto's EC2 (in process) -------------------------------------------------

STACK_ID = "train-ab12cd"


@pytest.fixture
def ec2(monkeypatch):
    moto = pytest.importorskip("moto")
    import boto3

    for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(var, value)
    with moto.mock_aws():
        client = boto3.client("ec2", region_name="us-east-1")
        image = client.describe_images()["Images"][0]["ImageId"]
        lt = client.create_launch_template(
            LaunchTemplateName="train-lt", LaunchTemplateData={"ImageId": image, "InstanceType": "p4d.24xlarge"}
        )["LaunchTemplate"]
        env = {
            "GPUINFRA_STACK_ID": STACK_ID,
            "GPUINFRA_STACK_ID_TAG": "gpuinfra:stack-id",
            "GPUINFRA_NODES": "2",
            "GPUINFRA_EXPIRES_AT": (datetime.now(UTC) + timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "GPUINFRA_MIN_SECONDS_LEFT": "3600",
            "GPUINFRA_LAUNCH_TEMPLATE_ID": lt["LaunchTemplateId"],
            "GPUINFRA_LAUNCH_TEMPLATE_VERSION": "1",
            "GPUINFRA_SPOT_MAX_PRICE": "12.5",
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        yield client, image


def _node(client, image, stack_id=STACK_ID, extra=()):
    tags = [{"Key": "gpuinfra:stack-id", "Value": stack_id}, {"Key": "gpuinfra:deployment", "Value": "d1"}, *extra]
    out = client.run_instances(
        ImageId=image, MinCount=1, MaxCount=1, TagSpecifications=[{"ResourceType": "instance", "Tags": tags}]
    )
    return out["Instances"][0]["InstanceId"]


def _warning(instance_id):
    return {
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "detail": {"instance-id": instance_id, "instance-action": "terminate"},
    }


def _tags(client, instance_id):
    found = client.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return {t["Key"]: t["Value"] for t in found.get("Tags") or []}, found


def test_function_replaces_an_interrupted_node_of_its_stack(ec2):
    client, image = ec2
    lost, kept = _node(client, image), _node(client, image)
    out = replace_function.handler(_warning(lost), None, client)
    assert out["replaces"] == lost and out["replacement"] not in (lost, kept)
    tags, new = _tags(client, out["replacement"])
    # the lost node's tags (peer discovery selects on stack id and deployment) plus the record;
    # EC2 adds its own aws:ec2launchtemplate:* tags to an instance launched from a template
    assert {k: v for k, v in tags.items() if not k.startswith("aws:")} == {
        "gpuinfra:stack-id": STACK_ID,
        "gpuinfra:deployment": "d1",
        "gpuinfra:replaces": lost,
    }
    assert new.get("InstanceLifecycle") == "spot"
    # the same event again (Lambda may deliver it twice): the stack has its 2 nodes besides the lost one
    again = replace_function.handler(_warning(lost), None, client)
    assert again == {"skipped": "2 live nodes besides it already (of 2): replaced before", "replaces": lost}


def test_function_leaves_other_stacks_and_ending_stacks_alone(ec2, monkeypatch):
    client, image = ec2
    stranger = _node(client, image, stack_id="other-zz9zz9")
    before = len(client.describe_instances()["Reservations"])
    assert replace_function.handler(_warning(stranger), None, client)["skipped"] == "not a node of this stack"
    lost = _node(client, image)
    soon = (datetime.now(UTC) + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    monkeypatch.setenv("GPUINFRA_EXPIRES_AT", soon)
    assert replace_function.handler(_warning(lost), None, client)["skipped"].endswith("under 3600 s away")
    assert replace_function.handler({"detail": {}}, None, client) == {"skipped": "no instance id in the event"}
    assert len(client.describe_instances()["Reservations"]) == before + 1  # only `lost`: nothing launched


def test_down_ends_the_replacements_the_fleet_does_not_know(ec2, monkeypatch):
    """A replacement is not in the instant fleet, so deleting the fleet would leave it billing:
    ``down`` lists it by this stack's id tag and the replaces tag, and terminates it with the rest."""
    from types import SimpleNamespace

    from gpuinfra import teardown

    client, image = ec2
    spec = make_spec("p4d.24xlarge", nodes=2, spot=True, cloud="aws")
    sid = f"{spec.stack}-{spec.name_suffix}"
    fleet = [_node(client, image, stack_id=sid), _node(client, image, stack_id=sid)]
    replacement = _node(client, image, stack_id=sid, extra=[{"Key": "gpuinfra:replaces", "Value": fleet[0]}])
    stranger = _node(client, image, stack_id="other-zz9zz9", extra=[{"Key": "gpuinfra:replaces", "Value": "i-1"}])
    clients = SimpleNamespace(ec2=client)
    listed = [n.name for n in teardown.list_nodes(spec, {"instance_ids": fleet}, clients)]
    assert sorted(listed) == sorted([*fleet, replacement])
    monkeypatch.setattr(teardown, "wait_seconds", lambda _s: None)
    assert teardown.end_nodes_and_wait(spec, {"instance_ids": fleet}, clients) == []
    states = {
        i["InstanceId"]: i["State"]["Name"] for r in client.describe_instances()["Reservations"] for i in r["Instances"]
    }
    assert {states[i] for i in [*fleet, replacement]} == {"terminated"} and states[stranger] == "running"
    on_demand = make_spec("p4d.24xlarge", nodes=2, cloud="aws")  # no replacement function: fleet ids only
    assert [n.name for n in teardown.list_nodes(on_demand, {"instance_ids": fleet[1:]}, clients)] == fleet[1:]


def test_the_backstop_call_ends_only_this_stacks_replacements(ec2):
    """The fleet backstop deletes the fleet, which ends its own nodes only: at the same time the
    schedule's end event makes the function terminate the replacements, and nothing else."""
    client, image = ec2
    fleet_node = _node(client, image)
    replacement = _node(client, image, extra=[{"Key": "gpuinfra:replaces", "Value": "i-0gone"}])
    stranger = _node(client, image, stack_id="other-zz9zz9", extra=[{"Key": "gpuinfra:replaces", "Value": "i-1"}])
    assert replace_function.handler({"gpuinfra-action": "end"}, None, client) == {"ended": [replacement]}
    states = {
        i["InstanceId"]: i["State"]["Name"] for r in client.describe_instances()["Reservations"] for i in r["Instances"]
    }
    assert (states[replacement], states[fleet_node], states[stranger]) == ("terminated", "running", "running")
