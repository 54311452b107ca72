"""Faults on PostgreSQL, with real worker processes: killed connections, a server restart,
a worker SIGKILLed mid-job. No job whose enqueue returned may be lost.

Figures (duplicates, outage-to-error time, stalls) are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from pgrig import (
    PgRig,
    PrivatePostgres,
    fresh_schema,
    read_marker,
    runs_per_job,
    wait_until,
    with_params,
)

from conveyor import Conveyor
from conveyor.errors import StoreError
from conveyor.job import JobState

pytestmark = pytest.mark.process

# The test's own worker's connections only: they carry the test's unique application_name.
OWN = "application_name = %s AND datname = current_database() AND pid <> pg_backend_pid()"
TERMINATE = f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {OWN}"
CONNECTIONS = f"SELECT pid FROM pg_stat_activity WHERE {OWN}"


@pytest.fixture
def pg_rig(tmp_path: Path) -> Iterator[PgRig]:
    """A fresh schema in the machine's PostgreSQL and the worker processes of one test."""
    with fresh_schema() as url:
        rig = PgRig(tmp_path, url)
        try:
            yield rig
        finally:
            rig.close()


def duplicates(marker: Path) -> dict[int, int]:
    return {j: n for j, n in runs_per_job(read_marker(marker)).items() if n > 1}


# -- (a) connections killed under a running worker -----------------------------------------------
@pytest.mark.timeout(180)
def test_worker_survives_its_connections_being_killed(pg_rig: PgRig) -> None:
    """pg_terminate_backend on every connection of one worker, 6 times at 0.5 s, mid-drain, then
    once more while it idles: every job succeeds, the process lives. A job may run twice (its
    outcome could not be written before its 5 s lease ran out): counted and printed, not failed."""
    rig = pg_rig
    marker = rig.marker()
    # Only this test's worker connects with this name, so only its connections are killed.
    app_name = f"conveyor_test_{uuid.uuid4().hex[:10]}"
    worker_url = with_params(rig.url, application_name=app_name)
    n = 1000
    ids = [j.id for j in rig.task().enqueue_many([(str(marker), 0.02)] * n)]

    w = rig.worker(concurrency=4, visibility_timeout=5.0, poll_interval=0.2, url=worker_url)
    rig.wait_started(w)
    rig.wait_until(lambda: rig.states().get("succeeded", 0) >= 50, 30, "the drain to get going")

    killed: list[int] = []
    pending_at_last_kill = 0
    for _ in range(6):
        killed.append(len(rig.sql(TERMINATE, [app_name])))
        pending_at_last_kill = n - rig.states().get("succeeded", 0)
        time.sleep(0.5)
    assert sum(killed) > 0, "no connection of the worker was found to kill"
    assert pending_at_last_kill > 0, "the drain finished before the kills ended: make the jobs slower"

    states = rig.wait_all(n, timeout=90)
    assert states == {"succeeded": n}, states
    runs = runs_per_job(read_marker(marker))
    assert set(runs) == set(ids)
    assert w.alive(), f"the worker died:\n{w.stderr()[-3000:]}"
    dups = duplicates(marker)

    # Idle now: its LISTEN connection and pooled connections die too; new jobs still run.
    rig.wait_until(lambda: rig.sql(CONNECTIONS, [app_name]), 10, "the idle worker's connections")
    killed_idle = len(rig.sql(TERMINATE, [app_name]))
    more = [j.id for j in rig.task().enqueue_many([(str(marker),)] * 20)]
    states = rig.wait_all(n + len(more), timeout=60)
    assert states == {"succeeded": n + len(more)}, states
    assert w.alive(), f"the worker died:\n{w.stderr()[-3000:]}"

    reruns = rig.sql("SELECT count(*) FROM conveyor_jobs WHERE attempt > 1")[0][0]
    errors_logged = w.stderr().count("Traceback")
    print(f"\nkilled connections: {killed} while draining {n} jobs (then {killed_idle} while idle); "
          f"jobs run more than once: {len(dups)} {dict(list(dups.items())[:10])}; "
          f"jobs on attempt > 1: {reruns}; tracebacks in the worker log: {errors_logged}")


