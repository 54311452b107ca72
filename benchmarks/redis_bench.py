"""Conveyor on Redis against Celery, RQ, Dramatiq, Huey and arq, on the same Redis, in one run.

    .venv/bin/python benchmarks/redis_bench.py [--jobs 20000] [--slow-jobs N] [--concurrency 8]
        [--rounds 1] [--latency-samples 300] [--systems conveyor,celery,...] [--seed N]

The peers are needed only here: ``.venv/bin/pip install celery rq 'dramatiq[redis]' huey arq``.

Every system gets a Redis database of its own on ``--redis`` (default 127.0.0.1:6379):
saq 9, celery 10, rq 11, dramatiq 12, huey 13, arq 14, conveyor 15 (with a fresh ``?prefix=`` per
phase as well). The benchmark FLUSHes only those databases, and refuses to start if one of them
holds keys it did not write (a marker key says which are its own). Database 0 is never touched.

Scenarios, run phase by phase so the systems alternate (their order rotates every round):

1. ``enqueue``       N no-op jobs, one producer call each (Conveyor ``task.enqueue``, Celery
                     ``delay``, RQ ``Queue.enqueue``, Dramatiq ``send``, Huey ``task()``, arq
                     ``enqueue_job``), after one untimed warm-up call.
2. ``enqueue_many``  N jobs through the system's batch API, 1000 per call, where it has one:
                     Conveyor ``enqueue_many`` (one Lua script per batch), RQ ``enqueue_many``
                     (one MULTI/EXEC pipeline per batch). The others: n/a (Celery's group or
                     chunks send one message per task; Dramatiq, Huey and arq have no batch
                     write). This is the drain backlog of systems that have it; the others'
                     backlog is the queue (1) wrote.
3. ``drain``         the backlog run by ONE worker process, 8-way concurrency: Conveyor
                     ``Worker(concurrency=8)``, Celery ``-P threads -c 8``, RQ ``SimpleWorker``
                     (one job at a time: RQ has no in-process concurrency), Dramatiq ``-p 1 -t 8``,
                     Huey ``-w 8 -k thread``, arq ``max_jobs=8, poll_delay=0.05`` (and
                     ``arq-default``: arq's default ``poll_delay=0.5``, on a smaller backlog).
                     Throughput = jobs / (last no-op body end - first body start), wall clock,
                     recorded in the worker process (``bench_redis_common``). For Conveyor the
                     window is read from the store instead (first claim to last durable ack,
                     Redis ``TIME``), which is the longer of the two. The worker's CPU per job is
                     ``time.process_time()`` over the same window in the worker process.
4. ``latency``       a fresh worker, idle: one probe job at a time (5-20 ms random gap, each
                     waited for before the next); wall clock from just before the producer's
                     enqueue call to the first line of the probe body. For Conveyor the store's
                     own enqueue-to-claim time (``attempted_at - created_at``) is noted too.

Per-job logging is off everywhere. Slow systems (RQ, arq-default) drain ``--slow-jobs`` jobs
(default N/4) of their backlog so a full run stays near 10 minutes on 2 cores; the output
says so. Results: a table of medians, Conveyor/peer ratios, caveats, and
``benchmarks/results/redis-latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bench_redis_common import PROBE_KEY  # noqa: E402
from sqlite_bench import GAP_S, Proc, fmt, percentile, wait_until  # noqa: E402

BATCH = 1000
MARKER = "conveyor-redis-bench:owner"
SYSTEMS = ("conveyor", "conveyor-prefetch", "celery", "rq", "dramatiq", "huey", "arq", "arq-default", "saq")
DBS = {"celery": 10, "rq": 11, "dramatiq": 12, "huey": 13, "arq": 14, "arq-default": 14, "conveyor": 15, "saq": 9, "conveyor-prefetch": 8}
SLOW = {"rq", "arq-default"}  # drain --slow-jobs of the backlog; arq-default also fewer probes
LATENCY_SLOW_SAMPLES = 60  # arq-default idles 0.5 s between polls: 300 probes would take ~2.5 min

CAVEATS = {
    "conveyor": "lease = visibility timeout (claim sets running + lease token + expiry from Redis TIME); "
    "ack/retry/heartbeat fenced by the token; a killed worker's jobs come back when the lease expires; "
    "the job hash (state, timestamps, result) is kept after success. Every transition is one Lua script.",
    "conveyor-prefetch": "as conveyor, with Worker(prefetch=concurrency): up to that many more jobs claimed and held, "
    "leased and heartbeated, until a slot frees (opt-in; held jobs are this worker's and wait behind running ones).",
    "celery": "acks_late=False (default): the message is acked when the worker receives it, so a worker "
    "crash mid-task loses that task; prefetched-but-unstarted messages come back after the kombu "
    "visibility timeout (1 h). No result backend here (ignore_result).",
    "rq": "no lease: the job is popped off the queue; a worker killed mid-job leaves it 'abandoned' and "
    "it is moved to the failed registry, not re-run. SimpleWorker runs one job at a time (RQ's "
    "concurrency is more processes); the forking Worker is ~5x slower still. Job hash kept (result_ttl 500 s).",
    "dramatiq": "message moved to the consumer's ack set on fetch, acked after it runs; a dead worker's "
    "unacked messages are requeued after its heartbeat goes stale (at-least-once, no fencing token: a "
    "zombie's late ack is not refused). Prefetches messages; idle consumers poll with backoff.",
    "huey": "no lease: the task is popped (BRPOP) and a consumer killed mid-task loses it; a None "
    "result stores nothing.",
    "arq": "job stays in the queue sorted set while an in-progress key with a TTL guards it, so a crashed "
    "worker's job runs again later (no fencing); results kept 1 h. Tasks are async def (arq runs no sync "
    "tasks). The worker POLLS the queue every poll_delay (0.05 s here), so one-at-a-time probes fall into "
    "step with its polls: latency is about poll_delay minus the 5-20 ms gap, not half of poll_delay.",
    "saq": "job moved from the queued list to the active list on dequeue (BLMOVE: no polling); a sweep "
    "re-queues or fails active jobs whose worker stopped heartbeating (no fencing token); job kept for "
    "ttl 600 s after it finishes. No batch enqueue. Tasks are async def.",
    "arq-default": "arq with its default poll_delay=0.5 s: about 200 jobs/s draining and ~0.5 s idle latency "
    "(see arq); drained on its own smaller backlog, 60 latency probes.",
}


# -- results ----------------------------------------------------------------------------------
@dataclass
class Result:
    system: str
    scenario: str  # "enqueue", "enqueue_many", "drain", "latency"
    jobs: int
    seconds: float | None = None
    jobs_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    cpu_ms_per_job: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    samples_ms: list[float] = field(default_factory=list, repr=False)

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("samples_ms")
        return d


def throughput(system: str, scenario: str, jobs: int, seconds: float, **kw: Any) -> Result:
    return Result(system, scenario, jobs, seconds, jobs / seconds if seconds > 0 else None, **kw)


def na(system: str, scenario: str, why: str) -> Result:
    return Result(system, scenario, 0, note=f"n/a: {why}")


def latency_result(system: str, samples_s: list[float], seconds: float, **kw: Any) -> Result:
    ms = [s * 1000 for s in samples_s]
    return Result(system, "latency", len(ms), seconds, None, percentile(ms, 50), percentile(ms, 99),
                  samples_ms=ms, **kw)


# -- the systems ------------------------------------------------------------------------------
class System:
    """One job system on its own Redis database: producer calls, queue length, worker command."""

    name: str
    has_bulk = False
    bulk_na = ""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.db = DBS[self.name]
        self.url = f"redis://{args.redis}/{self.db}"
        self.r = redis.Redis.from_url(self.url, socket_timeout=35, socket_connect_timeout=2)

    # producer
    def enqueue_n(self, start: int, n: int) -> None:
        raise NotImplementedError

    def enqueue_bulk(self, start: int, n: int) -> None:
        raise NotImplementedError

    def send_probe(self, token: str) -> float:
        """Enqueue the probe job ``token``; returns the wall-clock time just before the call."""
        raise NotImplementedError

    def backlog(self) -> int:
        raise NotImplementedError

    def warm(self) -> None:
        """Open the producer's connection without writing a job."""
        self.r.ping()

    # worker
    def worker_argv(self) -> list[str]:
        raise NotImplementedError

    def worker_env(self) -> dict[str, str]:
        return {"BENCH_REDIS_URL": self.url}

    # housekeeping
    def reset(self) -> None:
        """Empty this system's database (it is ours alone: see claim_databases)."""
        self.r.flushdb()
        self.r.set(MARKER, "1")

    def after_drain(self, n: int, clock: dict[str, Any], note: str) -> Result:
        window = clock["last_end"] - clock["first_start"]
        return throughput(self.name, "drain", n, window, cpu_ms_per_job=cpu_per_job(clock, n), note=note,
                          extra={"window_start": clock["first_start"], "window_end": clock["last_end"]})

    def close(self) -> None:
        self.r.close()


