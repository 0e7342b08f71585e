"""GCP conformance rules (names and sources in :data:`gpuinfra.rules.spec_rules.RULES`).

Each rule body is a *predicate* over plain values -- the machine type's
:class:`~gpuinfra.catalog.facts_model.InstanceFacts`, NIC types, disk counts, the provisioning
model, the MIG size -- that returns :class:`~gpuinfra.rules.model.Violation` objects. Two readers
feed the same predicates:

* the ``check_*`` functions here read a preview's :class:`~gpuinfra.rules.model.ResourceGraph`
  and take a mapping from machine type to facts;
* :func:`gpuinfra.rules.plan_rules.check_plan` reads the typed cluster plan, before any resource.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from gpuinfra.catalog.facts_model import GCP_PROVISIONING_MODELS, InstanceFacts
from gpuinfra.launch_errors import GCP_BULK_INSERT_TYPE, GCP_RESIZE_REQUEST_TYPE
from gpuinfra.rules.model import UNKNOWN, Facts, Resource, ResourceGraph, Violation
from gpuinfra.rules.spec_rules import not_sold, violation

TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
MIG = "gcp:compute/instanceGroupManager:InstanceGroupManager"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
NETWORK = "gcp:compute/network:Network"
SUBNET = "gcp:compute/subnetwork:Subnetwork"
FIREWALL = "gcp:compute/firewall:Firewall"
BUCKET = "gcp:storage/bucket:Bucket"
#: The all-or-nothing bulk insert of STANDARD / SPOT nodes (blueprints/gcp/bulk_insert.py).
BULK_INSERT = GCP_BULK_INSERT_TYPE

#: Bulk mode (``targetSizePolicy.mode = BULK``: the MIG creates all VMs or none) "is only
#: supported with instance templates that specify either a reservation-bound or flex-start
#: provisioning model" (cloud.google.com/compute/docs/instance-groups/about-bulk-mode#limitations).
BULK_PROVISIONING_MODELS = ("RESERVATION_BOUND", "FLEX_START")
#: What the MIG does with a VM that fails or that Compute Engine deletes (a preempted Spot VM with
#: ``instance_termination_action = DELETE``, a host failure): ``REPAIR`` recreates it -- "If a VM
#: fails or is deleted by an action not initiated by the MIG, then the MIG automatically repairs the
#: failed VM", while "If the MIG intentionally stops a VM ... then the MIG doesn't repair that VM"
#: (cloud.google.com/compute/docs/instance-groups/about-repair), so a node that ends itself through
#: the MIG (``delete-instances``, the formation watchdog's resize to 0) stays gone, and a VM at its
#: ``max_run_duration`` is deleted, not repaired (Compute Engine release notes, 2024-04-29).
#: ``DO_NOTHING``: "MIG does not repair a failed VM" (Compute API
#: ``InstanceGroupManagerInstanceLifecyclePolicy.defaultActionOnFailure``).
#: Bulk-mode groups (reservation-bound / flex-start) keep ``DO_NOTHING``: their VMs' capacity is a
#: reservation or a run duration that ends by itself, and a repaired VM "will retry until it
#: creates that VM successfully" (the REPAIR value's description in the Compute alpha API enum) --
#: after a reservation's end that is a group retrying forever.
REPAIR = "REPAIR"
DO_NOTHING = "DO_NOTHING"


def action_on_failure(model: str) -> str:
    """The MIG's ``defaultActionOnFailure`` for VMs of provisioning ``model`` (:data:`REPAIR`)."""
    return DO_NOTHING if model in BULK_PROVISIONING_MODELS else REPAIR


#: Marker of the node-side formation watchdog in the startup script (templates/gcp-cluster-env.sh.j2).
FORMATION_MARKER = "gpuinfra-formation-deadline"
#: The workload policy type of a GPU cluster's MIG.
HIGH_THROUGHPUT = "HIGH_THROUGHPUT"


# -- predicates: one body per rule, shared by the preview and the plan path -----------------------


