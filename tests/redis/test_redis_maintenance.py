"""Redis maintenance scales with the work due, not with the queues ever used (issue 32 item 4):
reap and promote read global indexes (P:leases, P:schedule) and ask only for the blocks of the
queues of the jobs they touch; one worker per interval runs them; cancel sends one queue's keys.
Costs are counted as the keys each script call carries, never as time."""

from __future__ import annotations

from typing import Any

from redisrig import RedisServer, wait_until
from support import running_worker

from conveyor import Conveyor, JobState
from conveyor.backends import open_backend
from conveyor.backends.base import ErrorInfo, Lease, NewJob
from conveyor.backends.redis import SWEEP_PER_REAP, RedisBackend, maintenance
from conveyor.backends.redis.keys import QUEUE_KEYS, STORE_KEYS

T0 = 1_700_000_000.0
HEADER = len(STORE_KEYS)  # keys of the common header (see _common.lua)
BLOCK = len(QUEUE_KEYS)  # keys per queue block


def job(queue: str, **kw: Any) -> NewJob:
    kw.setdefault("max_attempts", 3)
    return NewJob(task="t", queue=queue, args="{}", timeout=30.0, **kw)


def spy(backend: RedisBackend) -> list[tuple[str, int]]:
    """(script name, number of keys) of every script call the backend makes from now on."""
    calls: list[tuple[str, int]] = []
    real = backend._script

    def counted(name: str, keys: Any, args: Any) -> Any:
        calls.append((name.partition(":")[0], len(keys)))
        return real(name, keys, args)

    backend._script = counted  # type: ignore[method-assign]
    return calls


def many_queues(backend: RedisBackend, n: int) -> None:
    """n queues, each with one job scheduled far ahead and one running on a far lease."""
    for start in range(0, n, 500):
        names = [f"q{i}" for i in range(start, min(n, start + 500))]
        backend.enqueue_many([job(q, delay=3600) for q in names] + [job(q) for q in names], now=T0)
        for q in names:
            assert len(backend.claim(q, 1, worker_id="w", lease_s=3600, now=T0)) == 1


def test_reap_and_promote_carry_the_keys_of_the_due_work_only(backend: RedisBackend) -> None:
    many_queues(backend, 2000)
    [short] = backend.enqueue_many([job("late")], now=T0)
    assert backend.claim("late", 1, worker_id="w", lease_s=5, now=T0)
    [due] = backend.enqueue_many([job("soon", delay=10)], now=T0)
    backend.reap(now=T0 + 1)  # the first maintenance call of this backend looks the store over once
    calls = spy(backend)

    reaped = backend.reap(now=T0 + 20)
    promoted = backend.promote(now=T0 + 20)

    assert reaped.requeued == [short.id]
    assert promoted == 1
    assert backend.get(due.id).state.value == "available"  # type: ignore[union-attr]
    # The queue set holds 2,002 queues (22,022 keys as blocks). Each call is one script: the
    # client reads the due entries' queues first. A promote carries the header and the one block
    # it needs; a reap also the fixed slice of queues it sweeps (see sweep_queue).
    calls = [c for c in calls if c[0] != "get"]
    assert [name for name, _ in calls] == ["reap", "promote"], calls
    assert calls[0][1] <= HEADER + BLOCK * (1 + SWEEP_PER_REAP), calls
    assert calls[1][1] == HEADER + BLOCK, calls


def test_idle_maintenance_sends_only_the_header_and_the_sweep_slice(backend: RedisBackend) -> None:
    many_queues(backend, 300)
    backend.reap(now=T0 + 1)
    calls = spy(backend)
    assert backend.reap(now=T0 + 2).count == 0
    assert backend.promote(now=T0 + 2) == 0
    assert calls == [("reap", HEADER + BLOCK * SWEEP_PER_REAP), ("promote", HEADER)]


def test_cancel_sends_the_keys_of_the_jobs_own_queue(backend: RedisBackend, private_redis: RedisServer) -> None:
    many_queues(backend, 500)
    [target] = backend.enqueue_many([job("q7", delay=60)], now=T0)
    other = open_backend(private_redis.url)  # no cache of which queue the job is in
    assert isinstance(other, RedisBackend)
    try:
        other.stats(now=T0)  # it knows every queue's name, as a dashboard would
        calls = spy(other)
        assert other.cancel(target.id, now=T0 + 1)
        assert all(n <= HEADER + BLOCK for _, n in calls), calls
        assert len(calls) <= 2
    finally:
        other.close()


