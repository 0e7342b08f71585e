"""Price the resources of a plan through cost components.

Input is the resource list of a plan -- the offline preview's records or the steps of a real
``pulumi preview --json`` -- plus the provider config (region). Each priced resource yields one
or more :class:`CostLine` (component, unit, quantity per hour, unit price, source, date).
Compute comes from the instance catalog (one price per node-hour for the market); disks, IPs, NAT, storage and
transfer from :mod:`gpuinfra.catalog.prices`. A line whose price is not found keeps
``unit_price_usd = None`` and is counted, never priced at $0. Resources with no charge of their
own are listed as free; unknown resource types as not priced.

Model notes: instance hours = nodes per hour; EBS/PD GB-months per hour = size x nodes / 730;
storage for the run = usage GB / 730 per hour; per-run transfer (egress, NAT processing) is
spread over the run hours. Bundled local SSDs (A2 Ultra, A3, A4) are part of the catalog's
machine price (GCP bills them with the machine type); attached local SSDs are billed per GB-month
at the on-demand or Spot VM rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal

from gpuinfra.catalog.model import MARKETS
from gpuinfra.catalog.prices import (
    CONTAINER_PULL_GB,
    HOURS_PER_MONTH,
    HYPERDISK_BALANCED_FREE_IOPS,
    HYPERDISK_BALANCED_FREE_THROUGHPUT_MIBPS,
    Price,
    price,
    price_cap,
)
from gpuinfra.catalog.store import Catalog, load_gpu_models
from gpuinfra.cost.after_down import KeptLine, left_after_down
from gpuinfra.cost.lines import CostLine
from gpuinfra.cost.monitoring import MONITORING_TYPES, monitoring_lines
from gpuinfra.launch_errors import GCP_BULK_INSERT_TYPE as GCP_BULK_INSERT
from gpuinfra.launch_errors import GCP_RESIZE_REQUEST_TYPE as GCP_RESIZE_REQUEST
from gpuinfra.locality import quote_transfer

FREE_TYPES = frozenset(
    {
        "gpuinfra:aws:GpuCluster",
        "gpuinfra:gcp:GpuCluster",
        "aws:ec2/vpc:Vpc",
        "aws:ec2/subnet:Subnet",
        "aws:ec2/internetGateway:InternetGateway",
        "aws:ec2/routeTable:RouteTable",
        "aws:ec2/route:Route",
        "aws:ec2/routeTableAssociation:RouteTableAssociation",
        "aws:ec2/securityGroup:SecurityGroup",
        "aws:ec2/securityGroupRule:SecurityGroupRule",
        "aws:ec2/placementGroup:PlacementGroup",
        "aws:ec2/vpcEndpoint:VpcEndpoint",
        "aws:iam/role:Role",
        "aws:iam/rolePolicy:RolePolicy",
        "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
        "aws:iam/instanceProfile:InstanceProfile",
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws:s3/bucketVersioning:BucketVersioning",
        "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
        "aws:s3/bucketPolicy:BucketPolicy",
        # the node bundle, one object of ~0.1 MB in the stack bucket: its storage is in the bucket's
        # line (usage bucket_storage_gb), its few GETs at boot round to $0.00 (gpuinfra/plan/node_bundle.py)
        "aws:s3/bucketObjectv2:BucketObjectv2",
        "gcp:storage/bucketObject:BucketObject",
        # the bulk-inserted nodes are priced on the MIG's compute line (nodes = its target size
        # + the bulk insert's count: read_cluster_facts)
        GCP_BULK_INSERT,
        "gcp:compute/network:Network",
        "gcp:compute/subnetwork:Subnetwork",
        "gcp:compute/firewall:Firewall",
        "gcp:compute/router:Router",
        "gcp:compute/resourcePolicy:ResourcePolicy",
        # a flex-start group's resize request has no charge of its own: the VMs it creates bill,
        # priced on the group's compute line with the request's node count (read_cluster_facts)
        GCP_RESIZE_REQUEST,
        "gcp:serviceaccount/account:Account",
        "gcp:storage/bucketIAMMember:BucketIAMMember",
        "gcp:projects/iAMMember:IAMMember",
        "gcp:projects/iAMCustomRole:IAMCustomRole",
        # Spot replacement (gpuinfra/plan/replacement.py): EventBridge ingests "AWS management
        # events ... for free", $0.00 per million (aws.amazon.com/eventbridge/pricing/), and a rule,
        # its target, the invoke permission and the retry settings have no charge of their own;
        # the function is priced below
        "aws:cloudwatch/eventRule:EventRule",
        "aws:cloudwatch/eventTarget:EventTarget",
        "aws:lambda/permission:Permission",
        "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig",
    }
)
#: The resources whose lines are the nodes' compute (:func:`_compute_lines`: instance-hours of
#: the fleet or the managed instance group, priced from the instance catalog for the stack's zone).
COMPUTE_TYPES = frozenset({"aws:ec2/fleet:Fleet", "gcp:compute/instanceGroupManager:InstanceGroupManager"})
#: The backstop schedule fires once per run: one invocation, in the price's unit (millions).
SCHEDULER_INVOCATIONS_PER_RUN = Decimal("0.000001")
#: Spot interruptions ``cost`` prices per node and run for the replacement function (an assumption:
#: EC2 publishes no interruption rate per instance; a run with more costs more, a few ten-thousandths
#: of a dollar each).
PRICED_INTERRUPTIONS_PER_NODE = 1
#: Lambda's retries of an asynchronous invocation when the function sets none: "by default Lambda
#: attempts to run it two more times" (docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html).
LAMBDA_DEFAULT_RETRIES = 2
GP3_FREE_IOPS = 3000
GP3_FREE_THROUGHPUT = 125
CATALOG_SOURCE = "gpuinfra instance catalog"


#: Catalog market of a GCP template's ``scheduling.provisioningModel`` (absent: STANDARD).
GCP_MARKET_OF_MODEL = {"SPOT": "spot", "FLEX_START": "flex-start"}


@dataclass
class ClusterFacts:
    """What the resources say about the cluster (read once from the plan)."""

    cloud: str
    region: str
    zone: str | None = None
    instance_type: str | None = None
    nodes: int = 0
    market: str = "on-demand"
    profile: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None


@dataclass
class Estimate:
    """Priced lines plus what was free or could not be priced."""

    facts: ClusterFacts
    lines: list[CostLine]
    free: list[str] = field(default_factory=list)
    not_priced: list[tuple[str, str, str]] = field(default_factory=list)
    alternative_compute_hourly_usd: Decimal | None = None  # the other market (spot <-> on-demand)
    #: monthly charges of what ``down`` keeps (:mod:`gpuinfra.cost.after_down`)
    left_after_down: list[KeptLine] = field(default_factory=list)


def _line(
    resource, rtype, component, unit, qty, p: Price | None, usage_based=False, note="", missing_source=""
) -> CostLine:
    return CostLine(
        resource=resource,
        resource_type=rtype,
        component=component,
        unit=unit,
        hourly_quantity=Decimal(qty),
        unit_price_usd=None if p is None else p.usd,
        source=missing_source if p is None else p.source,
        price_date="" if p is None else p.date,
        usage_based=usage_based,
        note=note,
    )


def read_cluster_facts(resources: list, region: str | None) -> ClusterFacts:
    """Cluster shape from the plan's resources (see module docstring)."""
    cloud = "gcp" if any(r.type.startswith("gcp:") for r in resources) else "aws"
    facts = ClusterFacts(cloud=cloud, region=region or "")
    bulk_nodes = sum(int(r.inputs.get("count", 0)) for r in resources if r.type == GCP_BULK_INSERT)
    for r in resources:
        tags = r.inputs.get("tags") or r.inputs.get("labels") or {}
        facts.profile = facts.profile or tags.get("gpuinfra:profile") or tags.get("gpuinfra-profile")
        if r.type == "aws:ec2/launchTemplate:LaunchTemplate":
            facts.instance_type = r.inputs.get("instanceType")
        elif r.type == "aws:ec2/fleet:Fleet":
            spec = r.inputs.get("targetCapacitySpecification", {})
            facts.nodes = int(spec.get("totalTargetCapacity", 0))
            facts.market = spec.get("defaultTargetCapacityType", "on-demand")
        elif r.type == "aws:ec2/subnet:Subnet" and facts.zone is None:
            facts.zone = r.inputs.get("availabilityZoneId")
        elif r.type == "gcp:compute/instanceTemplate:InstanceTemplate":
            facts.instance_type = r.inputs.get("machineType")
            facts.region = facts.region or r.inputs.get("region", "")
            sched = r.inputs.get("scheduling", {})
            # FLEX_START is priced from the catalog's flex-start (DWS) price, never on-demand's
            facts.market = GCP_MARKET_OF_MODEL.get(sched.get("provisioningModel"), "on-demand")
            accelerators = r.inputs.get("guestAccelerators") or []
            if accelerators:
                by_type = {g.gcp_accelerator_type: g.name for g in load_gpu_models() if g.gcp_accelerator_type}
                facts.gpu = by_type.get(accelerators[0]["type"])
                facts.gpu_count = int(accelerators[0]["count"])
        elif r.type == "gcp:compute/instanceGroupManager:InstanceGroupManager":
            # a bulk-insert formation's MIG starts at 0: its nodes are the bulk insert's count
            facts.nodes += int(r.inputs.get("targetSize", 0)) + bulk_nodes
            facts.zone = r.inputs.get("zone")
        elif r.type == GCP_RESIZE_REQUEST:
            # a flex-start group starts at size 0; its resize request adds every node
            # (pulumi-gcp ResizeRequest ``resizeBy``: "The group's target size will be increased by this number")
            facts.nodes += int(r.inputs.get("resizeBy", 0))
    if cloud == "gcp" and facts.zone and not facts.region:
        facts.region = facts.zone.rsplit("-", 1)[0]
    return facts


