"""The typed, cloud-neutral cluster plan: what a stack builds, decided before Pulumi runs.

:class:`ClusterPlan` gathers the decisions the AWS and GCP planners make
(:func:`gpuinfra.plan.aws.plan_aws_cluster`, :func:`gpuinfra.plan.gcp.plan_gcp_cluster`) into
one shape with the same fields on both clouds -- network, placement, nodes, storage, identity
needs, outputs -- and keeps the cloud's own plan as its ``aws`` or ``gcp`` member for what has no
neutral form (NIC cards, VPCs per NIC, provisioning models). :func:`gpuinfra.plan.cluster.plan_cluster`
builds it; the Pulumi components (``blueprints/aws/cluster.py``, ``blueprints/gcp/cluster.py``)
register resources from it.

Pure Python, no Pulumi imports.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuinfra.plan.aws import AwsClusterPlan
from gpuinfra.plan.gcp import GcpClusterPlan
from gpuinfra.plan.node_bundle import NodeBundle
from gpuinfra.spec import ClusterSpec


@dataclass(frozen=True)
class ClusterNetwork:
    """The network of each node as deployed.

    Attributes:
        nic_layout: the GPU fabric the nodes use: ``ena`` (AWS without EFA), the instance's
            EFA layout from the facts (``InstanceFacts.nic_layout``), or GCP's ``gvnic`` /
            ``tcpx`` / ``tcpxo`` / ``gib`` (with ``high_bandwidth_networking: off`` the plan
            attaches no EFA / GPU NICs and the layout is the plain one).
        nics_per_node: network interfaces per node (AWS launch-template interfaces, GCP NICs).
        efa_per_node: EFA devices per node (0 on GCP and on AWS types without EFA).
    """

    nic_layout: str
    nics_per_node: int
    efa_per_node: int


@dataclass(frozen=True)
class ClusterPlacement:
    """Where the nodes run relative to each other.

    Attributes:
        zone: the zone (AWS AZ id such as ``use1-az4``, GCP zone such as ``us-central1-a``).
        compact: the nodes share a compact placement (AWS ``cluster`` placement group, new or
            an existing one of a targeted reservation; GCP COLLOCATED group placement or the
            HIGH_THROUGHPUT workload policy).
        existing_group: an existing AWS placement group to use instead of a new one, or None.
    """

    zone: str
    compact: bool
    existing_group: str | None = None


@dataclass(frozen=True)
class ClusterNodes:
    """The GPU nodes.

    Attributes:
        count: nodes in the cluster.
        instance_type: AWS instance type or GCP machine type.
        gpus_per_node: GPUs per node; gpu: canonical GPU model name.
        market: how the capacity is bought: AWS EC2 Fleet target capacity type
            (``on-demand`` | ``spot`` | ``capacity-block``), GCP provisioning model
            (``STANDARD`` | ``SPOT`` | ``RESERVATION_BOUND`` ...).
    """

    count: int
    instance_type: str
    gpus_per_node: int
    gpu: str
    market: str


@dataclass(frozen=True)
class ClusterStorage:
    """The stack bucket and each node's scratch.

    Attributes:
        bucket_scheme: ``s3`` or ``gs``.
        node_bundle_key: object key of the node bundle in the bucket (read-only to the nodes).
        scratch_mount: mount point of the node-local scratch (RAID0 over local NVMe).
        scratch_disks: local NVMe disks per node that the scratch uses (0: none).
    """

    bucket_scheme: str
    node_bundle_key: str
    scratch_mount: str
    scratch_disks: int


@dataclass(frozen=True)
class ClusterIdentity:
    """What the nodes' identity (AWS instance profile, GCP service account) must be allowed.

    Attributes:
        bucket_read_only_prefix: the prefix of the stack bucket the nodes may only read (the node
            bundle); the rest of the bucket they read and write.
        metric_writes: the nodes publish GPU metrics (the profile's monitoring is on).
        remote_shell: how an operator reaches a node: ``ssm`` (AWS Session Manager),
            ``iap-ssh`` (GCP, IAP and OS Login) or ``none``.
        peer_discovery: how a node finds its peers: ``ec2-describe-instances`` (AWS) or
            ``own-instance-group`` (GCP: read, and release, its own managed instance group).
    """

    bucket_read_only_prefix: str
    metric_writes: bool
    remote_shell: str
    peer_discovery: str


@dataclass(frozen=True)
class ClusterOutputs:
    """Stack outputs known before any resource exists.

    Attributes:
        nccl_env: the NCCL environment the fabric needs (``nccl_env`` output).
        run_command: how a user starts :data:`gpuinfra.plan.fabric.EXAMPLE_COMMAND` on every node.
        torchrun_port: port of the c10d rendezvous on the rank-0 node.
    """

    nccl_env: dict[str, str]
    run_command: str
    torchrun_port: int


@dataclass(frozen=True)
class ClusterPlan:
    """Everything a stack builds, decided and validated before Pulumi registers a resource.

    Attributes:
        spec: the validated cluster spec the plan was made from.
        network, placement, nodes, storage, identity, outputs: the cloud-neutral decisions
            (see each type).
        node_bundle: the files and units every node installs at boot (the object the bucket
            holds under ``storage.node_bundle_key``).
        aws: the AWS planner's own decisions (NIC cards, egress, AMI parameter); None on GCP.
        gcp: the GCP planner's own decisions (VPCs per NIC, boot disk, image, provisioning,
            local SSD interface); None on AWS.
    """

    spec: ClusterSpec
    network: ClusterNetwork
    placement: ClusterPlacement
    nodes: ClusterNodes
    storage: ClusterStorage
    identity: ClusterIdentity
    outputs: ClusterOutputs
    node_bundle: NodeBundle
    aws: AwsClusterPlan | None = None
    gcp: GcpClusterPlan | None = None

    @property
    def cloud(self) -> str:
        """``aws`` or ``gcp``."""
        return self.spec.cloud


def aws_network(spec: ClusterSpec, plan: AwsClusterPlan) -> ClusterNetwork:
    """The network of an AWS node: EFA devices and interfaces from the plan; the layout is the
    instance's EFA layout when the plan attaches EFA, else ``ena``."""
    return ClusterNetwork(
        nic_layout=spec.facts.nic_layout if plan.efa_count else "ena",
        nics_per_node=len(plan.interfaces),
        efa_per_node=plan.efa_count,
    )


def gcp_network(plan: GcpClusterPlan) -> ClusterNetwork:
    """The network of a GCP node: NICs and layout from the plan; no EFA."""
    return ClusterNetwork(nic_layout=plan.nic_layout, nics_per_node=plan.nic_count, efa_per_node=0)
