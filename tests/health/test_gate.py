"""The gate's decision on recorded outputs: evaluate() for whole nodes, one failure at a time."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from gpuinfra.catalog.store import load_catalog
from gpuinfra.health.baselines import find_baseline, load_baselines
from gpuinfra.health.gate import (BUSBW_PASS_FRACTION, CHECKS, Expectations, GateOutputs, NodeHealth, decide,
                                  health_key)
from gpuinfra.health.report import evaluate, expectations_for
from tests.health.conftest import fixture_text as t

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def _p4d_outputs(**changes) -> GateOutputs:
    """A healthy p4d-like node from recordings: 8 GPUs (the nvidia-smi recording is of 8 x H100;
    the gate counts GPUs and ECC errors, it does not compare models), NVLink of a p4de GPU,
    4 EFA devices of a p4d (AWS docs), a 2 x p4de all-reduce and aws-ofi-nccl log lines of a p4d."""
    outputs = dict(nvidia_smi=t("nvidia_smi_query_gpu_8xH100_virtualclient.csv"),
                   nvlink_status=t("nvlink_status_p4de_gpu0_awsome.txt"), fabric_manager="active\n",
                   fi_info=t("fi_info_p4d_awsdocs.txt"), all_reduce=t("all_reduce_p4de_2node_awsome_slurm.txt"),
                   nccl_log=t("nccl_info_efa_awsdocs.txt"))
    outputs.update(changes)
    return GateOutputs(**outputs)


def _p5_outputs(**changes) -> GateOutputs:
    outputs = dict(nvidia_smi=t("nvidia_smi_query_gpu_8xH100_virtualclient.csv"),
                   nvlink_status=t("nvlink_status_p4de_gpu0_awsome.txt"), fabric_manager="active\n",
                   fi_info=None, all_reduce=t("all_reduce_p5_2node_awsome_batch.txt"),
                   nccl_log=t("nccl_info_efa_awsome_fsdp.txt"))
    outputs.update(changes)
    return GateOutputs(**outputs)


def _by_name(health: NodeHealth) -> dict:
    return {c.name: c for c in health.checks}


def test_healthy_p4d_node_passes_every_check():
    health = evaluate("p4d.24xlarge", _p4d_outputs(), nodes=2, stack="train", node="i-0a", checked_at=NOW)
    assert health.passed and health.failed == ()
    assert [c.name for c in health.checks] == list(CHECKS)
    assert {c.name: c.passed for c in health.checks} == dict.fromkeys(CHECKS, True)
    checks = _by_name(health)
    assert (checks["gpu_count"].measured, checks["gpu_count"].expected) == (8, 8)
    assert (checks["efa_devices"].measured, checks["efa_devices"].expected) == (4, 4)
    assert checks["efa_devices"].detail == "4 of 4 EFA devices (efa_0, efa_1, efa_2, efa_3)"
    assert checks["gpudirect_plugin"].detail == "NCCL loaded aws-ofi-nccl (AWS Libfabric) (NET/OFI)"
    busbw = checks["allreduce_busbw"]
    assert (busbw.passed, busbw.measured, busbw.expected) == (True, 78.33, 77.35)
    assert busbw.detail == "78.33 GB/s at 2147483648 B, needs >= 0.8 x 77.35 = 61.88 GB/s (inter-node baseline)"
    assert busbw.source.startswith("https://github.com/skypilot-org/skypilot/blob/d32b1223")
    assert health.checked_at == "2026-11-30T12:00:00+00:00"


@pytest.mark.parametrize("change, check, measured, detail", [
    # a GPU fell off the bus: 7 rows
    (dict(nvidia_smi="\n".join(t("nvidia_smi_query_gpu_8xH100_virtualclient.csv").split("\n")[:8])),
     "gpu_count", 7, "7 of 8 GPUs visible (NVIDIA H100 80GB HBM3)"),
    # uncorrectable ECC errors (derived recording)
    (dict(nvidia_smi=t("nvidia_smi_query_gpu_8xH100_ecc_derived.csv")),
     "ecc", 2, "GPU 3: 2 uncorrectable volatile ECC errors"),
    # inactive NVLinks (Azure/azhpc-diagnostics#73)
    (dict(nvlink_status=t("nvlink_status_v100_inactive_azhpc73.txt")), "nvlink", 2, "GPU 3: links 3, 5 inactive"),
    (dict(fabric_manager="failed\n"), "fabric_manager", "failed", "nvidia-fabricmanager is failed"),
    # one EFA device missing (derived recording)
    (dict(fi_info=t("fi_info_p4d_missing_one_derived.txt")),
     "efa_devices", 3, "3 of 4 EFA devices (efa_0, efa_1, efa_2)"),
    (dict(fi_info="fi_getinfo: -61\n"), "efa_devices", 0, "0 of 4 EFA devices (fi_getinfo: -61)"),
    # NCCL fell back to sockets (NVIDIA/nccl-tests#131)
    (dict(nccl_log=t("nccl_info_no_plugin_nccltests131.txt")), "gpudirect_plugin", "Socket",
     "NCCL used network Socket, not aws-ofi-nccl (AWS Libfabric)"),
    (dict(nccl_log=None, all_reduce=t("all_reduce_p4de_2node_awsome_slurm.txt")), "gpudirect_plugin", None,
     "no `NCCL INFO` lines: run all_reduce_perf with NCCL_DEBUG=INFO"),
    # wrong elements (derived recording)
    (dict(all_reduce=t("all_reduce_p5_2node_wrong_derived.txt")), "allreduce_correct", 12,
     "12 wrong elements at 1073741824 B; out of bounds values: 12"),
    (dict(nvidia_smi=None), "gpu_count", None,
     "not run: no output of `nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,ecc.mode.current,"
     "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total --format=csv`"),
    (dict(all_reduce="NCCL WARN Call to ibv_reg_mr failed\n"), "allreduce_correct", None,
     "unreadable output: no all_reduce_perf result table: NCCL WARN Call to ibv_reg_mr failed"),
])
def test_each_failure_fails_its_check_and_the_node(change, check, measured, detail):
    health = evaluate("p4d.24xlarge", _p4d_outputs(**change), nodes=2, stack="train", node="i-0a", checked_at=NOW)
    result = _by_name(health)[check]
    assert (result.passed, result.measured, result.detail) == (False, measured, detail)
    assert not health.passed and check in [c.name for c in health.failed]


def test_low_busbw_fails_against_the_p5_baseline():  # derived recording: 301.44 GB/s at 2 GiB
    outputs = _p5_outputs(all_reduce=t("all_reduce_p5_2node_lowbw_derived.txt"))
    busbw = _by_name(evaluate("p5.48xlarge", outputs, nodes=2, stack="s", node="n", checked_at=NOW))["allreduce_busbw"]
    assert (busbw.passed, busbw.measured, busbw.expected) == (False, 301.44, 437.79)
    assert busbw.detail == "301.44 GB/s at 2147483648 B, needs >= 0.8 x 437.79 = 350.23 GB/s (inter-node baseline)"


def test_p5_with_the_real_batch_run_passes_busbw_but_needs_fi_info():
    health = evaluate("p5.48xlarge", _p5_outputs(), nodes=2, stack="s", node="n", checked_at=NOW)
    checks = _by_name(health)
    assert checks["allreduce_busbw"].passed and checks["allreduce_busbw"].measured == 444.02
    assert checks["efa_devices"].detail == "not run: no output of `fi_info -p efa`"
    assert checks["efa_devices"].expected == 32  # EfaInfo.MaximumEfaInterfaces of p5.48xlarge
    assert [c.name for c in health.failed] == ["efa_devices"]


def test_run_too_short_for_the_baseline_message_size_fails():
    head = "\n".join(line for line in t("all_reduce_p5_2node_awsome_batch.txt").splitlines()
                     if "2147483648" not in line and "4294967296" not in line and "8589934592" not in line
                     and "17179869184" not in line)
    busbw = _by_name(evaluate("p5.48xlarge", _p5_outputs(all_reduce=head), nodes=2, stack="s", node="n"))[
        "allreduce_busbw"]
    assert busbw.passed is False
    assert busbw.detail == ("no 2147483648 B row (largest: 1073741824 B); run all_reduce_perf up to at least "
                            "2147483648 B")


def test_types_without_nvswitch_efa_plugin_or_baseline_are_not_checked():
    # g5.48xlarge: 8 x A10G, one EFA, no NVSwitch, no baseline in the table
    outputs = GateOutputs(nvidia_smi=t("nvidia_smi_query_gpu_8xH100_virtualclient.csv"),
                          fi_info=t("fi_info_single_efa_libfabric5689.txt"),
                          all_reduce=t("all_reduce_p5_2node_awsome_batch.txt"), nccl_log=t("nccl_info_efa_awsdocs.txt"))
    health = evaluate("g5.48xlarge", outputs, nodes=2, stack="s", node="n", checked_at=NOW)
    checks = _by_name(health)
    assert checks["nvlink"].passed is None and checks["nvlink"].detail == "not checked (g5.48xlarge has no NVSwitch)"
    assert checks["fabric_manager"].passed is None
    assert checks["efa_devices"].passed is True and checks["efa_devices"].measured == 1
    assert checks["allreduce_busbw"].passed is None
    assert checks["allreduce_busbw"].detail == "not checked (no baseline for g5.48xlarge inter-node)"
    assert health.passed


def test_gcp_tcpx_node_with_googles_example_run():
    outputs = GateOutputs(nvidia_smi=t("nvidia_smi_query_gpu_8xH100_virtualclient.csv"),
                          nvlink_status=t("nvlink_status_p4de_gpu0_awsome.txt"), fabric_manager="active",
                          all_reduce=t("all_reduce_a3high_2node_gcp_tcpx.txt"), nccl_log=t("nccl_info_tcpx_skypilot.txt"))
    health = evaluate("a3-highgpu-8g", outputs, nodes=2, stack="s", node="vm-1", checked_at=NOW)
    checks = _by_name(health)
    assert checks["efa_devices"].passed is None
    assert checks["gpudirect_plugin"].passed and checks["gpudirect_plugin"].expected == "GPUDirect-TCPX"
    # validation 0: the run could not find wrong elements
    assert checks["allreduce_correct"].passed is None
    assert (checks["allreduce_busbw"].measured, checks["allreduce_busbw"].expected) == (88.18, 65.72)
    assert health.passed
    # the same node expecting gIB (a3-ultragpu-8g) does not accept TCPX lines
    ultra = evaluate("a3-ultragpu-8g", outputs, nodes=2, stack="s", node="vm-1", checked_at=NOW)
    assert _by_name(ultra)["gpudirect_plugin"].detail == "no NCCL/gIB line in NCCL's INFO output, not NCCL/gIB"


def test_single_node_uses_the_intra_node_baseline_and_skips_the_plugin():
    exp = expectations_for(load_catalog().fact("aws", "p5.48xlarge"), nodes=1)
    assert exp.baseline.scope == "intra_node" and exp.baseline.message_size_bytes is None
    health = decide(exp, _p5_outputs(), stack="s", node="n", checked_at=NOW)
    checks = _by_name(health)
    assert checks["gpudirect_plugin"].passed is None
    # compared at the largest size of the run (17179869184 B: 483.05 GB/s) with 480 GB/s
    assert (checks["allreduce_busbw"].measured, checks["allreduce_busbw"].expected) == (483.05, 480.0)


def test_expectations_come_from_the_catalog_facts():
    facts = load_catalog().fact("aws", "p5en.48xlarge")
    exp = expectations_for(facts, nodes=4)
    assert (exp.gpu_count, exp.efa_count, exp.nvswitch, exp.nic_layout) == (8, facts.max_efa_interfaces, True, "efa")
    assert exp.efa_count == 16 and exp.baseline is None and exp.busbw_pass_fraction == BUSBW_PASS_FRACTION
    assert Expectations.from_dict(json.loads(json.dumps(exp.to_dict()))) == exp
    p5 = expectations_for(load_catalog().fact("aws", "p5.48xlarge"), nodes=2)
    assert Expectations.from_dict(json.loads(json.dumps(p5.to_dict()))) == p5
    with pytest.raises(ValueError, match="nodes must be at least 1"):
        expectations_for(facts, nodes=0)
    with pytest.raises(ValueError, match="the catalog has no facts for 'p9.huge'"):
        evaluate("p9.huge", GateOutputs(), nodes=2, stack="s", node="n")


def test_node_health_round_trip_and_refusals():
    health = evaluate("p4d.24xlarge", _p4d_outputs(fabric_manager="failed"), nodes=2, stack="train", node="i-0a",
                      checked_at=NOW)
    doc = json.loads(health.to_json())
    assert doc["schema_version"] == "1" and doc["passed"] is False
    assert list(doc) == ["schema_version", "stack", "node", "cloud", "instance_type", "nodes", "checked_at", "checks",
                         "passed"]
    assert list(doc["checks"][0]) == ["name", "passed", "measured", "expected", "detail", "source"]
    assert NodeHealth.from_dict(doc) == health
    assert health_key("train", "i-0a") == "health/train/i-0a.json"
    with pytest.raises(ValueError, match="schema_version '2'"):
        NodeHealth.from_dict({**doc, "schema_version": "2"})
    with pytest.raises(ValueError, match="passed is True but the checks say False"):
        NodeHealth.from_dict({**doc, "passed": True})
    with pytest.raises(ValueError, match="missing or invalid field"):
        NodeHealth.from_dict({k: v for k, v in doc.items() if k != "node"})
    with pytest.raises(ValueError, match="not a JSON object"):
        NodeHealth.from_dict([doc])


def test_baseline_table_rules():
    baselines = load_baselines()
    assert {(b.cloud, b.instance_type, b.scope) for b in baselines} == {
        ("aws", "p4d.24xlarge", "inter_node"), ("aws", "p4de.24xlarge", "inter_node"),
        ("aws", "p5.48xlarge", "inter_node"), ("aws", "p5.48xlarge", "intra_node"),
        ("gcp", "a3-highgpu-8g", "inter_node"), ("gcp", "a3-megagpu-8g", "inter_node")}
    catalog = load_catalog()
    for b in baselines:
        assert catalog.fact(b.cloud, b.instance_type) is not None, b.instance_type
        assert b.busbw_gbps == min(o.busbw_gbps for o in b.observations)
        assert all(o.source.startswith("https://") and o.measured for o in b.observations)
    assert find_baseline("aws", "p5.48xlarge", "inter_node").busbw_gbps == 437.79
    assert find_baseline("gcp", "a3-ultragpu-8g", "inter_node") is None


def test_baseline_entry_that_is_not_the_lowest_observation_is_refused(tmp_path):
    from gpuinfra.health.baselines import Baseline

    entry = find_baseline("aws", "p5.48xlarge", "inter_node").to_dict()
    with pytest.raises(ValueError, match="busbw_gbps must be the lowest observation"):
        Baseline.from_dict({**entry, "busbw_gbps": 444.02})
    with pytest.raises(ValueError, match="every observation needs a source"):
        Baseline.from_dict({**entry, "observations": [{**entry["observations"][0], "source": " "}]})