def test_a_store_written_before_the_global_indexes_is_swept_into_them(
        backend: RedisBackend, private_redis: RedisServer) -> None:
    [leased] = backend.enqueue_many([job("a")], now=T0)
    assert backend.claim("a", 1, worker_id="w", lease_s=5, now=T0)
    [later] = backend.enqueue_many([job("b", delay=10)], now=T0)
    r = private_redis.client()
    p = backend.keys.p
    # What the previous version left: per-queue ZSETs only, no global index, no mark.
    r.delete(f"{p}:leases", f"{p}:schedule", f"{p}:indexed")
    fresh = open_backend(private_redis.url)
    assert isinstance(fresh, RedisBackend)
    try:
        assert fresh.reap(now=T0 + 20).requeued == [leased.id]
        assert fresh.promote(now=T0 + 20) == 1
        assert fresh.get(later.id).state.value == "available"  # type: ignore[union-attr]
        assert r.get(f"{p}:indexed") == "1"
        # A worker of the old version, still running during the upgrade, leases a job without
        # telling P:leases: the per-reap sweep finds it within one round of the queue set.
        [straggler] = fresh.enqueue_many([job("c")], now=T0 + 20)
        assert fresh.claim("c", 1, worker_id="old", lease_s=5, now=T0 + 20)
        r.delete(f"{p}:leases")
        requeued: list[int] = []
        for k in range(5):
            requeued += fresh.reap(now=T0 + 40 + k).requeued
        assert requeued == [straggler.id]
    finally:
        fresh.close()


def test_one_maintenance_turn_per_interval_across_backends(
        backend: RedisBackend, private_redis: RedisServer) -> None:
    other = open_backend(private_redis.url)
    try:
        turns = [b.maintenance_turn(60.0) for b in (backend, other, backend, other)]
        assert turns == [True, False, False, False]
    finally:
        other.close()


def test_a_queue_whose_jobs_are_all_deleted_is_forgotten_and_comes_back_on_enqueue(
        backend: RedisBackend, private_redis: RedisServer) -> None:
    r = private_redis.client()
    queues = backend.keys.queues
    [done] = backend.enqueue_many([job("gone")], now=T0)
    backend.enqueue_many([job("kept", delay=3600)], now=T0)
    [claimed] = backend.claim("gone", 1, worker_id="w", lease_s=30, now=T0)
    backend.ack(Lease(claimed.id, claimed.lease_token or ""), None, now=T0 + 1)
    assert r.smembers(queues) == {"gone", "kept"}
    assert backend.prune(older_than=10, now=T0 + 100) == 1
    assert backend.get(done.id) is None
    assert r.smembers(queues) == {"kept"}  # a queue with a scheduled job stays
    assert not r.exists(backend.keys.queue("gone", "fair"))
    assert [q.queue for q in backend.stats(now=T0 + 100).queues] == ["kept"]
    backend.enqueue_many([job("gone")], now=T0 + 200)  # the general script
    assert r.smembers(queues) == {"gone", "kept"}
    [again] = backend.claim("gone", 1, worker_id="w", lease_s=30, now=T0 + 200)
    backend.ack(Lease(again.id, again.lease_token or ""), None, now=T0 + 201)
    assert backend.purge(state=JobState.SUCCEEDED) == 1
    assert r.smembers(queues) == {"kept"}
    backend.enqueue_many([NewJob(task="t", queue="gone", args="{}", max_attempts=3, timeout=30.0)])
    assert r.smembers(queues) == {"gone", "kept"}  # enqueue_one (a plain job due now) names it too
    assert [q.queue for q in backend.stats().queues] == ["gone", "kept"]


def test_a_forgotten_queue_keeps_its_lease_expiries_in_stats(backend: RedisBackend) -> None:
    backend.enqueue_many([job("q", max_attempts=1)], now=T0)
    assert backend.claim("q", 1, worker_id="w", lease_s=5, now=T0)
    assert len(backend.reap(now=T0 + 10).dead) == 1
    assert backend.purge(state=JobState.DEAD) == 1
    [q] = backend.stats(now=T0 + 20).queues
    assert (q.queue, q.dead, q.lease_expiries) == ("q", 0, 1)


def test_a_client_that_knew_a_forgotten_queue_is_told_its_list_is_stale(
        backend: RedisBackend, private_redis: RedisServer) -> None:
    backend.enqueue_many([job("a"), job("b", delay=60)], now=T0)
    other = open_backend(private_redis.url)
    assert isinstance(other, RedisBackend)
    try:
        other.stats(now=T0)  # knows a and b
        [a] = backend.claim("a", 1, worker_id="w", lease_s=30, now=T0)
        backend.ack(Lease(a.id, a.lease_token or ""), None, now=T0)
        backend.prune(older_than=0, now=T0 + 1)
        backend.enqueue_many([job("c", delay=60)], now=T0)  # as many queues as before, not the same
        assert sorted(q.queue for q in other.stats(now=T0 + 1).queues) == ["b", "c"]
    finally:
        other.close()


