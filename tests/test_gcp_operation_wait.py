"""The one wait for a Compute zone operation (``blueprints.gcp.bulk_insert.wait_for_operation``),
used by the bulk insert, the cleanup after its capacity timeout and the group's resize to 0, with
faults injected on a fake clock: reads refused with Compute's rate-limit answer (HTTP 403
``rateLimitExceeded``: cloud.google.com/compute/api-quota), an operation that never ends."""

from __future__ import annotations

import pytest

pytest.importorskip("google.cloud.compute_v1")

from google.api_core.exceptions import Forbidden  # noqa: E402
from google.cloud import compute_v1  # noqa: E402

from blueprints.gcp.bulk_insert import ComputeClients, wait_for_operation  # noqa: E402

RUNNING, DONE = compute_v1.Operation.Status.RUNNING, compute_v1.Operation.Status.DONE


class Clock:
    """A fake monotonic clock that only sleeping advances."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


class Operations:
    """``zoneOperations.get``: each read answers the next of ``answers`` (an exception is raised;
    the last answer repeats)."""

    def __init__(self, *answers) -> None:
        self.answers, self.reads = list(answers), 0

    def get(self, project: str, zone: str, operation: str):
        answer = self.answers[min(self.reads, len(self.answers) - 1)]
        self.reads += 1
        if isinstance(answer, Exception):
            raise answer
        return compute_v1.Operation(name=operation, status=answer)


def rate_limited() -> Forbidden:
    return Forbidden("Quota exceeded for quota group 'ReadGroup'", errors=[{"reason": "rateLimitExceeded"}])


def started() -> compute_v1.Operation:
    return compute_v1.Operation(name="operation-1", status=RUNNING)


def wait(ops: Operations, clock: Clock, seconds: float, **kwargs):
    clients = ComputeClients(instances=None, operations=ops)
    return wait_for_operation(clients, "p", "z", started(), clock() + seconds, 5.0, clock, clock.sleep, **kwargs)


def test_refused_reads_do_not_end_the_wait_and_a_later_read_clears_the_refusal():
    clock = Clock()
    ops = Operations(rate_limited(), rate_limited(), RUNNING, DONE)
    operation, refused = wait(ops, clock, 60)
    assert operation.status == DONE and refused == ""
    assert ops.reads == 4 and clock.sleeps == [5.0] * 4


def test_a_refused_read_raises_where_the_caller_asks_for_it():
    clock = Clock()
    with pytest.raises(Forbidden):
        wait(Operations(rate_limited(), DONE), clock, 60, refused_ends_wait=True)


def test_an_operation_that_never_ends_is_left_at_the_deadline_and_the_last_sleep_is_cut_to_it():
    clock = Clock()
    ops = Operations(RUNNING)
    operation, refused = wait(ops, clock, 12)
    assert operation.status == RUNNING and refused == ""
    assert clock.now == 112 and clock.sleeps == [5.0, 5.0, 2.0] and ops.reads == 3


def test_at_the_deadline_the_last_refusal_is_returned_for_the_message():
    clock = Clock()
    operation, refused = wait(Operations(RUNNING, rate_limited()), clock, 10)
    assert operation.status == RUNNING
    assert "rateLimitExceeded" in refused and "Quota exceeded" in refused


def test_each_round_runs_before_every_look_including_the_last():
    clock, looks = Clock(), []
    ops = Operations(RUNNING, RUNNING, DONE)
    operation, _ = wait(ops, clock, 60, each_round=lambda: looks.append(clock()))
    assert operation.status == DONE and looks == [100.0, 105.0, 110.0, 115.0]


def test_a_done_operation_is_not_read_again():
    clock, ops = Clock(), Operations(RUNNING)
    clients = ComputeClients(instances=None, operations=ops)
    done = compute_v1.Operation(name="operation-1", status=DONE)
    assert wait_for_operation(clients, "p", "z", done, clock() + 60, 5.0, clock, clock.sleep) == (done, "")
    assert ops.reads == 0 and clock.sleeps == []
