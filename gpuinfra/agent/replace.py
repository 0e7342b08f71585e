"""A preempted GCP VM's replacement (node bundle module, imported by the agent
:mod:`gpuinfra.agent.node` on a preemption; standard library only).

The VMs of a STANDARD / SPOT stack's bulk insert are no members of the stack's managed instance
group, so nothing recreates a preempted one; its agent asks the group for a new VM, which takes
the lost node's rank and checkpoints (:meth:`gpuinfra.health.ranks.DecisionScope.takeover`).
"""

from __future__ import annotations

import logging
import random
import subprocess
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from gpuinfra.agent.constants import REPLACEMENT_MIN_SECONDS_LEFT

if TYPE_CHECKING:
    from gpuinfra.agent.node import GcpMetadata

LOG = logging.getLogger("gpuinfra-agent")
#: Seconds a replacement request may take: GCE hard-stops a preempted VM 30 s after its notice
#: (cloud.google.com/compute/docs/instances/spot#preemption-process).
REPLACEMENT_REQUEST_SECONDS = 25


def request_gcp_replacement(
    metadata: GcpMetadata, expires_at: datetime | None = None, now: datetime | None = None
) -> str:
    """Ask this preempted VM's managed instance group for its replacement, a new VM of the group's
    template named ``<group>-`` + 4 random ``a-z0-9`` like the group's own names, never the
    ``n`` + 3 digits of a bulk VM (``gcloud compute instance-groups managed create-instance``:
    Compute API instanceGroupManagers.createInstances, permission
    ``compute.instanceGroupManagers.update``,
    cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/createInstances).
    Nothing for a VM that is not preempted (``instance/preempted``) or is a group member (the
    group's repair recreates those), nor within :data:`REPLACEMENT_MIN_SECONDS_LEFT` of the TTL
    end ``expires_at`` (``now``: the current time, UTC).

    Returns:
        The replacement's name; "" when none was asked for.

    Raises:
        OSError: the metadata server did not answer; subprocess.CalledProcessError,
            subprocess.TimeoutExpired: ``gcloud`` failed or took over :data:`REPLACEMENT_REQUEST_SECONDS`.
    """
    now = now or datetime.now(timezone.utc)
    if expires_at is not None and (expires_at - now).total_seconds() < REPLACEMENT_MIN_SECONDS_LEFT:
        return ""
    if metadata._get("instance/preempted")[1].strip().upper() != "TRUE" or metadata.mig_member():
        return ""
    name, zone = metadata.instance()
    group, suffix = name.rsplit("-", 1)[0], "n000"
    while suffix[0] == "n" and suffix[1:].isdigit():
        suffix = "".join(random.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=4))
    new = f"{group}-{suffix}"
    LOG.info("preempted: asking managed instance group %s for replacement %s", group, new)
    argv = ["gcloud", "compute", "instance-groups", "managed", "create-instance", group, f"--instance={new}"]
    subprocess.run([*argv, f"--zone={zone}"], check=True, timeout=REPLACEMENT_REQUEST_SECONDS)
    return new
