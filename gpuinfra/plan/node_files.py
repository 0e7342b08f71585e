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
from gpuinfra.plan.tags import expires_at_text
from gpuinfra.plan.units import SCRATCH_FAILED_PATH
from gpuinfra.spec import ClusterSpec
from gpuinfra.templating import render

#: Seconds the scratch unit waits at boot for udev to link every local NVMe disk.
SCRATCH_DEVICE_WAIT_SECONDS = 120

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

    Raises:
        ValueError: a value would break the file (a newline) -- stack names are validated before.
    """
    return format_node_env(
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
            "GPUINFRA_DEPLOYMENT": spec.deployment_id,
        }
    )


def scratch_script(mount_point: str, device_glob: str, expected_disks: int, existing_mount: str = "") -> str:
    """The scratch unit's script (``templates/scratch-raid0.sh.j2``) for a machine with
    ``expected_disks`` local NVMe disks named ``/dev/disk/by-id/<device_glob>``; ``existing_mount``
    is where the image mounts them itself (the DLAMI's ``/opt/dlami/nvme``), or empty."""
    return render(
        "scratch-raid0.sh.j2",
        mount_point=mount_point,
        device_glob=device_glob,
        existing_mount=existing_mount,
        expected_disks=expected_disks,
        device_wait_seconds=SCRATCH_DEVICE_WAIT_SECONDS,
        failed_file=SCRATCH_FAILED_PATH,
    ).rstrip("\n")
