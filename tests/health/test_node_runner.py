"""The health gate as a node runs it (gpuinfra/health/node.py) and the all-reduce table it reads
(gpuinfra/health/allreduce.py): local checks from recorded outputs, the upload, exclusion and
end of a failing node, which peers take a rank, and the cluster stage over a table in the
nccl-tests layout."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuinfra.errors import PreconditionFailed
from gpuinfra.health import parsers as p
from gpuinfra.health.allreduce import (
    SizeResult,
    bus_bandwidth_gbps,
    format_report,
    sizes,
)
from gpuinfra.health.gate import NodeHealth
from gpuinfra.health.node import (
    ALLREDUCE_CONTAINER,
    EXCLUDED_MARK,
    FAILED_MARK,
    PASSED_MARK,
    RANKS_DECIDED_MARK,
    Bucket,
    HealthNode,
    NodeConfig,
    cluster_size,
    collect_local,
    current_results,
    ranked_addresses,
)
from gpuinfra.plan.health import expectations_for
from tests.health.conftest import fixture_text, spec_for

GIB = 1 << 30
NCCL_EFA = "node-0:1:1 [0] NCCL INFO Using network AWS Libfabric\n"


def p4d_runner(fabric_manager="active\n", fi_info=None, all_reduce=""):
    """A fake command runner for a healthy p4d: argv -> (exit code, output)."""
    calls = []

    def run(argv, timeout):
        calls.append(argv)
        command = " ".join(argv)
        if command.startswith("nvidia-smi --query-gpu"):
            return 0, fixture_text("nvidia_smi_query_gpu_8xH100_virtualclient.csv")
        if command == "nvidia-smi nvlink -s":
            return 0, fixture_text("nvlink_status_p4de_8gpu_derived.txt")
        if command == "systemctl is-active nvidia-fabricmanager":
            return (0 if fabric_manager == "active\n" else 3), fabric_manager
        if command == "/opt/amazon/efa/bin/fi_info -p efa":
            return 0, fi_info if fi_info is not None else fixture_text("fi_info_p4d_awsdocs.txt")
        if argv[0] == "/usr/local/bin/gpuinfra-run":
            return 0, all_reduce
        if argv[:3] == ["docker", "rm", "-f"]:
            return 0, ""
        return 127, f"{argv[0]}: not found\n"

    run.calls = calls
    return run


class MemoryBucket(Bucket):
    """The bucket as a dict (the CLI argv are tested separately)."""

    def __init__(self):
        super().__init__("aws", "bkt", runner=None)
        self.objects: dict[str, bytes] = {}

    def put(self, key, path):
        self.objects[key] = Path(path).read_bytes()

    def put_new(self, key, path):
        """Create-only, as S3 If-None-Match: * / GCS ifGenerationMatch=0: 412 when the key exists."""
        if key in self.objects:
            raise PreconditionFailed(f"{self.url(key)} exists")
        self.put(key, path)

    def read_prefix(self, prefix):
        return {k: v for k, v in self.objects.items() if k.startswith(prefix)}


def make_node(tmp_path, runner, mode="enforce", node="i-0a", address="10.0.0.7", bucket=None, spec=None, **kw):
    ended = []
    health = HealthNode(
        NodeConfig("aws", "train", "bkt", mode),
        expectations_for(spec or spec_for("p4d.24xlarge")),
        node,
        address,
        bucket or MemoryBucket(),
        runner,
        tmp_path / "state",
        end_node=ended.append,
        kept_result=tmp_path / "kept" / "health-cluster.json",
        **kw,
    )
    return health, ended


def test_local_stage_runs_the_node_checks_and_uploads_them(tmp_path):
    runner = p4d_runner()
    node, ended = make_node(tmp_path, runner)
    health = node.local()
    assert health.passed and (health.stage, health.address, health.node) == ("local", "10.0.0.7", "i-0a")
    assert [c.name for c in health.checks if c.passed] == [
        "gpu_count",
        "ecc",
        "nvlink",
        "fabric_manager",
        "efa_devices",
    ]
    assert [" ".join(a) for a in runner.calls] == [
        p.NVIDIA_SMI_QUERY,
        "nvidia-smi nvlink -s",
        "systemctl is-active nvidia-fabricmanager",
        "/opt/amazon/efa/bin/fi_info -p efa",
    ]
    uploaded = NodeHealth.from_dict(json.loads(node.bucket.objects["health/train/i-0a.json"]))
    assert uploaded == health and not ended
    assert not (tmp_path / "state" / FAILED_MARK).exists()


def test_a_failing_node_is_excluded_and_ended_once_ranks_are_decided(tmp_path):
    missing_efa = fixture_text("fi_info_p4d_missing_one_derived.txt")
    node, ended = make_node(tmp_path, p4d_runner(fabric_manager="failed\n", fi_info=missing_efa))
    health = node.local()
    assert [c.name for c in health.failed] == ["fabric_manager", "efa_devices"]
    assert (tmp_path / "state" / EXCLUDED_MARK).exists() and (tmp_path / "state" / FAILED_MARK).exists()
    assert not ended  # not before the peers have decided the ranks: they would list one node fewer
    clock, sleeps = iter(range(0, 10_000, 10)), []
    node.clock, node.sleep = (
        (lambda: next(clock)),
        (lambda s: (sleeps.append(s), len(sleeps) == 3 and (tmp_path / "state" / RANKS_DECIDED_MARK).touch())),
    )
    node.end_when_ranks_decided(health, wait_seconds=600)
    assert len(sleeps) == 3 and len(ended) == 1
    assert ended[0].startswith("health gate failed: fabric_manager: nvidia-fabricmanager is failed")
    # no decision within the wait: ended anyway (it must not bill forever)
    late, ended_late = make_node(tmp_path / "late", p4d_runner(fabric_manager="failed\n"))
    late.clock, late.sleep = iter(range(0, 10_000, 10)).__next__, (lambda s: None)
    late.end_when_ranks_decided(late.local(), wait_seconds=60)
    assert len(ended_late) == 1
    # a failed end call leaves the marks (the node agent ends the node, retrying) and raises nothing
    failing, _ = make_node(tmp_path / "failing", p4d_runner(fabric_manager="failed\n"))
    failing.end_node = lambda reason: (_ for _ in ()).throw(subprocess.CalledProcessError(1, ["gcloud"]))
    failing.clock, failing.sleep = iter(range(0, 10_000, 10)).__next__, (lambda s: None)
    failing.end_when_ranks_decided(failing.local(), wait_seconds=60)
    marks = tmp_path / "failing" / "state"
    assert (marks / EXCLUDED_MARK).exists() and (marks / FAILED_MARK).read_text().startswith("fabric_manager:")
    # report: recorded, the node trains on
    node, ended = make_node(tmp_path / "report", p4d_runner(fabric_manager="failed\n"), mode="report")
    assert not node.local().passed and not ended and not (tmp_path / "report" / "state" / EXCLUDED_MARK).exists()
    # no verdict yet: the node takes a rank and the verdict comes from the cluster stage (a verdict
    # now would start the agent's idle clock and let gpuinfra-run start beside the gate's all-reduce)
    assert not (tmp_path / "report" / "state" / FAILED_MARK).exists()


def _doc(node, address, passed=True, checked_at=None, stage="local"):
    runner = p4d_runner(fabric_manager="active\n" if passed else "failed\n")
    health = make_node(Path("/nonexistent"), runner, node=node, address=address)[0]._decide(
        collect_local(expectations_for(spec_for("p4d.24xlarge")), runner), stage
    )
    if checked_at:
        health = NodeHealth(
            health.stack,
            health.node,
            health.cloud,
            health.instance_type,
            health.nodes,
            checked_at,
            health.checks,
            health.stage,
            health.address,
        )
    return health.to_json().encode()


def test_only_nodes_that_passed_take_a_rank(tmp_path):
    bucket = MemoryBucket()
    bucket.objects = {
        "health/train/i-0a.json": _doc("i-0a", "10.0.0.7"),
        "health/train/i-0b.json": _doc("i-0b", "10.0.0.20", passed=False),
    }
    node, _ = make_node(tmp_path, p4d_runner(), bucket=bucket)
    assert node.peers(["10.0.0.7", "10.0.0.20"], wait_seconds=0) == ["10.0.0.7"]
    # report: everyone at once, without waiting for results
    node.config = NodeConfig("aws", "train", "bkt", "report")
    node.sleep = lambda s: pytest.fail("report mode must not wait")
    assert node.peers(["10.0.0.7", "10.0.0.20", "10.0.0.9"], wait_seconds=600) == ["10.0.0.7", "10.0.0.20", "10.0.0.9"]


def test_peers_wait_for_every_result_then_leave_out_the_silent_node(tmp_path):
    bucket = MemoryBucket()
    bucket.objects = {"health/train/i-0a.json": _doc("i-0a", "10.0.0.7")}
    clock = iter(range(0, 10_000, 15))
    node, _ = make_node(tmp_path, p4d_runner(), bucket=bucket)
    node.clock, sleeps = (lambda: next(clock)), []
    node.sleep = sleeps.append
    ranked = node.peers(["10.0.0.7", "10.0.0.20"], wait_seconds=60, poll_seconds=15)
    assert ranked == ["10.0.0.7"] and sleeps == [15, 15, 15]  # 60 s at 15 s a round


def test_results_from_before_this_deployment_do_not_count():
    booted = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    docs = {
        "a": _doc("i-old", "10.0.0.7", checked_at="2026-11-20T09:00:00+00:00"),
        "b": _doc("i-0b", "10.0.0.20", checked_at="2026-11-23T11:58:00+00:00"),
        "c": b"not json",
    }
    found = current_results(docs, "train", booted - timedelta(hours=1))
    assert list(found) == ["10.0.0.20"]
    assert ranked_addresses(["10.0.0.7", "10.0.0.20"], found, "enforce") == ["10.0.0.20"]


def _table(busbw_gbps: float, ranks: int = 16, wrong: int = 0, hosts=("node-0", "node-1")) -> str:
    """An all-reduce run whose 2 GiB row reaches ``busbw_gbps``."""
    size_list = sizes(1 << 20, 2 * GIB)
    factor = 2 * (ranks - 1) / ranks
    results = [SizeResult(s, s / (busbw_gbps / factor * 1e9) * 1e6, wrong) for s in size_list]
    devices = [(r, hosts[r * len(hosts) // ranks], r % 8, "NVIDIA A100-SXM4-40GB") for r in range(ranks)]
    return format_report(results, devices, min_bytes=1 << 20, max_bytes=2 * GIB, warmup=5, iters=20)


def test_the_all_reduce_table_reads_back_with_the_all_reduce_perf_parser():
    text = _table(90.0)
    run = p.parse_all_reduce(text)
    assert (run.ranks, run.hosts, len(run.rows)) == (16, ("node-0", "node-1"), 12)
    row = run.at_size(2 * GIB)
    assert row.oop_busbw_gbps == 90.0 and row.oop_wrong == 0 and row.ip_busbw_gbps is None
    assert run.has_footer and run.sizes_done and run.out_of_bounds == 0
    # nccl-tests doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n
    assert bus_bandwidth_gbps(2 * GIB, 1e6, 16) == pytest.approx((2.147483648, 2.147483648 * 30 / 16))
    assert bus_bandwidth_gbps(GIB, 1e6, 1)[1] == 0.0
    with pytest.raises(ValueError, match="4 <= min <= max"):
        sizes(2, 8)


def test_cluster_stage_passes_at_the_baseline_and_fails_below_it(tmp_path):
    baseline = expectations_for(spec_for("p4d.24xlarge")).baseline  # 77.35 GB/s at 2 GiB, 2 x p4d
    node, _ = make_node(tmp_path, p4d_runner(all_reduce=NCCL_EFA + _table(baseline.busbw_gbps)))
    node.local()
    health = node.cluster()
    assert health.passed and health.stage == "cluster", [c.detail for c in health.failed]
    assert health.check("allreduce_busbw").measured == baseline.busbw_gbps
    assert (tmp_path / "state" / PASSED_MARK).exists() and not (tmp_path / "state" / FAILED_MARK).exists()
    run = next(a for a in node.runner.calls if a[0] == "/usr/local/bin/gpuinfra-run")
    # a named container (removed before, and after a timeout), the image's entrypoint bypassed
    # (an inference image's entrypoint would take torchrun as its arguments)
    assert run == [
        "/usr/local/bin/gpuinfra-run",
        "--skip-health-gate",
        "--no-restore-wait",
        "--wait",
        "60",
        "--name",
        ALLREDUCE_CONTAINER,
        "--entrypoint",
        "env",
        "-e",
        "NCCL_DEBUG=INFO",
        "-e",
        "NCCL_DEBUG_SUBSYS=INIT,NET",
        "--",
        "python3",
        "gpuinfra_allreduce.py",
    ]
    assert ["docker", "rm", "-f", ALLREDUCE_CONTAINER] in node.runner.calls
    slow, _ = make_node(tmp_path / "slow", p4d_runner(all_reduce=NCCL_EFA + _table(0.5 * baseline.busbw_gbps)))
    slow.local()
    low = slow.cluster()
    assert [c.name for c in low.failed] == ["allreduce_busbw"]
    assert (tmp_path / "slow" / "state" / FAILED_MARK).read_text().startswith("allreduce_busbw: 38.68 GB/s")
    # a run over sockets is a failed plugin check, whatever the bandwidth
    sockets, _ = make_node(tmp_path / "sock", p4d_runner(all_reduce="x NCCL INFO Using network Socket\n" + _table(80)))
    sockets.local()
    assert [c.name for c in sockets.cluster().failed] == ["gpudirect_plugin"]


def test_bucket_commands_use_the_clouds_clis(tmp_path):
    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        return 0, ""

    (tmp_path / "h.json").write_text("{}")
    Bucket("aws", "bkt", runner).put("health/train/i-0a.json", tmp_path / "h.json")
    Bucket("gcp", "bkt", runner).put("health/train/vm-1.json", tmp_path / "h.json")
    assert calls == [
        ["aws", "s3", "cp", "--only-show-errors", str(tmp_path / "h.json"), "s3://bkt/health/train/i-0a.json"],
        ["gcloud", "storage", "cp", str(tmp_path / "h.json"), "gs://bkt/health/train/vm-1.json"],
    ]
    with pytest.raises(OSError, match="upload to s3://bkt/x failed"):
        Bucket("aws", "bkt", lambda argv, timeout: (1, "AccessDenied")).put("x", tmp_path / "h.json")
    # create-only: S3 If-None-Match: * (AWS CLI >= 2.17.34 / 1.34.2), GCS generation 0
    calls.clear()
    Bucket("aws", "bkt", runner).put_new("health/train/r.decision", tmp_path / "h.json")
    Bucket("gcp", "bkt", runner).put_new("health/train/r.decision", tmp_path / "h.json")
    assert calls == [
        [
            "aws",
            "s3api",
            "put-object",
            "--bucket",
            "bkt",
            "--key",
            "health/train/r.decision",
            "--body",
            str(tmp_path / "h.json"),
            "--if-none-match",
            "*",
        ],
        [
            "gcloud",
            "storage",
            "cp",
            "--if-generation-match=0",
            str(tmp_path / "h.json"),
            "gs://bkt/health/train/r.decision",
        ],
    ]
    assert Bucket("gcp", "bkt", lambda argv, timeout: (1, "ERROR: matched no objects")).read_prefix("health/t/") == {}


def test_node_env_mode_is_checked():
    env = {"GPUINFRA_CLOUD": "aws", "GPUINFRA_STACK": "train", "GPUINFRA_BUCKET": "b"}
    assert NodeConfig.from_env(env).mode == "off"
    assert NodeConfig.from_env({**env, "GPUINFRA_HEALTH_GATE": "enforce"}).mode == "enforce"
    with pytest.raises(ValueError, match="GPUINFRA_HEALTH_GATE='strict', allowed: enforce, report, off"):
        NodeConfig.from_env({**env, "GPUINFRA_HEALTH_GATE": "strict"})


def test_a_world_the_gate_shrank_is_checked_as_such(tmp_path):
    """3 nodes planned, one left out by the gate: the all-reduce runs on 2 x 8 ranks and is checked
    against 2 nodes (and the 2-node baseline the expectations file carries), not against 3."""
    spec3 = spec_for("p4d.24xlarge", 3)
    two_node = expectations_for(spec_for("p4d.24xlarge")).baseline
    node, _ = make_node(
        tmp_path,
        p4d_runner(all_reduce=NCCL_EFA + _table(two_node.busbw_gbps)),
        spec=spec3,
        world_baselines={2: two_node.to_dict()},
    )
    node.local()
    health = node.cluster(2)
    assert health.passed, [c.detail for c in health.failed]
    assert health.check("allreduce_ranks").detail.startswith("16 ranks on 2 hosts (2 nodes x 8 GPUs")
    assert health.check("allreduce_busbw").expected == two_node.busbw_gbps
    # without the shrink, the same run is 16 of 24 ranks
    node3, _ = make_node(tmp_path / "n3", p4d_runner(all_reduce=NCCL_EFA + _table(two_node.busbw_gbps)), spec=spec3)
    node3.local()
    assert "allreduce_ranks" in [c.name for c in node3.cluster(3).failed]
    (tmp_path / "cluster.env").write_text("NNODES=2\nNODE_RANK=1\n")
    assert cluster_size(tmp_path / "cluster.env") == 2 and cluster_size(tmp_path / "absent") is None


def test_after_a_reboot_the_kept_all_reduce_counts_with_fresh_local_checks(tmp_path):
    baseline = expectations_for(spec_for("p4d.24xlarge")).baseline
    node, _ = make_node(tmp_path, p4d_runner(all_reduce=NCCL_EFA + _table(baseline.busbw_gbps)))
    assert node.rejoin(node.local()) is None  # first boot: nothing kept, the cluster stage runs
    first = node.cluster()
    assert first.passed and not node.kept_result.exists()  # kept only once the verdict is collective
    node.await_peers(first, ["10.0.0.7"], datetime.now(UTC) - timedelta(minutes=1), wait_seconds=0)
    assert node.kept_result.exists()
    # the reboot: /run is empty again, the peers do not run the all-reduce again
    rebooted, _ = make_node(tmp_path, p4d_runner(all_reduce="should not run"))
    again = rebooted.rejoin(rebooted.local())
    assert again.passed and again.stage == "cluster"
    assert again.check("allreduce_busbw").measured == first.check("allreduce_busbw").measured
    assert again.check("allreduce_busbw").detail.endswith(
        f"(cluster all-reduce of {first.checked_at}, before a reboot)"
    )
    assert not any(a[0] == "/usr/local/bin/gpuinfra-run" for a in rebooted.runner.calls)
    assert (tmp_path / "state" / PASSED_MARK).exists()
    # a broken GPU after the reboot fails the node whatever the kept all-reduce said
    broken, _ = make_node(tmp_path, p4d_runner(fabric_manager="failed\n"))
    assert [c.name for c in broken.rejoin(broken.local()).failed] == ["fabric_manager"]


def test_a_peer_that_failed_the_cluster_stage_fails_this_node_too(tmp_path):
    """The job is collective: a node whose own all-reduce passed still refuses to train when a
    ranked peer's cluster result failed or never came."""
    baseline = expectations_for(spec_for("p4d.24xlarge")).baseline
    bucket = MemoryBucket()
    node, _ = make_node(tmp_path, p4d_runner(all_reduce=NCCL_EFA + _table(baseline.busbw_gbps)), bucket=bucket)
    node.local()
    since = datetime.now(UTC) - timedelta(minutes=1)
    mine = node.cluster()
    peer, _ = make_node(
        tmp_path / "peer",
        p4d_runner(all_reduce="x NCCL INFO Using network Socket\n" + _table(80)),
        bucket=bucket,
        node="i-0b",
        address="10.0.0.20",
    )
    peer.local()
    assert not peer.cluster().passed
    node.await_peers(mine, ["10.0.0.7", "10.0.0.20"], since, wait_seconds=0)
    verdict = (tmp_path / "state" / FAILED_MARK).read_text()
    assert verdict.startswith("peer 10.0.0.20 (gpudirect_plugin: ") and not (tmp_path / "state" / PASSED_MARK).exists()
    assert not node.kept_result.exists()  # a reboot must not bring this "pass" back
    # a peer that never reports
    lone, _ = make_node(tmp_path / "lone", p4d_runner(all_reduce=NCCL_EFA + _table(baseline.busbw_gbps)))
    lone.local()
    lone.await_peers(lone.cluster(), ["10.0.0.7", "10.0.0.99"], since, wait_seconds=0)
    assert (tmp_path / "lone" / "state" / FAILED_MARK).read_text() == "no cluster result from 10.0.0.99\n"
