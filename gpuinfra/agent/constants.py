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
#: The checkpoint sync request of ``gpuinfra down`` / ``reap``: before destroying, the operator
#: sets this EC2 instance tag (the node reads it from IMDS ``tags/instance/<key>``, enabled by the
#: launch template's ``instance_metadata_tags``) or this GCE instance metadata attribute (the node
#: reads ``instance/attributes/<key>``) to a request id on every running node; the node syncs
#: its checkpoints and writes the ack object :func:`sync_ack_key`.
SYNC_REQUEST_TAG = "gpuinfra:sync-request"
SYNC_REQUEST_ATTRIBUTE = "gpuinfra-sync-request"
#: A sync request id: lower-case letters, digits and '-', 1 to 64 characters (``down-<unix seconds>``).
SYNC_REQUEST_ID_PATTERN = r"[a-z0-9-]{1,64}"
#: Seconds a node spends on one requested sync before it writes its ack anyway.
SYNC_REQUEST_BOUND_SECONDS = 300
#: Default of ``down`` / ``reap --sync-timeout-seconds``: how long the operator waits for every
#: node's ack before destroying (nodes still uploading then are ended all the same): the node's
#: bound plus a minute for the node to see the request (its poll period) and upload the ack.
SYNC_REQUEST_WAIT_SECONDS = SYNC_REQUEST_BOUND_SECONDS + 60


def sync_ack_key(stack: str, request_id: str, node: str) -> str:
    """Bucket key of a node's ack of sync request ``request_id``: a JSON object with ``request``,
    ``node``, ``uploaded_files``, ``complete`` and ``finished_at``; ``node`` is the instance id
    (AWS) or VM name (GCP)."""
    return f"checkpoints/{stack}/.sync/{request_id}/{node}.json"


#: No replacement of a lost node in the stack's last hour (the AWS replacement function and a
#: preempted GCP bulk VM's request alike): it could not boot, restore and train before the TTL end.
REPLACEMENT_MIN_SECONDS_LEFT = 3600
