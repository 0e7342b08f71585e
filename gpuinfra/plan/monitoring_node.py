"""Node files of GPU monitoring: a systemd unit that installs (when the image lacks it) and
starts the cloud's agent once per boot, its script, and on GCP the Ops Agent configuration.

The boot puts these files in place and enables :data:`MONITORING_UNITS` (the node bundle of
the boot scripts); nothing here reaches a cloud.

* AWS: the CloudWatch agent reads its configuration from the stack's SSM parameter
  (:func:`gpuinfra.monitoring.metrics.aws_agent_parameter_name`, written by
  :class:`blueprints.aws.monitoring.AwsMonitoring`), so the node carries only the parameter
  name. The Deep Learning Base AMI's release notes do not list the CloudWatch agent, so when
  ``amazon-cloudwatch-agent-ctl`` is absent the pinned package :data:`AWS_AGENT_VERSION` is
  installed from AWS's download bucket (URL pattern of docs.aws.amazon.com/AmazonCloudWatch/
  latest/monitoring/download-cloudwatch-agent-commandline.html, versioned path
  ``ubuntu/amd64/<version>/amazon-cloudwatch-agent.deb``).
* GCP: the Ops Agent pinned to :data:`GCP_AGENT_VERSION` through Google's repository script
  (``add-google-cloud-ops-agent-repo.sh --also-install --version=X.Y.Z``). Its configuration
  (:func:`gpuinfra.monitoring.metrics.gcp_ops_agent_config`) ships at
  :data:`GCP_AGENT_CONFIG_SOURCE`, not in the package's folder: the package owns
  ``/etc/google-cloud-ops-agent/config.yaml`` and would meet a file it did not install there.
  The script installs the agent first, then ``install -m 0644`` copies the file to
  :data:`GCP_AGENT_CONFIG_PATH` and restarts the agent (cloud.google.com/stackdriver/docs/
  solutions/agents/ops-agent/configuration: "restart the agent" after editing the file).
"""

from __future__ import annotations

import yaml

from gpuinfra.monitoring.metrics import gcp_ops_agent_config
from gpuinfra.plan.naming import aws_agent_parameter
from gpuinfra.plan.units import SystemdUnit, command
from gpuinfra.spec import ClusterSpec
from gpuinfra.templating import render

MONITORING_UNIT = "gpuinfra-monitoring.service"
#: Units the boot must enable (and start) on every node when monitoring is on.
MONITORING_UNITS = (MONITORING_UNIT,)
SCRIPT_PATH = "/usr/local/sbin/gpuinfra-monitoring"
#: Where the Ops Agent reads its configuration; where gpuinfra ships it until the agent is in.
GCP_AGENT_CONFIG_PATH = "/etc/google-cloud-ops-agent/config.yaml"
GCP_AGENT_CONFIG_SOURCE = "/etc/gpuinfra/ops-agent.yaml"
#: systemd restarts of a failing start: at most ``BURST`` tries in ``INTERVAL`` seconds, then
#: the unit stays failed (systemd.unit(5) StartLimitIntervalSec= / StartLimitBurst=). With
#: RestartSec=60 and a start timeout of 900 s, 3 tries in an hour, then it gives up.
START_LIMIT_INTERVAL_SECONDS = 3600
START_LIMIT_BURST = 3

#: CloudWatch agent release installed when the image has none (a released version: its
#: versioned package path is quoted by public build scripts, e.g. ``1.300072.0b1766``).
AWS_AGENT_VERSION = "1.300072.0b1766"
AWS_AGENT_PACKAGE_URL = (
    f"https://amazoncloudwatch-agent.s3.amazonaws.com/ubuntu/amd64/{AWS_AGENT_VERSION}/amazon-cloudwatch-agent.deb"
)
#: Ops Agent release (GoogleCloudPlatform/ops-agent VERSION file: ``2.41.0``).
GCP_AGENT_VERSION = "2.41.0"
GCP_AGENT_REPO_SCRIPT_URL = "https://dl.google.com/cloudagents/add-google-cloud-ops-agent-repo.sh"


def monitoring_systemd_unit(agent_name: str) -> SystemdUnit:
    """``gpuinfra-monitoring.service``: installs (if needed) and starts the monitoring agent
    ``agent_name`` once per boot. Wanted by multi-user.target, required by nothing: a failed
    agent never blocks training. A failing install is retried (60 s apart) at most
    :data:`START_LIMIT_BURST` times in :data:`START_LIMIT_INTERVAL_SECONDS`, then left failed."""
    return SystemdUnit(
        MONITORING_UNIT,
        f"gpuinfra monitoring agent ({agent_name})",
        wants=("network-online.target",),
        after=("network-online.target",),
        start_limit_interval_sec=START_LIMIT_INTERVAL_SECONDS,
        start_limit_burst=START_LIMIT_BURST,
        type="oneshot",
        remain_after_exit=True,
        timeout_start_sec=900,
        exec_start=(command("/bin/bash", SCRIPT_PATH),),
        restart="on-failure",
        restart_sec=60,
        delivery="bundle",
    )


#: Where :func:`monitoring_systemd_unit` goes.
UNIT_PATH = monitoring_systemd_unit("agent").path


def monitoring_node_files(spec: ClusterSpec, cloud: str) -> dict[str, str]:
    """Files the nodes of ``spec`` need for monitoring: absolute path -> content (each ends
    with a newline); ``{}`` when ``spec.profile.monitoring.enabled`` is false.

    Args:
        spec: the validated cluster spec.
        cloud: ``aws`` | ``gcp``.

    Raises:
        ValueError: an unknown ``cloud``.
    """
    if not spec.profile.monitoring.enabled:
        return {}
    if cloud == "aws":
        values = {
            "cloud": "aws",
            "agent_version": AWS_AGENT_VERSION,
            "agent_package_url": AWS_AGENT_PACKAGE_URL,
            "parameter_name": aws_agent_parameter(spec),
        }
        agent_name = "amazon-cloudwatch-agent"
        extra: dict[str, str] = {}
    elif cloud == "gcp":
        values = {
            "cloud": "gcp",
            "agent_version": GCP_AGENT_VERSION,
            "agent_repo_script_url": GCP_AGENT_REPO_SCRIPT_URL,
            "config_source": GCP_AGENT_CONFIG_SOURCE,
            "config_path": GCP_AGENT_CONFIG_PATH,
        }
        agent_name = "google-cloud-ops-agent"
        config = gcp_ops_agent_config(job_logs=spec.profile.monitoring.job_logs)
        extra = {
            GCP_AGENT_CONFIG_SOURCE: '# written by gpuinfra (README "Monitoring")\n'
            + yaml.safe_dump(config, sort_keys=False)
        }
    else:
        raise ValueError(f"unknown cloud {cloud!r}: use aws or gcp")
    files = {
        UNIT_PATH: monitoring_systemd_unit(agent_name).render(),
        SCRIPT_PATH: render("monitoring-agent.sh.j2", **values),
        **extra,
    }
    return {path: text if text.endswith("\n") else text + "\n" for path, text in files.items()}
