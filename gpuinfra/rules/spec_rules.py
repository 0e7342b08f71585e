"""The named cloud rules (one registry) and the error that refuses a spec or a preview.

Every rule has one name and one source page here. The planners of the blueprints refuse a
spec that breaks a rule before any resource exists (:func:`rule_error`), and the graph checks
(:mod:`gpuinfra.rules.aws`, :mod:`gpuinfra.rules.gcp`, :mod:`gpuinfra.rules.common`) find the
same rule broken in a preview's resources; both name the rule the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuinfra.errors import RuleViolationError
from gpuinfra.fabrics import FABRICS
from gpuinfra.rules.model import Violation


@dataclass(frozen=True)
class RuleInfo:
    """Name, cloud, source and one-sentence summary of a rule."""

    name: str
    cloud: str
    source: str
    summary: str


_EFA_TYPES = "docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html"
_LSSD = "cloud.google.com/compute/docs/disks/local-ssd#choose_number_local_ssds"

#: (cloud, nic_layout) -> why that GPU fabric cannot be made to work at boot on gpuinfra's images
#: (gpuinfra/plan/fabric_host.py installs the others at boot), read from each layout's
#: :attr:`gpuinfra.fabrics.Fabric.boot_blocker`. Only GCP A3 High's TCPX has one.
FABRIC_BOOT_BLOCKERS: dict[tuple[str, str], str] = {
    (f.cloud, f.layout): f.boot_blocker for f in FABRICS.values() if f.boot_blocker
}


def fabric_boot_blocker(cloud: str, nic_layout: str) -> str | None:
    """Why the GPU fabric of ``nic_layout`` (``InstanceFacts.nic_layout``) cannot be made to work
    at boot on gpuinfra's images (:data:`FABRIC_BOOT_BLOCKERS`), or None.

    Raises:
        ValueError: an unknown cloud.
    """
    if cloud not in ("aws", "gcp"):
        raise ValueError(f"unknown cloud {cloud!r}; allowed: aws, gcp")
    return FABRIC_BOOT_BLOCKERS.get((cloud, nic_layout))


def type_fabric_blocker(facts, image_fabric: str | None = None) -> str | None:
    """:func:`fabric_boot_blocker` of a type that has GPU NICs (``facts``: an
    :class:`~gpuinfra.catalog.facts_model.InstanceFacts`); None for a type without them, whose
    nodes use plain networking anyway, and None when the node image already carries the type's
    fabric (``image_fabric`` == ``facts.nic_layout``: a bake, ``PlanRequest.image_fabric``)."""
    if not facts.gpu_nic_count or image_fabric == facts.nic_layout:
        return None
    return fabric_boot_blocker(facts.cloud, facts.nic_layout)


RULES: dict[str, RuleInfo] = {
    r.name: r
    for r in (
        RuleInfo(
            "single-zone",
            "any",
            "docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html#placement-groups-cluster "
            "(a cluster placement group is in one AZ); ParallelCluster EfaMultiAzValidator; "
            "cloud.google.com/compute/docs/instances/placement-policies-overview (zonal)",
            "all GPU nodes of a cluster are in one AZ / zone and one subnet",
        ),
        RuleInfo(
            "provisioning-model-offered",
            "any",
            "EC2 DescribeInstanceTypes SupportedUsageClasses; "
            "cloud.google.com/compute/docs/accelerator-optimized-machines (consumption options per series)",
            "the nodes are bought the way the cloud sells the type (on-demand, spot, reservation, capacity block)",
        ),
        RuleInfo(
            "high-bandwidth-nics",
            "any",
            f"{_EFA_TYPES}; cloud.google.com/compute/docs/gpus/gpudirect",
            "a profile that requires EFA / GPUDirect gets a type that has it",
        ),
        RuleInfo(
            "fabric-installable-at-boot",
            "gcp",
            "cluster-toolkit examples/machine-learning/a3-highgpu-8g/README.md L8-13 and "
            "a3high-slurm-blueprint.yaml L91-146 (TCPX kernel + reboot); cloud.google.com/compute/docs/gpus/gpudirect",
            "high_bandwidth_networking: required is refused on a type whose GPU fabric cannot be installed at "
            "boot (A3 High / TCPX) unless the stack names a baked image (gcp_image)",
        ),
        RuleInfo(
            "offered-in-zone",
            "any",
            "the catalog's offers (EC2 DescribeInstanceTypeOfferings / Compute machineTypes.list per zone)",
            "the region is one the catalog has GPU offers in, the zone lies in that region, and the type is offered in the zone",
        ),
        RuleInfo(
            "node-values-grammar",
            "any",
            "gpuinfra/rules/node_values.py (cloudinit.readthedocs.io/en/latest/reference/modules.html; "
            "bash(1) QUOTING; github.com/distribution/reference)",
            "every stack-file and profile value in the nodes' boot text matches its grammar and stays data",
        ),
        RuleInfo(
            "bucket-not-public",
            "any",
            "docs.aws.amazon.com/AmazonS3/latest/userguide/access-control-block-public-access.html; "
            "cloud.google.com/storage/docs/public-access-prevention",
            "the cluster's bucket blocks public access",
        ),
        RuleInfo(
            "bucket-same-region",
            "any",
            "docs/sources/cluster-facts.md section 6 rule 11 (cluster-toolkit cloud-storage-bucket location = region)",
            "the bucket is in the cluster's region",
        ),
        RuleInfo(
            "aws-ssh-not-world",
            "aws",
            "CIS Amazon Web Services Foundations Benchmark v6.0.0 6.3 (no security group allows ingress from "
            "0.0.0.0/0 to remote administration ports, SSH 22, over TCP (6) or ALL (-1)) and its ::/0 twin; "
            "block sizes: gpuinfra.spec.WORLD_PREFIX_BELOW",
            "no security group opens SSH (TCP 22) to the world unless the stack file allows it "
            "(network.allow_world_ssh, written by `gpuinfra new --allow-world-ssh`)",
        ),
        RuleInfo(
            "aws-s3-deny-insecure-transport",
            "aws",
            "docs.aws.amazon.com/AmazonS3/latest/userguide/security-best-practices.html (aws:SecureTransport)",
            "the bucket policy denies requests that are not over TLS",
        ),
        RuleInfo(
            "aws-efa-sg-both-ways",
            "aws",
            "docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html#efa-start-security; "
            "aws-parallelcluster cluster_validators.py EfaSecurityGroupValidator",
            "the security group of EFA interfaces allows all traffic to and from itself (ingress and egress)",
        ),
        RuleInfo(
            "aws-efa-interfaces",
            "aws",
            f"{_EFA_TYPES}; EC2 EfaInfo.MaximumEfaInterfaces",
            "one EFA interface per network card, cards 0..N-1 once each, card 0 device 0 is 'efa' (never efa-only)",
        ),
        RuleInfo(
            "aws-no-public-ip-multi-nic",
            "aws",
            "docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-eni.html#eni-basics (public IPv4 only for one "
            "interface at device index 0); ParallelCluster queues_stack.py",
            "instances with several network interfaces get no auto-assigned public IPv4",
        ),
        RuleInfo(
            "aws-placement-group",
            "aws",
            "docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html; ParallelCluster "
            "PlacementGroupCapacityTypeValidator (none with a Capacity Block)",
            "multi-node clusters use a cluster placement group on types that support it, none with a Capacity Block",
        ),
        RuleInfo(
            "aws-imdsv2",
            "aws",
            "docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-IMDS-new-instances.html",
            "instance metadata requires IMDSv2 session tokens",
        ),
        RuleInfo(
            "aws-fleet-all-or-nothing",
            "aws",
            "docs.aws.amazon.com/AWSEC2/latest/UserGuide/instant-fleet.html; "
            "docs.aws.amazon.com/AWSEC2/latest/APIReference/API_OnDemandOptionsRequest.html (MinTargetCapacity)",
            "an instant fleet with one type in one AZ and min target capacity = nodes",
        ),
        RuleInfo(
            "aws-capacity-reservation",
            "aws",
            "docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-launch.html; "
            "docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html; "
            "ParallelCluster CapacityReservationValidator",
            "a capacity reservation / block is of the node type, in the node AZ, and holds all nodes",
        ),
        RuleInfo(
            "gcp-local-ssd-count",
            "gcp",
            _LSSD,
            "local SSD count and interface are ones the machine type allows (bundled disks as the type has them)",
        ),
        RuleInfo(
            "gcp-placement-supported",
            "gcp",
            "cloud.google.com/compute/docs/instances/placement-policies-overview; "
            "cloud.google.com/compute/docs/instance-groups/about-workload-policies; "
            "cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy",
            "compact placement only on machines that take it; bulk-inserted nodes take a compact policy in the "
            "template; MIGs in bulk mode of A3 8g / Mega / Ultra / A4 use a workload policy",
        ),
        RuleInfo(
            "gcp-placement-max-vms",
            "gcp",
            "cloud.google.com/compute/docs/instances/placement-policies-overview (max VMs per compact policy)",
            "a compact policy's vm_count equals the MIG's size and is within the limit",
        ),
        RuleInfo(
            "gcp-mig-all-or-nothing",
            "gcp",
            "cloud.google.com/compute/docs/instance-groups/about-bulk-mode#limitations (BULK only with "
            "reservation-bound or flex-start templates); cloud.google.com/compute/docs/reference/rest/v1/"
            "instances/bulkInsert (minCount)",
            "a GCP cluster never bills part of itself: BULK where the template allows it, else one bulk insert "
            "with minCount = count and the MIG at size 0 (the nodes' formation watchdog as second line)",
        ),
        RuleInfo(
            "aws-spot-replacement",
            "aws",
            "docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html "
            "(EC2 Spot Instance Interruption Warning event); gpuinfra/plan/replacement.py",
            "a Spot stack has the interruption rule, its target, the replacement function and the invoke permission",
        ),
        RuleInfo(
            "gcp-mig-replaces-lost-nodes",
            "gcp",
            "cloud.google.com/compute/docs/instance-groups/about-repair; Compute API "
            "InstanceGroupManagerInstanceLifecyclePolicy.defaultActionOnFailure",
            "a SPOT / STANDARD MIG repairs (recreates) a preempted or failed node; a bulk-mode group does not",
        ),
        RuleInfo(
            "gcp-reservation-bound",
            "gcp",
            "cloud.google.com/compute/docs/instances/reservations-consume; pulumi-gcp InstanceTemplateSchedulingArgs "
            "provisioning_model docstring",
            "RESERVATION_BOUND VMs name their reservation (SPECIFIC_RESERVATION affinity)",
        ),
        RuleInfo(
            "gcp-host-maintenance",
            "gcp",
            "cloud.google.com/compute/docs/gpus/gpu-host-maintenance",
            "GPU VMs terminate on host maintenance and do not restart automatically",
        ),
        RuleInfo(
            "gcp-roce-no-firewall",
            "gcp",
            "cluster-toolkit modules/network/vpc/main.tf L191-198; cloud.google.com/vpc/docs/rdma-network-profiles",
            "a RoCE VPC has no firewall rules",
        ),
        RuleInfo(
            "gcp-boot-disk-type",
            "gcp",
            "cloud.google.com/compute/docs/accelerator-optimized-machines (supported disk types per series)",
            "the boot disk type is one the machine series supports",
        ),
        RuleInfo(
            "nic-layout-matches-facts",
            "any",
            f"{_EFA_TYPES}; cluster-toolkit a3high/a3mega/a3ultra blueprints (GPU VPCs, NIC types)",
            "the nodes' NICs match the type's NIC networks (count and NIC type)",
        ),
        RuleInfo(
            "mtu-matches-facts",
            "gcp",
            "cluster-toolkit a3high-slurm-blueprint.yaml L46 (8244), a3ultra (8896); cloud.google.com/vpc/docs/mtu",
            "each VPC's MTU equals the MTU of its NIC network in the facts",
        ),
        RuleInfo(
            "facts-current",
            "any",
            "gpuinfra/catalog/facts_model.py (the stack records the facts it was planned from)",
            "the facts (and gpu_facts) recorded in the stack file are the catalog's facts of the type and GPU (no hand edits, no stale plan)",
        ),
        RuleInfo(
            "profile-spot-policy",
            "any",
            "gpuinfra/profiles/data/profiles.yaml (spot.policy: forbidden for inference: a preempted server drops requests)",
            "a profile that forbids spot capacity never gets spot nodes",
        ),
        RuleInfo(
            "price-known",
            "any",
            "docs/prices.md 'Prices' (money fails closed: a missing price means 'not offered', never $0)",
            "the nodes have a catalog price in the market they are bought in",
        ),
        RuleInfo(
            "scratch-capacity",
            "any",
            f"{_LSSD}; EC2 InstanceStorageInfo",
            "the type's local NVMe can hold the profile's required scratch",
        ),
        RuleInfo(
            "budget-max-price",
            "any",
            "docs/conformance.md 'Cloud-rule conformance' (the stack's max_price_per_hour_usd; money fails closed)",
            "the stack's priced $/h is within its max_price_per_hour_usd and has no unpriced line",
        ),
        RuleInfo(
            "baked-image",
            "any",
            "docs.aws.amazon.com/AWSEC2/latest/UserGuide/CopyingAMIs.html (an AMI is regional); EC2 "
            "InvalidBlockDeviceMapping 'Volume of size ... is smaller than snapshot' "
            "(aws/karpenter-provider-aws#3302); cloud.google.com/compute/docs/disks/create-root-persistent-disks "
            "(a boot disk is at least the image's size)",
            "a cluster from a baked image is in the bake's region and its root disk is at least the "
            "image's root snapshot",
        ),
        RuleInfo(
            "provider-valid-values",
            "any",
            "the installed pulumi-aws / pulumi-gcp SDK docstrings ('Valid values: ...')",
            "every documented enum input holds one of the provider's valid values",
        ),
    )
}


def violation(rule: str, resource: str, message: str) -> Violation:
    """A :class:`Violation` of the registered rule ``rule``.

    Raises:
        KeyError: ``rule`` is not in :data:`RULES` (a bug).
    """
    return Violation(rule, resource, message, RULES[rule].source)


def not_sold(resource: str, facts: Any, model: str, hint: str = "") -> Violation | None:
    """``provisioning-model-offered`` when the cloud does not sell ``facts``' type as ``model``
    (on-demand, spot, reservation-bound, capacity-block ...), else None.

    Args:
        resource: the offending resource's name ("" for the spec).
        facts: the type's :class:`~gpuinfra.catalog.facts_model.InstanceFacts`.
        model: the provisioning model asked for.
        hint: appended to the message (what to do instead).
    """
    if facts.offers_model(model):
        return None
    return violation(
        "provisioning-model-offered",
        resource,
        f"{facts.instance_type} is not sold as {model}; it is sold as {', '.join(facts.provisioning_models)}{hint}",
    )


def rule_error(rule: str, resource: str, message: str) -> RuleViolationError:
    """The error to raise when a spec breaks ``rule`` (before any resource exists)."""
    return RuleViolationError([violation(rule, resource, message)])


def baked_image_violations(spec: Any) -> list[Violation]:
    """``baked-image`` over a spec with ``baked_image`` (a stack file edited after ``new``): the
    cluster is in the bake's region, and ``profile.root_disk_gib`` is at least the image's root
    snapshot. Empty without a baked image."""
    ref = spec.baked_image
    if ref is None:
        return []
    found = []
    if ref.region != spec.region:
        found.append(
            violation(
                "baked-image",
                "",
                f"bake {ref.bake!r} is in {ref.region}, the cluster in {spec.region}: the image cannot be used "
                f"there; write the stack again with `gpuinfra new --image baked:{ref.bake} --region {ref.region}`",
            )
        )
    if spec.profile.root_disk_gib < ref.root_snapshot_gib:
        found.append(
            violation(
                "baked-image",
                "",
                f"profile.root_disk_gib is {spec.profile.root_disk_gib} GiB, smaller than bake {ref.bake!r}'s root "
                f"snapshot of {ref.root_snapshot_gib} GiB (the cloud refuses the disk); set it to at least "
                f"{ref.root_snapshot_gib}",
            )
        )
    return found