def test_a_worker_reaps_only_in_its_maintenance_turn(private_redis: RedisServer) -> None:
    app = Conveyor(private_redis.url)
    holder = open_backend(private_redis.url)
    try:
        [expired] = app.backend.enqueue_many([job("default")])
        assert app.backend.claim("default", 1, worker_id="gone", lease_s=0.001)
        assert holder.maintenance_turn(3600.0)  # another worker has this interval's turn
        turns: list[bool] = []
        real_turn = app.backend.maintenance_turn

        def counted(interval: float) -> bool:
            took = real_turn(interval)
            turns.append(took)
            return took

        app.backend.maintenance_turn = counted  # type: ignore[method-assign]
        with running_worker(app, maintenance_interval=0.02, queues=["other"]):
            wait_until(lambda: len(turns) >= 5, 20, "five maintenance rounds")
            assert app.backend.get(expired.id).state is JobState.RUNNING  # type: ignore[union-attr]
            private_redis.client().delete(app.backend.keys.maintenance)  # type: ignore[attr-defined]
            wait_until(lambda: app.backend.get(expired.id).state is JobState.AVAILABLE,  # type: ignore[union-attr]
                       20, "the reap in the worker's own turn")
        assert turns[:5] == [False] * 5 and True in turns
    finally:
        holder.close()
        app.close()


def finish_in(backend: RedisBackend, queues: list[str], at: float) -> list[int]:
    """One job per queue, claimed and acked at ``at``: its ids, in the order of ``queues``."""
    ids = [j.id for j in backend.enqueue_many([job(q) for q in queues], now=at)]
    for q in queues:
        [c] = backend.claim(q, 1, worker_id="w", lease_s=30, now=at)
        backend.ack(Lease(c.id, c.lease_token or ""), None, now=at)
    return ids


def test_prune_carries_the_keys_of_the_due_jobs_and_a_slice_of_queues(
        backend: RedisBackend) -> None:
    finish_in(backend, [f"q{i}" for i in range(2000)], T0 + 1000)  # finished, not yet due
    # Due jobs in five other queues, finished in the reverse order of their queue names.
    due = [finish_in(backend, [f"d{k}"], T0 + 100 - 10 * k)[0] for k in range(5)]
    [dead] = backend.enqueue_many([job("x", max_attempts=1)], now=T0)
    assert backend.claim("x", 1, worker_id="w", lease_s=5, now=T0)
    assert backend.reap(now=T0 + 10).dead == [dead.id]
    # The first prune of this backend looks the store over once (see the upgrade test).
    assert backend.prune(older_than=500, states=(JobState.CANCELLED,), now=T0 + 1100) == 0
    calls = spy(backend)

    assert backend.prune(older_than=500, limit=3, now=T0 + 1100) == 3
    assert [backend.get(i) is None for i in due] == [False, False, True, True, True]
    # 2,007 queues (22,077 keys as blocks): one prune carries the header, the blocks of the
    # queues of the due jobs it reads (up to twice the limit: it passes over a job whose child is
    # unfinished) and the fixed slice of queues whose fair hashes it tidies.
    calls = [c for c in calls if c[0] != "get"]
    assert len(calls) == 1 and calls[0][0] == "prune", calls
    assert calls[0][1] <= HEADER + BLOCK * (2 * 3 + SWEEP_PER_REAP), calls

    assert backend.prune(older_than=500, states=(JobState.SUCCEEDED, JobState.DEAD),
                         limit=10, now=T0 + 1100) == 3
    assert all(backend.get(i) is None for i in [*due, dead.id])
    assert backend.prune(older_than=500, limit=10, now=T0 + 1100) == 0
    assert sum(q.succeeded for q in backend.stats(now=T0 + 1100).queues) == 2000


