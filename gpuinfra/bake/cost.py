"""What a bake costs: build instance hours once, image and registry storage per month.

Three kinds of line (``when``): ``once`` per bake, ``monthly`` while the image and the
container are kept (after ``down`` too), ``stack`` per month while the bake stack exists
after its build (until ``gpuinfra down``); each kind has its own total.

Unit prices come from ``gpuinfra/catalog/data/prices.yaml`` (each with its source and date);
quantities are estimates stated here, since no cloud is reachable to measure a bake. Money fails
closed: a line whose price the table lacks keeps ``unit_price_usd = None``, is listed in
``price_not_found``, and no total is given (:class:`gpuinfra.errors.PriceMissingError` when a
total is demanded).

Quantity estimates (per bake; measure your own with the commands named):

* AWS build instance hours :data:`AWS_BUILD_INSTANCE_HOURS` = 2.5: the build instance builds
  the container (NGC base pull ~20 GB, EFA installer and aws-ofi-nccl compile on 2 vCPUs, push)
  and the AMI (manifest, checks, snapshot), about 2 h; a second instance tests it
  (``image_tests_enabled``), about 0.5 h. ``aws imagebuilder get-image`` shows the real times.
* AWS NAT gateway: the build instance has no public IPv4 and reaches Systems Manager, ECR,
  nvcr.io and the package mirrors through the bake stack's NAT gateway (blueprints/aws/bake.py
  ``build_network``). **Lifetime:** the gateway and its Elastic IP are created at the start of
  ``gpuinfra up`` and exist until ``gpuinfra down`` of the bake; ``up`` does not remove them
  after the build (the bake stack stays, like a cluster stack). So:

  - ``once`` (the build): :data:`AWS_BUILD_INSTANCE_HOURS` gateway-hours and as many
    public-IPv4 address-hours (the Elastic IP bills like any public IPv4 address, in use or
    idle: aws.amazon.com/vpc/pricing), and :data:`AWS_NAT_DATA_GB` = 30 GB processed: the
    container base pulled from nvcr.io and the container pushed to ECR, each
    :data:`CONTAINER_STORED_GB` (NAT gateways bill each GB in either direction; S3 goes over
    the free gateway endpoint; the host-stack downloads are small). This is the cost of a
    bake whose stack is destroyed (``gpuinfra down``) right after ``up``.
  - ``stack`` (each month the bake stack stays up after the build): :data:`HOURS_PER_MONTH`
    gateway-hours and as many address-hours. Nothing else of the stack bills by the hour.

  Creating the gateway only for the build (a second update that removes it once the image
  exists) would cut the ``stack`` lines to nothing, at the price of a second ``pulumi up`` per
  bake and a stack that differs from its program between bakes; it is not done: ``down`` after
  the bake is the documented way to stop the charge.
* GCP bake stack: no ``stack`` line. Cloud NAT bills per VM that uses it and per GB
  (cloud.google.com/nat/pricing), and its automatically allocated addresses are released
  when no VM needs a port on them (cloud.google.com/nat/docs/ports-and-addresses); between
  builds the stack holds the Packer template (bytes in a bucket), a trigger and a topic.
* AWS AMI snapshot :data:`IMAGE_STORED_GB` = 100: EBS snapshots bill the blocks written, not the
  200 GiB volume (repost.aws/knowledge-center/ebs-snapshot-billing); the DLAMI's own data plus
  the unpacked container. ``aws ebs list-snapshot-blocks`` counts them.
* Registry :data:`CONTAINER_STORED_GB` = 15: the compressed NGC PyTorch layers plus the EFA
  layers (ECR bills compressed layer storage); ``aws ecr describe-images`` shows
  ``imageSizeInBytes``.
* GCP Packer VM hours :data:`GCP_BUILD_VM_HOURS` = 1.0 and Cloud Build minutes
  :data:`GCP_BUILD_MINUTES` = 75 (the build waits for Packer; the container mirror is a pull and
  a push). The 2,500 free build-minutes a month are not deducted (worst case).
* GCP Cloud NAT: the Packer VM has no external IP and reaches the internet through the bake's
  Cloud NAT (blueprints/gcp/bake.py): :data:`GCP_BUILD_VM_HOURS` VM-hours of the gateway, and
  :data:`GCP_NAT_DATA_GIB` = 15 GiB processed, the container base's compressed layers the VM
  pulls from nvcr.io (as :data:`CONTAINER_STORED_GB`; the host-stack downloads are small;
  Artifact Registry and other Google APIs go over Private Google Access, not NAT), and one
  external address for the same hours: with automatic allocation Cloud NAT adds an address
  while the VM needs source ports and removes it afterwards
  (cloud.google.com/nat/docs/ports-and-addresses), billed as an in-use external IP
  (``external_ip_per_hour``). The gateway bills only VMs that use it
  (cloud.google.com/nat/pricing), so it costs nothing between bakes.
* GCP custom image :data:`GCP_IMAGE_STORED_GIB` = 100, in GiB because Compute Engine counts
  storage in JEDEC GB = GiB (cloud.google.com/compute/disks-image-pricing). It is the same rough
  estimate as the AMI's (DLVM base plus the unpacked container), stated in GiB rather than
  converted from the AWS GB figure: the ~7 % between the two units is below its precision. A
  custom image is stored as a tar.gz archive; ``gcloud compute images describe IMAGE
  --format="value(archiveSizeBytes,diskSizeGb)"`` shows the archive and disk sizes. Priced with
  ``gce_custom_image_storage_per_gib_month``, which has a value for us-central1 only, looked up
  by the bake's region: a bake in another region has no monthly total (exit 4). The Packer
  template sets ``image_storage_locations`` to the bake's region, so the image is stored where it
  is priced (Packer's default would be the nearest multi-region, "us" for us-* regions:
  github.com/hashicorp/packer/issues/8109, github.com/hashicorp/packer-plugin-googlecompute/issues/184).
* GCP Artifact Registry :data:`CONTAINER_STORED_GB` = 15, the mirrored NGC base (compressed
  layers, as ECR). Priced with ``artifact_registry_storage_per_gb_month`` ($ per GB-month, the
  same for every regional and multi-regional repository). The first 0.5 GB a month per billing
  account are free; like Cloud Build's free minutes they are not deducted (worst case: other
  repositories of the billing account may use them). ``gcloud artifacts repositories describe
  REPO --location=REGION`` shows the repository size.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from gpuinfra.bake.model import BakeSpec
from gpuinfra.catalog.prices import CONTAINER_PULL_GB, HOURS_PER_MONTH, price

AWS_BUILD_INSTANCE_HOURS = Decimal("2.5")
IMAGE_STORED_GB = Decimal(100)
CONTAINER_STORED_GB = CONTAINER_PULL_GB
GCP_BUILD_VM_HOURS = Decimal("1.0")
GCP_BUILD_MINUTES = Decimal(75)
GCP_IMAGE_STORED_GIB = Decimal(100)
GCP_NAT_DATA_GIB = Decimal(15)
AWS_NAT_DATA_GB = 2 * CONTAINER_STORED_GB
#: NAT gateway-hours a build is billed: "each partial NAT Gateway-hour consumed is billed as a
#: full hour" (aws.amazon.com/vpc/pricing/, NAT Gateway pricing), so the 2.5 h build bills 3.
AWS_BUILD_NAT_GATEWAY_HOURS = AWS_BUILD_INSTANCE_HOURS.to_integral_value(rounding=ROUND_CEILING)
#: Kinds of cost line and the cost document's total of each (module docstring).
WHEN_TOTALS = {"once": "once_usd", "monthly": "monthly_usd", "stack": "stack_monthly_usd"}

#: Price-table key of each build instance / machine type (prices.yaml).
BUILD_PRICE_KEYS = {
    "m7i.large": "ec2_m7i_large_per_hour",
    "m7g.large": "ec2_m7g_large_per_hour",
    "n1-standard-8": "gce_n1_standard_8_per_hour",
}


@dataclass(frozen=True)
class BakeCostLine:
    """One priced component: ``quantity`` of ``unit`` at ``unit_price_usd`` (None = not found).

    Attributes:
        when: ``once`` (per bake), ``monthly`` (while the image is kept) or ``stack`` (per
            month while the bake stack exists after its build).
    """

    component: str
    when: str
    unit: str
    quantity: Decimal
    unit_price_usd: Decimal | None
    source: str
    date: str

    @property
    def usd(self) -> Decimal | None:
        """quantity x unit price, or None when unpriced."""
        return None if self.unit_price_usd is None else self.quantity * self.unit_price_usd


def _line(cloud: str, key: str | None, region: str, component: str, when: str, unit: str, qty: Decimal) -> BakeCostLine:
    found = price(cloud, key, region) if key else None
    if found is None:
        return BakeCostLine(
            component, when, unit, qty, None, f"no {cloud} price for {key or component} in {region}", ""
        )
    return BakeCostLine(component, when, unit, qty, found.usd, found.source, found.date)


def bake_cost_lines(spec: BakeSpec) -> list[BakeCostLine]:
    """The cost lines of ``spec`` (module docstring gives the quantities)."""
    region, build = spec.region, spec.build_instance_type
    if spec.cloud == "aws":
        return [
            _line(
                "aws",
                BUILD_PRICE_KEYS.get(build),
                region,
                f"build instances ({build})",
                "once",
                "instance-hours",
                AWS_BUILD_INSTANCE_HOURS,
            ),
            _line(
                "aws",
                "nat_gateway_per_hour",
                region,
                "NAT gateway (during the build)",
                "once",
                "gateway-hours",
                AWS_BUILD_NAT_GATEWAY_HOURS,
            ),
            _line(
                "aws",
                "public_ipv4_per_hour",
                region,
                "NAT gateway Elastic IP (during the build)",
                "once",
                "address-hours",
                AWS_BUILD_INSTANCE_HOURS,
            ),
            _line("aws", "nat_gateway_per_gb", region, "NAT gateway data processed", "once", "GB", AWS_NAT_DATA_GB),
            _line(
                "aws",
                "nat_gateway_per_hour",
                region,
                "NAT gateway while the bake stack exists",
                "stack",
                "gateway-hours",
                HOURS_PER_MONTH,
            ),
            _line(
                "aws",
                "public_ipv4_per_hour",
                region,
                "NAT gateway Elastic IP while the bake stack exists",
                "stack",
                "address-hours",
                HOURS_PER_MONTH,
            ),
            _line(
                "aws",
                "ebs_snapshot_standard_per_gb_month",
                region,
                "AMI snapshot",
                "monthly",
                "GB-months",
                IMAGE_STORED_GB,
            ),
            _line(
                "aws", "ecr_storage_per_gb_month", region, "ECR container", "monthly", "GB-months", CONTAINER_STORED_GB
            ),
        ]
    return [
        _line(
            "gcp",
            BUILD_PRICE_KEYS.get(build),
            region,
            f"Packer build VM ({build})",
            "once",
            "instance-hours",
            GCP_BUILD_VM_HOURS,
        ),
        _line(
            "gcp",
            "cloud_build_e2_standard_2_per_minute",
            region,
            "Cloud Build",
            "once",
            "build-minutes",
            GCP_BUILD_MINUTES,
        ),
        _line("gcp", "cloud_nat_per_vm_hour", region, "Cloud NAT (Packer VM)", "once", "VM-hours", GCP_BUILD_VM_HOURS),
        _line("gcp", "cloud_nat_per_gb", region, "Cloud NAT data", "once", "GiB", GCP_NAT_DATA_GIB),
        _line(
            "gcp",
            "external_ip_per_hour",
            region,
            "Cloud NAT address (Packer VM)",
            "once",
            "address-hours",
            GCP_BUILD_VM_HOURS,
        ),
        _line(
            "gcp",
            "gce_custom_image_storage_per_gib_month",
            region,
            "custom image storage",
            "monthly",
            "GiB-months",
            GCP_IMAGE_STORED_GIB,
        ),
        _line(
            "gcp",
            "artifact_registry_storage_per_gb_month",
            region,
            "Artifact Registry container",
            "monthly",
            "GB-months",
            CONTAINER_STORED_GB,
        ),
    ]


def bake_cost(spec: BakeSpec) -> dict:
    """The cost document of a bake: ``lines`` (component, when, quantity, unit, unit price,
    USD, source, date; prices as strings), the totals ``once_usd``, ``monthly_usd`` and
    ``stack_monthly_usd`` (:data:`WHEN_TOTALS`; strings, None when a line of that kind is
    unpriced, "0.00" when there is none) and ``price_not_found`` (one description per unpriced
    line).
    """
    lines = bake_cost_lines(spec)
    doc_lines, missing = [], []
    for ln in lines:
        doc_lines.append(
            {
                "component": ln.component,
                "when": ln.when,
                "quantity": str(ln.quantity),
                "unit": ln.unit,
                "unit_price_usd": None if ln.unit_price_usd is None else str(ln.unit_price_usd),
                "usd": None if ln.usd is None else f"{ln.usd:.2f}",
                "source": ln.source,
                "date": ln.date,
            }
        )
        if ln.usd is None:
            missing.append(f"{ln.component}: {ln.source}")

    def total(when: str) -> str | None:
        values = [ln.usd for ln in lines if ln.when == when]
        known = [v for v in values if v is not None]
        return None if len(known) < len(values) else f"{sum(known, Decimal(0)):.2f}"

    totals = {key: total(when) for when, key in WHEN_TOTALS.items()}
    return {"lines": doc_lines, **totals, "price_not_found": missing}
