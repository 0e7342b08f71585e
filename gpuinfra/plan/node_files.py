"""System configuration files every GPU node gets, on both clouds: one copy of each setting,
rendered into the AWS cloud-config (``write_files``) and the GCP startup script.

* ``limits.d`` and the systemd ``Default*`` limits: memlock unlimited and 1M open files for
  every session and service (EFA/RDMA and NCCL pin memory; docs/sources/cluster-facts.md section 2.6,
  cluster-toolkit a3high blueprint L321-329 ``99-unlimited.conf``). systemd reads ``Default*``
  limits only when it re-executes (systemd-system.conf(5)): the nodes run ``daemon-reexec``.
* The Docker drop-in: dockerd may already run with the old limits on the first boot, so it gets
  ``LimitMEMLOCK=infinity`` itself and is restarted once.
* No unattended upgrades on training nodes: a driver or kernel update in the middle of a run
  breaks the GPU stack (docs/sources/cluster-facts.md section 6 rule 12); periodic apt off, as
  aws-parallelcluster ``imagebuilder/parallelcluster.yaml`` InstallPrerequisite does it (the
  apt-daily timers are disabled by the boot scripts).
"""

from __future__ import annotations

from gpuinfra.agent.node import format_node_env
from gpuinfra.errors import UnitValueError
from gpuinfra.health.node import ALLREDUCE_TIMEOUT_SECONDS, HEALTH_RESULT_WAIT_SECONDS
from gpuinfra.plan.naming import stack_id
from gpuinfra.plan.tags import expires_at_text
from gpuinfra.plan.units import SCRATCH_FAILED_PATH
from gpuinfra.spec import ClusterSpec
from gpuinfra.templating import PLAIN_WORD_RE, render

#: Seconds the scratch unit waits at boot for udev to link every local NVMe disk.
SCRATCH_DEVICE_WAIT_SECONDS = 120

#: Seconds from the node agent's first start until a node without a health verdict counts as
#: failed (``GPUINFRA_HEALTH_WAIT_SECONDS``): the gate's own bounds (the peers' results
#: :data:`~gpuinfra.health.node.HEALTH_RESULT_WAIT_SECONDS` + 600 s until cluster.env, the
#: all-reduce :data:`~gpuinfra.health.node.ALLREDUCE_TIMEOUT_SECONDS`, the peers' cluster results
#: 900 s: ``HealthNode.await_peers``) plus 600 s for the bundle fetch before the gate starts.
HEALTH_VERDICT_WAIT_SECONDS = HEALTH_RESULT_WAIT_SECONDS + 600 + ALLREDUCE_TIMEOUT_SECONDS + 900 + 600
#: The file the job touches as it progresses (``GPUINFRA_PROGRESS_FILE``, given to the job by
#: ``gpuinfra-run``), on scratch: the container sees it at the same path.
PROGRESS_FILE_NAME = "gpuinfra-progress"

DOCKER_MEMLOCK_DROPIN = "/etc/systemd/system/docker.service.d/99-gpuinfra-memlock.conf"

#: path -> content (ends with a newline).
NODE_FILES: dict[str, str] = {
    "/etc/security/limits.d/99-gpuinfra.conf": (
        "* soft memlock unlimited\n* hard memlock unlimited\n* soft nofile 1048576\n* hard nofile 1048576\n"
    ),
    "/etc/systemd/system.conf.d/99-gpuinfra.conf": (
        "[Manager]\nDefaultLimitMEMLOCK=infinity\nDefaultLimitNOFILE=1048576\n"
    ),
    DOCKER_MEMLOCK_DROPIN: "[Service]\nLimitMEMLOCK=infinity\n",
    "/etc/apt/apt.conf.d/99-gpuinfra-no-unattended-upgrades": (
        'APT::Periodic::Update-Package-Lists "0";\nAPT::Periodic::Unattended-Upgrade "0";\n'
    ),
}


