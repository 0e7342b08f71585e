"""``gpuinfra.plan.cluster.plan_cluster``: one cloud-neutral plan per spec, made from the cloud's
planner without Pulumi (the components in ``blueprints/`` register resources from it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuinfra.agent.constants import SCRATCH_MOUNT, TORCHRUN_PORT
from gpuinfra.plan.aws import plan_aws_cluster
from gpuinfra.plan.cluster import plan_cluster
from gpuinfra.plan.gcp import nccl_env, plan_gcp_cluster
from gpuinfra.plan.health import deployed_network
from gpuinfra.plan.node_bundle import BUNDLE_PREFIX
from tests.health.conftest import spec_for

ROOT = Path(__file__).resolve().parents[2]


def test_aws_plan_wraps_the_aws_planner():
    spec = spec_for("p5.48xlarge", 2)
    plan = plan_cluster(spec)
    assert plan.cloud == "aws" and plan.gcp is None
    assert plan.aws == plan_aws_cluster(spec)
    # p5.48xlarge: 32 EFA devices, one launch-template interface per network card
    assert (plan.network.efa_per_node, plan.network.nics_per_node) == (32, 32)
    assert (plan.network.efa_per_node, plan.network.nic_layout) == deployed_network(spec)
    assert plan.placement.compact and plan.placement.existing_group is None
    assert (plan.nodes.count, plan.nodes.instance_type, plan.nodes.gpus_per_node) == (2, "p5.48xlarge", 8)
    assert plan.storage.bucket_scheme == "s3" and plan.storage.node_bundle_key == plan.node_bundle.key
    assert plan.storage.scratch_mount == SCRATCH_MOUNT
    assert plan.identity.bucket_read_only_prefix == BUNDLE_PREFIX and plan.identity.remote_shell == "ssm"
    assert plan.outputs.torchrun_port == TORCHRUN_PORT
    assert plan.outputs.run_command.startswith("aws ssm send-command")


def test_gcp_plan_wraps_the_gcp_planner():
    spec = spec_for("a3-megagpu-8g", 2)
    plan = plan_cluster(spec)
    assert plan.cloud == "gcp" and plan.aws is None
    assert plan.gcp == plan_gcp_cluster(spec)
    assert (plan.network.efa_per_node, plan.network.nic_layout) == deployed_network(spec) == (0, "tcpxo")
    assert plan.network.nics_per_node == plan.gcp.nic_count
    assert plan.storage.bucket_scheme == "gs" and plan.storage.scratch_disks == plan.gcp.local_ssd_count
    assert plan.nodes.market == plan.gcp.provisioning_model
    assert plan.identity.peer_discovery == "own-instance-group"
    assert plan.outputs.nccl_env == nccl_env("tcpxo")


def test_the_plan_package_does_not_load_pulumi():
    # a fresh interpreter: other tests of this session have loaded Pulumi already
    code = (
        "import sys, gpuinfra.plan.cluster, gpuinfra.plan.health; "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_aws', 'pulumi_gcp')]"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
