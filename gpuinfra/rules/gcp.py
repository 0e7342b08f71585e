"""GCP conformance checks over a preview's resources (rule names and sources in
:data:`gpuinfra.rules.spec_rules.RULES`).

Each check takes the :class:`~gpuinfra.rules.model.ResourceGraph` and a mapping from machine
type to :class:`~gpuinfra.catalog.facts_model.InstanceFacts`, and returns
:class:`~gpuinfra.rules.model.Violation` objects.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuinfra.catalog.facts_model import GCP_PROVISIONING_MODELS, InstanceFacts
from gpuinfra.rules.model import UNKNOWN, Facts, Resource, ResourceGraph, Violation
from gpuinfra.rules.spec_rules import not_sold, violation

TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
MIG = "gcp:compute/instanceGroupManager:InstanceGroupManager"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
NETWORK = "gcp:compute/network:Network"
SUBNET = "gcp:compute/subnetwork:Subnetwork"
FIREWALL = "gcp:compute/firewall:Firewall"
BUCKET = "gcp:storage/bucket:Bucket"


def _template_facts(template: Resource, facts: Facts) -> InstanceFacts | None:
    return facts.get(str(template.inputs.get("machineType", "")))


def _mig_size(graph: ResourceGraph) -> int:
    return graph.whole_number(MIG, "targetSize")


def _policy_links(template: Resource) -> list:
    links = template.inputs.get("resourcePolicies")
    return links if isinstance(links, list) else [links] if links else []


def _policies_of(template: Resource, graph: ResourceGraph) -> list[Resource]:
    found = [graph.referenced(link, POLICY) for link in _policy_links(template)]
    return [p for p in found if p is not None]


def check_local_ssd(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-local-ssd-count``: bundled local SSDs as the type has them (left out where the
    facts say Compute Engine attaches them); attached ones in an allowed count and interface."""
    out = []
    for template in graph.of_type(TEMPLATE):
        fact = _template_facts(template, facts)
        if fact is None:
            continue
        lssd = [d for d in (template.inputs.get("disks") or []) if d.get("diskType") == "local-ssd"]
        count, lf = len(lssd), fact.local_ssd
        if lf.bundled_count:
            allowed = {lf.bundled_count} if lf.list_in_template else {0}
            if count not in allowed:
                out.append(violation("gcp-local-ssd-count", template.name,
                                     f"{count} local SSDs listed; {fact.instance_type} comes with {lf.bundled_count} "
                                     + ("that must be listed" if lf.list_in_template else "that must not be listed")))
        elif count and count not in lf.attach_counts:
            allowed_text = ", ".join(map(str, lf.attach_counts)) or "none"
            out.append(violation("gcp-local-ssd-count", template.name,
                                 f"{count} local SSDs; {fact.instance_type} takes {allowed_text}"))
        bad = {d.get("interface") for d in lssd} - {lf.interface, None}
        if bad and lf.interface:
            out.append(violation("gcp-local-ssd-count", template.name,
                                 f"local SSD interface {sorted(bad)}; {fact.instance_type} uses {lf.interface}"))
    return out


