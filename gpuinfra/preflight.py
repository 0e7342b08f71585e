"""Quota and availability preflight: before anything is created, ask the cloud whether the cluster
can be launched at all (docs/capacity.md).

``gpuinfra up`` runs it before Pulumi creates the nodes; ``gpuinfra new`` runs it when credentials
are found (and says in one note line that it did not otherwise). A shortfall is refused with one
line per quota naming it, what is needed, what is in use, what is granted and how to ask for more
(:class:`~gpuinfra.errors.QuotaError`, exit 9); a type or accelerator the zone does not offer is
refused as :class:`~gpuinfra.errors.NotOfferedError` (exit 4). A check that cannot run (no
permission, no network, a quota the cloud does not list) is a note line, never a refusal: the
launch itself still fails closed.

AWS (region of the stack):

* ``DescribeInstanceTypeOfferings`` with ``LocationType=availability-zone-id`` and the stack's AZ
  ID (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTypeOfferings.html);
* Service Quotas ``ListServiceQuotas(ServiceCode=ec2)`` (docs.aws.amazon.com/servicequotas/2019-06-24/
  apireference/API_ListServiceQuotas.html): the vCPU quota of the type's family and market, found
  by its name as the API gives it -- ``Running On-Demand <families> instances`` or ``All
  <families> Spot Instance Requests`` (e.g. ``Running On-Demand P instances``, code
  ``L-417A185B``; ``All G and VT Spot Instance Requests``, ``L-3819A6DF``; the EC2 User Guide's
  on-demand and Spot quota pages, using-spot-limits.html, list the names). The most specific family
  wins (``All P5 Spot Instance Requests`` over ``All P Spot Instance Requests`` where both exist).
  The code in the message is the one the API returned;
* usage in flight: the quota's own ``UsageMetric`` (namespace ``AWS/Usage``, metric
  ``ResourceCount``, dimensions such as ``Class=P/OnDemand, Resource=vCPU``; the API's example in
  the AWS CLI reference ``get-aws-default-service-quota``), read with CloudWatch
  ``GetMetricStatistics`` (``Maximum``, as the quota's ``MetricStatisticRecommendation`` says) over
  the last :data:`USAGE_WINDOW_MINUTES` minutes. This is the figure the Service Quotas console
  compares with the quota, so gpuinfra keeps no table of which family counts where. Needed =
  nodes x the type's vCPUs (catalog).

  Not checked: a stack launched into a capacity reservation or Capacity Block (a reservation
  counts towards the On-Demand limits when it is made: errors-overview.html,
  ``InstanceLimitExceeded``, "Capacity Reservations count towards your On-Demand Instance
  limits").

GCP (project of the stack):

* ``acceleratorTypes.get`` for the offer's accelerator type in the zone
  (cloud.google.com/compute/docs/reference/rest/v1/acceleratorTypes/get; 404: not offered);
* ``regions.get`` quotas (cloud.google.com/compute/docs/reference/rest/v1/regions/get,
  ``quotas[].metric / limit / usage``): ``NVIDIA_<GPU>_GPUS``, or ``PREEMPTIBLE_NVIDIA_<GPU>_GPUS``
  for Spot (:data:`GCP_GPU_QUOTA_METRICS`); needed = nodes x GPUs per node;
* ``projects.get`` quotas (cloud.google.com/compute/docs/reference/rest/v1/projects/get):
  ``GPUS_ALL_REGIONS``, the project-wide GPU count.

  Not checked: reservation-bound stacks (a reservation's resources count against quota when it
  is created, cloud.google.com/compute/docs/instances/reservations-overview) and CPU quotas.

Credentials and clients come from :func:`make_aws_clients` / :func:`make_gcp_clients`, which tests
replace; the test suite's conftest swaps :data:`CHECKS` for checks that find nothing, so no test
reaches a cloud by accident.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuinfra.catalog.store import Catalog, load_catalog
from gpuinfra.credentials import check_gcp_credentials_configured, gcp_credentials
from gpuinfra.errors import MissingDependencyError, NotOfferedError, QuotaError
from gpuinfra.spec import ClusterSpec

#: CloudWatch window for the quota's usage metric (AWS/Usage metrics are per minute; the
#: maximum over this window is taken, so a cluster that just ended still counts: fails closed).
USAGE_WINDOW_MINUTES = 15

#: Compute Engine regional GPU quota metric (on-demand; Spot is ``PREEMPTIBLE_`` + it) per
#: accelerator type. Names as ``regions.get`` returns them: those in google-cloud-compute's
#: ``Quota.Metric`` enum (``NVIDIA_T4_GPUS``, ``NVIDIA_V100_GPUS``, ``NVIDIA_P100_GPUS``,
#: ``NVIDIA_P4_GPUS``, ``NVIDIA_A100_GPUS``, ``NVIDIA_A100_80GB_GPUS``, ``NVIDIA_L4_GPUS``,
#: ``PREEMPTIBLE_NVIDIA_H100_GPUS``) and, for types newer than that enum, as projects' ``gcloud
#: compute regions describe`` output shows them (``NVIDIA_H100_GPUS``, ``NVIDIA_H100_MEGA_GPUS``,
#: ``NVIDIA_H200_GPUS``, ``NVIDIA_B200_GPUS``). A metric the region does not list is a note, not
#: a refusal.
GCP_GPU_QUOTA_METRICS: dict[str, str] = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
    "nvidia-b200": "NVIDIA_B200_GPUS",
}
#: The project-wide GPU quota (``projects.get``).
GCP_GLOBAL_GPU_METRIC = "GPUS_ALL_REGIONS"

_ON_DEMAND_NAME = re.compile(r"^Running On-Demand (?P<families>.+) instances$")
_SPOT_NAME = re.compile(r"^All (?P<families>.+) Spot Instance Requests$")


class PreflightUnavailable(Exception):
    """The preflight cannot reach the cloud (no client library, no credentials, tests)."""


@dataclass(frozen=True)
class QuotaCheck:
    """One quota compared with what the cluster needs.

    Attributes:
        name: the quota's name as the cloud gives it; code: its code (AWS ``L-...``; GCP: the
            metric); scope: region or ``global``.
        needed: what the cluster adds (vCPUs on AWS, GPUs on GCP); in_use: usage now;
            granted: the quota's value; unit: ``vCPUs`` | ``GPUs``.
        how_to_ask: the command or page to ask for more.
    """

    name: str
    code: str
    scope: str
    needed: float
    in_use: float
    granted: float
    unit: str
    how_to_ask: str

    @property
    def short(self) -> bool:
        """The quota cannot hold what is in use plus what the cluster needs."""
        return self.in_use + self.needed > self.granted

    def line(self) -> str:
        """One line: name (code), scope, needed, in use, granted, how to ask for more."""
        return (
            f"quota {self.name} ({self.code}) in {self.scope}: the cluster needs {self.needed:g} {self.unit}, "
            f"{self.in_use:g} in use, {self.granted:g} granted; ask for at least {self.in_use + self.needed:g}: "
            f"{self.how_to_ask.format(value=f'{self.in_use + self.needed:g}')}"
        )


def make_aws_clients(region: str) -> tuple[Any, Any, Any]:
    """``(service-quotas, ec2, cloudwatch)`` boto3 clients from the default credential chain, with
    10 s timeouts and 2 attempts.

    Raises:
        PreflightUnavailable: no credentials.
    """
    import boto3
    from botocore.config import Config

    session = boto3.Session()
    if session.get_credentials() is None:
        raise PreflightUnavailable("no AWS credentials found")
    config = Config(connect_timeout=10, read_timeout=10, retries={"max_attempts": 2})
    return tuple(session.client(s, region_name=region, config=config) for s in ("service-quotas", "ec2", "cloudwatch"))  # type: ignore[return-value]


def make_gcp_clients(project: str | None) -> tuple[Any, Any, Any, str]:
    """``(RegionsClient, ProjectsClient, AcceleratorTypesClient, project)`` of google-cloud-compute
    with Application Default Credentials.

    Raises:
        PreflightUnavailable: no client library, no credentials or no project.
    """
    try:  # google-cloud-compute is an optional extra
        from google.cloud import compute_v1
    except ImportError:
        raise PreflightUnavailable(
            "google-cloud-compute is not installed (pip install 'gpuinfra[gcp-monitoring]')"
        ) from None
    try:
        check_gcp_credentials_configured()
        credentials, default_project = gcp_credentials()
    except MissingDependencyError:
        raise PreflightUnavailable("no GCP credentials found") from None
    project = project or default_project
    if not project:
        raise PreflightUnavailable("no GCP project (gcp:project / --gcp-project)")
    kwargs = {"credentials": credentials}
    return (
        compute_v1.RegionsClient(**kwargs),
        compute_v1.ProjectsClient(**kwargs),
        compute_v1.AcceleratorTypesClient(**kwargs),
        project,
    )


def run_preflight(spec: ClusterSpec, catalog: Catalog | None = None) -> list[str]:
    """Check ``spec`` against the cloud's quotas and offerings (module docstring).

    Args:
        spec: the stack's spec.
        catalog: for the type's vCPUs and accelerator type (default: the installed catalog).

    Returns:
        Note lines: what was checked, and each check that could not run.

    Raises:
        QuotaError: a quota is short (exit 9; one line per short quota).
        NotOfferedError: the zone does not offer the type or accelerator (exit 4).
    """
    return CHECKS[spec.cloud](spec, catalog or load_catalog())


def _offer_row(spec: ClusterSpec, catalog: Catalog):
    """The catalog offer of the spec's type (in its zone when there is one)."""
    rows = [o for o in catalog.offers if o.cloud == spec.cloud and o.instance_type == spec.instance_type]
    return next((o for o in rows if o.zone == spec.zone), rows[0] if rows else None)