def _find_offer(catalog: Catalog, facts: ClusterFacts):
    return catalog.find_offer(facts.cloud, facts.instance_type, facts.zone, facts.gpu, facts.gpu_count)


def _capacity_block_line(facts: ClusterFacts, resource: str, rtype: str, fee: Price, hours: Decimal) -> CostLine:
    """A Capacity Block's upfront fee as one line paid once: the fee covers the whole block
    whatever the run's length (EC2 charges it up front at purchase; the price does not change
    after: docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-pricing-billing.html)."""
    return CostLine(
        resource,
        rtype,
        f"Capacity Block, paid up front ({facts.instance_type})",
        "blocks",
        Decimal(1) / hours,
        fee.usd,
        fee.source,
        fee.date,
        note="upfront fee for the whole block, counted once",
        one_time=True,
    )


def _compute_lines(
    catalog: Catalog,
    facts: ClusterFacts,
    resource: str,
    rtype: str,
    market: str,
    block_price: Price | None = None,
    hours: Decimal = Decimal(1),
) -> tuple[list[CostLine], Decimal | None]:
    offer = _find_offer(catalog, facts)
    date = catalog.date_for(facts.cloud)
    spot = market == "spot"
    label = "spot" if spot else market
    source = f"{CATALOG_SOURCE} ({facts.cloud} {facts.zone})"
    if market == "capacity-block" and block_price is not None:
        return [_capacity_block_line(facts, resource, rtype, block_price, hours)], None
    if offer is None or market == "capacity-block":
        reason = (
            "Capacity Block prices are set per reservation"
            if market == "capacity-block"
            else f"no catalog offer for {facts.instance_type} in {facts.zone}"
        )
        return [
            CostLine(
                resource,
                rtype,
                f"Instance usage ({label}, {facts.instance_type})",
                "instance-hours",
                Decimal(facts.nodes),
                None,
                reason,
                date,
            )
        ], None
    other = None if market == "flex-start" else offer.price_per_hour_usd("on-demand" if spot else "spot")
    alternative = None if other is None else other * facts.nodes
    what = offer.instance_type
    if facts.cloud == "gcp":
        fact = catalog.fact("gcp", offer.instance_type)
        bundled = fact.local_ssd.bundled_count if fact else 0
        what += f": {offer.gpu_count}x {offer.gpu}, {offer.vcpus:g} vCPU, {offer.memory_gib:g} GiB" + (
            f", {bundled}x{fact.local_ssd.size_gib:g} GiB Local SSD" if fact and bundled else ""
        )
    price = offer.price_per_hour_usd(market if market in MARKETS else "on-demand")
    reason = source if price is not None else f"no {label} price for {offer.instance_type} in {facts.zone}"
    return [
        CostLine(
            resource,
            rtype,
            f"Instance usage ({label}, {what})",
            "instance-hours",
            Decimal(facts.nodes),
            price,
            reason,
            date,
        )
    ], alternative


