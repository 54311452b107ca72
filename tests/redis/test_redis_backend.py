"""Redis-only properties the shared conformance suite cannot see: the key layout, exact claim
order, wake-ups without polling, timeouts, and the persistence warnings.

Each test runs on a private redis-server (see conftest.py), never the shared one."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from redisrig import RedisServer

import conveyor.backends.redis.admin as redis_admin
import conveyor.backends.redis.transport as redis_transport
from conveyor import JobState, StorageFull, StoreError
from conveyor.backends import open_backend
from conveyor.backends.base import ErrorInfo, Lease, NewJob, WorkerInfo
from conveyor.backends.redis import RedisBackend
from conveyor.errors import StoreUnavailable

T0 = 1_700_000_000.0


def job(queue: str = "default", *, task: str = "t", max_attempts: int = 3, **kw: Any) -> NewJob:
    return NewJob(task=task, queue=queue, args="{}", max_attempts=max_attempts, timeout=30.0, **kw)


def test_every_key_has_the_prefix_and_one_cluster_slot(backend: RedisBackend, private_redis: RedisServer) -> None:
    ids = [r.id for r in backend.enqueue_many(
        [job("a"), job("b", delay=5), job("a", unique_key="u:1"), job("c", max_attempts=1)], now=T0)]
    [a] = backend.claim("a", 1, worker_id="w", lease_s=30, now=T0)
    backend.retry(Lease(a.id, a.lease_token or ""), ErrorInfo("exception", "x"), delay=10, now=T0 + 1)
    [c] = backend.claim("c", 1, worker_id="w", lease_s=30, now=T0)
    backend.kill(Lease(c.id, c.lease_token or ""), ErrorInfo("rejected", "no"), now=T0 + 1)
    backend.redrive([c.id], now=T0 + 2)
    backend.cancel(ids[1], now=T0 + 3)
    backend.reap(now=T0 + 100)
    backend.record_worker(WorkerInfo("w", ["a"], 1, "h", 1, T0, 0.0), now=T0)
    backend.stats(now=T0)
    backend.wait_for_jobs(["a"], 0.01)

    c2 = private_redis.client()
    keys = list(c2.scan_iter(count=1000))
    c2.close()
    assert keys, "nothing was written"
    tag = "{" + private_redis.prefix + "}:"
    assert all(k.startswith(tag) for k in keys), [k for k in keys if not k.startswith(tag)]
    assert {key_slot(k.encode()) for k in keys} == {key_slot(tag.encode())}


def test_apps_with_different_prefixes_do_not_see_each_other(private_redis: RedisServer) -> None:
    one = open_backend(private_redis.url.replace(private_redis.prefix, "app_one"))
    two = open_backend(private_redis.url.replace(private_redis.prefix, "app_two"))
    try:
        one.enqueue_many([job("shared")], now=T0)
        assert two.claim("shared", 10, worker_id="w", lease_s=30, now=T0) == []
        assert two.list_jobs().jobs == []
        assert [q.queue for q in one.stats(now=T0).queues] == ["shared"]
        assert two.stats(now=T0).queues == []
    finally:
        one.close()
        two.close()


def test_bad_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="prefix"):
        open_backend("redis://127.0.0.1:1/0?prefix=a{b}")


def test_claim_order_is_exact_for_close_run_at_negative_times_and_extreme_priorities(
    backend: RedisBackend,
) -> None:
    # run_at values a microsecond and less apart, around zero and below it, at both ends of
    # the priority range: a float composite score would tie or misorder several of them.
    run_ats = [T0 + 1e-6, T0, T0 + 2e-7, T0 - 1e-6, 0.0, -1.0, -1e9, 1e-300, 5e-324, T0 + 1, -5e-324]
    specs = [(p, r) for p in (32767, 0, -32768) for r in run_ats]
    results = backend.enqueue_many([job(priority=p, run_at=r) for p, r in specs], now=T0 + 10)
    expected = [res.id for _, res in sorted(zip(specs, results, strict=True), key=lambda x: (*x[0], x[1].id))]
    got = []
    while batch := backend.claim("default", 1, worker_id="w", lease_s=30, now=T0 + 10):
        got.extend(j.id for j in batch)
    assert got == expected
    for res, (_, r) in zip(results, specs, strict=True):
        stored = backend.get(res.id)
        assert stored is not None and stored.run_at == r  # bit for bit


def test_times_are_stored_bit_for_bit(backend: RedisBackend) -> None:
    now = 1_712_345_678.123_456_7
    [res] = backend.enqueue_many([job(delay=0.1)], now=now)
    stored = backend.get(res.id)
    assert stored is not None
    assert stored.created_at == now and stored.run_at == now + 0.1
    [claimed] = backend.claim("default", 1, worker_id="w", lease_s=0.3, now=now + 0.2)
    assert claimed.lease_expires_at == now + 0.2 + 0.3
    backend.retry(Lease(claimed.id, claimed.lease_token or ""), ErrorInfo("exception", "x"), delay=0, now=now + 0.25)
    again = backend.get(res.id)
    assert again is not None and again.errors[0]["at"] == now + 0.25 and isinstance(again.errors[0]["at"], float)


def test_a_claimed_hash_missing_a_common_field_comes_back_whole(backend: RedisBackend,
                                                              private_redis: RedisServer) -> None:
    """A claim sends a job's common fields as bare values and reads its whole hash only when
    HLEN says there is more. A hash that lacks one of them (an older layout) while holding an
    extra field has the plain count too: the claim must still see the extra field."""
    [plain, odd] = backend.enqueue_many([job(), job(unique_key="u-1", meta=json.dumps({"m": 1}))])
    c = private_redis.client()
    c.hdel(backend.keys.job(odd.id), "fair_tag")
    c.close()
    by_id = {j.id: j for j in backend.claim("default", 2, worker_id="w", lease_s=30)}
    assert by_id[odd.id].unique_key == "u-1" and by_id[odd.id].meta == {"m": 1}
    assert by_id[odd.id] == backend.get(odd.id)
    assert by_id[plain.id] == backend.get(plain.id) and by_id[plain.id].attempts == 1


def test_list_jobs_hands_back_a_cursor_when_its_work_budget_runs_out(
    backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    [old] = backend.enqueue_many([job(task="rare")], now=T0)
    backend.enqueue_many([job(task="common") for _ in range(30)], now=T0)
    monkeypatch.setattr(redis_admin, "LIST_BUDGET", 7)
    found, cursor, pages = [], None, 0
    while True:
        page = backend.list_jobs(task="rare", cursor=cursor, limit=10)
        pages += 1
        found += [j.id for j in page.jobs]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert found == [old.id]
    assert pages > 1  # each call looked at no more than its budget


def _waiter(backend: RedisBackend, queues: list[str], timeout: float) -> tuple[threading.Thread, dict[str, float]]:
    out: dict[str, float] = {}

    def run() -> None:
        t = time.monotonic()
        out["result"] = backend.wait_for_jobs(queues, timeout)
        out["elapsed"] = time.monotonic() - t

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.1)  # let it block
    return thread, out


def test_wake_interrupts_a_local_waiter_promptly(backend: RedisBackend) -> None:
    thread, out = _waiter(backend, ["default"], 30)
    t = time.monotonic()
    backend.wake()
    thread.join(5)
    assert out["result"] is True
    assert time.monotonic() - t < 0.5


def test_close_interrupts_a_local_waiter(private_redis: RedisServer) -> None:
    b = open_backend(private_redis.url)
    assert isinstance(b, RedisBackend)
    thread, out = _waiter(b, ["default"], 30)
    b.close()
    thread.join(5)
    assert out["result"] is True and out["elapsed"] < 2


def test_a_scheduled_job_wakes_the_waiter_when_it_comes_due(backend: RedisBackend) -> None:
    thread, out = _waiter(backend, ["default"], 10)
    backend.enqueue_many([job(delay=0.5)])  # store time: due 0.5 s from now
    thread.join(10)
    assert out["result"] is True
    assert 0.4 <= out["elapsed"] < 2.0


def test_the_wake_list_stays_capped_with_no_worker_to_drain_it(
    backend: RedisBackend, private_redis: RedisServer
) -> None:
    """Every enqueue pushes a wake marker; with nobody popping them the list must stop at the cap
    (the trim runs only once a push takes it past, not on every enqueue)."""
    c = private_redis.client()
    wake = backend.keys.queue("default", "wake")
    backend.enqueue_many([job()])
    assert c.llen(wake) == 1
    for _ in range(20):
        backend.enqueue_many([job()])
    backend.enqueue_many([job() for _ in range(30)])
    assert c.llen(wake) == 8
    c.close()


def _claiming_waiter(backend: RedisBackend, queues: list[str], timeout: float,
                     claims: list[tuple[str, int]]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    for q, _ in claims:  # load the claim script (a first run on a fresh server answers NOSCRIPT)
        assert backend.claim(q, 1, worker_id="warm-up", lease_s=30) == []

    def run() -> None:
        t = time.monotonic()
        out["woken"], out["jobs"] = backend.wait_and_claim(queues, timeout, claims, worker_id="w-idle", lease_s=30)
        out["elapsed"] = time.monotonic() - t

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.2)  # let it block
    return thread, out


def test_an_idle_waiters_claims_come_back_with_the_wake_up(backend: RedisBackend, private_redis: RedisServer) -> None:
    """The claims ride behind the blocking pop: an enqueue wakes the waiter and the job comes
    back leased, with no claim sent after the wake-up."""
    backend.enqueue_many([job("other")])  # loads the enqueue script
    thread, out = _claiming_waiter(backend, ["default"], 10, [("default", 4)])
    c = private_redis.client()
    c.config_resetstat()
    [res] = backend.enqueue_many([job()])
    thread.join(5)
    stats = c.info("commandstats")
    c.close()
    assert out["woken"] is True and [j.id for j in out["jobs"]] == [res.id]
    [claimed] = out["jobs"]
    assert claimed.state is JobState.RUNNING and claimed.worker_id == "w-idle" and claimed.attempts == 1
    assert backend.get(res.id) == claimed
    # After the wake-up: the enqueue's script and the claim that was already waiting in Redis.
    assert stats["cmdstat_evalsha"]["calls"] == 2, stats


def _blocked_clients(c: redis.Redis) -> int:
    return int(c.info("clients")["blocked_clients"])


def test_a_stale_wake_up_does_not_end_the_wait_and_the_next_job_comes_with_its_wake_up(
    backend: RedisBackend, private_redis: RedisServer
) -> None:
    """A marker whose job is gone (a neighbour took it, or this worker's own last claim did:
    under a steady load the wake list holds up to WAKE_MAX of those) wakes the claims behind
    the pop to nothing. The waiter then blocks again with its claims behind the next pop, so
    the next job still comes back with its wake-up rather than after a verified wait, a hop to
    the loop and a claim of its own."""
    backend.enqueue_many([job("other")])  # loads the enqueue script
    thread, out = _claiming_waiter(backend, ["default"], 30, [("default", 2)])
    c = private_redis.client()
    c.lpush(backend.keys.queue("default", "wake"), "1")  # a marker, no job (a neighbour took it)
    deadline = time.monotonic() + 10
    # The marker is popped, and the waiter goes on waiting: blocked again, not returned.
    while c.llen(backend.keys.queue("default", "wake")) or not _blocked_clients(c):
        assert thread.is_alive(), f"the stale marker ended the wait: {out}"
        assert time.monotonic() < deadline, "the waiter did not block again"
        time.sleep(0.01)
    [res] = backend.enqueue_many([job()])
    thread.join(5)
    c.close()
    assert out["woken"] is True and [j.id for j in out["jobs"]] == [res.id]


def test_claims_that_could_not_run_behind_the_pop_are_left_to_the_caller(backend: RedisBackend) -> None:
    """A script not loaded yet (a fresh or restarted server) refuses the pipelined claims: the
    wake-up comes back with no claim made (None), so the worker claims on its own."""
    out: dict[str, Any] = {}

    def run() -> None:
        out["woken"], out["jobs"] = backend.wait_and_claim(["default"], 10, [("default", 2)], worker_id="w",
                                                           lease_s=30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.2)
    [res] = backend.enqueue_many([job()])
    thread.join(5)
    assert out == {"woken": True, "jobs": None}
    stored = backend.get(res.id)
    assert stored is not None and stored.state is JobState.AVAILABLE
    assert [j.id for j in backend.claim("default", 2, worker_id="w", lease_s=30)] == [res.id]


def test_a_waiter_that_times_out_claims_nothing(backend: RedisBackend) -> None:
    thread, out = _claiming_waiter(backend, ["default"], 1.2, [("default", 2)])
    thread.join(5)
    assert out["woken"] is False and out["jobs"] is None
    assert 1.0 <= out["elapsed"] < 3.0
    assert backend.stats().queues == []  # nothing was enqueued, nothing claimed


def test_a_job_coming_due_is_claimed_by_the_claims_behind_the_pop(backend: RedisBackend) -> None:
    """A delayed job's enqueue wakes the waiter (its due time moved) with nothing to claim; the
    next wait blocks until the job is due, and the claims behind that pop take it then."""
    assert backend.claim("default", 1, worker_id="warm-up", lease_s=30) == []
    [res] = backend.enqueue_many([job(delay=0.5)])  # store time: due 0.5 s from now
    t = time.monotonic()
    woken, jobs = backend.wait_and_claim(["default"], 10, [("default", 2)], worker_id="w", lease_s=30)
    if jobs == []:  # the marker of the delayed job's enqueue, still in the wake list
        woken, jobs = backend.wait_and_claim(["default"], 10, [("default", 2)], worker_id="w", lease_s=30)
    assert woken is True and jobs is not None and [j.id for j in jobs] == [res.id]
    assert 0.4 <= time.monotonic() - t < 2.0


def test_a_waiter_killed_while_blocked_never_claims(private_redis: RedisServer, tmp_path: Path) -> None:
    """A worker SIGKILLed while it waits: Redis drops its pending claims with its connection, so
    a job enqueued afterwards is not leased to the dead worker (it stays available)."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "waiter.py"
    script.write_text(
        "import sys\n"
        "from conveyor.backends import open_backend\n"
        "b = open_backend(sys.argv[1])\n"
        "print('waiting', flush=True)\n"
        "b.wait_and_claim(['default'], 60, [('default', 4)], worker_id='doomed', lease_s=300)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script), private_redis.url], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    c = private_redis.client()
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "waiting"
        deadline = time.monotonic() + 10
        while not any(cl.get("cmd") == "blpop" for cl in c.client_list()):
            assert time.monotonic() < deadline, "the waiter never blocked"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        while any(cl.get("cmd") == "blpop" for cl in c.client_list()):  # Redis has dropped the client
            assert time.monotonic() < deadline, "Redis kept the killed waiter's connection"
            time.sleep(0.02)
        b = open_backend(private_redis.url)
        try:
            [res] = b.enqueue_many([job()])
            time.sleep(0.2)
            stored = b.get(res.id)
            assert stored is not None and stored.state is JobState.AVAILABLE and stored.attempts == 0
        finally:
            b.close()
    finally:
        c.close()
        if proc.poll() is None:
            proc.kill()


def test_an_idle_waiter_does_not_poll(backend: RedisBackend, private_redis: RedisServer) -> None:
    c = private_redis.client()
    c.config_resetstat()
    assert backend.wait_for_jobs(["a", "b"], 2.0) is False
    stats = c.info("commandstats")
    c.close()
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_config")
    # One BLPOP per 1 s slice, plus one look (the peek script) before each.
    assert stats["cmdstat_blpop"]["calls"] <= 3
    assert calls < 30, stats


def test_an_unreachable_redis_raises_store_unavailable_quickly(private_redis: RedisServer) -> None:
    b = open_backend(private_redis.url)
    try:
        b.enqueue_many([job()])
        private_redis.kill()
        t = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"unreachable.*nothing was done"):
            b.enqueue_many([job()])
        assert time.monotonic() - t < 5
        with pytest.raises(StoreUnavailable):
            b.stats()
        with pytest.raises(StoreUnavailable):
            b.wait_for_jobs(["default"], 0.5)
    finally:
        b.close()


