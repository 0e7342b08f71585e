"""Node in a box: the example stacks' real boot text booted under systemd (:mod:`tests.box.box`).

Each test is one scenario (:mod:`tests.box.scenario`): it boots the stack's nodes, waits for
what the node software must do, and asserts the exact outcome (ranks, verdicts, recorded cloud
calls). Wall times go to the pytest summary.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.box.box import EXIT_REBOOT, Box
from tests.box.render import BUNDLE_PREFIX, baked_variant, render_boot, stack_spec
from tests.box.scenario import Scenario, aws_p5, gcp_a3mega, healthy_a3mega

pytestmark = [pytest.mark.box]

#: Seconds from boot to ranks and a health verdict on every node (2 cores shared: generous).
BOOT_SECONDS = 300


def make_box(rootfs: Path, scenario: Scenario, workdir: Path, spec=None) -> Box:
    """A box for ``scenario``'s stack (or ``spec``, a changed copy of it), its boot text rendered
    by the real renderers."""
    spec = spec or stack_spec(scenario.stack)
    bucket = f"{spec.stack}-box"
    boot = render_boot(spec, bucket)
    zone = spec.zone or ""
    nodes = scenario.nodes or spec.nodes
    return Box(rootfs, scenario, boot, nodes, bucket, spec.region, zone, boot.efa_devices, workdir)


def env_file(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def wait_ranked_and_passed(box: Box, nodes=None) -> list[dict[str, str]]:
    """Wait until every node (default: all) has cluster.env and a health verdict; a failed
    verdict fails the test at once. Returns the nodes' cluster.env."""
    nodes = nodes or box.nodes

    def done():
        for node in nodes:
            failed = node.read("/run/gpuinfra/health-failed")
            if failed is not None:
                raise AssertionError(f"{node.name}: health gate failed: {failed}\n{node.diagnostics()}")
            if not node.running():
                raise AssertionError(f"{node.name} exited ({node.proc.returncode})\n{node.diagnostics()}")
        envs = [node.read("/etc/gpuinfra/cluster.env") for node in nodes]
        passed = [node.read("/run/gpuinfra/health-passed") for node in nodes]
        return [env_file(e) for e in envs] if all(envs) and all(p is not None for p in passed) else None

    return box.wait_for("ranks and a passed health gate on every node", done, BOOT_SECONDS, poll=2)


def assert_two_node_ranks(box: Box, envs: list[dict[str, str]], port: str) -> None:
    """Node 0 (10.77.0.11) rank 0, node 1 rank 1, the same world, hostfile in rank order."""
    first, second = box.nodes
    assert envs == [
        {"NNODES": "2", "NODE_RANK": str(i), "NPROC_PER_NODE": "8", "MASTER_ADDR": first.ip, "MASTER_PORT": port}
        for i in range(2)
    ]
    for node in box.nodes:
        assert node.read("/etc/gpuinfra/hostfile") == f"{first.ip}\n{second.ip}\n"


def health_results(box: Box, stack: str) -> dict[str, dict]:
    """The health results the nodes uploaded: object name -> document."""
    root = box.state / "bucket" / box.bucket / "health" / stack
    return {p.name: json.loads(p.read_text()) for p in sorted(root.glob("*.json"))}


def verdicts(results: dict[str, dict]) -> dict[str, tuple]:
    """Object name -> (stage, address, passed, names of failed checks) of the nodes' results."""
    return {
        k: (r["stage"], r["address"], r["passed"], [c["name"] for c in r["checks"] if c["passed"] is False])
        for k, r in results.items()
    }


def calls_of(box: Box, prefix: list[str]) -> list[tuple[str, list[str]]]:
    """(node, argv) of the recorded calls whose argv starts with ``prefix``."""
    return [(c["node"], c["argv"]) for c in box.calls() if c["argv"][: len(prefix)] == prefix]


def peer_reads(box: Box, node: str) -> tuple[int, int, int]:
    """``node``'s (peer-discovery rounds, ``instances list`` calls, ``instances describe`` calls):
    a round is one ``gcloud storage ls`` of the stack's ``gpuinfra-peers/`` prefix."""
    calls = [argv for who, argv in calls_of(box, ["gcloud"]) if who == node]
    rounds = sum(
        1 for a in calls if a[1:3] == ["storage", "ls"] and "/gpuinfra-peers/" in a[3] and a[3].endswith("/**")
    )
    lists = sum(1 for a in calls if a[1:4] == ["compute", "instances", "list"])
    describes = sum(1 for a in calls if a[1:4] == ["compute", "instances", "describe"])
    return rounds, lists, describes


