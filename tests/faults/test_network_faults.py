"""R14: network faults between Conveyor and PostgreSQL or Redis, through an in-process TCP proxy.

Every connection of the apps under test (producer and worker) goes through ``proxy.Proxy`` to
the shared server (the server itself is never touched). While a worker thread runs jobs and a
producer thread enqueues, the proxy adds latency, resets every connection, blackholes, or goes
half-open; meanwhile the test calls ``enqueue``, ``get_job`` and ``stats`` and a spy times the
worker's own store calls (claim, heartbeat, ack, ...). Then it heals and checks:

* no call blocked longer than its configured timeout + 1 s (``Net.bound``);
* a call that failed raised a Conveyor error (``StoreError``/``StoreUnavailable``), never a
  driver's exception;
* enqueues succeed again within 5 s of healing; every acknowledged job ran (lost = 0), and
  nothing ran that was never enqueued;
* a worker cut off past its lease loses the job: its late ack is refused (fencing) and the job
  runs again on another worker.

``CONVEYOR_FAULT_PROFILE=full`` runs the plan's durations (500 ms latency for 30 s, a 10 s
blackhole, ...) with production timeouts; the default (CI) profile shortens both. The
configured timeouts of a call (what "its timeout" means above):

* Redis: ``socket_timeout`` per attempt (1 s in CI, via the URL), and a safe call retries within
  ``RETRY_BUDGET`` (2 s): at most ``socket_timeout + RETRY_BUDGET``.
* PostgreSQL: waiting for a pooled connection (``POOL_TIMEOUT``, 5 s), connecting
  (``connect_timeout``, 2 s in CI) and each statement (``statement_timeout``, 30 s; shortened to
  2 s in CI through the module constant): at most the largest of the three.

``statement_timeout`` alone cannot hold that bound when the peer stops answering: the server
never sees the statement (blackhole) or its reply is lost (half-open). The PostgreSQL backend's
client-side deadline (one watchdog thread shuts the socket down) does; these tests first found
the hang and now check the bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest
from proxy import Proxy
from support import WorkerThread, wait_until

from conveyor import Conveyor
from conveyor.backends.base import Lease, NewJob
from conveyor.errors import ConveyorError, LeaseLost, StoreError
from conveyor.executor import current_job
from conveyor.job import JobState

FULL = os.environ.get("CONVEYOR_FAULT_PROFILE", "ci") == "full"
LATENCY_MS = 500 if FULL else 50  # per direction (a PostgreSQL enqueue is ~10 round trips)
LATENCY_S = 30.0 if FULL else 3.0
BLACKHOLE_S = 10.0 if FULL else 4.0  # at least the longest bound (6 s on PostgreSQL) of a call against a silent server
RESET_REFUSE_S = 5.0 if FULL else 1.0
# Worker lease (visibility timeout). At 500 ms each way a heartbeat cycle takes longer than 2 s.
LEASE = 10.0 if FULL else 2.0
RECONNECT_S = 5.0  # enqueues work again this soon after healing

log = logging.getLogger("tests.network")


# -- the store behind a proxy --------------------------------------------------------------------------
@dataclass
class Net:
    kind: str  # "postgres" or "redis"
    direct: str  # the store's URL (for a second, unaffected worker)
    proxied: str  # the same store through the proxy, with the test's timeouts
    proxy: Proxy
    timeout: float  # the longest a call is configured to take before giving up
    apps: list[Conveyor] = field(default_factory=list)

    @property
    def bound(self) -> float:
        return self.timeout + 1.0

    def app(self, *, direct: bool = False, **kwargs: Any) -> Conveyor:
        app = Conveyor(self.direct if direct else self.proxied, **kwargs)
        self.apps.append(app)
        return app


def _with_query(url: str, extra: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{extra}" if extra else url


POSTGRES_URL = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CONVEYOR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@contextlib.contextmanager
def shared_store(kind: str) -> Iterator[str]:
    """A fresh schema (PostgreSQL) or key prefix (Redis) on the machine's shared server, removed
    afterwards; the server itself is only ever reached through the proxy or directly, never
    stopped. Unreachable: skipped, or failed with CI=true (as tests/conftest.py does)."""
    import uuid

    name = f"conveyor_net_{uuid.uuid4().hex[:12]}"
    try:
        if kind == "postgres":
            import psycopg

            admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
        else:
            import redis

            admin = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
            admin.ping()
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{kind} unavailable: {exc}", pytrace=False)
        pytest.skip(f"{kind} unavailable: {exc}")
    try:
        if kind == "postgres":
            admin.execute(f'CREATE SCHEMA "{name}"')
            yield _with_query(POSTGRES_URL, f"options=-csearch_path%3D{name}")
        else:
            yield _with_query(REDIS_URL, f"prefix={name}")
    finally:
        if kind == "postgres":
            admin.execute(f'DROP SCHEMA "{name}" CASCADE')
        else:
            keys = list(admin.scan_iter(match=f"{{{name}}}*", count=1000))
            for i in range(0, len(keys), 500):
                admin.delete(*keys[i:i + 500])
        admin.close()


@pytest.fixture(params=["postgres", "redis"])
def net(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Net]:
    kind = request.param
    with contextlib.ExitStack() as stack:
        direct = stack.enter_context(shared_store(kind))
        parts = urlsplit(direct)
        proxy = stack.enter_context(Proxy(parts.hostname or "127.0.0.1", parts.port or 0))
        if kind == "redis":
            from conveyor.backends import redis as rmod

            socket_timeout = rmod.DEFAULT_SOCKET_TIMEOUT if FULL else 1.0
            extra = "" if FULL else "socket_timeout=1&socket_connect_timeout=1"
            timeout = socket_timeout + rmod.RETRY_BUDGET
        else:
            from conveyor.backends.postgres import connection as pmod

            if not FULL:
                monkeypatch.setattr(pmod, "STATEMENT_TIMEOUT_MS", 2000)
            connect = 5.0 if FULL else 2.0
            extra = "" if FULL else "connect_timeout=2"
            timeout = max(pmod.POOL_TIMEOUT, connect, pmod.STATEMENT_TIMEOUT_MS / 1000)
        n = Net(kind, direct, _with_query(proxy.url_for(direct), extra), proxy, timeout)
        try:
            yield n
        finally:
            # Free any call still stuck on a connection, then close.
            proxy.heal()
            proxy.reset()
            for app in n.apps:
                with contextlib.suppress(Exception):
                    app.close()


# -- what ran, what was called, how long it took ---------------------------------------------------------
@dataclass
class Call:
    what: str
    start: float
    end: float | None = None
    error: BaseException | None = None

    def duration(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start


class Calls:
    """Timed calls: the test's probes, the producer's enqueues and the worker's store calls."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def run(self, what: str, fn: Callable[[], Any]) -> Any:
        call = Call(what, time.monotonic())
        with self._lock:
            self.calls.append(call)
        try:
            return fn()
        except BaseException as exc:
            call.error = exc
            raise
        finally:
            call.end = time.monotonic()

    def probe(self, what: str, fn: Callable[[], Any], *, timed: bool = True) -> threading.Thread:
        """Run ``fn`` (timed, unless it times itself) on a daemon thread: the test thread must
        not hang with it."""

        def target() -> None:
            with contextlib.suppress(BaseException):
                if timed:
                    self.run(what, fn)
                else:
                    fn()

        t = threading.Thread(target=target, name=f"probe-{what}", daemon=True)
        t.start()
        return t

    def spy_on(self, backend: Any, names: tuple[str, ...]) -> None:
        for name in names:
            fn = getattr(backend, name)

            def timed(*args: Any, __fn: Callable[..., Any] = fn, __name: str = name, **kw: Any) -> Any:
                return self.run(f"worker.{__name}", lambda: __fn(*args, **kw))

            setattr(backend, name, timed)

    def since(self, t: float) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.start >= t]

    def slowest(self, since: float, allowance: Callable[[str], float]) -> list[tuple[str, float, float]]:
        """Calls started since ``since`` that ran (or are still running) past their bound:
        (what, seconds, bound)."""
        now = time.monotonic()
        return [(c.what, round(c.duration(now), 2), allowance(c.what)) for c in self.since(since)
                if c.duration(now) > allowance(c.what)]

    def foreign_errors(self) -> list[str]:
        """Errors that are not Conveyor's own (a driver's exception leaking out)."""
        with self._lock:
            return [f"{c.what}: {type(c.error).__module__}.{type(c.error).__name__}: {c.error}"
                    for c in self.calls if c.error is not None and not isinstance(c.error, ConveyorError)]


