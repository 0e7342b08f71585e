"""Read a deployed stack's nodes and GPU metrics from the clouds for ``gpuinfra status``.

* Which stack: the stack file (spec: cloud, region/zone, prices, TTL, idle settings) and the
  stack's Pulumi outputs (``monitoring_namespace`` on AWS, ``monitoring_project`` on GCP,
  written by :mod:`blueprints.aws.monitoring` / :mod:`blueprints.gcp.monitoring`).
* AWS: EC2 ``DescribeInstances`` (tag ``gpuinfra:stack-id``: the stack's own nodes, every state -- terminated instances
  stay listed for about an hour, docs.aws.amazon.com/AWSEC2/latest/UserGuide/
  terminating-instances.html: id, state, ``LaunchTime`` (start of the latest run), the stop /
  termination time from ``StateTransitionReason`` ("User initiated (YYYY-MM-DD HH:MM:SS GMT)",
  API_Instance.html), and the primary network interface's ``Attachment.AttachTime``, which
  keeps the first launch: later than ``LaunchTime`` by more than :data:`RESTART_SLACK` means
  the instance was stopped and started again),
  CloudWatch ``ListMetrics`` (the per-GPU series of the stack's namespace) and
  ``GetMetricData`` (``Average`` per 60 s over the last hour; docs.aws.amazon.com/
  AmazonCloudWatch/latest/APIReference/API_GetMetricData.html).
* GCP: Compute ``instances.list`` (label ``gpuinfra-stack-id``, the stack output
  ``monitoring_stack_label``: name, status, ``lastStartTimestamp`` -- the latest start only --,
  ``lastStopTimestamp``, ``creationTimestamp``; cloud.google.com/compute/docs/reference/rest/v1/
  instances) and Cloud Monitoring ``projects.timeSeries.list`` with
  ``ALIGN_MEAN`` per 60 s (cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.timeSeries/list),
  both through Google's client libraries (REST transport).

Credentials come from :mod:`gpuinfra.credentials`; every cloud error becomes one line with a
documented exit code (:mod:`gpuinfra.errors`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpuinfra import lifecycle
from gpuinfra.credentials import gcp_credentials, no_aws_credentials, no_gcp_credentials
from gpuinfra.errors import MissingDependencyError, OperationError, SpecError
from gpuinfra.monitoring import metrics as m
from gpuinfra.monitoring.status import WINDOW, ClusterStatus, GpuSeries, Node, build_status
from gpuinfra.plan.naming import AWS_STACK_ID_TAG, stack_id
from gpuinfra.spec import ClusterSpec, check_stack_name
from gpuinfra.stackfile import read_stack_spec, stack_file_path

MIB_PER_GIB = 1024
BYTES_PER_GIB = 1024**3
#: GetMetricData takes at most 500 queries per call.
MAX_QUERIES = 500
#: Instance states listed by ``status`` (all of them: spent money must not drop out).
AWS_STATES = ("pending", "running", "stopping", "stopped", "shutting-down", "terminated")
#: A start this much later than the first one (AWS primary ENI attach time, GCP creation time)
#: is a restart: the first start follows creation within the provisioning time. A restart
#: within it is missed, at most this long of an earlier run uncounted per node.
RESTART_SLACK = timedelta(minutes=10)
_AWS_TRANSITION_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) GMT\)")
_AWS_ENDED = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
_AWS_ACCESS = (
    "AccessDenied",
    "AccessDeniedException",
    "UnauthorizedOperation",
    "ExpiredToken",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "AuthFailure",
)


def utc_now() -> datetime:
    """The current time, UTC (tests replace it)."""
    return datetime.now(UTC)


def locate(stack: str, project_dir: Path) -> tuple[ClusterSpec, dict]:
    """(spec, Pulumi outputs) of a deployed stack; credentials of its cloud checked first.

    Raises:
        SpecError: invalid stack name, no or unreadable stack file, no Pulumi state or no
            outputs (not deployed) -- exit 2.
        MissingDependencyError: no cloud credentials, no Pulumi CLI -- exit 6.
    """
    check_stack_name(stack)
    if not stack_file_path(Path(project_dir), stack).is_file():
        raise SpecError(
            f"no stack file for {stack!r} ({stack_file_path(Path(project_dir), stack)}); "
            "write one with `gpuinfra new` or give --project-dir"
        )
    spec = read_stack_spec(Path(project_dir), stack)
    lifecycle.check_credentials(spec.cloud)
    outputs = lifecycle.make_backend().outputs(Path(project_dir), stack)
    if not outputs:
        raise SpecError(f"stack {stack!r} is not deployed (its Pulumi state has no outputs); run `gpuinfra up {stack}`")
    return spec, outputs


def collect(spec: ClusterSpec, outputs: dict, now: datetime | None = None, **clients) -> ClusterStatus:
    """The stack's :class:`ClusterStatus` at ``now`` (default: :func:`utc_now`).

    Args:
        clients: ``ec2`` / ``cloudwatch`` (boto3) or ``compute`` / ``monitoring`` (Google
            clients); default: new clients from the environment's credentials.

    Raises:
        MissingDependencyError: no credentials or no permission; GCP without the client
            libraries (``pip install 'gpuinfra[gcp-monitoring]'``).
        OperationError: any other cloud error.
    """
    now = (now or utc_now()).astimezone(UTC)
    reader = _read_aws if spec.cloud == "aws" else _read_gcp
    nodes, series, monitoring, notes = reader(spec, outputs, now, **clients)
    if not nodes:
        notes.append("no running nodes: the cluster ended (idle, TTL or `gpuinfra down`) or has not started yet")
    return build_status(spec, nodes, series, now, monitoring, notes)


def _window(now: datetime) -> tuple[datetime, datetime]:
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return end - WINDOW - timedelta(minutes=1), end


# ----------------------------------------------------------------------------------- AWS
def _read_aws(spec: ClusterSpec, outputs: dict, now: datetime, ec2=None, cloudwatch=None):
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        ec2 = ec2 or boto3.client("ec2", region_name=spec.region)
        nodes = []
        for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": f"tag:{AWS_STACK_ID_TAG}", "Values": [stack_id(spec)]},
                {"Name": "instance-state-name", "Values": list(AWS_STATES)},
            ]
        ):
            for reservation in page.get("Reservations", []):
                nodes += [aws_node(inst) for inst in reservation.get("Instances", [])]
        namespace = outputs.get("monitoring_namespace")
        if not namespace:
            return nodes, [], False, [_MONITORING_OFF]
        cloudwatch = cloudwatch or boto3.client("cloudwatch", region_name=spec.region)
        return nodes, _aws_series(cloudwatch, namespace, {n.node_id for n in nodes}, now), True, []
    except NoCredentialsError:
        raise no_aws_credentials() from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in _AWS_ACCESS:
            raise MissingDependencyError(
                f"cannot read stack {spec.stack!r} in {spec.region}: {code}; check the AWS "
                "credentials and their ec2:DescribeInstances, cloudwatch:ListMetrics and "
                "cloudwatch:GetMetricData permissions"
            ) from None
        raise OperationError(f"reading stack {spec.stack!r} from AWS failed: {code or exc}") from None
    except BotoCoreError as exc:
        raise OperationError(f"reading stack {spec.stack!r} from AWS failed: {exc}") from None


def aws_node(inst: dict) -> Node:
    """:class:`Node` of one ``DescribeInstances`` instance (module docstring for each field);
    an ended run whose ``StateTransitionReason`` carries no time has ``ended_at`` None."""
    state = inst["State"]["Name"]
    launched = _utc(inst.get("LaunchTime"))
    ended = None
    if state in _AWS_ENDED:
        found = _AWS_TRANSITION_TIME.search(inst.get("StateTransitionReason") or "")
        if found:
            ended = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    attached = [
        _utc(eni.get("Attachment", {}).get("AttachTime"))
        for eni in inst.get("NetworkInterfaces", [])
        if eni.get("Attachment", {}).get("DeviceIndex") == 0
    ]
    if attached and attached[0] is not None and launched is not None:
        earlier: bool | None = launched - attached[0] > RESTART_SLACK
    else:
        earlier = None if state in _AWS_ENDED else False  # ended instances lose their interfaces
    return Node(inst["InstanceId"], state, launched, ended, earlier)


def _utc(when) -> datetime | None:
    if when is None:
        return None
    if isinstance(when, str):
        when = datetime.fromisoformat(when.replace("Z", "+00:00"))
    return when.astimezone(UTC)


_MONITORING_OFF = (
    "no GPU metrics: monitoring is off for this stack (profile monitoring.enabled: false) or it was "
    "deployed before monitoring existed (run `gpuinfra up` to add it)"
)


def _aws_series(cloudwatch, namespace: str, node_ids: set[str], now: datetime) -> list[GpuSeries]:
    """Per-GPU utilization and memory series of the nodes ``node_ids``."""
    found: dict[tuple[str, str], dict[str, list]] = {}
    for metric_name in (m.AWS_UTILIZATION_METRIC, m.AWS_MEMORY_USED_METRIC):
        for page in cloudwatch.get_paginator("list_metrics").paginate(Namespace=namespace, MetricName=metric_name):
            for metric in page.get("Metrics", []):
                dims = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
                if dims.get("InstanceId") in node_ids and "index" in dims:
                    found.setdefault((dims["InstanceId"], dims["index"]), {})[metric_name] = metric["Dimensions"]
    keys = sorted(found)
    queries = []
    for i, key in enumerate(keys):
        for metric_name, prefix in ((m.AWS_UTILIZATION_METRIC, "u"), (m.AWS_MEMORY_USED_METRIC, "m")):
            if metric_name in found[key]:
                queries.append(
                    {
                        "Id": f"{prefix}{i}",
                        "ReturnData": True,
                        "MetricStat": {
                            "Metric": {
                                "Namespace": namespace,
                                "MetricName": metric_name,
                                "Dimensions": found[key][metric_name],
                            },
                            "Period": m.METRICS_INTERVAL_SECONDS,
                            "Stat": "Average",
                        },
                    }
                )
    start, end = _window(now)
    values: dict[str, list[tuple[datetime, float]]] = {}
    for chunk in range(0, len(queries), MAX_QUERIES):
        for page in cloudwatch.get_paginator("get_metric_data").paginate(
            MetricDataQueries=queries[chunk : chunk + MAX_QUERIES],
            StartTime=start,
            EndTime=end,
            ScanBy="TimestampAscending",
        ):
            for result in page.get("MetricDataResults", []):
                values.setdefault(result["Id"], []).extend(zip(result["Timestamps"], result["Values"], strict=False))
    series = []
    for i, (node_id, index) in enumerate(keys):
        util = sorted((t.astimezone(UTC), float(v)) for t, v in values.get(f"u{i}", []))
        mem = sorted((t.astimezone(UTC), float(v) / MIB_PER_GIB) for t, v in values.get(f"m{i}", []))
        series.append(GpuSeries(node_id, index, tuple(util), tuple(mem)))
    return series


# ----------------------------------------------------------------------------------- GCP
MONITORING_API = "https://monitoring.googleapis.com"


def make_gcp_clients():
    """(Compute ``InstancesClient``, an authorized HTTP session for the Cloud Monitoring REST
    API, the API's base URL) with Application Default Credentials (tests replace this function).
    google-cloud-monitoring 2.x ships only a gRPC transport, so ``timeSeries.list`` is called on
    its documented REST endpoint with google-auth's ``AuthorizedSession``.

    Raises:
        MissingDependencyError: the client libraries are missing, or no credentials.
    """
    try:
        from google.auth.transport.requests import AuthorizedSession
        from google.cloud import compute_v1
    except ImportError:
        raise MissingDependencyError(
            "gpuinfra status on GCP needs google-cloud-compute: pip install 'gpuinfra[gcp-monitoring]'"
        ) from None
    credentials, _ = gcp_credentials(" to read the stack's metrics")
    return compute_v1.InstancesClient(credentials=credentials), AuthorizedSession(credentials), MONITORING_API


def _read_gcp(spec: ClusterSpec, outputs: dict, now: datetime, compute=None, monitoring=None, api=MONITORING_API):
    import requests
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import DefaultCredentialsError, RefreshError

    project = outputs.get("monitoring_project") or spec.gcp_project
    if not project:
        raise SpecError(f"stack {spec.stack!r} names no GCP project (gcp_project in the stack file)")
    if compute is None or monitoring is None:
        compute, monitoring, api = make_gcp_clients()
    label = outputs.get("monitoring_stack_label") or m.gcp_stack_label(stack_id(spec))
    try:
        nodes, ids = [], {}
        for inst in compute.list(
            request={"project": project, "zone": spec.zone, "filter": f'labels.{m.GCP_STACK_ID_LABEL_KEY} = "{label}"'}
        ):
            nodes.append(gcp_node(inst))
            ids[str(inst.id)] = inst.name
        if not outputs.get("monitoring_dashboard"):
            return nodes, [], False, [_MONITORING_OFF]
        util = _gcp_points(monitoring, api, project, m.GCP_UTILIZATION_METRIC, ids, now, "", 1.0)
        mem = _gcp_points(
            monitoring,
            api,
            project,
            m.GCP_MEMORY_USED_METRIC,
            ids,
            now,
            ' AND metric.labels.memory_state = "used"',
            1 / BYTES_PER_GIB,
        )
    except (DefaultCredentialsError, RefreshError):
        raise no_gcp_credentials() from None
    except (gexc.Forbidden, gexc.Unauthenticated) as exc:
        raise MissingDependencyError(
            f"cannot read stack {spec.stack!r} in project {project}: {exc.message}; check the "
            "GCP credentials and their compute.instances.list and "
            "monitoring.timeSeries.list permissions"
        ) from None
    except gexc.GoogleAPIError as exc:
        raise OperationError(f"reading stack {spec.stack!r} from GCP failed: {exc}") from None
    except requests.RequestException as exc:
        raise OperationError(f"reading stack {spec.stack!r} from Cloud Monitoring failed: {exc}") from None
    series = [
        GpuSeries(node, gpu, tuple(points), tuple(mem.get((node, gpu), ())))
        for (node, gpu), points in sorted(util.items())
    ]
    return nodes, series, True, []


def gcp_node(inst) -> Node:
    """:class:`Node` of one Compute ``Instance``: its latest run from ``lastStartTimestamp`` (or
    ``creationTimestamp``) to ``lastStopTimestamp`` when that is later (the VM stopped), and
    ``earlier_runs`` True when it was stopped before its latest start or that start is more
    than :data:`RESTART_SLACK` after creation (None: no start time to compare)."""
    created = _utc(inst.creation_timestamp or None)
    started = _utc(inst.last_start_timestamp or None) or created
    stopped = _utc(inst.last_stop_timestamp or None)
    ended = stopped if stopped is not None and started is not None and stopped >= started else None
    if started is None or created is None:
        earlier: bool | None = None
    else:
        earlier = (stopped is not None and stopped < started) or started - created > RESTART_SLACK
    return Node(inst.name, inst.status, started, ended, earlier)


def _gcp_points(
    session, api: str, project: str, metric_type: str, ids: dict[str, str], now: datetime, extra: str, scale: float
) -> dict[tuple[str, str], list[tuple[datetime, float]]]:
    """``(node name, gpu_number) -> [(time, value x scale)]`` oldest first, 1-minute means
    (``projects.timeSeries.list``, every page).

    Raises:
        google.api_core.exceptions.GoogleAPIError: the API answered with an error status.
    """
    from google.api_core import exceptions as gexc

    if not ids:
        return {}
    start, end = _window(now)
    one_of = ", ".join(f'"{i}"' for i in sorted(ids))
    params = {
        "filter": (
            f'metric.type = "{metric_type}" AND resource.type = "gce_instance" AND '
            f"resource.labels.instance_id = one_of({one_of}){extra}"
        ),
        "interval.startTime": _rfc3339(start),
        "interval.endTime": _rfc3339(end),
        "aggregation.alignmentPeriod": f"{m.METRICS_INTERVAL_SECONDS}s",
        "aggregation.perSeriesAligner": "ALIGN_MEAN",
        "view": "FULL",
    }
    out: dict[tuple[str, str], list[tuple[datetime, float]]] = {}
    while True:
        response = session.get(f"{api}/v3/projects/{project}/timeSeries", params=params, timeout=60)
        if response.status_code != 200:
            raise gexc.from_http_response(response)
        body = response.json()
        for ts in body.get("timeSeries", []):
            instance = ts.get("resource", {}).get("labels", {}).get("instance_id", "")
            key = (ids.get(instance, instance), ts.get("metric", {}).get("labels", {}).get("gpu_number", "?"))
            for point in ts.get("points", []):
                value = point.get("value", {})
                value = value.get("doubleValue", value.get("int64Value"))
                if value is None:  # a point without a value is no sample (not 0 %)
                    continue
                when = datetime.fromisoformat(point["interval"]["endTime"].replace("Z", "+00:00"))
                out.setdefault(key, []).append((when.astimezone(UTC), float(value) * scale))
        if not body.get("nextPageToken"):
            break
        params["pageToken"] = body["nextPageToken"]
    return {k: sorted(v) for k, v in out.items()}


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