def local_ssd_violations(
    resource: str, fact: InstanceFacts, listed: int, interfaces: Collection[str | None]
) -> list[Violation]:
    """``gcp-local-ssd-count``: bundled local SSDs as the type has them (left out where the
    facts say Compute Engine attaches them); attached ones in an allowed count and interface.

    Args:
        resource: name reported (the instance template; "" for a plan).
        fact: facts of the machine type.
        listed: local SSD disks the template lists.
        interfaces: their interfaces (``NVME`` | ``SCSI``; None = not set).
    """
    out = []
    lf = fact.local_ssd
    if lf.bundled_count:
        allowed = {lf.bundled_count} if lf.list_in_template else {0}
        if listed not in allowed:
            out.append(
                violation(
                    "gcp-local-ssd-count",
                    resource,
                    f"{listed} local SSDs listed; {fact.instance_type} comes with {lf.bundled_count} "
                    + ("that must be listed" if lf.list_in_template else "that must not be listed"),
                )
            )
    elif listed and listed not in lf.attach_counts:
        allowed_text = ", ".join(map(str, lf.attach_counts)) or "none"
        out.append(
            violation(
                "gcp-local-ssd-count", resource, f"{listed} local SSDs; {fact.instance_type} takes {allowed_text}"
            )
        )
    bad = set(interfaces) - {lf.interface, None}
    if bad and lf.interface:
        out.append(
            violation(
                "gcp-local-ssd-count",
                resource,
                f"local SSD interface {sorted(str(i) for i in bad)}; {fact.instance_type} uses {lf.interface}",
            )
        )
    return out


def compact_policy_violations(resource: str, fact: InstanceFacts, vm_count: object, nodes: int) -> list[Violation]:
    """``gcp-placement-supported`` and ``gcp-placement-max-vms`` of one compact (group
    placement) policy in the template: the machine takes one, and ``vm_count`` equals the MIG
    size and is within ``placement.max_vms`` (a ``vm_count`` that is not a number is not judged)."""
    out = []
    if not fact.placement.compact_policy:
        how = "use a workload policy on the MIG" if fact.placement.workload_policy else "it has no placement"
        out.append(
            violation(
                "gcp-placement-supported",
                resource,
                f"{fact.instance_type} does not take a compact placement policy; {how}",
            )
        )
    limit = fact.placement.max_vms
    if isinstance(vm_count, (int, float)) and (vm_count != nodes or (limit and vm_count > limit)):
        out.append(
            violation(
                "gcp-placement-max-vms",
                resource,
                f"vm_count {vm_count} for a MIG of {nodes}" + (f" (limit {limit})" if limit else ""),
            )
        )
    return out


def workload_policy_violations(
    resource: str,
    fact: InstanceFacts,
    nodes: int,
    linked: bool,
    compact: bool,
    reserved: bool,
    bulk_insert: bool = False,
) -> list[Violation]:
    """``gcp-placement-supported`` on the MIG: a workload policy only where the machine supports
    one, and a multi-node MIG of such machines that creates the nodes itself has one (unless
    placed by a compact policy or a specific reservation).

    Args:
        resource: name reported (the MIG; "" for a plan).
        linked: the MIG names a workload policy.
        compact: the template has a compact placement policy.
        reserved: the template consumes a specific reservation.
        bulk_insert: the nodes come from a bulk insert, not from the MIG: its workload policy
            would not place them (:func:`compact_missing_violations` judges them).
    """
    out = []
    if linked and not fact.placement.workload_policy:
        out.append(
            violation("gcp-placement-supported", resource, f"{fact.instance_type} does not support workload policies")
        )
    if nodes > 1 and fact.placement.workload_policy and not (linked or compact or reserved or bulk_insert):
        out.append(
            violation(
                "gcp-placement-supported",
                resource,
                f"{nodes} {fact.instance_type} VMs without a HIGH_THROUGHPUT workload policy",
            )
        )
    return out


