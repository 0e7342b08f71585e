"""Least privilege of the nodes, evaluated rather than string-compared.

AWS: the node role's and the TTL backstop role's inline policies, as the offline preview renders
them, go through an IAM policy evaluator (:mod:`tests.blueprints.iam_policy`) with lists of
requests that must be allowed (what the SSM Agent, the CloudWatch agent, the node agent and the
backstop call) and must be denied (other stacks' and the account's parameters, SecureStrings
under ``/aws/``, other stacks' fleets and nodes). GCP: the node role's IAM condition is evaluated
with cel-python against this stack's group and VMs and against a stack whose names share the
prefix (``exp`` vs ``exp-node-2``, vs ``exp-<suffix>-node-2``, vs ``exp`` with another suffix),
and a hypothesis test checks that no other (stack name, suffix) has a group or VM name under
this group's prefix. The evaluator (:mod:`tests.iam_cel`) fails on a function IAM does not document.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuinfra.monitoring.metrics import aws_agent_parameter_name, aws_namespace
from gpuinfra.plan.boot_gcp import node_prefix
from gpuinfra.plan.naming import AWS_STACK_ID_TAG, stack_id
from gpuinfra.plan.node_bundle import bundle_key
from gpuinfra.preview import PREVIEW_ACCOUNT
from tests.blueprints.helpers import make_spec, preview
from tests.blueprints.iam_policy import Decision, evaluate
from tests.iam_cel import resource_allowed as cel_true

ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
OTHER_ACCOUNT = "210987654321"


def role_documents(result, role_id: str) -> list[dict]:
    return [json.loads(p.inputs["policy"]) for p in result.of_type(ROLE_POLICY) if p.inputs["role"] == role_id]


@pytest.fixture(scope="module")
def aws_stack():
    spec = make_spec("p5.48xlarge", nodes=2, stack="exp", profile_updates={"monitoring": {"enabled": True}})
    return spec, preview(spec)


def ssm_parameter(region: str, account: str, name: str) -> str:
    """ARN of a hierarchical SSM parameter (docs.aws.amazon.com/systems-manager/latest/userguide/
    sysman-paramstore-access.html: ``arn:aws:ssm:<region>:<account>:parameter/Dev/...``)."""
    return f"arn:aws:ssm:{region}:{account}:parameter{name}"


def node_requests(spec, bucket_arn: str) -> tuple[list[tuple], list[tuple]]:
    """(must allow, must deny): (action, resource, context) each."""
    region, account = spec.region, PREVIEW_ACCOUNT
    own = stack_id(spec)  # the stack's name and its random suffix, as in every physical name
    own_parameter = ssm_parameter(region, account, aws_agent_parameter_name(own))
    bundle = bundle_key("0" * 64)
    instance = f"arn:aws:ec2:{region}:{account}:instance/i-0123456789abcdef0"
    secrets = f"arn:aws:secretsmanager:{region}:{account}"  # + :secret:<name>-<6 random characters>
    allow = [
        # SSM Agent: registration, Session Manager channels, Run Command messages
        # (docs.aws.amazon.com/systems-manager/latest/userguide/getting-started-create-iam-instance-profile.html)
        ("ssm:UpdateInstanceInformation", instance, {}),
        *((f"ssmmessages:{a}", "*", {}) for a in ("CreateControlChannel", "CreateDataChannel")),
        *((f"ssmmessages:{a}", "*", {}) for a in ("OpenControlChannel", "OpenDataChannel")),
        *(
            (f"ec2messages:{a}", "*", {})
            for a in ("AcknowledgeMessage", "DeleteMessage", "FailMessage", "GetEndpoint", "GetMessages", "SendReply")
        ),
        # CloudWatch agent: its configuration, its metrics
        ("ssm:GetParameter", own_parameter, {}),
        ("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": aws_namespace(own)}),
        # node agent, health gate, peer discovery
        ("s3:ListBucket", bucket_arn, {}),
        ("s3:GetObject", f"{bucket_arn}/{bundle}", {}),
        ("s3:PutObject", f"{bucket_arn}/checkpoints/{spec.stack}/rank-0/LATEST", {}),
        ("s3:PutObject", f"{bucket_arn}/health/{spec.stack}/i-0123.json", {}),
        ("ec2:DescribeInstances", "*", {}),
        # the job's secrets by reference (gpuinfra run --secret): the stack's own names
        # (by the stack id: a stack of the same name in another project folder has another)
        ("ssm:GetParameter", ssm_parameter(region, account, f"/gpuinfra/{own}/job/hf-token"), {}),
        ("secretsmanager:GetSecretValue", f"{secrets}:secret:gpuinfra/{own}/job/db-AbCdEf", {}),
    ]
    other = f"{own}-node-2"  # a stack whose names start with this one's
    deny = [
        # another stack's, another region's, another account's configuration parameter
        ("ssm:GetParameter", ssm_parameter(region, account, aws_agent_parameter_name(other)), {}),
        ("ssm:GetParameter", ssm_parameter("eu-west-1", account, aws_agent_parameter_name(own)), {}),
        ("ssm:GetParameter", ssm_parameter(region, OTHER_ACCOUNT, aws_agent_parameter_name(own)), {}),
        ("ssm:GetParameter", own_parameter + "-x", {}),
        # the account's secrets: SecureStrings, Secrets Manager references, public parameters
        ("ssm:GetParameter", ssm_parameter(region, account, "/prod/db/password"), {}),
        ("ssm:GetParameter", ssm_parameter(region, account, "/aws/reference/secretsmanager/prod-db"), {}),
        ("ssm:GetParameter", f"arn:aws:ssm:{region}::parameter/aws/service/ami-amazon-linux-latest/x", {}),
        ("ssm:GetParameters", own_parameter, {}),
        ("ssm:GetParametersByPath", ssm_parameter(region, account, "/gpuinfra"), {}),
        ("ssm:PutParameter", own_parameter, {}),
        ("ssm:DescribeParameters", "*", {}),
        ("kms:Decrypt", f"arn:aws:kms:{region}:{account}:key/1234abcd-12ab-34cd-56ef-1234567890ab", {}),
        ("secretsmanager:GetSecretValue", f"arn:aws:secretsmanager:{region}:{account}:secret:prod-db", {}),
        # another stack's job secrets, even one whose name starts with this one's
        ("ssm:GetParameter", ssm_parameter(region, account, f"/gpuinfra/{other}/job/hf-token"), {}),
        ("ssm:GetParameter", ssm_parameter(region, account, f"/gpuinfra/{own}/job"), {}),
        ("secretsmanager:GetSecretValue", f"{secrets}:secret:gpuinfra/{other}/job/db-AbCdEf", {}),
        (
            "secretsmanager:GetSecretValue",
            f"arn:aws:secretsmanager:eu-west-1:{account}:secret:gpuinfra/{own}/job/db-AbCdEf",
            {},
        ),
        # the same stack name in another project folder (another suffix), and the name-scoped
        # names of before
        ("ssm:GetParameter", ssm_parameter(region, account, f"/gpuinfra/{spec.stack}-zzzzzz/job/hf-token"), {}),
        ("secretsmanager:GetSecretValue", f"{secrets}:secret:gpuinfra/{spec.stack}/db-AbCdEf", {}),
        # reaching other nodes through SSM, State Manager documents
        ("ssm:SendCommand", instance, {}),
        ("ssm:StartSession", instance, {}),
        ("ssm:GetDocument", f"arn:aws:ssm:{region}:{account}:document/AWS-RunShellScript", {}),
        # metrics elsewhere, writes to the bundle, deleting object versions, other buckets
        ("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": aws_namespace(other)}),
        ("cloudwatch:PutMetricData", "*", {}),
        ("s3:PutObject", f"{bucket_arn}/{bundle}", {}),
        ("s3:DeleteObjectVersion", f"{bucket_arn}/checkpoints/{spec.stack}/rank-0/LATEST", {}),
        ("s3:GetObject", "arn:aws:s3:::another-bucket/x", {}),
        ("ec2:TerminateInstances", instance, {}),
        ("iam:PassRole", f"arn:aws:iam::{account}:role/admin", {}),
    ]
    return allow, deny


def test_node_role_has_no_managed_policy(aws_stack):
    """AmazonSSMManagedInstanceCore grants ssm:GetParameter(s) on every parameter
    (docs.aws.amazon.com/aws-managed-policy/latest/reference/AmazonSSMManagedInstanceCore.html);
    a managed policy cannot be evaluated here, so the node role carries none."""
    _, result = aws_stack
    assert [a.inputs for a in result.of_type(ATTACHMENT) if a.inputs["role"].startswith("exp-node")] == []


def test_node_role_allows_what_the_node_calls_and_nothing_of_other_stacks(aws_stack):
    spec, result = aws_stack
    documents = role_documents(result, "exp-node-role-id")
    assert len(documents) == 4  # SSM agent, bucket, monitoring, the job's secrets
    (bucket,) = result.of_type("aws:s3/bucket:Bucket")
    bucket_arn = f"arn:aws:s3:::{bucket.inputs['bucketPrefix']}0000preview"  # the offline preview's name
    allow, deny = node_requests(spec, bucket_arn)
    wrong = [(a, r, c) for a, r, c in allow if evaluate(documents, a, r, c) is not Decision.ALLOW]
    wrong += [(a, r, c) for a, r, c in deny if evaluate(documents, a, r, c) is Decision.ALLOW]
    assert wrong == []


def test_node_role_without_monitoring_reads_no_parameter():
    spec = make_spec("p5.48xlarge", nodes=1, stack="exp", profile_updates={"monitoring": {"enabled": False}})
    documents = role_documents(preview(spec), "exp-node-role-id")
    own = ssm_parameter(spec.region, PREVIEW_ACCOUNT, aws_agent_parameter_name(stack_id(spec)))
    assert evaluate(documents, "ssm:GetParameter", own) is Decision.IMPLICIT_DENY
    assert evaluate(documents, "ssm:UpdateInstanceInformation", "*") is Decision.ALLOW


def test_backstop_role_deletes_its_fleet_and_terminates_its_nodes_only(aws_stack):
    spec, result = aws_stack
    documents = role_documents(result, "exp-backstop-role-id")
    (fleet_arn,) = [s["Resource"] for d in documents for s in d["Statement"] if s["Action"] == "ec2:DeleteFleets"]
    region, account = spec.region, PREVIEW_ACCOUNT
    instance = f"arn:aws:ec2:{region}:{account}:instance/i-0123456789abcdef0"
    own_tag = {f"aws:ResourceTag/{AWS_STACK_ID_TAG}": stack_id(spec)}
    assert evaluate(documents, "ec2:DeleteFleets", fleet_arn) is Decision.ALLOW
    assert evaluate(documents, "ec2:TerminateInstances", instance, own_tag) is Decision.ALLOW
    denied = [
        ("ec2:DeleteFleets", f"arn:aws:ec2:{region}:{account}:fleet/fleet-0123", {}),
        ("ec2:TerminateInstances", instance, {f"aws:ResourceTag/{AWS_STACK_ID_TAG}": f"{stack_id(spec)}-node-2"}),
        # a same-named stack of another project folder: same stack tag, another stack id
        ("ec2:TerminateInstances", instance, {"aws:ResourceTag/gpuinfra:stack": spec.stack}),
        ("ec2:TerminateInstances", instance, {}),  # an untagged instance
        ("ec2:TerminateInstances", f"arn:aws:ec2:eu-west-1:{account}:instance/i-0123456789abcdef0", own_tag),
        ("ec2:StopInstances", instance, own_tag),
        ("ec2:RunInstances", instance, own_tag),
        ("iam:PassRole", f"arn:aws:iam::{account}:role/admin", {}),
    ]
    assert [d for d in denied if evaluate(documents, *d) is Decision.ALLOW] == []
    # no statement of either role is left on "*" where the action has a resource type
    for document in documents:
        assert all(s["Resource"] != "*" for s in document["Statement"])


def test_rendered_policies_are_valid_iam_documents(aws_stack):
    """Every inline policy passes moto's IAM policy document validator (the grammar checks IAM
    applies on PutRolePolicy: Version, Effect, action ``service:Name`` form, resource ARN form), so
    the evaluations above judge documents IAM would accept."""
    from moto.iam.policy_validation import IAMPolicyDocumentValidator

    _, result = aws_stack
    for policy in result.of_type(ROLE_POLICY):
        IAMPolicyDocumentValidator(policy.inputs["policy"]).validate()


# --- the evaluator itself, on the documented rules it relies on --------------------------------
def test_evaluator_follows_the_documented_rules():
    """docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html: an
    explicit deny wins; no allow is an implicit deny; a condition key missing from the request
    does not match; ``?`` is one character; actions are case-insensitive, ARNs are not."""
    allow = {"Effect": "Allow", "Action": "s3:Get*", "Resource": "arn:aws:s3:::b/k?"}
    deny = {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/k2"}
    doc = {"Statement": [allow, deny]}
    assert evaluate([doc], "s3:getobject", "arn:aws:s3:::b/k1") is Decision.ALLOW
    assert evaluate([doc], "s3:GetObject", "arn:aws:s3:::b/k2") is Decision.EXPLICIT_DENY
    assert evaluate([doc], "s3:GetObject", "arn:aws:s3:::b/k10") is Decision.IMPLICIT_DENY
    assert evaluate([doc], "s3:GetObject", "arn:aws:s3:::B/k1") is Decision.IMPLICIT_DENY
    conditional = {"Statement": [{**allow, "Condition": {"StringEquals": {"aws:ResourceTag/x": "y"}}}]}
    assert evaluate([conditional], "s3:GetObject", "arn:aws:s3:::b/k1") is Decision.IMPLICIT_DENY
    assert evaluate([conditional], "s3:GetObject", "arn:aws:s3:::b/k1", {"aws:resourcetag/x": "y"}) is Decision.ALLOW
    not_resource = {"Statement": [{"Effect": "Deny", "Action": "*", "NotResource": "arn:aws:s3:::b/*"}, allow]}
    assert evaluate([not_resource], "s3:GetObject", "arn:aws:s3:::c/k1") is Decision.EXPLICIT_DENY
    with pytest.raises(NotImplementedError):
        evaluate(
            [{"Statement": [{**allow, "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}]}],
            "s3:GetObject",
            "arn:aws:s3:::b/k1",
        )


# --- GCP: the node role's condition ------------------------------------------------------------
def test_the_evaluator_refuses_what_iam_refuses():
    # IAM documents startsWith / endsWith / extract for resource.name; cel-python runs all of CEL
    for expression in (
        'resource.name.matches("^a$")',
        'resource.name.contains("a")',
        "size(resource.name) == 1",
        'resource.type.startsWith("a")',  # documented on resource.name only
    ):
        with pytest.raises(AssertionError, match="IAM conditions do not document"):
            cel_true(expression, "t", "a")
    assert cel_true('resource.name.startsWith("a") && resource.name.endsWith("a")', "t", "a")
    with pytest.raises(AssertionError, match="over 12 logical operators"):
        cel_true(" || ".join(['resource.name == "a"'] * 14), "t", "a")


INSTANCE_TYPE, MIG_TYPE = "compute.googleapis.com/Instance", "compute.googleapis.com/InstanceGroupManager"


def gcp_condition(stack: str):
    spec = make_spec("a2-highgpu-8g", nodes=2, cloud="gcp", stack=stack)
    result = preview(spec)
    (binding,) = [
        r.inputs for r in result.of_type("gcp:projects/iAMMember:IAMMember") if r.name.endswith("node-role-binding")
    ]
    (mig,) = result.of_type("gcp:compute/instanceGroupManager:InstanceGroupManager")
    zone_path = f"projects/{mig.inputs.get('project', 'gpuinfra-preview')}/zones/{spec.zone}"
    return spec, binding["condition"]["expression"], zone_path, mig.inputs


@pytest.mark.parametrize("own", ["exp", "llm", "a-b"])
def test_gcp_node_role_covers_its_own_group_only(own):
    spec, expression, zone_path, mig = gcp_condition(own)
    group = node_prefix(spec)
    assert mig["name"] == mig["baseInstanceName"] == group  # the condition's names are the MIG's
    suffix = spec.name_suffix
    # stacks whose names a bare prefix condition would confuse with this one: a longer name, the
    # same name with another suffix, names chosen to start with this stack's group or id
    others = [f"{own}-node-2", f"{own}s", f"{own}-{suffix}", f"{own}-{suffix}-node-2", f"{group}-b", f"{group}s"]
    other_groups = [node_prefix(spec.model_copy(update={"stack": name})) for name in others]
    other_groups.append(node_prefix(spec.model_copy(update={"name_suffix": "zz9zz9"})))
    allowed = [
        (MIG_TYPE, f"{zone_path}/instanceGroupManagers/{group}"),
        (INSTANCE_TYPE, f"{zone_path}/instances/{group}-x7q2"),  # a MIG VM: base name, '-', 4 chars
        (INSTANCE_TYPE, f"{zone_path}/instances/{group}-0a9z"),
    ]
    denied = [
        *[(MIG_TYPE, f"{zone_path}/instanceGroupManagers/{other}") for other in other_groups],
        *[(INSTANCE_TYPE, f"{zone_path}/instances/{other}-x7q2") for other in other_groups],
        (MIG_TYPE, f"{zone_path}/instanceGroupManagers/{group}-x7q2"),
        (MIG_TYPE, f"{zone_path}/instances/{group}-x7q2"),  # a VM's name with the group's type
        (INSTANCE_TYPE, f"{zone_path}/instances/{group}"),
        (INSTANCE_TYPE, f"x/{zone_path}/instances/{group}-x7q2"),
        (INSTANCE_TYPE, f"projects/other-project/zones/{spec.zone}/instances/{group}-x7q2"),
        (INSTANCE_TYPE, f"{zone_path.rsplit('/', 1)[0]}/us-west1-b/instances/{group}-x7q2"),
        ("compute.googleapis.com/Disk", f"{zone_path}/disks/{group}-x7q2"),
        (
            "compute.googleapis.com/InstanceTemplate",
            f"{zone_path.split('/zones/')[0]}/global/instanceTemplates/{group}",
        ),
        ("storage.googleapis.com/Bucket", f"projects/_/buckets/{group}"),
    ]
    assert [r for r in allowed if not cel_true(expression, *r)] == []
    assert [r for r in denied if cel_true(expression, *r)] == []


_STACK_NAMES = st.from_regex(r"[a-z](?:[-a-z0-9]{0,25}[a-z0-9])?", fullmatch=True).filter(lambda n: "--" not in n)
_SUFFIXES = st.from_regex(r"[a-z0-9]{6}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(a=st.tuples(_STACK_NAMES, _SUFFIXES), b=st.tuples(_STACK_NAMES, _SUFFIXES), vm=_SUFFIXES)
def test_no_other_stack_has_a_vm_or_group_name_under_this_groups_prefix(a, b, vm):
    # the node role grants <zone>/instances/<group>- by prefix (IAM's CEL has no anchored match):
    # that is exact only if no other (stack name, suffix) yields a group or VM name under it
    from gpuinfra.plan.naming import gcp_group_name

    base = make_spec("a2-highgpu-8g", nodes=2, cloud="gcp", stack="base")
    group_a = gcp_group_name(base.model_copy(update={"stack": a[0], "name_suffix": a[1]}))
    group_b = gcp_group_name(base.model_copy(update={"stack": b[0], "name_suffix": b[1]}))
    if a != b:
        assert not f"{group_b}-{vm[:4]}".startswith(f"{group_a}-")
        assert not group_b.startswith(f"{group_a}-")


SECRET_TYPE, VERSION_TYPE = "secretmanager.googleapis.com/Secret", "secretmanager.googleapis.com/SecretVersion"


def test_gcp_nodes_read_their_own_stacks_job_secrets_only():
    """``gpuinfra run --secret`` on GCP: the node account gets Secret Accessor at project level
    with a condition on the secret's ``resource.name`` (``projects/<number>/secrets/<id>``), so it
    reads ``gpuinfra-<stack id>_*`` and no other secret, not another stack's even when its id
    starts with this one's."""
    from gpuinfra.preview import PREVIEW_PROJECT_NUMBER

    spec = make_spec("a2-highgpu-8g", nodes=2, cloud="gcp", stack="exp")
    result = preview(spec)
    (binding,) = [
        r.inputs for r in result.of_type("gcp:projects/iAMMember:IAMMember") if r.name.endswith("node-job-secrets")
    ]
    assert binding["role"] == "roles/secretmanager.secretAccessor"
    assert binding["member"].startswith("serviceAccount:")
    expression = binding["condition"]["expression"]
    own, project = stack_id(spec), f"projects/{PREVIEW_PROJECT_NUMBER}"
    allowed = [
        (SECRET_TYPE, f"{project}/secrets/gpuinfra-{own}_hf-token"),
        (VERSION_TYPE, f"{project}/secrets/gpuinfra-{own}_hf-token/versions/3"),
    ]
    denied = [
        (SECRET_TYPE, f"{project}/secrets/prod-db"),
        (SECRET_TYPE, f"{project}/secrets/gpuinfra-{own}-x-d4e5f6_hf-token"),  # stack exp-<suffix>-x
        (SECRET_TYPE, f"{project}/secrets/gpuinfra-exp-zzzzzz_hf-token"),  # same name, another folder
        (SECRET_TYPE, f"{project}/secrets/gpuinfra-exp_hf-token"),
        (SECRET_TYPE, f"projects/999/secrets/gpuinfra-{own}_hf-token"),  # another project
    ]
    assert [r for r in allowed if not cel_true(expression, *r)] == []
    assert [r for r in denied if cel_true(expression, *r)] == []
    # the node-side check names the same secrets (one prefix, gpuinfra.agent.job)
    from gpuinfra.agent.job import secret_command

    assert secret_command("gcp", own, f"gpuinfra-{own}_hf-token")[-1] == f"--secret=gpuinfra-{own}_hf-token"
