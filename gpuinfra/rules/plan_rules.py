"""Cloud rules over the typed cluster plan: the conformance check that needs no Pulumi.

The cluster planners (:func:`gpuinfra.plan.aws.plan_aws_cluster`,
:func:`gpuinfra.plan.gcp.plan_gcp_cluster`) decide, without Pulumi, what the components
register; the spec supplies the rest (node type and its facts, node count, zone, reservation).
:func:`check_plan` reads that pair and runs the *same* predicates the preview checks run
(:mod:`gpuinfra.rules.aws`, :mod:`gpuinfra.rules.gcp`): only the reader differs, no rule body
is written twice. A plan violation names its plan field as the resource (``plan.interfaces``).

Rules judged over the plan (:data:`PLAN_RULES`):

* AWS: ``aws-efa-interfaces`` and ``aws-no-public-ip-multi-nic`` (``plan.interfaces``),
  ``aws-placement-group`` (``plan.placement_group`` / ``placement_group_name`` with the node
  count, market and reservation), ``provisioning-model-offered`` (``plan.market``).
* GCP: ``nic-layout-matches-facts``, ``mtu-matches-facts`` and ``gcp-roce-no-firewall``
  (``plan.networks``), ``gcp-local-ssd-count`` (``plan.local_ssd_listed`` / interface),
  ``gcp-placement-supported`` and ``gcp-placement-max-vms`` (``plan.compact_placement`` /
  ``workload_policy`` with the node count and reservation), ``gcp-mig-all-or-nothing`` (bulk
  mode: ``plan.all_or_nothing`` against ``plan.provisioning_model``),
  ``provisioning-model-offered`` and ``gcp-reservation-bound`` (``plan.provisioning_model``),
  ``gcp-boot-disk-type`` (``plan.boot_disk_type``).

Rules that stay preview-only (:data:`PREVIEW_ONLY_RULES`, with the reason), because what they
judge is written by the components, not decided by the plan:

* ``aws-efa-sg-both-ways`` -- the security group rules and which group each interface names
  are resources of the network component;
* ``aws-imdsv2`` -- the launch template's metadata options are constants of the component;
* ``aws-ssh-not-world`` -- the security group rules are resources of the network component
  (the spec validation refuses a world-open ``network.ssh_cidr`` before any plan);
* ``aws-fleet-all-or-nothing`` -- the fleet's type and single-type / single-AZ / minimum
  capacity options are constants of the component;
* ``single-zone`` -- the plan has no zone of its own: the AZs of the subnets, the subnet each
  interface names and the MIGs' zones exist only in the resource graph;
* ``gcp-host-maintenance`` -- the template's scheduling constants;
* ``bucket-not-public``, ``bucket-same-region``, ``aws-s3-deny-insecure-transport`` -- bucket,
  access block and bucket policy resources;
* ``provider-valid-values`` -- the registered inputs' values against the installed provider
  SDKs' documented enums;
* ``node-values-grammar`` -- the boot text and tags the components render (the spec's own
  grammars refuse a bad value before any plan: gpuinfra/spec.py).

Parts of two plan rules are preview-only too: the placement group's ``strategy`` and the
workload policy's type (constants of the components), and the formation watchdog of
``gcp-mig-all-or-nothing`` (in the rendered startup script).

The remaining rules are judged on the spec, not on a plan or a graph: ``offered-in-zone`` and
``facts-current`` (:func:`gpuinfra.rules.check_offered_in_zone`,
:func:`gpuinfra.rules.check_facts_current`), ``budget-max-price`` (the cost preview), and the
refusals the planners raise before a plan exists (:data:`REFUSAL_RULES`).
"""

from __future__ import annotations

from typing import Any

from gpuinfra.rules import aws, gcp
from gpuinfra.rules.model import Violation

#: Rules :func:`check_plan` judges.
PLAN_RULES = frozenset(
    {
        "aws-efa-interfaces",
        "aws-no-public-ip-multi-nic",
        "aws-placement-group",
        "provisioning-model-offered",
        "nic-layout-matches-facts",
        "mtu-matches-facts",
        "gcp-roce-no-firewall",
        "gcp-local-ssd-count",
        "gcp-placement-supported",
        "gcp-placement-max-vms",
        "gcp-mig-all-or-nothing",
        "gcp-mig-replaces-lost-nodes",
        "gcp-reservation-bound",
        "gcp-boot-disk-type",
    }
)

#: Rules only the preview checks judge -> why the plan cannot (see the module docstring).
PREVIEW_ONLY_RULES: dict[str, str] = {
    "aws-efa-sg-both-ways": "security group rules are resources of the network component",
    "aws-imdsv2": "metadata options are constants of the launch template",
    "aws-ssh-not-world": "security group rules are resources of the network component",
    "aws-fleet-all-or-nothing": "fleet type and options are constants of the fleet",
    "aws-spot-replacement": "the rule, target, function and permission are resources of the replacement component",
    "single-zone": "subnet AZs, interface subnets and MIG zones exist only in the resource graph",
    "gcp-host-maintenance": "scheduling constants of the instance template",
    "bucket-not-public": "bucket and access block resources",
    "bucket-same-region": "the bucket resource's location",
    "aws-s3-deny-insecure-transport": "the bucket policy resource",
    "provider-valid-values": "registered input values against the provider SDKs' enums",
    "node-values-grammar": "the rendered user data / startup script and the tags exist only in the resource graph",
}