def cpu_per_job(clock: dict[str, Any], n: int) -> float | None:
    if clock.get("cpu_first") is None or clock.get("cpu_last") is None:
        return None
    return (clock["cpu_last"] - clock["cpu_first"]) / n * 1000


class ConveyorSystem(System):
    name = "conveyor"
    has_bulk = True

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.app: Any = None
        self.ids: list[int] = []
        self.probe_ids: list[int] = []
        self.new_app()

    def new_app(self) -> None:
        from bench_redis_conveyor import make_app

        if self.app is not None:
            self.app.close()
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}"
        self.conveyor_url = f"{self.url}?prefix={self.prefix}"
        self.app, self.noop, self.probe = make_app(self.conveyor_url)
        self.p = "{" + self.prefix + "}"

    def reset(self) -> None:
        super().reset()
        self.new_app()

    def enqueue_n(self, start: int, n: int) -> None:
        noop = self.noop
        for i in range(start, start + n):
            noop.enqueue(i)

    def enqueue_bulk(self, start: int, n: int) -> None:
        ids = self.ids
        for s in range(start, start + n, BATCH):
            ids += [j.id for j in self.noop.enqueue_many([(i,) for i in range(s, min(start + n, s + BATCH))])]

    def warm(self) -> None:
        self.app.backend.now()

    def send_probe(self, token: str) -> float:
        sent = time.time()
        self.probe_ids.append(self.probe.enqueue(token).id)
        return sent

    def backlog(self) -> int:
        qs = {q.queue: q for q in self.app.backend.stats().queues}
        return qs["default"].available if "default" in qs else 0

    def succeeded(self) -> int:
        qs = {q.queue: q for q in self.app.backend.stats().queues}
        return qs["default"].succeeded if "default" in qs else 0

    def worker_argv(self) -> list[str]:
        return [sys.executable, "-m", "bench_redis_conveyor", self.conveyor_url,
                "--concurrency", str(self.args.concurrency)]

    def job_fields(self, ids: list[int], fields: list[str]) -> list[list[Any]]:
        out: list[list[Any]] = []
        for s in range(0, len(ids), 5000):
            pipe = self.r.pipeline(transaction=False)
            for i in ids[s:s + 5000]:
                pipe.hmget(f"{self.p}:job:{i}", fields)
            out += pipe.execute()
        return out

    def after_drain(self, n: int, clock: dict[str, Any], note: str) -> Result:
        # The no-op bodies have all returned; wait for the last acks, then read the store's clock.
        wait_until("the last Conveyor acks", lambda: self.succeeded() >= n, 30)
        rows = self.job_fields(self.ids, ["attempted_at", "finished_at", "attempt", "state"])
        assert all(r[3] == b"succeeded" for r in rows), "a drained job is not succeeded"
        first = min(float(r[0]) for r in rows)
        last = max(float(r[1]) for r in rows)
        reruns = sum(int(r[2]) > 1 for r in rows)
        body = clock["last_end"] - clock["first_start"]
        note += f"; window from the store (first claim to last ack); body clock {n / body:,.0f} jobs/s"
        if reruns:
            note += f"; {reruns} jobs ran more than once"
        return throughput(self.name, "drain", n, last - first, cpu_ms_per_job=cpu_per_job(clock, n),
                          note=note, extra={"body_clock_jobs_per_s": n / body,
                                            "window_start": first, "window_end": last})

    def store_latency_ms(self) -> list[float]:
        rows = self.job_fields(self.probe_ids, ["created_at", "attempted_at"])
        return [(float(a) - float(c)) * 1000 for c, a in rows]

    def close(self) -> None:
        self.app.close()
        super().close()