def workload_type_violations(resource: str, policy_type: object) -> list[Violation]:
    """``gcp-placement-supported``: the MIG's workload policy is ``HIGH_THROUGHPUT``."""
    if policy_type != HIGH_THROUGHPUT:
        return [violation("gcp-placement-supported", resource, "a GPU cluster's workload policy is HIGH_THROUGHPUT")]
    return []


def compact_missing_violations(
    resource: str, fact: InstanceFacts, nodes: int, attached: bool, reserved: bool, bulk_insert: bool = False
) -> list[Violation]:
    """``gcp-placement-supported``: a multi-node group of machines that take a compact policy
    has one attached to its template (unless a specific reservation places it) where nothing
    else places the nodes: machines without a workload policy, and every machine whose nodes come
    from a bulk insert -- a MIG's workload policy places only the VMs that MIG creates, while a
    compact policy places "compute instances created in bulk"
    (cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy).

    Args:
        attached: the template names a compact policy (or a policy judged at ``up``).
        reserved: the template consumes a specific reservation.
        bulk_insert: the nodes come from one ``instances.bulkInsert`` (STANDARD / SPOT).
    """
    if (
        nodes > 1
        and fact.placement.compact_policy
        and (bulk_insert or not fact.placement.workload_policy)
        and not attached
        and not reserved
    ):
        how = " for its bulk-inserted nodes (a MIG's workload policy does not place them)" if bulk_insert else ""
        return [
            violation(
                "gcp-placement-supported",
                resource,
                f"{nodes} {fact.instance_type} VMs without a compact placement policy{how}",
            )
        ]
    return []


def bulk_mode_violations(resource: str, model: str, modes: Sequence[object]) -> list[Violation]:
    """``gcp-mig-all-or-nothing``: ``targetSizePolicy`` BULK exactly for reservation-bound /
    flex-start templates (``model``: the template's provisioning model; ``modes``: the MIG's
    target size policy modes)."""
    out = []
    if "BULK" in modes and model not in BULK_PROVISIONING_MODELS:
        out.append(
            violation(
                "gcp-mig-all-or-nothing",
                resource,
                f"bulk mode with a {model} template; Compute Engine takes it only with "
                "RESERVATION_BOUND or FLEX_START templates",
            )
        )
    if model in BULK_PROVISIONING_MODELS and list(modes) != ["BULK"]:
        out.append(
            violation(
                "gcp-mig-all-or-nothing",
                resource,
                f"{model} VMs without targetSizePolicy BULK (set at creation; the mode cannot be "
                "changed later): a stockout bills part of the cluster",
            )
        )
    return out


def bulk_insert_violations(
    resource: str, model: str, mig_size: object, bulk: Sequence[tuple[object, object]]
) -> list[Violation]:
    """``gcp-mig-all-or-nothing`` for STANDARD / SPOT VMs (``model``), which bulk mode refuses: the
    nodes come from exactly one bulk insert with ``minCount`` = ``count`` ("If min_count instances
    cannot be created, then no instances will be created", Compute v1 ``BulkInsertInstanceResource``),
    and the MIG starts at target size 0 (an ordinary MIG "attempts to create the remaining
    instances as capacity becomes available", about-bulk-mode, and keeps trying after a failed ``up``).

    Args:
        resource: name reported (the MIG; "" for a plan).
        mig_size: the MIG's ``targetSize`` (a value that is not a number is not judged).
        bulk: ``(count, min_count)`` of each bulk insert of the stack.
    """
    if model in BULK_PROVISIONING_MODELS:
        return []
    out = []
    if isinstance(mig_size, (int, float)) and mig_size > 0:
        out.append(
            violation(
                "gcp-mig-all-or-nothing",
                resource,
                f"target size {mig_size} of {model} VMs: a stockout bills part of the cluster and the group keeps "
                "creating VMs after a failed `up`; the nodes come from one bulk insert, the MIG starts at 0",
            )
        )
    if len(bulk) != 1:
        out.append(
            violation("gcp-mig-all-or-nothing", resource, f"{len(bulk)} bulk inserts of {model} VMs; want exactly one")
        )
    for count, min_count in bulk:
        if count != min_count:
            out.append(
                violation(
                    "gcp-mig-all-or-nothing",
                    resource,
                    f"bulk insert of {count} VMs with minCount {min_count}: not all or nothing",
                )
            )
    return out


