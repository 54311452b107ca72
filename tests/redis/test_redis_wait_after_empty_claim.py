"""An idle wait right after a claim that found its queue empty makes no look of its own
(RedisBackend._looked): the claim's reply ('empty', and when the queue's first scheduled job is
due) says what look.lua would. An idle worker claims, then waits: the look in between was a
round trip per job at a light load. Counted in look calls and in the pauses of the waits'
pops, never in time."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from support import new_job

from conveyor.backends.base import NewJob
from conveyor.backends.redis import RedisBackend
from conveyor.backends.redis.transport import WAIT_SLICE


def looks(backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The mode of every look the backend makes from now on."""
    made: list[str] = []
    real = backend._look

    def counted(mode: str, queues: Any) -> Any:
        made.append(mode)
        return real(mode, queues)

    monkeypatch.setattr(backend, "_look", counted)
    return made


def pauses(backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """How long each pop with claims behind it may block, from now on."""
    made: list[float] = []
    real = backend._pop_then_claim

    def recorded(wake_keys: Any, pause: float, *args: Any) -> Any:
        made.append(pause)
        return real(wake_keys, pause, *args)

    monkeypatch.setattr(backend, "_pop_then_claim", recorded)
    return made


def enqueue(backend: RedisBackend, job: NewJob) -> int:
    [result] = backend.enqueue_many([job])
    return result.id


def wait(backend: RedisBackend, timeout: float = 5.0) -> tuple[bool, list[int]]:
    woken, jobs = backend.wait_and_claim(["default"], timeout, [("default", 4)], worker_id="w",
                                         lease_s=30)
    return woken, [j.id for j in jobs or []]


def test_a_wait_after_an_empty_claim_does_not_look(
        backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    assert backend.claim("default", 4, worker_id="w", lease_s=30) == []
    made = looks(backend, monkeypatch)
    # A job that comes after the claim leaves a wake-up marker, which the pop sees at once.
    job_id = enqueue(backend, new_job())
    assert wait(backend) == (True, [job_id])
    assert made == []


def test_a_stale_marker_is_waited_past_without_a_second_look(
        backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # A job taken by a claim that is not the wait's own leaves its marker behind. That claim
    # got a job, which says nothing of what is left: the wait looks first. Its pop then takes
    # the marker, the claims behind it find the queue empty, and it pops again without a look.
    enqueue(backend, new_job())
    assert len(backend.claim("default", 4, worker_id="w", lease_s=30)) == 1
    made = looks(backend, monkeypatch)
    popped = pauses(backend, monkeypatch)
    assert wait(backend, timeout=0.3) == (False, [])
    assert made == ["any"] and len(popped) >= 2


def test_the_pause_ends_when_the_first_scheduled_job_is_due(
        backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    due = enqueue(backend, replace(new_job(), delay=0.5))
    assert backend.claim("default", 4, worker_id="w", lease_s=30) == []
    _, due_in = backend._emptied["default"]
    assert due_in is not None and 0.3 < due_in <= 0.5
    made = looks(backend, monkeypatch)
    popped = pauses(backend, monkeypatch)
    assert wait(backend) == (True, [due])
    assert made == []
    # No pop was told to block past the job's time (as a look's answer would have told it).
    assert popped and popped[0] <= due_in


@pytest.mark.parametrize("case", ["no claim yet", "paused", "old", "due already"])
def test_a_wait_looks_when_no_fresh_empty_claim_answers_for_it(
        backend: RedisBackend, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    if case == "paused":
        # A paused queue's claim answers {}, not 'empty': it says nothing of the queue.
        backend.pause_queue("default")
        assert backend.claim("default", 4, worker_id="w", lease_s=30) == []
    elif case == "old":
        backend._emptied["default"] = (time.monotonic() - WAIT_SLICE - 0.1, None)
    elif case == "due already":
        backend._emptied["default"] = (time.monotonic() - 0.2, 0.1)
    made = looks(backend, monkeypatch)
    assert wait(backend, timeout=0.05) == (False, [])
    assert made[:1] == ["any"]


def test_a_claim_that_got_jobs_or_was_held_back_says_nothing(backend: RedisBackend) -> None:
    assert backend.claim("default", 4, worker_id="w", lease_s=30) == []
    assert "default" in backend._emptied
    enqueue(backend, new_job())
    assert len(backend.claim("default", 4, worker_id="w", lease_s=30)) == 1
    assert "default" not in backend._emptied
    # Limits hold the waiting job back ('hold'): jobs wait, so the wait must look.
    limited = replace(new_job(), concurrency_key="K", concurrency_limit=1)
    enqueue(backend, limited)
    enqueue(backend, limited)
    assert len(backend.claim("default", 4, worker_id="w", lease_s=30)) == 1
    assert backend.claim("default", 4, worker_id="w", lease_s=30) == []
    assert "default" not in backend._emptied
