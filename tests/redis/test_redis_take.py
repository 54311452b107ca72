"""take.lua (RedisBackend.take, a broker's delivery): a taken job sits in exactly the keys a
claim would have put it in, a job taken again in exactly those a reap and a claim would have
left, and reap treats a taken job whose lease ran out as it treats a claimed one. Compared
store against store, key by key (as test_enqueue_one does), on a private redis-server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redisrig import RedisServer
from support import T0
from test_enqueue_one import dump, plain, store

from conveyor.backends.base import Lease, new_claim_id
from conveyor.backends.redis import RedisBackend
from conveyor.backends.redis import enqueue as redis_enqueue
from conveyor.job import JobState

KEEP_ERRORS = 20  # _common.lua

# Jobs of the kinds whose indexes differ: a plain one (left in the inbox by enqueue_one), a
# scheduled one (the claim promotes it first), one with a fair key and a priority, one with a
# concurrency and a rate key (counted in the queue's 'gated', P:conc and P:rate).
KINDS = {
    "plain": {},
    "scheduled": {"delay": 60.0},
    "fair": {"fair_key": "tenant-a", "priority": 4},
    "limited": {"concurrency_key": "c", "concurrency_limit": 2, "rate_key": "r",
                "rate_limit": 5, "rate_period": 10.0},
}
LATER = {"scheduled": {"delay": 1000.0}}


@pytest.fixture
def twins(private_redis: RedisServer,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RedisBackend, RedisBackend]]:
    """Two stores on one server: 'claimed' (jobs go the claim's way) and 'taken' (a broker's);
    the n-th job enqueued has the same uid in both, so the stores can be compared whole."""
    claimed, taken = store(private_redis, "claimed"), store(private_redis, "taken")
    monkeypatch.setattr(redis_enqueue, "new_uids", lambda k: [f"{7:032x}"] * k)
    monkeypatch.setattr(redis_enqueue, "new_uid_text", lambda k: f"{7:032x}" * k)
    try:
        yield claimed, taken
    finally:
        claimed.close()
        taken.close()


def both(twins: tuple[RedisBackend, RedisBackend], job: Any, now: float) -> int:
    ids = {b.enqueue_many([job], now=now)[0].id for b in twins}
    [job_id] = ids
    return job_id


def same(r: redis.Redis, *, errors_alike: bool = False) -> None:
    a, b = dump(r, "claimed"), dump(r, "taken")
    if errors_alike:  # a reap and a take say why the lease was lost in words of their own
        for d in (a, b):
            for key in [k for k in d if k.startswith("{P}:errors:")]:
                d[key] = [{**json.loads(e), "message": "-"} for e in d[key]]
            d.pop("{P}:q:default:wake", None)  # reap woke the queue for the job it requeued
    assert a == b


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_taken_job_is_where_a_claim_puts_it(twins: tuple[RedisBackend, RedisBackend],
                                             private_redis: RedisServer, kind: str) -> None:
    claimed, taken = twins
    r = private_redis.client()
    both(twins, plain(0, **KINDS[kind]), T0)
    # A second job of the kind, which stays where it is (the scheduled one not yet due).
    job_id = both(twins, plain(1, **{**KINDS[kind], **LATER.get(kind, {})}), T0 + 0.5)
    now = T0 + 100  # past the scheduled job's run_at, so the claim finds it
    cid = new_claim_id()
    # The claim takes the first job of the queue: its twin in the other store is taken by id.
    [by_claim] = claimed.claim("default", 1, worker_id="w", lease_s=30, now=now, claim_id=cid)
    by_take = taken.take(by_claim.id, f"{cid}00000000", worker_id="w", lease_s=30, now=now)
    assert by_take is not None and by_take.id == by_claim.id == job_id - 1
    same(r)
    assert by_take == by_claim
    # The store's own reading of them agrees too, and the other job is untouched.
    assert taken.get(by_take.id) == claimed.get(by_claim.id)
    assert taken.get(job_id).state is claimed.get(job_id).state  # type: ignore[union-attr]
    # Their leases run out: reap treats the taken job as it treats the claimed one.
    later = now + 31
    assert taken.reap(now=later) == claimed.reap(now=later)
    same(r)
    requeued = taken.get(by_take.id)
    assert requeued is not None and requeued.state is JobState.AVAILABLE
    assert [e["kind"] for e in requeued.errors] == ["lease_expired"]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_job_taken_again_is_where_a_reap_and_a_claim_leave_it(
        twins: tuple[RedisBackend, RedisBackend], private_redis: RedisServer, kind: str) -> None:
    """The broker handed a running job out again: the store ends as if its lease had expired,
    been reaped (the lost attempt recorded and counted) and the job claimed by the new holder,
    in one step, whatever the lease's time left."""
    claimed, taken = twins
    r = private_redis.client()
    job_id = both(twins, plain(0, **KINDS[kind]), T0)
    first, second = new_claim_id(), new_claim_id()
    now = T0 + 100
    [job] = claimed.claim("default", 1, worker_id="w1", lease_s=2, now=now, claim_id=first)
    assert job.id == job_id
    assert taken.take(job_id, f"{first}00000000", worker_id="w1", lease_s=2, now=now) is not None
    later = now + 5
    # (A backend's first reap marks its store indexed: the taken store's finds nothing due.)
    assert taken.reap(now=now).requeued == []
    assert claimed.reap(now=later).requeued == [job_id]
    [again] = claimed.claim("default", 1, worker_id="w2", lease_s=30, now=later,
                            claim_id=second)
    retaken = taken.take(job_id, f"{second}00000000", worker_id="w2", lease_s=30, now=later)
    assert retaken is not None
    same(r, errors_alike=True)
    assert retaken.attempts == again.attempts == 2
    assert retaken.lease_expires_at == again.lease_expires_at == later + 30
    assert [(e["attempt"], e["kind"], e["worker_id"]) for e in retaken.errors] == [
        (1, "lease_expired", "w1")]
    assert "the broker handed the job out again" in retaken.errors[0]["message"]
    stats = {q.queue: q for q in taken.stats(now=later).queues}
    assert stats["default"].lease_expiries == 1 and stats["default"].running == 1