def repair_violations(resource: str, model: str, action: object) -> list[Violation]:
    """``gcp-mig-replaces-lost-nodes``: the MIG's ``defaultActionOnFailure`` (``action``; unset is
    the API's default ``REPAIR``) is :func:`action_on_failure` of the template's ``model``: a
    preempted or failed SPOT / STANDARD node is recreated, a bulk-mode group's is not."""
    wanted = action_on_failure(model)
    got = action or REPAIR
    if got in (wanted, UNKNOWN):
        return []
    why = (
        "a preempted or failed node is never replaced and the job cannot re-form"
        if wanted == REPAIR
        else "a repair after the reservation or run duration ended would retry forever"
    )
    return [
        violation(
            "gcp-mig-replaces-lost-nodes",
            resource,
            f"defaultActionOnFailure {got} with {model} VMs (want {wanted}): {why}",
        )
    ]


def model_offered_violations(resource: str, fact: InstanceFacts | None, model: str) -> list[Violation]:
    """``provisioning-model-offered``: Compute Engine sells the machine with ``model``."""
    sold_as = GCP_PROVISIONING_MODELS.get(model)
    if fact is None or sold_as is None:
        return []
    unsold = not_sold(resource, fact, sold_as)
    return [unsold] if unsold else []


def reservation_bound_violations(resource: str, model: str, specific_reservation: bool) -> list[Violation]:
    """``gcp-reservation-bound``: RESERVATION_BOUND VMs name their reservation."""
    if model == "RESERVATION_BOUND" and not specific_reservation:
        return [
            violation(
                "gcp-reservation-bound",
                resource,
                "RESERVATION_BOUND without a SPECIFIC_RESERVATION reservation affinity",
            )
        ]
    return []


def nic_layout_violations(resource: str, fact: InstanceFacts, nic_types: Sequence[object]) -> list[Violation]:
    """``nic-layout-matches-facts``: the NIC types in order are the machine's NIC networks, or
    the system NIC alone."""
    wanted = [n.nic_type for n in fact.networks for _ in range(n.count)]
    got = list(nic_types)
    if got not in (wanted, wanted[:1]):
        return [
            violation(
                "nic-layout-matches-facts",
                resource,
                f"NICs {got}; {fact.instance_type} has {wanted} (or the system NIC alone)",
            )
        ]
    return []


def mtu_violations(resource: str, fact: InstanceFacts, nic_index: int, nic_count: int, mtu: object) -> list[Violation]:
    """``mtu-matches-facts``: the VPC of NIC ``nic_index`` (0-based, of ``nic_count``) has the
    MTU of that NIC's network in the facts (any MTU when the system NIC is alone)."""
    if nic_count <= 1:
        return []
    role = [n for n in fact.networks for _ in range(n.count)][nic_index]
    if mtu != role.mtu:
        return [
            violation(
                "mtu-matches-facts",
                resource,
                f"MTU {mtu}; the {role.role} network of {fact.instance_type} uses {role.mtu}",
            )
        ]
    return []


def roce_firewall_violations(resource: str, roce: bool, firewall_rules: int) -> list[Violation]:
    """``gcp-roce-no-firewall``: a RoCE VPC has no firewall rules."""
    if roce and firewall_rules:
        return [violation("gcp-roce-no-firewall", resource, f"{firewall_rules} firewall rules on a RoCE VPC")]
    return []


def boot_disk_violations(resource: str, fact: InstanceFacts, disk_type: object) -> list[Violation]:
    """``gcp-boot-disk-type``: the boot disk type is one the machine series supports."""
    if disk_type not in fact.boot_disk_types:
        return [
            violation(
                "gcp-boot-disk-type",
                resource,
                f"boot disk {disk_type!r}; {fact.instance_type} takes {', '.join(fact.boot_disk_types)}",
            )
        ]
    return []


