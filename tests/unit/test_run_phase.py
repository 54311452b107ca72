"""The phases of a leased job in the worker (conveyor.worker.capacity.RunPhase): the legal moves
are the ones the worker makes, and any other one fails loudly instead of corrupting its books."""

from __future__ import annotations

import pytest

from conveyor.backends.base import Lease
from conveyor.job import Job, JobState
from conveyor.worker import Running, RunPhase


def _running() -> Running:
    job = Job(id=1, task="t", queue="default", args={}, state=JobState.RUNNING, attempts=1,
              max_attempts=3, priority=0, run_at=0.0, timeout=60.0, created_at=0.0,
              lease_token="x")
    return Running(job=job, lease=Lease(1, "x"))


@pytest.mark.parametrize("path", [
    ["RUNNING", "FINISHING", "ACKING", "SETTLED"],  # succeeded, acked
    ["RUNNING", "FINISHING", "SETTLED"],  # a retry or a kill written
    ["RUNNING", "SETTLED"],  # cancelled (lease lost, stop) or a worker error
    ["SETTLED"],  # held, then dropped or given back unrun
    ["SETTLED", "SETTLED"],  # settling twice is harmless
])
def test_the_worker_s_moves_are_legal(path: list[str]) -> None:
    r = _running()
    assert r.phase is RunPhase.CLAIMED and r.unfinished and not r.settled
    for name in path:
        r.move(RunPhase[name])
    assert r.settled and not r.unfinished and not r.writing and not r.acking


@pytest.mark.parametrize(("path", "bad"), [
    ([], "ACKING"),  # a job acked before it ran
    ([], "FINISHING"),
    (["RUNNING", "FINISHING", "ACKING"], "RUNNING"),
    (["SETTLED"], "RUNNING"),  # a dropped job started anyway
    (["RUNNING", "SETTLED"], "ACKING"),
])
def test_any_other_move_fails(path: list[str], bad: str) -> None:
    r = _running()
    for name in path:
        r.move(RunPhase[name])
    with pytest.raises(AssertionError, match="no move"):
        r.move(RunPhase[bad])


def test_lost_is_a_flag_beside_the_phase() -> None:
    r = _running()
    r.move(RunPhase.RUNNING)
    r.move(RunPhase.FINISHING)
    r.lost = True  # a heartbeat found the lease lost while a retry was being written
    assert r.writing
    r.move(RunPhase.SETTLED)
    assert r.lost and r.settled


def test_phases_hash_by_identity_and_still_look_up_by_value() -> None:
    # Each move hashes two phases: they hash as the singletons they are (object's C hash, not
    # Enum's Python-level one), and lookups by value or name still find the same member.
    for phase in RunPhase:
        assert hash(phase) == object.__hash__(phase)
        assert RunPhase(phase.value) is phase and RunPhase[phase.name] is phase
        assert {phase: 1}[RunPhase(phase.value)] == 1
