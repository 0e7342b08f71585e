"""Cost lines of GPU monitoring (:mod:`blueprints.aws.monitoring`, :mod:`blueprints.gcp.monitoring`).

Quantities per hour of the run (prices in :mod:`gpuinfra.catalog.prices`, ``prices.yaml``):

* AWS -- custom metrics: :func:`gpuinfra.monitoring.metrics.aws_custom_metric_count` metrics,
  each billed per metric-month prorated by the hour, so ``count / 730`` metric-months per hour;
  ``PutMetricData``: one request per node per flush (``force_flush_interval`` 60 s; a flush of
  up to 1,000 datums is one request), so ``nodes x 60 / 1000`` thousand requests per hour;
  the dashboard ``1 / 730`` dashboard-months and the alarm (one metric) ``1 / 730`` alarm
  metric-months per hour. SSM Standard parameters and SNS topics have no charge of their own.
* GCP -- Ops Agent ingestion :func:`gpuinfra.monitoring.metrics.gcp_ingested_mib_per_hour`
  MiB per hour; the alert policy's one condition ``1 / 730`` condition-months plus one time
  series returned (``REDUCE_MAX`` without grouping) per 30-second execution period, the period
  Google's alerting cost examples use (cloud.google.com/monitoring/alerts/cost-control: "30-second
  execution period ... 86,400 periods per month"): 120 per hour, in millions. Dashboards and notification
  channels are free (cloud.google.com/stackdriver/pricing: only metric ingestion, API reads
  and alerting are charged).

Job logs (profile ``monitoring.job_logs``), usage-based on :data:`JOB_LOG_GB_PER_NODE_HOUR`:

* AWS -- on the job log group (``aws:cloudwatch/logGroup:LogGroup``): CloudWatch Logs ingestion,
  ``nodes x JOB_LOG_GB_PER_NODE_HOUR`` GB per hour, and its storage for the group's
  ``retentionInDays``: each hour's log kept that long, ``GB x days x 24 / 730`` GB-months per
  hour (an upper bound: ``down`` deletes the group with the stack, and CloudWatch bills storage
  compressed: aws.amazon.com/cloudwatch/pricing, "Store (Archival)").
* GCP -- on the nodes' ``roles/logging.logWriter`` binding: Cloud Logging's one-time charge per GiB
  streamed into the log bucket, which includes 30 days of storage (cloud.google.com/stackdriver/
  pricing); the ``_Default`` bucket keeps 30 days unless the project changed it, so no retention line.

Free tiers (CloudWatch: 10 metrics, 3 dashboards, 10 alarm metrics; Cloud Monitoring: 150 MiB
per billing account) are per account, so they are named in notes but not subtracted.

Fails closed: when the GPUs per node of the instance type are unknown, the metric lines carry no
price (the estimate reports them as not priced), never a count made with 0 GPUs.
"""

from __future__ import annotations

from decimal import Decimal

from gpuinfra.catalog.prices import HOURS_PER_MONTH, price
from gpuinfra.cost.lines import CostLine
from gpuinfra.monitoring import metrics as m

#: Resource types of monitoring that the estimate prices here (free ones yield no line). What
#: the agents write is priced on a real resource, never on a component (the CrossGuard budget
#: policy sees no components): on AWS the agent configuration parameter (it names the metrics),
#: on GCP the nodes' ``roles/monitoring.metricWriter`` binding (what lets them write).
PRICED_TYPES = frozenset(
    {
        "aws:ssm/parameter:Parameter",
        "aws:cloudwatch/dashboard:Dashboard",
        "aws:cloudwatch/metricAlarm:MetricAlarm",
        "aws:cloudwatch/logGroup:LogGroup",
        "gcp:projects/iAMMember:IAMMember",
        "gcp:monitoring/alertPolicy:AlertPolicy",
    }
)
FREE_TYPES = frozenset(
    {
        "gpuinfra:aws:Monitoring",
        "gpuinfra:gcp:Monitoring",
        "aws:sns/topic:Topic",
        "aws:sns/topicSubscription:TopicSubscription",
        "gcp:monitoring/dashboard:Dashboard",
        "gcp:monitoring/notificationChannel:NotificationChannel",
    }
)
MONITORING_TYPES = PRICED_TYPES | FREE_TYPES
#: GB of job log each node writes per hour, assumed by the cost preview (a planning default, not
#: a measurement: 10 MB an hour is ~2,800 bytes a second, e.g. 8 ranks each printing a 350-byte
#: line every second). A job that logs more costs proportionally more.
JOB_LOG_GB_PER_NODE_HOUR = Decimal("0.01")
#: Bytes per GB (AWS prices) and per GiB (Cloud Logging prices "treated as binary measures":
#: cloud.google.com/stackdriver/pricing).
BYTES_PER_GB = Decimal(10**9)
BYTES_PER_GIB = Decimal(2**30)
#: Agent flushes per node and hour (one PutMetricData request each).
AWS_PUTS_PER_NODE_HOUR = 3600 // m.METRICS_INTERVAL_SECONDS
#: Seconds per alerting execution period (cloud.google.com/monitoring/alerts/cost-control:
#: "30-second execution period"; 86,400 of them in a 30-day month).
GCP_ALERT_EXECUTION_PERIOD_SECONDS = 30
#: Alert condition executions per hour (one time series returned each: REDUCE_MAX, no grouping).
GCP_ALERT_EXECUTIONS_PER_HOUR = 3600 // GCP_ALERT_EXECUTION_PERIOD_SECONDS


