"""`gpuinfra size` on GCP: inter-node communication over the GPU NICs and the spot checkpoint
upload over the host gVNIC, from the bandwidth Google documents (``gcp_machine_facts.json``);
a type without a documented bandwidth still says unknown.

Formulas (gpuinfra.sizing.throughput / comm / checkpoint module docstrings): ZeRO-3 all-gathers
the 16-bit parameters twice and reduce-scatters the gradients once per micro-batch, each a
2P-byte buffer x (N-1)/N (NCCL's bus-bandwidth factor, nccl-tests doc/PERFORMANCE.md) at the
node's GPU-NIC bandwidth x the all-reduce efficiency measured on 4 x p4dn (29.61 of 50 GB/s,
github.com/NVIDIA/nccl/issues/527); the upload moves 14 B x P / nodes at host-NIC Gbit/s x 1e9 / 8.
The catalog folder of each test holds only the named GCP offers (``GPUINFRA_CATALOG_DIR``), so
the GCP type is the one priced; facts and metadata are the shipped ones.
"""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from gpuinfra.catalog.store import PACKAGE_DATA_DIR


@pytest.fixture
def gcp_catalog(tmp_path, monkeypatch):
    """Point the CLI at a catalog folder with the shipped facts and only the GCP offers that
    ``keep(instance_type)`` accepts."""

    def _make(keep) -> None:
        for name in ("catalog.json", "instance_types.json"):
            shutil.copy(PACKAGE_DATA_DIR / name, tmp_path / name)
        with (
            open(PACKAGE_DATA_DIR / "offers.csv", newline="") as src,
            open(tmp_path / "offers.csv", "w", newline="") as dst,
        ):
            reader = csv.DictReader(src)
            writer = csv.DictWriter(dst, fieldnames=reader.fieldnames, lineterminator="\n")
            writer.writeheader()
            writer.writerows(r for r in reader if r["cloud"] == "gcp" and keep(r["instance_type"]))
        monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(tmp_path))

    return _make