def estimate(
    resources: list,
    catalog: Catalog,
    region: str | None,
    usage: dict[str, Decimal],
    hours: Decimal,
    market: str | None = None,
    data=None,
    capacity_block_price: Price | None = None,
) -> Estimate:
    """Price ``resources`` (objects with ``type``, ``name``, ``inputs``).

    Args:
        resources: the plan's resources.
        catalog: instance catalog for compute prices.
        region: the provider region (``aws:region`` / ``gcp:region``).
        usage: run usage (``bucket_storage_gb``, ``internet_egress_gb``, ``nat_processed_gb``).
        hours: run length in hours (per-run transfer is spread over it).
        market: price compute as ``spot`` / ``on-demand`` instead of what the plan says.
        data: the stack's data set (:class:`gpuinfra.spec.DataSource`): moving it to the
            cluster once is a line spread over the run (:mod:`gpuinfra.locality`).
        capacity_block_price: a Capacity Block stack's upfront fee (the stack file's
            ``capacity_block_upfront_usd``, :func:`capacity_block_price`): its compute is one
            upfront line; None leaves a Capacity Block's compute unpriced.
    """
    facts = read_cluster_facts(resources, region)
    chosen = market or facts.market
    cloud, reg = facts.cloud, facts.region
    result = Estimate(facts=facts, lines=[])
    lines = result.lines
    for r in resources:
        t, name, inputs = r.type, r.name, r.inputs
        if t in COMPUTE_TYPES:
            compute, result.alternative_compute_hourly_usd = _compute_lines(
                catalog, facts, name, t, chosen, capacity_block_price, hours
            )
            lines += compute
        elif t == "aws:ec2/launchTemplate:LaunchTemplate":
            lines += _aws_launch_template(name, t, inputs, facts)
        elif t == "aws:ec2/natGateway:NatGateway":
            lines.append(
                _line(
                    name,
                    t,
                    "NAT gateway",
                    "hours",
                    1,
                    price("aws", "nat_gateway_per_hour", reg),
                    missing_source=f"no NAT gateway price for {reg}",
                )
            )
            lines.append(
                _nat_data_line(
                    name, t, "NAT data processed", resources, usage, facts.nodes, hours,
                    price("aws", "nat_gateway_per_gb", reg), f"no NAT gateway price for {reg}",
                )
            )  # fmt: skip
        elif t == "aws:ec2/eip:Eip":
            lines.append(_line(name, t, "Public IPv4 address", "hours", 1, price("aws", "public_ipv4_per_hour", reg)))
        elif t == "aws:scheduler/schedule:Schedule":
            lines.append(
                _one_time(
                    _line(
                        name,
                        t,
                        "EventBridge Scheduler invocation (TTL backstop)",
                        "million invocations",
                        SCHEDULER_INVOCATIONS_PER_RUN / hours,
                        price("aws", "scheduler_per_million_invocations", reg),
                        note="once per run; the first 14 million a month are free",
                        missing_source=f"no EventBridge Scheduler price for {reg}",
                    )
                )
            )
        elif t == "aws:lambda/function:Function":
            lines += _lambda_lines(name, t, inputs, resources, facts, reg, hours)
        elif t == "aws:s3/bucket:Bucket":
            lines += _storage_lines(
                name, t, cloud, reg, usage, hours, "s3_standard_per_gb_month", "S3 Standard storage"
            )
            versioning = [v for v in resources if v.type == "aws:s3/bucketVersioning:BucketVersioning"]
            if any((v.inputs.get("versioningConfiguration") or {}).get("status") == "Enabled" for v in versioning):
                lines.append(_noncurrent_line(name, t, cloud, reg, usage, "s3_standard_per_gb_month"))
        elif t == "gcp:storage/bucket:Bucket":
            lines += _storage_lines(
                name, t, cloud, reg, usage, hours, "gcs_standard_per_gb_month", "GCS Standard storage"
            )
            if (inputs.get("versioning") or {}).get("enabled"):
                lines.append(_noncurrent_line(name, t, cloud, reg, usage, "gcs_standard_per_gb_month"))
        elif t == "gcp:compute/instanceTemplate:InstanceTemplate":
            lines += _gcp_template_disks(name, t, inputs, facts, catalog.fact("gcp", facts.instance_type or ""), chosen)
        elif t == "gcp:compute/routerNat:RouterNat":
            per_vm = price("gcp", "cloud_nat_per_vm_hour", reg)
            cap = price_cap("gcp", "cloud_nat_per_vm_hour")
            vms = Decimal(facts.nodes)
            if per_vm is not None and cap is not None and vms * per_vm.usd > cap:
                per_vm = Price(cap / vms, per_vm.source + " (capped)", per_vm.date)
            lines.append(_line(name, t, "Cloud NAT gateway (per VM)", "VM-hours", vms, per_vm))
            ips = _nat_ip_count(facts.nodes, inputs)
            lines.append(
                _line(
                    name,
                    t,
                    f"Cloud NAT IP address ({ips}, auto-allocated)",
                    "IP-hours",
                    Decimal(ips),
                    price("gcp", "external_ip_per_hour", reg),
                    missing_source=f"no external IP price for {reg}",
                )
            )
            lines.append(
                _nat_data_line(
                    name, t, "Cloud NAT data processed", resources, usage, facts.nodes, hours,
                    price("gcp", "cloud_nat_per_gb", reg), "",
                )
            )  # fmt: skip
        elif t in MONITORING_TYPES:  # GPU monitoring: gpuinfra/cost/monitoring.py
            priced = monitoring_lines(name, t, facts, catalog, inputs)
            lines += priced
            if not priced:
                result.free.append(name)
        elif t in FREE_TYPES:
            result.free.append(name)
        else:
            result.not_priced.append((name, t, "no cost model for this resource type"))
    if data is not None and cloud:
        lines.append(_data_line(data, cloud, reg or "", hours))
    result.left_after_down = left_after_down(resources, reg or "", usage["bucket_storage_gb"])
    key = "aws_per_gb" if cloud == "aws" else "gcp_per_gb"
    lines.append(
        _line(
            "cluster",
            "network",
            "Inter-zone data transfer",
            "GB",
            0,
            price("inter_zone", key, reg),
            note="0 by design: every node is in one zone",
        )
    )
    return result


