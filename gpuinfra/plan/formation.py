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

#: ``GcpClusterPlan.formation``: STANDARD and SPOT VMs come from one ``instances.bulkInsert``
#: with ``minCount`` = ``count`` = the nodes (all or nothing; blueprints/gcp/bulk_insert.py), the
#: group's MIG starting at size 0 (it only ever holds the replacements the nodes ask it for).
BULK_INSERT = "bulk_insert"
#: ``GcpClusterPlan.formation``: reservation-bound VMs come from the MIG itself in
#: bulk mode (``targetSizePolicy.mode = BULK``: "the MIG creates all VMs at once or none",
#: cloud.google.com/compute/docs/instance-groups/about-bulk-mode; flex-start, the other model bulk
#: mode takes, forms through a resize request instead: :data:`gpuinfra.plan.flex_start.RESIZE_REQUEST`).
BULK_MODE = "bulk_mode"
#: Stack config key (namespace ``gpuinfra``) through which ``up`` passes ``--capacity-timeout`` to
#: the Pulumi program (written into the stack file before each ``up``; absent: the default).
CAPACITY_TIMEOUT_CONFIG_KEY = "capacity_timeout_seconds"