def test_a_store_written_before_the_finished_index_is_pruned_oldest_first(
        backend: RedisBackend, private_redis: RedisServer) -> None:
    old = [finish_in(backend, [f"q{k}"], T0 + 100 - k)[0] for k in range(30)]  # q29 oldest
    [recent] = finish_in(backend, ["q0"], T0 + 1000)
    r = private_redis.client()
    p = backend.keys.p
    # What the previous version left: finished jobs in the queues' own sets only.
    r.delete(*(f"{p}:done:{s}" for s in ("succeeded", "dead", "cancelled")), f"{p}:indexed:done")
    fresh = open_backend(private_redis.url)
    assert isinstance(fresh, RedisBackend)
    try:
        assert fresh.prune(older_than=500, limit=10, now=T0 + 1100) == 10
        assert [fresh.get(i) is None for i in old] == [False] * 20 + [True] * 10
        assert fresh.prune(older_than=500, limit=100, now=T0 + 1100) == 20
        assert fresh.get(recent) is not None
        assert r.get(f"{p}:indexed:done") == "1"
        # A worker of the old version, still running during the upgrade, finishes a job without
        # telling the index: the per-prune sweep slice finds it within one round of the queues.
        [straggler] = finish_in(fresh, ["q5"], T0 + 1200)
        r.delete(f"{p}:done:succeeded")
        pruned = sum(fresh.prune(older_than=500, now=T0 + 2000 + k) for k in range(5))
        assert pruned == 2
        assert fresh.get(straggler) is None and fresh.get(recent) is None
    finally:
        fresh.close()


def test_every_finish_and_removal_keeps_the_finished_index_in_step(
        backend: RedisBackend, private_redis: RedisServer) -> None:
    r = private_redis.client()

    def leased(queue: str, **kw: Any) -> Lease:
        backend.enqueue_many([job(queue, **kw)], now=T0)
        [c] = backend.claim(queue, 1, worker_id="w", lease_s=5, now=T0)
        return Lease(c.id, c.lease_token or "")

    def in_step() -> None:
        for s in ("succeeded", "dead", "cancelled"):
            own = {f"{m}/{q}": score for q in r.smembers(backend.keys.queues)
                   for m, score in r.zrange(backend.keys.queue(q, s), 0, -1, withscores=True)}
            assert dict(r.zrange(backend.keys.done_index(s), 0, -1, withscores=True)) == own, s

    backend.ack(leased("a"), None, now=T0 + 1)
    assert backend.ack_many([(leased("b"), None), (leased("a"), '"x"')], now=T0 + 2) == [True] * 2
    backend.kill(leased("c"), ErrorInfo("rejected", "no"), now=T0 + 3)
    assert backend.retry(leased("d", max_attempts=1), ErrorInfo("exception", "x"), delay=0,
                         now=T0 + 4) == JobState.DEAD
    leased("e", max_attempts=1)
    assert len(backend.reap(now=T0 + 60).dead) == 1
    [waiting] = backend.enqueue_many([job("f", delay=60)], now=T0)
    assert backend.cancel(waiting.id, now=T0 + 5)
    in_step()
    assert len(r.zrange(backend.keys.done_index("dead"), 0, -1)) == 3
    assert backend.redrive(queue="c", now=T0 + 70) == 1
    assert backend.purge(state=JobState.DEAD, queue="d") == 1
    assert backend.purge(state=JobState.CANCELLED) == 1
    in_step()
    assert len(r.zrange(backend.keys.done_index("dead"), 0, -1)) == 1
    assert backend.prune(older_than=0, states=(JobState.SUCCEEDED, JobState.DEAD),
                         now=T0 + 100) == 4
    in_step()
    assert all(r.zcard(backend.keys.done_index(s)) == 0 for s in ("succeeded", "dead"))


def test_the_finished_index_copy_pages_through_a_long_set_with_equal_times(
        backend: RedisBackend, private_redis: RedisServer, monkeypatch: Any) -> None:
    monkeypatch.setattr(maintenance, "DONE_SWEEP_BUDGET", 0)  # 100 entries per set and call
    for n, at in ((120, T0 + 1), (130, T0 + 2)):  # each batch finished at one time
        backend.enqueue_many([job("a") for _ in range(n)], now=T0)
        claimed = backend.claim("a", n, worker_id="w", lease_s=30, now=T0)
        assert all(backend.ack_many([(Lease(c.id, c.lease_token or ""), None) for c in claimed],
                                    now=at))
    r = private_redis.client()
    p = backend.keys.p
    r.delete(f"{p}:done:succeeded", f"{p}:indexed:done")
    fresh = open_backend(private_redis.url)
    assert isinstance(fresh, RedisBackend)
    try:
        calls = spy(fresh)
        assert fresh.prune(older_than=0, now=T0 + 10) == 250
        # 100 of the first time and its 20 ties, then 100 of the second and its 30, then none.
        assert [name for name, _ in calls] == ["sweep_done"] * 3 + ["prune"]
    finally:
        fresh.close()