def _nodes_have_public_ip(resources: list) -> bool:
    """True when the nodes get a public address of their own: an AWS launch template network
    interface with ``associatePublicIpAddress``, or a GCP instance template interface with an
    ``accessConfigs`` entry (cloud.google.com/compute/docs/ip-addresses#ephemeraladdress)."""
    for r in resources:
        for nic in r.inputs.get("networkInterfaces") or []:
            aws_public = nic.get("associatePublicIpAddress") in ("true", True)
            if (r.type == "aws:ec2/launchTemplate:LaunchTemplate" and aws_public) or (
                r.type == "gcp:compute/instanceTemplate:InstanceTemplate" and nic.get("accessConfigs")
            ):
                return True
    return False


def _nat_processed_gb(resources: list, usage: dict[str, Decimal], nodes: int) -> tuple[Decimal, str]:
    """GB one run sends through the NAT gateway, and how it is made up.

    * ``nat_processed_gb`` of the usage: what the cluster fetches from outside the cloud
      besides the container (packages, data sets), once per run;
    * :data:`~gpuinfra.catalog.prices.CONTAINER_PULL_GB` per node: every node pulls the NGC
      container from nvcr.io through the NAT (an upper bound for a baked image, which holds it);
    * ``internet_egress_gb`` when the nodes have no public address of their own: their
      traffic to the internet leaves through the NAT, which bills it as processed data on top
      of the egress charge (cloud.google.com/nat/pricing: "data processed ... in both
      directions"; aws.amazon.com/vpc/pricing/: "Data Processing charge ... for each gigabyte
      processed by the NAT gateway regardless of the traffic's source or destination"). Egress
      of nodes with a public IP (AWS inference nodes) does not pass the NAT.

    Transfer is once per run: a cluster left running idle moves no new data, so these lines
    (and ``Internet egress``) count once in ``monthly_if_left_running_usd``.
    """
    pulls = CONTAINER_PULL_GB * nodes
    gb = usage["nat_processed_gb"] + pulls
    what = f"{usage['nat_processed_gb']:f} GB fetched + {nodes} x {CONTAINER_PULL_GB:f} GB container pulls"
    if not _nodes_have_public_ip(resources):
        gb += usage["internet_egress_gb"]
        what += f" + {usage['internet_egress_gb']:f} GB egress from the nodes"
    return gb, what


