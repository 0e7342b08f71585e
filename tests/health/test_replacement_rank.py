"""A node that boots after its cluster formed -- the replacement of a lost node (GCP: the MIG's
repair; AWS: the Spot replacement function) -- takes the lost node's rank through the health gate's
stored decision, so it restores the lost node's checkpoint part (``rank-<N>``) and the survivors'
ranks stand. It never waits for a formation that already happened."""

from __future__ import annotations

from gpuinfra.health.ranks import DecisionScope, RankDecision
from tests.health.test_deployment_scope import CREATED, NEW, OLD, gate_node, publish_local
from tests.health.test_node_runner import MemoryBucket

A, B, C = "10.0.0.7", "10.0.0.9", "10.0.0.20"
R, S = "10.0.0.3", "10.0.0.150"  # replacements: R sorts before every survivor


def _formed(bucket, ranked, deployment=NEW, decided_at="2026-11-27T04:00:00+00:00"):
    scope = DecisionScope("train", tuple(ranked), CREATED, deployment)
    decision = scope.propose(list(ranked), {}, "i-0a", ranked[0], "all-results")
    decision = RankDecision(**{**decision.__dict__, "decided_at": decided_at})
    bucket.objects[scope.key] = decision.to_json().encode()
    return decision


def test_the_replacement_takes_the_lost_nodes_rank_not_the_one_its_address_sorts_to(tmp_path):
    """A, B, C formed as ranks 0, 1, 2; B was lost; R (lower address than all) replaces it. Sorted
    addresses would make R rank 0 beside A's rank 0; the takeover gives it rank 1, B's."""
    bucket = MemoryBucket()
    _formed(bucket, [A, B, C])
    publish_local(tmp_path, bucket, R, NEW, node="i-0r")  # its own checks passed
    me = gate_node(tmp_path, R, bucket, NEW, node="i-0r")
    me.sleep = lambda _s: (_ for _ in ()).throw(AssertionError("a replacement never waits for a formation"))
    assert me.peers([R, A, C], wait_seconds=2700) == [A, R, C]
    stored = RankDecision.from_json(bucket.objects[DecisionScope("train", (R, A, C), CREATED, NEW).key])
    assert (stored.trigger, stored.ranked, stored.decided_by) == ("replacement", (A, R, C), "i-0r")


def test_two_replacements_take_the_lost_slots_in_address_order(tmp_path):
    bucket = MemoryBucket()
    _formed(bucket, [A, B, C])
    for address, name in ((R, "i-0r"), (S, "i-0s")):
        publish_local(tmp_path, bucket, address, NEW, node=name)
    # A and C lost; R < S take A's rank 0 and C's rank 2; whichever decides first stores it
    assert gate_node(tmp_path, S, bucket, NEW, node="i-0s").peers([R, B, S], wait_seconds=1) == [R, B, S]
    assert gate_node(tmp_path, R, bucket, NEW, node="i-0r").peers([R, B, S], wait_seconds=1) == [R, B, S]


def test_a_second_loss_builds_on_the_newest_decision(tmp_path):
    """After R replaced B ([A, R, C]), A is lost and S replaces it: S takes rank 0 and R keeps 1."""
    bucket = MemoryBucket()
    _formed(bucket, [A, B, C])
    _formed(bucket, [A, R, C], decided_at="2026-11-27T05:00:00+00:00")
    publish_local(tmp_path, bucket, S, NEW, node="i-0s")
    assert gate_node(tmp_path, S, bucket, NEW, node="i-0s").peers([R, C, S], wait_seconds=1) == [S, R, C]


def test_no_takeover_without_a_formed_cluster_of_this_deployment_or_a_passed_check(tmp_path):
    bucket = MemoryBucket()
    _formed(bucket, [A, B, C], deployment=OLD)  # another deployment's cluster
    scope = DecisionScope("train", (R, A, C), CREATED, NEW)
    assert scope.takeover(bucket.read_prefix("health/"), R) is None
    _formed(bucket, [A, B, C])
    docs = bucket.read_prefix("health/")
    assert DecisionScope("train", (A, B, C, R), CREATED, NEW).takeover(docs, R) is None  # nobody lost
    assert DecisionScope("train", (R, A, C), CREATED, NEW).takeover(docs, R) == [A, R, C]
    # R's own checks have not passed (no result yet): no takeover; it waits like any node and
    # decides at its deadline (here 0 s), where enforce ranks only nodes with a passing result
    me = gate_node(tmp_path, R, bucket, NEW, node="i-0r")
    assert me.peers([R, A, C], wait_seconds=0) == []
    assert RankDecision.from_json(bucket.objects[scope.key]).trigger == "deadline"


def test_a_survivor_reads_the_newest_ranking_of_its_deployment_that_ranks_it():
    """Before its job restarts, a survivor looks for the ranking that now stands: after R took the
    lost A's rank 0, that is [R, B, C] (newest), not the formation's [A, B, C]."""
    from gpuinfra.health.ranks import newest_ranking

    bucket = MemoryBucket()
    _formed(bucket, [A, B, C])
    docs = bucket.read_prefix("health/")
    assert newest_ranking(docs, "train", NEW, B) == (A, B, C)
    _formed(bucket, [R, B, C], decided_at="2026-11-27T05:00:00+00:00")
    _formed(bucket, [S, B, C], deployment=OLD, decided_at="2026-11-27T06:00:00+00:00")  # another deployment's
    docs = {**bucket.read_prefix("health/"), "health/train/ranks-x.decision": b"not json"}
    assert newest_ranking(docs, "train", NEW, B) == (R, B, C)
    assert newest_ranking(docs, "train", NEW, A) == (A, B, C)  # the lost node is ranked only by the old one
    assert newest_ranking(docs, "train", NEW, "10.0.0.99") is None
    assert newest_ranking(docs, "other", NEW, B) is None
    assert newest_ranking(docs, "train", "", B) is None  # no deployment id: decisions it cannot scope