# -- (b) the server itself goes away and comes back ----------------------------------------------
@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL of the test's own, on a free port, removed afterwards."""
    srv = PrivatePostgres()
    try:
        srv.start()
        yield srv
    finally:
        srv.cleanup()


@dataclass
class Call:
    started: float
    ended: float
    job_id: int | None
    error: BaseException | None


class Producer:
    """Enqueues a job every ``gap`` seconds in a thread, timing each call and keeping its outcome."""

    def __init__(self, rig: PgRig, marker: Path, gap: float = 0.02) -> None:
        self.rig, self.marker, self.gap = rig, marker, gap
        self.calls: list[Call] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def _run(self) -> None:
        task = self.rig.task()
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                job = task.enqueue(str(self.marker), 0.01)
            except BaseException as exc:
                self.calls.append(Call(t, time.monotonic(), None, exc))
            else:
                self.calls.append(Call(t, time.monotonic(), job.id, None))
            self._stop.wait(self.gap)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "an enqueue call hung for over 60 s"

    def ok(self, since: float = 0.0) -> list[Call]:
        return [c for c in self.calls if c.job_id is not None and c.started >= since]

    def failed(self) -> list[Call]:
        return [c for c in self.calls if c.error is not None]


@pytest.mark.timeout(240)
def test_server_restart_under_load_loses_no_acknowledged_job(tmp_path: Path, private_pg: PrivatePostgres) -> None:
    """Stopped (immediate) under load, restarted ~3 s later. Each enqueue either returns (then its
    job must end succeeded) or raises StoreError, in bounded time. A call that starts during so
    short an outage usually waits in the connection pool (up to its 15 s timeout) and succeeds
    once the server is back; the next test keeps the server down until enqueue fails."""
    rig = PgRig(tmp_path, private_pg.url)
    try:
        marker = rig.marker()
        w = rig.worker(concurrency=4, visibility_timeout=5.0, poll_interval=0.2)
        rig.wait_started(w)
        with Producer(rig, marker) as producer:
            rig.wait_until(lambda: len(producer.ok()) >= 100 and rig.states().get("succeeded", 0) >= 50, 30,
                           "load before the outage")
            t_stop = time.monotonic()
            private_pg.stop("immediate")
            stopped_s = time.monotonic() - t_stop
            time.sleep(max(0.0, 3.0 - (time.monotonic() - t_stop)))
            private_pg.start()
            t_up = time.monotonic()
            # The producer goes on until enqueues work again, then a little longer.
            wait_until(lambda: len(producer.ok(since=t_up)) >= 50, 60,
                       lambda: f"enqueues to work again after the restart\n{rig.diagnosis()}")
        calls = producer.calls
        errors = producer.failed()
        for c in errors:
            assert isinstance(c.error, StoreError) and not isinstance(c.error, psycopg.Error), repr(c.error)
        slowest = max(c.ended - c.started for c in calls)
        assert slowest < 20, f"an enqueue call took {slowest:.1f}s"

        # Every job whose enqueue returned ends succeeded, run by the worker that lived through it.
        acked = [c.job_id for c in calls if c.job_id is not None]
        wait_until(lambda: rig.sql("SELECT count(*) FROM conveyor_jobs WHERE id = ANY(%s) AND state <> 'succeeded'",
                                   [acked])[0][0] == 0, 90,
                   lambda: f"the acknowledged jobs to succeed ({rig.states()})\n{rig.diagnosis()}")
        assert rig.states().keys() <= {"succeeded"}, rig.states()
        assert w.alive(), f"the worker died:\n{w.stderr()[-3000:]}"
        dups = duplicates(marker)
        during = [c for c in calls if c.started <= t_up and c.ended >= t_stop]
        first_error = min((c.ended - t_stop for c in errors), default=None)
        print(f"\nrestart: server stopped in {stopped_s:.2f}s, up again {t_up - t_stop:.2f}s after the stop; "
              f"{len(acked)} jobs acknowledged, all succeeded; {len(errors)} enqueues raised StoreError"
              f" (first {first_error if first_error is None else round(first_error, 2)}s after the stop);"
              f" calls spanning the outage: {[(round(c.ended - c.started, 2), c.job_id is not None) for c in during]};"
              f" slowest enqueue {slowest:.2f}s; enqueues OK again {producer.ok(since=t_up)[0].ended - t_up:.2f}s"
              f" after the restart; jobs run more than once: {len(dups)}")
    finally:
        rig.close()