def _data_line(data, cloud: str, region: str, hours: Decimal) -> CostLine:
    """Moving the data set once, spread over the run (free, priced, or not found)."""
    moved = quote_transfer(data, cloud, region)
    component = f"Data set transfer ({moved.gb:f} GB, {moved.route})"
    if moved.free:
        return CostLine(
            "cluster",
            "data",
            component,
            "GB",
            moved.gb / hours,
            Decimal(0),
            "same cloud and region: no transfer charge",
            "",
            note="free",
            one_time=True,
        )
    line = _line(
        "cluster",
        "data",
        component,
        moved.unit,
        moved.quantity / hours,
        moved.price_per_gb,
        missing_source=f"no transfer price for {moved.route}",
        note="once per run",
    )
    return _one_time(line)


def _nat_data_line(name, t, label, resources, usage, nodes, hours, unit_price, missing_source) -> CostLine:
    """The NAT data line of either cloud: :func:`_nat_processed_gb` GB once per run at ``unit_price``."""
    gb, what = _nat_processed_gb(resources, usage, nodes)
    return _one_time(
        _line(
            name,
            t,
            f"{label} ({what})",
            "GB",
            gb / hours,
            unit_price,
            usage_based=True,
            note="once per run",
            missing_source=missing_source,
        )
    )