def test_a_stalled_redis_times_out_instead_of_hanging(private_redis: RedisServer) -> None:
    b = open_backend(private_redis.url + "&socket_timeout=0.3")
    # A PAUSE ALL holds every client's commands, the admin's UNPAUSE too, until it runs out: the
    # admin waits that out (redis-py 6 and later would retry a shorter timeout; 5.0 does not).
    admin = redis.Redis(port=private_redis.port, password=private_redis.password, socket_timeout=10,
                        socket_connect_timeout=1, decode_responses=True)
    try:
        b.enqueue_many([job()])  # connected
        admin.execute_command("CLIENT", "PAUSE", "3000", "ALL")
        t = time.monotonic()
        with pytest.raises(StoreUnavailable, match="may or may not have happened"):
            b.enqueue_many([job()])
        assert time.monotonic() - t < 2
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
        b.close()


def test_a_new_connection_costs_at_most_two_round_trips_before_its_first_command(backend: RedisBackend) -> None:
    """A call that needs a new connection pays its handshake inside its own time bound: at
    500 ms each way, redis-py 8's default (HELLO, CLIENT MAINT_NOTIFICATIONS, SETNAME and two
    CLIENT SETINFO) made a first stats() take 12 s against a bound of 8. HELLO (with RESP3) and
    SETNAME are left."""
    for pool in (backend._transport.pool, backend._transport.block_pool):
        conn = pool.make_connection()
        sent: list[str] = []
        send = conn.send_command

        def record(*args: Any, _send: Any = send, _sent: list[str] = sent, **kw: Any) -> None:
            _sent.append(" ".join(str(a) for a in args[:2]))
            _send(*args, **kw)

        conn.send_command = record  # type: ignore[method-assign]
        conn.connect()
        conn.disconnect()
        assert len(sent) <= 2 and "CLIENT SETNAME" in sent, sent
        assert not [c for c in sent if "SETINFO" in c or "MAINT" in c], sent


