"""Names of a stack's resources.

Two kinds, kept apart:

* **Logical (Pulumi) names** of child resources derive from the component name
  (``<stack>-vpc``, :func:`child`), never from values that can change, so Pulumi URNs stay stable.
  Resources Pulumi auto-names (VPC, subnets, security group, launch template, fleet, IAM roles,
  bucket prefix, GCE network/firewall/template prefix ...) get a random suffix from Pulumi
  already (www.pulumi.com/docs/iac/concepts/resources/names/#autonaming).
* **Fixed physical names** -- the ones gpuinfra spells out because something else finds the
  resource by its name (the nodes, the IAM conditions, ``gpuinfra status``) -- carry the stack's
  random name suffix (:attr:`gpuinfra.spec.ClusterSpec.name_suffix`) through :func:`stack_id`,
  so two stacks with the same name in one account/region or project never share one. The IAM
  conditions of the nodes import the GCP group name from here (:func:`gcp_group_name`; its VMs
  are ``<group>-`` and 4 characters), so each is defined once.
"""

from __future__ import annotations

import re

from gpuinfra.monitoring.metrics import (
    GCP_STACK_ID_LABEL_KEY,
    aws_agent_parameter_name,
    aws_namespace,
    aws_resource_name,
)
from gpuinfra.monitoring.metrics import (
    aws_job_log_group as metrics_job_log_group,
)
from gpuinfra.spec import ClusterSpec

#: AWS tag / GCP label naming the stack's own resources by :func:`stack_id` (unique per stack, unlike
#: ``gpuinfra:stack``): run_command targets, the backstop's TerminateInstances condition, the
#: ``private_ips`` output and the nodes' peer discovery select by it (with the deployment tag).
AWS_STACK_ID_TAG = "gpuinfra:stack-id"
GCP_STACK_ID_LABEL = GCP_STACK_ID_LABEL_KEY
#: GCE resource names: ``[a-z]([-a-z0-9]*[a-z0-9])?``, at most 63 characters
#: (cloud.google.com/compute/docs/naming-resources#resource-name-format).
GCE_NAME_MAX = 63
#: Characters a GCE MIG adds to its base instance name: ``-`` and 4 random characters
#: (cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers: ``baseInstanceName``
#: "The base instance name is a prefix that you want to attach to the names of all VMs in a MIG.
#: The maximum character length is 58"; VMs are ``<base>-<4 characters>``).
GCE_BASE_INSTANCE_NAME_MAX = 58


def child(name: str, role: str) -> str:
    """Logical name of a child resource: ``<component>-<role>``."""
    return f"{name}-{role}"


