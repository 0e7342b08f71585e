"""Dashboard bodies and idle-alarm settings of a stack, on both clouds (pure: JSON-ready dicts).

AWS dashboard body: docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/
CloudWatch-Dashboard-Body-Structure.html (``widgets`` of ``type: metric`` with ``properties``
``metrics``, ``view``, ``region``, ``stat``, ``period``, ``title``; ``metrics`` is an array of
arrays: each entry ``[namespace, name, {options}]`` or ``[{"expression": ..., "id": ...}]``).
A ``SEARCH`` expression draws every matching series (/AmazonCloudWatch/latest/monitoring/
using-search-expressions.html). gpuinfra's searches are schema-less -- the quoted namespace and
``MetricName="..."`` as search terms (search-expression-syntax.html: "you must enclose names
that include ... non-alphanumeric characters in double quotes") -- because a schema
``{namespace,dim,...}`` matches only metrics with exactly those dimensions, and an agent release
that adds one (the nvidia_gpu ``arch`` dimension, say) would empty the widgets. The cluster
roll-up (the same metric without dimensions) matches too and shows as one more line.
GCP dashboard JSON: cloud.google.com/monitoring/api/ref_v3/rest/v1/projects.dashboards
(``gridLayout.widgets[].xyChart.dataSets[].timeSeriesQuery.timeSeriesFilter``); filters on
``metadata.user_labels`` are documented in cloud.google.com/monitoring/api/v3/filters.
"""

from __future__ import annotations

import json
import math

from gpuinfra.monitoring import metrics as m

#: Period of the idle alarm's data points (s): standard resolution, so the alarm is billed as
#: a standard-resolution alarm (periods under 60 s are high resolution).
ALARM_PERIOD_SECONDS = 60


def alarm_periods(idle_alarm_minutes: int) -> int:
    """Evaluation periods of the idle alarm: ``ceil(minutes x 60 / period)``; CloudWatch allows
    at most one day of them for 60 s periods (PutMetricAlarm: "EvaluationPeriods multiplied by
    Period ... cannot be more than 86,400 seconds"), which the profile's 1440-minute limit keeps."""
    return math.ceil(idle_alarm_minutes * 60 / ALARM_PERIOD_SECONDS)


def aws_search_expression(namespace: str, metric: str, stat: str) -> str:
    """``SEARCH('"<namespace>" MetricName="<metric>"', '<stat>', <period>)``: every series of
    ``metric`` in ``namespace``, whatever its dimensions (module docstring)."""
    return f"SEARCH('\"{namespace}\" MetricName=\"{metric}\"', '{stat}', {m.METRICS_INTERVAL_SECONDS})"


def aws_dashboard_body(stack: str, region: str, idle_percent: int) -> str:
    """CloudWatch dashboard JSON: cluster GPU utilization (max/avg over every GPU, with the idle
    threshold as an annotation), every GPU's utilization, memory used, power, temperature, and
    host CPU / memory / disk."""
    ns = m.aws_namespace(stack)

    def search(metric: str, stat: str) -> list:
        return [[{"expression": aws_search_expression(ns, metric, stat), "id": metric.replace("nvidia_smi_", "")}]]

    def widget(title: str, metrics: list, y: int, x: int = 0, width: int = 12, **extra) -> dict:
        return {
            "type": "metric",
            "x": x,
            "y": y,
            "width": width,
            "height": 6,
            "properties": {
                "title": title,
                "view": "timeSeries",
                "region": region,
                "stat": "Average",
                "period": m.METRICS_INTERVAL_SECONDS,
                "metrics": metrics,
                **extra,
            },
        }

    widgets = [
        widget(
            "GPU utilization, cluster (%)",
            [
                [ns, m.AWS_UTILIZATION_METRIC, {"stat": "Maximum", "label": "busiest GPU"}],
                [ns, m.AWS_UTILIZATION_METRIC, {"stat": "Average", "label": "mean of all GPUs"}],
            ],
            0,
            width=24,
            yAxis={"left": {"min": 0, "max": 100}},
            annotations={"horizontal": [{"label": "idle threshold", "value": idle_percent}]},
        ),
        widget("GPU utilization per GPU (%)", search(m.AWS_UTILIZATION_METRIC, "Average"), 6),
        widget("GPU memory used per GPU (MB)", search(m.AWS_MEMORY_USED_METRIC, "Average"), 6, x=12),
        widget("GPU power draw per GPU (W)", search(m.AWS_POWER_METRIC, "Average"), 12),
        widget("GPU temperature per GPU (°C)", search(m.AWS_TEMPERATURE_METRIC, "Maximum"), 12, x=12),
        widget(
            "Host CPU, memory, root disk used (%, busiest node)",
            [[ns, name, {"stat": "Maximum"}] for name in m.AWS_HOST_METRICS],
            18,
            width=24,
        ),
    ]
    return json.dumps({"widgets": widgets}, sort_keys=True)