def _refuse(checks: list[QuotaCheck]) -> list[str]:
    """Raise :class:`QuotaError` for the short ones; else one note per check."""
    short = [c for c in checks if c.short]
    if short:
        raise QuotaError("\n".join(c.line() for c in short))
    return [
        f"quota {c.name} ({c.code}): {c.in_use:g} in use + {c.needed:g} {c.unit} needed <= {c.granted:g} granted"
        for c in checks
    ]


# --- AWS -------------------------------------------------------------------------------------


def quota_families(families: str) -> list[str]:
    """The family prefixes a quota name's family part covers, lower case:
    ``"G and VT"`` -> ``["g", "vt"]``, ``"P4, P3 and P2"`` -> ``["p4", "p3", "p2"]``,
    ``"Standard (A, C, D, H, I, M, R, T, Z)"`` -> ``["a", "c", ...]``."""
    inner = re.search(r"\(([^)]*)\)", families)
    text = inner.group(1) if inner else families
    return [t.strip().lower() for t in re.split(r",| and ", text) if t.strip()]


def _match_length(token: str, family: str) -> int:
    """How specifically ``token`` (``p``, ``p5``, ``vt``) names ``family`` (``p5en``,
    ``p6-b200``): its length, or 0 when it does not (``p5`` names ``p5e`` but not ``p50``)."""
    if not family.startswith(token):
        return 0
    rest = family[len(token) :]
    if token[-1].isdigit() and rest[:1].isdigit():
        return 0
    return len(token)


