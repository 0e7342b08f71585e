"""``gpuinfra.fabrics``: one record per network layout, checked against facts from outside the
record (the catalog, public NCCL logs, vendor documentation) and against what its readers render,
never against a copy of its own table. Sources: ``docs/sources/fabric.md``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import get_args

import pytest

from gpuinfra.catalog.facts_model import NicLayout
from gpuinfra.catalog.store import load_catalog
from gpuinfra.fabrics import FABRICS, fabric_for
from gpuinfra.health.baselines import load_baselines
from gpuinfra.health.gate import Expectations, GateOutputs, decide
from gpuinfra.plan.aws import plan_aws_cluster
from gpuinfra.plan.boot_aws import nccl_env as aws_nccl_env
from gpuinfra.plan.fabric import aws_fabric, efa_image_build, gcp_fabric
from gpuinfra.plan.fabric_host import gcp_host_stack
from gpuinfra.plan.gcp import nccl_env
from gpuinfra.rules.spec_rules import fabric_boot_blocker
from tests.health.conftest import spec_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "health"
CATALOG = load_catalog()


def _facts(cloud: str, instance_type: str):
    return CATALOG.fact(cloud, instance_type)


def _gate(layout: str, log: str):
    """The health gate's ``gpudirect_plugin`` check of a 2-node cluster on ``layout``."""
    exp = Expectations("gcp", "x", 2, 8, 0, True, layout, None)
    health = decide(exp, GateOutputs(nccl_log=log), stack="s", node="n")
    return next(c for c in health.checks if c.name == "gpudirect_plugin")


def _selected_net(env: dict[str, str]) -> str:
    """The network NCCL selects by name: ``NCCL_NET`` (NCCL env docs: "forces NCCL to use a
    specific network"); NCCL then logs ``NCCL INFO Using network <name>``."""
    return env["NCCL_NET"]


def _using(name: str) -> str:
    return f"node:1:1 [0] NCCL INFO Using network {name}\n"


def test_the_registry_covers_every_layout_the_catalog_uses():
    used = {(f.cloud, f.nic_layout) for f in CATALOG.facts.values()}
    assert used <= {(f.cloud, f.layout) for f in FABRICS.values()}
    assert set(FABRICS) == set(get_args(NicLayout))  # the facts model's layouts, no more
    assert all(fabric_for(layout).layout == layout for layout in FABRICS)
    with pytest.raises(ValueError, match="unknown nic_layout 'infiniband'"):
        fabric_for("infiniband")


def test_every_baseline_is_keyed_by_a_fabric_network():
    networks = {f.baseline_network for f in FABRICS.values() if f.plugin}
    assert {b.nic_layout for b in load_baselines() if b.nodes > 1} <= networks


def test_efa_uses_aws_ofi_nccl_one_uverbs_device_per_efa_interface():
    efa = fabric_for("efa")
    assert efa.plugin.name == "aws-ofi-nccl" and efa.plugin.library.endswith("/libnccl-net.so")
    # the efa-cheatsheet: modern aws-ofi-nccl needs no FI_PROVIDER / NCCL_PROTO, never RDMAV_*
    p5 = _facts("aws", "p5.48xlarge")
    env = aws_nccl_env(plan_aws_cluster(spec_for("p5.48xlarge", 2)), p5)
    assert not any(k in env for k in ("FI_PROVIDER", "NCCL_PROTO", "FI_EFA_USE_DEVICE_RDMA"))
    assert not any(k.startswith("RDMAV_") for k in env) and env["FI_EFA_USE_HUGE_PAGE"] == "0"
    runtime = aws_fabric(p5.max_efa_interfaces)
    assert runtime.devices == tuple(f"/dev/infiniband/uverbs{i}" for i in range(32))  # p5: 32 EFA
    assert {r.target for r in runtime.requirements} >= {efa.plugin.library}
    dockerfile = efa_image_build("nvcr.io/nvidia/pytorch:25.01-py3").dockerfile
    assert all(f"={v}" in dockerfile for v in efa.host.versions.values())
    # a public 2 x p4d log: NCCL selected aws-ofi-nccl's network, the gate passes it
    assert _gate("efa", (FIXTURES / "nccl_info_efa_p4d_awsefaeks.txt").read_text()).passed is True
    assert _gate("efa", _using("Socket")).passed is False
    assert efa.boot_blocker is None and fabric_boot_blocker("aws", "efa") is None


