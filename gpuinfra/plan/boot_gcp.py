"""Startup script of GCP GPU nodes, rendered from ``templates/gcp-startup.sh.j2``.

GCE runs ``startup-script`` metadata on every boot
(cloud.google.com/compute/docs/instances/startup-scripts/linux), which is what local SSD scratch
needs. Metadata values are limited to 256 KB (cloud.google.com/compute/docs/metadata/overview).
"""

from __future__ import annotations

from gpuinfra.agent.constants import PEER_DISCOVERY_WAIT_SECONDS, SCRATCH_MOUNT, TORCHRUN_PORT
from gpuinfra.errors import SpecError
from gpuinfra.plan.fabric import RUN_SCRIPT_PATH, gcp_fabric, render_run_script
from gpuinfra.plan.fabric_host import FABRIC_HOST_UNIT, fabric_host_unit, gcp_host_stack
from gpuinfra.plan.gcp import GcpClusterPlan, nccl_env
from gpuinfra.plan.health import expectations_for
from gpuinfra.plan.naming import dns_safe
from gpuinfra.plan.node_bundle import (BUNDLE_FETCH_PATH, BUNDLE_UNIT, NodeBundle, add_health_gate, add_monitoring,
                                       fetch_script, fetch_unit, health_template_vars)
from gpuinfra.plan.node_files import DOCKER_MEMLOCK_DROPIN, NODE_FILES, node_env, scratch_script
from gpuinfra.spec import ClusterSpec
from gpuinfra.templating import agent_source, render

METADATA_VALUE_LIMIT_BYTES = 256 * 1024
#: Local NVMe SSDs under /dev/disk/by-id (cluster-toolkit startup-script setup-raid.yml).
GCP_NVME_GLOB = "google-local-nvme-ssd-*"
#: Bucket prefix where nodes publish their IPs (outside the expiring scratch prefix: a node
#: re-created days later must still find its formed peers).
PEERS_PREFIX = "gpuinfra-peers"


def node_prefix(spec: ClusterSpec) -> str:
    """Base instance name of the MIG: VMs are ``<prefix>-<random suffix>``."""
    return f"{dns_safe(spec.stack, 40)}-node"


def gcp_node_bundle(spec: ClusterSpec, plan: GcpClusterPlan) -> NodeBundle:
    """The GCP node bundle (:mod:`gpuinfra.plan.node_bundle`): ``gpuinfra-run``, the GPU
    fabric's host stack where it can be installed at boot (:mod:`gpuinfra.plan.fabric_host`:
    TCPXO on A3 Mega, gIB on A3 Ultra / A4), the monitoring agent and the health gate."""
    bundle = NodeBundle()
    env = nccl_env(plan.nic_layout)
    fabric = gcp_fabric(plan.nic_layout, spec.facts, env)
    bundle.add(RUN_SCRIPT_PATH, render_run_script(fabric, image=spec.profile.container_image,
                                                  instance_type=spec.instance_type, scratch=SCRATCH_MOUNT), "0755")
    host = gcp_host_stack(plan.nic_layout, spec.facts, env)
    after: tuple[str, ...] = ()
    if host.boot_command and host.boot_ok:
        bundle.add_files(host.files)
        bundle.add(f"/etc/systemd/system/{FABRIC_HOST_UNIT}", fabric_host_unit(host))
        bundle.units.append(FABRIC_HOST_UNIT)
        after = (FABRIC_HOST_UNIT,)
    add_monitoring(bundle, spec, "gcp")
    add_health_gate(bundle, spec, expectations_for(spec), after)
    return bundle


def render_startup_script(spec: ClusterSpec, plan: GcpClusterPlan, bucket: str) -> str:
    """The startup script text for ``spec``.

    Raises:
        SpecError: the script exceeds the metadata value limit.
    """
    scratch = scratch_script(SCRATCH_MOUNT, GCP_NVME_GLOB, plan.local_ssd_count)
    text = render(
        "gcp-startup.sh.j2",
        node_files=NODE_FILES,
        docker_memlock_dropin=DOCKER_MEMLOCK_DROPIN,
        stack=spec.stack,
        machine_type=spec.instance_type,
        profile=spec.profile.name,
        mount_point=SCRATCH_MOUNT,
        nic_layout=plan.nic_layout,
        scratch_script=scratch.rstrip("\n"),
        agent_source=agent_source(),
        bundle_fetch_path=BUNDLE_FETCH_PATH,
        bundle_fetch_script=fetch_script("gcp", bucket),
        bundle_unit=BUNDLE_UNIT,
        bundle_unit_text=fetch_unit().rstrip("\n"),
        **health_template_vars(spec),
        nccl_env=nccl_env(plan.nic_layout),
        nodes=spec.nodes,
        nic_count=plan.nic_count,
        group=node_prefix(spec),
        zone=spec.zone,
        gpus_per_node=spec.gpu_count,
        wait_seconds=PEER_DISCOVERY_WAIT_SECONDS,
        master_port=TORCHRUN_PORT,
        bucket=bucket,
        peers_prefix=f"{PEERS_PREFIX}/{node_prefix(spec)}",
        node_env=node_env(spec, "gcp", bucket, SCRATCH_MOUNT),
        container_image=spec.profile.container_image,
    )
    if len(text.encode()) > METADATA_VALUE_LIMIT_BYTES:
        raise SpecError(f"startup script is {len(text.encode())} bytes; GCE metadata allows {METADATA_VALUE_LIMIT_BYTES}")
    return text