def node_env(spec: ClusterSpec, cloud: str, bucket: str, scratch_mount: str) -> str:
    """``/etc/gpuinfra/node.env`` of the nodes of ``spec`` (the node agent's settings), with the
    keys the agent defines (:data:`gpuinfra.agent.node.NODE_ENV_KEYS`).

    Every value is one plain word (:data:`gpuinfra.templating.PLAIN_WORD_RE`): the file is read
    as data (``parse_node_env``, ``gpuinfra-run``'s ``value``), and a value a shell would expand
    or split is refused here too, whatever reads it later.

    Raises:
        UnitValueError: a value that is not one plain word -- the spec's grammars refuse those
            before (gpuinfra/spec.py, gpuinfra/profiles).
    """
    text = format_node_env(
        {
            "GPUINFRA_CLOUD": cloud,
            "GPUINFRA_STACK": spec.stack,
            "GPUINFRA_PROFILE": spec.profile.name,
            "GPUINFRA_BUCKET": bucket,
            "GPUINFRA_EXPIRES_AT": expires_at_text(spec),
            "GPUINFRA_IDLE_TIMEOUT_MINUTES": spec.profile.idle_timeout_minutes,
            "GPUINFRA_IDLE_GPU_UTILIZATION_PERCENT": spec.profile.idle_gpu_utilization_percent,
            "GPUINFRA_SCRATCH": scratch_mount,
            "GPUINFRA_HEALTH_GATE": spec.profile.health_gate,
            "GPUINFRA_CHECKPOINT_INTERVAL_MINUTES": spec.profile.spot.checkpoint_interval_minutes,
            "GPUINFRA_HEALTH_WAIT_SECONDS": HEALTH_VERDICT_WAIT_SECONDS,
            "GPUINFRA_GPU_COUNT": spec.gpu_count,
            "GPUINFRA_HANG_ACTION": spec.profile.hang.action,
            "GPUINFRA_HANG_MINUTES": spec.profile.hang.minutes,
            "GPUINFRA_HANG_POWER_PERCENT": spec.profile.hang.power_percent,
            "GPUINFRA_PROGRESS_FILE": f"{scratch_mount}/{PROGRESS_FILE_NAME}",
            "GPUINFRA_DEPLOYMENT": spec.deployment_id,
            "GPUINFRA_STACK_ID": stack_id(spec),
        }
    )
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if value and not PLAIN_WORD_RE.fullmatch(value):
            raise UnitValueError(f"node.env {key} {value[:80]!r} is not a plain word (letters, digits, _@%+=:,./-)")
    return text


def scratch_script(
    mount_point: str, device_glob: str, expected_disks: int, existing_mount: str = "", docker_on_scratch: bool = True
) -> str:
    """The scratch unit's script (``templates/scratch-raid0.sh.j2``) for a machine with
    ``expected_disks`` local NVMe disks named ``/dev/disk/by-id/<device_glob>``; ``existing_mount``
    is where the image mounts them itself (the DLAMI's ``/opt/dlami/nvme``), or empty.

    ``docker_on_scratch`` (:func:`docker_on_scratch`): the script points Docker's ``data-root``
    at ``<mount_point>/docker`` and restarts Docker; False leaves Docker's data-root alone.
    """
    return render(
        "scratch-raid0.sh.j2",
        mount_point=mount_point,
        device_glob=device_glob,
        existing_mount=existing_mount,
        expected_disks=expected_disks,
        device_wait_seconds=SCRATCH_DEVICE_WAIT_SECONDS,
        failed_file=SCRATCH_FAILED_PATH,
        docker_on_scratch=docker_on_scratch,
    ).rstrip("\n")


def docker_on_scratch(spec: ClusterSpec) -> bool:
    """Whether the nodes of ``spec`` keep Docker's image store on scratch.

    A stock image (no ``baked_image``): yes. Every boot pulls or builds the training image, and
    the local NVMe is the fast, large disk for those ~20 GB; Docker keeps images, layers and
    container writable layers under its ``data-root`` ("By default the daemon stores data in
    /var/lib/docker ... You can configure the Docker daemon to use a different directory, using
    the data-root configuration option": docs.docker.com/engine/daemon/#daemon-data-directory;
    overlay2 keeps image layers and each container's upper layer there:
    docs.docker.com/engine/storage/drivers/overlayfs-driver/).

    A baked image: no. The bake pulled (GCP) or built (AWS) the container under the default
    data-root on the image's root disk; pointing ``data-root`` at an empty scratch folder hides
    it and every node pulls it again (from a registry it may not even read). Re-homing it onto
    scratch at each start would copy ~20 GB (instance store and local SSD are empty after a stop,
    so at every start, not once) to gain only faster container writes; the root volume is sized
    to the image's snapshot and the job's bulk data already goes to scratch, which
    ``gpuinfra-run`` bind-mounts into the container. So the image store stays where the bake put it.
    """
    return spec.baked_image is None
