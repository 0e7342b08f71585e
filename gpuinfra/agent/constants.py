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

# ---------------------------------------------------------------- checkpoints (gpuinfra.agent.checkpoints)
#: File a job writes *last* into a checkpoint folder to say "this checkpoint is complete"; the
#: node syncs a folder only once it is complete (README "Checkpoints").
CHECKPOINT_COMPLETE_MARKER = ".gpuinfra-complete"
#: Variable in the job's environment (``gpuinfra-run``): the checkpoint folder restored at boot,
#: empty when there is nothing to resume from.
RESUME_ENV = "GPUINFRA_RESUME_FROM"
#: ``<RESUME_ENV>=<path>`` line written by the restore at boot (``gpuinfra-restore.service``)
#: whatever it found; ``gpuinfra-run`` waits for it and passes the line to the job.
RESUME_FILE_PATH = "/run/gpuinfra/resume.env"
#: The operator's sync request (``down`` / ``reap`` ask, the node agent answers). AWS: this
#: instance tag, read through IMDS ``tags/instance/<tag>`` (instance metadata tags on).
SYNC_REQUEST_TAG = "gpuinfra:sync-request"
#: GCP: this instance metadata attribute (``instance/attributes/<attribute>``).
SYNC_REQUEST_ATTRIBUTE = "gpuinfra-sync-request"
#: A request id: the tag's / attribute's value (a new id is a new request).
SYNC_REQUEST_ID_PATTERN = r"[a-z0-9-]{1,64}"
#: Seconds the node spends on one requested sync before it writes its ack anyway; the operator
#: waits this long plus its own margin for every node's ack.
SYNC_REQUEST_BOUND_SECONDS = 300


def sync_ack_key(stack: str, request: str, node: str) -> str:
    """The object a node writes once it has answered sync request ``request``:
    ``checkpoints/<stack>/.sync/<request>/<node>.json`` holding ``{"request", "node",
    "uploaded_files", "complete", "finished_at"}`` (``complete``: every complete checkpoint
    folder on the node is in the bucket; ``finished_at``: ISO 8601 UTC)."""
    return f"checkpoints/{stack}/.sync/{request}/{node}.json"
