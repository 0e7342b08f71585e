"""When the cloud-side backstops end a node that its own agent did not end.

Two things end a node at its TTL (``spec.expires_at``):

1. the node agent (:mod:`gpuinfra.agent.node`), polling every 5 s: at the TTL it syncs the
   checkpoint folder for at most :data:`~gpuinfra.agent.node.END_SYNC_BOUND_SECONDS` and then
   ends the node (AWS instance-initiated shutdown = terminate; GCP deletes its VM from the MIG);
2. a backstop that does not depend on the node's software -- AWS: an EventBridge Scheduler
   one-time schedule calling ``ec2:TerminateInstances`` on the fleet's instances; GCP: the
   instance template's ``max_run_duration`` (Compute Engine deletes the VM).

The backstops fire :data:`BACKSTOP_DELAY_SECONDS` after the TTL: the agent's sync bound plus a
margin, so on a healthy node the agent ends it first with its checkpoints saved, and the backstop
ends it only when the agent could not (crashed, node hung, software removed).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpuinfra.agent.node import END_SYNC_BOUND_SECONDS
from gpuinfra.spec import ClusterSpec

#: Slack after the agent's bounded sync (its 5 s poll, a slow shutdown).
BACKSTOP_MARGIN_SECONDS = 300
#: Seconds after the TTL at which the cloud-side backstop ends a node.
BACKSTOP_DELAY_SECONDS = END_SYNC_BOUND_SECONDS + BACKSTOP_MARGIN_SECONDS


def backstop_at(spec: ClusterSpec) -> datetime:
    """UTC time at which the AWS backstop schedule terminates the nodes (TTL + delay)."""
    return spec.expires_at + timedelta(seconds=BACKSTOP_DELAY_SECONDS)


def max_run_duration_seconds(spec: ClusterSpec) -> int:
    """GCP ``scheduling.maxRunDuration`` of each VM: the profile's TTL plus the backstop delay.

    It counts from the VM's start (cloud.google.com/compute/docs/instances/limit-vm-runtime), which
    is after the stack's creation, so it never fires before the agent's TTL end either.
    """
    return spec.profile.ttl_hours * 3600 + BACKSTOP_DELAY_SECONDS