WORKER_CALLS = ("claim", "heartbeat", "ack", "ack_many", "retry", "kill", "release", "record_worker", "reap",
                "promote", "prune", "get", "wait_for_jobs")


class Flow:
    """A worker (through the proxy) running ``net.record`` jobs, a producer enqueuing them, and
    the history a checker needs (Jepsen total-queue style): attempted, acknowledged, executed."""

    def __init__(self, net: Net) -> None:
        self.net = net
        self.calls = Calls()
        self.executed: Counter[int] = Counter()
        self.attempted: set[int] = set()
        self.acked: set[int] = set()
        self.failed: dict[int, str] = {}  # enqueue raised (its message): the outcome may be unknown
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self.worker_app = net.app(visibility_timeout=LEASE)
        self.producer_app = net.app(visibility_timeout=LEASE)
        for app in (self.worker_app, self.producer_app):
            app.task(name="net.record")(self._record)
        self.record = self.producer_app.tasks["net.record"]
        self.calls.spy_on(self.worker_app.backend, WORKER_CALLS)
        self.worker = WorkerThread(self.worker_app, queues="default", concurrency=4, poll_interval=0.1,
                                   maintenance_interval=0.2, grace_period=2.0)
        self.producer = threading.Thread(target=self._produce, name="producer", daemon=True)

    def _record(self, n: int) -> None:
        with self._lock:
            self.executed[n] += 1

    def new_n(self) -> int:
        with self._lock:
            self._next += 1
            self.attempted.add(self._next)
            return self._next

    def enqueue(self, what: str = "enqueue") -> bool:
        n = self.new_n()
        try:
            self.calls.run(what, lambda: self.record.enqueue(n))
        except Exception as exc:
            with self._lock:
                self.failed[n] = str(exc)
            return False
        with self._lock:
            self.acked.add(n)
        return True

    def _produce(self) -> None:
        while not self._stop.is_set():
            self.enqueue("producer.enqueue")
            time.sleep(0.02)

    def __enter__(self) -> Flow:
        self.worker.start()
        self.producer.start()
        wait_until(lambda: len(self.executed) >= 5, timeout=20, message="jobs flowing before the fault")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if exc[0] is not None:
            # A failed check may leave calls stuck (PostgreSQL): free them before stopping.
            self.net.proxy.heal()
            self.net.proxy.reset()
        self.producer.join(30)
        self.worker.stop()
        self.worker.join(30)

    # -- checks ---------------------------------------------------------------------------------------
    def allowance(self, what: str) -> float:
        extra = 0.0
        if what == "worker.wait_for_jobs":
            extra = 0.1 + 1.0  # poll_interval, plus Redis's blocking slice
        return self.net.bound + extra

    def probe_during(self, seconds: float) -> float:
        """Call enqueue, get_job and stats over and over (each on its own thread) for ``seconds``;
        returns when the window started."""
        app = self.producer_app
        known = max(self.acked)
        start = time.monotonic()
        live: dict[str, threading.Thread] = {}
        while time.monotonic() - start < seconds:
            for what, fn in (("get_job", lambda: app.get_job(known)), ("stats", lambda: app.backend.stats()),
                             ("enqueue", lambda: self.enqueue("enqueue"))):
                if what not in live or not live[what].is_alive():  # at most one of each in flight
                    live[what] = self.calls.probe(what, fn, timed=what != "enqueue")
            time.sleep(0.1)
        return start

    def assert_bounded(self, since: float) -> None:
        slow = self.calls.slowest(since, self.allowance)
        assert not slow, (f"{self.net.kind}: calls blocked past their configured timeout + 1 s "
                          f"(what, seconds so far, bound): {sorted(slow, key=lambda s: -s[1])[:8]}")

    def assert_reconnects(self, healed: float) -> float:
        """Enqueue until one succeeds; returns how long after healing it took."""
        while True:
            ok = self.enqueue("enqueue.after_heal")
            took = time.monotonic() - healed
            if ok:
                return took
            assert took < RECONNECT_S, f"{self.net.kind}: no enqueue succeeded within {RECONNECT_S}s of healing"
            time.sleep(0.05)

    def drain(self) -> None:
        """Stop producing; wait until every acknowledged job ran."""
        self._stop.set()
        self.producer.join(30)

        def done() -> bool:
            with self._lock:
                return self.acked <= set(self.executed)

        wait_until(done, timeout=LEASE + 30, interval=0.05,
                   message=f"every acknowledged job ran: lost {sorted(self.acked - set(self.executed))[:20]}")

    def check_history(self) -> dict[str, int]:
        with self._lock:
            executed = set(self.executed)
            lost = self.acked - executed
            unexpected = executed - self.attempted
            # An error that says the enqueue did not happen must be right about it.
            not_done = {n for n, msg in self.failed.items() if "nothing was done" in msg or "did not happen" in msg}
            report = {"enqueued_ok": len(self.acked), "enqueue_failed": len(self.failed),
                      "recovered": len(set(self.failed) & executed), "said_not_done": len(not_done),
                      "duplicated": sum(c - 1 for c in self.executed.values()),
                      "lost": len(lost), "unexpected": len(unexpected)}
        log.warning("%s history: %s", self.net.kind, report)
        print(f"{self.net.kind} history: {report}")
        assert not lost, f"acknowledged jobs never ran: {sorted(lost)[:20]}"
        assert not unexpected, f"jobs ran that were never enqueued: {sorted(unexpected)[:20]}"
        assert not not_done & executed, f"enqueues reported as not done ran anyway: {sorted(not_done & executed)}"
        assert not self.calls.foreign_errors(), self.calls.foreign_errors()[:5]
        assert self.worker.thread.is_alive() or self.worker.errors == []
        return report


