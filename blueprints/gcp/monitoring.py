"""``GcpMonitoring``: the Cloud Monitoring side of GPU monitoring for one stack.

Children: a Cloud Monitoring dashboard, an email notification channel when the profile names
an address, and the idle alert policy: one condition over every GPU of the stack's VMs
(``agent.googleapis.com/gpu/utilization`` of VMs labelled with the stack), aligned to 1-minute
means, reduced to their maximum over all GPUs (``REDUCE_MAX``), below the profile's
``idle_gpu_utilization_percent`` for ``monitoring.idle_alarm_minutes`` (cloud.google.com/
monitoring/alerts/concepts-indepth; one condition over all resources is the cheap shape:
cloud.google.com/monitoring/alerts/cost-control). The Ops Agent itself and its configuration
are node files (:mod:`gpuinfra.plan.monitoring_node`); the nodes' ``monitoring.metricWriter``
role is granted in :mod:`blueprints.gcp.storage`.

Values checked against pulumi_gcp 10 (``AlertPolicy`` combiner ``OR``, comparison
``COMPARISON_LT``, aligner ``ALIGN_MEAN``, reducer ``REDUCE_MAX``; ``NotificationChannel``
type ``email`` with label ``email_address``: cloud.google.com/monitoring/support/notification-options).
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from gpuinfra.monitoring import metrics as m
from gpuinfra.monitoring.dashboards import gcp_dashboard_json, gcp_stack_filter
from gpuinfra.plan.naming import child
from gpuinfra.plan.tags import gcp_labels
from gpuinfra.spec import ClusterSpec

TYPE_TOKEN = "gpuinfra:gcp:Monitoring"


class GcpMonitoring(pulumi.ComponentResource):
    """Dashboard, optional email channel and idle alert policy of one stack.

    Args:
        name: the cluster component's name; children are ``<name>-<role>``.
        spec: the cluster spec (``profile.monitoring.enabled`` true).
        project: the GCP project.
        opts: Pulumi resource options (parent: the cluster).

    Attributes:
        outputs: stack outputs it adds (``monitoring_*``), read by ``gpuinfra status``.
    """

    def __init__(self, name: str, spec: ClusterSpec, project: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE_TOKEN, f"{name}-monitoring", None, opts)
        settings = spec.profile.monitoring
        own = pulumi.ResourceOptions(parent=self)
        labels = gcp_labels(spec)
        stack_label = labels[m.GCP_STACK_ID_LABEL_KEY]  # this stack's own VMs, not every stack of its name
        threshold = spec.profile.idle_gpu_utilization_percent
        self.dashboard = gcp.monitoring.Dashboard(
            child(name, "gpu-dashboard"),
            dashboard_json=gcp_dashboard_json(spec.stack, stack_label, threshold),
            project=project,
            opts=own,
        )
        channels = []
        if settings.alarm_email:
            channel = gcp.monitoring.NotificationChannel(
                child(name, "alarm-email"),
                type="email",
                display_name=f"gpuinfra {spec.stack} alarms",
                labels={"email_address": settings.alarm_email},
                user_labels=labels,
                project=project,
                opts=own,
            )
            channels.append(channel.id)
        self.alert = gcp.monitoring.AlertPolicy(
            child(name, "gpus-idle"),
            display_name=f"gpuinfra {spec.stack}: every GPU idle",
            combiner="OR",
            conditions=[
                gcp.monitoring.AlertPolicyConditionArgs(
                    display_name=f"every GPU under {threshold}% for {settings.idle_alarm_minutes} min",
                    condition_threshold=gcp.monitoring.AlertPolicyConditionConditionThresholdArgs(
                        filter=gcp_stack_filter(m.GCP_UTILIZATION_METRIC, stack_label),
                        comparison="COMPARISON_LT",
                        threshold_value=threshold,
                        duration=f"{settings.idle_alarm_minutes * 60}s",
                        aggregations=[
                            gcp.monitoring.AlertPolicyConditionConditionThresholdAggregationArgs(
                                alignment_period=f"{m.METRICS_INTERVAL_SECONDS}s",
                                per_series_aligner="ALIGN_MEAN",
                                cross_series_reducer="REDUCE_MAX",
                                group_by_fields=[],
                            )
                        ],
                        trigger=gcp.monitoring.AlertPolicyConditionConditionThresholdTriggerArgs(count=1),
                        # no samples (the nodes are gone) is not idleness: keep the state, as the AWS
                        # alarm's treat_missing_data "missing" does (pulumi_gcp AlertPolicy
                        # conditionThreshold.evaluationMissingData; cloud.google.com/monitoring/alerts/concepts-indepth)
                        evaluation_missing_data="EVALUATION_MISSING_DATA_NO_OP",
                    ),
                )
            ],
            notification_channels=channels,
            documentation=gcp.monitoring.AlertPolicyDocumentationArgs(
                content=(
                    f"Every GPU of gpuinfra stack {spec.stack} has been under {threshold}% utilization for "
                    f"{settings.idle_alarm_minutes} minutes: you are paying for idle GPUs. "
                    f"Check with `gpuinfra status {spec.stack}`; end it with `gpuinfra down {spec.stack}`."
                ),
                mime_type="text/markdown",
            ),
            user_labels=labels,
            project=project,
            opts=own,
        )
        self.outputs = {
            "monitoring_project": project,
            "monitoring_dashboard": self.dashboard.id,
            "monitoring_dashboard_url": self.dashboard.id.apply(
                lambda d: (
                    f"https://console.cloud.google.com/monitoring/dashboards/builder/{d.rsplit('/', 1)[-1]}"
                    f"?project={project}"
                )
            ),
            "monitoring_idle_alert_policy": self.alert.name,
            "monitoring_stack_label": stack_label,
        }
        self.register_outputs(self.outputs)


def build_monitoring(name: str, spec: ClusterSpec, project: str, parent: pulumi.Resource) -> GcpMonitoring | None:
    """:class:`GcpMonitoring` under ``parent``, or None when the profile turns monitoring off."""
    if not spec.profile.monitoring.enabled:
        return None
    return GcpMonitoring(name, spec, project, pulumi.ResourceOptions(parent=parent))
