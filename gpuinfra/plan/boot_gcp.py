"""Startup script of GCP GPU nodes: the node boot manifest (:mod:`gpuinfra.plan.boot`) as bash.

GCE runs ``startup-script`` metadata on every boot
(cloud.google.com/compute/docs/instances/startup-scripts/linux), which is what local SSD scratch
needs. Metadata values are limited to 256 KB (cloud.google.com/compute/docs/metadata/overview).
"""

from __future__ import annotations

import shlex

from gpuinfra.agent.constants import PEER_DISCOVERY_WAIT_SECONDS, SCRATCH_MOUNT, TORCHRUN_PORT
from gpuinfra.errors import SpecError
from gpuinfra.plan.boot import (
    PREPULL_UNIT,
    BootStep,
    CloudBoot,
    NodeBoot,
    node_boot,
    render_cluster_env,
)
from gpuinfra.plan.fabric import RUN_SCRIPT_PATH, gcp_fabric, render_run_script
from gpuinfra.plan.fabric_host import fabric_host_systemd_unit, gcp_host_stack
from gpuinfra.plan.gcp import GcpClusterPlan, nccl_env
from gpuinfra.plan.health import expectations_for
from gpuinfra.plan.naming import gcp_bulk_instance_names, gcp_group_name
from gpuinfra.plan.node_bundle import (
    NodeBundle,
    add_checkpoint_restore,
    add_health_gate,
    add_job,
    add_monitoring,
    fetch_script,
    health_template_vars,
)
from gpuinfra.plan.node_files import docker_on_scratch, node_env, scratch_script
from gpuinfra.plan.units import ExecCommand, NodeFile, check_value, shell
from gpuinfra.spec import ClusterSpec

METADATA_VALUE_LIMIT_BYTES = 256 * 1024
#: Local NVMe SSDs under /dev/disk/by-id (cluster-toolkit startup-script setup-raid.yml).
GCP_NVME_GLOB = "google-local-nvme-ssd-*"
#: Bucket prefix where nodes publish their IPs (outside the expiring scratch prefix: a node
#: re-created days later must still find its formed peers).
PEERS_PREFIX = "gpuinfra-peers"


def artifact_registry_login(spec: ClusterSpec) -> tuple[ExecCommand, ...]:
    """``gcloud auth configure-docker <region>-docker.pkg.dev --quiet``: Docker then gets
    credentials for the bake's Artifact Registry host from gcloud's credential helper, i.e. the
    node's service account (cloud.google.com/artifact-registry/docs/docker/authentication#gcloud-helper);
    () when the nodes boot no bake with a repository.

    Raises:
        UnitValueError: a host that cannot be written (validated by the spec).
    """
    ref = spec.baked_image
    if ref is None or not ref.registry_host:
        return ()
    return (shell('gcloud auth configure-docker "$1" --quiet', check_value("registry", ref.registry_host)),)


def node_prefix(spec: ClusterSpec) -> str:
    """Name and base instance name of the MIG (:func:`gpuinfra.plan.naming.gcp_group_name`): its
    VMs are ``<prefix>-<4 characters>``, those of the stack's bulk insert ``<prefix>-n000`` ..
    (:func:`gpuinfra.plan.naming.gcp_bulk_instance_names`)."""
    return gcp_group_name(spec)


def gcp_node_bundle(spec: ClusterSpec, plan: GcpClusterPlan) -> NodeBundle:
    """The GCP node bundle (:mod:`gpuinfra.plan.node_bundle`): ``gpuinfra-run``, the GPU
    fabric's host stack where it can be installed at boot (:mod:`gpuinfra.plan.fabric_host`:
    TCPXO on A3 Mega, gIB on A3 Ultra / A4), the monitoring agent and the health gate, which
    starts after the host stack and after the boot's pre-pull of the profile's image (its
    all-reduce runs in that image)."""
    bundle = NodeBundle()
    env = nccl_env(plan.nic_layout)
    fabric = gcp_fabric(plan.nic_layout, spec.facts, env)
    bundle.add(
        RUN_SCRIPT_PATH,
        render_run_script(
            fabric, image=spec.profile.container_image, instance_type=spec.instance_type, scratch=SCRATCH_MOUNT
        ),
        "0755",
    )
    host = gcp_host_stack(plan.nic_layout, spec.facts, env)
    after: tuple[str, ...] = ()
    if host.boot_command and host.boot_ok:
        bundle.add_files(host.files)
        unit = fabric_host_systemd_unit(host)
        bundle.add_unit(unit)
        after = (unit.name,)
    if spec.profile.container_image:
        after = (*after, PREPULL_UNIT)
    add_monitoring(bundle, spec, "gcp")
    add_health_gate(bundle, spec, expectations_for(spec), after)
    add_checkpoint_restore(bundle)
    add_job(bundle)
    return bundle


def peers_prefix(spec: ClusterSpec) -> str:
    """Where the nodes of ``spec`` publish their addresses and ``.formed`` markers:
    ``gpuinfra-peers/<group>/<deployment id>`` (``gpuinfra-peers/<group>`` for a stack without
    one), so an earlier deployment's entries of the same group are never read."""
    base = f"{PEERS_PREFIX}/{node_prefix(spec)}"
    return f"{base}/{spec.deployment_id}" if spec.deployment_id else base