class ConveyorPrefetchSystem(ConveyorSystem):
    """Conveyor with ``--prefetch`` = concurrency: claims overlap running jobs (opt-in)."""

    name = "conveyor-prefetch"

    def worker_argv(self) -> list[str]:
        return [*super().worker_argv(), "--prefetch", str(self.args.concurrency)]


class CelerySystem(System):
    name = "celery"
    bulk_na = "no batch write: group/chunks publish one message per task"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        os.environ["BENCH_REDIS_URL"] = self.url  # read by bench_redis_celery at import
        import bench_redis_celery

        self.mod = bench_redis_celery

    def reset(self) -> None:
        # FLUSHDB would also drop kombu's exchange bindings (_kombu.binding.*), which this
        # producer declared once and will not declare again: keep those, delete the rest.
        keep = {k for k in self.r.scan_iter(match=b"_kombu.binding.*")}
        for k in self.r.scan_iter(count=1000):
            if k not in keep:
                self.r.delete(k)
        self.r.set(MARKER, "1")

    def enqueue_n(self, start: int, n: int) -> None:
        delay = self.mod.noop.delay
        for i in range(start, start + n):
            delay(i)

    def send_probe(self, token: str) -> float:
        sent = time.time()
        self.mod.probe.delay(token)
        return sent

    def backlog(self) -> int:
        return int(self.r.llen("celery"))

    def worker_argv(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "bench_redis_celery", "worker", "-P", "threads",
                "-c", str(self.args.concurrency), "-l", "WARNING", "-Q", "celery"]


