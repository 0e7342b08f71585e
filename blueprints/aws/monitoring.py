"""``AwsMonitoring``: the CloudWatch side of GPU monitoring for one stack.

Children: the CloudWatch agent configuration as an SSM parameter (Standard tier: free, up to
4 KB; docs.aws.amazon.com/systems-manager/latest/userguide/parameter-store-advanced-parameters.html),
a CloudWatch dashboard, an SNS topic (plus an email subscription when the profile names an
address) and the idle alarm: ``Maximum`` of ``nvidia_smi_utilization_gpu`` over every GPU
(the metric without dimensions, :mod:`gpuinfra.monitoring.metrics`) below the profile's
``idle_gpu_utilization_percent`` for ``monitoring.idle_alarm_minutes`` 1-minute periods.
Missing data (no node publishing) keeps the alarm's state (``treat_missing_data = missing``:
docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/AlarmThatSendsEmail.html
#alarms-and-missing-data). With the profile's ``monitoring.job_logs`` also the job log's
CloudWatch Logs group (:func:`gpuinfra.plan.naming.aws_job_log_group`, ``aws.cloudwatch.LogGroup``
with ``retention_in_days``), so ``down`` deletes it with the stack. The nodes' IAM permissions are
in :mod:`blueprints.aws.identity`.

Values checked against pulumi_aws 7 (``aws.cloudwatch.MetricAlarm`` comparison_operator
``LessThanThreshold``, statistic ``Maximum``, treat_missing_data ``missing``; ``aws.ssm.Parameter``
type ``String``, tier ``Standard``; ``aws.sns.TopicSubscription`` protocol ``email``).
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from gpuinfra.monitoring import metrics as m
from gpuinfra.monitoring.dashboards import ALARM_PERIOD_SECONDS, alarm_periods, aws_dashboard_body
from gpuinfra.plan.naming import (
    aws_agent_parameter,
    aws_job_log_group,
    aws_metric_namespace,
    aws_monitoring_name,
    child,
    stack_id,
)
from gpuinfra.plan.tags import aws_tags
from gpuinfra.spec import ClusterSpec

TYPE_TOKEN = "gpuinfra:aws:Monitoring"


def dashboard_url(region: str, name: str) -> str:
    """Console address of a CloudWatch dashboard."""
    return f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#dashboards:name={name}"


class AwsMonitoring(pulumi.ComponentResource):
    """Agent configuration, dashboard, alarm topic and idle alarm of one stack.

    Args:
        name: the cluster component's name; children are ``<name>-<role>``.
        spec: the cluster spec (``profile.monitoring.enabled`` true).
        opts: Pulumi resource options (parent: the cluster).

    Attributes:
        outputs: stack outputs it adds (``monitoring_*``), read by ``gpuinfra status``.
    """

    def __init__(self, name: str, spec: ClusterSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE_TOKEN, f"{name}-monitoring", None, opts)
        settings = spec.profile.monitoring
        own = pulumi.ResourceOptions(parent=self)
        tags = aws_tags(spec)
        stack = spec.stack
        # physical names carry the stack's name suffix (gpuinfra.plan.naming): a stack of the same
        # name from another folder in this account and region has names of its own
        unique = stack_id(spec)
        self.parameter = aws.ssm.Parameter(
            child(name, "cw-agent-config"),
            name=aws_agent_parameter(spec),
            type="String",
            tier="Standard",
            insecure_value=json.dumps(m.aws_agent_config(unique, settings.job_logs), sort_keys=True),  # not secret
            description=f"CloudWatch agent configuration of the gpuinfra stack {stack}",
            tags=tags,
            opts=own,
        )
        dashboard_name = aws_monitoring_name(spec)
        self.dashboard = aws.cloudwatch.Dashboard(
            child(name, "gpu-dashboard"),
            dashboard_name=dashboard_name,
            dashboard_body=aws_dashboard_body(unique, spec.region, spec.profile.idle_gpu_utilization_percent),
            opts=own,
        )
        self.topic = aws.sns.Topic(child(name, "alarms"), name=aws_monitoring_name(spec, "alarms"), tags=tags, opts=own)
        if settings.alarm_email:
            aws.sns.TopicSubscription(
                child(name, "alarm-email"),
                topic=self.topic.arn,
                protocol="email",
                endpoint=settings.alarm_email,
                opts=own,
            )
        periods = alarm_periods(settings.idle_alarm_minutes)
        threshold = spec.profile.idle_gpu_utilization_percent
        alarm_name = aws_monitoring_name(spec, "gpus-idle")
        self.alarm = aws.cloudwatch.MetricAlarm(
            child(name, "gpus-idle"),
            name=alarm_name,
            namespace=aws_metric_namespace(spec),
            metric_name=m.AWS_UTILIZATION_METRIC,
            statistic="Maximum",
            period=ALARM_PERIOD_SECONDS,
            evaluation_periods=periods,
            datapoints_to_alarm=periods,
            threshold=threshold,
            comparison_operator="LessThanThreshold",
            treat_missing_data="missing",
            alarm_description=(
                f"every GPU of stack {stack} under {threshold}% utilization for "
                f"{settings.idle_alarm_minutes} min: you are paying for idle GPUs"
            ),
            alarm_actions=[self.topic.arn],
            tags=tags,
            opts=own,
        )
        self.job_logs: aws.cloudwatch.LogGroup | None = None
        if settings.job_logs:  # the job log, shipped by the same agent (gpuinfra.monitoring.metrics)
            self.job_logs = aws.cloudwatch.LogGroup(
                child(name, "job-logs"),
                name=aws_job_log_group(spec),
                retention_in_days=settings.job_log_retention_days,
                tags=tags,
                opts=own,
            )
        self.outputs = {
            "monitoring_namespace": aws_metric_namespace(spec),
            "monitoring_dashboard": dashboard_name,
            "monitoring_dashboard_url": dashboard_url(spec.region, dashboard_name),
            "monitoring_idle_alarm": alarm_name,
            "monitoring_alarm_topic_arn": self.topic.arn,
            "monitoring_agent_parameter": aws_agent_parameter(spec),
        }
        if settings.job_logs:
            self.outputs["monitoring_job_log_group"] = aws_job_log_group(spec)
        self.register_outputs(self.outputs)


def build_monitoring(name: str, spec: ClusterSpec, parent: pulumi.Resource) -> AwsMonitoring | None:
    """:class:`AwsMonitoring` under ``parent``, or None when the profile turns monitoring off."""
    if not spec.profile.monitoring.enabled:
        return None
    return AwsMonitoring(name, spec, pulumi.ResourceOptions(parent=parent))
