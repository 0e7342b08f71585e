"""The profile's ``monitoring.job_logs``: the job's log file also goes to CloudWatch Logs / Cloud
Logging. Offline previews of a p5 and an a3-megagpu-8g stack with the setting on (the log group with
its retention, the node role's exact log statement, the agents' configurations, the GCP role
binding) and off (none of them), and the cost preview's lines from the cited prices.

External facts checked: CloudWatch Logs retention values (PutRetentionPolicy ``retentionInDays``,
read here from botocore's logs service model, shape ``Days``); the log group / stream ARN forms
(docs.aws.amazon.com/service-authorization/latest/reference/list_amazoncloudwatchlogs.html); the
agent config keys (CloudWatch-Agent-Configuration-File-Details.html "Logs section"; Ops Agent
configuration#logging-receivers); prices: us-east-1 $0.50 per GB ingested and $0.03 per GB-month
stored (aws.amazon.com/cloudwatch/pricing, Logs tab), Cloud Logging $0.50 per GiB
(cloud.google.com/stackdriver/pricing).
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import botocore
import pytest
import yaml

from gpuinfra.catalog.store import load_catalog
from gpuinfra.cost.estimate import estimate
from gpuinfra.errors import ProfileError
from gpuinfra.plan.monitoring_node import GCP_AGENT_CONFIG_SOURCE, monitoring_node_files
from gpuinfra.profiles import CLOUDWATCH_LOG_RETENTION_DAYS, MonitoringSettings, get_profile
from tests.blueprints.helpers import make_spec, preview

NO_USAGE = {"bucket_storage_gb": Decimal(0), "internet_egress_gb": Decimal(0), "nat_processed_gb": Decimal(0)}
ON = {"monitoring": {"enabled": True, "idle_alarm_minutes": 30, "job_logs": True, "job_log_retention_days": 14}}


@pytest.fixture(scope="module")
def p5_on():
    spec = make_spec("p5.48xlarge", nodes=2, profile_updates=ON)
    return spec, preview(spec)


@pytest.fixture(scope="module")
def p5_off():
    spec = make_spec("p5.48xlarge", nodes=2)
    return spec, preview(spec)


@pytest.fixture(scope="module")
def a3_on():
    spec = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp", profile_updates=ON)
    return spec, preview(spec)


def agent_config(result) -> dict:
    (param,) = result.of_type("aws:ssm/parameter:Parameter")
    return json.loads(param.inputs["insecureValue"])


def monitoring_statements(result) -> list[dict]:
    policy = next(r for r in result.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.endswith("-node-monitoring"))
    return json.loads(policy.inputs["policy"])["Statement"]


def test_retention_values_are_the_ones_cloudwatch_accepts():
    model = Path(botocore.__file__).parent / "data" / "logs" / "2014-03-28" / "service-2.json.gz"
    doc = json.loads(gzip.decompress(model.read_bytes()))["shapes"]["Days"]["documentation"]
    listed = doc.split("Possible values are:")[1].split(".")[0].replace("and", "")
    assert tuple(int(v) for v in listed.split(",")) == CLOUDWATCH_LOG_RETENTION_DAYS
    with pytest.raises(ValueError, match="not a CloudWatch Logs retention"):
        MonitoringSettings(job_logs=True, job_log_retention_days=10)
    with pytest.raises(ValueError, match="needs monitoring.enabled: true"):
        MonitoringSettings(enabled=False, job_logs=True)
    assert MonitoringSettings().job_logs is False  # off unless a profile turns it on


def test_a_profile_file_with_a_bad_retention_is_refused_with_the_field(tmp_path):
    base = get_profile("llm-finetune").model_dump(exclude={"name"})
    base["monitoring"] = {"job_logs": True, "job_log_retention_days": 45}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"logs": base}))
    with pytest.raises(ProfileError, match="monitoring.job_log_retention_days"):
        get_profile("logs", tmp_path)


def test_p5_on_declares_the_log_group_with_its_retention(p5_on):
    spec, result = p5_on
    (group,) = result.of_type("aws:cloudwatch/logGroup:LogGroup")
    assert group.inputs["name"] == "/gpuinfra/t-2-t3st0a/job"  # /gpuinfra/<stack id>/job
    assert group.inputs["retentionInDays"] == 14
    assert not group.retain_on_delete  # destroy removes it with the stack
    assert result.outputs["monitoring_job_log_group"] == "/gpuinfra/t-2-t3st0a/job"


def test_p5_on_agent_collects_the_job_log_into_one_stream_per_instance(p5_on):
    spec, result = p5_on
    config = agent_config(result)
    assert config["logs"] == {
        "logs_collected": {
            "files": {
                "collect_list": [
                    {
                        "file_path": "/var/log/gpuinfra/job.log",
                        "log_group_name": "/gpuinfra/t-2-t3st0a/job",
                        "log_stream_name": "{instance_id}",
                        "timezone": "UTC",
                    }
                ]
            }
        }
    }
    (param,) = result.of_type("aws:ssm/parameter:Parameter")
    assert len(param.inputs["insecureValue"]) < 4096  # SSM Standard tier limit


def test_p5_on_node_role_may_write_only_into_that_group(p5_on):
    spec, result = p5_on
    statements = monitoring_statements(result)
    assert statements[-1] == {
        "Sid": "ShipJobLog",
        "Effect": "Allow",
        "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
        "Resource": [
            "arn:aws:logs:us-east-1:123456789012:log-group:/gpuinfra/t-2-t3st0a/job",
            "arn:aws:logs:us-east-1:123456789012:log-group:/gpuinfra/t-2-t3st0a/job:log-stream:*",
        ],
    }
    actions = [a for s in statements for a in s["Action"]]
    assert not {"logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:DeleteLogGroup"} & set(actions)


def test_p5_off_has_no_log_group_statement_or_logs_section(p5_off, p5_on):
    spec, result = p5_off
    assert result.of_type("aws:cloudwatch/logGroup:LogGroup") == []
    assert "logs" not in agent_config(result)
    assert [s["Sid"] for s in monitoring_statements(result)] == ["PutStackMetrics", "ReadAgentConfiguration"]
    assert "monitoring_job_log_group" not in result.outputs
    # on adds exactly the group (and changes the parameter and policy): nothing else
    on_types = sorted(r.type for r in p5_on[1].resources)
    off_types = sorted(r.type for r in result.resources)
    assert on_types == sorted([*off_types, "aws:cloudwatch/logGroup:LogGroup"])


def test_a3_on_ops_agent_receiver_pipeline_and_log_writer(a3_on):
    spec, result = a3_on
    members = {r.inputs["role"]: r for r in result.of_type("gcp:projects/iAMMember:IAMMember")}
    writer = members["roles/logging.logWriter"]
    assert writer.inputs["member"] == members["roles/monitoring.metricWriter"].inputs["member"]
    assert writer.inputs["member"].startswith("serviceAccount:")
    config = yaml.safe_load(monitoring_node_files(spec, "gcp")[GCP_AGENT_CONFIG_SOURCE])
    assert config["logging"]["receivers"] == {
        "gpuinfra_job": {"type": "files", "include_paths": ["/var/log/gpuinfra/job.log"]}
    }
    pipelines = config["logging"]["service"]["pipelines"]
    assert pipelines["gpuinfra_job"] == {"receivers": ["gpuinfra_job"]}
    assert pipelines["default_pipeline"] == {"receivers": []}  # syslog stays out of Cloud Logging


def test_a3_off_has_no_receiver_and_no_log_writer():
    spec = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp")
    result = preview(spec)
    assert "roles/logging.logWriter" not in {
        r.inputs["role"] for r in result.of_type("gcp:projects/iAMMember:IAMMember")
    }
    config = yaml.safe_load(monitoring_node_files(spec, "gcp")[GCP_AGENT_CONFIG_SOURCE])
    assert config["logging"] == {"service": {"pipelines": {"default_pipeline": {"receivers": []}}}}


def test_p5_on_cost_prices_ingestion_and_retention(p5_on):
    spec, result = p5_on
    est = estimate(result.resources, load_catalog(), spec.region, NO_USAGE, Decimal(24))
    lines = {x.component: x for x in est.lines if x.resource_type == "aws:cloudwatch/logGroup:LogGroup"}
    ingest = lines["CloudWatch Logs job log ingested (0.01 GB per node-hour assumed)"]
    # 2 nodes x 0.01 GB an hour at $0.50 per GB (us-east-1)
    assert ingest.hourly_quantity == Decimal("0.02") and ingest.unit_price_usd == Decimal("0.5")
    assert ingest.hourly_usd == Decimal("0.01") and ingest.usage_based
    stored = lines["CloudWatch Logs job log stored (14 days retention)"]
    # 0.02 GB kept 14 days = 0.02 x 336 / 730 GB-months at $0.03
    assert stored.hourly_quantity == Decimal("0.02") * 14 * 24 / Decimal(730)
    assert stored.unit_price_usd == Decimal("0.03") and stored.price_date == "2025-06-05"
    assert not est.not_priced


def test_a3_on_cost_prices_cloud_logging_ingestion(a3_on):
    spec, result = a3_on
    est = estimate(result.resources, load_catalog(), spec.region, NO_USAGE, Decimal(24))
    (line,) = [x for x in est.lines if x.component.startswith("Cloud Logging job log ingested")]
    # 2 nodes x 0.01 GB = 2e7 bytes an hour = 0.018626... GiB at $0.50
    assert line.hourly_quantity == Decimal(2 * 10**7) / Decimal(2**30)
    assert line.unit_price_usd == Decimal("0.5") and line.price_date == "2018-07-01" and line.usage_based
    assert not est.not_priced


def test_a_region_without_a_logs_price_is_unpriced_never_zero():
    from gpuinfra.cost.estimate import ClusterFacts
    from gpuinfra.cost.monitoring import monitoring_lines

    facts = ClusterFacts(cloud="aws", region="ap-south-2", instance_type="p5.48xlarge", nodes=2)
    lines = monitoring_lines(
        "t-job-logs", "aws:cloudwatch/logGroup:LogGroup", facts, load_catalog(), {"retentionInDays": 30}
    )
    assert [(x.unit_price_usd, x.hourly_usd) for x in lines] == [(None, None), (None, None)]
    assert "no CloudWatch Logs price for ap-south-2" in lines[0].source
    facts = ClusterFacts(cloud="aws", region="us-east-1", instance_type="p5.48xlarge", nodes=2)
    no_retention = monitoring_lines("t-job-logs", "aws:cloudwatch/logGroup:LogGroup", facts, load_catalog(), {})
    assert no_retention[1].unit_price_usd is None and no_retention[1].source == "log group retention unknown"