class RQSystem(System):
    name = "rq"
    has_bulk = True

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        import bench_redis_rq
        from rq import Queue

        self.mod = bench_redis_rq
        self.Queue = Queue
        self.conn = redis.Redis.from_url(self.url)
        self.q = Queue("default", connection=self.conn)

    def enqueue_n(self, start: int, n: int) -> None:
        enqueue, fn = self.q.enqueue, self.mod.noop
        for i in range(start, start + n):
            enqueue(fn, i)

    def enqueue_bulk(self, start: int, n: int) -> None:
        prep, fn = self.Queue.prepare_data, self.mod.noop
        for s in range(start, start + n, BATCH):
            self.q.enqueue_many([prep(fn, (i,)) for i in range(s, min(start + n, s + BATCH))])

    def send_probe(self, token: str) -> float:
        sent = time.time()
        self.q.enqueue(self.mod.probe, token)
        return sent

    def backlog(self) -> int:
        return int(self.q.count)

    def warm(self) -> None:
        self.conn.ping()

    def worker_argv(self) -> list[str]:
        return [sys.executable, "-m", "bench_redis_rq", self.url]


class DramatiqSystem(System):
    name = "dramatiq"
    bulk_na = "no batch enqueue (group() sends one message at a time)"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        os.environ["BENCH_REDIS_URL"] = self.url
        import bench_redis_dramatiq

        self.mod = bench_redis_dramatiq

    def enqueue_n(self, start: int, n: int) -> None:
        send = self.mod.noop.send
        for i in range(start, start + n):
            send(i)

    def send_probe(self, token: str) -> float:
        sent = time.time()
        self.mod.probe.send(token)
        return sent

    def backlog(self) -> int:
        return int(self.r.llen("dramatiq:default"))

    def worker_argv(self) -> list[str]:
        return [sys.executable, "-m", "dramatiq", "bench_redis_dramatiq", "-p", "1", "-t",
                str(self.args.concurrency), "-Q", "default"]


class HueySystem(System):
    name = "huey"
    bulk_na = "no batch enqueue"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        os.environ["BENCH_REDIS_URL"] = self.url
        import bench_redis_huey

        self.mod = bench_redis_huey

    def enqueue_n(self, start: int, n: int) -> None:
        noop = self.mod.noop
        for i in range(start, start + n):
            noop(i)

    def send_probe(self, token: str) -> float:
        sent = time.time()
        self.mod.probe(token)
        return sent

    def backlog(self) -> int:
        return int(self.mod.huey.pending_count())

    def worker_argv(self) -> list[str]:
        return [sys.executable, "-m", "huey.bin.huey_consumer", "bench_redis_huey.huey", "-w",
                str(self.args.concurrency), "-k", "thread", "-q"]


class ArqSystem(System):
    name = "arq"
    bulk_na = "no batch enqueue"
    poll_delay = 0.05

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        from arq.connections import create_pool
        from bench_redis_arq import redis_settings

        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(create_pool(redis_settings(self.url)))

    def enqueue_n(self, start: int, n: int) -> None:
        async def go() -> None:
            enqueue = self.pool.enqueue_job
            for i in range(start, start + n):
                await enqueue("noop", i)

        self.loop.run_until_complete(go())

    def send_probe(self, token: str) -> float:
        async def go() -> float:
            sent = time.time()
            await self.pool.enqueue_job("probe", token)
            return sent

        return self.loop.run_until_complete(go())

    def backlog(self) -> int:
        return int(self.r.zcard("arq:queue"))

    def worker_argv(self) -> list[str]:
        return [sys.executable, "-m", "bench_redis_arq", self.url, "--max-jobs", str(self.args.concurrency),
                "--poll-delay", str(self.poll_delay)]

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()
        super().close()


class ArqDefaultSystem(ArqSystem):
    """arq with its default poll_delay; drain and latency only (its enqueue is arq's)."""

    name = "arq-default"
    poll_delay = 0.5


