"""Spot checkpoint plan: how big a checkpoint is, how long it takes to upload, whether that fits
the interruption notice, and how often to checkpoint.

* Size: what a resumable training checkpoint holds: 16-bit weights (2 B), fp32 master weights
  (4 B) and Adam moments (8 B) per trained parameter (ZeRO paper arXiv:1910.02054 section 3;
  DeepSpeed and FSDP save these states), divided over the nodes (each node writes its shard).
  LoRA/QLoRA save the adapters with their optimizer state (the frozen base is not saved).
* Upload: at the bandwidth of the node's host NIC(s) (catalog facts ``host_nic_bandwidth_gbps``;
  object-storage traffic does not use the EFA / GPU NICs). AWS: the primary network card,
  total bandwidth / network cards; "each connection to Amazon S3 has a maximum transfer rate
  of 5Gbps", parallel connections reach the instance's network bandwidth
  (repost.aws/articles/AR1Jqz-WmjRzCgVGa-uVSdLQ "Maximizing Amazon S3 transfer throughput to
  Amazon EC2 instances"). GCP: the host gVNIC(s) of ``gcp_machine_facts.json`` (A3 Mega / High
  "up to 200 Gbps bandwidth on the primary NIC"; A3 Ultra / A4 "2 host NICs providing a
  bandwidth of 400 Gbps", both gVNICs together; single-NIC types their VM maximum egress);
  unknown (N1) leaves the upload time unknown.
* Notice: AWS gives a two-minute (120 s) Spot interruption notice
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html); GCP
  Spot VMs get 30 s between ACPI G2 Soft Off and G3 Mechanical Off (Compute Engine API
  ``Scheduling.skipGuestOsShutdown``: "120 seconds ... for Standard VMs and 30 seconds for
  Spot VMs").
* Interval: Young (1974) ``sqrt(2 * C * M)``, Daly (2006, FGCS 22(3)) first order
  ``sqrt(2 * C * M) - C`` for C < M / 2, with C the checkpoint write time and M the mean time
  between interruptions of the job = 1 / (rate per node-hour x nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuinfra.errors import SizingError

NOTICE_SECONDS = {"aws": 120, "gcp": 30}
#: Interruptions per node per hour assumed when the user gives none (an input, not a fact:
#: AWS Spot Instance Advisor publishes monthly frequency buckets per type and region).
DEFAULT_INTERRUPTIONS_PER_NODE_HOUR = 0.05
#: Most interruptions per node-hour a plan takes: one an hour per node is already far beyond
#: the highest band of the AWS Spot Instance Advisor (">20%" of instances interrupted per month,
#: aws.amazon.com/ec2/spot/instance-advisor/), so a larger rate is a typo, not a forecast.
MAX_INTERRUPTIONS_PER_NODE_HOUR = 1.0


def check_interruption_rate(rate: float) -> float:
    """Return ``rate`` (interruptions per node-hour) if it is a finite number in
    (0, :data:`MAX_INTERRUPTIONS_PER_NODE_HOUR`].

    Raises:
        SizingError: NaN, infinite, zero, negative or over the bound (one line, exit 2).
    """
    if not math.isfinite(rate) or not 0 < rate <= MAX_INTERRUPTIONS_PER_NODE_HOUR:
        raise SizingError(
            f"--interruption-rate must be a number above 0 and at most {MAX_INTERRUPTIONS_PER_NODE_HOUR:g} "
            f"interruptions per node-hour, got {rate}"
        )
    return rate


@dataclass(frozen=True)
class CheckpointPlan:
    """A spot checkpoint plan (module docstring)."""

    checkpoint_gib_per_node: float
    upload_seconds: float | None
    notice_seconds: int
    fits_notice: bool | None
    interruptions_per_node_hour: float
    interval_minutes: float | None

    def to_json(self) -> dict:
        """JSON view (``size --json`` ``checkpoint_plan``, rounded)."""
        return {
            "checkpoint_gib_per_node": round(self.checkpoint_gib_per_node, 2),
            "upload_seconds": None if self.upload_seconds is None else round(self.upload_seconds, 1),
            "notice_seconds": self.notice_seconds,
            "fits_notice": self.fits_notice,
            "interruptions_per_node_hour": self.interruptions_per_node_hour,
            "interval_minutes": None if self.interval_minutes is None else round(self.interval_minutes, 1),
        }


def checkpoint_bytes(trained_params: float) -> float:
    """Bytes of a resumable checkpoint of ``trained_params`` parameters (14 B each)."""
    return 14 * trained_params


def young_daly_interval_seconds(write_seconds: float, mtbi_seconds: float) -> float:
    """Daly's first-order optimum ``sqrt(2CM) - C`` (Young's ``sqrt(2CM)`` minus the write
    time); the mean time between interruptions when the write is longer than half of it."""
    if write_seconds >= mtbi_seconds / 2:
        return mtbi_seconds
    return math.sqrt(2 * write_seconds * mtbi_seconds) - write_seconds


def checkpoint_plan(
    trained_params: float,
    nodes: int,
    cloud: str,
    host_nic_bandwidth_gbps: float | None,
    interruptions_per_node_hour: float = DEFAULT_INTERRUPTIONS_PER_NODE_HOUR,
) -> CheckpointPlan:
    """The plan for ``nodes`` spot nodes of one instance type on ``cloud``.

    Args:
        trained_params: parameters whose optimizer state is saved (all for full training,
            the adapters for LoRA/QLoRA).
        host_nic_bandwidth_gbps: the bandwidth of the node's host NIC(s), the object-storage
            path, Gbit/s (catalog facts ``host_nic_bandwidth_gbps``; None: unknown).
        interruptions_per_node_hour: expected interruptions per node and hour (> 0).
    """
    per_node = checkpoint_bytes(trained_params) / max(1, nodes)
    upload = None if not host_nic_bandwidth_gbps else per_node / (host_nic_bandwidth_gbps * 1e9 / 8)
    notice = NOTICE_SECONDS[cloud]
    mtbi = 3600 / (interruptions_per_node_hour * max(1, nodes))
    interval = None if upload is None else young_daly_interval_seconds(upload, mtbi) / 60
    return CheckpointPlan(
        per_node / 2**30,
        upload,
        notice,
        None if upload is None else upload <= notice,
        interruptions_per_node_hour,
        interval,
    )
