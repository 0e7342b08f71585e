"""Health results and rank decisions are scoped to the deployment (``GPUINFRA_DEPLOYMENT``), not
to the stack file's ``created_at``: ``gpuinfra up --replace-nodes`` and ``down`` + ``up`` keep the
stack file (and so ``results_not_before``) and the bucket, and the new nodes may get the old
addresses. Nothing the earlier deployment stored may decide for the new one."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from gpuinfra.health.gate import health_key
from gpuinfra.health.node import EXIT_UNDECIDED, HealthNode, NodeConfig, current_results, stored_exit
from gpuinfra.health.ranks import DecisionScope, RankDecision
from gpuinfra.plan.health import expectations_for
from tests.health.conftest import spec_for
from tests.health.test_node_runner import MemoryBucket, p4d_runner

A, B, C = "10.0.0.7", "10.0.0.9", "10.0.0.20"
LISTED = [A, B, C]
NODES = {A: "i-0a", B: "i-0b", C: "i-0c"}
OLD, NEW = "0a0a0a0a0a0a", "0b0b0b0b0b0b"
#: the stack file's created_at: the same for both deployments (the file is kept)
CREATED = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)


def gate_node(tmp_path, address, bucket, deployment, node=None):
    return HealthNode(
        NodeConfig("aws", "train", "bkt", "enforce", deployment=deployment),
        expectations_for(spec_for("p4d.24xlarge")),
        node or NODES[address],
        address,
        bucket,
        p4d_runner(),
        tmp_path / (node or NODES[address]) / "state",
        results_not_before=CREATED,
        kept_result=tmp_path / (node or NODES[address]) / "kept.json",
    )


def publish_local(tmp_path, bucket, address, deployment, node=None):
    """The node at ``address`` of ``deployment`` runs its local checks (they pass) and uploads them."""
    return gate_node(tmp_path / deployment, address, bucket, deployment, node).local()


def test_an_earlier_deployments_decision_and_results_are_never_used(tmp_path):
    """``up --replace-nodes`` of the same stack file: the old deployment ranked A and B (C left
    out) and every old node uploaded a pass. A new node at C's old address neither reads the old
    decision nor decides at once on the old results: it waits for the new results."""
    bucket = MemoryBucket()
    for address in LISTED:
        publish_local(tmp_path, bucket, address, OLD)
    old_scope = DecisionScope("train", tuple(LISTED), CREATED, OLD)
    old = old_scope.propose([A, B], {}, "i-0a", A, "all-results")
    bucket.objects[old_scope.key] = old.to_json().encode()

    me = gate_node(tmp_path / "new", C, bucket, NEW, node="i-1c")
    assert current_results(bucket.read_prefix("health/train/"), "train", CREATED, NEW) == {}
    waits = []

    def new_nodes_report(seconds):  # while C waits, the new nodes' results arrive
        waits.append(seconds)
        for address, name in ((A, "i-1a"), (B, "i-1b"), (C, "i-1c")):
            publish_local(tmp_path, bucket, address, NEW, node=name)

    me.sleep = new_nodes_report
    assert me.peers(LISTED, wait_seconds=2700) == LISTED
    assert len(waits) == 1  # the old passes did not complete the wait
    decision = RankDecision.from_json(bucket.objects[DecisionScope("train", tuple(LISTED), CREATED, NEW).key])
    assert (decision.deployment, decision.trigger, decision.ranked) == (NEW, "all-results", tuple(LISTED))
    assert set(decision.results) == set(LISTED) and all(r["node"].startswith("i-1") for r in decision.results.values())
    assert bucket.objects[old_scope.key] == old.to_json().encode()  # the old one is left alone


def test_down_then_up_does_not_rejoin_with_the_earlier_all_reduce(tmp_path):
    """After ``down`` + ``up`` a node with the old node's name (a GCE VM name can repeat) and a
    kept cluster result on disk runs the all-reduce again instead of reusing the old one."""
    bucket = MemoryBucket()
    old = gate_node(tmp_path, A, bucket, OLD)
    local = old.local()
    old.keep(replace(local, stage="cluster"))  # its passed cluster result, kept on the boot disk
    assert old.rejoin(local) is not None  # the same deployment after a reboot: reused
    new = gate_node(tmp_path, A, bucket, NEW)  # same name, same kept file, new deployment
    assert new.rejoin(new.local()) is None


def test_a_node_whose_peers_call_failed_gets_the_stored_ranking_once_the_excluded_node_ended(tmp_path):
    """The gate ranked A and B and left C out; C ended itself. B's first ``peers`` call failed,
    so on its retry only A and B are listed (fewer than the stack's 3): the stored ranking of its
    deployment stands. Another deployment's, a ranking without B, or one ranking a node no longer
    listed does not."""
    bucket = MemoryBucket()
    scope = DecisionScope("train", tuple(LISTED), CREATED, NEW)
    bucket.objects[scope.key] = scope.propose([A, B], {}, "i-0a", A, "all-results").to_json().encode()
    b = gate_node(tmp_path, B, bucket, NEW)
    assert b.stored_ranking([A, B]) == [A, B]
    out = []
    assert stored_exit(b, [A, B], out=_Lines(out)) == 0 and out == [f"{A}\n{B}"]
    assert gate_node(tmp_path / "old", B, bucket, OLD).stored_ranking([A, B]) is None
    assert b.stored_ranking([B]) is None  # A, ranked, is not listed: not this cluster any more
    assert gate_node(tmp_path, C, bucket, NEW).stored_ranking([A, B, C]) is None  # C has no rank
    assert stored_exit(gate_node(tmp_path / "x", B, MemoryBucket(), NEW), [A, B], out=_Lines([])) == EXIT_UNDECIDED


def test_results_of_another_deployment_do_not_count(tmp_path):
    bucket = MemoryBucket()
    publish_local(tmp_path, bucket, A, OLD)
    publish_local(tmp_path, bucket, B, NEW)
    docs = bucket.read_prefix("health/train/")
    assert set(current_results(docs, "train", CREATED, NEW)) == {B}
    assert set(current_results(docs, "train", CREATED, OLD)) == {A}
    assert health_key("train", "i-0a") in docs


class _Lines:
    def __init__(self, lines):
        self.lines = lines

    def write(self, text):
        if text.strip():
            self.lines.append(text)

    def flush(self):
        pass


def test_every_result_a_node_uploads_carries_its_deployment(tmp_path):
    """Local and cluster stage: a result without it would not count for its own peers."""
    bucket = MemoryBucket()
    node = gate_node(tmp_path, A, bucket, NEW)
    assert node.local().deployment == NEW
    assert node.cluster().deployment == NEW
    assert set(current_results(bucket.read_prefix("health/train/"), "train", CREATED, NEW)) == {A}