def check_placement(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-placement-supported`` and ``gcp-placement-max-vms``."""
    out = []
    nodes = _mig_size(graph)
    for template in graph.of_type(TEMPLATE):
        fact = _template_facts(template, facts)
        if fact is None:
            continue
        compact = [p for p in _policies_of(template, graph) if p.inputs.get("groupPlacementPolicy")]
        for policy in compact:
            if not fact.placement.compact_policy:
                how = "use a workload policy on the MIG" if fact.placement.workload_policy else "it has no placement"
                out.append(violation("gcp-placement-supported", policy.name,
                                     f"{fact.instance_type} does not take a compact placement policy; {how}"))
            vm_count = policy.get("groupPlacementPolicy.vmCount")
            limit = fact.placement.max_vms
            if isinstance(vm_count, (int, float)) and (vm_count != nodes or (limit and vm_count > limit)):
                out.append(violation("gcp-placement-max-vms", policy.name,
                                     f"vm_count {vm_count} for a MIG of {nodes}" + (f" (limit {limit})" if limit else "")))
        reserved = template.get("reservationAffinity.type") == "SPECIFIC_RESERVATION"
        for mig in graph.of_type(MIG):
            link = mig.get("resourcePolicies.workloadPolicy")
            if link and not fact.placement.workload_policy:
                out.append(violation("gcp-placement-supported", mig.name,
                                     f"{fact.instance_type} does not support workload policies"))
            if (nodes > 1 and fact.placement.workload_policy and not link and not compact and not reserved):
                out.append(violation("gcp-placement-supported", mig.name,
                                     f"{nodes} {fact.instance_type} VMs without a HIGH_THROUGHPUT workload policy"))
            workload = graph.referenced(link, POLICY) if link else None
            if workload is not None and workload.get("workloadPolicy.type") != "HIGH_THROUGHPUT":
                out.append(violation("gcp-placement-supported", workload.name,
                                     "a GPU cluster's workload policy is HIGH_THROUGHPUT"))
        attached = bool(compact) or any(link == UNKNOWN for link in _policy_links(template))  # unknown: judged at `up`
        if nodes > 1 and fact.placement.compact_policy and not fact.placement.workload_policy and not attached \
                and not reserved:
            out.append(violation("gcp-placement-supported", template.name,
                                 f"{nodes} {fact.instance_type} VMs without a compact placement policy"))
    return out


#: Bulk mode (``targetSizePolicy.mode = BULK``: the MIG creates all VMs or none) "is only
#: supported with instance templates that specify either a reservation-bound or flex-start
#: provisioning model" (cloud.google.com/compute/docs/instance-groups/about-bulk-mode#limitations).
BULK_PROVISIONING_MODELS = ("RESERVATION_BOUND", "FLEX_START")
#: Marker of the node-side formation watchdog in the startup script (templates/gcp-cluster-env.sh.j2).
FORMATION_MARKER = "gpuinfra-formation-deadline"


def check_all_or_nothing(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-mig-all-or-nothing``: a multi-node MIG of reservation-bound / flex-start VMs uses
    ``targetSizePolicy`` BULK; STANDARD / SPOT templates cannot (the API refuses bulk mode for
    them), so their startup script must carry the formation watchdog that releases the group."""
    out = []
    template = graph.first(TEMPLATE)
    model = (template.get("scheduling.provisioningModel") or "STANDARD") if template else "STANDARD"
    script = template.get("metadata.startup-script") if template else None
    for mig in graph.of_type(MIG):
        size = mig.inputs.get("targetSize")
        modes = [p.get("mode") for p in (mig.inputs.get("targetSizePolicies") or [])]
        if "BULK" in modes and model not in BULK_PROVISIONING_MODELS:
            out.append(violation("gcp-mig-all-or-nothing", mig.name,
                                 f"bulk mode with a {model} template; Compute Engine takes it only with "
                                 "RESERVATION_BOUND or FLEX_START templates"))
        if model in BULK_PROVISIONING_MODELS and modes != ["BULK"]:
            out.append(violation("gcp-mig-all-or-nothing", mig.name,
                                 f"{model} VMs without targetSizePolicy BULK (set at creation; the mode cannot be "
                                 "changed later): a stockout bills part of the cluster"))
        if not (isinstance(size, (int, float)) and size > 1):
            continue
        if model not in BULK_PROVISIONING_MODELS and isinstance(script, str) and script != UNKNOWN \
                and FORMATION_MARKER not in script:
            out.append(violation("gcp-mig-all-or-nothing", mig.name,
                                 f"target size {size} of {model} VMs and no formation watchdog in the startup "
                                 "script: a stockout bills part of the cluster"))
    return out


def check_scheduling(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-host-maintenance``, ``provisioning-model-offered``, ``gcp-reservation-bound``."""
    out = []
    for template in graph.of_type(TEMPLATE):
        fact = _template_facts(template, facts)
        scheduling = template.inputs.get("scheduling") or {}
        if scheduling.get("onHostMaintenance") != "TERMINATE" or scheduling.get("automaticRestart") is not False:
            out.append(violation("gcp-host-maintenance", template.name,
                                 "GPU VMs need onHostMaintenance TERMINATE and automaticRestart false"))
        model = scheduling.get("provisioningModel", "STANDARD")
        sold_as = GCP_PROVISIONING_MODELS.get(model)
        if fact is not None and sold_as is not None and (unsold := not_sold(template.name, fact, sold_as)):
            out.append(unsold)
        if model == "RESERVATION_BOUND" and template.get("reservationAffinity.type") != "SPECIFIC_RESERVATION":
            out.append(violation("gcp-reservation-bound", template.name,
                                 "RESERVATION_BOUND without a SPECIFIC_RESERVATION reservation affinity"))
    return out


def check_networks(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``nic-layout-matches-facts``, ``mtu-matches-facts``, ``gcp-roce-no-firewall``."""
    out = []
    for template in graph.of_type(TEMPLATE):
        fact = _template_facts(template, facts)
        nics = template.inputs.get("networkInterfaces") or []
        if fact is None or not nics:
            continue
        wanted = [n.nic_type for n in fact.networks for _ in range(n.count)]
        got = [n.get("nicType") for n in nics]
        if got not in (wanted, wanted[:1]):
            out.append(violation("nic-layout-matches-facts", template.name,
                                 f"NICs {got}; {fact.instance_type} has {wanted} (or the system NIC alone)"))
            continue
        roles = [n for n in fact.networks for _ in range(n.count)]
        checked: set[str] = set()
        for index, nic in enumerate(nics):
            subnet = graph.referenced(nic.get("subnetwork"), SUBNET)
            net = graph.referenced(subnet.inputs.get("network"), NETWORK) if subnet is not None else None
            if net is None or net.name in checked:
                continue
            checked.add(net.name)
            expected = roles[index].mtu if len(nics) > 1 else None  # system NIC alone: any MTU
            if expected is not None and net.inputs.get("mtu") != expected:
                out.append(violation("mtu-matches-facts", net.name,
                                     f"MTU {net.inputs.get('mtu')}; the {roles[index].role} network of "
                                     f"{fact.instance_type} uses {expected}"))
    for net in graph.of_type(NETWORK):
        if net.inputs.get("networkProfile"):
            rules = [f for f in graph.of_type(FIREWALL) if graph.referenced(f.inputs.get("network"), NETWORK) is net]
            if rules:
                out.append(violation("gcp-roce-no-firewall", net.name, f"{len(rules)} firewall rules on a RoCE VPC"))
    return out


def check_boot_disk(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``gcp-boot-disk-type``: the boot disk type is one the machine series supports."""
    out = []
    for template in graph.of_type(TEMPLATE):
        fact = _template_facts(template, facts)
        for disk in template.inputs.get("disks") or []:
            if fact is not None and disk.get("boot") and disk.get("diskType") not in fact.boot_disk_types:
                out.append(violation("gcp-boot-disk-type", template.name,
                                     f"boot disk {disk.get('diskType')!r}; {fact.instance_type} takes "
                                     f"{', '.join(fact.boot_disk_types)}"))
    return out


def check_bucket(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``bucket-not-public`` (uniform access + public access prevention enforced) and
    ``bucket-same-region`` (bucket location = the MIG's region)."""
    out = []
    template = graph.first(TEMPLATE)
    region = str(template.inputs.get("region", "")) if template else ""
    for bucket in graph.of_type(BUCKET):
        if bucket.inputs.get("uniformBucketLevelAccess") is not True or bucket.inputs.get("publicAccessPrevention") != "enforced":
            out.append(violation("bucket-not-public", bucket.name,
                                 "needs uniformBucketLevelAccess true and publicAccessPrevention 'enforced'"))
        location = str(bucket.inputs.get("location", ""))
        if region and location.lower() != region.lower():
            out.append(violation("bucket-same-region", bucket.name, f"bucket in {location}, nodes in {region}"))
    return out


def check_single_zone(graph: ResourceGraph, facts: Facts) -> list[Violation]:
    """``single-zone``: the nodes come from zonal MIGs of one zone."""
    zones = {m.inputs.get("zone") for m in graph.of_type(MIG)}
    if None in zones or len(zones) > 1:
        return [violation("single-zone", "", f"managed instance groups in zones {sorted(map(str, zones))}; "
                          "one zonal MIG in one zone")]
    return []


CHECKS: tuple[Callable[[ResourceGraph, Facts], list[Violation]], ...] = (
    check_local_ssd, check_placement, check_all_or_nothing, check_scheduling, check_networks,
    check_boot_disk, check_bucket, check_single_zone,
)
