"""What the nodes' monitoring agents collect, the names the metrics get, and how many billable
series that makes: one place for every metric name the dashboards, alarms, ``status`` and the
cost preview use.

AWS -- the CloudWatch agent's ``nvidia_gpu`` section (docs.aws.amazon.com/AmazonCloudWatch/
latest/monitoring/CloudWatch-Agent-NVIDIA-GPU.html; awsdocs/amazon-cloudwatch-user-guide
doc_source/CloudWatch-Agent-NVIDIA-GPU.md @b3554970): measurement ``utilization_gpu`` is published
as ``nvidia_smi_utilization_gpu`` (percent of the sample period a kernel ran), ``memory_used``
as ``nvidia_smi_memory_used`` (MB as nvidia-smi reports it; ``memory_total`` is not collected:
nothing reads it, and every measurement costs a custom metric per GPU),
``power_draw`` as ``nvidia_smi_power_draw`` (W), ``temperature_gpu`` as
``nvidia_smi_temperature_gpu`` (deg C), each with the dimensions ``index``, ``name`` and
``host``. The configuration (CloudWatch-Agent-Configuration-File-Details.md @077ceea7): the
``namespace`` is per stack (so ``PutMetricData`` can be limited to it), ``omit_hostname`` drops
``host``, ``append_dimensions`` adds ``InstanceId``, and ``aggregation_dimensions: [[]]`` also
publishes every metric without dimensions ("roll up all metrics into one collection"), which
CloudWatch combines over all nodes: the idle alarm reads its ``Maximum``.

GCP -- the Ops Agent's ``hostmetrics`` receiver, with the NVML pipeline on any VM with an NVIDIA
GPU (GoogleCloudPlatform/ops-agent apps/hostmetrics.go: ``nvml.gpu.utilization`` ->
``agent.googleapis.com/gpu/utilization`` x100 (percent), ``nvml.gpu.memory.bytes_used`` ->
``agent.googleapis.com/gpu/memory/bytes_used`` with label ``memory_state`` used/free;
``cpu/utilization`` is averaged over CPUs, keeping ``cpu_state``; ``memory/percent_used`` by
``state``). NVML gives no power or temperature (DCGM would; not collected by gpuinfra yet).
Every other host metric is excluded (``exclude_metrics`` processor,
cloud.google.com/stackdriver/docs/solutions/agents/ops-agent/configuration#metrics-processors):
agent metrics are billed by bytes ingested (cloud.google.com/monitoring/api/metrics_opsagent:
"the other types are chargeable").

Job logs (profile ``monitoring.job_logs``): the same agents also ship the job's log file on the
node (:data:`gpuinfra.agent.job.LOCAL_LOG`) -- AWS to the stack's log group
:func:`aws_job_log_group` (declared in the stack with its retention, so the agent neither creates
it nor sets its retention), GCP to Cloud Logging through the receiver
:data:`GCP_JOB_LOG_RECEIVER`. Off, the configurations carry no ``logs`` section / receiver.
"""

from __future__ import annotations

import re
from decimal import Decimal

from gpuinfra.agent.job import LOCAL_LOG

#: Seconds between samples on both clouds (CloudWatch agent default 60; below 60 would make
#: them high-resolution metrics, billed as such).
METRICS_INTERVAL_SECONDS = 60

# ------------------------------------------------------------------------------------ AWS
#: ``nvidia_gpu`` measurements collected; CloudWatch names are ``nvidia_smi_<measurement>``.
AWS_GPU_MEASUREMENTS = ("utilization_gpu", "memory_used", "power_draw", "temperature_gpu")
AWS_UTILIZATION_METRIC = "nvidia_smi_utilization_gpu"
AWS_MEMORY_USED_METRIC = "nvidia_smi_memory_used"
AWS_POWER_METRIC = "nvidia_smi_power_draw"
AWS_TEMPERATURE_METRIC = "nvidia_smi_temperature_gpu"
#: Host metrics: section -> (measurement, its extra dimensions besides InstanceId).
AWS_HOST_METRICS = {
    "cpu_usage_active": ("cpu", "usage_active"),
    "mem_used_percent": ("mem", "used_percent"),
    "disk_used_percent": ("disk", "used_percent"),
}
#: Dimensions of a per-GPU series as the agent publishes them with the configuration below.
AWS_GPU_DIMENSIONS = ("InstanceId", "index", "name")
#: The path whose disk use is reported (the root volume).
AWS_DISK_PATH = "/"