def _size(run_cli, *args):
    result = run_cli("size", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


NCCL_EFFICIENCY = 29.61 / 50


def _zero3_seconds_per_step(doc, params, gpu_nic_gbps):
    """ZeRO-3 traffic of one step (module docstring) in the document's layout."""
    layout = doc["layout"]
    assert (layout["tp"], layout["pp"]) == (1, 1)
    n = layout["dp"]
    return layout["accumulation"] * 3 * 2 * params * (n - 1) / n / (gpu_nic_gbps * 1e9 / 8 * NCCL_EFFICIENCY)


def _upload_seconds(params, nodes, host_nic_gbps):
    return 14 * params / nodes / (host_nic_gbps * 1e9 / 8)


def test_a3_mega_communicates_over_its_eight_gpu_nics_and_uploads_over_the_primary_nic(run_cli, gcp_catalog):
    gcp_catalog(lambda t: t == "a3-megagpu-8g")
    doc = _size(
        run_cli,
        "--params",
        "13B",
        "--method",
        "full",
        "--strategy",
        "zero3",
        "--tokens",
        "10B",
        "--gpus",
        "8xH100",
        "--nodes",
        "2",
        "--spot",
    )
    assert doc["recommendation"]["instance_type"] == "a3-megagpu-8g" and doc["fits"] is True
    # 8 GPU NICs x 200 Gbps (Vertex AI configure-compute, GPUDirect-TCPXO): 3 x 2 x 13e9 x 15/16 B
    # at 200 GB/s x 0.592 = 0.617 s per micro-batch, hidden behind its compute (prefetch)
    comm = _zero3_seconds_per_step(doc, 13e9, 8 * 200)
    assert abs(doc["time"]["data_parallel_seconds_per_step"] - comm) < 1e-3 and abs(comm - 0.6175) < 1e-3
    assert doc["communication_hours"] == 0 and doc["time"]["overlap_fraction"] == 1
    assert abs(doc["training_hours"] - doc["compute_hours"]) < 0.011
    plan = doc["checkpoint_plan"]
    # "Up to 200 Gbps bandwidth on the primary NIC": 14 x 13e9 / 2 B / 25 GB/s = 3.64 s < the 30 s notice
    assert plan["upload_seconds"] == round(_upload_seconds(13e9, 2, 200), 1) == 3.6
    assert (plan["notice_seconds"], plan["fits_notice"]) == (30, True)
    mtbi = 3600 / (0.05 * 2)
    upload = _upload_seconds(13e9, 2, 200)
    assert plan["interval_minutes"] == round(((2 * upload * mtbi) ** 0.5 - upload) / 60, 1)


def test_ranked_multi_node_gcp_candidate_has_a_time_and_a_cost(run_cli, gcp_catalog):
    gcp_catalog(lambda t: t in ("a3-highgpu-8g", "a3-megagpu-8g"))  # the H100 types: B200 / H200 hold 30B on one node
    doc = _size(
        run_cli,
        "--params",
        "45B",
        "--method",
        "full",
        "--strategy",
        "zero3",
        "--recompute",
        "full",
        "--tokens",
        "10B",
        "--spot",
    )
    best = doc["candidates"][0]
    # 45B ZeRO-3 does not fit one 8 x H100 node (16 B x 45e9 / 8 = 84 GiB of model states per GPU);
    # two a3-megagpu-8g nodes do.
    # A3 Mega: 8 GPU NICs x 200 Gbps for 8 GPUs (GKE gpu-bandwidth-gpudirect-tcpx). A3 High is not
    # ranked: its TCPX cannot be installed at boot (rule fabric-installable-at-boot).
    assert (best["gpus"], best["nodes"], best["instance_type"]) == ("8xH100", 2, "a3-megagpu-8g")
    assert "a3-highgpu-8g" not in {c["instance_type"] for c in doc["candidates"] if c["nodes"] > 1}
    assert best["network_bandwidth_gbps"] == 1600
    assert abs(best["time"]["data_parallel_seconds_per_step"] - _zero3_seconds_per_step(best, 45e9, 8 * 200)) < 1e-3
    assert best["run_cost_usd"] is not None
    # 14 x 45e9 / 2 B over the 200 Gbps primary NIC = 12.6 s
    assert doc["checkpoint_plan"]["upload_seconds"] == round(_upload_seconds(45e9, 2, 200), 1) == 12.6


def test_a3_high_with_a_slow_interconnect_is_timed_over_its_primary_nic(run_cli, gcp_catalog):
    gcp_catalog(lambda t: t == "a3-highgpu-8g")
    doc = _size(
        run_cli,
        "--params",
        "30B",
        "--method",
        "full",
        "--strategy",
        "zero3",
        "--recompute",
        "full",
        "--tokens",
        "10B",
        "--gpus",
        "8xH100",
        "--nodes",
        "2",
        "--allow-slow-interconnect",
    )
    # without a baked image the 4 GPU NICs carry nothing: 200 Gbps primary NIC for 8 GPUs, so the
    # traffic takes 8 x as long as over A3 Mega's 1,600 Gbps and is no longer hidden
    comm = _zero3_seconds_per_step(doc, 30e9, 200)
    assert abs(doc["time"]["data_parallel_seconds_per_step"] - comm) < 1e-3
    assert doc["communication_hours"] > 0 and doc["time"]["overlap_fraction"] < 1


def test_single_nic_types_use_the_vms_maximum_egress(run_cli, gcp_catalog):
    gcp_catalog(lambda t: t == "a2-highgpu-8g")
    doc = _size(
        run_cli,
        "--params",
        "13B",
        "--method",
        "full",
        "--strategy",
        "zero3",
        "--tokens",
        "10B",
        "--gpus",
        "8xA100",
        "--nodes",
        "4",
        "--allow-slow-interconnect",
        "--spot",
    )
    assert (doc["recommendation"]["instance_type"], doc["recommendation"]["nodes"], doc["fits"]) == (
        "a2-highgpu-8g",
        4,
        True,
    )
    # accelerator-optimized-machines, A2 Standard: a2-highgpu-8g "Maximum egress bandwidth" 100 Gbps,
    # one gVNIC for both: 3 x 2 x 13e9 x 31/32 B at 12.5 GB/s x 0.592 = 10.2 s per micro-batch
    comm = _zero3_seconds_per_step(doc, 13e9, 100)
    assert abs(doc["time"]["data_parallel_seconds_per_step"] - comm) < 1e-3 and abs(comm - 10.21) < 0.01
    # 14 x 13e9 / 4 B / 12.5 GB/s = 3.64 s
    assert doc["checkpoint_plan"]["upload_seconds"] == round(_upload_seconds(13e9, 4, 100), 1) == 3.6


def test_a_type_without_a_documented_bandwidth_stays_unknown(run_cli, gcp_catalog):
    gcp_catalog(lambda t: t.startswith("n1-"))
    args = (
        "--params",
        "1B",
        "--method",
        "full",
        "--strategy",
        "zero3",
        "--precision",
        "fp16",
        "--tokens",
        "1B",
        "--gpus",
        "4xT4",
        "--nodes",
        "2",
        "--allow-slow-interconnect",
        "--spot",
    )
    doc = _size(run_cli, *args)
    assert doc["recommendation"]["instance_type"].startswith("n1-") and doc["fits"] is True
    assert (doc["communication_hours"], doc["training_hours"], doc["run_cost_usd"]) == (None, None, None)
    plan = doc["checkpoint_plan"]
    assert (plan["upload_seconds"], plan["fits_notice"], plan["interval_minutes"]) == (None, None, None)
    text = run_cli("size", *args)
    assert text.exit_code == 0, text.stderr
    assert "upload unknown -> unknown vs the 30 s notice; checkpoint unknown" in text.stdout
