"""Typed hardware facts of one instance / machine type: the one source every layer reads.

The planner, the blueprints (through the stack file's spec), the conformance rules, cost and
sizing read what they need to know about a type from :class:`InstanceFacts`, never from a
name prefix or a constant of their own. ``gpuinfra new`` copies the facts of the chosen type
into the spec (``gpuinfra:cluster.facts``), so the blueprints deploy what was reviewed without
loading the catalog.

Where the facts come from (each record carries ``sources`` per fact):

* AWS: EC2 ``DescribeInstanceTypes`` (``NetworkInfo.NetworkCards``, ``EfaInfo``,
  ``InstanceStorageInfo``, ``PlacementGroupInfo``, ``SupportedUsageClasses``) --
  docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTypes.html; Capacity
  Block types from docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-blocks.html.
* GCP: the curated family table ``gcp_machine_facts.json`` (GCP has no API field for GPU NIC
  layouts, attachable local SSD counts or workload-policy support); every family cites its
  cloud.google.com pages.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Ways to obtain capacity, in the field's terms. ``reservation-bound``: GCP VMs bound to a
#: (calendar-mode / future) reservation, provisioning model RESERVATION_BOUND; ``capacity-block``:
#: EC2 Capacity Blocks for ML.
ProvisioningModel = Literal["on-demand", "spot", "flex-start", "reservation-bound", "capacity-block"]
PROVISIONING_MODELS: tuple[str, ...] = ("on-demand", "spot", "flex-start", "reservation-bound", "capacity-block")

#: Compute Engine ``scheduling.provisioningModel`` -> provisioning model (pulumi-gcp
#: InstanceTemplateSchedulingArgs: STANDARD, SPOT, FLEX_START, RESERVATION_BOUND).
GCP_PROVISIONING_MODELS = {
    "STANDARD": "on-demand",
    "SPOT": "spot",
    "FLEX_START": "flex-start",
    "RESERVATION_BOUND": "reservation-bound",
}
#: EC2 Fleet ``DefaultTargetCapacityType`` -> provisioning model
#: (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_TargetCapacitySpecificationRequest.html).
AWS_CAPACITY_TYPES = {"on-demand": "on-demand", "spot": "spot", "capacity-block": "capacity-block"}

NicLayout = Literal["efa", "ena", "gvnic", "tcpx", "tcpxo", "gib"]


def aws_primary_card_gbps(total_gbps: float | None, network_cards: int) -> float | None:
    """Bandwidth of one EC2 network card: the total over ``network_cards`` cards (Gbit/s).

    Object-storage (IP) traffic leaves through the primary interface, card 0 / device 0
    (docs/sources/cluster-facts.md section 6, item 6), not through the other cards' EFA interfaces. The
    published total is split evenly over the cards (p5: 3,200 / 32 = 100; G6e: 400 / 4 = 100).
    None when ``total_gbps`` is None or 0.
    """
    if not total_gbps:
        return None
    return total_gbps / max(1, network_cards)


class NicNetwork(BaseModel):
    """One network the type's NICs attach to (GCP: one VPC per entry; AWS: the VPC).

    Attributes:
        role: ``system`` (primary NIC) | ``gpu`` (GPUDirect-TCPX/TCPXO gVNICs, one VPC each) |
            ``host`` (second gVNIC of A3 Ultra / A4) | ``roce`` (MRDMA NICs, one RoCE VPC).
        nic_type: ``GVNIC`` | ``MRDMA`` (GCP API values) | ``ENA`` | ``EFA`` (AWS).
        count: NICs of this role per node. GCP ``gpu`` networks: one VPC per NIC; ``roce``:
            one VPC with one subnet per NIC.
        mtu: MTU of that network in bytes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "gpu", "host", "roce"]
    nic_type: Literal["GVNIC", "MRDMA", "ENA", "EFA"]
    count: int = Field(ge=1)
    mtu: int = Field(ge=576, le=9001)