def _lambda_lines(name, t, inputs, resources, facts: ClusterFacts, reg, hours) -> list[CostLine]:
    """The Spot replacement function (:mod:`blueprints.aws.replacement`): per run,
    :data:`PRICED_INTERRUPTIONS_PER_NODE` interruptions per node and one call of each schedule
    that targets it (the TTL backstop), each invoked once plus its
    retries (the function's ``FunctionEventInvokeConfig``, else Lambda's default), each billed for
    the whole timeout at its memory size (an upper bound). Only arm64 prices are in the table: any
    other architecture is not priced (fails closed)."""
    configs = [
        r.inputs
        for r in resources
        if r.type == "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig"
        and r.inputs.get("functionName") == inputs.get("name", name)
    ]
    retries = int(configs[0].get("maximumRetryAttempts", LAMBDA_DEFAULT_RETRIES)) if configs else LAMBDA_DEFAULT_RETRIES
    # the backstop schedule that invokes it once at the TTL (blueprints/aws/replacement.py), with
    # retries: a schedule whose target is this Lambda function (its ARN ends in :function:<name>)
    function_name = str(inputs.get("name") or name)
    backstops = [
        r
        for r in resources
        if r.type == "aws:scheduler/schedule:Schedule"
        and str((r.inputs.get("target") or {}).get("arn", "")).endswith(f":function:{function_name}")
    ]
    invocations = Decimal((facts.nodes * PRICED_INTERRUPTIONS_PER_NODE + len(backstops)) * (1 + retries))
    arm = list(inputs.get("architectures") or ["x86_64"]) == ["arm64"]
    gb_seconds = invocations * Decimal(int(inputs.get("memorySize") or 128)) / 1024 * int(inputs.get("timeout") or 3)
    why = "" if arm else f"no Lambda price for architecture {inputs.get('architectures') or ['x86_64']}"
    note = (
        f"{invocations} invocations a run: {PRICED_INTERRUPTIONS_PER_NODE} Spot interruption per node"
        f"{' and the TTL backstop' if backstops else ''}, each with {retries} retries"
    )
    return [
        _one_time(
            _line(
                name, t, "Lambda requests (Spot replacement)", "million requests",
                invocations / Decimal(1_000_000) / hours,
                price("aws", "lambda_requests_per_million", reg) if arm else None,
                note=note, missing_source=why or f"no Lambda request price for {reg}",
            )
        ),
        _one_time(
            _line(
                name, t, "Lambda duration (Spot replacement)", "GB-seconds",
                gb_seconds / hours,
                price("aws", "lambda_duration_arm_per_gb_second", reg) if arm else None,
                note=f"{note}, each billed for the whole timeout",
                missing_source=why or f"no Lambda duration price for {reg}",
            )
        ),
    ]  # fmt: skip


def _one_time(line: CostLine) -> CostLine:
    """``line`` as a once-per-run charge (spread over the run's hours, counted once if left running)."""
    return replace(line, one_time=True)


#: Ports per NAT IP address and the default minimum ports per VM
#: (cloud.google.com/nat/docs/ports-and-addresses: "Each NAT IP address ... 64,512 ports";
#: "the default minimum number of ports per VM is 64").
NAT_PORTS_PER_IP = 64512
NAT_DEFAULT_MIN_PORTS_PER_VM = 64


