"""A broker companion's outbox (``Backend.outbox``, ``outbox_mark``, ``outbox_confirm``,
``outbox_sweep``; contract in backends/base.py): the jobs whose message a broker has not
confirmed, kept in the same write as the records, so a companion that died between the record
and the message can publish it again. Same rules on every store."""

from __future__ import annotations

import pytest
from support import T0, new_job

from conveyor import JobState
from conveyor.backends.base import Backend, Lease, NewJob, new_claim_id


@pytest.fixture
def outbox(backend: Backend) -> Backend:
    backend.outbox = True
    return backend


def enqueue(backend: Backend, *, now: float = T0, **kw: object) -> int:
    [res] = backend.enqueue_many([new_job(**kw)], now=now)  # type: ignore[arg-type]
    return res.id


def swept(backend: Backend, *, now: float, older_than: float = 60.0) -> list[int]:
    return [j.id for j in backend.outbox_sweep(older_than=older_than, now=now)]


def test_no_marks_while_the_outbox_is_off(backend: Backend) -> None:
    enqueue(backend)
    assert swept(backend, now=T0 + 3600) == []


def test_enqueue_marks_its_jobs_until_confirmed(outbox: Backend) -> None:
    a = enqueue(outbox)
    b = enqueue(outbox, delay=600)
    [c, d] = [r.id for r in outbox.enqueue_many([new_job(), new_job()], now=T0)]
    assert swept(outbox, now=T0 + 59) == []  # younger than the bound
    outbox.outbox_confirm([c])
    jobs = outbox.outbox_sweep(older_than=60, now=T0 + 61)
    assert [j.id for j in jobs] == sorted([a, b, d])
    assert {j.id: j.state for j in jobs}[b] is JobState.SCHEDULED
    # Renewed: not swept again until another bound has passed.
    assert swept(outbox, now=T0 + 100) == []
    assert swept(outbox, now=T0 + 122) == sorted([a, b, d])
    outbox.outbox_confirm([a, b, d])
    assert swept(outbox, now=T0 + 3600) == []


def test_a_unique_key_held_creates_no_mark(outbox: Backend) -> None:
    first = enqueue(outbox, unique_key="k")
    outbox.outbox_confirm([first])
    [again] = outbox.enqueue_many([new_job(unique_key="k")], now=T0 + 1)
    assert again.id == first and not again.created
    assert swept(outbox, now=T0 + 3600) == []


def test_the_sweep_clears_marks_of_jobs_that_moved_on(outbox: Backend) -> None:
    """A job taken (its message was delivered), finished or gone needs no message."""
    running = enqueue(outbox)
    cancelled = enqueue(outbox)
    waiting = enqueue(outbox)
    tok = new_claim_id() + "1"
    assert outbox.take(running, tok, worker_id="w", lease_s=600, now=T0 + 1) is not None
    assert outbox.cancel(cancelled, now=T0 + 1)
    outbox.outbox_mark([987654321], now=T0)
    assert swept(outbox, now=T0 + 61, older_than=60) == [waiting]
    outbox.ack(Lease(running, tok), None, now=T0 + 62)
    outbox.outbox_confirm([waiting])
    assert swept(outbox, now=T0 + 3600) == []


def test_a_cron_tick_marks_its_job(outbox: Backend) -> None:
    job = NewJob(task="t.tick", queue="default", args="{}", max_attempts=1, timeout=30.0)
    assert outbox.cron_enqueue("every-minute", T0 - 60, None, now=T0 - 60) is None
    res = outbox.cron_enqueue("every-minute", T0, job, now=T0)
    assert res is not None and res.created
    assert swept(outbox, now=T0 + 61) == [res.id]


def test_mark_before_a_redrive(outbox: Backend) -> None:
    job_id = enqueue(outbox, max_attempts=1)
    outbox.outbox_confirm([job_id])
    tok = new_claim_id() + "1"
    assert outbox.take(job_id, tok, worker_id="w", lease_s=30, now=T0 + 1) is not None
    from conveyor.backends.base import ErrorInfo

    outbox.kill(Lease(job_id, tok), ErrorInfo("exception", "boom"), now=T0 + 2)
    outbox.outbox_mark([job_id], now=T0 + 10)
    assert swept(outbox, now=T0 + 69, older_than=60) == []
    assert outbox.redrive([job_id], now=T0 + 11) == 1
    assert swept(outbox, now=T0 + 71, older_than=60) == [job_id]


def test_the_sweep_is_bounded(outbox: Backend) -> None:
    ids = [r.id for r in outbox.enqueue_many([new_job() for _ in range(5)], now=T0)]
    first = [j.id for j in outbox.outbox_sweep(older_than=60, limit=2, now=T0 + 61)]
    second = [j.id for j in outbox.outbox_sweep(older_than=60, limit=10, now=T0 + 62)]
    assert len(first) == 2 and sorted(first + second) == sorted(ids)


def test_marks_that_need_no_message_never_hide_the_ones_that_do(outbox: Backend) -> None:
    """A sweep's batch full of marks whose jobs moved on (a backlog left by producers that died
    after their publish, or by a store that failed their confirm) is cleared and the sweep
    looks further: it returns nothing only when no due mark needs a message. Returning an
    empty batch there would end the companion's sweep for another interval, 100 marks at a
    time."""
    outbox.outbox_mark([987_654_321 + i for i in range(7)], now=T0 - 10)  # gone: oldest first
    waiting = enqueue(outbox, now=T0)
    assert [j.id for j in outbox.outbox_sweep(older_than=60, limit=3, now=T0 + 61)] == [waiting]
    outbox.outbox_confirm([waiting])
    assert outbox.outbox_sweep(older_than=60, limit=3, now=T0 + 3600) == []