def pick_ec2_quota(quotas: list[dict], instance_type: str, spot: bool) -> dict | None:
    """The vCPU quota of ``instance_type``'s family and market among ``ListServiceQuotas``'
    ``Quotas`` (``QuotaName``, ``QuotaCode``, ``Value``, ``UsageMetric``), by name, most specific
    family first; None when none names the family."""
    pattern = _SPOT_NAME if spot else _ON_DEMAND_NAME
    family = instance_type.split(".")[0].lower()
    best, best_length = None, 0
    for quota in quotas:
        found = pattern.match(quota.get("QuotaName", ""))
        if not found:
            continue
        length = max((_match_length(t, family) for t in quota_families(found["families"])), default=0)
        if length > best_length:
            best, best_length = quota, length
    return best


def _usage(cloudwatch, quota: dict, now: datetime) -> float:
    """The quota's usage now: the maximum of its ``UsageMetric`` over the last
    :data:`USAGE_WINDOW_MINUTES` minutes (0 without datapoints: nothing ran)."""
    metric = quota.get("UsageMetric") or {}
    if not metric.get("MetricName"):
        raise LookupError(f"quota {quota.get('QuotaCode')} has no usage metric")
    answer = cloudwatch.get_metric_statistics(
        Namespace=metric["MetricNamespace"],
        MetricName=metric["MetricName"],
        Dimensions=[{"Name": k, "Value": v} for k, v in sorted((metric.get("MetricDimensions") or {}).items())],
        StartTime=now - timedelta(minutes=USAGE_WINDOW_MINUTES),
        EndTime=now,
        Period=60,
        Statistics=[metric.get("MetricStatisticRecommendation") or "Maximum"],
    )
    statistic = metric.get("MetricStatisticRecommendation") or "Maximum"
    return max((float(p[statistic]) for p in answer.get("Datapoints", [])), default=0.0)