def test_aws_p5_two_nodes_boot_to_ranks_and_a_passed_health_gate(box_rootfs, box_timer, tmp_path):
    scenario = aws_p5()
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        envs = wait_ranked_and_passed(box)
        assert_two_node_ranks(box, envs, "29500")
        stack = stack_spec(scenario.stack).stack
        fetches = calls_of(box, ["aws", "s3", "cp"])
        for node in box.nodes:
            assert (
                node.name,
                [
                    "aws",
                    "s3",
                    "cp",
                    "--only-show-errors",
                    "--region",
                    "us-east-1",
                    f"s3://{box.bucket}/{box.boot.bundle_key}",
                    "/run/gpuinfra/node-bundle.json.tmp",
                ],
            ) in fetches
        describe = [
            "aws",
            "ec2",
            "describe-instances",
            "--region",
            "us-east-1",
            "--filters",
            # the stack's own id (name and name suffix), never the bare name every same-named stack has
            f"Name=tag:gpuinfra:stack-id,Values={stack}-{stack_spec(scenario.stack).name_suffix}",
            "Name=instance-state-name,Values=pending,running",
            "--query",
            "Reservations[].Instances[].PrivateIpAddress",
            "--output",
            "text",
        ]
        assert {n for n, argv in calls_of(box, ["aws", "ec2"]) if argv == describe} == {n.name for n in box.nodes}
        results = health_results(box, stack)
        assert verdicts(results) == {f"{n.name}.json": ("cluster", n.ip, True, []) for n in box.nodes}
        assert not [c for c in box.calls() if c["argv"][0] == "shutdown"]


def test_gcp_a3mega_two_nodes_boot_to_ranks_and_a_passed_health_gate(box_rootfs, box_timer, tmp_path):
    scenario = gcp_a3mega()
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        envs = wait_ranked_and_passed(box)
        assert_two_node_ranks(box, envs, "29500")
        spec = stack_spec(scenario.stack)
        for node in box.nodes:
            assert (
                node.name,
                [
                    "gcloud",
                    "storage",
                    "cp",
                    f"gs://{box.bucket}/{box.boot.bundle_key}",
                    "/run/gpuinfra/node-bundle.json.tmp",
                ],
            ) in calls_of(box, ["gcloud", "storage", "cp"])
            assert (
                node.name,
                [
                    "gcloud",
                    "storage",
                    "cp",
                    "-",
                    f"gs://{box.bucket}/gpuinfra-peers/{box.boot.group}/{node.name}/{node.ip}",
                    "--quiet",
                ],
            ) in calls_of(box, ["gcloud", "storage", "cp", "-"])
        listing = [
            "gcloud",
            "compute",
            "instance-groups",
            "managed",
            "list-instances",
            box.boot.group,
            "--zone",
            spec.zone,
            "--filter=instanceStatus=RUNNING",
            "--format=value(instance.basename())",
        ]
        assert {n for n, argv in calls_of(box, listing[:5]) if argv == listing} == {n.name for n in box.nodes}
        results = health_results(box, spec.stack)
        assert verdicts(results) == {f"{n.name}.json": ("cluster", n.ip, True, []) for n in box.nodes}
        assert not calls_of(box, ["gcloud", "compute", "instance-groups", "managed", "delete-instances"])
        # the pre-pull unit pulled the profile's image once per node, before the gate ran
        pulls = calls_of(box, ["docker", "pull"])
        assert sorted(pulls) == sorted((n.name, ["docker", "pull", spec.profile.container_image]) for n in box.nodes)
        for node in box.nodes:
            pulled = min(c["t"] for c in box.calls() if c["node"] == node.name and c["argv"][:2] == ["docker", "pull"])
            all_reduce = [
                c["t"]
                for c in box.calls()
                if c["node"] == node.name
                and c["argv"][:2] == ["docker", "run"]
                and any(a.endswith("gpuinfra_allreduce.py") for a in c["argv"])
            ]
            assert all_reduce and pulled < min(all_reduce)


