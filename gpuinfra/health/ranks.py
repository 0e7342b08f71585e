"""One rank decision per cluster: the health gate's ``peers`` (:mod:`gpuinfra.health.node`).

Standard library only (it runs on the nodes beside :mod:`gpuinfra.health.node`).

With ``GPUINFRA_HEALTH_GATE=enforce`` every node decides which listed nodes take a rank when
every listed address has a result or at its own deadline. Deadlines differ, so a result that
lands between two nodes' deadlines would split the decision (one node ranks 3 nodes, another
4: the torchrun world never forms). So the first node that decides stores its decision
create-only in the stack bucket, and every node, the first one too, ranks with the stored
decision, never with its own once one exists:

* Key :meth:`DecisionScope.key`: ``health/<stack>/ranks-<deployment>-<digest>.decision``. It
  is scoped to the deployment (``GPUINFRA_DEPLOYMENT`` of node.env: a new id at every ``gpuinfra
  up`` that creates the nodes, so ``up --replace-nodes`` and ``down`` + ``up`` never read an
  earlier deployment's decision; nodes without one fall back to ``results_not_before``, the stack
  file's ``created_at``) and to the listed addresses (a cluster re-formed with other addresses
  decides again). The body repeats both and is checked against them. The key does not end in ``.json``: ``gpuinfra
  check`` reads every ``.json`` under ``health/<stack>/`` as a node result
  (:func:`gpuinfra.services.health_report.read_health`).
* Create-only write (:meth:`gpuinfra.health.node.Bucket.put_new`): S3 ``PutObject`` with
  ``If-None-Match: *`` fails with ``412 Precondition Failed`` when the key exists
  (docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html); GCS uploads with
  ``ifGenerationMatch=0`` succeed "only if there are no live versions of the object" and
  otherwise fail with 412 (cloud.google.com/storage/docs/request-preconditions).
* Losing the race (:class:`PreconditionFailed`): read the stored decision back and use it.
  Any other failure of the write: read back as well (a write whose answer was lost may have
  landed, and another node may have won meanwhile), then try again, :data:`WRITE_TRIES` in all
  :data:`RETRY_SECONDS` apart; then :class:`RankDecisionError`. The node then prints no ranking
  and exits :data:`gpuinfra.health.node.EXIT_UNDECIDED`; ``gpuinfra-cluster-env`` exits 75
  and systemd runs it again (``Restart=on-failure``), which reads the decision another node
  stored meanwhile. A node never ranks with a decision it could not store.
* A stored object at this node's key that is not a decision of this deployment and listing
  (unreadable, another stack, another ``results_not_before``, other addresses): a
  :class:`RankDecisionError` naming it; it is never overwritten (no node could store another).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from gpuinfra.errors import PreconditionFailed, RankDecisionError
from gpuinfra.health.gate import HEALTH_PREFIX, NodeHealth

#: Version of the decision document (:meth:`RankDecision.to_dict`).
DECISION_SCHEMA_VERSION = "1"
DECISION_KIND = "gpuinfra-rank-decision"
#: Object name suffix: not ``.json`` (``gpuinfra check`` reads those as node results).
DECISION_SUFFIX = ".decision"
#: Create-only writes tried before the node gives up (each followed by a read-back).
WRITE_TRIES = 3
#: Seconds between two tries.
RETRY_SECONDS = 10.0


class DecisionBucket(Protocol):
    """What :func:`settle` needs of :class:`gpuinfra.health.node.Bucket`."""

    def url(self, key: str) -> str: ...  # pragma: no cover - protocol

    def put_new(self, key: str, path: Path) -> None: ...  # pragma: no cover - protocol


def _address_order(address: str) -> tuple:
    """Numeric order of dotted IPv4 addresses (as the nodes sort them), text after numbers."""
    parts = address.split(".")
    return (0, tuple(int(p) for p in parts)) if all(p.isdigit() for p in parts) else (1, address)


def _iso(when: datetime | None) -> str | None:
    return when.astimezone(timezone.utc).isoformat() if when else None


@dataclass(frozen=True)
class RankDecision:
    """The ranking one node decided for the cluster, as stored.

    Attributes:
        stack: the stack's name.
        results_not_before: ISO 8601 time before which results are another deployment's
            (None when the expectations file gives none).
        listed: the addresses the node was asked to rank (``peers`` arguments, rank order).
        ranked: the addresses that take a rank, in rank order (a subsequence of ``listed``).
        decided_by, decided_by_address: the deciding node's id and private address.
        decided_at: ISO 8601 UTC time of the decision.
        trigger: ``all-results`` (every listed address had a result), ``deadline``, or
            ``replacement`` (a node that booted after the cluster formed took a lost node's rank:
            :meth:`DecisionScope.takeover`).
        results: what the node saw, address -> ``{"node", "stage", "checked_at", "passed"}``
            (listed addresses without a result are absent).
        deployment: the deployment id the decision belongs to ("" for nodes without one).
    """

    stack: str
    results_not_before: str | None
    listed: tuple[str, ...]
    ranked: tuple[str, ...]
    decided_by: str
    decided_by_address: str
    decided_at: str
    trigger: str
    results: dict[str, dict] = field(default_factory=dict)
    deployment: str = ""

    def to_dict(self) -> dict:
        """JSON form, keys in a fixed order."""
        return {
            "kind": DECISION_KIND,
            "schema_version": DECISION_SCHEMA_VERSION,
            "stack": self.stack,
            "deployment": self.deployment,
            "results_not_before": self.results_not_before,
            "listed": list(self.listed),
            "ranked": list(self.ranked),
            "decided_by": self.decided_by,
            "decided_by_address": self.decided_by_address,
            "decided_at": self.decided_at,
            "trigger": self.trigger,
            "results": self.results,
        }

    def to_json(self) -> str:
        """The document as stored."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_json(cls, body: bytes) -> RankDecision:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: not JSON, not a decision of this schema, or a field missing or mistyped.
        """
        data = json.loads(body)
        if not isinstance(data, dict) or data.get("kind") != DECISION_KIND:
            raise ValueError("not a rank decision")
        if data.get("schema_version") != DECISION_SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {data.get('schema_version')!r}, this gpuinfra reads {DECISION_SCHEMA_VERSION!r}"
            )
        try:
            listed, ranked = tuple(map(str, data["listed"])), tuple(map(str, data["ranked"]))
            decision = cls(
                str(data["stack"]),
                data["results_not_before"],
                listed,
                ranked,
                str(data["decided_by"]),
                str(data["decided_by_address"]),
                str(data["decided_at"]),
                str(data["trigger"]),
                dict(data.get("results") or {}),
                str(data.get("deployment") or ""),
            )
            datetime.fromisoformat(decision.decided_at)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"missing or invalid field: {exc!r}") from None
        if any(a not in listed for a in ranked):
            raise ValueError("ranks an address it does not list")
        return decision


@dataclass(frozen=True)
class DecisionScope:
    """Which decision a node's ``peers`` call shares: the stack, the deployment and the listing.

    Attributes:
        stack: the stack's name.
        addresses: the listed addresses (``peers`` arguments).
        results_not_before: the deployment's ``results_not_before`` (None: unscoped, as the
            results are then).
        deployment: the node's deployment id (``GPUINFRA_DEPLOYMENT``); "" for nodes without one.
    """

    stack: str
    addresses: tuple[str, ...]
    results_not_before: datetime | None = None
    deployment: str = ""

    @property
    def prefix(self) -> str:
        """``health/<stack>/ranks-<deployment or not before, UTC, to the second>-``: every
        decision of this deployment starts with it."""
        stamp = self.deployment or (
            self.results_not_before.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            if self.results_not_before
            else "any"
        )
        return f"{HEALTH_PREFIX}/{self.stack}/ranks-{stamp}-"

    @property
    def key(self) -> str:
        """:attr:`prefix` + ``<16 hex>.decision``; the hex digits are SHA-256 of the deployment,
        the exact ``results_not_before`` and the sorted addresses."""
        not_before = _iso(self.results_not_before)
        parts = [self.deployment, not_before or ""] if self.deployment else [not_before or ""]
        digest = hashlib.sha256("\n".join([*parts, *sorted(self.addresses)]).encode()).hexdigest()[:16]
        return f"{self.prefix}{digest}{DECISION_SUFFIX}"

    def ranking_of(self, docs: Mapping[str, bytes], address: str) -> list[str] | None:
        """A ranking this deployment already decided that gives ``address`` a rank and whose ranked
        nodes are all among :attr:`addresses` (a node whose ``peers`` call failed, retrying after a
        node the gate left out has ended, lists fewer nodes than the stack has); None when there is
        none. Only decisions of this stack and deployment count."""
        for key in sorted(docs):
            if not (key.startswith(self.prefix) and key.endswith(DECISION_SUFFIX)):
                continue
            try:
                decision = RankDecision.from_json(docs[key])
            except ValueError:
                continue
            if (
                (decision.stack, decision.deployment, decision.results_not_before)
                == (self.stack, self.deployment, _iso(self.results_not_before))
                and address in decision.ranked
                and set(decision.ranked) <= set(self.addresses)
            ):
                return list(decision.ranked)
        return None

    def takeover(self, docs: Mapping[str, bytes], address: str) -> list[str] | None:
        """The ranking of a node that boots after its cluster formed (a replacement of a lost
        node: the MIG's repair of its members or the VM a preempted bulk VM asks the MIG for on
        GCP, the Spot replacement function on AWS): the newest
        decision of this deployment that does not rank ``address``, with the listed addresses it
        does not rank put, in address order, into the slots of its ranked nodes that are no
        longer listed, in rank order. So the replacement takes the lost node's rank -- and its
        checkpoint part ``rank-<N>`` (:mod:`gpuinfra.agent.checkpoints`) -- and the survivors keep
        theirs. None when no decision applies: none stored, every ranked node still listed,
        ``address`` not listed, or more new addresses sorting before ``address`` than lost slots.
        """
        best: RankDecision | None = None
        for key in sorted(docs):
            if not (key.startswith(self.prefix) and key.endswith(DECISION_SUFFIX)):
                continue
            try:
                decision = RankDecision.from_json(docs[key])
            except ValueError:
                continue
            if (decision.stack, decision.deployment, decision.results_not_before) != (
                self.stack,
                self.deployment,
                _iso(self.results_not_before),
            ) or address in decision.ranked:
                continue
            if best is None or decision.decided_at > best.decided_at:
                best = decision
        if best is None:
            return None
        ranked = list(best.ranked)
        lost = [i for i, a in enumerate(ranked) if a not in self.addresses]
        new = sorted((a for a in self.addresses if a not in ranked), key=_address_order)
        if not lost or address not in new or new.index(address) >= len(lost):
            return None
        for slot, newcomer in zip(lost, new, strict=False):
            ranked[slot] = newcomer
        return ranked

    def stored(self, docs: Mapping[str, bytes]) -> RankDecision | None:
        """The decision stored for this scope among ``docs`` (key -> body, as
        :meth:`gpuinfra.health.node.Bucket.read_prefix` returns them); None when there is none.

        Raises:
            RankDecisionError: an object at :attr:`key` that is not this scope's decision.
        """
        body = docs.get(self.key)
        if body is None:
            return None
        try:
            decision = RankDecision.from_json(body)
            if decision.stack != self.stack:
                raise ValueError(f"written for stack {decision.stack!r}")
            if decision.deployment != self.deployment:
                raise ValueError(f"written for deployment {decision.deployment!r}, this node's is {self.deployment!r}")
            if decision.results_not_before != _iso(self.results_not_before):
                raise ValueError(
                    f"written for the deployment of {decision.results_not_before}, this node's is "
                    f"{_iso(self.results_not_before)}"
                )
            if sorted(decision.listed) != sorted(self.addresses):
                raise ValueError(f"lists {', '.join(decision.listed)}, this node lists {', '.join(self.addresses)}")
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise RankDecisionError(
                f"{self.key} is not this deployment's rank decision ({exc}); no node can store "
                "another there: delete it so that the nodes decide again"
            ) from None
        return decision

    def propose(
        self,
        ranked: list[str],
        results: Mapping[str, NodeHealth],
        node: str,
        address: str,
        trigger: str,
        decided_at: datetime | None = None,
    ) -> RankDecision:
        """This node's decision (stored only if no other node stored one first).

        Args:
            ranked: :func:`gpuinfra.health.node.ranked_addresses` of what this node saw.
            results: the current results, by address.
            node, address: this node's id and private address.
            trigger: ``all-results`` or ``deadline``.
            decided_at: the decision's time (default: now, UTC).
        """
        seen = {
            a: {"node": r.node, "stage": r.stage, "checked_at": r.checked_at, "passed": r.passed}
            for a, r in results.items()
            if a in self.addresses
        }
        when = (decided_at or datetime.now(timezone.utc)).astimezone(timezone.utc)
        return RankDecision(
            self.stack,
            _iso(self.results_not_before),
            tuple(self.addresses),
            tuple(ranked),
            node,
            address,
            when.isoformat(timespec="seconds"),
            trigger,
            seen,
            self.deployment,
        )


def settle(
    bucket: DecisionBucket,
    scope: DecisionScope,
    proposal: RankDecision,
    read_docs: Callable[[], Mapping[str, bytes]],
    sleep: Callable[[float], None],
    tries: int = WRITE_TRIES,
    retry_seconds: float = RETRY_SECONDS,
) -> RankDecision:
    """The cluster's decision: ``proposal`` when this node stored it first, else the stored one.

    Args:
        bucket: the stack bucket (create-only ``put_new``).
        scope: the decision's scope (its key and checks).
        proposal: this node's decision (:meth:`DecisionScope.propose`).
        read_docs: reads the stack's results prefix (key -> body).
        sleep: waits between tries (seconds).
        tries: create-only writes to try, each followed by a read-back when it fails.
        retry_seconds: seconds between tries.

    Raises:
        RankDecisionError: after ``tries`` failed writes with no decision to read back, or an
            object at the key that is not this scope's decision.
    """
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "decision"
        path.write_text(proposal.to_json())
        for attempt in range(tries):
            if attempt:
                sleep(retry_seconds)
            try:
                bucket.put_new(scope.key, path)
                return proposal
            except PreconditionFailed:
                failures.append("another node stored a decision first")
            except OSError as exc:
                failures.append(str(exc))
            try:  # lost the race, or the write's answer was lost: the stored decision, if any, stands
                stored = scope.stored(read_docs())
            except RankDecisionError:
                raise
            except OSError as exc:
                failures.append(f"reading it back failed: {exc}")
                continue
            if stored is not None:
                return stored
    raise RankDecisionError(
        f"could not store or read the rank decision {bucket.url(scope.key)} ({tries} tries: {'; '.join(failures)})"
    )


def newest_ranking(docs: Mapping[str, bytes], stack: str, deployment: str, address: str) -> tuple[str, ...] | None:
    """The ranked addresses of the newest stored decision (``decided_at``) of ``stack`` and
    ``deployment`` that ranks ``address``; None when there is none or ``deployment`` is "".

    A node that already has a rank reads it before it restarts its job (:mod:`gpuinfra.agent.job`):
    after a replacement took a lost rank 0 (:meth:`DecisionScope.takeover`), rank 0 of this
    ranking is the replacement, which hosts the job's rendezvous. Nodes without a deployment id
    get None: their decisions are scoped by ``results_not_before``, which only the health gate
    knows.

    Args:
        docs: key -> body under ``health/<stack>/`` (:meth:`gpuinfra.health.node.Bucket.read_prefix`);
            objects that are not decisions of this stack and deployment are skipped.
        stack, deployment: node.env ``GPUINFRA_STACK`` and ``GPUINFRA_DEPLOYMENT``.
        address: this node's private address.
    """
    if not deployment:
        return None
    prefix = f"{HEALTH_PREFIX}/{stack}/ranks-{deployment}-"
    best: RankDecision | None = None
    for key in sorted(docs):
        if not (key.startswith(prefix) and key.endswith(DECISION_SUFFIX)):
            continue
        try:
            decision = RankDecision.from_json(docs[key])
        except ValueError:
            continue
        if (decision.stack, decision.deployment) != (stack, deployment) or address not in decision.ranked:
            continue
        if best is None or datetime.fromisoformat(decision.decided_at) > datetime.fromisoformat(best.decided_at):
            best = decision
    return best.ranked if best else None