def gcp_node_boot(spec: ClusterSpec, plan: GcpClusterPlan, bucket: str, bundle: NodeBundle | None = None) -> NodeBoot:
    """The boot manifest (:func:`gpuinfra.plan.boot.node_boot`) of the GCP nodes of ``spec``.

    GCP specifics: peers are found through the managed instance group, the fixed names of the
    stack's bulk insert (:func:`gpuinfra.plan.naming.gcp_bulk_instance_names`, every node gets
    them: whether it is one of them or a group member is decided on the node) and the bucket
    (``templates/gcp-cluster-env.sh.j2``); the profile's image is pre-pulled by
    ``gpuinfra-prepull.service`` as on AWS.

    ``bundle``: the node bundle the bucket holds (its SHA-256 is pinned in the fetch script);
    None renders it from ``spec`` and ``plan`` (:func:`plan_cluster <gpuinfra.plan.cluster.plan_cluster>`
    does the same, so both give the same bytes).

    Raises:
        SpecError: the profile's container image is not an OCI reference.
    """
    prefix = node_prefix(spec)
    cluster_env = render_cluster_env(
        "gcp-cluster-env.sh.j2",
        nodes=spec.nodes,
        nic_count=plan.nic_count,
        group=prefix,
        bulk_names=gcp_bulk_instance_names(prefix, spec.nodes),
        zone=spec.zone,
        gpus_per_node=spec.gpu_count,
        wait_seconds=PEER_DISCOVERY_WAIT_SECONDS,
        master_port=TORCHRUN_PORT,
        bucket=bucket,
        peers_prefix=peers_prefix(spec),
        **health_template_vars(spec),
    )
    cloud = CloudBoot(
        cloud="gcp",
        summary=(
            f"NCCL layout {plan.nic_layout}. Written by gpuinfra from its NodeBoot manifest (gpuinfra/plan/boot.py).",
            "GCE runs it on every boot: files are rewritten only when they change; local SSD scratch is rebuilt.",
        ),
        scratch_script=scratch_script(
            SCRATCH_MOUNT, GCP_NVME_GLOB, plan.local_ssd_count, docker_on_scratch=docker_on_scratch(spec)
        ),
        scratch_after=(),
        cluster_env_script=cluster_env,
        nccl_env=nccl_env(plan.nic_layout),
        node_env=node_env(spec, "gcp", bucket, SCRATCH_MOUNT),
        bundle_fetch_script=fetch_script("gcp", bucket, (bundle or gcp_node_bundle(spec, plan)).sha256()),
        prepull=True,
        registry_login=artifact_registry_login(spec),
    )
    return node_boot(spec, cloud)


#: Defined once at the top of the script: writes stdin to a node file when its content changed
#: (``install``-created folder, ``cmp`` against the old file, mode set either way) and notes the
#: path in ``CHANGED``.
_INSTALL_FUNCTION = """\
CHANGED=""
# gpuinfra_file PATH MODE < content: write PATH when its content changed; note it in CHANGED
gpuinfra_file() {
  local path="$1" mode="$2"
  install -d -m 0755 "$(dirname "$path")"
  cat > "$path.new"
  chmod "$mode" "$path.new"
  if cmp -s "$path.new" "$path"; then
    rm -f "$path.new"
    chmod "$mode" "$path"
  else
    mv -f "$path.new" "$path"
    CHANGED="$CHANGED $path "
  fi
}
"""


def heredoc_delimiter(content: str) -> str:
    """A heredoc delimiter that is not a line of ``content`` (``GPUINFRA_EOF``, numbered if it is)."""
    lines = set(content.splitlines())
    tag, n = "GPUINFRA_EOF", 0
    while tag in lines:
        n += 1
        tag = f"GPUINFRA_EOF_{n}"
    return tag


def _file(f: NodeFile) -> str:
    tag = heredoc_delimiter(f.content)
    # quoted delimiter: the content is not expanded (bash(1), "Here Documents")
    return f"gpuinfra_file {shlex.quote(f.path)} {f.mode} <<'{tag}'\n{f.content}{tag}\n"


def _step(step: BootStep) -> str:
    argv = " ".join(shlex.quote(w) for w in step.argv)
    if step.status_file:
        why = (
            f"$(cat {shlex.quote(step.status_file)} 2>/dev/null || echo "
            f"{shlex.quote('see journalctl -u ' + step.unit)})"
        )
    else:
        why = "see journalctl" + (f" -u {step.unit}" if step.unit else "")
    line = f'if ! {argv}; then echo "gpuinfra: {argv} failed: {why}" >&2; fi'
    if step.when_changed:
        return f'case "$CHANGED" in *{shlex.quote(" " + step.when_changed + " ")}*) {line} ;; esac\n'
    return line + "\n"


def startup_script(boot: NodeBoot) -> str:
    """``boot`` as a bash startup script: every file through ``gpuinfra_file`` (a heredoc with a
    quoted delimiter, so nothing in it is expanded; ``cmp``: written only when changed), then the
    steps, each failure reported on stderr without stopping the boot (``set -e`` would skip the
    agent's start after a failed scratch). Paths and words are ``shlex.quote``-d."""
    header = "".join(f"# {line}\n" for line in boot.summary)  # one line each (NodeBoot checks)
    parts = ["#!/bin/bash\n", header, "set -euo pipefail\n\n", _INSTALL_FUNCTION, "\n"]
    parts += [_file(f) for f in boot.all_files()]
    parts.append("\n")
    parts += [_step(step) for step in boot.steps]
    return "".join(parts)


def render_startup_script(
    spec: ClusterSpec, plan: GcpClusterPlan, bucket: str, bundle: NodeBundle | None = None
) -> str:
    """The startup script text for ``spec`` (:func:`gcp_node_boot`, :func:`startup_script`).

    Raises:
        SpecError: the script exceeds the metadata value limit, or the container image is not
            an OCI reference.
    """
    text = startup_script(gcp_node_boot(spec, plan, bucket, bundle))
    if len(text.encode()) > METADATA_VALUE_LIMIT_BYTES:
        raise SpecError(
            f"startup script is {len(text.encode())} bytes; GCE metadata allows {METADATA_VALUE_LIMIT_BYTES}"
        )
    return text
