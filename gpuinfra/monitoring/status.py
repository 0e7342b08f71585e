"""The figures ``gpuinfra status`` shows, from what the clouds returned (pure: no cloud calls).

* Per GPU: utilization now (its newest 1-minute sample, if it is at most
  :data:`FRESH_SECONDS` old) and the mean of its 1-minute samples over the last hour; memory
  used now (GiB).
* Cluster timeline: per minute, the mean and the maximum over every GPU that reported.
* Cost so far: the catalog's per-node price for the stack's instance type, zone and market
  (:meth:`gpuinfra.catalog.store.Catalog.node_hour_price_usd`, never the price recorded in the stack
  file, which anyone may edit) x every listed node's billed hours: from the
  start of its run (``launched_at``) to now while it runs, to its stop / termination
  (``ended_at``) once it ended; a node still starting has none (billed states below). Projected to
  the TTL: that plus every running or starting node's price x hours left until
  ``spec.expires_at``. No catalog price: both are None (never $0), shown as "incomplete". When money already spent
  cannot be counted -- a run's end time unknown, a node that ran before its latest start, fewer
  nodes listed than the stack has (AWS lists terminated instances for only about an hour, GCP
  none once deleted) -- both totals are None and ``*_at_least_usd`` carry the lower bound, with
  a note saying why: never a lower number presented as the total.
* Idle: the cluster is idle since the first minute from which every GPU stayed under the
  profile's ``idle_gpu_utilization_percent``; the node agent ends it ``idle_timeout_minutes``
  later (docs/lifecycle.md, "How a node ends").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from gpuinfra.catalog.store import Catalog, load_catalog
from gpuinfra.money import usd_json
from gpuinfra.spec import ClusterSpec

#: A sample older than this is not "now" (two agent intervals and CloudWatch's ingestion delay).
FRESH_SECONDS = 180
WINDOW = timedelta(hours=1)
#: States whose instance hours are billed. AWS: ``running``; ``pending`` is not billed,
#: ``stopping`` only when hibernating (gpuinfra never hibernates), ``shutting-down``, ``stopped``
#: and ``terminated`` are not (docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html).
#: GCP: ``RUNNING``, and ``STOPPING`` until it reaches ``TERMINATED`` (counted as billed: a
#: transient state, so at most an over-count of its seconds); ``PROVISIONING`` and ``STAGING`` are
#: not billed (cloud.google.com/compute/docs/instances/instance-life-cycle).
BILLED_STATES = frozenset({"running", "RUNNING", "STOPPING"})
#: A run about to start: no hours billed yet, but it will bill until the TTL.
STARTING_STATES = frozenset({"pending", "PROVISIONING", "STAGING"})
#: The run ended: billed from ``launched_at`` to ``ended_at``.
ENDED_STATES = frozenset(
    {"stopping", "stopped", "shutting-down", "terminated", "TERMINATED", "STOPPED", "SUSPENDING", "SUSPENDED"}
)


@dataclass(frozen=True)
class Node:
    """One VM of the stack: id, cloud state, start of its latest run (UTC), end of that run once
    it stopped or terminated (UTC; None while it runs or when the cloud does not say), and
    ``earlier_runs``: False when the latest run is its only one, True when it ran before
    ``launched_at`` (restarted), None when that cannot be told."""

    node_id: str
    state: str
    launched_at: datetime | None
    ended_at: datetime | None = None
    earlier_runs: bool | None = False

    @property
    def billed(self) -> bool:
        """The state bills instance hours now (:data:`BILLED_STATES`)."""
        return self.state in BILLED_STATES

    @property
    def will_bill(self) -> bool:
        """Running or starting: it bills until it ends (the TTL at the latest)."""
        return self.state in BILLED_STATES or self.state in STARTING_STATES

    def billed_interval(self, now: datetime) -> tuple[datetime, datetime] | None:
        """(start, end) of the billed hours of its latest run, an empty one (start = end) while
        starting; None when they cannot be known (no start, an ended run without its end time,
        an unknown state)."""
        if self.state in STARTING_STATES:
            return (now, now)
        if self.launched_at is None:
            return None
        if self.state in BILLED_STATES:
            return (self.launched_at, max(self.launched_at, now))
        if self.state in ENDED_STATES and self.ended_at is not None:
            return (self.launched_at, max(self.launched_at, self.ended_at))
        return None


@dataclass(frozen=True)
class GpuSeries:
    """1-minute samples of one GPU: ``utilization`` (percent) and ``memory_used_gib`` points,
    each a tuple of (timestamp UTC, value) in time order."""

    node_id: str
    gpu: str
    utilization: tuple[tuple[datetime, float], ...]
    memory_used_gib: tuple[tuple[datetime, float], ...] = ()


@dataclass(frozen=True)
class GpuStatus:
    """The figures of one GPU (percent, GiB; None when no sample)."""

    node_id: str
    gpu: str
    utilization_now: float | None
    utilization_hour_mean: float | None
    memory_used_gib_now: float | None


@dataclass
class ClusterStatus:
    """Everything ``status`` shows for one stack at ``now``."""

    stack: str
    cloud: str
    now: datetime
    nodes: list[Node]
    gpus: list[GpuStatus]
    timeline: list[tuple[datetime, float, float]]  # (minute, mean %, max %)
    price_per_node_hour_usd: Decimal | None
    cost_so_far_usd: Decimal | None
    projected_to_ttl_usd: Decimal | None
    expires_at: datetime
    idle_threshold_percent: int
    idle_since: datetime | None
    idle_ends_at: datetime | None
    monitoring: bool
    notes: list[str] = field(default_factory=list)
    series: list[GpuSeries] = field(default_factory=list)  # the samples (HTML report charts)
    #: Lower bounds when the totals are unknown (money spent that cannot all be counted).
    cost_so_far_at_least_usd: Decimal | None = None
    projected_to_ttl_at_least_usd: Decimal | None = None

    @property
    def cluster_utilization_hour_mean(self) -> float | None:
        """Mean over GPUs of their hour means (None without samples)."""
        means = [g.utilization_hour_mean for g in self.gpus if g.utilization_hour_mean is not None]
        return sum(means) / len(means) if means else None

    def to_dict(self) -> dict:
        """JSON form (``gpuinfra status --json``; USD as decimal strings, times ISO 8601 UTC)."""
        iso = _iso
        return {
            "stack": self.stack,
            "cloud": self.cloud,
            "now": iso(self.now),
            "monitoring": self.monitoring,
            "nodes": [
                {"id": n.node_id, "state": n.state, "launched_at": iso(n.launched_at), "ended_at": iso(n.ended_at)}
                for n in self.nodes
            ],
            "gpus": [
                {
                    "node": g.node_id,
                    "gpu": g.gpu,
                    "utilization_percent_now": _round(g.utilization_now),
                    "utilization_percent_hour_mean": _round(g.utilization_hour_mean),
                    "memory_used_gib_now": _round(g.memory_used_gib_now),
                }
                for g in self.gpus
            ],
            "utilization_percent_hour_mean": _round(self.cluster_utilization_hour_mean),
            "timeline": [
                {"minute": iso(t), "mean_percent": _round(a), "max_percent": _round(b)} for t, a, b in self.timeline
            ],
            # the USD figures below are compute only (the nodes' billed hours x this price)
            "priced": "compute only",
            "price_per_node_hour_usd": usd_json(self.price_per_node_hour_usd),
            "cost_so_far_usd": usd_json(_cents(self.cost_so_far_usd)),
            "projected_to_ttl_usd": usd_json(_cents(self.projected_to_ttl_usd)),
            "cost_so_far_at_least_usd": usd_json(_cents(self.cost_so_far_at_least_usd)),
            "projected_to_ttl_at_least_usd": usd_json(_cents(self.projected_to_ttl_at_least_usd)),
            "expires_at": iso(self.expires_at),
            "idle_threshold_percent": self.idle_threshold_percent,
            "idle_since": iso(self.idle_since),
            "idle_ends_at": iso(self.idle_ends_at),
            "notes": self.notes,
        }


def _iso(when: datetime | None) -> str | None:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z") if when else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _cents(value: Decimal | None) -> Decimal | None:
    return None if value is None else value.quantize(Decimal("0.01"))


def gpu_status(series: GpuSeries, now: datetime) -> GpuStatus:
    """Now / hour-mean figures of one GPU (samples in ``(now - 1 h, now]`` count for the mean:
    60 one-minute samples, not 61)."""

    def latest(points):
        if points and (now - points[-1][0]).total_seconds() <= FRESH_SECONDS:
            return points[-1][1]
        return None

    hour = [v for t, v in series.utilization if now - WINDOW < t <= now]
    return GpuStatus(
        series.node_id,
        series.gpu,
        latest(series.utilization),
        sum(hour) / len(hour) if hour else None,
        latest(series.memory_used_gib),
    )


def timeline(series: list[GpuSeries]) -> list[tuple[datetime, float, float]]:
    """(minute, mean, max) of utilization over every GPU that has a sample in that minute."""
    by_minute: dict[datetime, list[float]] = {}
    for s in series:
        for t, v in s.utilization:
            by_minute.setdefault(t.replace(second=0, microsecond=0), []).append(v)
    return [(t, sum(vs) / len(vs), max(vs)) for t, vs in sorted(by_minute.items())]


def idle_since(points: list[tuple[datetime, float, float]], threshold: float) -> datetime | None:
    """Start of the trailing run of minutes whose busiest GPU is under ``threshold``; None when
    the newest minute is busy or there are no samples."""
    start = None
    for minute, _mean, peak in reversed(points):
        if peak >= threshold:
            break
        start = minute
    return start


@dataclass(frozen=True)
class Costs:
    """USD figures of :func:`costs`: ``rate`` per node-hour; ``so_far`` / ``projected`` the
    totals, None when unknown; ``*_at_least`` their lower bounds when some spending cannot be
    counted; ``notes`` why."""

    rate: Decimal | None
    so_far: Decimal | None
    projected: Decimal | None
    so_far_at_least: Decimal | None = None
    projected_at_least: Decimal | None = None
    notes: tuple[str, ...] = ()


def costs(spec: ClusterSpec, nodes: list[Node], now: datetime, catalog: Catalog | None = None) -> Costs:
    """Cost so far and projected to the TTL from the catalog's per-node price (module
    docstring); every figure None (never 0) when the catalog has no price for the stack.

    Args:
        catalog: the catalog to price from (default: the one in use).
    """
    rate = (catalog or load_catalog()).node_hour_price_usd(spec)
    if rate is None:
        return Costs(None, None, None)
    counted, notes = Decimal(0), []
    for n in nodes:
        interval = n.billed_interval(now)
        if interval is None:
            notes.append(
                f"node {n.node_id} ({n.state}): the start or end of its run is unknown, its hours are not counted"
            )
            continue
        counted += _hours(interval[1] - interval[0])
        if n.earlier_runs is not False:
            notes.append(
                f"node {n.node_id}: "
                + (
                    "it also ran before its latest start"
                    if n.earlier_runs
                    else "runs before its latest start cannot be told"
                )
                + "; only the latest "
                "run is counted"
            )
    if len(nodes) < spec.nodes:
        notes.append(
            f"{len(nodes)} of the stack's {spec.nodes} nodes are listed: nodes terminated over about an hour "
            "ago (AWS) or deleted (GCP) are no longer listed, so their hours are not counted"
        )
    so_far = rate * counted
    projected = so_far + rate * sum(n.will_bill for n in nodes) * _hours(spec.expires_at - now)
    if notes:
        return Costs(rate, None, None, so_far, projected, tuple(notes))
    return Costs(rate, so_far, projected)


def _hours(delta: timedelta) -> Decimal:
    return max(Decimal(0), Decimal(int(delta.total_seconds())) / Decimal(3600))


def build_status(
    spec: ClusterSpec,
    nodes: list[Node],
    series: list[GpuSeries],
    now: datetime,
    monitoring: bool,
    notes: list[str] | None = None,
    catalog: Catalog | None = None,
) -> ClusterStatus:
    """Assemble :class:`ClusterStatus` (see the module docstring for every figure; ``catalog``
    prices the node-hours, default: the one in use)."""
    points = timeline(series)
    threshold = spec.profile.idle_gpu_utilization_percent
    since = idle_since(points, threshold)
    money = costs(spec, nodes, now, catalog)
    gpus = sorted((gpu_status(s, now) for s in series), key=lambda g: (g.node_id, _gpu_key(g.gpu)))
    return ClusterStatus(
        stack=spec.stack,
        cloud=spec.cloud,
        now=now,
        nodes=sorted(nodes, key=lambda n: n.node_id),
        gpus=gpus,
        timeline=points,
        price_per_node_hour_usd=money.rate,
        cost_so_far_usd=money.so_far,
        projected_to_ttl_usd=money.projected,
        cost_so_far_at_least_usd=money.so_far_at_least,
        projected_to_ttl_at_least_usd=money.projected_at_least,
        expires_at=spec.expires_at,
        idle_threshold_percent=threshold,
        idle_since=since,
        idle_ends_at=since + timedelta(minutes=spec.profile.idle_timeout_minutes) if since else None,
        monitoring=monitoring,
        notes=list(notes or []) + list(money.notes),
        series=list(series),
    )


def _gpu_key(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
