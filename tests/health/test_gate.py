"""The gate's decision on recorded outputs: evaluate() for whole nodes of real stack specs, one
failure at a time."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from gpuinfra.health import parsers as p
from gpuinfra.health.baselines import Baseline, baseline_nodes, find_baseline, load_baselines
from gpuinfra.health.gate import (
    BUSBW_PASS_FRACTION,
    CHECKS,
    Expectations,
    GateOutputs,
    NodeHealth,
    decide,
    health_key,
    run_problems,
)
from gpuinfra.plan.health import expectations_for
from gpuinfra.services.health_report import evaluate
from tests.health.conftest import fixture_text as t
from tests.health.conftest import spec_for

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
#: A complete 2 x 8 GPU EFA run: the p5 AWS Batch output with its 16-rank list (derived fixture).
RUN_2X8 = "all_reduce_p5_2node_batch_ranks_derived.txt"


def _baked(spec):
    """``spec`` with a baked image carrying the TCPX kernel (A3 High gets its GPU NICs only then)."""
    return spec.model_copy(update={"gcp_image": "projects/my-project/global/images/a3-high-tcpx-baked"})


def _p4d_outputs(**changes) -> GateOutputs:
    """A healthy p4d-like node from recordings: 8 GPUs (the nvidia-smi recording is of 8 x H100;
    the gate counts GPUs and ECC errors, it does not compare models), NVLink of 8 A100 GPUs
    (p4de GPU 0, repeated), 4 EFA devices of a p4d (AWS docs), a complete 2 x 8 GPU all-reduce
    and the NCCL lines of a 2 x p4d run that selected `AWS Libfabric`."""
    outputs = dict(
        nvidia_smi=t("nvidia_smi_query_gpu_8xH100_virtualclient.csv"),
        nvlink_status=t("nvlink_status_p4de_8gpu_derived.txt"),
        fabric_manager="active\n",
        fi_info=t("fi_info_p4d_awsdocs.txt"),
        all_reduce=t(RUN_2X8),
        nccl_log=t("nccl_info_efa_p4d_awsefaeks.txt"),
    )
    outputs.update(changes)
    return GateOutputs(**outputs)


def _p5_outputs(**changes) -> GateOutputs:
    return _p4d_outputs(**{"fi_info": None, **changes})


def _by_name(health: NodeHealth) -> dict:
    return {c.name: c for c in health.checks}


def _check(instance_type: str, outputs: GateOutputs, name: str, nodes: int = 2, profile: str = "llm-finetune"):
    return _by_name(evaluate(spec_for(instance_type, nodes, profile), outputs, node="n", checked_at=NOW))[name]


def _one_node_run() -> str:
    """RUN_2X8 without ranks 8-15: what `all_reduce_perf` prints when the "2-node" job ran on one node."""
    return "\n".join(line for line in t(RUN_2X8).splitlines() if "ztan-mig-gq73" not in line) + "\n"


def test_healthy_p4d_node_passes_every_check():
    health = evaluate(spec_for("p4d.24xlarge"), _p4d_outputs(), node="i-0a", checked_at=NOW)
    assert health.passed and health.failed == ()
    assert [c.name for c in health.checks] == list(CHECKS)
    assert {c.name: c.passed for c in health.checks} == dict.fromkeys(CHECKS, True)
    checks = _by_name(health)
    assert (checks["gpu_count"].measured, checks["gpu_count"].expected) == (8, 8)
    assert (checks["efa_devices"].measured, checks["efa_devices"].expected) == (4, 4)
    assert checks["efa_devices"].detail == "4 of 4 EFA devices (efa_0, efa_1, efa_2, efa_3)"
    assert checks["nvlink"].detail == (
        "96 links active on 8 GPUs; links per GPU not checked (the catalog facts give no NVLink count per GPU)"
    )
    assert checks["gpudirect_plugin"].detail == "NCCL used aws-ofi-nccl (AWS Libfabric) (network AWS Libfabric)"
    assert checks["allreduce_ranks"].detail == "16 ranks on 2 hosts (2 nodes x 8 GPUs = 16 ranks)"
    assert checks["allreduce_complete"].detail == (
        "finished: 32 sizes up to 17179869184 B, footer present, no NCCL WARN"
    )
    busbw = checks["allreduce_busbw"]
    assert (busbw.passed, busbw.measured, busbw.expected) == (True, 444.02, 77.35)
    assert busbw.detail == "444.02 GB/s at 2147483648 B, needs >= 0.8 x 77.35 = 61.88 GB/s (2-node baseline)"
    assert busbw.source.startswith("https://github.com/skypilot-org/skypilot/blob/d32b1223")
    assert health.checked_at == "2026-11-30T12:00:00+00:00"


@pytest.mark.parametrize(
    "change, check, measured, detail",
    [
        # a GPU fell off the bus: 7 rows
        (
            dict(nvidia_smi="\n".join(t("nvidia_smi_query_gpu_8xH100_virtualclient.csv").split("\n")[:8])),
            "gpu_count",
            7,
            "7 of 8 GPUs visible (NVIDIA H100 80GB HBM3)",
        ),
        # uncorrectable ECC errors (derived recording)
        (
            dict(nvidia_smi=t("nvidia_smi_query_gpu_8xH100_ecc_derived.csv")),
            "ecc",
            2,
            "GPU 3: 2 uncorrectable volatile ECC errors",
        ),
        # inactive NVLinks (Azure/azhpc-diagnostics#73): the excerpt lists one GPU of 8
        (
            dict(nvlink_status=t("nvlink_status_v100_inactive_azhpc73.txt")),
            "nvlink",
            2,
            "1 of 8 GPUs listed; GPU 3: links 3, 5 inactive",
        ),
        # the real p4de recording lists GPU 0 only: not a whole 8-GPU node
        (dict(nvlink_status=t("nvlink_status_p4de_gpu0_awsome.txt")), "nvlink", 0, "1 of 8 GPUs listed"),
        (dict(fabric_manager="failed\n"), "fabric_manager", "failed", "nvidia-fabricmanager is failed"),
        # one EFA device missing (derived recording)
        (
            dict(fi_info=t("fi_info_p4d_missing_one_derived.txt")),
            "efa_devices",
            3,
            "3 of 4 EFA devices (efa_0, efa_1, efa_2)",
        ),
        (dict(fi_info="fi_getinfo: -61\n"), "efa_devices", 0, "0 of 4 EFA devices (fi_getinfo: -61)"),
        # NCCL fell back to sockets (NVIDIA/nccl-tests#131)
        (
            dict(nccl_log=t("nccl_info_no_plugin_nccltests131.txt")),
            "gpudirect_plugin",
            "Socket",
            "NCCL used network Socket, not aws-ofi-nccl (AWS Libfabric)",
        ),
        # aws-ofi-nccl started (NET/OFI lines: AWS docs; awsome-distributed-training) but nothing shows NCCL used it
        (
            dict(nccl_log=t("nccl_info_efa_awsdocs.txt")),
            "gpudirect_plugin",
            "NET/OFI",
            "the plugin started (NET/OFI) but no `Using network AWS Libfabric` line shows NCCL used it, not aws-ofi-nccl "
            "(AWS Libfabric)",
        ),
        (
            dict(nccl_log=t("nccl_info_efa_awsome_fsdp.txt")),
            "gpudirect_plugin",
            "NET/OFI",
            "the plugin started (NET/OFI) but no `Using network AWS Libfabric` line shows NCCL used it, not aws-ofi-nccl "
            "(AWS Libfabric)",
        ),
        # some communicators on EFA, one fell back to sockets
        (
            dict(nccl_log=t("nccl_info_efa_p4d_awsefaeks.txt") + t("nccl_info_no_plugin_nccltests131.txt")),
            "gpudirect_plugin",
            "AWS Libfabric, Socket",
            "NCCL used network Socket, not aws-ofi-nccl (AWS Libfabric)",
        ),
        (
            dict(nccl_log=None, all_reduce=t("all_reduce_p4de_2node_awsome_slurm.txt")),
            "gpudirect_plugin",
            None,
            "no `NCCL INFO` lines: run all_reduce_perf with NCCL_DEBUG=INFO",
        ),
        # 2 x g4dn.metal with one GPU per node (real, aws-ia/terraform-aws-eks-blueprints): 2 ranks, not 16
        (
            dict(all_reduce=t("all_reduce_g4dnmetal_2node_1gpu_eksblueprints.txt")),
            "allreduce_ranks",
            2,
            "2 ranks, needs 2 nodes x 8 GPUs = 16 ranks",
        ),
        # the "2-node" run on one node
        (
            dict(all_reduce=_one_node_run()),
            "allreduce_ranks",
            8,
            "8 ranks, on 1 host (ztan-mig-235z), needs 2 nodes x 8 GPUs = 16 ranks",
        ),
        # the README excerpt has no rank list: nothing shows the run spanned the cluster
        (
            dict(all_reduce=t("all_reduce_p5_2node_awsome_batch.txt")),
            "allreduce_ranks",
            None,
            "no `# Rank` lines (the `# Using devices` list all_reduce_perf prints before the table): cannot tell whether "
            "the run spanned the cluster; needs 2 nodes x 8 GPUs = 16 ranks",
        ),
        # a table without the footer: the run did not finish (awsome-distributed-training Slurm excerpt)
        (
            dict(all_reduce=t("all_reduce_p5_2node_awsome_slurm.txt")),
            "allreduce_complete",
            17179869184,
            "no `# Out of bounds values` / `# Avg bus bandwidth` footer: all_reduce_perf did not finish",
        ),
        (
            dict(
                all_reduce=t(RUN_2X8).replace(
                    "[1,0]<stdout>:# Out of bounds",
                    "[1,8]<stdout>:ztan-mig-gq73:6733:6790 [0] NCCL WARN NET/OFI Unable to "
                    "register memory\n[1,0]<stdout>:# Out of bounds",
                )
            ),
            "allreduce_complete",
            17179869184,
            "NCCL warned: [1,8]<stdout>:ztan-mig-gq73:6733:6790 [0] NCCL WARN NET/OFI Unable to register memory",
        ),
        # wrong elements (derived recording)
        (
            dict(all_reduce=t("all_reduce_p5_2node_wrong_derived.txt")),
            "allreduce_correct",
            12,
            "12 wrong elements at 1073741824 B; out of bounds values: 12",
        ),
        # out-of-bounds values with no #wrong on any row fail too
        (
            dict(all_reduce=t(RUN_2X8).replace("Out of bounds values : 0 OK", "Out of bounds values : 3 FAILED")),
            "allreduce_correct",
            0,
            "no wrong element in 32 sizes; out of bounds values: 3",
        ),
        (
            dict(nvidia_smi=None),
            "gpu_count",
            None,
            "not run: no output of `nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,ecc.mode.current,"
            "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total --format=csv`",
        ),
        (
            dict(all_reduce="NCCL WARN Call to ibv_reg_mr failed\n"),
            "allreduce_correct",
            None,
            "unreadable output: no all_reduce_perf result table: NCCL WARN Call to ibv_reg_mr failed",
        ),
    ],
)
def test_each_failure_fails_its_check_and_the_node(change, check, measured, detail):
    health = evaluate(spec_for("p4d.24xlarge"), _p4d_outputs(**change), node="i-0a", checked_at=NOW)
    result = _by_name(health)[check]
    assert (result.passed, result.measured, result.detail) == (False, measured, detail)
    assert not health.passed and check in [c.name for c in health.failed]


def test_the_mixed_network_log_would_pass_without_the_other_network():
    """The mixed case above fails only because of the Socket line: the same log without it passes."""
    assert _check(
        "p4d.24xlarge", _p4d_outputs(nccl_log=t("nccl_info_efa_p4d_awsefaeks.txt")), "gpudirect_plugin"
    ).passed


def test_truncated_run_fails_completeness_and_busbw():
    """A3 Mega: the real 2 x 8 H100 run passes; cut after 1 GiB (derived) it fails both checks."""
    outputs = GateOutputs(all_reduce=t("all_reduce_a3mega_2node_ztan.txt"))
    full = _by_name(evaluate(spec_for("a3-megagpu-8g"), outputs, node="vm-1", checked_at=NOW))
    assert [
        full[c].passed for c in ("allreduce_ranks", "allreduce_complete", "allreduce_correct", "allreduce_busbw")
    ] == [True, True, True, True]
    assert (full["allreduce_busbw"].measured, full["allreduce_busbw"].expected) == (318.40, 318.4)
    cut = _by_name(
        evaluate(
            spec_for("a3-megagpu-8g"),
            GateOutputs(all_reduce=t("all_reduce_a3mega_2node_truncated_derived.txt")),
            node="vm-1",
            checked_at=NOW,
        )
    )
    assert (
        cut["allreduce_complete"].passed,
        cut["allreduce_complete"].measured,
        cut["allreduce_complete"].expected,
    ) == (False, 1073741824, 8589934592)
    assert cut["allreduce_complete"].detail == (
        "no `# Out of bounds values` / `# Avg bus bandwidth` footer: all_reduce_perf did not finish; the table stops at "
        "1073741824 B; the run was set up to go to 8589934592 B"
    )
    assert cut["allreduce_busbw"].passed is False
    assert cut["allreduce_busbw"].detail == (
        "no 2147483648 B row (largest: 1073741824 B); run all_reduce_perf up to at least 2147483648 B"
    )
    assert cut["allreduce_ranks"].passed  # all 16 ranks started: it is the cluster's run, cut short


def test_run_problems_rule():
    assert run_problems(p.parse_all_reduce(t("all_reduce_a3mega_2node_ztan.txt"))) == []
    # footer present but the sizes stop early: the footer line alone does not make a run complete
    text = t("all_reduce_a3mega_2node_ztan.txt")
    head, footer = text.split("# Out of bounds")
    early = "\n".join(line for line in head.splitlines() if not line.startswith(("  4294967296", "  8589934592")))
    assert run_problems(p.parse_all_reduce(early + "\n# Out of bounds" + footer)) == [
        "the table stops at 2147483648 B; the run was set up to go to 8589934592 B"
    ]


def test_busbw_is_not_compared_for_a_run_that_is_not_the_clusters():
    busbw = _check("p5.48xlarge", _p5_outputs(all_reduce=_one_node_run()), "allreduce_busbw")
    assert busbw.passed is False
    assert busbw.detail == (
        "not compared until allreduce_ranks passes (8 ranks, on 1 host (ztan-mig-235z), needs "
        "2 nodes x 8 GPUs = 16 ranks)"
    )


def test_low_busbw_fails_against_the_p5_baseline():  # derived recording: 301.44 GB/s at 2 GiB
    busbw = _check("p5.48xlarge", _p5_outputs(all_reduce=t("all_reduce_p5_2node_lowbw_derived.txt")), "allreduce_busbw")
    assert (busbw.passed, busbw.measured, busbw.expected) == (False, 301.44, 437.79)
    assert busbw.detail == "301.44 GB/s at 2147483648 B, needs >= 0.8 x 437.79 = 350.23 GB/s (2-node baseline)"


def test_p5_with_the_real_batch_run_passes_busbw_but_needs_fi_info():
    health = evaluate(spec_for("p5.48xlarge"), _p5_outputs(), node="n", checked_at=NOW)
    checks = _by_name(health)
    assert checks["allreduce_busbw"].passed and checks["allreduce_busbw"].measured == 444.02
    assert checks["efa_devices"].detail == "not run: no output of `fi_info -p efa`"
    assert checks["efa_devices"].expected == 32  # the plan attaches EfaInfo.MaximumEfaInterfaces of p5.48xlarge
    assert [c.name for c in health.failed] == ["efa_devices"]


def test_run_too_short_for_the_baseline_message_size_fails():
    head = "\n".join(
        line
        for line in t(RUN_2X8).splitlines()
        if "2147483648" not in line
        and "4294967296" not in line
        and "8589934592" not in line
        and "17179869184" not in line
    )
    busbw = _check("p5.48xlarge", _p5_outputs(all_reduce=head), "allreduce_busbw")
    assert busbw.passed is False
    assert busbw.detail == (
        "no 2147483648 B row (largest: 1073741824 B); run all_reduce_perf up to at least 2147483648 B"
    )


@pytest.mark.parametrize("profile, efa, layout", [("llm-finetune", 32, "efa"), ("qlora-finetune", 0, "ena")])
def test_efa_and_network_come_from_the_cluster_plan(profile, efa, layout):
    """`high_bandwidth_networking: off` (qlora-finetune): the blueprint attaches no EFA, so none is expected."""
    exp = expectations_for(spec_for("p5.48xlarge", 2, profile))
    assert (exp.efa_count, exp.nic_layout) == (efa, layout)


def test_healthy_p5_without_high_bandwidth_networking_passes():
    """No EFA attached: fi_info finds none (`fi_getinfo: -61`), NCCL uses sockets; the EFA baseline
    does not apply over ENA, so busbw is not checked."""
    health = evaluate(
        spec_for("p5.48xlarge", 2, "qlora-finetune"),
        _p5_outputs(fi_info="fi_getinfo: -61\n", nccl_log=t("nccl_info_no_plugin_nccltests131.txt")),
        node="n",
        checked_at=NOW,
    )
    checks = _by_name(health)
    assert checks["efa_devices"].passed is None
    assert checks["efa_devices"].detail == "not checked (the cluster plan attaches no EFA to p5.48xlarge)"
    assert checks["gpudirect_plugin"].passed is None
    assert checks["allreduce_busbw"].detail == "not checked (no baseline for p5.48xlarge on 2 nodes over ena)"
    assert health.passed


def test_gcp_network_comes_from_the_plan_too():
    # A3 High's TCPX: from a baked image only (rule fabric-installable-at-boot), else plain networking
    assert expectations_for(_baked(spec_for("a3-highgpu-8g"))).nic_layout == "tcpx"
    assert expectations_for(spec_for("a3-highgpu-8g")).nic_layout == "gvnic"
    off = expectations_for(spec_for("a3-highgpu-8g", 2, "qlora-finetune"))
    assert (off.nic_layout, off.efa_count, off.baseline) == ("gvnic", 0, None)


@pytest.mark.parametrize(
    "nodes, detail",
    [
        (4, "not checked (no baseline for p5.48xlarge on 4 nodes over efa)"),
        (1, "not checked (no baseline for p5.48xlarge on 1 node)"),
    ],
)
def test_a_baseline_is_used_only_for_the_node_count_it_measured(nodes, detail):
    """The 2-node p5 number is not used for 4 nodes (NVIDIA/nccl#1221: lower beyond 2 nodes), and
    the one-node 480 GB/s NVLS peak without a message size is not in the table."""
    exp = expectations_for(spec_for("p5.48xlarge", nodes))
    assert exp.baseline is None
    busbw = _by_name(decide(exp, _p5_outputs(), stack="s", node="n", checked_at=NOW))["allreduce_busbw"]
    assert (busbw.passed, busbw.detail) == (None, detail)
    assert baseline_nodes("aws", "p5.48xlarge") == (2,)


def test_types_without_nvswitch_or_baseline_are_not_checked():
    # g5.48xlarge: 8 x A10G, one EFA, no NVSwitch, no baseline in the table
    outputs = GateOutputs(
        nvidia_smi=t("nvidia_smi_query_gpu_8xH100_virtualclient.csv"),
        fi_info=t("fi_info_single_efa_libfabric5689.txt"),
        all_reduce=t(RUN_2X8),
        nccl_log=t("nccl_info_efa_p4d_awsefaeks.txt"),
    )
    health = evaluate(spec_for("g5.48xlarge"), outputs, node="n", checked_at=NOW)
    checks = _by_name(health)
    assert checks["nvlink"].passed is None and checks["nvlink"].detail == "not checked (g5.48xlarge has no NVSwitch)"
    assert checks["fabric_manager"].passed is None
    assert checks["efa_devices"].passed is True and checks["efa_devices"].measured == 1
    assert checks["allreduce_busbw"].passed is None
    assert checks["allreduce_busbw"].detail == "not checked (no baseline for g5.48xlarge on 2 nodes over efa)"
    assert health.passed


def test_gcp_n1_takes_the_specs_attached_gpus():
    """n1-standard-8 has no built-in GPU (facts.gpu_count 0): the spec's 2 x T4 are expected."""
    spec = spec_for("n1-standard-8", 1, "dev", gpus="2xT4")
    exp = expectations_for(spec)
    assert (exp.gpu_count, exp.nvswitch, exp.nic_layout) == (2, False, "gvnic")
    two = "\n".join(t("nvidia_smi_query_gpu_8xH100_virtualclient.csv").split("\n")[:3])
    checks = _by_name(evaluate(spec, GateOutputs(nvidia_smi=two), node="vm-1", checked_at=NOW))
    assert checks["gpu_count"].passed and checks["gpu_count"].detail == "2 of 2 GPUs visible (NVIDIA H100 80GB HBM3)"


def test_nvlink_count_per_gpu_is_checked_where_known():
    exp = expectations_for(spec_for("p4d.24xlarge"))
    assert exp.nvlinks_per_gpu is None  # the catalog facts give no NVLink count per GPU
    outputs = _p4d_outputs()
    twelve = _by_name(decide(replace(exp, nvlinks_per_gpu=12), outputs, stack="s", node="n"))["nvlink"]
    assert (twelve.passed, twelve.detail) == (True, "96 links active on 8 GPUs; 12 per GPU")
    eighteen = _by_name(decide(replace(exp, nvlinks_per_gpu=18), outputs, stack="s", node="n"))["nvlink"]
    assert eighteen.passed is False and eighteen.detail.startswith("GPU 0: 12 of 18 NVLinks listed; GPU 1: 12 of 18")


def test_gcp_tcpx_node_with_googles_example_run():
    """Google's example output has no rank list: allreduce_ranks fails and busbw is not compared
    (the 88.18 GB/s would pass); the rest passes."""
    outputs = GateOutputs(
        nvidia_smi=t("nvidia_smi_query_gpu_8xH100_virtualclient.csv"),
        nvlink_status=t("nvlink_status_p4de_8gpu_derived.txt"),
        fabric_manager="active",
        all_reduce=t("all_reduce_a3high_2node_gcp_tcpx.txt"),
        nccl_log=t("nccl_info_tcpx_skypilot.txt"),
    )
    exp = expectations_for(_baked(spec_for("a3-highgpu-8g")))
    health = decide(exp, outputs, stack="train", node="vm-1", checked_at=NOW)
    checks = _by_name(health)
    assert checks["efa_devices"].passed is None
    assert checks["gpudirect_plugin"].passed and checks["gpudirect_plugin"].expected == "GPUDirect-TCPX"
    # validation 0: the run could not find wrong elements
    assert checks["allreduce_correct"].passed is None
    assert checks["allreduce_complete"].passed
    assert [c.name for c in health.failed] == ["allreduce_ranks", "allreduce_busbw"]
    assert checks["allreduce_busbw"].detail.startswith("not compared until allreduce_ranks passes (no `# Rank` lines")
    # the same node expecting gIB (A3 Ultra's network) does not accept TCPX lines
    ultra = decide(replace(exp, nic_layout="gib"), outputs, stack="train", node="vm-1", checked_at=NOW)
    assert _by_name(ultra)["gpudirect_plugin"].detail == "no NCCL/gIB line in NCCL's INFO output, not NCCL/gIB"


def test_single_node_skips_the_plugin():
    checks = _by_name(evaluate(spec_for("p5.48xlarge", 1), _p5_outputs(), node="n", checked_at=NOW))
    assert checks["gpudirect_plugin"].passed is None


def test_expectations_round_trip():
    facts_type = "p5en.48xlarge"
    exp = expectations_for(spec_for(facts_type, 4))
    assert (exp.gpu_count, exp.efa_count, exp.nvswitch, exp.nic_layout) == (8, 16, True, "efa")
    assert exp.baseline is None and exp.busbw_pass_fraction == BUSBW_PASS_FRACTION and exp.ranks == 32
    assert Expectations.from_dict(json.loads(json.dumps(exp.to_dict()))) == exp
    p5 = replace(expectations_for(spec_for("p5.48xlarge")), nvlinks_per_gpu=18)
    assert Expectations.from_dict(json.loads(json.dumps(p5.to_dict()))) == p5


def test_node_health_round_trip_and_refusals():
    health = evaluate(spec_for("p4d.24xlarge"), _p4d_outputs(fabric_manager="failed"), node="i-0a", checked_at=NOW)
    doc = json.loads(health.to_json())
    assert doc["schema_version"] == "3" and doc["passed"] is False
    assert list(doc) == [
        "schema_version",
        "stack",
        "node",
        "cloud",
        "instance_type",
        "nodes",
        "checked_at",
        "stage",
        "address",
        "deployment",
        "checks",
        "passed",
    ]
    assert list(doc["checks"][0]) == ["name", "passed", "measured", "expected", "detail", "source"]
    assert NodeHealth.from_dict(doc) == health
    assert health_key("train", "i-0a") == "health/train/i-0a.json"
    with pytest.raises(ValueError, match="schema_version '2'"):  # written before the stages
        NodeHealth.from_dict({**doc, "schema_version": "2"})
    with pytest.raises(ValueError, match="stage 'boot' is not one of local, cluster"):
        NodeHealth.from_dict({**doc, "stage": "boot"})
    with pytest.raises(ValueError, match="passed is True but the checks say False"):
        NodeHealth.from_dict({**doc, "passed": True})
    with pytest.raises(ValueError, match="missing or invalid field"):
        NodeHealth.from_dict({k: v for k, v in doc.items() if k != "node"})
    with pytest.raises(ValueError, match="not a JSON object"):
        NodeHealth.from_dict([doc])
    without_ranks = [c for c in doc["checks"] if c["name"] != "allreduce_ranks"]
    with pytest.raises(ValueError, match="checks are gpu_count, .*allreduce_complete, .*not gpu_count"):
        NodeHealth.from_dict({**doc, "checks": without_ranks})


def test_baseline_table_rules():
    baselines = load_baselines()
    assert {(b.cloud, b.instance_type, b.nodes, b.nic_layout) for b in baselines} == {
        ("aws", "p4d.24xlarge", 2, "efa"),
        ("aws", "p4de.24xlarge", 2, "efa"),
        ("aws", "p5.48xlarge", 2, "efa"),
        ("gcp", "a3-highgpu-8g", 2, "tcpx"),
        ("gcp", "a3-megagpu-8g", 2, "tcpxo"),
    }
    from gpuinfra.catalog.store import load_catalog

    catalog = load_catalog()
    for b in baselines:
        facts = catalog.fact(b.cloud, b.instance_type)
        assert facts is not None and facts.nic_layout == b.nic_layout, b.instance_type
        assert b.busbw_gbps == min(o.busbw_gbps for o in b.observations)
        assert all(o.source.startswith("https://") and o.measured for o in b.observations)
        assert b.message_size_bytes == 2147483648
    assert find_baseline("aws", "p5.48xlarge", 2, "efa").busbw_gbps == 437.79
    assert find_baseline("aws", "p5.48xlarge", 2, "ena") is None
    assert find_baseline("aws", "p5.48xlarge", 4, "efa") is None
    assert find_baseline("gcp", "a3-ultragpu-8g", 2, "gib") is None


def test_baseline_entry_rules_are_enforced():
    entry = find_baseline("aws", "p5.48xlarge", 2, "efa").to_dict()
    assert Baseline.from_dict(entry) == find_baseline("aws", "p5.48xlarge", 2, "efa")
    with pytest.raises(ValueError, match="busbw_gbps must be the lowest observation"):
        Baseline.from_dict({**entry, "busbw_gbps": 444.02})
    with pytest.raises(ValueError, match="every observation needs a source"):
        Baseline.from_dict({**entry, "observations": [{**entry["observations"][0], "source": " "}]})
    with pytest.raises(ValueError, match="message_size_bytes is null"):
        Baseline.from_dict({**entry, "message_size_bytes": None})
    with pytest.raises(ValueError, match="nodes 1 needs scope intra_node"):
        Baseline.from_dict({**entry, "nodes": 1})


def test_local_stage_leaves_the_all_reduce_checks_pending():
    """Before ranks: the node's own checks decide; the all-reduce checks are pending, not failed
    (no all-reduce output was given, which the cluster stage fails)."""
    outputs = replace(_p4d_outputs(), all_reduce=None)
    local = decide(
        expectations_for(spec_for("p4d.24xlarge")),
        outputs,
        stack="train",
        node="i-0a",
        checked_at=NOW,
        stage="local",
        address="10.0.0.7",
    )
    assert local.passed and (local.stage, local.address) == ("local", "10.0.0.7")
    pending = [c.name for c in local.checks if c.passed is None and c.detail.startswith("pending:")]
    assert pending == [
        "gpudirect_plugin",
        "allreduce_ranks",
        "allreduce_complete",
        "allreduce_correct",
        "allreduce_busbw",
    ]
    cluster = decide(expectations_for(spec_for("p4d.24xlarge")), outputs, stack="train", node="i-0a", checked_at=NOW)
    assert not cluster.passed and cluster.check("allreduce_complete").passed is False
    broken = decide(
        expectations_for(spec_for("p4d.24xlarge")),
        replace(outputs, fabric_manager="failed"),
        stack="train",
        node="i-0a",
        checked_at=NOW,
        stage="local",
    )
    assert [c.name for c in broken.failed] == ["fabric_manager"]
    with pytest.raises(ValueError, match="stage 'boot'"):
        decide(expectations_for(spec_for("p4d.24xlarge")), outputs, stack="train", node="i-0a", stage="boot")