def test_aws_node_reboots_and_rejoins_with_the_same_ranks(box_rootfs, box_timer, tmp_path):
    with make_box(box_rootfs, aws_p5(), tmp_path) as box:
        box.start()
        before = wait_ranked_and_passed(box)
        node = box.nodes[1]
        # the verdict is marked before the node keeps its result (once every peer's is in the bucket)
        box.wait_for("the kept cluster result", lambda: node.read("/var/lib/gpuinfra/health-cluster.json"), 60)
        node.exec(["systemctl", "reboot"], check=False)
        assert node.wait_exit(120) == EXIT_REBOOT
        node.start()
        box.wait_for("the rebooted node's new boot", lambda: node.read("/run/gpuinfra/node-bundle.json"), 120)
        after = wait_ranked_and_passed(box, [node])
        assert after == [before[1]]
        assert node.read("/var/lib/gpuinfra/ranked-hostfile") == f"{box.nodes[0].ip}\n{node.ip}\n"
        assert box.nodes[0].running() and node.boots == 2
        # the bundle was fetched once: the reboot installed the verified copy kept on the disk; the
        # all-reduce ran once: after the reboot the gate rejoined with its kept cluster result
        # (gpuinfra/health/node.py HealthNode.rejoin)
        assert (
            len(
                [
                    1
                    for n, argv in calls_of(box, ["aws", "s3", "cp"])
                    if n == node.name and argv[-2] == f"s3://{box.bucket}/{box.boot.bundle_key}"
                ]
            )
            == 1
        )
        assert node.read("/var/lib/gpuinfra/node-bundle.json") == box.boot.bundle
        assert (
            len(
                [
                    1
                    for n, argv in calls_of(box, ["docker", "run"])
                    if n == node.name and any(a.endswith("gpuinfra_allreduce.py") for a in argv)
                ]
            )
            == 1
        )


def test_gcp_agent_ends_idle_nodes_through_the_managed_instance_group(box_rootfs, box_timer, tmp_path):
    scenario = Scenario(**{**gcp_a3mega().__dict__, "node_env": {"GPUINFRA_IDLE_TIMEOUT_MINUTES": "0.05"}})
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        codes = [node.wait_exit(BOOT_SECONDS) for node in box.nodes]
        assert codes == [0, 0]  # powered off, not rebooted or killed
        spec = stack_spec(scenario.stack)
        assert verdicts(health_results(box, spec.stack)) == {
            f"{n.name}.json": ("cluster", n.ip, True, []) for n in box.nodes
        }
        assert sorted(calls_of(box, ["gcloud", "compute", "instance-groups", "managed", "delete-instances"])) == sorted(
            (
                n.name,
                [
                    "gcloud",
                    "compute",
                    "instance-groups",
                    "managed",
                    "delete-instances",
                    box.boot.group,
                    f"--instances={n.name}",
                    f"--zone={spec.zone}",
                    "--quiet",
                ],
            )
            for n in box.nodes
        )


def test_gcp_agent_ends_idle_bulk_vms_by_deleting_them(box_rootfs, box_timer, tmp_path):
    """The VMs of a bulk insert (``<group>-n000`` ..., no ``created-by``, not group members) find
    each other by name, pass the gate together and, idle, each delete themselves through the
    instances API (the group would not know them)."""
    scenario = Scenario(
        **{**gcp_a3mega().__dict__, "node_env": {"GPUINFRA_IDLE_TIMEOUT_MINUTES": "0.05"}, "gcp_bulk": True}
    )
    with make_box(box_rootfs, scenario, tmp_path) as box:
        spec = stack_spec(scenario.stack)
        assert [n.name for n in box.nodes] == [f"{box.boot.group}-n000", f"{box.boot.group}-n001"]
        box.start()
        codes = [node.wait_exit(BOOT_SECONDS) for node in box.nodes]
        assert codes == [0, 0]  # powered off, not rebooted or killed
        assert verdicts(health_results(box, spec.stack)) == {
            f"{n.name}.json": ("cluster", n.ip, True, []) for n in box.nodes
        }
        assert sorted(calls_of(box, ["gcloud", "compute", "instances", "delete"])) == sorted(
            (n.name, ["gcloud", "compute", "instances", "delete", n.name, f"--zone={spec.zone}", "--quiet"])
            for n in box.nodes
        )
        assert not calls_of(box, DELETE)
        # each found its peer by name (the group listed neither), reading a name seen RUNNING
        # again only in the round that completes the count: at most 2 reads a name plus one a
        # round, not one a name every round
        described = {(n, argv[4]) for n, argv in calls_of(box, ["gcloud", "compute", "instances", "describe"])}
        assert {(a.name, b.name) for a in box.nodes for b in box.nodes} <= described
        for node in box.nodes:
            rounds, lists, describes = peer_reads(box, node.name)
            assert lists == 0 and describes <= 2 * len(box.nodes) + rounds, (node.name, rounds, describes)