class LocalSsdFacts(BaseModel):
    """Local NVMe of a type.

    Attributes:
        bundled_count: disks that come with the type and cannot be changed (AWS instance
            store; GCP A2 Ultra, A3, A4, G2 "fixed" local SSD). 0 when none.
        attach_counts: counts of local SSD that may be attached (GCP A2 Standard, N1); empty
            when none can be attached.
        size_gib: size of one disk in GiB (AWS reports decimal GB; converted). 0 when none.
        interface: ``NVME`` | ``SCSI`` (GCP disk interface), ``NVME`` on AWS; "" when none.
        list_in_template: GCP: a bundled disk is listed explicitly in the instance template
            (False: Compute Engine attaches the bundled disks by itself).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    bundled_count: int = Field(ge=0)
    attach_counts: tuple[int, ...] = ()
    size_gib: float = Field(ge=0)
    interface: Literal["NVME", "SCSI", ""] = ""
    list_in_template: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> LocalSsdFacts:
        if self.bundled_count and self.attach_counts:
            raise ValueError("a type has either bundled or attachable local SSD, not both")
        if (self.bundled_count or self.attach_counts) and (self.size_gib <= 0 or not self.interface):
            raise ValueError("local SSD needs size_gib > 0 and an interface")
        return self

    @property
    def total_gib(self) -> float:
        """Bundled capacity in GiB (0 when the disks are attachable or absent)."""
        return self.bundled_count * self.size_gib

    def smallest_attach_count(self, min_gib: float) -> int | None:
        """Smallest allowed attach count that gives at least ``min_gib``; None if none does."""
        fitting = [n for n in sorted(self.attach_counts) if n * self.size_gib >= min_gib]
        return fitting[0] if fitting else None


class PlacementFacts(BaseModel):
    """How nodes of the type are placed close together.

    Attributes:
        cluster_placement_group: AWS placement group ``strategy=cluster``
            (``PlacementGroupInfo.SupportedStrategies``).
        compact_policy: GCP ``groupPlacementPolicy`` COLLOCATED in the instance template, for
            standalone and bulk-inserted VMs (A2, G2, A3 High / Mega / Ultra, A4: "compact placement
            policies ... standalone compute instances, or compute instances created in bulk",
            cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy).
        workload_policy: GCP ``workloadPolicy`` HIGH_THROUGHPUT referenced by the MIG (MIGs with
            clustered GPUs: A3 High 8g, A3 Mega, A3 Ultra, A4, same page); used for the VMs a MIG creates
            itself (reservation-bound bulk mode), a compact policy for bulk-inserted ones.
        max_vms: largest group one placement policy may hold (None: no documented limit).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster_placement_group: bool = False
    compact_policy: bool = False
    workload_policy: bool = False
    max_vms: int | None = None

    @property
    def any(self) -> bool:
        """The type can be placed close together in some way."""
        return self.cluster_placement_group or self.compact_policy or self.workload_policy


#: AWS types whose GPUs take RDMA reads and writes over EFA straight into GPU memory
#: (GPUDirect RDMA). Source: the EC2 user guide's EFA pages, "Supported instance types"
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types) and
#: "Elastic Fabric Adapter for AI/ML" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html):
#: the P4d, P4de, P5, P5e, P5en and P6-B200 8-GPU types. Other EFA types (g4dn, g5, g6, g6e,
#: gr6, p3dn) move GPU data through host memory.
AWS_GPUDIRECT_RDMA_TYPES = frozenset(
    {"p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge"}
)
AWS_GPUDIRECT_RDMA_SOURCE = (
    "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types "
    "(GPUDirect RDMA: P4d, P4de, P5, P5e, P5en, P6-B200)"
)