def test_a_spent_job_taken_again_is_where_a_reap_leaves_it_dead(
        twins: tuple[RedisBackend, RedisBackend], private_redis: RedisServer) -> None:
    """Its last attempt's holder stopped answering: the store ends as a reap leaves a job out of
    attempts (dead, its unique key freed, its waiting child in another queue cancelled), and
    nothing is taken. The taker knows neither queue: the script asks for both blocks."""
    claimed, taken = twins
    r = private_redis.client()
    parent = both(twins, plain(0, max_attempts=1, unique_key="u"), T0)
    child = both(twins, plain(1, queue="other", after=(parent,)), T0)
    cid, now = new_claim_id(), T0 + 100
    [job] = claimed.claim("default", 1, worker_id="w1", lease_s=2, now=now, claim_id=cid)
    assert job.id == parent
    fresh = store(private_redis, "taken")  # knows no job's queue
    try:
        assert fresh.take(parent, f"{cid}00000000", worker_id="w1", lease_s=2,
                          now=now) is not None
        assert fresh.reap(now=now).requeued == []  # (marks the store indexed, as below)
        later = now + 5
        assert claimed.reap(now=later).dead == [parent]
        assert fresh.take(parent, new_claim_id() + "1", worker_id="w2", lease_s=30,
                          now=later) is None
    finally:
        fresh.close()
    same(r, errors_alike=True)
    dead = taken.get(parent)
    assert dead is not None and dead.state is JobState.DEAD and dead.attempts == 1
    assert dead.finished_at == later and dead.lease_token is None
    assert "no attempts left" in dead.errors[-1]["message"]
    assert taken.get(child).state is JobState.CANCELLED  # type: ignore[union-attr]
    assert taken.enqueue_many([plain(2, unique_key="u")], now=later)[0].created


def test_a_lease_still_running_is_replaced_in_every_index(backend: RedisBackend,
                                                          private_redis: RedisServer) -> None:
    """Taken again before its lease ran out: the new expiry is the job's score in the queue's
    running set, in P:leases and in P:conc:<key>, and the old holder is fenced."""
    r = private_redis.client()
    [res] = backend.enqueue_many([plain(0, concurrency_key="c", concurrency_limit=1)], now=T0)
    old, new = new_claim_id() + "1", new_claim_id() + "1"
    assert backend.take(res.id, old, worker_id="w1", lease_s=30, now=T0 + 1) is not None
    job = backend.take(res.id, new, worker_id="w2", lease_s=60, now=T0 + 2)
    assert job is not None and job.lease_token == new and job.worker_id == "w2"
    p = "{" + backend.prefix + "}"
    for key, member in ((f"{p}:q:default:running", str(res.id)),
                        (f"{p}:leases", f"{res.id}/default"),
                        (f"{p}:conc:c", str(res.id))):
        assert r.zrange(key, 0, -1, withscores=True) == [(member, T0 + 62)], key
    assert r.zrange(f"{p}:state:running", 0, -1) == [str(res.id)]
    assert backend.heartbeat([Lease(res.id, old)], lease_s=30, now=T0 + 3) == {res.id}
    assert backend.heartbeat([Lease(res.id, new)], lease_s=30, now=T0 + 3) == set()


