"""What every node of a cluster must show at its boot health gate, as the plan deploys it.

The blueprints bake these expectations into the node bundle at render time
(``/etc/gpuinfra/health-expectations.json``); the operator side
(:mod:`gpuinfra.services.health_report`) judges results against the same expectations. GPUs per node
come from the spec (GCP N1 hosts take attached GPUs), EFA devices and the network from the
cluster plan (:func:`gpuinfra.plan.aws.plan_aws_cluster` / :func:`gpuinfra.plan.gcp.plan_gcp_cluster`:
with ``high_bandwidth_networking: off`` they attach no EFA / GPU NICs), NVSwitch from the facts,
the bus-bandwidth baseline for that node count and network from the table
(:mod:`gpuinfra.health.baselines`, keyed by the fabric's
:attr:`~gpuinfra.fabrics.Fabric.baseline_network`).
"""

from __future__ import annotations

from gpuinfra.fabrics import fabric_for
from gpuinfra.health.baselines import find_baseline
from gpuinfra.health.gate import BUSBW_PASS_FRACTION, Expectations
from gpuinfra.plan.aws import plan_aws_cluster
from gpuinfra.plan.gcp import plan_gcp_cluster
from gpuinfra.plan.model import aws_network, gcp_network
from gpuinfra.spec import ClusterSpec


def deployed_network(spec: ClusterSpec) -> tuple[int, str]:
    """``(EFA devices per node, nic_layout)`` as the plan deploys ``spec``: read from the
    cluster plan, so the rule (EFA and GPU NICs only unless the profile turns
    high-bandwidth networking off) lives in one place.

    Raises:
        SpecError / RuleViolationError: the spec breaks a rule the planner enforces.
    """
    network = aws_network(spec, plan_aws_cluster(spec)) if spec.cloud == "aws" else gcp_network(plan_gcp_cluster(spec))
    return network.efa_per_node, network.nic_layout


def expectations_for(spec: ClusterSpec, busbw_pass_fraction: float = BUSBW_PASS_FRACTION) -> Expectations:
    """What every node of the stack ``spec`` describes must show, as deployed.

    Args:
        spec: the stack's cluster spec (``gpuinfra:cluster``).
        busbw_pass_fraction: share of the baseline a node must reach (0 to 1).

    Raises:
        SpecError / RuleViolationError: the cluster plan refuses the spec.
    """
    efa_count, nic_layout = deployed_network(spec)
    facts = spec.facts
    return Expectations(
        cloud=spec.cloud,
        instance_type=spec.instance_type,
        nodes=spec.nodes,
        gpu_count=spec.gpu_count,
        efa_count=efa_count,
        nvswitch=facts.nvswitch,
        nic_layout=nic_layout,
        baseline=find_baseline(spec.cloud, spec.instance_type, spec.nodes, fabric_for(nic_layout).baseline_network),
        busbw_pass_fraction=busbw_pass_fraction,
    )
