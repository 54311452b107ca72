"""A settle (ack, retry, kill) whose reply was lost, tried again by a later call: the backend
reports what the store holds, instead of "lease lost" for its own success.

The replies are lost for real: the backend talks to a private redis-server through the fault
tests' TCP proxy, which forwards the commands and drops the replies (half-open)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redisrig import RedisServer

import conveyor.backends.redis.transport as redis_transport
from conveyor import JobState, LeaseLost
from conveyor.backends.base import ErrorInfo, Lease, NewJob
from conveyor.backends.redis import RedisBackend
from conveyor.errors import StoreUnavailable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "faults"))
from proxy import Proxy

T0 = 1_700_000_000.0


@pytest.fixture
def proxied(private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RedisBackend, Proxy]]:
    monkeypatch.setattr(redis_transport, "RETRY_BUDGET", 0.5)  # give up soon while replies are dropped
    with Proxy("127.0.0.1", private_redis.port) as proxy:
        backend = RedisBackend(proxy.url_for(private_redis.url) + "&socket_timeout=0.3&socket_connect_timeout=0.3")
        try:
            yield backend, proxy
        finally:
            backend.close()


def claimed(backend: RedisBackend) -> Lease:
    """A job claimed, after an ack and a kill of others: the server has those scripts loaded
    (a first EVALSHA answered NOSCRIPT would not have run)."""
    new = NewJob(task="t", queue="default", args="{}", max_attempts=3, timeout=30.0)
    backend.enqueue_many([new, new, new], now=T0)
    first, second, job = backend.claim("default", 3, worker_id="w", lease_s=30, now=T0)
    backend.ack(Lease(first.id, first.lease_token or ""), None, now=T0)
    backend.kill(Lease(second.id, second.lease_token or ""), ErrorInfo("rejected", "no"), now=T0)
    return Lease(job.id, job.lease_token or "")


def test_an_ack_tried_again_after_its_reply_was_lost_reports_success(
        proxied: tuple[RedisBackend, Proxy], private_redis: RedisServer) -> None:
    backend, proxy = proxied
    lease = claimed(backend)
    proxy.half_open()
    with pytest.raises(StoreUnavailable) as lost:
        backend.ack(lease, json.dumps("done"), now=T0 + 1)
    # Its retries could not reconnect (nothing sent), but the first try was sent: not "nothing was done".
    assert "nothing was done" not in str(lost.value) and "may" in str(lost.value), str(lost.value)
    admin = private_redis.client()
    try:
        key = f"{{{private_redis.prefix}}}:job:{lease.job_id}"
        assert admin.hget(key, "state") == "succeeded"  # the store holds the success
        proxy.heal()
        backend.ack(lease, json.dumps("done"), now=T0 + 2)  # the worker's next try: no LeaseLost
        job = backend.get(lease.job_id)
        assert job is not None and job.state is JobState.SUCCEEDED
        assert (job.result, job.finished_at) == ("done", T0 + 1)  # the first ack's, unchanged
        # Reported once, it is settled: a further repeat is refused as any second ack is.
        with pytest.raises(LeaseLost):
            backend.ack(lease, json.dumps("done"), now=T0 + 3)
    finally:
        admin.close()


def test_a_kill_tried_again_after_its_reply_was_lost_reports_success(proxied: tuple[RedisBackend, Proxy]) -> None:
    backend, proxy = proxied
    lease = claimed(backend)
    proxy.half_open()
    with pytest.raises(StoreUnavailable):
        backend.kill(lease, ErrorInfo("rejected", "no"), now=T0 + 1)
    proxy.heal()
    backend.kill(lease, ErrorInfo("rejected", "no"), now=T0 + 2)
    job = backend.get(lease.job_id)
    assert job is not None and job.state is JobState.DEAD and len(job.errors) == 1


def test_an_ack_whose_lost_first_try_did_not_land_is_still_refused(
        proxied: tuple[RedisBackend, Proxy]) -> None:
    """The lost reply was a refusal (the lease had expired): the retry must not report success."""
    backend, proxy = proxied
    lease = claimed(backend)
    proxy.half_open()
    with pytest.raises(StoreUnavailable):
        backend.ack(lease, json.dumps("late"), now=T0 + 31)  # past the lease: refused, unseen
    proxy.heal()
    with pytest.raises(LeaseLost):
        backend.ack(lease, json.dumps("late"), now=T0 + 32)
    job = backend.get(lease.job_id)
    assert job is not None and job.state is JobState.RUNNING


def test_acks_in_a_batch_tried_again_after_the_reply_was_lost_report_success(
        proxied: tuple[RedisBackend, Proxy]) -> None:
    """The worker's batched acks (ack_many, and ack_and_claim's) tried again after a lost reply."""
    backend, proxy = proxied
    new = NewJob(task="t", queue="default", args="{}", max_attempts=3, timeout=30.0)
    backend.enqueue_many([new] * 4, now=T0)
    warm = backend.claim("default", 2, worker_id="w", lease_s=30, now=T0)
    backend.ack_many([(Lease(j.id, j.lease_token or ""), None) for j in warm], now=T0)  # script loaded
    jobs = backend.claim("default", 2, worker_id="w", lease_s=30, now=T0)
    acks = [(Lease(j.id, j.lease_token or ""), json.dumps(j.id)) for j in jobs]
    proxy.half_open()
    with pytest.raises(StoreUnavailable):
        backend.ack_many(acks, now=T0 + 1)
    proxy.heal()
    assert backend.ack_many(acks, now=T0 + 2) == [True, True]
    for j in jobs:
        done = backend.get(j.id)
        assert done is not None and done.state is JobState.SUCCEEDED and done.result == j.id
