"""Two server faults the other fault tests lack: the server frozen (SIGSTOP) under load, and
Redis on a full disk (R5b's Redis half).

**Freeze** (the plan's pause nemesis, section 7.3, aimed at the server; R3/R4's pause variant).
Three worker processes (concurrency 4, lease 2 s) and a producer at 150 jobs/s on the fault
suite's *private* PostgreSQL or Redis (never the machine's shared ones on 5432 / 6379). After
~2 s of load, SIGSTOP every process of that server -- PostgreSQL: the postmaster (its pid from
``postmaster.pid``, checked to run our data directory) and all its children (backends,
checkpointer, WAL writer, ...), found through /proc; Redis: redis-server and any child it
forked -- for FREEZE s, then SIGCONT them (always, in a ``finally``), and check the server
answers again before the test ends. FREEZE is the longer of the lease and the producer's
configured call bound, plus a few seconds. That bound ("its timeout", as in
test_network_faults.py):

* Redis: ``socket_timeout`` + ``RETRY_BUDGET`` (CI: ``socket_timeout=1`` in the URL of the
  producer and the workers, so 3 s; full: the defaults, 5 + 2 s);
* PostgreSQL: ``max(POOL_TIMEOUT, statement_timeout) + DEADLINE_MARGIN_S`` (CI: the producer's
  statement_timeout shortened to 2 s, so 5.5 s; full: the defaults, 30.5 s). The worker
  processes keep the production timeouts, so in CI their calls wait the freeze out, and in the
  full profile (FREEZE 33.5 s) their client-side deadlines fire too.

Pass: no enqueue took longer than its bound + 1 s (each call is timed in the history); every
enqueue that failed raised a StoreError (StoreUnavailable, ...), never a driver's exception;
none that started once the server was stopped succeeded before SIGCONT, and in each freeze
at least one failed while the server was stopped (so the freeze did bite); every worker
process is alive at the end, none restarted; after each SIGCONT the first job starts within
10 s; after the drain lost = 0 over ``ok`` enqueues, unexpected = 0, every ``ok`` job
succeeded, nothing left running, no attempt ran twice, no stale result; duplicated <= freezes
x workers x concurrency (a worker holds at most ``concurrency`` jobs whose lease the freeze
can cost). CI: one freeze; full: three, 10 s apart.

**Redis on a full disk.** A redis-server of this test's own (redisrig.RedisServer, its own
port; ``appendonly yes``, ``appendfsync everysec``) whose data directory is a 2 MiB tmpfs
(mounted by the test, unmounted in a ``finally``), with one worker process running jobs. A
ballast file takes all but 256 KiB; enqueue 4 KiB jobs until one fails, keep enqueuing for a
second (full: 3 s), delete the ballast, wait until Redis reports its AOF writable again
(``aof_last_write_status:ok``: after a failed write Redis 7 keeps the data in its AOF buffer,
refuses writes with ``MISCONF``, and retries the write itself), then enqueue 100 more jobs.
Then SIGKILL Redis and restart it on the same directory: replaying the AOF must give back
every job as it was. Pass: every refused enqueue raised a Conveyor error (never a
``redis.exceptions`` one) within 1 s; the worker process lives through it; the 100 enqueues
after freeing the space all succeed, and their jobs; lost = 0 over ``ok`` enqueues;
duplicated <= cycles x concurrency (acks refused past the lease); the AOF replays to the
same jobs; every refusal is StorageFull (Redis's ``MISCONF``: nothing was written) or
StoreUnavailable. (This test found MISCONF surfacing as a plain StoreError; fixed.)
CI: one fill-and-free cycle; full: three.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from faultstore import FaultStore, open_fault_store
from harness import (
    FULL,
    History,
    Producer,
    WorkerSpec,
    all_jobs,
    check,
    client_app,
    drain,
    make_rng,
    pick,
    read_effects,
)
from processrig import proc_stat, wait_until
from redisrig import RedisServer

import conveyor.errors
from conveyor import JobState
from conveyor.backends import redis as redis_backend
from conveyor.backends.postgres import connection as pg_backend
from conveyor.errors import ConveyorError, StorageFull, StoreError, StoreUnavailable

pytestmark = [pytest.mark.faults, pytest.mark.process]

SHARED_PORTS = {5432, 6379}  # the machine's own servers: never paused
WORKERS, CONCURRENCY, LEASE = 3, 4, 2.0
RATE = 150.0
LOAD_S = 2.0  # of load before the first freeze
FREEZES = pick(1, 3)
GAP_S = pick(4.0, 10.0)  # after each SIGCONT, before the next freeze (and before the producer ends)
FREEZE_MARGIN_S = pick(2.5, 3.0)  # the freeze outlasts the lease and the call bound by this
FIRST_JOB_S = 10.0  # after SIGCONT, the first job starts this soon
CI_REDIS_SOCKET_TIMEOUT = 1.0
CI_PG_STATEMENT_TIMEOUT_MS = 2000
APP_PREFIX = "fpause-"


def fail_without(*tools: str) -> None:
    """CI treats a skip as a failure: a missing tool fails the test, saying what is missing."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"these tests need {', '.join(missing)} on PATH", pytrace=False)