# =======================================================================================================
def test_proxy_modes_behave_as_documented() -> None:
    """The proxy itself, against an echo server: each mode does what the tests rely on."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return

            def serve(c: socket.socket = conn) -> None:
                with contextlib.suppress(OSError), c:
                    while data := c.recv(65536):
                        c.sendall(data)

            threading.Thread(target=serve, daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()
    with Proxy("127.0.0.1", server.getsockname()[1]) as p, socket.create_connection(("127.0.0.1", p.port)) as s:
        s.settimeout(2)
        s.sendall(b"a")
        assert s.recv(10) == b"a"
        p.latency(150)
        t = time.monotonic()
        s.sendall(b"b")
        assert s.recv(10) == b"b"
        assert 0.29 <= time.monotonic() - t < 1.0  # 150 ms each way
        p.blackhole()
        s.settimeout(0.3)
        s.sendall(b"held")
        with pytest.raises(TimeoutError):
            s.recv(10)
        p.heal()  # what was held flows now
        s.settimeout(2)
        assert s.recv(10) == b"held"
        p.half_open()
        s.settimeout(0.3)
        s.sendall(b"lost")
        with pytest.raises(TimeoutError):
            s.recv(10)
        p.heal()
        s.settimeout(2)
        s.sendall(b"c")
        assert s.recv(10) == b"c"  # the server got "lost" too, but its echo of it was dropped
        t = time.monotonic()
        assert p.reset() == 1
        with pytest.raises(ConnectionResetError):
            s.recv(10)
        assert time.monotonic() - t < 0.05  # RST at once
        p.refuse()
        with socket.create_connection(("127.0.0.1", p.port)) as s2, pytest.raises(ConnectionResetError):
            s2.settimeout(2)
            s2.recv(10)
        stats = p.stats()
        assert stats.reset == 2 and stats.dropped == 4 and stats.to_server >= 9
    server.close()


def test_latency_slows_calls_but_everything_completes(net: Net) -> None:
    with Flow(net) as flow:
        before = len(flow.executed)
        net.proxy.latency(LATENCY_MS)
        start = flow.probe_during(LATENCY_S)
        during = flow.calls.since(start)
        net.proxy.heal()
        flow.assert_bounded(start)
        failed = [c for c in during if c.error is not None]
        if FULL:
            # At 1 s per round trip a new PostgreSQL connection (~6 round trips) outlasts the pool's
            # 5 s wait: such calls may fail, cleanly and in time (checked above). Reported, not fatal.
            assert all(isinstance(c.error, StoreError) for c in failed), [repr(c.error) for c in failed][:5]
            print(f"{net.kind}: {len(failed)} call(s) failed under {LATENCY_MS} ms latency: "
                  f"{sorted({str(c.error)[:100] for c in failed})[:3]}")
        else:
            assert failed == [], "latency far below the timeouts must not fail calls"
        assert len(flow.executed) > before, "no job ran during the latency window"
        now = time.monotonic()
        assert any(c.what in ("enqueue", "get_job") and c.duration(now) >= 2 * LATENCY_MS / 1000
                   for c in during), "the latency was not felt: was traffic going through the proxy?"
        flow.drain()
        flow.check_history()


def test_reset_connections_fail_fast_and_recover(net: Net) -> None:
    with Flow(net) as flow:
        start = time.monotonic()
        # RST every open connection, twice, while jobs flow; then refuse new ones for a while.
        resets = net.proxy.reset()
        time.sleep(0.3)
        resets += net.proxy.reset()
        assert resets >= 2, "no connection was open through the proxy"
        net.proxy.refuse()
        flow.probe_during(RESET_REFUSE_S)
        net.proxy.heal()
        healed = time.monotonic()
        flow.assert_bounded(start)
        took = flow.assert_reconnects(healed)
        flow.drain()
        flow.check_history()
    print(f"{net.kind}: first enqueue {took:.2f}s after healing")


@pytest.mark.parametrize("mode", ["blackhole", "half_open"])
def test_a_silent_store_never_blocks_a_call_past_its_timeout(net: Net, mode: str, request: pytest.FixtureRequest,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="conveyor")
    with Flow(net) as flow:
        getattr(net.proxy, mode)()
        start = flow.probe_during(max(BLACKHOLE_S, net.bound + 1.0))
        flow.assert_bounded(start)  # checked before healing: a call stuck until the heal counts
        failed = [c for c in flow.calls.since(start) if c.error is not None]
        assert failed, "nothing failed while the store was silent: was traffic going through the proxy?"
        assert not flow.calls.foreign_errors(), flow.calls.foreign_errors()[:5]
        probes = [c for c in failed if c.what in ("enqueue", "get_job", "stats")]
        assert probes and all(isinstance(c.error, StoreError) for c in probes), [repr(c.error) for c in probes][:5]
        assert "heartbeat failed" in caplog.text or "claim failed" in caplog.text or "could not record" in caplog.text
        net.proxy.heal()
        healed = time.monotonic()
        took = flow.assert_reconnects(healed)
        flow.drain()
        report = flow.check_history()
    print(f"{net.kind} {mode}: first enqueue {took:.2f}s after healing; {report}")


def test_a_worker_cut_off_past_its_lease_is_fenced(net: Net) -> None:
    """Worker A (through the proxy) runs a job; the proxy blackholes A past its lease; worker B
    (direct) takes the job over and finishes it. When A's network heals, its heartbeat or ack
    with the old lease token is refused, and the job keeps B's result."""
    runs: list[tuple[str, int]] = []
    release_a = threading.Event()
    token_a: list[str] = []
    app_a = net.app(visibility_timeout=LEASE)
    app_b = net.app(direct=True, visibility_timeout=LEASE)

    @app_a.task(name="net.slow")
    def slow_a() -> str:
        ctx = current_job()
        assert ctx is not None and ctx.job.lease_token
        runs.append(("A", ctx.attempt))
        token_a.append(ctx.job.lease_token)
        release_a.wait(60)
        return "A"

    @app_b.task(name="net.slow")
    def slow_b() -> str:
        ctx = current_job()
        assert ctx is not None
        runs.append(("B", ctx.attempt))
        return "B"

    job = app_b.tasks["net.slow"].options(queue="fence").enqueue()
    a = WorkerThread(app_a, queues="fence", concurrency=1, poll_interval=0.1, maintenance_interval=0.2,
                     grace_period=1.0).start()
    b: WorkerThread | None = None
    try:
        wait_until(lambda: runs == [("A", 1)], timeout=20, message="worker A started the job")
        net.proxy.blackhole()
        cut = time.monotonic()
        b = WorkerThread(app_b, queues="fence", concurrency=1, poll_interval=0.1, maintenance_interval=0.2).start()
        done = wait_until(lambda: (j := app_b.get_job(job.id)).state is JobState.SUCCEEDED and j,
                          timeout=LEASE + 20, message="worker B finished the job after A's lease ran out")
        took_over = time.monotonic() - cut
        assert done.result == "B" and done.attempts == 2 and runs == [("A", 1), ("B", 2)]
        assert took_over >= LEASE * 0.9, "B got the job before A's lease could have expired"
        net.proxy.heal()
        release_a.set()  # A's task returns now and tries to report "A"
        wait_until(lambda: a.worker.counters.lease_lost >= 1, timeout=LEASE + 15,
                   message="worker A noticed it lost the lease (heartbeat refused or ack refused)")
        assert a.worker.counters.succeeded == 0
        # The zombie's own calls with its old token, made now that its network works again:
        with pytest.raises(LeaseLost):
            app_a.backend.ack(Lease(job.id, token_a[0]), '"A"')
        assert app_a.backend.heartbeat([Lease(job.id, token_a[0])], lease_s=LEASE) == {job.id}
        final = app_b.get_job(job.id)
        assert (final.state, final.result, final.attempts) == (JobState.SUCCEEDED, "B", 2)
        assert final.finished_at == done.finished_at
        assert [e["kind"] for e in final.errors] == ["lease_expired"]
    finally:
        release_a.set()
        net.proxy.heal()
        a.stop()
        if b is not None:
            b.stop()
        a.join(30)
        if b is not None:
            b.join(30)


