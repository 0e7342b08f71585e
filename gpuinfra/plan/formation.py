"""How a cluster's nodes come into being at ``up``, and how long ``up`` waits for them.

``up --capacity-timeout SECONDS`` bounds the wait for a whole cluster: within it ``up`` either
reports every node created or reports no capacity (exit 7), with nothing it made left behind.
"""

from __future__ import annotations

#: Default of ``up --capacity-timeout``, in seconds: the wait for every node of the cluster.
#: A product default, equal to the default create timeout of a managed instance group in the
#: provider pulumi-gcp wraps (15 minutes: registry.terraform.io/providers/hashicorp/google/latest/
#: docs/resources/compute_instance_group_manager#timeouts), so ``up`` waits no shorter than before.
DEFAULT_CAPACITY_TIMEOUT_SECONDS = 900
#: Bounds of ``--capacity-timeout`` in seconds: 1 minute to 24 hours.
MIN_CAPACITY_TIMEOUT_SECONDS = 60
MAX_CAPACITY_TIMEOUT_SECONDS = 86_400