def test_aws_agent_ends_idle_nodes_with_an_instance_initiated_shutdown(box_rootfs, box_timer, tmp_path):
    scenario = Scenario(**{**aws_p5().__dict__, "node_env": {"GPUINFRA_IDLE_TIMEOUT_MINUTES": "0.05"}})
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        codes = [node.wait_exit(BOOT_SECONDS) for node in box.nodes]
        assert codes == [0, 0]  # powered off, not rebooted or killed
        assert verdicts(health_results(box, stack_spec(scenario.stack).stack)) == {
            f"{n.name}.json": ("cluster", n.ip, True, []) for n in box.nodes
        }
        assert sorted(calls_of(box, ["shutdown"])) == sorted(
            (n.name, ["shutdown", "-h", "now", "gpuinfra agent: idle"]) for n in box.nodes
        )


#: The agent's module of the node bundle (hang and Xid checks), on the node once the bundle is in.
WATCH_PATH = "/usr/local/lib/gpuinfra/gpuinfra/agent/watch.py"
DELETE = ["gcloud", "compute", "instance-groups", "managed", "delete-instances"]


def variant(base: Scenario, **changes) -> Scenario:
    """``base`` with ``changes`` (one node, the gate off and node_env merged unless given)."""
    node_env = {"GPUINFRA_HEALTH_GATE": "off", **changes.pop("node_env", {})}
    return Scenario(**{**base.__dict__, "nodes": 1, "node_env": node_env, **changes})


def ended_at(box: Box, timeout: float) -> float:
    """Wait for the one node to power off (nspawn exit 0, not a reboot or a kill); the time."""
    assert box.nodes[0].wait_exit(timeout) == 0, box.nodes[0].diagnostics()
    return time.time()


def test_gcp_agent_keeps_trying_after_a_failed_end_call(box_rootfs, box_timer, fault_row, tmp_path):
    pattern = " ".join(DELETE) + " *"
    scenario = variant(gcp_a3mega(), node_env={"GPUINFRA_IDLE_TIMEOUT_MINUTES": "0.05"}, failing_calls=((pattern, 3),))
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        end = ended_at(box, BOOT_SECONDS)
        deletes = [c for c in box.calls() if c["argv"][:5] == DELETE]
        # three failures, then the call that deleted the VM; the agent never exited in between
        assert [c["rc"] for c in deletes] == [1, 1, 1, 0]
        assert not calls_of(box, ["shutdown"])
        # END_RETRY_SECONDS: 5, 10, 20 s after the failures (the agent polls every 5 s)
        gaps = [b["t"] - a["t"] for a, b in zip(deletes, deletes[1:], strict=False)]
        assert all(w - 1 <= g < w + 6 for g, w in zip(gaps, (5, 10, 20), strict=True)), gaps
        fault_row("end call (delete-instances) fails 3 times", "deleted on the 4th try", end - deletes[0]["t"])


def test_aws_failing_nvidia_smi_is_a_gpu_fault_that_ends_the_node(box_rootfs, box_timer, fault_row, tmp_path):
    scenario = variant(aws_p5(), failing_calls=("nvidia-smi *",))
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        end = ended_at(box, 180)
        reads = [c for c in box.calls() if c["argv"][0] == "nvidia-smi"]
        assert reads and all(c["rc"] == 1 for c in reads)
        assert calls_of(box, ["shutdown"]) == [
            (box.nodes[0].name, ["shutdown", "-h", "now", "gpuinfra agent: gpu-fault"])
        ]
        # GPU_FAULT_SECONDS (60 s) of failed reads, then the end
        assert 60 <= end - reads[0]["t"] < 90
        fault_row("nvidia-smi exits 1", "gpu fault: shutdown", end - reads[0]["t"])