def test_a_batch_that_breaks_the_rules_writes_nothing(backend: RedisBackend, private_redis: RedisServer) -> None:
    with pytest.raises(StoreError, match="max_attempts"):
        backend.enqueue_many([job(), job(max_attempts=0)], now=T0)
    with pytest.raises(StoreError, match="queue"):
        backend.enqueue_many([job("x" * 129)], now=T0)
    c = private_redis.client()
    assert c.dbsize() == 0
    c.close()


def test_script_flush_between_calls_is_transparent(backend: RedisBackend, private_redis: RedisServer) -> None:
    backend.enqueue_many([job()], now=T0)
    c = private_redis.client()
    c.script_flush()
    c.close()
    [claimed] = backend.claim("default", 1, worker_id="w", lease_s=30, now=T0)
    backend.ack(Lease(claimed.id, claimed.lease_token or ""), json.dumps(1), now=T0 + 1)
    assert backend.get(claimed.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]


def test_connections_a_burst_opened_are_closed_once_idle(backend: RedisBackend, private_redis: RedisServer,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Five threads wait at once, each on a blocking connection of its own; once those have been
    # idle for IDLE_CLOSE_S, the next call closes all but the one used last, on the server too.
    monkeypatch.setattr(redis_transport, "IDLE_CLOSE_S", 0.3)
    admin = private_redis.client()

    def ours() -> int:
        return sum(1 for c in admin.client_list() if c.get("name") == "conveyor")

    try:
        together = threading.Barrier(5)

        def wait() -> None:
            together.wait()
            backend.wait_and_claim(["default"], 0.2, [("default", 1)], worker_id="w", lease_s=30)

        threads = [threading.Thread(target=wait) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(backend._transport.idle_blocking) == 5
        burst = ours()
        last_used = backend._transport.idle_blocking[-1]
        time.sleep(0.4)
        backend.enqueue_many([job("other")], now=T0)
        assert backend._transport.idle_blocking == [last_used] and len(backend._transport.idle) == 1
        assert ours() <= burst - 4
        # A stack of one is never emptied: the next wait, long after, is on the connection kept.
        time.sleep(0.4)
        assert backend.wait_and_claim(["default"], 0.2, [("default", 1)], worker_id="w", lease_s=30) == (False, None)
        assert backend._transport.idle_blocking == [last_used] and last_used.is_connected
    finally:
        admin.close()


def test_a_forked_child_talks_on_connections_of_its_own(backend: RedisBackend) -> None:
    # The parent's idle connection is in the pool when it forks: a child that wrote on it
    # would read the parent's replies (and the parent the child's).
    backend.enqueue_many([job()], now=T0)
    [parent_conn] = backend._transport.idle
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        code = 1
        try:
            ids = [backend.enqueue_many([job()], now=T0)[0].id for _ in range(3)]
            mine = set(backend._transport.idle) == backend._transport.made and parent_conn not in backend._transport.made
            os.write(w, json.dumps({"ids": ids, "own": mine}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        report = json.loads(f.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report["own"] is True
    after = backend.enqueue_many([job()], now=T0)[0].id  # on the parent's own connection still
    assert backend._transport.idle == [parent_conn]
    assert sorted([1, *report["ids"], after]) == [1, 2, 3, 4, 5]


def test_script_flush_before_the_pipelined_ack_and_claim(backend: RedisBackend, private_redis: RedisServer) -> None:
    """ack_many and ack_and_claim send EVALSHA in a pipeline: NOSCRIPT there must take the
    careful path (the acks land, the claim is made) and load the scripts for the next call."""
    for _ in range(6):
        backend.enqueue_many([job()], now=T0)
    first = backend.claim("default", 2, worker_id="w", lease_s=30, now=T0)
    c = private_redis.client()
    c.script_flush()
    held, second = backend.ack_and_claim([(Lease(j.id, j.lease_token or ""), "1") for j in first], "default", 2,
                                         worker_id="w", lease_s=30, now=T0 + 1)
    assert held == [True, True] and len(second) == 2
    assert c.script_exists(backend._transport.scripts["ack_many"].sha, backend._transport.scripts["claim"].sha) == [True, True]
    c.script_flush()
    c.close()
    assert backend.ack_many([(Lease(j.id, j.lease_token or ""), "2") for j in second], now=T0 + 2) == [True, True]
    for j in [*first, *second]:
        assert backend.get(j.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]


# -- persistence warnings -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("appendonly", "save", "expect"),
    [(False, "", "no persistence"), (False, "60 1", "RDB snapshots only"), (True, "", None)],
    ids=["none", "rdb", "aof"],
)
def test_startup_warnings_name_a_redis_that_can_lose_jobs(
    tmp_path: Path, appendonly: bool, save: str, expect: str | None
) -> None:
    server = RedisServer(tmp_path, appendonly=appendonly, save=save).start()
    b = open_backend(server.url)
    assert isinstance(b, RedisBackend)
    try:
        warnings = b.startup_warnings()
        if expect is None:
            assert warnings == []
        else:
            assert len(warnings) == 1 and expect in warnings[0], warnings
        c = server.client()
        c.config_set("maxmemory-policy", "allkeys-lru")  # the test sets it; the library never would
        c.close()
        assert any("allkeys-lru" in w for w in b.startup_warnings())
    finally:
        b.close()
        server.stop()


def test_the_library_never_sends_dangerous_commands(backend: RedisBackend, private_redis: RedisServer) -> None:
    c = private_redis.client()
    c.config_resetstat()
    backend.enqueue_many([job(), job(delay=1)], now=T0)
    [j] = backend.claim("default", 1, worker_id="w", lease_s=30, now=T0)
    backend.heartbeat([Lease(j.id, j.lease_token or "")], lease_s=30, now=T0)
    backend.reap(now=T0 + 100)
    backend.purge()
    backend.stats()
    backend.list_jobs()
    backend.startup_warnings()
    stats = c.info("commandstats")
    c.close()
    for name in ("keys", "flushall", "flushdb"):
        assert f"cmdstat_{name}" not in stats
    assert stats.get("cmdstat_config", {}).get("calls", 0) <= 3  # CONFIG GET, by startup_warnings only


def test_redis_client_errors_are_store_errors(backend: RedisBackend, private_redis: RedisServer) -> None:
    c = private_redis.client()
    c.set("{" + private_redis.prefix + "}:ids", "not a number")
    c.close()
    with pytest.raises(StoreError, match="enqueue") as info:
        backend.enqueue_many([job()], now=T0)
    assert not isinstance(info.value, redis.RedisError)  # never a raw driver exception


BUSY_LUA = """
local t = redis.call('TIME')
local until_us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= until_us
return 1
"""


@pytest.mark.parametrize("call", ["ack", "retry"])
def test_a_fenced_call_whose_reply_was_lost_is_not_reported_as_lease_lost(
    private_redis: RedisServer, call: str
) -> None:
    """Redis runs the ack but the reply never arrives (the client timed out and hung up). The
    retry is then refused by the fence, and the backend must see that its first try landed."""
    b = open_backend(private_redis.url + "&socket_timeout=0.2")
    admin = private_redis.client()
    try:
        b.enqueue_many([job(), job()])
        warm, j = b.claim("default", 2, worker_id="w", lease_s=60)
        # Once normally, so the script is cached: else the lost call would only be a NOSCRIPT.
        if call == "ack":
            b.ack(Lease(warm.id, warm.lease_token or ""), None)
        else:
            b.retry(Lease(warm.id, warm.lease_token or ""), ErrorInfo("exception", "x"), delay=0)
        lease = Lease(j.id, j.lease_token or "")
        # Keep the server busy for 0.6 s: the ack sent meanwhile waits in its socket, the client
        # gives up after 0.2 s, and Redis still runs it when the busy script ends.
        busy = threading.Thread(target=lambda: admin.eval(BUSY_LUA, 0, 600_000), daemon=True)
        busy.start()
        time.sleep(0.1)
        if call == "ack":
            b.ack(lease, json.dumps("done"))
            assert b.get(j.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]
        else:
            assert b.retry(lease, ErrorInfo("exception", "x"), delay=0) is JobState.AVAILABLE
            stored = b.get(j.id)
            assert stored is not None and len(stored.errors) == 1  # recorded once, not twice
        busy.join(5)
    finally:
        admin.close()
        b.close()


def test_credentials_and_acl_users(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, extra=("--requirepass", "s3cret"))
    server.password = "s3cret"
    server.start()
    admin = server.client()
    admin.acl_setuser("app", enabled=True, passwords=["+apppw"], keys=["{" + server.prefix + "}*"],
                      commands=["+@all", "-@dangerous", "+info", "+config|get"])
    admin.close()
    base = f"127.0.0.1:{server.port}/0?prefix={server.prefix}"
    try:
        for url in (f"redis://{base}", f"redis://:wrong@{base}"):
            b = open_backend(url)
            t = time.monotonic()
            with pytest.raises(StoreError, match="credentials") as info:
                b.enqueue_many([job()])
            assert time.monotonic() - t < 1  # not retried: waiting would not fix a password
            assert "wrong" not in str(info.value)
            b.close()
        for url in (f"redis://:s3cret@{base}", f"redis://app:apppw@{base}"):
            b = open_backend(url)
            [res] = b.enqueue_many([job()], now=T0)
            assert b.claim("default", 1, worker_id="w", lease_s=30, now=T0)[0].id == res.id
            b.close()
    finally:
        server.stop()


def test_a_full_redis_refuses_whole_batches_with_storage_full(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, extra=("--maxmemory", "4mb", "--maxmemory-policy", "noeviction")).start()
    b = open_backend(server.url)
    try:
        big = NewJob(task="t", queue="default", args=json.dumps({"blob": "x" * 50_000}), max_attempts=3, timeout=30)
        with pytest.raises(StorageFull, match="out of memory"):
            for _ in range(1000):
                b.enqueue_many([big] * 10)
        # Whole batches or nothing: every job that exists is complete and indexed.
        page = b.list_jobs(limit=10_000)
        assert len(page.jobs) % 10 == 0 and page.jobs
        assert all(j.args == {"blob": "x" * 50_000} for j in page.jobs)
        # Workers can still finish jobs: pruning frees memory and enqueues work again.
        jobs = b.claim("default", 10, worker_id="w", lease_s=30)
        for j in jobs:
            b.ack(Lease(j.id, j.lease_token or ""), None)
        assert b.prune(older_than=-1) == 10
    finally:
        b.close()
        server.stop()


def test_a_worker_entry_written_before_stuck_slots_reads_as_none_stuck(backend: RedisBackend) -> None:
    # The JSON an older worker writes: no "stuck" (WorkerInfo.stuck was added later).
    old = {"queues": ["a"], "concurrency": 2, "host": "h", "pid": 1, "started_at": T0, "running": 1}
    backend._run("record_worker", [], [repr(T0), "w-old", json.dumps(old)], safe=True)
    [seen] = backend.stats(now=T0).workers
    assert (seen.id, seen.running, seen.stuck) == ("w-old", 1, 0)