@pytest.mark.parametrize("net", ["postgres"], indirect=True)
def test_a_call_waiting_when_the_pool_gives_up_reconnecting_gets_a_connection_once_the_store_answers(
        net: Net, monkeypatch: pytest.MonkeyPatch) -> None:
    """psycopg_pool stops reconnecting after ``reconnect_timeout`` and tries again only for a
    *new* request. A call already waiting for a connection then sat out its whole wait though
    the server was back (what the server-freeze test showed: a worker's heartbeats failing for
    seconds after the thaw, leases lost a second time). The backend now asks again while it
    waits. PostgreSQL only: redis-py connects on the calling thread, nothing waits on a pool."""
    from conveyor.backends.postgres import connection as pmod

    # A long wait, so the call is certainly still waiting when the pool gives up. Two chains of
    # reconnect attempts run (the replacement of the reset connection, and the growth this
    # call's request starts), each of 5 s connect timeouts with growing pauses until
    # reconnect_timeout: the pool is empty only once both gave up, seen 11-30 s in.
    monkeypatch.setattr(pmod, "POOL_TIMEOUT", 150.0)
    backend: Any = net.app().backend
    assert backend.get(1) is None
    net.proxy.blackhole()
    assert net.proxy.reset() >= 1, "no connection was open through the proxy"
    got: list[Any] = []

    def call() -> None:
        try:
            got.append(backend.get(1))
        except BaseException as exc:  # reported below
            got.append(exc)

    waiter = threading.Thread(target=call, daemon=True)
    waiter.start()
    wait_until(lambda: backend._pool.get_stats().get("pool_size", 1) == 0, timeout=90,
               message="the pool gave up reconnecting")
    assert waiter.is_alive() and not got, f"the call ended before the pool gave up: {got}"
    net.proxy.heal()
    healed = time.monotonic()
    waiter.join(15)
    took = time.monotonic() - healed
    assert got == [None], (f"the waiting call did not get a connection within 15 s of the store "
                           f"answering again: {got or 'still waiting'}")
    print(f"the waiting call got its answer {took:.2f}s after healing")