def _cost_line(resource, rtype, component, unit, qty, p, note="", missing_source=""):
    """A :class:`~gpuinfra.cost.lines.CostLine` of a fixed (not usage-based) quantity."""
    return CostLine(
        resource=resource,
        resource_type=rtype,
        component=component,
        unit=unit,
        hourly_quantity=Decimal(qty),
        unit_price_usd=None if p is None else p.usd,
        source=missing_source if p is None else p.source,
        price_date="" if p is None else p.date,
        usage_based=False,
        note=note,
    )


def monitoring_lines(name: str, rtype: str, facts, catalog, inputs: dict | None = None) -> list:
    """Cost lines of one monitoring resource (``[]`` for a free one, e.g. an SSM parameter or IAM
    binding that is not the monitoring one).

    Args:
        name: logical name; rtype: type token (one of :data:`MONITORING_TYPES`).
        inputs: the resource's inputs (which parameter, which role).
        facts: :class:`gpuinfra.cost.estimate.ClusterFacts` (cloud, region, instance type, nodes).
        catalog: the instance catalog (GPUs per node of ``facts.instance_type``).
    """
    _line = _cost_line
    reg, nodes = facts.region, facts.nodes
    per_month = Decimal(1) / HOURS_PER_MONTH
    inputs = inputs or {}
    if rtype == "aws:ssm/parameter:Parameter" and m.is_aws_agent_parameter_name(str(inputs.get("name") or "")):
        gpus = _gpus_per_node(facts, catalog)
        if gpus is None:
            return [_unknown_gpus(name, rtype, "CloudWatch custom metrics", "metric-months", facts)]
        count = m.aws_custom_metric_count(gpus, nodes)
        return [
            _line(
                name,
                rtype,
                f"CloudWatch custom metrics ({count}: {len(m.AWS_GPU_MEASUREMENTS)} per GPU, "
                f"{len(m.AWS_HOST_METRICS)} per node, cluster roll-ups)",
                "metric-months",
                count * per_month,
                price("aws", "cloudwatch_custom_metric_per_month", reg),
                note="first 10 metrics per account free",
                missing_source=f"no CloudWatch metric price for {reg}",
            ),
            _line(
                name,
                rtype,
                f"CloudWatch PutMetricData ({AWS_PUTS_PER_NODE_HOUR} per node-hour)",
                "1,000 requests",
                Decimal(nodes * AWS_PUTS_PER_NODE_HOUR) / 1000,
                price("aws", "cloudwatch_requests_per_thousand", reg),
                missing_source=f"no CloudWatch API price for {reg}",
            ),
        ]
    if rtype == "aws:cloudwatch/dashboard:Dashboard":
        return [
            _line(
                name,
                rtype,
                "CloudWatch dashboard",
                "dashboard-months",
                per_month,
                price("aws", "cloudwatch_dashboard_per_month", reg),
                note="first 3 per account free",
            )
        ]
    if rtype == "aws:cloudwatch/metricAlarm:MetricAlarm":
        return [
            _line(
                name,
                rtype,
                "CloudWatch alarm (standard resolution, 1 metric)",
                "alarm metric-months",
                per_month,
                price("aws", "cloudwatch_alarm_metric_per_month", reg),
                note="first 10 alarm metrics per account free",
                missing_source=f"no CloudWatch alarm price for {reg}",
            )
        ]
    if rtype == "gcp:projects/iAMMember:IAMMember" and inputs.get("role") == m.METRIC_WRITER_ROLE:
        gpus = _gpus_per_node(facts, catalog)
        if gpus is None:
            return [_unknown_gpus(name, rtype, "Ops Agent metrics ingested", "MiB", facts)]
        series = m.gcp_series_count(gpus, nodes)
        return [
            _line(
                name,
                rtype,
                f"Ops Agent metrics ingested ({series} series x "
                f"{3600 // m.METRICS_INTERVAL_SECONDS} points/h x "
                f"{m.GCP_BYTES_PER_POINT} B)",
                "MiB",
                m.gcp_ingested_mib_per_hour(gpus, nodes),
                price("gcp", "monitoring_ingestion_per_mib", reg),
                note="first 150 MiB per billing account free",
            )
        ]
    if rtype == "aws:cloudwatch/logGroup:LogGroup":
        return _aws_job_log_lines(name, rtype, facts, inputs)
    if rtype == "gcp:projects/iAMMember:IAMMember" and inputs.get("role") == m.LOG_WRITER_ROLE:
        gib = nodes * JOB_LOG_GB_PER_NODE_HOUR * BYTES_PER_GB / BYTES_PER_GIB
        return [
            _usage_line(
                _line(
                    name,
                    rtype,
                    f"Cloud Logging job log ingested ({JOB_LOG_GB_PER_NODE_HOUR} GB per node-hour assumed)",
                    "GiB",
                    gib,
                    price("gcp", "cloud_logging_ingestion_per_gib", reg),
                    note="includes 30 days of storage; first 50 GiB per project a month free",
                    missing_source=f"no Cloud Logging price for {reg}",
                )
            )
        ]
    if rtype == "gcp:monitoring/alertPolicy:AlertPolicy":
        return [
            _line(
                name,
                rtype,
                "Alerting policy condition (1)",
                "condition-months",
                per_month,
                price("gcp", "alerting_condition_per_month", reg),
            ),
            _line(
                name,
                rtype,
                f"Alerting time series returned ({GCP_ALERT_EXECUTIONS_PER_HOUR} per hour)",
                "million time series",
                Decimal(GCP_ALERT_EXECUTIONS_PER_HOUR) / 1_000_000,
                price("gcp", "alerting_time_series_per_million", reg),
            ),
        ]
    return []


