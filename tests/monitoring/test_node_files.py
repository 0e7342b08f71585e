"""Node files of monitoring: the unit the boot enables, its script (shellcheck-clean), the Ops
Agent configuration on GCP, and nothing when the profile turns monitoring off."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from gpuinfra.plan.monitoring_node import (
    AWS_AGENT_PACKAGE_URL,
    GCP_AGENT_CONFIG_PATH,
    GCP_AGENT_CONFIG_SOURCE,
    MONITORING_UNITS,
    SCRIPT_PATH,
    UNIT_PATH,
    monitoring_node_files,
)
from tests.blueprints.helpers import make_spec, need_tool


@pytest.mark.parametrize(
    "cloud, instance_type, paths",
    [
        ("aws", "p5.48xlarge", [UNIT_PATH, SCRIPT_PATH]),
        ("gcp", "a3-megagpu-8g", [UNIT_PATH, SCRIPT_PATH, GCP_AGENT_CONFIG_SOURCE]),
    ],
)
def test_files_units_and_shellcheck(cloud, instance_type, paths, tmp_path):
    files = monitoring_node_files(make_spec(instance_type, cloud=cloud), cloud)
    assert sorted(files) == sorted(paths) and all(text.endswith("\n") for text in files.values())
    assert MONITORING_UNITS == ("gpuinfra-monitoring.service",) and UNIT_PATH.endswith(MONITORING_UNITS[0])
    unit = files[UNIT_PATH]
    assert f"ExecStart=/bin/bash {SCRIPT_PATH}" in unit and "WantedBy=multi-user.target" in unit
    # a failing install is retried a bounded number of times (systemd.unit(5)), not forever
    unit_section = unit.split("[Service]")[0]
    assert "StartLimitIntervalSec=3600" in unit_section and "StartLimitBurst=3" in unit_section
    script = tmp_path / "gpuinfra-monitoring.sh"
    script.write_text(files[SCRIPT_PATH])
    result = subprocess.run([need_tool("shellcheck"), "--severity=style", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_aws_script_fetches_the_stack_parameter_and_installs_the_pinned_agent():
    script = monitoring_node_files(make_spec("p5.48xlarge"), "aws")[SCRIPT_PATH]
    assert '-a fetch-config -m ec2 -c "ssm:/gpuinfra/t-1-t3st0a/cloudwatch-agent" -s' in script
    assert AWS_AGENT_PACKAGE_URL == (
        "https://amazoncloudwatch-agent.s3.amazonaws.com/ubuntu/amd64/1.300072.0b1766/amazon-cloudwatch-agent.deb"
    )
    assert f'"{AWS_AGENT_PACKAGE_URL}"' in script and 'dpkg -i -E "$deb"' in script


def test_gcp_ops_agent_config_keeps_gpu_metrics_and_drops_the_rest():
    files = monitoring_node_files(make_spec("a3-megagpu-8g", cloud="gcp"), "gcp")
    script = files[SCRIPT_PATH]
    assert GCP_AGENT_CONFIG_PATH not in files  # the package's folder: written only after the package is in
    assert (GCP_AGENT_CONFIG_SOURCE, GCP_AGENT_CONFIG_PATH) == (
        "/etc/gpuinfra/ops-agent.yaml",
        "/etc/google-cloud-ops-agent/config.yaml",
    )
    install_agent = script.index('--also-install --version="2.41.0"')
    copy_config = script.index(
        'install -m 0644 "/etc/gpuinfra/ops-agent.yaml" "/etc/google-cloud-ops-agent/config.yaml"'
    )
    restart = script.index("systemctl restart google-cloud-ops-agent")
    assert install_agent < copy_config < restart
    config = yaml.safe_load(files[GCP_AGENT_CONFIG_SOURCE])
    assert config["logging"]["service"]["pipelines"]["default_pipeline"]["receivers"] == []
    assert config["metrics"]["service"]["pipelines"]["default_pipeline"] == {
        "receivers": ["hostmetrics"],
        "processors": ["gpuinfra_exclude"],
    }
    excluded = config["metrics"]["processors"]["gpuinfra_exclude"]["metrics_pattern"]
    assert "agent.googleapis.com/gpu/processes/*" in excluded
    assert not any(
        p.startswith(("agent.googleapis.com/gpu/utilization", "agent.googleapis.com/gpu/memory")) for p in excluded
    )


def test_nothing_when_monitoring_is_off():
    spec = make_spec("p5.48xlarge", profile_updates={"monitoring": {"enabled": False}})
    assert monitoring_node_files(spec, "aws") == {} and monitoring_node_files(spec, "gcp") == {}
    with pytest.raises(ValueError, match="unknown cloud 'azure'"):
        monitoring_node_files(make_spec("p5.48xlarge"), "azure")