def gcp_stack_filter(metric_type: str, stack_label: str) -> str:
    """Monitoring filter selecting ``metric_type`` of the stack's VMs (their
    :data:`gpuinfra.monitoring.metrics.GCP_STACK_ID_LABEL_KEY` label, value ``stack_label``:
    :func:`gpuinfra.plan.tags.gcp_labels`)."""
    return (
        f'metric.type = "{metric_type}" AND resource.type = "gce_instance" AND '
        f'metadata.user_labels."{m.GCP_STACK_ID_LABEL_KEY}" = "{stack_label}"'
    )


def gcp_dashboard_json(stack: str, stack_label: str, idle_percent: int) -> str:
    """Cloud Monitoring dashboard JSON: busiest / mean GPU utilization of the cluster with the
    idle threshold, each GPU's utilization and memory used, host CPU and memory."""

    def dataset(
        metric: str, aligner: str, reducer: str | None, group_by: list[str], legend: str, extra_filter: str = ""
    ) -> dict:
        aggregation: dict[str, object] = {
            "alignmentPeriod": f"{m.METRICS_INTERVAL_SECONDS}s",
            "perSeriesAligner": aligner,
        }
        if reducer:
            aggregation.update(crossSeriesReducer=reducer, groupByFields=group_by)
        return {
            "plotType": "LINE",
            "legendTemplate": legend,
            "timeSeriesQuery": {
                "timeSeriesFilter": {
                    "filter": gcp_stack_filter(metric, stack_label) + extra_filter,
                    "aggregation": aggregation,
                }
            },
        }

    def chart(title: str, datasets: list, **extra) -> dict:
        return {"title": title, "xyChart": {"dataSets": datasets, **extra}}

    per_gpu = ['metadata.system_labels."name"', 'metric.label."gpu_number"']
    widgets = [
        chart(
            "GPU utilization, cluster (%)",
            [
                dataset(m.GCP_UTILIZATION_METRIC, "ALIGN_MEAN", "REDUCE_MAX", [], "busiest GPU"),
                dataset(m.GCP_UTILIZATION_METRIC, "ALIGN_MEAN", "REDUCE_MEAN", [], "mean of all GPUs"),
            ],
            thresholds=[{"label": "idle threshold", "value": idle_percent}],
        ),
        chart(
            "GPU utilization per GPU (%)",
            [
                dataset(
                    m.GCP_UTILIZATION_METRIC,
                    "ALIGN_MEAN",
                    "REDUCE_MEAN",
                    per_gpu,
                    "${metadata.system_labels.name} GPU ${metric.labels.gpu_number}",
                )
            ],
        ),
        chart(
            "GPU memory used per GPU (bytes)",
            [
                dataset(
                    m.GCP_MEMORY_USED_METRIC,
                    "ALIGN_MEAN",
                    "REDUCE_MEAN",
                    per_gpu,
                    "${metadata.system_labels.name} GPU ${metric.labels.gpu_number}",
                    ' AND metric.label."memory_state" = "used"',
                )
            ],
        ),
        chart(
            "Host CPU and memory used (%)",
            [
                dataset(
                    m.GCP_CPU_METRIC,
                    "ALIGN_MEAN",
                    "REDUCE_SUM",
                    ['metadata.system_labels."name"'],
                    "CPU ${metadata.system_labels.name}",
                    ' AND metric.label."cpu_state" != "idle"',
                ),
                dataset(
                    m.GCP_HOST_MEMORY_METRIC,
                    "ALIGN_MEAN",
                    "REDUCE_SUM",
                    ['metadata.system_labels."name"'],
                    "memory ${metadata.system_labels.name}",
                    ' AND metric.label."state" = "used"',
                ),
            ],
        ),
    ]
    return json.dumps(
        {"displayName": f"gpuinfra {stack}", "gridLayout": {"columns": "2", "widgets": widgets}}, sort_keys=True
    )