def test_gcp_xid_79_in_the_kernel_log_ends_the_node(box_rootfs, box_timer, fault_row, tmp_path):
    with make_box(box_rootfs, variant(gcp_a3mega()), tmp_path) as box:
        box.start()
        node = box.nodes[0]
        box.wait_for("the node bundle's job watch", lambda: node.read(WATCH_PATH), BOOT_SECONDS)
        time.sleep(10)  # the agent runs with its watch: the GPUs read fine and nothing ends it
        assert node.running() and not [c for c in box.calls() if c["argv"][:5] == DELETE]
        injected = time.time()
        node.kernel_message("NVRM: Xid (PCI:0000:53:00): 79, pid=1912, name=python, GPU has fallen off the bus.")
        end = ended_at(box, 60)
        deletes = [c for c in box.calls() if c["argv"][:5] == DELETE]
        assert len(deletes) == 1 and deletes[0]["rc"] == 0 and deletes[0]["t"] > injected
        fault_row("Xid 79 in the kernel log", "gpu fault: deleted", end - injected)


def test_aws_gate_without_a_verdict_counts_as_failed_and_the_idle_node_ends(box_rootfs, box_timer, fault_row, tmp_path):
    # the bundle never arrives, so no gate unit ever runs and no verdict is written
    scenario = variant(
        aws_p5(),
        node_env={
            "GPUINFRA_HEALTH_GATE": "enforce",
            "GPUINFRA_HEALTH_WAIT_SECONDS": "20",
            "GPUINFRA_IDLE_TIMEOUT_MINUTES": "0.05",
        },
        failing_calls=(f"aws s3 cp * s3://*/{BUNDLE_PREFIX}node-bundle-* *",),
    )
    with make_box(box_rootfs, scenario, tmp_path) as box:
        started = time.time()
        box.start()
        node = box.nodes[0]
        failed = box.wait_for("the agent's failed verdict", lambda: node.read("/run/gpuinfra/health-failed"), 120)
        assert failed == "no health verdict within 20 s of the agent's start\n"
        end = ended_at(box, 60)
        assert calls_of(box, ["shutdown"]) == [(node.name, ["shutdown", "-h", "now", "gpuinfra agent: idle"])]
        assert not list((box.state / "bucket" / box.bucket).glob("health/**/*.json"))
        fault_row("no health verdict (bound 20 s)", "gate failed, idle end", end - started)


def test_aws_tampered_bundle_is_refused_and_the_idle_node_ends(box_rootfs, box_timer, fault_row, tmp_path):
    # someone with write access to the bucket rewrote the bundle object after `up`: one more file
    scenario = variant(aws_p5(), node_env={"GPUINFRA_HEALTH_GATE": "enforce", "GPUINFRA_IDLE_TIMEOUT_MINUTES": "0.25"})
    with make_box(box_rootfs, scenario, tmp_path) as box:
        obj = box.state / "bucket" / box.bucket / box.boot.bundle_key
        doc = json.loads(obj.read_text())
        doc["files"].append({"path": "/etc/gpuinfra/tampered", "mode": "0755", "content": "#!/bin/sh\n"})
        obj.write_text(json.dumps(doc))
        started = time.time()
        box.start()
        node = box.nodes[0]
        failed = box.wait_for("the refused bundle's verdict", lambda: node.read("/run/gpuinfra/health-failed"), 120)
        assert failed.startswith(f"node bundle refused: s3://{box.bucket}/{box.boot.bundle_key} has SHA-256 ")
        pinned, got = (hashlib.sha256(t.encode()).hexdigest() for t in (box.boot.bundle, obj.read_text()))
        assert failed.endswith(f" has SHA-256 {got}, this deployment's is {pinned}; nothing from it was run\n")
        end = ended_at(box, 90)
        assert calls_of(box, ["shutdown"]) == [(node.name, ["shutdown", "-h", "now", "gpuinfra agent: idle"])]
        disk = node.dir / "upper"
        for path in ("etc/gpuinfra/tampered", "usr/local/bin/gpuinfra-run", "var/lib/gpuinfra/node-bundle.json"):
            assert not (disk / path).exists(), path  # nothing of the bundle was written, nor kept
        assert not list((box.state / "bucket" / box.bucket).glob("health/**/*.json"))
        fault_row("node bundle object rewritten in the bucket", "refused, gate failed, idle end", end - started)