class SaqSystem(System):
    name = "saq"
    bulk_na = "no batch enqueue (Queue.batch() only aborts the jobs of a failed block)"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        from bench_redis_saq import make_queue

        self.loop = asyncio.new_event_loop()
        self.queue = make_queue(self.url)
        self.loop.run_until_complete(self.queue.connect())

    def enqueue_n(self, start: int, n: int) -> None:
        async def go() -> None:
            enqueue = self.queue.enqueue
            for i in range(start, start + n):
                await enqueue("noop", i=i)

        self.loop.run_until_complete(go())

    def send_probe(self, token: str) -> float:
        async def go() -> float:
            sent = time.time()
            await self.queue.enqueue("probe", token=token)
            return sent

        return self.loop.run_until_complete(go())

    def backlog(self) -> int:
        return int(self.r.llen("saq:default:queued"))

    def worker_argv(self) -> list[str]:
        return [sys.executable, "-m", "bench_redis_saq", self.url, "--concurrency", str(self.args.concurrency)]

    def close(self) -> None:
        self.loop.run_until_complete(self.queue.disconnect())
        self.loop.close()
        super().close()


SYSTEM_CLASSES: dict[str, type[System]] = {
    "conveyor": ConveyorSystem, "conveyor-prefetch": ConveyorPrefetchSystem, "celery": CelerySystem, "rq": RQSystem, "dramatiq": DramatiqSystem,
    "huey": HueySystem, "arq": ArqSystem, "arq-default": ArqDefaultSystem, "saq": SaqSystem,
}


def claim_databases(args: argparse.Namespace, names: list[str]) -> None:
    """Refuse databases that hold keys this benchmark did not write; mark the rest as ours."""
    for db in sorted({DBS[n] for n in names}):
        if db == 0:
            raise SystemExit("refusing to use Redis database 0")
        r = redis.Redis.from_url(f"redis://{args.redis}/{db}", socket_connect_timeout=2)
        try:
            size = r.dbsize()
            if size and not r.exists(MARKER):
                raise SystemExit(
                    f"Redis database {db} on {args.redis} holds {size} keys this benchmark did not write; "
                    "it FLUSHes its databases (10-15), so empty that one first or use another Redis (--redis)."
                )
            r.flushdb()
            r.set(MARKER, "1")
        finally:
            r.close()


def release_databases(args: argparse.Namespace, names: list[str]) -> None:
    for db in sorted({DBS[n] for n in names}):
        r = redis.Redis.from_url(f"redis://{args.redis}/{db}", socket_connect_timeout=2)
        try:
            if r.exists(MARKER):
                r.flushdb()
        finally:
            r.close()


# -- scenarios --------------------------------------------------------------------------------
@contextlib.contextmanager
def running(proc: Proc) -> Iterator[Proc]:
    """Stop ``proc`` with SIGTERM on the way out; show its log if it did not exit cleanly."""
    try:
        yield proc
    finally:
        rc = proc.stop(signal.SIGTERM)
        if rc not in (0, -signal.SIGTERM):
            try:
                tail = "\n".join(proc.log_path.read_text().splitlines()[-30:])
            except OSError:
                tail = "(no log)"
            print(f"  ! {proc.name} exited with {rc}; last lines of its log:\n{tail}", file=sys.stderr)


def scenario_enqueue(s: System, args: argparse.Namespace) -> Result:
    n = args.jobs
    s.reset()
    s.enqueue_n(0, 1)  # warm-up: connections, scripts, imports; it stays in the queue
    t0 = time.perf_counter()
    s.enqueue_n(1, n)
    dt = time.perf_counter() - t0
    got = s.backlog()
    assert got == n + 1, f"{s.name}: {got} jobs queued, expected {n + 1}"
    return throughput(s.name, "enqueue", n, dt)


def scenario_bulk(s: System, args: argparse.Namespace) -> Result:
    n = args.jobs
    s.reset()
    s.warm()
    if isinstance(s, ConveyorSystem):
        s.ids = []
    t0 = time.perf_counter()
    s.enqueue_bulk(0, n)
    dt = time.perf_counter() - t0
    got = s.backlog()
    assert got == n, f"{s.name}: {got} jobs queued, expected {n}"
    return throughput(s.name, "enqueue_many", n, dt, note=f"batches of {BATCH}")


def scenario_drain(s: System, args: argparse.Namespace, tmp: Path) -> Result:
    if isinstance(s, ArqDefaultSystem):  # its own, smaller backlog (arq's was drained by arq)
        s.reset()
        s.enqueue_n(0, args.slow_jobs)
    backlog = s.backlog()
    n = min(backlog, args.slow_jobs) if s.name in SLOW else backlog
    done = tmp / f"{s.name}-drain.json"
    done.unlink(missing_ok=True)
    env = {**s.worker_env(), "BENCH_EXPECT": str(n), "BENCH_DONE": str(done)}
    cpu0 = redis_cpu(s.r)
    worker = Proc(f"{s.name}-drain", s.worker_argv(), tmp, env=env)
    with running(worker):
        wait_until(f"{n} {s.name} jobs to run", done.exists, max(120.0, n / 40), (worker,))
        wall = time.perf_counter() - worker.started
        redis_ms = (redis_cpu(s.r) - cpu0) / n * 1000
        clock = json.loads(done.read_text())
        note = f"{wall:.1f}s incl. process start; redis-server CPU {redis_ms:.3f} ms/job"
        if n < backlog:
            note = f"first {n} of a {backlog}-job backlog (slow: --slow-jobs); " + note
        result = s.after_drain(n, clock, note)
        result.extra["redis_cpu_ms_per_job"] = redis_ms
    s.reset()
    return result