def single_zone_violations(zones: Collection[object]) -> list[Violation]:
    """``single-zone``: the nodes come from zonal MIGs of one zone (``zones``: each MIG's zone;
    None = regional)."""
    zones = set(zones)
    if None in zones or len(zones) > 1:
        return [
            violation(
                "single-zone",
                "",
                f"managed instance groups in zones {sorted(map(str, zones))}; one zonal MIG in one zone",
            )
        ]
    return []


# -- readers of a preview's resources ------------------------------------------------------------


def _template_facts(template: Resource, facts: Facts) -> InstanceFacts | None:
    return facts.get(str(template.inputs.get("machineType", "")))


def _mig_size(graph: ResourceGraph) -> int:
    """The cluster's node count: the MIG's target size plus the count of its bulk insert (the
    MIG of a bulk-insert formation starts at 0)."""
    bulk = graph.first(BULK_INSERT)
    return graph.whole_number(MIG, "targetSize", 0) + (graph.whole_number(BULK_INSERT, "count") if bulk else 0) or 1


def _policy_links(template: Resource) -> list:
    links = template.inputs.get("resourcePolicies")
    return links if isinstance(links, list) else [links] if links else []


def _policies_of(template: Resource, graph: ResourceGraph) -> list[Resource]:
    found = [graph.referenced(link, POLICY) for link in _policy_links(template)]
    return [p for p in found if p is not None]


