"""Pure planning of a GCP GPU cluster (no Pulumi imports): NIC layout, networks, compact
placement, disks, scheduling, image, NCCL environment -- decided and validated before any
resource is registered.

Sources (docs/sources/cluster-facts.md sections 2 and 6):

* NIC layouts: A3 High 1 system + 4 GPU gVNIC VPCs (GPUDirect-TCPX), A3 Mega 1 + 8 (TCPXO),
  MTU 8244 (cluster-toolkit a3high/a3mega blueprints, GKE gpu_direct.tf); A3 Ultra / A4 2 gVNIC
  VPCs (MTU 8896) + 8 MRDMA NICs on one RoCE VPC (network profile ``<zone>-vpc-roce``) with
  8 subnets and **no firewall rules** (modules/network/gpu-rdma-vpc, vpc/main.tf L191-198).
* Placement (``InstanceFacts.placement``): nodes from a bulk insert (STANDARD / SPOT) take a
  compact ``groupPlacementPolicy`` (``collocation = COLLOCATED``, ``vm_count`` = number of VMs, at
  most ``max_vms``) in the instance template -- A2, G2, and A3 High / Mega / Ultra and A4 too:
  "When you apply compact placement policies to standalone compute instances, or compute
  instances created in bulk, Compute Engine makes best-effort attempts to create compute instances
  as close to each other as possible"; its comparison table lists A4, A3 Ultra, A3 Mega and A3
  High among the machines that take compact policies (read in the stored ja / zh-CN copies)
  (cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy). No
  ``maxDistance``: it is Preview and makes placement strict ("When you want densely colocated
  resources based on best-effort availability, don't specify a max distance in the policy", same
  page). Where the MIG creates the nodes itself (reservation-bound bulk mode), A3 High 8g, A3 Mega,
  A3 Ultra and A4 use a ``workloadPolicy`` HIGH_THROUGHPUT referenced by the MIG's
  ``resourcePolicies`` instead (workload policies: MIGs with clustered GPUs, same table;
  cloud.google.com/compute/docs/instance-groups/about-workload-policies); N1 has neither.
  Requires ``on_host_maintenance = TERMINATE`` and ``automatic_restart = false``; not with a
  reservation that does not accept external policies (slurm-gcp resume.py L127-144).
* Local SSD (``InstanceFacts.local_ssd``): bundled disks come with the machine (listed in the
  template only where the facts say so); attachable ones take only the counts the machine
  allows (cloud.google.com/compute/docs/disks/local-ssd#choose_number_local_ssds).
* Scheduling: GPUs force ``TERMINATE`` on host maintenance; spot is ``provisioning_model=SPOT``;
  the TTL plus the backstop delay becomes ``max_run_duration`` with
  ``instance_termination_action = DELETE`` (cloud.google.com/compute/docs/instances/limit-vm-runtime;
  :mod:`gpuinfra.plan.backstop` says why it fires after the node agent).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuinfra.catalog.facts_model import GCP_PROVISIONING_MODELS, InstanceFacts
from gpuinfra.errors import SpecError
from gpuinfra.fabrics import FABRICS, GVNIC
from gpuinfra.plan.backstop import BACKSTOP_DELAY_SECONDS, max_run_duration_seconds
from gpuinfra.plan.flex_start import RESIZE_REQUEST, check_flex_start_ttl, flex_start_run_duration_seconds
from gpuinfra.plan.formation import BULK_INSERT, BULK_MODE
from gpuinfra.rules.gcp import BULK_PROVISIONING_MODELS, action_on_failure
from gpuinfra.rules.spec_rules import RuleViolationError, fabric_boot_blocker, not_sold, rule_error
from gpuinfra.spec import ClusterSpec

SYSTEM_CIDR = "10.128.0.0/20"
#: MTU of a VPC created without one (cloud.google.com/vpc/docs/mtu).
DEFAULT_VPC_MTU = 1460
IAP_SSH_RANGE = "35.235.240.0/20"  # cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule
#: Boot disk preference: the first of these that the machine allows.
BOOT_DISK_PREFERENCE = ("pd-balanced", "hyperdisk-balanced")
DLVM_PROJECT = "deeplearning-platform-release"


#: Longest ``max_run_duration`` Compute Engine takes: "between 30 seconds and 120 days"
#: (cloud.google.com/compute/docs/instances/limit-vm-runtime).
MAX_RUN_DURATION_LIMIT_SECONDS = 120 * 24 * 3600


@dataclass(frozen=True)
class NetworkPlan:
    """One VPC of the cluster.

    Attributes:
        role: ``system`` | ``gpu-<i>`` | ``net-1`` | ``roce``.
        mtu: network MTU.
        subnets: CIDRs of its subnets (8 for the RoCE VPC).
        nic_type: NIC type of the interfaces on it (``GVNIC`` | ``MRDMA``).
        firewall: allow internal tcp/udp/icmp (never on a RoCE VPC).
        roce: uses the zone's RoCE network profile.
    """

    role: str
    mtu: int
    subnets: tuple[str, ...]
    nic_type: str
    firewall: bool
    roce: bool = False


@dataclass(frozen=True)
class GcpClusterPlan:
    """Decisions for one GCP cluster.

    Attributes:
        networks: VPCs in NIC order; nic_count: NICs per VM.
        compact_placement: COLLOCATED group placement policy in the template (A2, G2, A3 1g-4g;
            A3 High 8g / Mega / Ultra and A4 when ``formation`` is bulk insert).
        workload_policy: HIGH_THROUGHPUT workload policy on the MIG (A3 High 8g and later, when
            the MIG creates the nodes itself: bulk mode).
        local_ssd_count: local SSDs per VM (bundled or attached); local_ssd_listed: how many the
            template lists (0 when Compute Engine attaches bundled ones by itself).
        provisioning_model: ``STANDARD`` | ``SPOT`` | ``RESERVATION_BOUND`` | ``FLEX_START``.
        all_or_nothing: the MIG creates its VMs all at once (``targetSizePolicy.mode`` BULK);
            only for reservation-bound templates (flex-start groups are all-or-nothing through
            their resize request instead: ``formation``), set whatever the size because the
            mode cannot be changed on an existing MIG (about-bulk-mode#limitations). STANDARD and SPOT MIGs cannot use
            bulk mode: their nodes come from one bulk insert instead (``formation``).
        action_on_failure: the MIG's ``defaultActionOnFailure``: ``REPAIR`` for SPOT / STANDARD
            VMs (the MIG recreates a preempted or failed node, which restores its checkpoint and
            rejoins), ``DO_NOTHING`` for bulk-mode groups (:func:`gpuinfra.rules.gcp.action_on_failure`).
        formation: how ``up`` creates the nodes, all or nothing: :data:`~gpuinfra.plan.formation.BULK_INSERT`
            for STANDARD and SPOT (one ``instances.bulkInsert`` with ``minCount`` = nodes; the MIG
            starts at size 0 and holds only the replacements of lost nodes),
            :data:`~gpuinfra.plan.formation.BULK_MODE` for reservation-bound VMs (the MIG in bulk
            mode, ``all_or_nothing``), or :data:`~gpuinfra.plan.flex_start.RESIZE_REQUEST` for
            flex-start (the MIG at target size 0 and one resize request for all nodes,
            :mod:`gpuinfra.plan.flex_start`).
        resize_request_run_seconds: the resize request's ``requestedRunDuration`` (formation
            ``resize_request`` only; the template then carries no ``max_run_duration``), else None.
    """

    networks: tuple[NetworkPlan, ...]
    nic_count: int
    compact_placement: bool
    local_ssd_count: int
    boot_disk_type: str
    image: str
    guest_accelerator: tuple[str, int] | None
    max_run_duration_seconds: int
    nic_layout: str
    provisioning_model: str
    workload_policy: bool
    all_or_nothing: bool
    local_ssd_listed: int
    local_ssd_interface: str
    local_ssd_size_gib: int
    action_on_failure: str
    formation: str = BULK_INSERT
    resize_request_run_seconds: int | None = None

    @property
    def bulk_insert(self) -> bool:
        """The nodes come from one bulk insert (``formation`` is :data:`~gpuinfra.plan.formation.BULK_INSERT`)."""
        return self.formation == BULK_INSERT


def network_layout(facts: InstanceFacts | None) -> tuple[NetworkPlan, ...]:
    """VPCs for the machine's NIC networks (see module docstring); ``None``: the system VPC
    only (high-bandwidth networking off). MTUs come from the facts."""
    if facts is None:
        return (NetworkPlan("system", DEFAULT_VPC_MTU, (SYSTEM_CIDR,), "GVNIC", True),)
    plans: list[NetworkPlan] = []
    for net in facts.networks:
        if net.role == "system":
            plans.append(NetworkPlan("system", net.mtu, (SYSTEM_CIDR,), net.nic_type, True))
        elif net.role == "host":
            plans.append(NetworkPlan("net-1", net.mtu, ("10.129.0.0/20",), net.nic_type, True))
        elif net.role == "gpu":
            plans += [
                NetworkPlan(f"gpu-{i}", net.mtu, (f"10.{i + 1}.0.0/20",), net.nic_type, True) for i in range(net.count)
            ]
        else:
            plans.append(
                NetworkPlan(
                    "roce", net.mtu, tuple(f"10.200.{i}.0/24" for i in range(net.count)), net.nic_type, False, roce=True
                )
            )
    return tuple(plans)


def nccl_env(layout: str) -> dict[str, str]:
    """The ``nccl.env`` settings of the layout's GPU fabric (:attr:`gpuinfra.fabrics.Fabric.nccl_env`:
    TCPX, TCPXO, gIB; TCP sockets for ``gvnic`` and any layout without a GPU fabric)."""
    return dict(FABRICS.get(layout, GVNIC).nccl_env)


def boot_disk_type(facts: InstanceFacts) -> str:
    """The first of :data:`BOOT_DISK_PREFERENCE` that the machine allows (A3 Ultra / A4 take
    Hyperdisk only), else the first type the facts list."""
    return next((t for t in BOOT_DISK_PREFERENCE if t in facts.boot_disk_types), facts.boot_disk_types[0])


def provisioning_model(spec: ClusterSpec) -> str:
    """Compute Engine provisioning model for the spec: ``SPOT`` for spot; ``RESERVATION_BOUND``
    for a calendar-mode / future reservation (``gcp_reservation_bound``; by default exactly when
    the type is not sold on demand, as A3 Ultra / A4: cloud.google.com/compute/docs/instances/
    about-reservation-bound-vms); else ``STANDARD`` (on-demand, or an ordinary reservation)."""
    if spec.spot:
        return "SPOT"
    if spec.gcp_flex_start:  # about-flex-start-vms: the FLEX_START provisioning model
        return "FLEX_START"
    bound = spec.gcp_reservation_bound
    if bound is None:
        bound = bool(spec.gcp_reservation) and not spec.facts.offers_model("on-demand")
    return "RESERVATION_BOUND" if bound else "STANDARD"


def attached_local_ssd_count(spec: ClusterSpec) -> int:
    """Local SSDs to attach for the profile's scratch on a type without bundled ones.

    Raises:
        RuleViolationError: ``gcp-local-ssd-count``: no allowed count gives ``scratch.min_gib``.
    """
    lssd = spec.facts.local_ssd
    scratch = spec.profile.scratch
    if lssd.bundled_count or not scratch.required or scratch.min_gib <= 0:
        return 0
    count = lssd.smallest_attach_count(scratch.min_gib)
    if count is None:
        allowed = ", ".join(str(n) for n in lssd.attach_counts) or "none"
        raise rule_error(
            "gcp-local-ssd-count",
            "",
            f"profile scratch needs {scratch.min_gib} GiB, but {spec.instance_type} takes local SSD "
            f"counts {allowed} of {lssd.size_gib:g} GiB",
        )
    return count


def plan_gcp_cluster(spec: ClusterSpec) -> GcpClusterPlan:
    """Decide and validate the GCP layout for ``spec`` from the facts the spec carries.

    Raises:
        SpecError: a spec that is not GCP.
        RuleViolationError: the spec breaks a cloud rule (rule named in the message): GPUDirect
            required on a machine without GPU NICs, placement on a machine without it, more
            VMs than one placement policy holds, a provisioning model the machine is not sold
            with, a local SSD count it does not take.
    """
    if spec.cloud != "gcp":
        raise SpecError(f"GcpGpuCluster needs cloud gcp, got {spec.cloud!r}")
    if spec.gcp_flex_start:
        check_flex_start_ttl(spec)  # the 7-day bound of flex-start, before the 120-day one
    if max_run_duration_seconds(spec) > MAX_RUN_DURATION_LIMIT_SECONDS:
        raise SpecError(
            f"profile ttl_hours {spec.profile.ttl_hours} is too long for GCP: the VMs' max_run_duration (TTL + "
            f"{BACKSTOP_DELAY_SECONDS} s) may be at most 120 days (cloud.google.com/compute/docs/instances/"
            f"limit-vm-runtime); use ttl_hours <= {(MAX_RUN_DURATION_LIMIT_SECONDS - BACKSTOP_DELAY_SECONDS) // 3600}"
        )
    facts = spec.facts
    hbn = spec.profile.high_bandwidth_networking
    # a fabric gpuinfra cannot install at boot (A3 High's TCPX) works only from a baked image
    blocked = None if spec.gcp_image else fabric_boot_blocker("gcp", facts.nic_layout)
    if hbn == "required" and blocked:
        raise rule_error(
            "fabric-installable-at-boot",
            "",
            f"profile {spec.profile.name!r} requires GPUDirect, but {spec.instance_type}'s "
            f"{facts.nic_layout} fabric cannot be installed at boot: {blocked}; set gcp_image to such "
            "an image, or use high_bandwidth_networking: preferred (plain networking)",
        )
    if blocked:
        hbn = "off"  # preferred: plain networking, not GPU NICs that nothing on the node serves
    if hbn == "required" and facts.gpu_nic_count == 0:
        raise rule_error(
            "high-bandwidth-nics",
            "",
            f"profile {spec.profile.name!r} requires GPUDirect NICs, but {spec.instance_type} has none "
            "(a3-highgpu-8g, a3-megagpu-8g, a3-ultragpu-8g and a4-highgpu-8g have them)",
        )
    model = provisioning_model(spec)
    wanted = GCP_PROVISIONING_MODELS[model]
    hint = (
        " (set gcp_reservation to a reservation of it, or use --spot or --flex-start)" if wanted == "on-demand" else ""
    )
    if unsold := not_sold("", facts, wanted, hint):
        raise RuleViolationError([unsold])
    placeable = facts.placement.compact_policy or facts.placement.workload_policy
    if spec.nodes > 1 and spec.profile.placement == "required" and not placeable:
        raise rule_error(
            "gcp-placement-supported",
            "",
            f"{spec.instance_type} supports neither a compact placement policy nor a workload policy, "
            "and the profile requires placement for multi-node clusters; use A2/A3/A4/G2 machines, "
            "nodes: 1, or a profile with placement: none",
        )
    # every multi-node cluster is placed close together where the machine allows it (as on AWS)
    wants_placement = spec.nodes > 1 and placeable
    if wants_placement and facts.placement.max_vms is not None and spec.nodes > facts.placement.max_vms:
        raise rule_error(
            "gcp-placement-max-vms",
            "",
            f"{spec.nodes} VMs are over the limit of {facts.placement.max_vms} VMs per placement policy",
        )
    if spec.gcp_reservation and not spec.gcp_reservation_accepts_placement:
        wants_placement = False  # vanilla reservations don't take external placement policies
    networks = network_layout(facts) if hbn != "off" else network_layout(None)
    image = spec.gcp_image or f"projects/{DLVM_PROJECT}/global/images/family/{spec.profile.image.gcp_image_family}"
    guest = (
        (spec.gpu_facts.gcp_accelerator_type, spec.gpu_count)
        if facts.guest_accelerators and spec.gpu_facts.gcp_accelerator_type
        else None
    )
    attached = attached_local_ssd_count(spec)
    bundled = facts.local_ssd.bundled_count
    flex = model == "FLEX_START"
    formation = RESIZE_REQUEST if flex else (BULK_MODE if model in BULK_PROVISIONING_MODELS else BULK_INSERT)
    # a MIG's workload policy places only the VMs that MIG creates; bulk-inserted nodes take the
    # template's compact policy ("compute instances created in bulk", see the module docstring)
    by_workload = wants_placement and facts.placement.workload_policy and formation != BULK_INSERT
    return GcpClusterPlan(
        networks=networks,
        nic_count=sum(len(n.subnets) if n.roce else 1 for n in networks),
        compact_placement=wants_placement and facts.placement.compact_policy and not by_workload,
        workload_policy=by_workload,
        local_ssd_count=bundled or attached,
        local_ssd_listed=(bundled or attached) if (attached or facts.local_ssd.list_in_template) else 0,
        local_ssd_interface=facts.local_ssd.interface or "NVME",
        local_ssd_size_gib=int(facts.local_ssd.size_gib),
        boot_disk_type=boot_disk_type(facts),
        image=image,
        guest_accelerator=guest,
        max_run_duration_seconds=max_run_duration_seconds(spec),
        nic_layout=facts.nic_layout if hbn != "off" else "gvnic",
        provisioning_model=model,
        # the mode cannot be switched later; a flex-start group is all-or-nothing by its resize request
        all_or_nothing=model in BULK_PROVISIONING_MODELS and not flex,
        action_on_failure=action_on_failure(model),
        formation=formation,
        resize_request_run_seconds=flex_start_run_duration_seconds(spec) if flex else None,
    )