def test_a_rate_key_keeps_only_its_open_windows(backend: RedisBackend,
                                               private_redis: RedisServer) -> None:
    """Each take is a claim of its rate key, as claim.lua records one; the windows that closed
    are dropped as it records it, so a companion that only takes does not grow the key."""
    r = private_redis.client()
    [res] = backend.enqueue_many([plain(0, max_attempts=9, rate_key="r", rate_limit=5,
                                        rate_period=10.0)], now=T0)
    for n in range(4):
        tok = f"{new_claim_id()}{n:08x}"
        assert backend.take(res.id, tok, worker_id="w", lease_s=5, now=T0 + 20 * n) is not None
    key = "{" + backend.prefix + "}:rate:r"
    assert r.zrange(key, 0, -1, withscores=True) == [(f"{res.id}:{tok}", T0 + 70)]
    assert 0 < r.pttl(key) <= 10_001


def test_lost_attempts_keep_the_last_errors_as_reap_does(backend: RedisBackend) -> None:
    [res] = backend.enqueue_many([plain(0, max_attempts=100)], now=T0)
    takes = KEEP_ERRORS + 3
    for n in range(takes):
        job = backend.take(res.id, f"{new_claim_id()}{n:08x}", worker_id=f"w{n}", lease_s=30,
                           now=T0 + n)
        assert job is not None and job.attempts == n + 1
    assert job is not None
    assert [e["attempt"] for e in job.errors] == list(range(takes - KEEP_ERRORS, takes))
    assert job.errors[-1]["worker_id"] == f"w{takes - 2}"
    [q] = backend.stats(now=T0 + takes).queues
    assert q.lease_expiries == takes - 1  # every lease lost, counted as reap counts one


def test_the_same_delivery_taken_twice_is_one_take(backend: RedisBackend) -> None:
    """A repeat with the same token (a reply lost, the call sent again) is the same delivery:
    the job comes back as the first call left it, no attempt lost."""
    [res] = backend.enqueue_many([plain(0)], now=T0)
    tok = new_claim_id() + "1"
    first = backend.take(res.id, tok, worker_id="w1", lease_s=30, now=T0 + 1)
    again = backend.take(res.id, tok, worker_id="w1", lease_s=30, now=T0 + 2)
    assert first is not None and again == first and again.attempts == 1 and again.errors == []


def test_a_job_in_the_inbox_is_taken_by_a_backend_that_never_saw_it(
        private_redis: RedisServer) -> None:
    """The producer's enqueue_one left the job's index entries in the queue's inbox, and the
    taker does not know the job's queue: the script asks for the block ('need'), the prelude
    folds the inbox, and the job leaves available whole."""
    producer, taker = store(private_redis, "inbox"), store(private_redis, "inbox")
    r = private_redis.client()
    try:
        [res] = producer.enqueue_many([plain(0)], now=T0)
        p = "{inbox}"
        assert r.llen(f"{p}:q:default:inbox") == 1
        job = taker.take(res.id, new_claim_id() + "1", worker_id="w", lease_s=30, now=T0 + 1)
        assert job is not None and job.queue == "default" and job.state is JobState.RUNNING
        assert r.llen(f"{p}:q:default:inbox") == 0
        assert r.zcard(f"{p}:q:default:available") == r.zcard(f"{p}:q:default:due") == 0
        assert r.zrange(f"{p}:state:available", 0, -1) == []
        assert r.zrange(f"{p}:q:default:running", 0, -1) == [str(res.id)]
        assert "m" not in r.hgetall(f"{p}:job:{res.id}")
        assert producer.claim("default", 1, worker_id="w2", lease_s=30, now=T0 + 2) == []
    finally:
        producer.close()
        taker.close()


def test_refused_jobs_leave_the_store_as_it_was(backend: RedisBackend,
                                                private_redis: RedisServer) -> None:
    r = private_redis.client()
    [done, parent] = backend.enqueue_many([plain(0), plain(1)], now=T0)
    tok = new_claim_id() + "1"
    assert backend.take(done.id, tok, worker_id="w", lease_s=30, now=T0 + 1) is not None
    backend.ack(Lease(done.id, tok), None, now=T0 + 2)
    [child] = backend.enqueue_many([plain(2, after=(parent.id,))], now=T0 + 3)
    backend.stats()  # folds the inbox: what follows may change nothing at all
    before = dump(r, backend.prefix)
    for job_id in (done.id, child.id, 987654321):
        assert backend.take(job_id, new_claim_id() + "1", worker_id="w", lease_s=30,
                            now=T0 + 4) is None
    assert dump(r, backend.prefix) == before