def check_local_ssd(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-local-ssd-count`` on each template (:func:`local_ssd_violations`)."""
    out = []
    for template in graph.of_type(TEMPLATE):
        fact = _template_facts(template, facts)
        if fact is None:
            continue
        lssd = [d for d in (template.inputs.get("disks") or []) if d.get("diskType") == "local-ssd"]
        out += local_ssd_violations(template.name, fact, len(lssd), [d.get("interface") for d in lssd])
    return out


def check_placement(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-placement-supported`` and ``gcp-placement-max-vms`` (:func:`compact_policy_violations`,
    :func:`workload_policy_violations`, :func:`workload_type_violations`,
    :func:`compact_missing_violations`)."""
    out = []
    nodes = _mig_size(graph)
    for template in graph.of_type(TEMPLATE):
        fact = _template_facts(template, facts)
        if fact is None:
            continue
        compact = [p for p in _policies_of(template, graph) if p.inputs.get("groupPlacementPolicy")]
        for policy in compact:
            out += compact_policy_violations(policy.name, fact, policy.get("groupPlacementPolicy.vmCount"), nodes)
        reserved = template.get("reservationAffinity.type") == "SPECIFIC_RESERVATION"
        bulk = graph.first(BULK_INSERT) is not None
        for mig in graph.of_type(MIG):
            link = mig.get("resourcePolicies.workloadPolicy")
            out += workload_policy_violations(mig.name, fact, nodes, bool(link), bool(compact), reserved, bulk)
            workload = graph.referenced(link, POLICY) if link else None
            if workload is not None:
                out += workload_type_violations(workload.name, workload.get("workloadPolicy.type"))
        attached = bool(compact) or any(link == UNKNOWN for link in _policy_links(template))  # unknown: judged at `up`
        out += compact_missing_violations(template.name, fact, nodes, attached, reserved, bulk)
    return out


#: Pulumi type of a MIG resize request (flex-start clusters: :mod:`gpuinfra.plan.flex_start`).
RESIZE_REQUEST = GCP_RESIZE_REQUEST_TYPE
#: Shortest and longest ``requestedRunDuration`` of a resize request, in seconds: "between 10
#: minutes and 7 days" (cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig;
#: pulumi-gcp 10.2 ``ResizeRequestRequestedRunDurationArgs``: "Must be from 600 to 604800
#: inclusive"); seven days is also the longest run of a flex-start VM
#: (cloud.google.com/compute/docs/instances/about-flex-start-vms).
FLEX_START_RUN_LIMITS_SECONDS = (600, 7 * 24 * 3600)


def resize_request_violations(
    resource: str, size: object, requests: Sequence[Resource], limits: tuple[int, int] = FLEX_START_RUN_LIMITS_SECONDS
) -> list[Violation]:
    """``gcp-mig-all-or-nothing`` for a FLEX_START group without bulk mode: it is all-or-nothing
    only through one resize request for all its nodes ("the MIG creates VMs all at once",
    cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig) on a group created at
    target size 0, with a ``requestedRunDuration`` within ``limits`` (seconds, 10 min..7 days)."""
    out = []
    if size not in (0, None, UNKNOWN):
        out.append(violation("gcp-mig-all-or-nothing", resource, f"flex-start group at target size {size}, not 0"))
    if len(requests) != 1:
        return [
            *out,
            violation(
                "gcp-mig-all-or-nothing",
                resource,
                f"flex-start group with {len(requests)} resize requests; one for all nodes is all-or-nothing",
            ),
        ]
    request = requests[0]
    by = request.inputs.get("resizeBy")
    if by != UNKNOWN and not (isinstance(by, int) and by >= 1):
        out.append(violation("gcp-mig-all-or-nothing", request.name, f"resize request for {by} nodes"))
    seconds = request.get("requestedRunDuration.seconds")
    if seconds != UNKNOWN and not (seconds is not None and limits[0] <= int(seconds) <= limits[1]):
        out.append(
            violation(
                "gcp-mig-all-or-nothing",
                request.name,
                f"requestedRunDuration {seconds} s is not within {limits[0]}..{limits[1]} s",
            )
        )
    return out


def check_all_or_nothing(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-mig-all-or-nothing``: a multi-node MIG of reservation-bound / flex-start VMs uses
    ``targetSizePolicy`` BULK (:func:`bulk_mode_violations`); STANDARD / SPOT templates cannot
    (the API refuses bulk mode for them), so their nodes come from one all-or-nothing bulk insert
    and the MIG starts empty (:func:`bulk_insert_violations`); their startup script still carries
    the formation watchdog, the second line."""
    out = []
    template = graph.first(TEMPLATE)
    model = (template.get("scheduling.provisioningModel") or "STANDARD") if template else "STANDARD"
    script = template.get("metadata.startup-script") if template else None
    bulk = [(b.inputs.get("count"), b.inputs.get("min_count")) for b in graph.of_type(BULK_INSERT)]
    nodes = _mig_size(graph)
    for mig in graph.of_type(MIG):
        modes = [p.get("mode") for p in (mig.inputs.get("targetSizePolicies") or [])]
        requests = graph.of_type(RESIZE_REQUEST)
        if model == "FLEX_START" and not modes:
            out += resize_request_violations(mig.name, mig.inputs.get("targetSize"), requests)
            continue
        out += bulk_mode_violations(mig.name, model, modes)
        out += bulk_insert_violations(mig.name, model, mig.inputs.get("targetSize"), bulk)
        size = nodes
        if not size > 1:
            continue
        if (
            model not in BULK_PROVISIONING_MODELS
            and isinstance(script, str)
            and script != UNKNOWN
            and FORMATION_MARKER not in script
        ):
            out.append(
                violation(
                    "gcp-mig-all-or-nothing",
                    mig.name,
                    f"{size} {model} VMs and no formation watchdog in the startup "
                    "script: a stockout bills part of the cluster",
                )
            )
    return out


def check_repair(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-mig-replaces-lost-nodes`` on each MIG (:func:`repair_violations`)."""
    template = graph.first(TEMPLATE)
    model = (template.get("scheduling.provisioningModel") or "STANDARD") if template else "STANDARD"
    out = []
    for mig in graph.of_type(MIG):
        policy = mig.inputs.get("instanceLifecyclePolicy") or {}
        out += repair_violations(mig.name, model, policy.get("defaultActionOnFailure"))
    return out


def check_scheduling(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-host-maintenance``, ``provisioning-model-offered`` (:func:`model_offered_violations`),
    ``gcp-reservation-bound`` (:func:`reservation_bound_violations`)."""
    out = []
    for template in graph.of_type(TEMPLATE):
        scheduling = template.inputs.get("scheduling") or {}
        if scheduling.get("onHostMaintenance") != "TERMINATE" or scheduling.get("automaticRestart") is not False:
            out.append(
                violation(
                    "gcp-host-maintenance",
                    template.name,
                    "GPU VMs need onHostMaintenance TERMINATE and automaticRestart false",
                )
            )
        model = scheduling.get("provisioningModel", "STANDARD")
        out += model_offered_violations(template.name, _template_facts(template, facts), model)
        out += reservation_bound_violations(
            template.name, model, template.get("reservationAffinity.type") == "SPECIFIC_RESERVATION"
        )
    return out


def check_networks(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``nic-layout-matches-facts`` (:func:`nic_layout_violations`), ``mtu-matches-facts``
    (:func:`mtu_violations`), ``gcp-roce-no-firewall`` (:func:`roce_firewall_violations`)."""
    out = []
    for template in graph.of_type(TEMPLATE):
        fact = _template_facts(template, facts)
        nics = template.inputs.get("networkInterfaces") or []
        if fact is None or not nics:
            continue
        layout = nic_layout_violations(template.name, fact, [n.get("nicType") for n in nics])
        if layout:
            out += layout
            continue
        checked: set[str] = set()
        for index, nic in enumerate(nics):
            subnet = graph.referenced(nic.get("subnetwork"), SUBNET)
            net = graph.referenced(subnet.inputs.get("network"), NETWORK) if subnet is not None else None
            if net is None or net.name in checked:
                continue
            checked.add(net.name)
            out += mtu_violations(net.name, fact, index, len(nics), net.inputs.get("mtu"))
    for net in graph.of_type(NETWORK):
        rules = [f for f in graph.of_type(FIREWALL) if graph.referenced(f.inputs.get("network"), NETWORK) is net]
        out += roce_firewall_violations(net.name, bool(net.inputs.get("networkProfile")), len(rules))
    return out


def check_boot_disk(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-boot-disk-type`` on each template's boot disk (:func:`boot_disk_violations`)."""
    out = []
    for template in graph.of_type(TEMPLATE):
        fact = _template_facts(template, facts)
        for disk in template.inputs.get("disks") or []:
            if fact is not None and disk.get("boot"):
                out += boot_disk_violations(template.name, fact, disk.get("diskType"))
    return out


def check_bucket(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``bucket-not-public`` (uniform access + public access prevention enforced) and
    ``bucket-same-region`` (bucket location = the MIG's region)."""
    out = []
    template = graph.first(TEMPLATE)
    region = str(template.inputs.get("region", "")) if template else ""
    for bucket in graph.of_type(BUCKET):
        if (
            bucket.inputs.get("uniformBucketLevelAccess") is not True
            or bucket.inputs.get("publicAccessPrevention") != "enforced"
        ):
            out.append(
                violation(
                    "bucket-not-public",
                    bucket.name,
                    "needs uniformBucketLevelAccess true and publicAccessPrevention 'enforced'",
                )
            )
        location = str(bucket.inputs.get("location", ""))
        if region and location.lower() != region.lower():
            out.append(violation("bucket-same-region", bucket.name, f"bucket in {location}, nodes in {region}"))
    return out


def check_single_zone(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``single-zone`` over the MIGs' zones (:func:`single_zone_violations`)."""
    return single_zone_violations([m.inputs.get("zone") for m in graph.of_type(MIG)])


CHECKS: tuple[Callable[[ResourceGraph, Facts], list[Violation]], ...] = (
    check_local_ssd,
    check_placement,
    check_all_or_nothing,
    check_repair,
    check_scheduling,
    check_networks,
    check_boot_disk,
    check_bucket,
    check_single_zone,
)