#: Rules a planner (or :func:`gpuinfra.planner.plan_cluster`) refuses with before any plan
#: exists, and rules judged on the spec and the catalog or the cost preview.
REFUSAL_RULES = frozenset(
    {
        "high-bandwidth-nics",
        "fabric-installable-at-boot",
        "aws-capacity-reservation",
        "profile-spot-policy",
        "price-known",
        "scratch-capacity",
        "offered-in-zone",
        "facts-current",
        "budget-max-price",
        "baked-image",
    }
)


def check_plan(spec: Any, plan: Any) -> list[Violation]:
    """Every rule of :data:`PLAN_RULES` over ``plan``, with the facts the spec carries.

    Args:
        spec: the :class:`~gpuinfra.spec.ClusterSpec` the plan was made from (node type, facts,
            node count, capacity reservation / GCP reservation).
        plan: its :class:`~gpuinfra.plan.aws.AwsClusterPlan` (``spec.cloud == "aws"``) or
            :class:`~gpuinfra.plan.gcp.GcpClusterPlan` (``"gcp"``), e.g. from
            :func:`gpuinfra.plan.cluster.cloud_plan` (the rules sit below the plan and never import it).

    Returns:
        Violations sorted by rule, resource (the plan field) and message; empty when the plan
        conforms.
    """
    found = _aws(spec, plan) if spec.cloud == "aws" else _gcp(spec, plan)
    return sorted(set(found), key=lambda v: (v.rule, v.resource, v.message))


def _aws(spec: Any, plan: Any) -> list[Violation]:
    fact = spec.facts
    nics = [
        aws.Nic(i.network_card_index, i.device_index, i.interface_type, i.associate_public_ip_address)
        for i in plan.interfaces
    ]
    grouped = plan.placement_group or bool(plan.placement_group_name)
    return [
        *aws.efa_interface_violations("plan.interfaces", fact, nics),
        *aws.public_ip_violations("plan.interfaces", nics),
        *aws.placement_group_violations(
            "plan.placement_group", fact, spec.nodes, grouped, plan.market, bool(spec.capacity_reservation_id)
        ),
        *aws.market_violations("plan.market", fact, plan.market),
    ]


def _gcp(spec: Any, plan: Any) -> list[Violation]:
    fact = spec.facts
    reserved = bool(spec.gcp_reservation)  # the template then consumes it by SPECIFIC_RESERVATION affinity
    nics_per_network = [len(n.subnets) if n.roce else 1 for n in plan.networks]
    nic_types = [n.nic_type for n, count in zip(plan.networks, nics_per_network, strict=True) for _ in range(count)]
    out = gcp.nic_layout_violations("plan.networks", fact, nic_types)
    if not out:
        first_nic = 0
        for net, count in zip(plan.networks, nics_per_network, strict=True):
            out += gcp.mtu_violations(f"plan.networks.{net.role}", fact, first_nic, len(nic_types), net.mtu)
            first_nic += count
    for net in plan.networks:
        out += gcp.roce_firewall_violations(f"plan.networks.{net.role}", net.roce, 1 if net.firewall else 0)
    listed = plan.local_ssd_listed
    out += gcp.local_ssd_violations("plan.local_ssd_listed", fact, listed, [plan.local_ssd_interface] if listed else [])
    if plan.compact_placement:  # the component's policy has vm_count = nodes
        out += gcp.compact_policy_violations("plan.compact_placement", fact, spec.nodes, spec.nodes)
    out += gcp.workload_policy_violations(
        "plan.workload_policy",
        fact,
        spec.nodes,
        plan.workload_policy,
        plan.compact_placement,
        reserved,
        plan.bulk_insert,
    )
    out += gcp.compact_missing_violations(
        "plan.compact_placement", fact, spec.nodes, plan.compact_placement, reserved, plan.bulk_insert
    )
    out += gcp.bulk_mode_violations(
        "plan.all_or_nothing", plan.provisioning_model, ["BULK"] if plan.all_or_nothing else []
    )
    bulk = plan.bulk_insert  # the component's insert has minCount = count = nodes
    out += gcp.bulk_insert_violations(
        "plan.formation", plan.provisioning_model, 0 if bulk else spec.nodes, [(spec.nodes, spec.nodes)] if bulk else []
    )
    out += gcp.repair_violations("plan.action_on_failure", plan.provisioning_model, plan.action_on_failure)
    out += gcp.model_offered_violations("plan.provisioning_model", fact, plan.provisioning_model)
    out += gcp.reservation_bound_violations("plan.provisioning_model", plan.provisioning_model, reserved)
    out += gcp.boot_disk_violations("plan.boot_disk_type", fact, plan.boot_disk_type)
    return out
