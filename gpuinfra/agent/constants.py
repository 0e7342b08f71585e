"""Node constants that the cluster plan renders into the boot scripts, defined once.

No imports at all, so node-side modules may import it once it is listed in
:data:`gpuinfra.plan.node_bundle.NODE_MODULES` (node-side code imports only the standard
library, :mod:`gpuinfra.errors` and each other). The plan imports these names; nothing here
imports the plan.

Not to be confused with :data:`gpuinfra.health.node.HEALTH_RESULT_WAIT_SECONDS` (2700 s): how long the
boot health gate waits for every peer's *health result*, a different wait from
:data:`PEER_DISCOVERY_WAIT_SECONDS` below.
"""

#: Port of torchrun's c10d rendezvous on the rank-0 node (``MASTER_PORT`` in
#: ``/etc/gpuinfra/cluster.env``; PyTorch's default, pytorch.org/docs/stable/elastic/run.html).
TORCHRUN_PORT = 29500
#: Mount point of the node's scratch filesystem (local NVMe SSDs in RAID0; ``GPUINFRA_SCRATCH``
#: in ``node.env``). The agent's fallback for a ``node.env`` without it is the same path.
SCRATCH_MOUNT = "/scratch"
#: Seconds a booting node waits for every node of the cluster to publish its private IP before
#: it gives up writing ranks to ``/etc/gpuinfra/cluster.env`` (AWS: ``aws-cluster-env.sh.j2``,
#: GCP: the startup script). 15 minutes covers a fleet launched in waves.
PEER_DISCOVERY_WAIT_SECONDS = 900