def test_gcp_hung_job_at_full_utilization_and_low_power_ends_the_node(box_rootfs, box_timer, fault_row, tmp_path):
    hung = replace(healthy_a3mega(), utilization=(100,) * 8, power_w=(70.0,) * 8)  # 10% of 700 W
    scenario = variant(
        gcp_a3mega(), gpus=hung, node_env={"GPUINFRA_HANG_ACTION": "end", "GPUINFRA_HANG_MINUTES": "0.25"}
    )
    with make_box(box_rootfs, scenario, tmp_path) as box:
        box.start()
        node = box.nodes[0]
        box.wait_for("the node bundle's job watch", lambda: node.read(WATCH_PATH), BOOT_SECONDS)
        since = time.time()
        end = ended_at(box, 90)
        deletes = [c for c in box.calls() if c["argv"][:5] == DELETE]
        assert len(deletes) == 1 and deletes[0]["rc"] == 0
        power = [c for c in box.calls() if c["argv"][1:2] == ["--query-gpu=power.draw,enforced.power.limit"]]
        assert power and power[0]["t"] < deletes[0]["t"]
        # 15 s of full use at low power, read every 5 s, then the end
        assert deletes[0]["t"] - power[0]["t"] >= 15
        fault_row("hang: 100% utilization at 10% power", "hang: deleted", end - since)


def test_gcp_cluster_from_a_baked_image_reaches_its_verdict_with_no_pull(box_rootfs, box_timer, fault_row, tmp_path):
    # the example A3 Mega stack as `new --image baked:bake-a3mega` writes it; each node's Docker
    # store holds the container where the bake left it (the image's own data-root)
    scenario = gcp_a3mega()
    stock = stack_spec(scenario.stack)
    project = "gpuinfra-box-1"
    repository = f"projects/{project}/locations/{stock.region}/repositories/gpuinfra-bake-a3mega"
    spec = baked_variant(stock, "bake-a3mega", f"projects/{project}/global/images/gpuinfra-bake-a3mega-1", repository)
    bucket = f"{spec.stack}-box"
    boot = render_boot(spec, bucket)
    image = spec.profile.container_image
    with Box(box_rootfs, scenario, boot, spec.nodes, bucket, spec.region, spec.zone, 0, tmp_path) as box:
        (box.state / "images").mkdir()
        for node in box.nodes:
            (box.state / "images" / node.name).write_text(f"{image}\n")
            node.write("/etc/docker/daemon.json", '{"default-runtime": "nvidia"}')
        started = time.monotonic()
        box.start()
        envs = wait_ranked_and_passed(box)
        ready_seconds = time.monotonic() - started
        assert_two_node_ranks(box, envs, "29500")
        assert verdicts(health_results(box, spec.stack)) == {
            f"{n.name}.json": ("cluster", n.ip, True, []) for n in box.nodes
        }
        assert calls_of(box, ["docker", "pull"]) == []
        # the pre-pull found the baked image; the all-reduce ran in it
        assert sorted(calls_of(box, ["docker", "image", "inspect", image])) == sorted(
            (n.name, ["docker", "image", "inspect", image]) for n in box.nodes
        )
        for node in box.nodes:
            assert [
                argv
                for n, argv in calls_of(box, ["docker", "run"])
                if n == node.name and any(a.endswith("gpuinfra_allreduce.py") for a in argv)
            ]
            # Docker's data-root stayed where the bake put it; Docker was logged in to the bake's registry
            assert node.read("/etc/docker/daemon.json") == '{"default-runtime": "nvidia"}'
            assert (
                node.name,
                ["gcloud", "auth", "configure-docker", f"{spec.region}-docker.pkg.dev", "--quiet"],
            ) in calls_of(box, ["gcloud", "auth", "configure-docker"])
    fault_row("baked image", "verdict with no pull", ready_seconds)