def redis_cpu(r: redis.Redis) -> float:
    """CPU seconds the whole redis-server has used (other clients of this Redis count too)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def scenario_latency(s: System, args: argparse.Namespace, tmp: Path, rng: random.Random, tag: str) -> Result:
    samples = LATENCY_SLOW_SAMPLES if s.name == "arq-default" else args.latency_samples
    samples = min(samples, args.latency_samples)
    s.reset()
    if isinstance(s, ConveyorSystem):
        s.probe_ids = []
    worker = Proc(f"{s.name}-latency", s.worker_argv(), tmp, env=s.worker_env())
    out: list[float] = []
    with running(worker):

        def one(token: str, timeout: float) -> float:
            sent = s.send_probe(token)
            deadline = time.monotonic() + timeout
            while True:
                worker.check_alive()
                got = s.r.blpop([PROBE_KEY], timeout=1)
                if got is not None:
                    seen, at = got[1].decode().split()
                    if seen == token:
                        return float(at) - sent
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{s.name}: probe {token} did not run within {timeout:g}s")

        one(f"{tag}-warmup", 90)  # waits for the worker to be up
        time.sleep(0.3)
        t0 = time.perf_counter()
        for i in range(samples):
            time.sleep(rng.uniform(*GAP_S))
            out.append(one(f"{tag}-{i}", 30))
        dt = time.perf_counter() - t0
    note = "wall clock, enqueue call to probe body start"
    extra: dict[str, Any] = {}
    if isinstance(s, ConveyorSystem):
        store = s.store_latency_ms()[1:]  # without the warm-up
        extra = {"store_p50_ms": percentile(store, 50), "store_p99_ms": percentile(store, 99)}
        note += f"; store clock enqueue-to-claim p50 {extra['store_p50_ms']:.2f} / p99 {extra['store_p99_ms']:.2f} ms"
    if samples < args.latency_samples:
        note += f"; {samples} samples per round (it polls every 0.5 s)"
    s.reset()
    return latency_result(s.name, out, dt, note=note, extra=extra)


# -- reporting --------------------------------------------------------------------------------
HEADER = (f"{'system':<12} {'scenario':<13} {'jobs':>6} {'seconds':>8} {'jobs/s':>8} {'cpu ms/job':>10} "
          f"{'p50 ms':>7} {'p99 ms':>7}  note")


def row(r: Result) -> str:
    return (f"{r.system:<12} {r.scenario:<13} {r.jobs:>6} {fmt(r.seconds, '.2f'):>8} "
            f"{fmt(r.jobs_per_s, ',.0f'):>8} {fmt(r.cpu_ms_per_job, '.3f'):>10} {fmt(r.p50_ms, '.2f'):>7} "
            f"{fmt(r.p99_ms, '.2f'):>7}  {r.note}")


def report(r: Result) -> None:
    print("  " + row(r), flush=True)


def summarize(rounds: list[list[Result]]) -> list[Result]:
    """One result per (system, scenario): medians over rounds; latency samples pooled."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for rs in rounds:
        for r in rs:
            groups.setdefault((r.system, r.scenario), []).append(r)
    out = []
    for (system, scenario), g in groups.items():
        first = g[0]
        if scenario == "latency":
            pooled = [x / 1000 for r in g for x in r.samples_ms]
            res = latency_result(system, pooled, sum(r.seconds or 0 for r in g), note=first.note,
                                 extra=first.extra)
        elif first.seconds is None:
            res = first
        else:
            secs = statistics.median(r.seconds for r in g if r.seconds is not None)
            nearest = min(g, key=lambda r: abs((r.seconds or 0) - secs))
            cpus = [r.cpu_ms_per_job for r in g if r.cpu_ms_per_job is not None]
            res = throughput(system, scenario, first.jobs, secs, note=nearest.note, extra=nearest.extra,
                             cpu_ms_per_job=statistics.median(cpus) if cpus else None)
            if len(g) > 1:
                res.note += f" (median of {len(g)})"
        out.append(res)
    order = {n: i for i, n in enumerate(SYSTEMS)}
    scen = {n: i for i, n in enumerate(("enqueue", "enqueue_many", "drain", "latency"))}
    return sorted(out, key=lambda r: (order[r.system], scen[r.scenario]))