class InstanceFacts(BaseModel):
    """Hardware and capacity facts of one instance/machine type, the same in every zone.

    Attributes:
        cloud: ``aws`` | ``gcp``.
        instance_type: type name (``p5.48xlarge``, ``a3-megagpu-8g``, ``n1-standard-8``).
        gpu: canonical GPU model (``gpus.json``) built into the type; None for GCP N1 hosts,
            which take attached GPUs (``guest_accelerators``).
        gpu_count: GPUs built in (0 for N1 hosts).
        guest_accelerators: GPUs are attached to the host as guest accelerators (GCP N1).
        network_cards: AWS ``NetworkInfo.MaximumNetworkCards``; 1 on GCP.
        max_interfaces_per_network_card: AWS: ENIs allowed per card (minimum over cards);
            GCP: vNICs of the layout.
        max_efa_interfaces: AWS ``EfaInfo.MaximumEfaInterfaces`` (0 = no EFA); 0 on GCP.
        gpudirect_rdma: AWS: the type does GPUDirect RDMA over EFA (:data:`AWS_GPUDIRECT_RDMA_TYPES`,
            source in ``sources["gpudirect_rdma"]``); without it NCCL's intra-node shared-memory
            transport copies with CUDA (``NCCL_SHM_USE_CUDA_MEMCPY=1``). False on GCP (its GPU
            fabrics are :attr:`nic_layout`).
        nic_layout: ``efa`` | ``ena`` | ``gvnic`` | ``tcpx`` | ``tcpxo`` | ``gib``.
        networks: the NIC networks with their MTU (see :class:`NicNetwork`).
        local_ssd: local NVMe (see :class:`LocalSsdFacts`).
        boot_disk_types: disk types allowed for the boot disk (GCP ``pd-balanced``,
            ``hyperdisk-balanced`` ...; AWS EBS ``gp3`` ...).
        nvswitch: GPUs sit on NVSwitch (NVIDIA fabric manager must run).
        placement: see :class:`PlacementFacts`.
        provisioning_models: ways the cloud sells the type (see :data:`ProvisioningModel`).
        network_bandwidth_gbps: bandwidth, Gbit/s, of the NICs that carry inter-node GPU (NCCL)
            traffic. AWS: the published ``NetworkPerformance`` total (EFA rides on every card),
            or ``PeakBandwidthInGbps`` summed over the cards for "Up to" types
            (:func:`gpuinfra.catalog.facts.aws_bandwidth_gbps`); GCP: all GPU NICs together
            (GPUDirect-TCPX/TCPXO gVNICs, MRDMA NICs) where the type has them, else the VM's
            documented maximum egress (``gcp_machine_facts.json`` ``network_bandwidth``, sources
            per family). None when no citable figure exists (fail closed).
        host_nic_bandwidth_gbps: bandwidth, Gbit/s, of the NIC(s) that carry host traffic --
            object storage, so the checkpoint upload -- which never uses the EFA / GPU NICs.
            AWS: the primary network card's share, ``network_bandwidth_gbps /
            network_cards``; GCP: the documented bandwidth of the non-GPU gVNIC(s) together
            (A3 Mega / High: the primary NIC, "up to 200 Gbps"; A3 Ultra / A4: "2 host NICs
            providing a bandwidth of 400 Gbps"), the VM's maximum egress for single-NIC
            types. None when unknown.
        sources: fact name -> the page or file it comes from.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cloud: Literal["aws", "gcp"]
    instance_type: str = Field(min_length=1)
    gpu: str | None = None
    gpu_count: int = Field(ge=0)
    guest_accelerators: bool = False
    network_cards: int = Field(ge=1)
    max_interfaces_per_network_card: int = Field(ge=1)
    max_efa_interfaces: int = Field(ge=0)
    gpudirect_rdma: bool = False
    nic_layout: NicLayout
    networks: tuple[NicNetwork, ...] = Field(min_length=1)
    local_ssd: LocalSsdFacts
    boot_disk_types: tuple[str, ...] = Field(min_length=1)
    nvswitch: bool
    placement: PlacementFacts
    provisioning_models: tuple[ProvisioningModel, ...] = Field(min_length=1)
    network_bandwidth_gbps: float | None = None
    host_nic_bandwidth_gbps: float | None = Field(default=None, gt=0)
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _aws_host_nic_of_older_records(cls, data: object) -> object:
        """AWS facts recorded before ``host_nic_bandwidth_gbps`` or ``gpudirect_rdma`` existed (stack files, refreshed
        catalogs) get the same derivation as :func:`aws_primary_card_gbps`, so they stay equal
        to the catalog's facts."""
        if isinstance(data, dict) and data.get("cloud") == "aws" and "host_nic_bandwidth_gbps" not in data:
            data = {
                **data,
                "host_nic_bandwidth_gbps": aws_primary_card_gbps(
                    data.get("network_bandwidth_gbps"), int(data.get("network_cards") or 1)
                ),
            }
        if isinstance(data, dict) and data.get("cloud") == "aws" and "gpudirect_rdma" not in data:
            # recorded before the fact existed: the same table the catalog build reads
            data = {**data, "gpudirect_rdma": data.get("instance_type") in AWS_GPUDIRECT_RDMA_TYPES}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> InstanceFacts:
        if self.networks[0].role != "system":
            raise ValueError("the first NIC network must be the system network")
        if self.max_efa_interfaces and self.nic_layout != "efa":
            raise ValueError("a type with EFA interfaces has nic_layout efa")
        if self.guest_accelerators and (self.gpu is not None or self.gpu_count):
            raise ValueError("a host with guest accelerators has no built-in GPU")
        return self

    @property
    def efa_supported(self) -> bool:
        """True when the type takes at least one EFA interface (AWS only)."""
        return self.max_efa_interfaces > 0

    @property
    def gpu_nic_count(self) -> int:
        """High-bandwidth NICs for GPU traffic: AWS EFA interfaces, GCP GPU gVNICs or MRDMA NICs."""
        if self.cloud == "aws":
            return self.max_efa_interfaces
        return sum(n.count for n in self.networks if n.role in ("gpu", "roce"))

    @property
    def nic_count(self) -> int:
        """NICs per node in the full layout (GCP; AWS: EFA interfaces, or 1)."""
        if self.cloud == "aws":
            return max(self.max_efa_interfaces, 1)
        return sum(n.count for n in self.networks)

    @property
    def mtu(self) -> int:
        """MTU of the system (primary) network."""
        return self.networks[0].mtu

    def offers_model(self, model: str) -> bool:
        """True when the cloud sells the type as ``model`` (see :data:`ProvisioningModel`)."""
        return model in self.provisioning_models

    def to_dict(self) -> dict:
        """JSON-compatible form (``instance_types.json`` and the stack file)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict) -> InstanceFacts:
        """Inverse of :meth:`to_dict`.

        Raises:
            pydantic.ValidationError: a field is missing or out of range.
        """
        return cls.model_validate(data)