def aws_gpu_metric_names() -> tuple[str, ...]:
    """CloudWatch metric names of :data:`AWS_GPU_MEASUREMENTS` (``nvidia_smi_<measurement>``)."""
    return tuple(f"nvidia_smi_{m}" for m in AWS_GPU_MEASUREMENTS)


def aws_namespace(stack: str) -> str:
    """CloudWatch namespace of a stack's metrics: ``gpuinfra/<stack>`` (stack names are letters,
    digits, ``-_.``: all valid in a namespace, docs.aws.amazon.com/AmazonCloudWatch/latest/
    APIReference/API_PutMetricData.html)."""
    return f"gpuinfra/{stack}"


def aws_resource_name(stack: str, suffix: str = "") -> str:
    """Dashboard / alarm / topic name: ``gpuinfra-<stack>[-suffix]`` with any character outside
    ``A-Za-z0-9_-`` replaced by ``-`` (PutDashboard: "can contain only alphanumerics, dash (-),
    and underscore (_)"; SNS topic names allow the same), at most 255 characters."""
    name = f"gpuinfra-{stack}" + (f"-{suffix}" if suffix else "")
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)[:255]


#: SSM parameter holding a stack's CloudWatch agent configuration (``{stack}`` is the stack).
AWS_AGENT_PARAMETER_PATTERN = "/gpuinfra/{stack}/cloudwatch-agent"


def aws_agent_parameter_name(stack: str) -> str:
    """SSM parameter the nodes' CloudWatch agent reads its configuration from
    (``amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -c ssm:<name>``):
    :data:`AWS_AGENT_PARAMETER_PATTERN`."""
    return AWS_AGENT_PARAMETER_PATTERN.format(stack=stack)


def is_aws_agent_parameter_name(name: str) -> bool:
    """Whether an SSM parameter name is some stack's agent configuration
    (:data:`AWS_AGENT_PARAMETER_PATTERN` with a non-empty stack)."""
    head, tail = AWS_AGENT_PARAMETER_PATTERN.split("{stack}")
    return name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail)


def aws_job_log_group(stack: str) -> str:
    """CloudWatch Logs group of a stack's job log: ``/gpuinfra/<stack>/job`` (``stack`` is
    :func:`gpuinfra.plan.naming.stack_id`: letters, digits and ``-_.``, all allowed in a group
    name, "a-z, A-Z, 0-9, '_' (underscore), '-' (hyphen), '/' (forward slash), '.' (period), and '#'
    (number sign)", 1-512 characters: docs.aws.amazon.com/AmazonCloudWatchLogs/latest/APIReference/
    API_CreateLogGroup.html)."""
    return f"/gpuinfra/{stack}/job"


def aws_agent_config(stack: str, job_logs: bool = False) -> dict:
    """The CloudWatch agent configuration of the nodes of ``stack`` (JSON-ready dict, see the
    module docstring for each field).

    With ``job_logs`` it adds a ``logs`` section (keys of CloudWatch-Agent-Configuration-File-
    Details.html, "Logs section": ``logs_collected.files.collect_list`` "an array of entries, each
    of which specifies one log file to collect"; per entry ``file_path`` "the path of the log file
    to upload", ``log_group_name`` "what to use as the log group name in CloudWatch Logs",
    ``log_stream_name`` with the placeholder ``{instance_id}`` -- one stream per instance --,
    ``timezone`` ``UTC``). No ``retention_in_days``: the stack declares the group with its
    retention (the agent would otherwise call ``PutRetentionPolicy``, a permission the nodes
    do not get)."""
    config: dict = {
        "agent": {
            "metrics_collection_interval": METRICS_INTERVAL_SECONDS,
            "omit_hostname": True,
            "run_as_user": "root",
        },
        "metrics": {
            "namespace": aws_namespace(stack),
            "append_dimensions": {"InstanceId": "${aws:InstanceId}"},
            "aggregation_dimensions": [[]],
            "metrics_collected": {
                "nvidia_gpu": {"measurement": list(AWS_GPU_MEASUREMENTS)},
                "cpu": {"totalcpu": True, "measurement": ["usage_active"]},
                "mem": {"measurement": ["used_percent"]},
                "disk": {"resources": [AWS_DISK_PATH], "measurement": ["used_percent"], "drop_device": True},
            },
        },
    }
    if job_logs:
        entry = {
            "file_path": LOCAL_LOG,
            "log_group_name": aws_job_log_group(stack),
            "log_stream_name": "{instance_id}",
            "timezone": "UTC",
        }
        config["logs"] = {"logs_collected": {"files": {"collect_list": [entry]}}}
    return config