@pytest.mark.timeout(240)
def test_enqueue_during_outage_raises_store_error_in_bounded_time(
    tmp_path: Path, private_pg: PrivatePostgres
) -> None:
    """The server stays down until an enqueue has failed: a StoreError (not a psycopg error), in
    bounded time; after the restart, enqueues work again and the same worker runs the jobs."""
    rig = PgRig(tmp_path, private_pg.url)
    try:
        marker = rig.marker()
        w = rig.worker(concurrency=4, visibility_timeout=5.0, poll_interval=0.2)
        rig.wait_started(w)
        with Producer(rig, marker) as producer:
            rig.wait_until(lambda: len(producer.ok()) >= 50 and rig.states().get("succeeded", 0) >= 20, 30,
                           "load before the outage")
            t_stop = time.monotonic()
            private_pg.stop("immediate")
            failed = wait_until(producer.failed, 25, "an enqueue to fail while the server is down")
            first_error_s = failed[0].ended - t_stop
            # A new app (no pool yet) fails at once, with the same error type.
            t0 = time.monotonic()
            with pytest.raises(StoreError) as fresh:
                Conveyor(private_pg.url).backend  # noqa: B018
            fresh_s = time.monotonic() - t0
            private_pg.start()
            t_up = time.monotonic()
            ok_again = wait_until(lambda: producer.ok(since=t_up), 90,
                                  lambda: f"enqueues to work again after the restart\n{rig.diagnosis()}")
            recovered_s = ok_again[0].ended - t_up
            wait_until(lambda: len(producer.ok(since=t_up)) >= 20, 30, "more enqueues after the restart")
        errors = producer.failed()
        for c in errors:
            assert isinstance(c.error, StoreError) and not isinstance(c.error, psycopg.Error), repr(c.error)
        assert not isinstance(fresh.value, psycopg.Error)
        assert first_error_s < 20, f"the first enqueue error came {first_error_s:.1f}s after the stop"
        slowest = max(c.ended - c.started for c in producer.calls)
        assert slowest < 20, f"an enqueue call took {slowest:.1f}s"

        acked = [c.job_id for c in producer.calls if c.job_id is not None]
        wait_until(lambda: rig.sql("SELECT count(*) FROM conveyor_jobs WHERE id = ANY(%s) AND state <> 'succeeded'",
                                   [acked])[0][0] == 0, 90,
                   lambda: f"the acknowledged jobs to succeed ({rig.states()})\n{rig.diagnosis()}")
        assert w.alive(), f"the worker died:\n{w.stderr()[-3000:]}"
        print(f"\noutage: first enqueue StoreError {first_error_s:.2f}s after the stop "
              f"({str(errors[0].error)[:90]!r}); a new app fails in {fresh_s:.2f}s; {len(errors)} enqueues "
              f"failed, slowest call {slowest:.2f}s; server down {t_up - t_stop:.1f}s; enqueue works again "
              f"{recovered_s:.2f}s after the restart; {len(acked)} acknowledged jobs all succeeded; "
              f"jobs run more than once: {len(duplicates(marker))}")
    finally:
        rig.close()


