"""Backend contract: enqueue, get, scheduling, claim. Only the Backend interface is used,
so these run unchanged on every backend. Every time-dependent call gets an injected ``now``."""

from __future__ import annotations

import json

import pytest
from support import T0, enqueue_one, new_job

from conveyor import ConveyorError, JobState
from conveyor.backends.base import Backend, NewJob


def all_jobs(backend: Backend) -> list:
    page = backend.list_jobs(limit=10_000)
    assert page.next_cursor is None
    return page.jobs


# -- enqueue ----------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_enqueue_many_returns_ids_in_order(backend: Backend) -> None:
    batch = [new_job(args={"n": i}) for i in range(7)]
    results = backend.enqueue_many(batch, now=T0)

    assert len(results) == 7
    ids = [r.id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == 7
    assert all(r.created for r in results)
    assert all(r.at == T0 for r in results)
    for i, job_id in enumerate(ids):
        job = backend.get(job_id)
        assert job is not None
        assert job.args == {"n": i}


@pytest.mark.needs("limits")
@pytest.mark.needs("cross_queue")
def test_enqueue_many_keeps_every_field_of_a_mixed_batch(backend: Backend) -> None:
    """A batch of jobs without unique or fair keys (PostgreSQL writes it in one statement):
    each job keeps its own queue, priority, timing, limits and meta, in batch order."""
    batch = [
        new_job(args={"n": 0}, queue="q1", priority=2, meta='{"m": 0}'),
        new_job(args={"n": 1}, queue="q2", delay=30.0, max_attempts=7, timeout=4.5),
        new_job(args={"n": 2}, queue="q1", run_at=T0 - 5, concurrency_key="c", concurrency_limit=2),
        new_job(args={"n": 3}, queue="q2", run_at=T0 + 60, rate_key="r", rate_limit=3, rate_period=1.5),
        new_job(args={"n": 4}, queue="q1", priority=-1),
    ]
    results = backend.enqueue_many(batch, now=T0)
    ids = [r.id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == 5 and all(r.created for r in results)
    jobs = [backend.get(i) for i in ids]
    assert [j.args for j in jobs if j] == [{"n": i} for i in range(5)]
    got = [(j.queue, j.priority, j.state, j.run_at, j.max_attempts, j.timeout, j.meta, j.concurrency_key,
            j.concurrency_limit, j.rate_key, j.rate_limit, j.rate_period, j.created_at) for j in jobs if j]
    assert got == [
        ("q1", 2, JobState.AVAILABLE, T0, 3, 30.0, {"m": 0}, None, None, None, None, None, T0),
        ("q2", 0, JobState.SCHEDULED, T0 + 30, 7, 4.5, {}, None, None, None, None, None, T0),
        ("q1", 0, JobState.AVAILABLE, T0 - 5, 3, 30.0, {}, "c", 2, None, None, None, T0),
        ("q2", 0, JobState.SCHEDULED, T0 + 60, 3, 30.0, {}, None, None, "r", 3, 1.5, T0),
        ("q1", -1, JobState.AVAILABLE, T0, 3, 30.0, {}, None, None, None, None, None, T0),
    ]
    claimed = backend.claim("q1", 3, worker_id="w", lease_s=30, now=T0)
    assert [j.id for j in claimed] == [ids[4], ids[2], ids[0]]


@pytest.mark.needs("lookup")
@pytest.mark.needs("cross_queue")
def test_enqueue_many_keeps_order_across_runs_of_alike_jobs(backend: Backend) -> None:
    """Consecutive jobs that differ only in their args (PostgreSQL sends each such run's shared
    values once): runs that come back to an earlier kind still keep batch order and fields."""
    kinds = [{"queue": "q1"}, {"queue": "q1"}, {"queue": "q2", "priority": 3}, {"queue": "q2", "priority": 3},
             {"queue": "q1"}, {"queue": "q1", "delay": 10.0}, {"queue": "q1"}]
    batch = [new_job(args={"n": i, "s": "\"quoted\" \\ é"}, **kind) for i, kind in enumerate(kinds)]
    results = backend.enqueue_many(batch, now=T0)
    ids = [r.id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == len(batch)
    jobs = [backend.get(i) for i in ids]
    assert [(j.args["n"], j.args["s"], j.queue, j.priority, j.run_at) for j in jobs if j] == [
        (i, '"quoted" \\ é', kind["queue"], kind.get("priority", 0), T0 + kind.get("delay", 0.0))
        for i, kind in enumerate(kinds)
    ]


@pytest.mark.needs("lookup")
def test_enqueue_many_round_trips_awkward_values(backend: Backend) -> None:
    awkward = [
        {"s": 'quote " backslash \\ slash / tab \t newline \n', "u": "é ü 漢字 😀 \u2028 \u2029 \x7f"},
        {"big": 2**63 - 1, "neg": -(2**63), "f": 1e308, "tiny": 5e-324, "z": -0.0, "n": None},
        {"nested": [[[{"k": [True, False, None]}]]], "empty": {}, "e": [], "esc": "\\u0041"},
    ]
    # As the app writes them: UTF-8 as is (ensure_ascii=False), not \\u escapes.
    batch = [NewJob(task="t.task", queue="default", args=json.dumps(a, ensure_ascii=False), max_attempts=3,
                    timeout=30.0) for a in awkward]
    results = backend.enqueue_many(batch, now=T0)
    for a, r in zip(awkward, results, strict=True):
        job = backend.get(r.id)
        assert job is not None and job.args == a


@pytest.mark.needs("listing")
def test_enqueue_many_of_nothing_writes_nothing(backend: Backend) -> None:
    assert backend.enqueue_many([], now=T0) == []
    assert all_jobs(backend) == []


@pytest.mark.parametrize("with_unique_keys", [False, True], ids=["plain", "unique"])
@pytest.mark.needs("listing")
def test_enqueue_many_is_atomic(backend: Backend, with_unique_keys: bool) -> None:
    before = enqueue_one(backend, args={"keep": True})
    key = (lambda i: f"k{i}") if with_unique_keys else (lambda i: None)
    batch = [
        new_job(args={"n": 0}, unique_key=key(0)),
        new_job(args={"n": 1}, unique_key=key(1)),
        # max_attempts=0 violates the store's own consistency rules: the whole batch must fail.
        NewJob(
            task="t.task",
            queue="default",
            args="{}",
            max_attempts=0,
            timeout=30.0,
            unique_key=key(2),
        ),
        new_job(args={"n": 3}, unique_key=key(3)),
    ]
    with pytest.raises(ConveyorError):
        backend.enqueue_many(batch, now=T0)

    assert [j.id for j in all_jobs(backend)] == [before]
    # The unique keys of the failed batch were not taken either.
    if with_unique_keys:
        [res] = backend.enqueue_many([new_job(unique_key="k0")], now=T0)
        assert res.created


@pytest.mark.needs("unique")
def test_get_returns_every_field(backend: Backend) -> None:
    nj = NewJob(
        task="mod.send_email",
        queue="emails",
        args='{"user_id": 42, "tags": ["a", "é"], "x": null}',
        max_attempts=4,
        timeout=12.5,
        priority=3,
        unique_key="welcome:42",
        meta='{"origin": "test"}',
    )
    [res] = backend.enqueue_many([nj], now=T0)
    job = backend.get(res.id)

    assert job is not None
    assert job.id == res.id
    assert job.task == "mod.send_email"
    assert job.queue == "emails"
    assert job.args == {"user_id": 42, "tags": ["a", "é"], "x": None}
    assert job.state is JobState.AVAILABLE
    assert job.attempts == 0
    assert job.max_attempts == 4
    assert job.priority == 3
    assert job.run_at == T0
    assert job.timeout == 12.5
    assert job.created_at == T0
    assert job.attempted_at is None
    assert job.finished_at is None
    assert job.result is None
    assert job.errors == []
    assert job.unique_key == "welcome:42"
    assert job.worker_id is None
    assert job.lease_token is None
    assert job.lease_expires_at is None
    assert job.meta == {"origin": "test"}


@pytest.mark.needs("lookup")
def test_get_of_a_missing_job_is_none(backend: Backend) -> None:
    job_id = enqueue_one(backend)
    assert backend.get(job_id + 1000) is None


# -- scheduling -----------------------------------------------------------------------------


@pytest.mark.needs("clock", "lookup")
def test_delayed_job_is_scheduled_and_promoted_when_due(backend: Backend) -> None:
    job_id = enqueue_one(backend, delay=10.0)
    job = backend.get(job_id)
    assert job is not None
    assert job.state is JobState.SCHEDULED
    assert job.run_at == T0 + 10

    assert backend.promote(now=T0 + 9.5) == 0
    assert backend.get(job_id).state is JobState.SCHEDULED  # type: ignore[union-attr]
    assert backend.claim("default", 5, worker_id="w", lease_s=30, now=T0 + 9.5) == []
    assert backend.get(job_id).state is JobState.SCHEDULED  # type: ignore[union-attr]

    assert backend.promote(now=T0 + 10) == 1
    job = backend.get(job_id)
    assert job is not None
    assert job.state is JobState.AVAILABLE
    assert job.run_at == T0 + 10
    assert job.attempts == 0


@pytest.mark.needs("clock")
def test_promote_is_bounded_by_limit(backend: Backend) -> None:
    ids = [enqueue_one(backend, delay=float(i + 1)) for i in range(5)]
    assert backend.promote(limit=2, now=T0 + 100) == 2
    states = [backend.get(i).state for i in ids]  # type: ignore[union-attr]
    assert states.count(JobState.AVAILABLE) == 2
    # The two that came due first went first.
    assert states[:2] == [JobState.AVAILABLE, JobState.AVAILABLE]
    assert backend.promote(limit=100, now=T0 + 100) == 3
    assert backend.promote(limit=100, now=T0 + 100) == 0


@pytest.mark.needs("clock")
def test_claim_promotes_due_scheduled_jobs(backend: Backend) -> None:
    job_id = enqueue_one(backend, delay=10.0)
    [job] = backend.claim("default", 5, worker_id="w", lease_s=30, now=T0 + 10)
    assert job.id == job_id
    assert job.state is JobState.RUNNING
    assert job.attempts == 1


@pytest.mark.needs("lookup")
def test_run_at_wins_over_delay_and_a_past_run_at_is_available_at_once(backend: Backend) -> None:
    later = enqueue_one(backend, run_at=T0 + 100, delay=1.0)
    past = enqueue_one(backend, run_at=T0 - 100)
    job = backend.get(later)
    assert job is not None and job.state is JobState.SCHEDULED and job.run_at == T0 + 100
    job = backend.get(past)
    assert job is not None and job.state is JobState.AVAILABLE and job.run_at == T0 - 100


# -- claim ----------------------------------------------------------------------------------


@pytest.mark.needs("ordering")
def test_claim_order_is_priority_then_run_at_then_id(backend: Backend) -> None:
    # (priority, run_at) in enqueue order; ids increase in this order.
    spec = [
        (5, T0 + 1),
        (0, T0 + 3),
        (0, T0 + 2),
        (0, T0 + 2),
        (-1, T0 + 4),
        (0, T0 + 1),
        (5, T0 + 0.5),
    ]
    ids = [enqueue_one(backend, priority=p, run_at=r) for p, r in spec]
    expected = [
        i for _, i in sorted(zip(spec, ids, strict=True), key=lambda x: (x[0][0], x[0][1], x[1]))
    ]

    now = T0 + 10  # everything is due (and promoted by the claim)
    first_two = backend.claim("default", 2, worker_id="w", lease_s=30, now=now)
    assert {j.id for j in first_two} == set(expected[:2])
    rest = []
    while batch := backend.claim("default", 1, worker_id="w", lease_s=30, now=now):
        rest.extend(j.id for j in batch)
    assert rest == expected[2:]


@pytest.mark.needs("lookup")
def test_claim_respects_limit(backend: Backend) -> None:
    ids = {enqueue_one(backend, args={"n": i}) for i in range(10)}
    assert backend.claim("default", 0, worker_id="w", lease_s=30, now=T0) == []
    assert all(backend.get(i).state is JobState.AVAILABLE for i in ids)  # type: ignore[union-attr]

    first = backend.claim("default", 3, worker_id="w", lease_s=30, now=T0)
    assert len(first) == 3
    running = [j for j in all_jobs(backend) if j.state is JobState.RUNNING]
    assert {j.id for j in running} == {j.id for j in first}

    rest = backend.claim("default", 100, worker_id="w", lease_s=30, now=T0)
    assert len(rest) == 7
    assert {j.id for j in first} | {j.id for j in rest} == ids
    assert backend.claim("default", 100, worker_id="w", lease_s=30, now=T0) == []


@pytest.mark.needs("lookup")
def test_claim_takes_only_its_own_queue(backend: Backend) -> None:
    a = {enqueue_one(backend, queue="a") for _ in range(3)}
    b = {enqueue_one(backend, queue="b") for _ in range(2)}
    got = backend.claim("a", 10, worker_id="w", lease_s=30, now=T0)
    assert {j.id for j in got} == a
    assert all(backend.get(i).state is JobState.AVAILABLE for i in b)  # type: ignore[union-attr]
    assert backend.claim("nothing-here", 10, worker_id="w", lease_s=30, now=T0) == []


@pytest.mark.needs("clock")
def test_claim_sets_running_attempt_lease_and_expiry(backend: Backend) -> None:
    job_id = enqueue_one(backend, max_attempts=3)
    [job] = backend.claim("default", 1, worker_id="worker-1", lease_s=45, now=T0 + 5)

    assert job.id == job_id
    assert job.state is JobState.RUNNING
    assert job.attempts == 1
    assert isinstance(job.lease_token, str) and len(job.lease_token) >= 16
    assert job.lease_expires_at == T0 + 5 + 45
    assert job.worker_id == "worker-1"
    assert job.attempted_at == T0 + 5

    stored = backend.get(job_id)
    assert stored == job  # the returned snapshot is what the store holds


@pytest.mark.needs("fair", "unique")
def test_a_claim_of_varied_jobs_returns_each_as_the_store_holds_it(backend: Backend) -> None:
    """Jobs of several kinds claimed in one call (a store may build the common kinds from a
    shared template): each returned job equals what get() reads back afterwards."""
    from conveyor.backends.base import ErrorInfo, Lease

    # A job that failed for good and was redriven (its error kept), then one with an earlier
    # failed attempt, one with a recorded step, and the common kinds.
    extra = enqueue_one(backend, args={"n": 8}, max_attempts=1, priority=-2, now=T0)
    [dead] = backend.claim("default", 1, worker_id="w0", lease_s=30, now=T0)
    backend.kill(Lease(dead.id, dead.lease_token), ErrorInfo("rejected", "Reject", "no"), now=T0)  # type: ignore[arg-type]
    batch = [
        new_job(args={"n": 0}, priority=-1),
        new_job(args={"n": 1}, meta='{"trace": {"traceparent": "00-abc-def-01"}}'),
        new_job(task="t.other", args={"n": 2}, priority=0, max_attempts=9, timeout=2.5),
        new_job(args={"n": 3}, unique_key="u-3"),
        new_job(args={"n": 4}, fair_key="tenant-a"),
        new_job(args={"n": 5}, concurrency_key="c", concurrency_limit=5),
        new_job(args={"n": 6}, rate_key="r", rate_limit=10, rate_period=1.0),
        new_job(args={"n": 7}),
    ]
    made = backend.enqueue_many(batch, now=T0 + 1)
    ids = [r.id for r in made]
    [first] = backend.claim("default", 1, worker_id="w0", lease_s=30, now=T0 + 1)
    assert first.id == ids[0]
    backend.retry(Lease(first.id, first.lease_token), ErrorInfo("exception", "Boom", "boom"),  # type: ignore[arg-type]
                  delay=0, now=T0 + 2)
    backend.record_step(ids[7], "charge", '{"ok": true}', uid=made[7].uid)
    assert backend.redrive([extra], now=T0 + 5) == 1

    claimed = backend.claim("default", 20, worker_id="w1", lease_s=30, now=T0 + 6)
    assert sorted(j.id for j in claimed) == sorted([*ids, extra])
    for job in claimed:
        assert job == backend.get(job.id), job.id
    by_id = {j.id: j for j in claimed}
    assert by_id[ids[0]].attempts == 2 and len(by_id[ids[0]].errors) == 1
    assert by_id[ids[1]].meta == {"trace": {"traceparent": "00-abc-def-01"}}
    assert by_id[ids[7]].steps == {"charge": {"ok": True}}
    assert by_id[extra].meta.get("redriven") == 1 and len(by_id[extra].errors) == 1


def test_two_claims_never_return_the_same_job(backend: Backend) -> None:
    ids = {enqueue_one(backend, args={"n": i}) for i in range(20)}
    seen: list[int] = []
    tokens: list[str] = []
    for k in range(8):
        batch = backend.claim("default", 3, worker_id=f"w{k}", lease_s=30, now=T0 + k)
        seen.extend(j.id for j in batch)
        tokens.extend(j.lease_token for j in batch)  # type: ignore[misc]
    assert len(seen) == len(set(seen)) == 20
    assert set(seen) == ids
    assert len(set(tokens)) == 20


def test_claims_hand_out_fresh_tokens_per_attempt(backend: Backend) -> None:
    from conveyor.backends.base import ErrorInfo, Lease

    enqueue_one(backend, max_attempts=3)
    [a] = backend.claim("default", 1, worker_id="w", lease_s=30, now=T0)
    backend.retry(Lease(a.id, a.lease_token), ErrorInfo("exception", "boom"), delay=0, now=T0 + 1)  # type: ignore[arg-type]
    [b] = backend.claim("default", 1, worker_id="w", lease_s=30, now=T0 + 2)
    assert b.id == a.id
    assert b.attempts == 2
    assert b.lease_token != a.lease_token