def aws_custom_metric_count(gpus_per_node: int, nodes: int) -> int:
    """Custom metrics (distinct namespace + name + dimension set) the cluster publishes: per
    node, every GPU measurement per GPU and every host metric; once for the cluster, every
    metric again without dimensions (``aggregation_dimensions: [[]]``)."""
    per_node = len(AWS_GPU_MEASUREMENTS) * gpus_per_node + len(AWS_HOST_METRICS)
    return nodes * per_node + len(AWS_GPU_MEASUREMENTS) + len(AWS_HOST_METRICS)


# ------------------------------------------------------------------------------------ GCP
#: What the Ops Agent needs to write its metrics (cloud.google.com/stackdriver/docs/solutions/
#: agents/ops-agent/authorization: "Monitoring Metric Writer (roles/monitoring.metricWriter)").
METRIC_WRITER_ROLE = "roles/monitoring.metricWriter"
#: Label key carrying the stack on every GCP resource of it.
GCP_STACK_LABEL_KEY = "gpuinfra-stack"
#: Label key carrying the stack's unique id (stack name and random name suffix,
#: :func:`gpuinfra.plan.naming.stack_id`): the dashboard, the idle alert and ``gpuinfra status``
#: select the stack's VMs by it, so a stack of the same name in the project is never counted.
GCP_STACK_ID_LABEL_KEY = "gpuinfra-stack-id"


def gcp_stack_label(stack: str) -> str:
    """Value of :data:`GCP_STACK_LABEL_KEY` for ``stack``: lower case, characters outside
    ``a-z0-9_-`` replaced by ``-``, at most 63 characters (label values: "can contain only
    lowercase letters, numeric characters, underscores, and dashes ... up to 63 characters",
    cloud.google.com/compute/docs/labeling-resources#requirements)."""
    return re.sub(r"[^a-z0-9_-]", "-", stack.lower())[:63]


GCP_UTILIZATION_METRIC = "agent.googleapis.com/gpu/utilization"
GCP_MEMORY_USED_METRIC = "agent.googleapis.com/gpu/memory/bytes_used"
GCP_CPU_METRIC = "agent.googleapis.com/cpu/utilization"
GCP_HOST_MEMORY_METRIC = "agent.googleapis.com/memory/percent_used"
#: Series per metric and VM: per GPU (``gpu_number``) x label values (ops-agent
#: apps/hostmetrics.go: ``memory_state`` used/free; ``cpu_state`` idle, interrupt, nice,
#: softirq, steal, system, user, wait; memory ``state`` buffered, cached, free, slab, used).
GCP_SERIES_PER_GPU = {GCP_UTILIZATION_METRIC: 1, GCP_MEMORY_USED_METRIC: 2}
GCP_SERIES_PER_VM = {GCP_CPU_METRIC: 8, GCP_HOST_MEMORY_METRIC: 5}
#: Every other metric of the hostmetrics receiver is left out (trailing ``*`` patterns).
GCP_EXCLUDED_METRICS = (
    "agent.googleapis.com/cpu/load_*",
    "agent.googleapis.com/cpu/usage_time",
    "agent.googleapis.com/disk/*",
    "agent.googleapis.com/interface/*",
    "agent.googleapis.com/memory/bytes_used",
    "agent.googleapis.com/network/*",
    "agent.googleapis.com/pagefile/*",
    "agent.googleapis.com/processes/*",
    "agent.googleapis.com/swap/*",
    "agent.googleapis.com/gpu/processes/*",
)
#: Billable bytes per sample of a scalar (INT64/DOUBLE) point: cloud.google.com/stackdriver/
#: pricing ("Metrics charged by bytes ingested": 8 bytes per scalar point).
GCP_BYTES_PER_POINT = 8
MIB = 1024 * 1024


