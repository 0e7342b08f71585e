"""Offline preview of a p5 and an a3-megagpu-8g stack: dashboard, idle alarm / alert policy and
agent configuration with the GPU metrics named as the agents publish them (AWS: CloudWatch agent
``nvidia_smi_*``, CloudWatch-Agent-NVIDIA-GPU.md; GCP: Ops Agent ``agent.googleapis.com/gpu/*``,
ops-agent apps/hostmetrics.go), the nodes' exact write permissions, and the cost preview's lines
for custom metrics, dashboards and alarms from the cited prices."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from gpuinfra.catalog.store import load_catalog
from gpuinfra.cost.estimate import estimate
from tests.blueprints.helpers import make_spec, preview

NO_USAGE = {"bucket_storage_gb": Decimal(0), "internet_egress_gb": Decimal(0), "nat_processed_gb": Decimal(0)}
HOURS = Decimal(730)


@pytest.fixture(scope="module")
def p5():
    spec = make_spec("p5.48xlarge", nodes=2)
    return spec, preview(spec)


@pytest.fixture(scope="module")
def a3():
    spec = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp")
    return spec, preview(spec)


def monthly(line) -> Decimal:
    """USD a 730-hour month, to the cent."""
    return (line.hourly_usd * HOURS).quantize(Decimal("0.01"))


def one(result, token):
    found = result.of_type(token)
    assert len(found) == 1, [r.name for r in found]
    return found[0]


def test_p5_agent_configuration_in_ssm_names_the_gpu_metrics(p5):
    spec, result = p5
    param = one(result, "aws:ssm/parameter:Parameter")
    assert (param.inputs["name"], param.inputs["type"], param.inputs["tier"]) == (
        "/gpuinfra/t-2-t3st0a/cloudwatch-agent",
        "String",
        "Standard",
    )
    config = json.loads(param.inputs["insecureValue"])
    assert config["metrics"]["namespace"] == "gpuinfra/t-2-t3st0a"
    assert config["metrics"]["metrics_collected"]["nvidia_gpu"]["measurement"] == [
        "utilization_gpu",
        "memory_used",
        "power_draw",
        "temperature_gpu",
    ]
    assert config["metrics"]["append_dimensions"] == {"InstanceId": "${aws:InstanceId}"}
    assert config["metrics"]["aggregation_dimensions"] == [[]]
    assert config["agent"]["metrics_collection_interval"] == 60 and config["agent"]["omit_hostname"] is True
    assert len(param.inputs["insecureValue"]) < 4096  # Standard tier limit


def test_p5_dashboard_and_idle_alarm(p5):
    spec, result = p5
    dash = one(result, "aws:cloudwatch/dashboard:Dashboard")
    assert dash.inputs["dashboardName"] == "gpuinfra-t-2-t3st0a"
    body = json.loads(dash.inputs["dashboardBody"])
    text = json.dumps(body)
    for metric in (
        "nvidia_smi_utilization_gpu",
        "nvidia_smi_memory_used",
        "nvidia_smi_power_draw",
        "nvidia_smi_temperature_gpu",
        "cpu_usage_active",
        "mem_used_percent",
        "disk_used_percent",
    ):
        assert metric in text
    assert body["widgets"][0]["properties"]["annotations"]["horizontal"][0]["value"] == 5
    alarm = one(result, "aws:cloudwatch/metricAlarm:MetricAlarm")
    assert {
        k: alarm.inputs[k]
        for k in (
            "name",
            "namespace",
            "metricName",
            "statistic",
            "period",
            "evaluationPeriods",
            "datapointsToAlarm",
            "threshold",
            "comparisonOperator",
            "treatMissingData",
        )
    } == {
        "name": "gpuinfra-t-2-t3st0a-gpus-idle",
        "namespace": "gpuinfra/t-2-t3st0a",
        "metricName": "nvidia_smi_utilization_gpu",
        "statistic": "Maximum",
        "period": 60,
        "evaluationPeriods": 30,
        "datapointsToAlarm": 30,
        "threshold": 5,
        "comparisonOperator": "LessThanThreshold",
        "treatMissingData": "missing",
    }
    assert "dimensions" not in alarm.inputs  # the cluster-wide roll-up: every GPU of every node
    topic = one(result, "aws:sns/topic:Topic")
    assert alarm.inputs["alarmActions"] == [f"arn:preview:aws:sns/topic:Topic:{topic.name}"]
    assert result.of_type("aws:sns/topicSubscription:TopicSubscription") == []
    assert result.outputs["monitoring_namespace"] == "gpuinfra/t-2-t3st0a"


def test_p5_node_role_adds_only_put_metric_data_into_its_namespace_and_reads_its_parameter(p5):
    """Monitoring adds metric writes into the stack's namespace and the read of the agent's one
    configuration parameter; the node role has no managed policy (evaluated against other stacks'
    parameters in tests/blueprints/test_node_iam.py)."""
    spec, result = p5
    policy = next(r for r in result.of_type("aws:iam/rolePolicy:RolePolicy") if r.name == "t-2-node-monitoring")
    doc = json.loads(policy.inputs["policy"])
    assert doc["Statement"] == [
        {
            "Sid": "PutStackMetrics",
            "Effect": "Allow",
            "Action": ["cloudwatch:PutMetricData"],
            "Resource": "*",
            "Condition": {"StringEquals": {"cloudwatch:namespace": "gpuinfra/t-2-t3st0a"}},
        },
        {
            "Sid": "ReadAgentConfiguration",
            "Effect": "Allow",
            "Action": ["ssm:GetParameter"],
            "Resource": ["arn:aws:ssm:us-east-1:123456789012:parameter/gpuinfra/t-2-t3st0a/cloudwatch-agent"],
        },
    ]
    attached = {r.inputs["policyArn"] for r in result.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    assert attached == set()


def test_alarm_email_adds_a_subscription_and_monitoring_off_removes_everything():
    spec = make_spec(
        "p5.48xlarge",
        nodes=1,
        profile_updates={"monitoring": {"enabled": True, "idle_alarm_minutes": 45, "alarm_email": "ops@example.com"}},
    )
    result = preview(spec)
    sub = one(result, "aws:sns/topicSubscription:TopicSubscription")
    assert (sub.inputs["protocol"], sub.inputs["endpoint"]) == ("email", "ops@example.com")
    assert one(result, "aws:cloudwatch/metricAlarm:MetricAlarm").inputs["evaluationPeriods"] == 45
    off = preview(make_spec("p5.48xlarge", nodes=1, profile_updates={"monitoring": {"enabled": False}}))
    tokens = {r.type for r in off.resources}
    assert not tokens & {
        "aws:cloudwatch/dashboard:Dashboard",
        "aws:cloudwatch/metricAlarm:MetricAlarm",
        "aws:ssm/parameter:Parameter",
        "aws:sns/topic:Topic",
        "gpuinfra:aws:Monitoring",
    }
    assert "t-1-node-monitoring" not in {r.name for r in off.resources}
    assert not any(k.startswith("monitoring_") for k in off.outputs)


def test_p5_cost_preview_prices_metrics_dashboard_and_alarm(p5):
    spec, result = p5
    est = estimate(result.resources, load_catalog(), spec.region, NO_USAGE, Decimal(24))
    lines = {x.component: x for x in est.lines if x.resource.startswith("t-2-") and "CloudWatch" in x.component}
    # 2 nodes x (4 GPU metrics x 8 GPUs + 3 host metrics) + 7 cluster roll-ups = 77 metrics at $0.30 a month
    metrics = lines["CloudWatch custom metrics (77: 4 per GPU, 3 per node, cluster roll-ups)"]
    assert metrics.unit_price_usd == Decimal("0.30") and monthly(metrics) == Decimal("23.10")
    assert "aws.amazon.com/cloudwatch/pricing" in metrics.source
    assert monthly(lines["CloudWatch dashboard"]) == Decimal("3.00")
    assert monthly(lines["CloudWatch alarm (standard resolution, 1 metric)"]) == Decimal("0.10")
    puts = lines["CloudWatch PutMetricData (60 per node-hour)"]
    assert puts.hourly_usd == Decimal("0.0012")  # 120 requests an hour at $0.01 per 1,000
    assert not est.not_priced


def test_a3_mega_ops_agent_dashboard_alert_and_role(a3):
    spec, result = a3
    dash = one(result, "gcp:monitoring/dashboard:Dashboard")
    text = dash.inputs["dashboardJson"]
    assert "agent.googleapis.com/gpu/utilization" in text and "agent.googleapis.com/gpu/memory/bytes_used" in text
    policy = one(result, "gcp:monitoring/alertPolicy:AlertPolicy")
    condition = policy.inputs["conditions"][0]["conditionThreshold"]
    assert condition["filter"] == (
        'metric.type = "agent.googleapis.com/gpu/utilization" AND resource.type = '
        '"gce_instance" AND metadata.user_labels."gpuinfra-stack-id" = "t-2-t3st0a"'
    )
    assert (condition["comparison"], condition["thresholdValue"], condition["duration"]) == (
        "COMPARISON_LT",
        5,
        "1800s",
    )
    assert condition["evaluationMissingData"] == "EVALUATION_MISSING_DATA_NO_OP"  # no samples: keep the state
    assert condition["aggregations"] == [
        {
            "alignmentPeriod": "60s",
            "perSeriesAligner": "ALIGN_MEAN",
            "crossSeriesReducer": "REDUCE_MAX",
            "groupByFields": [],
        }
    ]
    assert policy.inputs["combiner"] == "OR" and policy.inputs.get("notificationChannels", []) == []
    members = {r.inputs["role"]: r for r in result.of_type("gcp:projects/iAMMember:IAMMember")}
    assert members["roles/monitoring.metricWriter"].inputs["member"].startswith("serviceAccount:")
    assert "roles/logging.logWriter" not in members  # the agent's logging pipeline is off


def test_a3_mega_cost_preview_prices_ingestion_and_alerting(a3):
    spec, result = a3
    est = estimate(result.resources, load_catalog(), spec.region, NO_USAGE, Decimal(24))
    lines = {x.component: x for x in est.lines}
    # 2 VMs x (8 GPUs x (1 utilization + 2 memory states) + 8 CPU states + 5 memory states) = 74 series,
    # 60 points an hour x 8 bytes = 35,520 B = 0.033874... MiB an hour at $0.2580 per MiB
    ingest = lines["Ops Agent metrics ingested (74 series x 60 points/h x 8 B)"]
    assert ingest.hourly_quantity == Decimal(35520) / Decimal(1048576)
    assert ingest.unit_price_usd == Decimal("0.2580") and ingest.price_date == "2018-07-01"
    assert monthly(lines["Alerting policy condition (1)"]) == Decimal("1.50")
    # one series per 30-second execution period (cost-control page): 120 an hour at $0.35 per million
    assert lines["Alerting time series returned (120 per hour)"].hourly_usd == Decimal("0.000042")
    dashboard = next(r for r in result.resources if r.type == "gcp:monitoring/dashboard:Dashboard")
    assert dashboard.name in est.free
    assert not est.not_priced


def test_every_dashboard_metric_entry_is_an_array_and_searches_quote_the_namespace(p5):
    """CloudWatch-Dashboard-Body-Structure.html: ``metrics`` is an array of arrays; search-expression-
    syntax.html: a namespace with non-alphanumeric characters ("gpuinfra/t-2") is double-quoted."""
    spec, result = p5
    body = json.loads(one(result, "aws:cloudwatch/dashboard:Dashboard").inputs["dashboardBody"])
    searches = []
    for widget in body["widgets"]:
        entries = widget["properties"]["metrics"]
        assert entries and all(isinstance(entry, list) and entry for entry in entries), widget["properties"]["title"]
        for entry in entries:
            searches += [item["expression"] for item in entry if isinstance(item, dict) and "expression" in item]
            if isinstance(entry[0], str):
                assert entry[0] == "gpuinfra/t-2-t3st0a"  # [namespace, metric name, {options}]
    assert len(searches) == 4
    for expression in searches:
        assert expression.startswith('SEARCH(\'"gpuinfra/t-2-t3st0a" MetricName="nvidia_smi_'), expression
        assert expression.endswith("', 60)") and "{" not in expression  # schema-less: any dimension set


def test_unknown_instance_type_prices_no_metrics_never_zero():
    from gpuinfra.cost.estimate import ClusterFacts
    from gpuinfra.cost.monitoring import monitoring_lines

    facts = ClusterFacts(cloud="aws", region="us-east-1", instance_type="p9.nonexistent", nodes=2)
    lines = monitoring_lines(
        "t-param", "aws:ssm/parameter:Parameter", facts, load_catalog(), {"name": "/gpuinfra/t/cloudwatch-agent"}
    )
    assert [(x.component, x.unit_price_usd, x.hourly_usd) for x in lines] == [("CloudWatch custom metrics", None, None)]
    assert "GPUs per node of p9.nonexistent unknown" in lines[0].source
    gcp_facts = ClusterFacts(cloud="gcp", region="us-central1", instance_type="a9-nonexistent", nodes=1)
    gcp = monitoring_lines(
        "t-writer",
        "gcp:projects/iAMMember:IAMMember",
        gcp_facts,
        load_catalog(),
        {"role": "roles/monitoring.metricWriter"},
    )
    assert [x.unit_price_usd for x in gcp] == [None]


def test_stack_label_for_status_matches_the_blueprints_labels():
    from gpuinfra.monitoring.metrics import gcp_stack_label
    from gpuinfra.plan.tags import gcp_labels

    for name in ("t-2", "Train_Big.v2", "x" * 80):
        spec = make_spec("a3-megagpu-8g", cloud="gcp").model_copy(update={"stack": name})
        assert gcp_stack_label(name) == gcp_labels(spec)["gpuinfra-stack"]