METRICS = (
    ("enqueue", "jobs_per_s", "enqueue one by one, jobs/s", ",.0f"),
    ("enqueue_many", "jobs_per_s", "bulk enqueue (1000/call), jobs/s", ",.0f"),
    ("drain", "jobs_per_s", "drain, 1 worker process, jobs/s", ",.0f"),
    ("drain", "cpu_ms_per_job", "worker CPU per job (drain), ms", ".3f"),
    ("latency", "p50_ms", "idle latency p50, ms", ".2f"),
    ("latency", "p99_ms", "idle latency p99, ms", ".2f"),
)


def ratio_table(summary: list[Result]) -> list[dict[str, Any]]:
    """Conveyor / peer per metric. jobs/s: > 1 means Conveyor is faster; ms: < 1 means Conveyor is faster."""
    by = {(r.system, r.scenario): r for r in summary}
    out = []
    for scenario, attr, label, _ in METRICS:
        mine = by.get(("conveyor", scenario))
        a = getattr(mine, attr) if mine else None
        for peer in SYSTEMS[1:]:
            theirs = by.get((peer, scenario))
            if theirs is None:
                continue
            b = getattr(theirs, attr)
            out.append({"metric": label, "scenario": scenario, "field": attr, "peer": peer,
                        "ratio": (a / b) if a is not None and b else None})
    return out


def print_tables(summary: list[Result], ratios: list[dict[str, Any]]) -> None:
    systems = [s for s in SYSTEMS if any(r.system == s for r in summary)]
    by = {(r.system, r.scenario): r for r in summary}
    print("\n| metric (median) | " + " | ".join(systems) + " |")
    print("|---|" + "---:|" * len(systems))
    for scenario, attr, label, spec in METRICS:
        cells = []
        for s in systems:
            r = by.get((s, scenario))
            v = getattr(r, attr) if r else None
            cells.append("n/a" if r is not None and r.seconds is None else fmt(v, spec))
        print(f"| {label} | " + " | ".join(cells) + " |")
    peers = [s for s in systems if s != "conveyor"]
    if "conveyor" not in systems or not peers:
        return
    print("\nConveyor / peer (jobs/s: above 1 = Conveyor faster; CPU and latency: below 1 = Conveyor better)\n")
    print("| Conveyor / peer | " + " | ".join(peers) + " |")
    print("|---|" + "---:|" * len(peers))
    idx = {(e["metric"], e["peer"]): e["ratio"] for e in ratios}
    for _, _, label, _ in METRICS:
        cells = []
        for p in peers:
            if (label, p) not in idx:
                cells.append("-")
            else:
                v = idx[(label, p)]
                cells.append("n/a" if v is None else f"x{v:.2f}")
        print(f"| {label} | " + " | ".join(cells) + " |")


def environment(args: argparse.Namespace) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
    }
    for pkg in ("conveyor", "redis", "hiredis", "celery", "kombu", "rq", "dramatiq", "huey", "arq", "saq"):
        try:
            env[pkg] = version(pkg)
        except PackageNotFoundError:
            env[pkg] = None
    r = redis.Redis.from_url(f"redis://{args.redis}/0", socket_connect_timeout=2)
    try:
        info = r.info("server")
        env["redis_server"] = info.get("redis_version")
        env["redis_appendonly"] = r.info("persistence").get("aof_enabled")
        with contextlib.suppress(redis.ResponseError):
            env["redis_save"] = r.config_get("save").get("save")
    finally:
        r.close()
    return env