@pytest.mark.parametrize("layout", ["ena", "gvnic"])
def test_plain_networks_use_nccl_sockets_and_are_not_gate_checked(layout):
    fabric = fabric_for(layout)
    assert fabric.plugin is None and fabric.gate is None and fabric.runtime == "sockets"
    assert not fabric.host.template and fabric.boot_blocker is None
    env = (
        nccl_env(layout)
        if fabric.cloud == "gcp"
        else aws_nccl_env(SimpleNamespace(efa_count=0), _facts("aws", "g6e.xlarge"))
    )
    assert "NCCL_NET" not in env and {"docker", "lo"} <= set(env["NCCL_SOCKET_IFNAME"].lstrip("^").split(","))
    assert _gate(layout, _using("Socket")).passed is None  # no GPUDirect plugin to look for


def test_tcpx_selects_the_gpudirecttcpx_plugin_the_gate_looks_for():
    tcpx = fabric_for("tcpx")
    facts = _facts("gcp", "a3-highgpu-8g")
    env = nccl_env("tcpx")
    runtime = gcp_fabric("tcpx", facts, env)
    # one GPU NIC per GPU NIC the facts list (A3 High: 4), each with TX and RX CPU bindings
    assert len(runtime.gpu_nics) == facts.gpu_nic_count == 4
    for way in ("TX", "RX"):
        assert [b.split(":")[0] for b in runtime.env[f"NCCL_GPUDIRECTTCPX_{way}_BINDINGS"].split(";")] == list(
            runtime.gpu_nics
        )
    # the RxDM's socket folder is the one the container mounts and NCCL is pointed at
    uds = runtime.env["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"]
    assert f"{uds}:{uds}" in runtime.mounts and any(r.target == uds for r in runtime.requirements)
    assert f"--uds_path {uds}" in gcp_host_stack("tcpx", facts, env).writes["/etc/systemd/system/gpuinfra-rxdm.service"]
    assert runtime.library_path + "/libnccl-net.so" == tcpx.plugin.library
    # the public skypilot 2 x A3 High log, and the network the rendered env names
    assert _gate("tcpx", (FIXTURES / "nccl_info_tcpx_skypilot.txt").read_text()).passed is True
    assert _gate("tcpx", _using(_selected_net(env))).passed is True
    assert "linux-gcp-tcpx" in fabric_boot_blocker("gcp", "tcpx") == tcpx.boot_blocker


def test_tcpxo_uses_the_fastrak_libnccl_net_plugin():
    tcpxo = fabric_for("tcpxo")
    facts = _facts("gcp", "a3-megagpu-8g")
    env = nccl_env("tcpxo")
    runtime = gcp_fabric("tcpxo", facts, env)
    # Google's TCPXO plugin (FasTrak) is the libnccl-net.so its installer writes, configured by
    # NCCL_FASTRAK_* settings (control NIC + 8 GPU NICs) and by nccl-env-profile.sh read with
    # NCCL_LIB_DIR set to the plugin folder (container-engine-accelerators gpudirect-tcpxo/README.md)
    assert tcpxo.plugin.library == f"{runtime.library_path}/libnccl-net.so"
    assert "FasTrak" in tcpxo.plugin.name and {"NCCL_FASTRAK_CTRL_DEV", "NCCL_FASTRAK_IFNAME"} <= set(env)
    assert runtime.env_script == f"{runtime.env_script_lib_dir}/nccl-env-profile.sh"
    assert len(runtime.gpu_nics) == facts.gpu_nic_count == 8
    aperture = env["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"]
    assert f"{aperture}:{aperture}" in runtime.mounts
    assert tcpxo.host.rxdm_image in gcp_host_stack("tcpxo", facts, env).images
    assert _gate("tcpxo", "node:1:1 [0] NCCL INFO NET/FasTrak : Using 8 NICs\n").passed is True
    assert _gate("tcpxo", _using("Socket")).passed is False
    assert tcpxo.boot_blocker is None


@pytest.mark.parametrize("instance_type", ["a3-ultragpu-8g", "a4-highgpu-8g"])
def test_gib_selects_the_gib_network_over_one_uverbs_device_per_mrdma_nic(instance_type):
    gib = fabric_for("gib")
    facts = _facts("gcp", instance_type)
    env = {**nccl_env("gib"), **gcp_fabric("gib", facts, nccl_env("gib")).env}
    runtime = gcp_fabric("gib", facts, nccl_env("gib"))
    assert runtime.devices == tuple(f"/dev/infiniband/uverbs{i}" for i in range(facts.gpu_nic_count))
    assert _gate("gib", _using(_selected_net(env))).passed is True
    assert _gate("gib", _using("IB")).passed is False
    # the host stack installs the pinned nccl-gib, whose set_nccl_env.sh the container reads
    script = gcp_host_stack("gib", facts, nccl_env("gib")).files["/usr/local/sbin/gpuinfra-fabric-host"]
    assert f'"nccl-gib={gib.host.versions["nccl-gib"]}"' in script and runtime.env_script in script
    assert gib.boot_blocker is None