#: What the Ops Agent needs to write log entries (cloud.google.com/stackdriver/docs/solutions/
#: agents/ops-agent/authorization: "Logs Writer (roles/logging.logWriter)"); granted only with
#: ``monitoring.job_logs``.
LOG_WRITER_ROLE = "roles/logging.logWriter"
#: The Ops Agent receiver (and pipeline) id of the job log. The agent's entries carry the
#: receiver id as their log name (its built-in ``syslog`` receiver writes the log ``syslog``), so
#: the log is expected as ``logName=projects/<p>/logs/gpuinfra_job`` (not checked against a live
#: project here).
GCP_JOB_LOG_RECEIVER = "gpuinfra_job"


def gcp_ops_agent_config(job_logs: bool = False) -> dict:
    """``/etc/google-cloud-ops-agent/config.yaml``: host metrics every 60 s minus
    :data:`GCP_EXCLUDED_METRICS`, NVML GPU metrics (on by default on GPU VMs); the default
    logging pipeline off (no syslog in Cloud Logging; without ``job_logs`` no Cloud Logging
    charges and no ``logging.logWriter``).

    With ``job_logs``: a ``files`` receiver :data:`GCP_JOB_LOG_RECEIVER` of the job's log file
    (``include_paths``) and a pipeline of it (cloud.google.com/stackdriver/docs/solutions/agents/
    ops-agent/configuration#logging-receivers: ``type: files``, ``include_paths``;
    #logging-service: ``service.pipelines.<id>.receivers``)."""
    receivers = {"hostmetrics": {"type": "hostmetrics", "collection_interval": f"{METRICS_INTERVAL_SECONDS}s"}}
    pipeline_receivers = ["hostmetrics"]
    logging: dict = {"service": {"pipelines": {"default_pipeline": {"receivers": []}}}}
    if job_logs:
        logging = {
            "receivers": {GCP_JOB_LOG_RECEIVER: {"type": "files", "include_paths": [LOCAL_LOG]}},
            "service": {
                "pipelines": {
                    "default_pipeline": {"receivers": []},
                    GCP_JOB_LOG_RECEIVER: {"receivers": [GCP_JOB_LOG_RECEIVER]},
                }
            },
        }
    return {
        "logging": logging,
        "metrics": {
            "receivers": receivers,
            "processors": {
                "gpuinfra_exclude": {"type": "exclude_metrics", "metrics_pattern": list(GCP_EXCLUDED_METRICS)}
            },
            "service": {
                "pipelines": {"default_pipeline": {"receivers": pipeline_receivers, "processors": ["gpuinfra_exclude"]}}
            },
        },
    }


def gcp_series_count(gpus_per_node: int, nodes: int) -> int:
    """Chargeable Ops Agent series of the cluster (NVML GPU metrics and the kept host metrics)."""
    per_vm = sum(GCP_SERIES_PER_GPU.values()) * gpus_per_node + sum(GCP_SERIES_PER_VM.values())
    return nodes * per_vm


def gcp_ingested_mib_per_hour(gpus_per_node: int, nodes: int) -> Decimal:
    """MiB the cluster's agents ingest per hour: series x samples per hour x
    :data:`GCP_BYTES_PER_POINT` / 2^20."""
    points = gcp_series_count(gpus_per_node, nodes) * (3600 // METRICS_INTERVAL_SECONDS)
    return Decimal(points * GCP_BYTES_PER_POINT) / Decimal(MIB)