# -- a claim whose reply is lost (issue 32 item 3) --------------------------------------------------------
def test_a_claim_whose_reply_is_lost_costs_no_attempt(net: Net, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim reaches the server and runs there; its reply is dropped (half-open), then the
    connection is reset. The claimer knows the claim id its lease tokens began with and gives
    the claim back once the store answers again: the jobs are available at once, attempts 0,
    instead of waiting out the lease and being charged an attempt (max_attempts=1: dead)."""
    from support import new_job

    from conveyor.errors import StoreError as Err

    direct = net.app(direct=True)
    proxied = net.app()
    ids = [r.id for r in direct.backend.enqueue_many([new_job(max_attempts=1) for _ in range(3)])]
    # Connections through the proxy, ready (and on Redis the claim script loaded).
    assert proxied.backend.claim("warm-up", 1, worker_id="w-lost", lease_s=60.0) == []
    out: dict[str, Any] = {}
    cut: list[str] = []  # the PostgreSQL claim statement whose reply the proxy dropped
    if net.kind == "postgres":
        # A PostgreSQL claim is two statements (promote the due jobs, then claim): the proxy
        # goes half-open just before the claim statement is handed to libpq, so the server
        # runs and commits it and its reply is the one lost.
        import psycopg

        real_execute = psycopg.Connection.execute

        def execute(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
            text = query.decode() if isinstance(query, bytes) else str(query)
            if "claimed AS (" in text and threading.current_thread() is thread and not cut:
                cut.append(text)
                net.proxy.half_open()
            return real_execute(self, query, *args, **kw)

        monkeypatch.setattr(psycopg.Connection, "execute", execute)

    def claim() -> None:
        try:
            out["jobs"] = proxied.backend.claim("default", 3, worker_id="w-lost", lease_s=60.0)
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=claim, daemon=True)
    if net.kind == "redis":
        net.proxy.half_open()  # a Redis claim is one script call
    thread.start()
    try:
        def claimed() -> bool:
            jobs = [direct.backend.get(i) for i in ids]
            return all(j is not None and j.state is JobState.RUNNING for j in jobs)

        wait_until(claimed, 10, message="the claim to run on the server")
    finally:
        net.proxy.heal()
        net.proxy.reset()
    thread.join(net.bound + 5)
    assert not thread.is_alive()
    assert net.kind == "redis" or len(cut) == 1
    assert "jobs" not in out and isinstance(out.get("error"), Err), out
    for job_id in ids:
        job = direct.backend.get(job_id)
        assert job is not None
        assert (job.state, job.attempts, job.stalls, job.lease_token) == (JobState.AVAILABLE, 0, 0, None), job


@pytest.mark.parametrize("mode", ["half_open", "blackhole"])
def test_a_wake_up_subscriber_on_a_dead_path_is_replaced(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partitioned app's grouped idle waits hang on one subscribed connection per node
    (backends/redis/wakes.py). A path that stops answering without a reset would lose every
    wake-up without a sign: the subscriber PINGs a quiet connection and takes it for dead when
    no answer comes within the socket timeout, so the waits subscribe again once it heals."""
    from conveyor.backends import open_backend
    from conveyor.backends.redis import wakes
    from conveyor.backends.redis.partitions import PartitionedRedis, queue_partition

    monkeypatch.setattr(wakes, "PING_EVERY", 0.3)
    with shared_store("redis") as direct:
        parts = urlsplit(direct)
        with Proxy(parts.hostname or "127.0.0.1", parts.port or 0) as proxy:
            url = _with_query(proxy.url_for(direct), "socket_timeout=1&partitions=8")
            b = open_backend(url)
            assert isinstance(b, PartitionedRedis)
            by_part: dict[int, str] = {}
            i = 0
            while len(by_part) < 8:
                by_part.setdefault(queue_partition(f"q{i}", 8), f"q{i}")
                i += 1
            queues = list(by_part.values())
            try:
                assert b.wait_for_jobs(queues, 0.2) is False  # subscribed through the proxy
                [first] = list(b._hub._nodes.values())
                getattr(proxy, mode)()
                deadline = time.monotonic() + 10
                while not first.broken:
                    assert time.monotonic() < deadline, "the dead subscriber was kept"
                    time.sleep(0.05)
                proxy.heal()
                woken: list[bool] = []
                t = threading.Thread(target=lambda: woken.append(b.wait_for_jobs(queues, 30)))
                t.start()
                deadline = time.monotonic() + 10
                while b._hub.subscriptions() < 8:
                    assert time.monotonic() < deadline, "never subscribed again"
                    time.sleep(0.02)
                time.sleep(0.2)
                b.enqueue_many([NewJob(task="t", queue=queues[3], args="{}", max_attempts=1,
                                       timeout=30)])
                t.join(15)
                assert woken == [True]
            finally:
                proxy.heal()
                b.close()