# -- freezing a whole server ------------------------------------------------------------------------
def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (a scan of /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = proc_stat(int(entry.name))
            if st is not None and st["ppid"] == pid:
                found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def postmaster_pid(store: FaultStore) -> int:
    """The private cluster's postmaster, checked to be the one running its data directory."""
    assert store.pg is not None
    assert store.pg.port not in SHARED_PORTS, f"refusing to pause the shared PostgreSQL on {store.pg.port}"
    pid = int((store.pg.data / "postmaster.pid").read_text().split()[0])
    assert str(store.pg.data) in cmdline(pid), f"pid {pid} is not our postmaster: {cmdline(pid)!r}"
    return pid


def redis_pid(store: FaultStore) -> int:
    assert store.redis is not None and store.redis.proc is not None
    assert store.redis.port not in SHARED_PORTS, f"refusing to pause the shared Redis on {store.redis.port}"
    pid = store.redis.proc.pid
    assert f":{store.redis.port}" in cmdline(pid), f"pid {pid} is not our redis-server: {cmdline(pid)!r}"
    return pid


class Freeze:
    """SIGSTOP a server's root process, then every child it has (the root, stopped, forks no
    more); ``thaw()`` SIGCONTs all of them. Used as a context manager: thawed on the way out,
    whatever happened."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.stopped: list[int] = []

    def __enter__(self) -> Freeze:
        try:
            self.stopped.append(self.root)  # listed first: whatever happens next, it gets its SIGCONT
            os.kill(self.root, signal.SIGSTOP)
            while new := [p for p in children(self.root) if p not in self.stopped]:
                for pid in new:
                    self.stopped.append(pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)

            def all_stopped() -> bool:  # a child that exited meanwhile is a zombie: fine
                return all((proc_stat(p) or {"state": "T"})["state"] in ("T", "Z") for p in self.stopped)

            wait_until(all_stopped, 10, "the server's processes to stop")
        except BaseException:
            self.thaw()
            raise
        return self

    def thaw(self) -> None:
        """SIGCONT the children first: the root, still stopped meanwhile, reaps none of them
        (so no pid of the list can be reused before it is sent its SIGCONT)."""
        for pid in reversed(self.stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.thaw()
        if exc_type is None:
            wait_until(lambda: not [p for p in self.stopped if (proc_stat(p) or {}).get("state") == "T"], 5,
                       "the server's processes to run again after SIGCONT")


def wait_answering(store: FaultStore, timeout: float = 30.0) -> None:
    """The server answers a query again (the next test gets a healthy server)."""
    def up() -> bool:
        try:
            if store.pg is not None:
                with psycopg.connect(store.pg.url, autocommit=True, connect_timeout=3) as conn:
                    conn.execute("SELECT 1")
            else:
                assert store.redis is not None
                c = store.redis.client()
                try:
                    c.ping()
                finally:
                    c.close()
            return True
        except (psycopg.Error, redis.RedisError):
            return False

    wait_until(up, timeout, f"the private {store.name} server to answer after SIGCONT")


# -- the freeze under load -------------------------------------------------------------------------
def call_bound(backend: str) -> float:
    """The longest an enqueue is configured to take (its timeout), in this process."""
    if backend == "redis":
        socket_timeout = redis_backend.DEFAULT_SOCKET_TIMEOUT if FULL else CI_REDIS_SOCKET_TIMEOUT
        return socket_timeout + redis_backend.RETRY_BUDGET
    return (max(pg_backend.POOL_TIMEOUT, pg_backend.STATEMENT_TIMEOUT_MS / 1000)
            + pg_backend.DEADLINE_MARGIN_S)


def error_class(op_error: str | None) -> type[BaseException] | None:
    """The Conveyor exception class named in a history record (None if it is not one)."""
    name = (op_error or "").split(":", 1)[0]
    found = getattr(conveyor.errors, name, None)
    return found if isinstance(found, type) and issubclass(found, ConveyorError) else None


@pytest.mark.timeout(pick(240, 900))
@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_server_frozen_under_load(backend: str, request: pytest.FixtureRequest, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch, make_cluster) -> None:  # type: ignore[no-untyped-def]
    fail_without("redis-server" if backend == "redis" else "runuser")
    if backend == "postgres" and not FULL:
        monkeypatch.setattr(pg_backend, "STATEMENT_TIMEOUT_MS", CI_PG_STATEMENT_TIMEOUT_MS)
    with open_fault_store(backend, request, tmp_path) as store:
        try:
            run_freeze(store, make_cluster)
        finally:
            wait_answering(store)


def run_freeze(store: FaultStore, make_cluster) -> None:  # type: ignore[no-untyped-def]
    seed, rng = make_rng(f"server freeze / {store.name}")
    bound = call_bound(store.name)
    freeze_s = max(LEASE, bound) + FREEZE_MARGIN_S
    url = store.url
    if store.redis is not None and not FULL:
        url += f"&socket_timeout={CI_REDIS_SOCKET_TIMEOUT:g}&socket_connect_timeout={CI_REDIS_SOCKET_TIMEOUT:g}"
    root = postmaster_pid(store) if store.pg is not None else redis_pid(store)

    cluster = make_cluster(url, url_for=store.url_for(APP_PREFIX))
    workers = [cluster.spawn(WorkerSpec(concurrency=CONCURRENCY, lease=LEASE), wait=False) for _ in range(WORKERS)]
    cluster.wait_started(*workers)
    app = client_app(url)
    try:
        history = History()
        jobs_n = int(RATE * (LOAD_S + FREEZES * (freeze_s + GAP_S) + 2))
        jobs = [(n, round(rng.uniform(0.005, 0.03), 4)) for n in range(jobs_n)]
        producer = Producer(app, history, jobs, rate=RATE).start()
        wait_until(lambda: len(history.ok_ids()) >= LOAD_S * RATE * 0.8, 30, "load before the freeze")

        # (first SIGSTOP, every process stopped, SIGCONT sent), in time.time() like the history
        windows: list[tuple[float, float, float]] = []
        frozen_procs = []
        for i in range(FREEZES):
            if i:
                time.sleep(GAP_S)
            t_stop = time.time()
            with Freeze(root) as freeze:
                t_frozen = time.time()
                frozen_procs.append(len(freeze.stopped))
                time.sleep(freeze_s)
                freeze.thaw()
                windows.append((t_stop, t_frozen, time.time()))
            print(f"[server freeze / {store.name}] freeze {i + 1}: {len(freeze.stopped)} process(es) "
                  f"stopped for {windows[-1][2] - t_frozen:.1f}s")
        producer.join(timeout=jobs_n / RATE + 120)
        drain(app.backend, 90, cluster.diagnosis)

        effects = read_effects(cluster.log)
        report = check(f"server freeze (SIGSTOP) {store.name}", store.name, seed, history, effects,
                       all_jobs(app.backend))
        report.faults = {"server_sigstop": FREEZES, "frozen_s": round(sum(c - a for a, _, c in windows), 1)}
        report.duplicate_bound = FREEZES * WORKERS * CONCURRENCY

        took = history.durations()
        invoked = {o.n: o.t for o in history.by_type("invoke")}
        errors = history.by_type("fail") + history.by_type("info")
        # Calls that overlapped a freeze; ok answers to calls made once everything was stopped
        # and given before SIGCONT (impossible); errors given while the server was stopped.
        in_freeze = [n for n, t in invoked.items() if any(t < c and t + took.get(n, 0.0) > a for a, _, c in windows)]
        ok_while_frozen = [o.n for o in history.by_type("ok")
                           if any(b <= invoked[o.n] and o.t < c for _, b, c in windows)]
        failed_in_freeze = [o for o in errors if any(b <= o.t < c for _, b, c in windows)]
        first_starts = []
        for *_, t_back in windows:
            after = [r["t0"] for r in effects if r["t0"] >= t_back]
            first_starts.append(round(min(after) - t_back, 2) if after else None)
        report.figures = {
            "frozen_processes": frozen_procs, "freeze_s": round(freeze_s, 1), "call_bound_s": round(bound, 1),
            "slowest_enqueue_s": round(max(took.values()), 2),
            "slowest_enqueue_in_freeze_s": round(max((took.get(n, 0.0) for n in in_freeze), default=0.0), 2),
            "enqueues_in_freeze": len(in_freeze), "failed_in_freeze": len(failed_in_freeze),
            "enqueue_errors": len(errors),
            "error_classes": dict(Counter((o.error or "").split(":", 1)[0] for o in errors)),
            "first_job_start_after_sigcont_s": first_starts,
            "first_error": errors[0].error[:110] if errors else None,
            "lease_lost_logged": cluster.stderr_all().count("lease lost"),
        }
        if store.pg is not None:
            report.figures["pg_deadlines_fired_in_workers"] = cluster.stderr_all().count(
                "PostgreSQL did not answer in time")
        report.emit()

        assert not producer.errors, ("an enqueue raised something that is not a ConveyorError: "
                                     + "".join(traceback.format_exception(producer.errors[0])))
        slow = sorted(((round(s, 2), n) for n, s in took.items() if s > bound + 1.0), reverse=True)
        assert not slow, f"enqueues blocked past their bound {bound:.1f}s + 1 s: {slow[:10]}"
        not_store = [o.error for o in errors if not (cls := error_class(o.error)) or not issubclass(cls, StoreError)]
        assert not not_store, f"failed enqueues that were not StoreErrors: {not_store[:5]}"
        quiet = [i + 1 for i, (_, b, c) in enumerate(windows) if not any(b <= o.t < c for o in errors)]
        assert not quiet, f"no enqueue failed during freeze(s) {quiet}: the freeze did not bite"
        assert not ok_while_frozen, f"enqueues succeeded while the server was stopped: {ok_while_frozen[:10]}"
        report.assert_clean(context=cluster.diagnosis())
        assert report.ok >= jobs_n * 0.5, "most enqueues failed: the freeze lasted too long to test anything"
        dead = [p for p in cluster.procs if not p.alive()]
        assert not dead and len(cluster.procs) == WORKERS, f"worker processes died: {dead}\n{cluster.diagnosis()}"
        assert all(s is not None and s <= FIRST_JOB_S for s in first_starts), first_starts
    finally:
        app.close()


# -- Redis on a full disk ---------------------------------------------------------------------------
DISK = "2m"
HEADROOM = 256 * 1024  # left free beside the ballast
PAD = "p" * 4096
CYCLES = pick(1, 3)
REFUSALS = pick(20, 60)  # enqueues tried, 50 ms apart, while the disk is full
AFTER = 100  # enqueues after the space is freed
CALL_S = 1.0  # a refused enqueue answers this soon

@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root", pytrace=False)
    fail_without("mount", "umount")
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs on {path}: {res.stderr.strip()}", pytrace=False)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def aof_writable(server: RedisServer) -> bool:
    c = server.client()
    try:
        return str(c.info("persistence").get("aof_last_write_status")) == "ok"
    finally:
        c.close()


@pytest.mark.timeout(pick(120, 300))
def test_redis_full_disk_is_a_clear_error_and_recovers(tmp_path: Path, make_cluster) -> None:  # type: ignore[no-untyped-def]
    fail_without("redis-server")
    seed, _ = make_rng("R5b Redis disk full")
    base = tmp_path / "redis"
    base.mkdir()
    with tmpfs(base / "redis-data", DISK) as disk:  # RedisServer(base) keeps its data here, its log beside
        server = RedisServer(base)
        assert server.dir == disk and server.port not in SHARED_PORTS
        server.start()
        try:
            url = f"redis://127.0.0.1:{server.port}/0?prefix=fdisk"
            cluster = make_cluster(url, log=tmp_path / "effects.jsonl")
            worker = cluster.spawn(WorkerSpec(concurrency=CONCURRENCY, lease=LEASE))
            app = client_app(url)
            try:
                run_full_disk(seed, server, disk, app, cluster, worker)
            finally:
                app.close()
                cluster.close()
        finally:
            server.stop()


def run_full_disk(seed: int, server: RedisServer, disk: Path, app, cluster, worker) -> None:  # type: ignore[no-untyped-def]
    task = app.tasks["fault.work"]
    history = History()
    n = 0
    refusals: list[tuple[BaseException, float]] = []  # (error, seconds the call took)
    writable_after: list[float] = []
    full_s = 0.0

    def enqueue(**kw: object) -> BaseException | None:
        """One recorded enqueue; the Conveyor error it raised, if any. Anything else is a bug."""
        nonlocal n
        n += 1
        history.invoke(n)
        t = time.monotonic()
        try:
            job = task.enqueue(n, **kw)
        except ConveyorError as exc:
            (history.fail if "nothing was" in str(exc) else history.info)(n, exc)
            refusals.append((exc, time.monotonic() - t))
            return exc
        except Exception as exc:
            history.info(n, exc)
            raise AssertionError(f"enqueue on a full disk raised {type(exc).__module__}.{type(exc).__name__}, "
                                 f"not a Conveyor error:\n{''.join(traceback.format_exception(exc))}") from exc
        history.ok(n, job.id)
        return None

    for cycle in range(CYCLES):
        ballast = disk / "ballast"
        st = os.statvfs(disk)
        ballast.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - HEADROOM))
        t_full = time.monotonic()
        for _ in range(5000):
            if enqueue(pad=PAD) is not None:
                break
        else:
            raise AssertionError(f"cycle {cycle}: the disk never filled")
        refused = 0
        for _ in range(REFUSALS):  # full for a while
            time.sleep(0.05)
            refused += enqueue(pad=PAD) is not None
        assert refused >= REFUSALS * 0.75, f"only {refused}/{REFUSALS} enqueues refused on a full disk"
        assert worker.alive(), f"the worker died on a full disk:\n{worker.stderr()[-3000:]}"

        ballast.unlink()
        t_free = time.monotonic()
        wait_until(lambda: aof_writable(server), 15, "Redis to write its AOF again after the space was freed")
        writable_after.append(round(time.monotonic() - t_free, 2))
        full_s += time.monotonic() - t_full
        after = []
        for _ in range(AFTER):
            assert enqueue() is None, f"an enqueue failed after the space was freed: {refusals[-1][0]!r}"
            after.append(n)
        drain(app.backend, 60, cluster.diagnosis)
        ids = history.ok_ids()
        not_done = [k for k in after if app.get_job(ids[k]).state is not JobState.SUCCEEDED]
        assert not not_done, f"jobs enqueued after the space was freed did not succeed: {not_done[:10]}"

    assert worker.alive(), worker.stderr()[-3000:]
    report = check("R5b Redis disk full", "redis", seed, history, read_effects(cluster.log), all_jobs(app.backend))
    # A SIGKILL and a restart on the same directory: the AOF, written again after the failed write,
    # replays to the same jobs.
    before = {j.id: (j.state, j.attempts) for j in all_jobs(app.backend)}
    server.kill()
    server.start()
    replayed = {j.id: (j.state, j.attempts) for j in all_jobs(app.backend)}
    first, slowest = refusals[0][0], max(s for _, s in refusals)
    report.faults = {"disk_full_s": round(full_s, 1)}
    report.duplicate_bound = CYCLES * CONCURRENCY
    report.figures = {
        "first_error": f"{type(first).__name__}: {str(first)[:120]}",
        "error_classes": dict(Counter(type(e).__name__ for e, _ in refusals)),
        "refused": len(refusals), "slowest_refusal_s": round(slowest, 3),
        "aof_writable_after_free_s": writable_after,
        "worker_misconf_log_lines": worker.stderr().count("MISCONF"),
        "aof_replay_same_jobs": before == replayed,
    }
    report.emit()

    report.assert_clean(context=cluster.diagnosis())
    assert slowest <= CALL_S, f"a refused enqueue took {slowest:.2f}s"
    assert before == replayed, f"after the AOF replay: {len(before)} jobs before, {len(replayed)} after"
    assert worker.alive(), worker.stderr()[-3000:]
    wrong = [e for e, _ in refusals if not isinstance(e, StorageFull | StoreUnavailable)]
    assert not wrong, f"{len(wrong)}/{len(refusals)} refusals were {type(wrong[0]).__name__}: {wrong[0]}"
    assert any("nothing was written" in str(e) for e, _ in refusals if isinstance(e, StorageFull))