def _usage_line(line: CostLine) -> CostLine:
    """``line`` marked usage-based (its quantity is an assumption, :data:`JOB_LOG_GB_PER_NODE_HOUR`)."""
    line.usage_based = True
    return line


def _aws_job_log_lines(name, rtype, facts, inputs: dict) -> list[CostLine]:
    """Ingestion and storage of the job log group (module docstring); the storage line is
    unpriced when the group's ``retentionInDays`` is not in its inputs (never kept forever at $0)."""
    reg = facts.region
    gb = facts.nodes * JOB_LOG_GB_PER_NODE_HOUR
    days = inputs.get("retentionInDays")
    ingest = _cost_line(
        name,
        rtype,
        f"CloudWatch Logs job log ingested ({JOB_LOG_GB_PER_NODE_HOUR} GB per node-hour assumed)",
        "GB",
        gb,
        price("aws", "cloudwatch_logs_ingestion_per_gb", reg),
        note="first 5 GB a month per account free",
        missing_source=f"no CloudWatch Logs price for {reg}",
    )
    storage_price = price("aws", "cloudwatch_logs_storage_per_gb_month", reg) if days else None
    storage = _cost_line(
        name,
        rtype,
        f"CloudWatch Logs job log stored ({days or '?'} days retention)",
        "GB-months",
        gb * Decimal(days or 0) * 24 / HOURS_PER_MONTH,
        storage_price,
        note="upper bound: down deletes the log group earlier",
        missing_source=f"no CloudWatch Logs storage price for {reg}" if days else "log group retention unknown",
    )
    return [_usage_line(ingest), _usage_line(storage)]


def _unknown_gpus(name, rtype, component, unit, facts):
    """An unpriced line: the metric count needs the GPUs per node, unknown for the type."""
    return _cost_line(
        name,
        rtype,
        component,
        unit,
        0,
        None,
        missing_source=f"GPUs per node of {facts.instance_type or 'the instance type'} unknown: "
        "the metric count cannot be made",
    )


def _gpus_per_node(facts, catalog) -> int | None:
    """GPUs per node: the template's attached GPUs (GCP N1), else the catalog's facts of the
    type; None when the type is unknown (the caller then prices nothing)."""
    if facts.gpu_count:
        return int(facts.gpu_count)
    fact = catalog.fact(facts.cloud, facts.instance_type or "")
    return int(fact.gpu_count) if fact is not None else None