def check_aws(spec: ClusterSpec, catalog: Catalog, now: datetime | None = None) -> list[str]:
    """The AWS preflight (module docstring); ``now``: the end of the usage window (tests)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        quotas_api, ec2, cloudwatch = make_aws_clients(spec.region)
    except PreflightUnavailable as exc:
        return [f"quota preflight not run: {exc}"]
    notes: list[str] = []
    try:
        offered = ec2.describe_instance_type_offerings(
            LocationType="availability-zone-id",
            Filters=[
                {"Name": "location", "Values": [spec.zone]},
                {"Name": "instance-type", "Values": [spec.instance_type]},
            ],
        ).get("InstanceTypeOfferings", [])
        if not offered:
            raise NotOfferedError(
                f"EC2 does not offer {spec.instance_type} in {spec.zone} ({spec.region}) "
                "(DescribeInstanceTypeOfferings)",
                f"pick another zone: `gpuinfra offers --instance-type {spec.instance_type}`",
            )
        notes.append(f"EC2 offers {spec.instance_type} in {spec.zone}")
    except (BotoCoreError, ClientError) as exc:
        notes.append(f"offering in {spec.zone} not checked: {exc}")
    if spec.capacity_reservation_id:
        return [*notes, f"vCPU quota not checked: the nodes launch into {spec.capacity_reservation_id}"]
    offer = _offer_row(spec, catalog)
    if offer is None:
        return [*notes, f"vCPU quota not checked: the catalog has no vCPU count for {spec.instance_type}"]
    market = "spot" if spec.spot else "on-demand"
    try:
        quotas = [
            q
            for page in quotas_api.get_paginator("list_service_quotas").paginate(ServiceCode="ec2")
            for q in page.get("Quotas", [])
        ]
        quota = pick_ec2_quota(quotas, spec.instance_type, spec.spot)
        if quota is None:
            return [*notes, f"vCPU quota not checked: Service Quotas lists none for {spec.instance_type} {market}"]
        in_use = _usage(cloudwatch, quota, now or datetime.now(UTC))
    except (BotoCoreError, ClientError, LookupError) as exc:
        return [*notes, f"vCPU quota not checked: {exc}"]
    vcpus = int(offer.vcpus)
    code = quota["QuotaCode"]
    check = QuotaCheck(
        name=quota["QuotaName"],
        code=code,
        scope=spec.region,
        needed=spec.nodes * vcpus,
        in_use=in_use,
        granted=float(quota["Value"]),
        unit=f"vCPUs ({spec.nodes} x {spec.instance_type} x {vcpus})",
        how_to_ask=(
            f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
            f"--desired-value {{value}} --region {spec.region}"
        ),
    )
    return notes + _refuse([check])


# --- GCP -------------------------------------------------------------------------------------


def check_gcp(spec: ClusterSpec, catalog: Catalog) -> list[str]:
    """The GCP preflight (module docstring)."""
    from google.api_core import exceptions as google_errors

    try:
        regions, projects, accelerators, project = make_gcp_clients(spec.gcp_project)
    except PreflightUnavailable as exc:
        return [f"quota preflight not run: {exc}"]
    offer = _offer_row(spec, catalog)
    accelerator = (offer.accelerator_type if offer is not None else None) or spec.gpu_facts.gcp_accelerator_type
    if not accelerator:
        return [f"quota preflight not run: no accelerator type known for {spec.instance_type}"]
    notes: list[str] = []
    try:
        accelerators.get(project=project, zone=spec.zone, accelerator_type=accelerator)
        notes.append(f"Compute Engine offers {accelerator} in {spec.zone}")
    except google_errors.NotFound:
        raise NotOfferedError(
            f"Compute Engine does not offer {accelerator} in {spec.zone} (acceleratorTypes.get: 404)",
            f"pick another zone: `gpuinfra offers --instance-type {spec.instance_type}`",
        ) from None
    except Exception as exc:  # noqa: BLE001 - API, transport or auth failure: a note, the launch still fails closed
        notes.append(f"accelerator in {spec.zone} not checked: {exc}")
    if spec.gcp_reservation:
        return [*notes, f"GPU quota not checked: the VMs consume reservation {spec.gcp_reservation}"]
    stem = GCP_GPU_QUOTA_METRICS.get(accelerator)
    if stem is None:
        return [*notes, f"GPU quota not checked: no quota metric known for {accelerator}"]
    # flex-start VMs "consume preemptible quota" (cloud.google.com/blog/products/compute/
    # introducing-flex-start-vms-for-the-compute-engine-instance-api)
    metric = f"PREEMPTIBLE_{stem}" if spec.spot or spec.gcp_flex_start else stem
    needed = spec.nodes * spec.gpu_count
    page = f"https://console.cloud.google.com/iam-admin/quotas?project={project} (metric {{metric}}, ask for {{value}})"
    checks: list[QuotaCheck] = []
    for scope, read, name in (
        (spec.region, lambda: regions.get(project=project, region=spec.region).quotas, metric),
        ("global", lambda: projects.get(project=project).quotas, GCP_GLOBAL_GPU_METRIC),
    ):
        try:
            found = next((q for q in read() if q.metric == name), None)
        except Exception as exc:  # noqa: BLE001 - API, transport or auth failure: a note, the launch still fails closed
            notes.append(f"quota {name} not checked: {exc}")
            continue
        if found is None:
            notes.append(f"quota {name} not checked: {scope} lists no such quota for project {project}")
            continue
        checks.append(
            QuotaCheck(
                name=name,
                code=name,
                scope=scope if scope == "global" else f"region {scope}",
                needed=needed,
                in_use=float(found.usage),
                granted=float(found.limit),
                unit=f"GPUs ({spec.nodes} x {spec.gpu_count} {accelerator})",
                how_to_ask=page.replace("{metric}", name),
            )
        )
    return notes + _refuse(checks)


#: The check of each cloud (the test suite's conftest swaps it).
CHECKS: dict[str, Callable[[ClusterSpec, Catalog], list[str]]] = {"aws": check_aws, "gcp": check_gcp}
