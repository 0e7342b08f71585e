"""Scenarios: what the box's stand-ins answer, as one small declarative object per test.

A scenario names the example stack whose real boot text the nodes boot, what the stand-in GPU
tools print (recorded outputs from ``tests/fixtures/health/``, each with its ``.source``), which
stand-in calls fail, and the rendered text's few box overrides. :meth:`Scenario.to_json` is what
the box server reads (:mod:`tests.box.server`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "health"


def fixture(name: str) -> str:
    """The text of one recorded output under ``tests/fixtures/health/``."""
    return (FIXTURES / name).read_text()


def fi_info_efa(devices: int) -> str:
    """``fi_info -p efa`` for ``devices`` EFA devices: the first provider block of the AWS-docs
    p4d recording, repeated with its domain renamed ``efa_<n>-rdm`` (derived: no p5 recording
    of 32 devices is stored)."""
    text = fixture("fi_info_p4d_awsdocs.txt")
    block = "provider: efa" + text.split("provider: efa")[1]
    return "".join(block.replace("efa_0", f"efa_{n}").rstrip("\n") + "\n" for n in range(devices))


@dataclass(frozen=True)
class Gpus:
    """What ``nvidia-smi``, ``fi_info`` and the health gate's all-reduce container print.

    Attributes:
        query: ``nvidia-smi --query-gpu=... --format=csv`` output.
        nvlink_status: ``nvidia-smi nvlink -s`` output.
        fi_info: ``fi_info -p efa`` output; "" answers ``fi_getinfo: -61`` with exit 1.
        all_reduce: what ``docker run ... gpuinfra_allreduce.py`` prints (nccl-tests table and
            NCCL INFO lines).
        utilization: per GPU, percent, for ``nvidia-smi --query-gpu=utilization.gpu``.
        power_w: per GPU, watts, for ``nvidia-smi --query-gpu=power.draw,enforced.power.limit``
            (empty: ``[N/A]``); power_limit_w: every GPU's enforced limit (H100 SXM: 700 W).
    """

    query: str
    nvlink_status: str
    fi_info: str
    all_reduce: str
    utilization: tuple[int, ...] = (0,) * 8
    power_w: tuple[float, ...] = ()
    power_limit_w: float = 700.0


def healthy_p5() -> Gpus:
    """A healthy p5.48xlarge node: 8 x H100 (recorded), NVLink (p4de recording, 8 GPUs), 32 EFA
    devices (:func:`fi_info_efa`), a complete 2 x 8 GPU all-reduce and the NCCL lines of a run
    over `AWS Libfabric`."""
    return Gpus(
        fixture("nvidia_smi_query_gpu_8xH100_virtualclient.csv"),
        fixture("nvlink_status_p4de_8gpu_derived.txt"),
        fi_info_efa(32),
        fixture("all_reduce_p5_2node_batch_ranks_derived.txt") + fixture("nccl_info_efa_p4d_awsefaeks.txt"),
    )


def healthy_a3mega() -> Gpus:
    """A healthy a3-megagpu-8g node: the 2-node A3 Mega all-reduce recording, plus two NCCL INFO
    lines naming the FasTrak (TCPXO) network (derived: the recording carries no INFO lines)."""
    return Gpus(
        fixture("nvidia_smi_query_gpu_8xH100_virtualclient.csv"),
        fixture("nvlink_status_p4de_8gpu_derived.txt"),
        "",
        fixture("all_reduce_a3mega_2node_ztan.txt")
        + "NCCL INFO NET/FasTrak ver. 1.0.0.\nNCCL INFO Using network FasTrak\n",
    )


@dataclass(frozen=True)
class Scenario:
    """One box run.

    Attributes:
        stack: example stack name (``stacks/Pulumi.<stack>.yaml``).
        gpus: the stand-in GPU tools' answers.
        failing_calls: ``fnmatch`` patterns over ``"<program> <args>"``; a matching stand-in call
            exits 1 with a message (e.g. ``"gcloud compute instance-groups managed delete-instances*"``).
            A ``(pattern, n)`` pair fails each node's first ``n`` matching calls, then lets them through.
        node_env: node.env keys whose rendered value the box replaces (e.g. a tiny idle timeout).
        gpu_nics: interface names created up (veth pairs) in each node's namespace: the GPU NICs
            ``gpuinfra-run`` checks on GCP.
        nic_wait_seconds: replaces the GCP cluster-env script's 300 s wait for NIC addresses
            (veth interfaces have no ``/sys/class/net/*/device``, so that wait never ends early).
        nodes: how many of the stack's nodes boot (0: all of them).
        gcp_bulk: GCP: the nodes are the VMs of the stack's bulk insert (named
            ``<group>-n000`` ..., no ``created-by`` metadata key, not listed by the managed instance
            group) instead of the group's members.
    """

    stack: str
    gpus: Gpus
    failing_calls: tuple[str | tuple[str, int], ...] = ()
    node_env: dict[str, str] = field(default_factory=dict)
    gpu_nics: tuple[str, ...] = ()
    nic_wait_seconds: int = 0
    nodes: int = 0
    gcp_bulk: bool = False

    def patch(self, text: str) -> str:
        """The rendered boot text with the box overrides applied.

        Raises:
            ValueError: an override does not find exactly one place to change (the renderer changed).
        """
        for key, value in self.node_env.items():
            text, count = re.subn(
                rf"^(\s*){re.escape(key)}=.*$",
                lambda m, key=key, value=value: f"{m.group(1)}{key}={value}",
                text,
                flags=re.MULTILINE,
            )
            if count != 1:
                raise ValueError(f"node.env key {key} found {count} times in the boot text")
        old = "NIC_DEADLINE=$(( $(date +%s) + 300 ))"
        if old in text:
            if text.count(old) != 1:
                raise ValueError("the NIC wait appears more than once")
            text = text.replace(old, f"NIC_DEADLINE=$(( $(date +%s) + {int(self.nic_wait_seconds)} ))")
        return text

    def to_json(self, region: str = "", zone: str = "", attributes: dict | None = None) -> dict:
        """The server's ``scenario.json``."""
        g = self.gpus
        return {
            "gpus": {
                "query": g.query,
                "nvlink_status": g.nvlink_status,
                "fi_info": g.fi_info,
                "all_reduce": g.all_reduce,
                "utilization": list(g.utilization),
                "power_w": list(g.power_w),
                "power_limit_w": g.power_limit_w,
            },
            "failing_calls": list(self.failing_calls),
            "aws": {"region": region, "zone": zone, "zone_id": "use1-az4" if zone else "", "tags": {}},
            "gcp": {"zone": zone, "attributes": attributes or {}},
        }


#: The GPU NICs of an a3-megagpu-8g (the rendered gpuinfra-run's ``nic|`` checks).
A3MEGA_GPU_NICS = ("enp6s0", "enp7s0", "enp13s0", "enp14s0", "enp134s0", "enp135s0", "enp141s0", "enp142s0")


def aws_p5() -> Scenario:
    """2 x p5.48xlarge, everything healthy."""
    return Scenario("example-p5-2nodes", healthy_p5())


def gcp_a3mega() -> Scenario:
    """2 x a3-megagpu-8g, everything healthy."""
    return Scenario("example-a3mega-2nodes", healthy_a3mega(), gpu_nics=A3MEGA_GPU_NICS)