def _nat_ip_count(nodes: int, inputs: dict) -> int:
    """NAT IPs an AUTO_ONLY Cloud NAT allocates for ``nodes`` VMs: ceil(VMs x min ports / 64,512), at least 1."""
    ports = int(inputs.get("minPortsPerVm") or NAT_DEFAULT_MIN_PORTS_PER_VM)
    return max(1, -(-max(nodes, 1) * ports // NAT_PORTS_PER_IP))


def _aws_launch_template(name: str, t: str, inputs: dict, facts: ClusterFacts) -> list[CostLine]:
    lines = []
    reg, nodes = facts.region, Decimal(facts.nodes)
    for mapping in inputs.get("blockDeviceMappings") or []:
        ebs = mapping.get("ebs") or {}
        size = Decimal(str(ebs.get("volumeSize", 8)))
        vtype = ebs.get("volumeType", "gp3")
        if vtype != "gp3":
            lines.append(
                _line(
                    name,
                    t,
                    f"EBS {vtype} storage",
                    "GB-months",
                    size * nodes / HOURS_PER_MONTH,
                    None,
                    missing_source=f"no {vtype} price table",
                )
            )
            continue
        lines.append(
            _line(
                name,
                t,
                f"EBS gp3 root volume ({size} GiB x {facts.nodes} nodes)",
                "GB-months",
                size * nodes / HOURS_PER_MONTH,
                price("aws", "ebs_gp3_per_gb_month", reg),
                missing_source=f"no gp3 price for {reg}",
            )
        )
        extra_iops = max(0, int(ebs.get("iops", GP3_FREE_IOPS)) - GP3_FREE_IOPS)
        extra_tput = max(0, int(ebs.get("throughput", GP3_FREE_THROUGHPUT)) - GP3_FREE_THROUGHPUT)
        if extra_iops:
            lines.append(
                _line(
                    name,
                    t,
                    "EBS gp3 provisioned IOPS",
                    "IOPS-months",
                    Decimal(extra_iops) * nodes / HOURS_PER_MONTH,
                    price("aws", "ebs_gp3_iops_per_month", reg),
                )
            )
        if extra_tput:
            lines.append(
                _line(
                    name,
                    t,
                    "EBS gp3 provisioned throughput",
                    "MiBps-months",
                    Decimal(extra_tput) * nodes / HOURS_PER_MONTH,
                    price("aws", "ebs_gp3_throughput_per_mibps_month", reg),
                )
            )
    public = [n for n in inputs.get("networkInterfaces") or [] if n.get("associatePublicIpAddress") in ("true", True)]
    if public:
        lines.append(
            _line(
                name,
                t,
                "Public IPv4 address (per node)",
                "hours",
                nodes * len(public),
                price("aws", "public_ipv4_per_hour", reg),
            )
        )
    return lines


#: ``prices.yaml`` ``gcp`` capacity key of each boot disk type a plan can choose
#: (:data:`gpuinfra.plan.gcp.BOOT_DISK_PREFERENCE`). Hyperdisk Balanced (the only boot disk of A3
#: Ultra / A4) bills capacity plus provisioned IOPS above 3,000 and throughput above 140 MiB/s
#: (cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced, "Baseline performance"):
#: :func:`_hyperdisk_balanced_lines`. Its three tables come from a dated dump of the Compute Engine
#: Billing Catalog (SKUs "Hyperdisk Balanced Capacity / IOPS / Throughput in <region>", fetched
#: 2026-04-30; docs/prices.md), refreshed by ``gpuinfra catalog refresh --cloud gcp``; a region
#: without one of them leaves its line unpriced (tests/test_region_prices.py lists the regions).
GCP_BOOT_DISK_PRICE_KEYS: dict[str, str] = {
    "pd-balanced": "pd_balanced_per_gb_month",
    "hyperdisk-balanced": "hyperdisk_balanced_per_gib_month",
}


def _hyperdisk_balanced_lines(name: str, t: str, disk: dict, facts: ClusterFacts) -> list[CostLine]:
    """Hyperdisk Balanced disk lines: capacity, and IOPS / throughput provisioned above what the
    volume includes (:data:`HYPERDISK_BALANCED_FREE_IOPS`, ...). An excess of 0 needs no price;
    a disk that provisions none leaves GCP to pick a default, which is not priced here (an
    unpriced line, never $0)."""
    reg, nodes = facts.region, Decimal(facts.nodes)
    size = Decimal(str(disk.get("diskSizeGb", 10)))
    lines = [
        _line(
            name,
            t,
            f"hyperdisk-balanced boot disk ({size} GiB x {facts.nodes} nodes)",
            "GB-months",
            size * nodes / HOURS_PER_MONTH,
            price("gcp", "hyperdisk_balanced_per_gib_month", reg),
            missing_source=f"no hyperdisk-balanced price for {reg}",
        )
    ]
    for field_name, free, label, unit, key in (
        ("provisionedIops", HYPERDISK_BALANCED_FREE_IOPS, "IOPS", "IOPS-months", "hyperdisk_balanced_iops_per_month"),
        (
            "provisionedThroughput",
            HYPERDISK_BALANCED_FREE_THROUGHPUT_MIBPS,
            "throughput (MiB/s)",
            "MiBps-months",
            "hyperdisk_balanced_throughput_per_mibps_month",
        ),
    ):
        provisioned = disk.get(field_name)
        if provisioned is None:
            lines.append(
                _line(
                    name,
                    t,
                    f"hyperdisk-balanced {label}, GCP default",
                    unit,
                    Decimal(0),
                    None,
                    missing_source=f"no provisioned {label}: GCP's default is not priced",
                )
            )
            continue
        extra = max(0, int(provisioned) - free)
        if extra:
            lines.append(
                _line(
                    name,
                    t,
                    f"hyperdisk-balanced {label} above {free:,}",
                    unit,
                    Decimal(extra) * nodes / HOURS_PER_MONTH,
                    price("gcp", key, reg),
                    missing_source=f"no hyperdisk-balanced {label} price for {reg}",
                )
            )
    return lines


def _gcp_template_disks(name: str, t: str, inputs: dict, facts: ClusterFacts, machine, market: str) -> list[CostLine]:
    """Boot disk and local SSD lines; local SSDs that come with the machine type
    (``InstanceFacts.local_ssd.bundled_count``) are in the machine price. Attached local SSDs
    of Spot VMs are priced at the Spot rate (cloud.google.com/compute/disks-image-pricing,
    "Local SSD pricing"); ``market`` is the market being priced (``cost --spot`` on an
    on-demand plan prices them at the Spot rate, as its compute)."""
    lines = []
    reg, nodes = facts.region, Decimal(facts.nodes)
    bundled = machine is not None and machine.local_ssd.bundled_count > 0
    scratch, scratch_gib = 0, Decimal(0)
    for disk in inputs.get("disks") or []:
        if disk.get("type") == "SCRATCH":
            scratch += 1
            scratch_gib = Decimal(str(disk.get("diskSizeGb") or (machine.local_ssd.size_gib if machine else 0)))
            continue
        size = Decimal(str(disk.get("diskSizeGb", 10)))
        dtype = disk.get("diskType", "pd-balanced")
        if dtype == "hyperdisk-balanced":
            lines += _hyperdisk_balanced_lines(name, t, disk, facts)
            continue
        key = GCP_BOOT_DISK_PRICE_KEYS.get(dtype)
        lines.append(
            _line(
                name,
                t,
                f"{dtype} boot disk ({size} GiB x {facts.nodes} nodes)",
                "GB-months",
                size * nodes / HOURS_PER_MONTH,
                price("gcp", key, reg) if key else None,
                missing_source=f"no {dtype} price for {reg}",
            )
        )
    if scratch and not bundled:
        key = "local_ssd_spot_per_gb_month" if market == "spot" else "local_ssd_per_gb_month"
        lines.append(
            _line(
                name,
                t,
                f"Local SSD ({scratch} x {scratch_gib:g} GiB x {facts.nodes} nodes)",
                "GB-months",
                scratch * scratch_gib * nodes / HOURS_PER_MONTH,
                price("gcp", key, reg),
                missing_source=f"no local SSD price for {reg}",
            )
        )
    elif scratch:
        lines.append(
            CostLine(
                name,
                t,
                f"Local SSD ({scratch} x {scratch_gib:g} GiB bundled)",
                "GB-months",
                Decimal(0),
                Decimal(0),
                "bundled with the machine type (in the machine price)",
                "",
                note="included in machine price",
            )
        )
    return lines


def _noncurrent_line(name, t, cloud, reg, usage, key) -> CostLine:
    """A versioned bucket keeps earlier versions of replaced or deleted objects until the
    noncurrent-version expiry: at most once more what the bucket holds (every object replaced once
    inside the expiry window), billed at the same Standard rate (S3 and GCS bill noncurrent
    versions as stored objects: aws.amazon.com/s3/pricing, cloud.google.com/storage/pricing).
    An upper bound; no price for the region leaves it unpriced (counted, never $0)."""
    gb = usage["bucket_storage_gb"]
    return _line(
        name,
        t,
        f"Noncurrent object versions (versioning on; at most {gb} GB)",
        "GB-months",
        gb / HOURS_PER_MONTH,
        price(cloud, key, reg),
        usage_based=True,
        note="upper bound: every object replaced once within the noncurrent-version expiry",
        missing_source=f"no storage price for {reg}",
    )


def _storage_lines(name, t, cloud, reg, usage, hours, key, label) -> list[CostLine]:
    gb = usage["bucket_storage_gb"]
    return [
        _line(
            name,
            t,
            f"{label} ({gb} GB)",
            "GB-months",
            gb / HOURS_PER_MONTH,
            price(cloud, key, reg),
            usage_based=True,
            missing_source=f"no storage price for {reg}",
        ),
        _one_time(
            _line(
                name,
                t,
                "Internet egress",
                "GB",
                usage["internet_egress_gb"] / hours,
                price(cloud, "internet_egress_per_gb", reg),
                usage_based=True,
                note="once per run",
                missing_source=f"no egress price for {reg}",
            )
        ),
    ]


def capacity_block_price(spec) -> Price | None:
    """The upfront fee a stack file records for its Capacity Block (``capacity_block_upfront_usd``
    with its source and date, :class:`gpuinfra.spec.ClusterSpec`), or None (no block, or no fee
    recorded)."""
    if not getattr(spec, "capacity_block", False) or spec.capacity_block_upfront_usd is None:
        return None
    return Price(
        Decimal(spec.capacity_block_upfront_usd), spec.capacity_block_price_source, spec.capacity_block_price_date
    )