def dns_safe(text: str, max_len: int = 40) -> str:
    """Lower-case letters, digits and '-' only (S3/GCS bucket and GCE resource names)."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (cleaned or "gpuinfra")[:max_len].rstrip("-")


def stack_id(spec: ClusterSpec) -> str:
    """The stack's unique id in physical names: ``<stack>-<name_suffix>`` (``gpu-a1b2c3``), or the
    bare stack name for a stack file written before it had a suffix (``preview`` and ``up``
    refuse those: :meth:`gpuinfra.spec.ClusterSpec.check_name_suffix`). Letters, digits and
    ``-_.`` only: valid in an SSM parameter path segment, a CloudWatch namespace, dashboard and
    alarm name, an SNS topic name and an AWS tag value."""
    return f"{spec.stack}-{spec.name_suffix}" if spec.name_suffix else spec.stack


def _short(spec: ClusterSpec, room: int, sep: str = "-", collapse: bool = False) -> str:
    """:func:`stack_id` fitted into ``room`` characters: the stack name is cut, never the
    suffix (the suffix is what keeps two stacks apart); ``sep`` between them; ``collapse``
    turns every run of ``-`` in the stack name into one."""
    stack = dns_safe(spec.stack, 100)
    if collapse:
        stack = re.sub("-+", "-", stack)
    if not spec.name_suffix:
        return stack[:room].rstrip("-")
    keep = room - len(spec.name_suffix) - len(sep)
    return f"{stack[:keep].rstrip('-')}{sep}{spec.name_suffix}"


def gcp_group_name(spec: ClusterSpec) -> str:
    """The GCP managed instance group's name, also its base instance name (the agent finds its
    group from its VM name): ``<stack>--<suffix>-node``, within
    :data:`GCE_BASE_INSTANCE_NAME_MAX` (a 27-character stack name gives 40).

    The stack part has every run of ``-`` collapsed to one (so it never holds ``--``) and never
    ends in ``-``; the ``--`` after it therefore ends it, which makes ``<group>-`` a prefix of no
    other stack's group or VM names (the node role's IAM condition relies on it:
    :func:`blueprints.gcp.storage.own_group_condition`)."""
    return f"{_short(spec, GCE_BASE_INSTANCE_NAME_MAX - len('-node'), '--', collapse=True)}-node"


def gcp_bulk_instance_names(group: str, nodes: int) -> tuple[str, ...]:
    """The fixed names of the VMs one ``instances.bulkInsert`` creates for a group
    (``perInstanceProperties`` keys): ``<group>-n000`` .. ``<group>-n<nodes-1>``, 5 characters
    after the group name like a MIG's own ``-`` + 4 characters (:data:`GCE_BASE_INSTANCE_NAME_MAX`
    keeps the whole name within :data:`GCE_NAME_MAX`), so ``<group>-`` stays the prefix the node
    role's IAM condition grants and ``name.rsplit("-", 1)[0]`` is the group on every node. A
    MIG's own names end in "a random four-character string"
    (cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers, ``baseInstanceName``),
    which can be ``n`` + 3 digits: the peer script counts a name once, and a replacement the agent
    asks for never takes that form (:func:`gpuinfra.agent.replace.request_gcp_replacement`).

    Args:
        group: :func:`gcp_group_name`; nodes: 1..1000.

    Raises:
        ValueError: ``nodes`` outside 1..1000 (three digits).
    """
    if not 1 <= nodes <= 1000:
        raise ValueError(f"nodes {nodes}: 1 to 1000 VMs per bulk insert name pattern")
    return tuple(f"{group}-n{i:03d}" for i in range(nodes))


def gcp_bulk_name_pattern(group: str) -> str:
    """The RE2 pattern that matches, as a whole, exactly the names :func:`gcp_bulk_instance_names`
    gives ``group`` at any node count: ``<group>-n`` and 3 digits. Compute's list ``filter``
    "``name eq <literal>``" takes it as is ("The literal value is interpreted as a regular
    expression using Google RE2 library syntax. The literal value must match the entire field":
    cloud.google.com/compute/docs/reference/rest/v1/instances/list, ``filter``); gcloud's
    ``--filter`` takes it as ``name ~ ^<pattern>$`` (``~``: a regular-expression match,
    cloud.google.com/sdk/gcloud/reference/topic/filters). A group name holds ``a-z 0-9 -`` only,
    none of them special in a regular expression.

    Raises:
        ValueError: ``group`` holds another character.
    """
    if not re.fullmatch(r"[a-z0-9-]+", group):
        raise ValueError(f"group {group!r}: only a-z 0-9 - in a GCE name")
    return f"{group}-n[0-9]{{3}}"


def gcp_service_account_id(spec: ClusterSpec) -> str:
    """The nodes' service account id: ``gi-<stack>-<suffix>`` in 6 to 30 lowercase letters,
    digits or ``-`` (cloud.google.com/iam/docs/service-accounts-create: "must be between 6 and 30
    characters", ``[a-z]([-a-z0-9]*[a-z0-9])``); a long stack name is cut, the suffix kept."""
    return f"gi-{_short(spec, 30 - len('gi-'))}".ljust(6, "0")


def gcp_role_id(spec: ClusterSpec) -> str:
    """The nodes' custom role id: ``gpuinfra_<stack>_<suffix>`` in at most 64 letters, digits,
    ``_`` or ``.`` (cloud.google.com/iam/docs/reference/rest/v1/projects.roles/create: roleId
    "can only include letters, digits, underscores and periods", at most 64)."""
    return "gpuinfra_" + _short(spec, 64 - len("gpuinfra_"), "_").replace("-", "_")


def aws_agent_parameter(spec: ClusterSpec) -> str:
    """The stack's SSM parameter holding its CloudWatch agent configuration:
    ``/gpuinfra/<stack>-<suffix>/cloudwatch-agent``
    (:func:`gpuinfra.monitoring.metrics.aws_agent_parameter_name` of :func:`stack_id`; parameter
    names take ``a-zA-Z0-9_.-/``, at most 1011 characters after ``arn:...:parameter``:
    docs.aws.amazon.com/systems-manager/latest/userguide/sysman-paramstore-su-create.html). The
    nodes read it and only it."""
    return aws_agent_parameter_name(stack_id(spec))


def aws_job_log_group(spec: ClusterSpec) -> str:
    """The stack's CloudWatch Logs group of the job log, ``/gpuinfra/<stack>-<suffix>/job``
    (:func:`gpuinfra.monitoring.metrics.aws_job_log_group` of :func:`stack_id`)."""
    return metrics_job_log_group(stack_id(spec))


def aws_monitoring_name(spec: ClusterSpec, role: str = "") -> str:
    """The stack's CloudWatch dashboard (``role`` empty), SNS topic (``alarms``) or alarm
    (``gpus-idle``) name: ``gpuinfra-<stack>-<suffix>[-role]``
    (:func:`gpuinfra.monitoring.metrics.aws_resource_name`: dashboards, alarms and topics allow
    ``A-Za-z0-9_-`` in at most 255 / 255 / 256 characters:
    docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_PutDashboard.html,
    docs.aws.amazon.com/sns/latest/api/API_CreateTopic.html)."""
    return aws_resource_name(stack_id(spec), role)


def aws_metric_namespace(spec: ClusterSpec) -> str:
    """The stack's CloudWatch namespace ``gpuinfra/<stack>-<suffix>``
    (:func:`gpuinfra.monitoring.metrics.aws_namespace`): the idle alarm and dashboard read only
    this stack's metrics, and the nodes may write only here."""
    return aws_namespace(stack_id(spec))