def test_aws_cluster_from_a_baked_image_uses_the_baked_container_with_no_pull(
    box_rootfs, box_timer, fault_row, tmp_path
):
    # the example p5 stack as `new --image baked:bake-p5` writes it: the AMI's Docker store holds
    # the bake's EFA container (repo@sha256), which the image unit tags instead of building
    scenario = aws_p5()
    stock = stack_spec(scenario.stack)
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    container = f"{registry}/gpuinfra/bake-p5@sha256:" + "b" * 64
    repository = "arn:aws:ecr:us-east-1:123456789012:repository/gpuinfra/bake-p5"
    spec = baked_variant(stock, "bake-p5", "ami-0fedcba9876543210", repository, container)
    bucket = f"{spec.stack}-box"
    boot = render_boot(spec, bucket)
    with Box(box_rootfs, scenario, boot, spec.nodes, bucket, spec.region, spec.zone, boot.efa_devices, tmp_path) as box:
        (box.state / "images").mkdir()
        for node in box.nodes:
            (box.state / "images" / node.name).write_text(f"{container}\n")
            node.write("/etc/docker/daemon.json", '{"default-runtime": "nvidia"}')
        started = time.monotonic()
        box.start()
        envs = wait_ranked_and_passed(box)
        ready_seconds = time.monotonic() - started
        assert_two_node_ranks(box, envs, "29500")
        assert verdicts(health_results(box, spec.stack)) == {
            f"{n.name}.json": ("cluster", n.ip, True, []) for n in box.nodes
        }
        assert calls_of(box, ["docker", "pull"]) == [] and calls_of(box, ["docker", "build"]) == []
        for node in box.nodes:
            tags = [argv for n, argv in calls_of(box, ["docker", "tag"]) if n == node.name]
            assert len(tags) == 1 and tags[0][2] == container and tags[0][3].startswith("gpuinfra/train:efa-")
            # Docker logged in to the bake's registry with the node role's token, through the real unit
            assert (node.name, ["aws", "ecr", "get-login-password", "--region", "us-east-1"]) in calls_of(
                box, ["aws", "ecr"]
            )
            assert (
                node.name,
                ["docker", "login", "--username", "AWS", "--password-stdin", registry],
            ) in calls_of(box, ["docker", "login"])
            assert node.read("/etc/docker/daemon.json") == '{"default-runtime": "nvidia"}'
    fault_row("baked image (AWS EFA)", "verdict with no pull", ready_seconds)


def test_aws_a_new_deployment_never_ranks_with_an_earlier_deployments_decision(
    box_rootfs, box_timer, fault_row, tmp_path
):
    """``up --replace-nodes`` / ``down`` + ``up`` of the same stack file: the kept bucket holds the
    earlier deployment's passing results and its rank decision, which left node 1 out, at the
    addresses the new nodes get (at the key it has with and without a deployment id). The new
    deployment's nodes rank together on their own results and store their own decision."""
    from gpuinfra.health.ranks import DecisionScope, RankDecision

    scenario = aws_p5()
    spec = stack_spec(scenario.stack).model_copy(update={"deployment_id": "0b0b0b0b0b0b"})
    with make_box(box_rootfs, scenario, tmp_path, spec) as box:
        first, second = box.nodes
        addresses = (first.ip, second.ip)
        health = box.state / "bucket" / box.bucket / "health" / spec.stack
        health.mkdir(parents=True, exist_ok=True)
        for earlier in ("", "0a0a0a0a0a0a"):  # a deployment before ids, and one with its own id
            scope = DecisionScope(spec.stack, addresses, spec.created_at, earlier)
            (health / scope.key.rsplit("/", 1)[1]).write_text(
                scope.propose([first.ip], {}, "i-0old", first.ip, "deadline").to_json()
            )
        started = time.monotonic()
        box.start()
        envs = wait_ranked_and_passed(box)
        seconds = time.monotonic() - started
        assert_two_node_ranks(box, envs, "29500")
        new = DecisionScope(spec.stack, addresses, spec.created_at, "0b0b0b0b0b0b")
        decision = RankDecision.from_json((health / new.key.rsplit("/", 1)[1]).read_bytes())
        assert (decision.deployment, decision.ranked) == ("0b0b0b0b0b0b", addresses)
        assert {r["deployment"] for r in health_results(box, spec.stack).values()} == {"0b0b0b0b0b0b"}
        fault_row("an earlier deployment's rank decision (node 1 left out) in the bucket", "both nodes ranked", seconds)