# -- main -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Conveyor on Redis against Celery, RQ, Dramatiq, Huey and arq.")
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per throughput scenario (default 20000)")
    parser.add_argument("--slow-jobs", type=int, default=None,
                        help="jobs the slow systems (rq, arq-default) drain (default: --jobs / 4)")
    parser.add_argument("--concurrency", type=int, default=8, help="worker slots (default 8)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every scenario; report medians")
    parser.add_argument("--latency-samples", type=int, default=300, help="probes timed one at a time (default 300)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    parser.add_argument("--redis", default="127.0.0.1:6379", help="host:port of the Redis (default 127.0.0.1:6379)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the random gaps")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "redis-latest.json")
    args = parser.parse_args(argv)
    if args.slow_jobs is None:
        args.slow_jobs = max(1, args.jobs // 4)
    if min(args.jobs, args.slow_jobs, args.concurrency, args.rounds, args.latency_samples) < 1:
        parser.error("--jobs, --slow-jobs, --concurrency, --rounds and --latency-samples must be >= 1")
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = [n for n in names if n not in SYSTEM_CLASSES]
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {','.join(SYSTEMS)}")
    names = [n for n in SYSTEMS if n in names]
    missing = []
    for n, mod in (("celery", "celery"), ("rq", "rq"), ("dramatiq", "dramatiq"), ("huey", "huey"),
                   ("arq", "arq"), ("arq-default", "arq"), ("saq", "saq")):
        if n in names:
            try:
                __import__(mod)
            except ImportError:
                missing.append(mod)
    if missing:
        parser.error(f"missing peers {sorted(set(missing))}: "
                     ".venv/bin/pip install celery rq 'dramatiq[redis]' huey arq saq")

    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    rng = random.Random(args.seed)
    started = time.perf_counter()
    print(f"Redis benchmark on {args.redis}: {args.jobs} jobs (slow systems drain {args.slow_jobs}), "
          f"concurrency {args.concurrency}, {args.rounds} round(s), {args.latency_samples} latency samples; "
          f"systems: {', '.join(names)}", flush=True)
    claim_databases(args, names)
    env = environment(args)
    if not env.get("redis_appendonly") and env.get("redis_save") == "":
        print("  note: this Redis has no persistence (appendonly no, save \"\"): for every system, "
              "'durable' here means in Redis's memory", flush=True)
    systems = {n: SYSTEM_CLASSES[n](args) for n in names}
    all_rounds: list[list[Result]] = []
    try:
        for rnd in range(args.rounds):
            k = rnd % len(names)
            order = names[k:] + names[:k]
            if "arq-default" in order and "arq" in order:  # they share a database: arq first
                order.remove("arq-default")
                order.insert(order.index("arq") + 1, "arq-default")
            print(f"\nround {rnd + 1}/{args.rounds}: {', '.join(order)}", flush=True)
            print("  " + HEADER, flush=True)
            results: list[Result] = []
            with tempfile.TemporaryDirectory(prefix="conveyor-redis-bench-") as d:
                tmp = Path(d)
                for name in order:  # enqueue one by one; the backlog of systems with no batch API
                    if name != "arq-default":
                        results.append(scenario_enqueue(systems[name], args))
                        report(results[-1])
                for name in order:
                    s = systems[name]
                    if name == "arq-default":
                        continue
                    results.append(scenario_bulk(s, args) if s.has_bulk else na(name, "enqueue_many", s.bulk_na))
                    report(results[-1])
                for name in order:
                    results.append(scenario_drain(systems[name], args, tmp))
                    report(results[-1])
                for name in order:
                    results.append(scenario_latency(systems[name], args, tmp, rng, f"r{rnd}"))
                    report(results[-1])
            all_rounds.append(results)
    finally:
        for s in systems.values():
            with contextlib.suppress(Exception):
                s.close()
        release_databases(args, names)

    summary = summarize(all_rounds)
    ratios = ratio_table(summary)
    elapsed = time.perf_counter() - started
    env["loadavg_at_end"] = os.getloadavg()
    print(f"\nSummary ({args.jobs} jobs; rq and arq-default drain {args.slow_jobs}; concurrency "
          f"{args.concurrency}; {args.rounds} round(s); {elapsed:.0f}s total)")
    print(HEADER)
    for r in summary:
        print(row(r))
    print_tables(summary, ratios)
    print("\nCaveats (what each system guarantees for the speed it shows):")
    for n in names:
        print(f"  - {n}: {CAVEATS[n]}")
    print("  - All systems share one Redis and one 2-core machine with the driver; the driver's own "
          "polling and BLPOP cost a little CPU. Drain and latency workers are fresh processes. Load average "
          f"at start {env['loadavg_at_start'][0]:.2f}, at end {env['loadavg_at_end'][0]:.2f} "
          "(anything else running skews the numbers).")

    args.output.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "redis_bench",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": {"jobs": args.jobs, "slow_jobs": args.slow_jobs, "slow_systems": sorted(SLOW),
                   "concurrency": args.concurrency, "rounds": args.rounds,
                   "latency_samples": args.latency_samples, "systems": names, "batch": BATCH,
                   "seed": args.seed, "databases": {n: DBS[n] for n in names}},
        "environment": env,
        "elapsed_s": elapsed,
        "results": [r.public() for r in summary],
        "ratios": ratios,
        "caveats": {n: CAVEATS[n] for n in names},
        "rounds": [[r.public() for r in rs] for rs in all_rounds],
    }
    tmp_out = args.output.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(doc, indent=2) + "\n")
    tmp_out.replace(args.output)
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