# -- (c) a worker killed mid-job ---------------------------------------------------------------
@pytest.mark.timeout(120)
def test_sigkilled_worker_job_completes_on_attempt_two(pg_rig: PgRig) -> None:
    rig = pg_rig
    marker = rig.marker()
    job = rig.task().enqueue(str(marker), 60.0, 2)  # attempt 1 sleeps a minute; attempt 2 is quick
    a = rig.worker(concurrency=2, visibility_timeout=1.0, poll_interval=0.2, name="a")
    rig.wait_until(lambda: read_marker(marker), 30, "attempt 1 to start")
    assert read_marker(marker)[0] == {"job": job.id, "attempt": 1, "pid": a.pid}
    a.popen.send_signal(signal.SIGKILL)
    a.popen.wait(timeout=10)
    t_kill = time.monotonic()

    b = rig.worker(concurrency=2, visibility_timeout=1.0, poll_interval=0.2, name="b")
    done = rig.wait_until(lambda: (j := rig.app.get_job(job.id)).state is JobState.SUCCEEDED and j, 30,
                          "the job to succeed on another worker")
    took = time.monotonic() - t_kill
    assert done.attempts == 2
    assert done.result == {"attempt": 2, "pid": b.pid}
    assert [e["kind"] for e in done.errors] == ["lease_expired"]
    assert [(r["attempt"], r["pid"]) for r in read_marker(marker)] == [(1, a.pid), (2, b.pid)]
    assert rig.sql("SELECT value FROM conveyor_counters WHERE name = 'lease_expired'") == [(1,)]
    print(f"\nSIGKILL: job {job.id} succeeded on attempt 2 {took:.2f}s after its worker was killed")


# -- (a2) the pools keep their size through storms of killed sessions -----------------------------
@pytest.mark.timeout(120)
def test_pools_do_not_grow_with_each_storm_of_killed_sessions() -> None:
    """Three threads use one backend as a worker does (claims and heartbeats on the control pool,
    reads on the main one) while all its sessions are terminated 12 times, 0.6 s apart. Each
    storm leaves dead connections the pool replaces; asking it for one while the replacement
    is on its way must not make it grow on top of that (it did: +1 per storm and per pool, up to
    max_size, for 10 minutes). Every call either answered or raised StoreError."""
    from conveyor.backends.postgres import PostgresBackend

    with fresh_schema() as url:
        app_name = f"conveyor_test_{uuid.uuid4().hex[:10]}"
        backend = PostgresBackend(with_params(url, application_name=app_name))
        admin = psycopg.connect(url, autocommit=True)
        stop = threading.Event()
        calls = {"ok": 0, "store_error": 0}
        other: list[BaseException] = []

        def use(call: object) -> None:
            while not stop.is_set():
                try:
                    call()  # type: ignore[operator]
                    calls["ok"] += 1
                except StoreError:
                    calls["store_error"] += 1
                except BaseException as exc:  # reported below
                    other.append(exc)
                    return
                time.sleep(0.002)

        users = [lambda: backend.claim("storm", 4, worker_id="w", lease_s=5.0),
                 lambda: backend.heartbeat([], lease_s=5.0),
                 lambda: backend.get(1)]
        threads = [threading.Thread(target=use, args=(u,), daemon=True) for u in users]
        try:
            for t in threads:
                t.start()
            time.sleep(0.5)
            sizes = []
            for _ in range(12):
                admin.execute(TERMINATE, [app_name])
                time.sleep(0.6)
                sizes.append((backend._pool.get_stats()["pool_size"], backend._control.get_stats()["pool_size"]))
        finally:
            stop.set()
            for t in threads:
                t.join(10)
            backend.close()
            admin.close()
        assert not other, other
        assert calls["ok"] > 100, calls
        main, control = max(s[0] for s in sizes), max(s[1] for s in sizes)
        print(f"\npool sizes (main, control) after each storm: {sizes}; calls {calls}")
        # One user of the main pool, two of the control pool: a replacement racing a caller may
        # add one, never one per storm.
        assert main <= 2 and control <= 3, sizes
