"""The fault harness: real worker processes, a nemesis that kills or pauses them, a history of
what the producer enqueued and what the handlers did, and a checker in the style of Jepsen's
``total-queue``.

* **History.** The producer records every enqueue as ``invoke`` then ``ok`` (with the job id),
  ``fail`` (a definite refusal: nothing was written) or ``info`` (the outcome is unknown: the
  store went away mid-call). The handler (faultapp.py) appends ``(n, job, attempt, pid, t)``
  to an ``O_APPEND`` file, fsynced, before it returns: that log survives a SIGKILL.
* **Nemesis.** A thread that, every U(a, b) seconds, SIGKILLs a random started worker and
  starts a new one in its place (or SIGSTOPs it for a while, then SIGCONTs it).
* **Drain.** After the faults stop, wait until no job is waiting or running.
* **Checker.** ``lost`` = enqueues acknowledged ``ok`` whose job is missing, unfinished, or
  succeeded without its side effect; ``unexpected`` = side effects of jobs nobody tried to
  enqueue; ``duplicated`` = side effects beyond the first, per job; ``recovered`` = ``info`` or
  ``fail`` enqueues whose job exists after all. Plus checks of the final store: nothing left
  running, no ``attempts > max_attempts``, no attempt that ran twice (unless the store recorded
  it as a stall: its lease ran out before the job was reported started), no finished job holding
  a lease, and every result written by the job's last attempt (a zombie's late ack refused).

Every random choice comes from one seed, printed with the report; ``CONVEYOR_FAULT_SEED=<seed>``
replays the same choices (process timing is not replayable, the schedule of faults is).
``CONVEYOR_FAULT_PROFILE=full`` selects the big sizes (``make faults``);
``CONVEYOR_FAULT_REPORT=<file>`` appends every report to ``<file>`` as one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

TESTS = Path(__file__).resolve().parent.parent
for _rig in ("process", "postgres", "redis"):  # the existing rigs: processrig, pgrig, redisrig
    if str(TESTS / _rig) not in sys.path:
        sys.path.insert(0, str(TESTS / _rig))

from processrig import Proc, proc_stat, session_members, wait_until  # noqa: E402

from conveyor import Conveyor, ConveyorError, Job, JobState  # noqa: E402
from conveyor.backends.base import Backend  # noqa: E402
from conveyor.errors import StoreError  # noqa: E402

HERE = Path(__file__).resolve().parent
T = TypeVar("T")

# -- profile and seeds ---------------------------------------------------------------------------
PROFILE = os.environ.get("CONVEYOR_FAULT_PROFILE", "ci")
FULL = PROFILE == "full"


def pick(ci: T, full: T) -> T:
    """The CI size or, with ``CONVEYOR_FAULT_PROFILE=full``, the full one."""
    return full if FULL else ci


def make_rng(name: str) -> tuple[int, random.Random]:
    """A seeded RNG for one test; the seed is printed so a failing run can be replayed."""
    raw = os.environ.get("CONVEYOR_FAULT_SEED")
    seed = int(raw) if raw else random.SystemRandom().randrange(2**32)
    print(f"\n[{name}] seed {seed} (replay: CONVEYOR_FAULT_SEED={seed}), profile {PROFILE}")
    return seed, random.Random(seed)


def client_app(url: str) -> Conveyor:
    """The test's own handle on the store, with faultapp's tasks (so enqueue validates)."""
    import faultapp

    app = Conveyor(url)
    for t in faultapp.app.tasks.values():
        app.task(name=t.name, queue=t.queue, max_attempts=t.max_attempts, timeout=t.timeout,
                 retry=t.retry_policy)(t.fn)
    return app


# -- the producer's history ----------------------------------------------------------------------
@dataclass
class Op:
    n: int
    type: str  # invoke | ok | fail | info
    t: float
    job_id: int | None = None
    error: str | None = None


class History:
    """Every enqueue: ``invoke``, then ``ok``, ``fail`` or ``info``. Thread-safe."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._lock = threading.Lock()

    def _add(self, op: Op) -> None:
        with self._lock:
            self.ops.append(op)

    def invoke(self, n: int) -> None:
        self._add(Op(n, "invoke", time.time()))

    def ok(self, n: int, job_id: int) -> None:
        self._add(Op(n, "ok", time.time(), job_id=job_id))

    def fail(self, n: int, error: BaseException) -> None:
        self._add(Op(n, "fail", time.time(), error=f"{type(error).__name__}: {error}"[:300]))

    def info(self, n: int, error: BaseException) -> None:
        self._add(Op(n, "info", time.time(), error=f"{type(error).__name__}: {error}"[:300]))

    def by_type(self, kind: str) -> list[Op]:
        with self._lock:
            return [o for o in self.ops if o.type == kind]

    def durations(self) -> dict[int, float]:
        """Seconds from each enqueue's invoke to its outcome."""
        started: dict[int, float] = {}
        took: dict[int, float] = {}
        with self._lock:
            for o in self.ops:
                if o.type == "invoke":
                    started[o.n] = o.t
                elif o.n in started:
                    took[o.n] = o.t - started[o.n]
        return took

    def ok_ids(self) -> dict[int, int]:
        return {o.n: o.job_id for o in self.by_type("ok") if o.job_id is not None}

    def record(self, n: int, call: Callable[[], int]) -> int | None:
        """Run one enqueue ``call`` (returning the job id) and record its outcome.

        A refusal that says nothing was written is ``fail``; any other store error leaves the
        outcome unknown (``info``): the write may have landed before the reply was lost. An
        exception that is not a ConveyorError is recorded as ``info`` and re-raised (a bug).
        """
        self.invoke(n)
        try:
            job_id = call()
        except StoreError as exc:
            text = str(exc)
            if "nothing was" in text:
                self.fail(n, exc)
            else:
                self.info(n, exc)
            return None
        except ConveyorError as exc:
            self.fail(n, exc)
            return None
        except BaseException as exc:
            self.info(n, exc)
            raise
        self.ok(n, job_id)
        return job_id

    def load(self, records: Iterable[dict[str, Any]]) -> None:
        """Add records ``{"type": "invoke"|"ok", "n", "job"}`` written by another process; an
        invoke that never got its ok (the writer was killed in the call) becomes ``info``."""
        done: dict[int, int] = {}
        invoked: list[int] = []
        for r in records:
            if r["type"] == "invoke":
                invoked.append(int(r["n"]))
            elif r["type"] == "ok":
                done[int(r["n"])] = int(r["job"])
        for n in invoked:
            self.invoke(n)
            if n in done:
                self.ok(n, done[n])
            else:
                self.info(n, RuntimeError("the writer was killed before the enqueue returned"))

    def record_many(self, ns: Sequence[int], call: Callable[[], list[int]]) -> list[int]:
        """One batch enqueue (``call`` returns the ids, in order), recorded per job."""
        for n in ns:
            self.invoke(n)
        try:
            ids = call()
        except ConveyorError as exc:
            for n in ns:
                self.fail(n, exc) if "nothing was" in str(exc) else self.info(n, exc)
            raise
        for n, job_id in zip(ns, ids, strict=True):
            self.ok(n, job_id)
        return ids

    def save(self, path: Path) -> None:
        with self._lock, open(path, "w") as f:
            for op in self.ops:
                f.write(json.dumps(asdict(op)) + "\n")


class Producer:
    """Enqueues ``fault.work(n, sleep)`` for each ``(n, sleep)`` at about ``rate`` per second on a
    thread, recording each call in ``history``. Store errors are recorded, never raised."""

    def __init__(self, app: Conveyor, history: History, jobs: Sequence[tuple[int, float]], *,
                 rate: float, task: str = "fault.work", retry_pause: float = 0.05) -> None:
        self.app, self.history, self.jobs, self.rate = app, history, list(jobs), rate
        self.task = app.tasks[task]
        self.retry_pause = retry_pause
        self.errors: list[BaseException] = []  # exceptions that were not ConveyorError: bugs
        self._stop = threading.Event()
        self.done = threading.Event()
        self.started = 0.0
        self.finished = 0.0
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def _run(self) -> None:
        self.started = time.monotonic()
        try:
            for i, (n, sleep) in enumerate(self.jobs):
                if self._stop.is_set():
                    return
                due = self.started + i / self.rate
                if (pause := due - time.monotonic()) > 0:
                    time.sleep(pause)
                try:
                    if self.history.record(n, lambda n=n, sleep=sleep: self.task.enqueue(n, sleep).id) is None:
                        time.sleep(self.retry_pause)  # the store is away: don't spin
                except BaseException as exc:
                    self.errors.append(exc)
        finally:
            self.finished = time.monotonic()
            self.done.set()

    def start(self) -> Producer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the producer is still enqueuing after {timeout}s (an enqueue hung?)"


# -- the side-effect log and the store ---------------------------------------------------------------
def read_effects(path: Path) -> list[dict[str, Any]]:
    """Complete lines of the side-effect log (a line cut by a SIGKILL mid-write is ignored)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n")[:-1]:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def all_jobs(backend: Backend, *, task: str | None = None, queue: str | None = None) -> list[Job]:
    """Every job in the store (newest first), page by page through the Backend interface."""
    jobs: list[Job] = []
    cursor: int | None = None
    while True:
        page = backend.list_jobs(cursor=cursor, limit=500, task=task, queue=queue)
        jobs.extend(page.jobs)
        if page.next_cursor is None:
            return jobs
        cursor = page.next_cursor


def unfinished(backend: Backend) -> int:
    """Jobs waiting (for parents), scheduled, available or running, on every queue."""
    stats = backend.stats(finished=False)
    return sum(q.waiting + q.scheduled + q.available + q.running for q in stats.queues)


def drain(backend: Backend, timeout: float, what: str | Callable[[], str] = "") -> float:
    """Wait until no job is waiting or running; return how long that took."""
    t0 = time.monotonic()
    last = -1

    def done() -> bool:
        nonlocal last
        try:
            last = unfinished(backend)
        except StoreError:
            return False
        return last == 0

    def why() -> str:
        detail = what() if callable(what) else what
        return f"the store to drain ({last} job(s) still waiting or running) {detail}"

    wait_until(done, timeout, why, interval=0.1)
    return time.monotonic() - t0


# -- the checker --------------------------------------------------------------------------------
@dataclass
class Report:
    """What a chaos run did and what the checker found. ``problems()`` lists every violation."""

    name: str
    backend: str
    seed: int
    profile: str = PROFILE
    attempted: int = 0
    ok: int = 0
    failed: int = 0
    info: int = 0
    executions: int = 0
    lost: list[int] = field(default_factory=list)
    unexpected: list[int] = field(default_factory=list)
    duplicated: dict[int, int] = field(default_factory=dict)  # n -> extra executions
    # n -> its executions "a<attempt> pid <pid> @<time.time()>", printed when over the bound
    duplicate_runs: dict[int, list[str]] = field(default_factory=dict)
    recovered: list[int] = field(default_factory=list)
    enqueued_twice: list[int] = field(default_factory=list)
    not_succeeded: dict[int, str] = field(default_factory=dict)  # n -> state, for ok jobs
    running_at_end: int = 0
    unfinished_at_end: int = 0
    attempts_over_max: list[int] = field(default_factory=list)
    same_attempt_twice: list[tuple[int, int]] = field(default_factory=list)
    stale_result: list[int] = field(default_factory=list)
    log_ahead_of_store: list[int] = field(default_factory=list)
    terminal_with_lease: list[int] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    attempts_hist: dict[int, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)  # e.g. {"sigkill": 40}
    duplicate_bound: int | None = None
    figures: dict[str, Any] = field(default_factory=dict)  # timings, throughput, notes

    @property
    def duplicated_total(self) -> int:
        return sum(self.duplicated.values())

    def problems(self, *, expect: JobState | None = JobState.SUCCEEDED) -> list[str]:
        """Every violated invariant, in words (empty when the run is clean)."""
        out = []

        def some(xs: Iterable[Any]) -> str:
            xs = list(xs)
            return f"{len(xs)} {xs[:10]}{' ...' if len(xs) > 10 else ''}"

        if self.lost:
            out.append(f"lost: {some(self.lost)}")
        if self.unexpected:
            out.append(f"unexpected: {some(self.unexpected)}")
        if self.enqueued_twice:
            out.append(f"one enqueue made two jobs: {some(self.enqueued_twice)}")
        if expect is not None and self.not_succeeded:
            out.append(f"ok jobs not {expect}: {some(self.not_succeeded.items())}")
        if self.running_at_end:
            out.append(f"{self.running_at_end} job(s) still running at the end")
        if self.unfinished_at_end:
            out.append(f"{self.unfinished_at_end} job(s) unfinished at the end")
        if self.attempts_over_max:
            out.append(f"attempts > max_attempts: {some(self.attempts_over_max)}")
        if self.same_attempt_twice:
            out.append(f"one attempt ran twice (job, attempt): {some(self.same_attempt_twice)}")
        if self.stale_result:
            out.append(f"result not from the job's last attempt (a stale ack won): {some(self.stale_result)}")
        if self.log_ahead_of_store:
            out.append(f"attempt ran that the store does not count: {some(self.log_ahead_of_store)}")
        if self.terminal_with_lease:
            out.append(f"finished job still holds a lease: {some(self.terminal_with_lease)}")
        if self.duplicate_bound is not None and self.duplicated_total > self.duplicate_bound:
            runs = "; ".join(f"n={n}: {', '.join(r)}" for n, r in list(self.duplicate_runs.items())[:12])
            out.append(f"duplicated {self.duplicated_total} > bound {self.duplicate_bound}; the executions: {runs}")
        return out

    def summary(self) -> str:
        dup_jobs = len(self.duplicated)
        bound = f" (bound {self.duplicate_bound})" if self.duplicate_bound is not None else ""
        faults = ", ".join(f"{k} {v}" for k, v in self.faults.items()) or "none"
        figs = ", ".join(f"{k} {v}" for k, v in self.figures.items())
        return (f"[{self.name} / {self.backend}] seed {self.seed}, profile {self.profile}: "
                f"enqueues {self.attempted} (ok {self.ok}, fail {self.failed}, info {self.info}); "
                f"executions {self.executions}; lost {len(self.lost)}; unexpected {len(self.unexpected)}; "
                f"duplicated {self.duplicated_total} in {dup_jobs} job(s){bound}; "
                f"recovered {len(self.recovered)}; states {self.states}; attempts {self.attempts_hist}; "
                f"faults: {faults}; {figs}")

    def emit(self) -> None:
        """Print the report and append it to ``$CONVEYOR_FAULT_REPORT`` if set."""
        print("\n" + self.summary())
        path = os.environ.get("CONVEYOR_FAULT_REPORT")
        if path:
            rec = asdict(self)
            rec.update(lost=len(self.lost), unexpected=len(self.unexpected), recovered=len(self.recovered),
                       duplicated=self.duplicated_total, duplicated_jobs=len(self.duplicated),
                       problems=self.problems(expect=None), at=time.strftime("%Y-%m-%d %H:%M:%S"))
            for k in ("not_succeeded", "attempts_over_max", "same_attempt_twice", "stale_result",
                      "log_ahead_of_store", "terminal_with_lease", "enqueued_twice"):
                rec[k] = len(rec[k])
            with open(path, "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")

    def assert_clean(self, *, expect: JobState | None = JobState.SUCCEEDED, context: str = "") -> None:
        problems = self.problems(expect=expect)
        assert not problems, f"{self.summary()}\n" + "\n".join(problems) + (f"\n{context}" if context else "")


def check(name: str, backend_name: str, seed: int, history: History, effects: Iterable[dict[str, Any]],
          jobs: Iterable[Job], *, effect: str = "done", task: str = "fault.work") -> Report:
    """The total-queue check of one run, plus the final-store checks. ``jobs`` is the whole
    store after the drain; ``effects`` the side-effect log; only ``task``'s jobs are judged."""
    rep = Report(name=name, backend=backend_name, seed=seed)
    attempted = {o.n for o in history.by_type("invoke")}
    ok = history.ok_ids()
    failed = {o.n for o in history.by_type("fail")}
    info = {o.n for o in history.by_type("info")}
    rep.attempted, rep.ok, rep.failed, rep.info = len(attempted), len(ok), len(failed), len(info)

    mine = [j for j in jobs if j.task == task]
    by_id = {j.id: j for j in mine}
    by_n: dict[int, list[Job]] = defaultdict(list)
    for j in mine:
        by_n[int(j.args["n"])].append(j)
    runs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    per_attempt: Counter[tuple[int, int]] = Counter()
    for rec in effects:
        if rec.get("e") != effect:
            continue
        runs[int(rec["n"])].append(rec)
        per_attempt[(int(rec["job"]), int(rec["attempt"]))] += 1
    rep.executions = sum(len(v) for v in runs.values())

    for n, job_id in sorted(ok.items()):
        job = by_id.get(job_id)
        if job is None or not job.state.is_final or (job.state is JobState.SUCCEEDED and not runs.get(n)):
            rep.lost.append(n)
        elif job.state is not JobState.SUCCEEDED:
            rep.not_succeeded[n] = str(job.state)
    rep.unexpected = sorted({n for n in runs if n not in attempted} | {n for n in by_n if n not in attempted})
    rep.duplicated = {n: len(r) - 1 for n, r in sorted(runs.items()) if len(r) > 1}
    rep.duplicate_runs = {n: [f"a{x['attempt']} pid {x['pid']} @{x['t']:.3f}" for x in runs[n]] for n in rep.duplicated}
    rep.recovered = sorted(n for n in (info | failed) if n in by_n or n in runs)
    rep.enqueued_twice = sorted(n for n, js in by_n.items() if len(js) > 1)

    rep.states = dict(sorted(Counter(str(j.state) for j in mine).items()))
    rep.attempts_hist = dict(sorted(Counter(j.attempts for j in mine).items()))
    rep.running_at_end = sum(1 for j in mine if j.state is JobState.RUNNING)
    rep.unfinished_at_end = sum(1 for j in mine if not j.state.is_final)
    rep.attempts_over_max = sorted(j.id for j in mine if j.attempts > j.max_attempts)
    # A lease that ran out before the store knew its job had started (a prefetched job its worker
    # started less than worker.MARK_SPACING_S before it died) gives the attempt back uncounted,
    # recorded as a stall at that attempt number: that attempt may run once more per stall.
    stalled = Counter((j.id, int(e["attempt"])) for j in mine for e in j.errors
                      if e.get("kind") == "lease_expired" and "not counted" in str(e.get("message")))
    rep.same_attempt_twice = sorted(k for k, c in per_attempt.items() if c > 1 + stalled[k])
    rep.terminal_with_lease = sorted(j.id for j in mine if j.state.is_final and j.lease_token is not None)
    ran = {(int(r["job"]), int(r["attempt"]), int(r["pid"])) for rs in runs.values() for r in rs}
    for j in mine:
        if j.state is JobState.SUCCEEDED:
            res = j.result if isinstance(j.result, dict) else {}
            if res.get("attempt") != j.attempts or (j.id, res.get("attempt"), res.get("pid")) not in ran:
                rep.stale_result.append(j.id)
    rep.log_ahead_of_store = sorted({job_id for (job_id, attempt) in per_attempt
                                     if job_id in by_id and attempt > by_id[job_id].attempts})
    return rep


def check_effects(name: str, backend_name: str, seed: int, history: History,
                  effects: Iterable[dict[str, Any]], *, effect: str = "done",
                  max_attempts: int = 100, free_handouts: int = 0) -> Report:
    """The total-queue check from the side-effect log alone, for a store that keeps no job
    table (a message broker: an acked message is gone). ``lost`` = ``ok`` enqueues with no
    ``effect`` record; ``unexpected``, ``duplicated`` and ``recovered`` as in :func:`check`;
    ``same_attempt_twice`` = a (job, attempt) recorded more than ``1 + free_handouts`` times (a
    broker alone counts hand-outs, and the first ``free_handouts`` it takes back cost no
    attempt: broker/core.py MAX_STALLS; past them a hand-out starts a later attempt);
    ``attempts_over_max`` = jobs with an
    attempt past ``max_attempts``. What needs the store's rows (states, results, leases) is
    left for the caller to check against what the broker does keep."""
    rep = Report(name=name, backend=backend_name, seed=seed)
    attempted = {o.n for o in history.by_type("invoke")}
    ok = history.ok_ids()
    failed = {o.n for o in history.by_type("fail")}
    info = {o.n for o in history.by_type("info")}
    rep.attempted, rep.ok, rep.failed, rep.info = len(attempted), len(ok), len(failed), len(info)
    runs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    per_attempt: Counter[tuple[int, int]] = Counter()
    for rec in effects:
        if rec.get("e") == effect:
            runs[int(rec["n"])].append(rec)
            per_attempt[(int(rec["job"]), int(rec["attempt"]))] += 1
    rep.executions = sum(len(v) for v in runs.values())
    rep.lost = sorted(n for n in ok if not runs.get(n))
    # The job an enqueue made is known by its id: an effect of another id for the same n
    # would be a second job from one enqueue.
    rep.enqueued_twice = sorted(n for n, job_id in ok.items()
                                if any(int(r["job"]) != job_id for r in runs.get(n, ())))
    rep.unexpected = sorted(n for n in runs if n not in attempted)
    rep.duplicated = {n: len(r) - 1 for n, r in sorted(runs.items()) if len(r) > 1}
    rep.duplicate_runs = {n: [f"a{x['attempt']} pid {x['pid']} @{x['t']:.3f}" for x in runs[n]]
                          for n in rep.duplicated}
    rep.recovered = sorted(n for n in (info | failed) if n in runs)
    rep.same_attempt_twice = sorted(k for k, c in per_attempt.items() if c > 1 + free_handouts)
    rep.attempts_over_max = sorted({job for job, attempt in per_attempt if attempt > max_attempts})
    rep.attempts_hist = dict(sorted(Counter(
        max(int(r["attempt"]) for r in rs) for rs in runs.values()).items()))
    return rep


# -- worker processes ------------------------------------------------------------------------
@dataclass
class WorkerSpec:
    concurrency: int = 4
    lease: float = 2.0
    poll: float = 0.2
    grace: float = 5.0
    queues: str = "default"
    scheduler: bool = False
    processes: int = 1  # > 1: under the product's supervisor (--processes), which restarts crashed ones
    prefetch: int = 0  # --prefetch: jobs held (leased) beyond the free slots
    prefetch_hold: float | None = None  # --prefetch-hold: seconds a held job waits for a slot
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()  # more command-line options, e.g. ("--log-level", "DEBUG")


class Cluster:
    """Real ``python -m conveyor --app faultapp:app worker`` processes on one store.

    Each runs in its own session (a signal for one reaches no other) with its output in files
    under ``tmp``. ``close()`` SIGKILLs, by pid, whatever this cluster started and is still alive.
    """

    def __init__(self, tmp: Path, url: str, log: Path, *, env: dict[str, str] | None = None,
                 url_for: Callable[[str], str] | None = None) -> None:
        self.tmp, self.url, self.log = tmp, url, log
        self.url_for = url_for  # a store URL per worker name (e.g. a PostgreSQL application_name)
        base = dict(os.environ)
        for k in ("CONVEYOR_APP", "CONVEYOR_FAULTPOINT", "FAULT_CRON"):
            base.pop(k, None)
        base.update(CONVEYOR_URL=url, FAULT_LOG=str(log), PYTHONUNBUFFERED="1",
                    PYTHONPATH=os.pathsep.join(p for p in (str(HERE), base.get("PYTHONPATH")) if p))
        base.update(env or {})
        self.env = base
        self.procs: list[Proc] = []
        self.specs: dict[int, WorkerSpec] = {}
        self._n = 0
        self._lock = threading.Lock()

    def spawn(self, spec: WorkerSpec | None = None, *, name: str | None = None, wait: bool = True) -> Proc:
        spec = spec or WorkerSpec()
        with self._lock:
            self._n += 1
            name = name or f"w{self._n}"
        out, err = self.tmp / f"{name}.stdout", self.tmp / f"{name}.stderr"
        argv = [sys.executable, "-m", "conveyor", "--app", "faultapp:app", "worker", "--queues", spec.queues,
                "--concurrency", str(spec.concurrency), "--visibility-timeout", str(spec.lease),
                "--grace", str(spec.grace), "--poll-interval", str(spec.poll)]
        if not spec.scheduler:
            argv.append("--no-scheduler")
        if spec.prefetch:
            argv += ["--prefetch", str(spec.prefetch)]
        if spec.prefetch_hold is not None:
            argv += ["--prefetch-hold", str(spec.prefetch_hold)]
        if spec.processes > 1:
            argv += ["--processes", str(spec.processes)]
        argv += list(spec.args)
        env = {**self.env, **spec.env}
        if self.url_for is not None:
            env["CONVEYOR_URL"] = self.url_for(name)
        with open(out, "wb") as fo, open(err, "wb") as fe:
            popen = subprocess.Popen(argv, env=env, cwd=self.tmp, stdin=subprocess.DEVNULL,
                                     stdout=fo, stderr=fe, start_new_session=True)
        proc = Proc(popen, name, out, err)
        with self._lock:
            self.procs.append(proc)
            self.specs[proc.pid] = spec
        if wait:
            self.wait_started(proc)
        return proc

    def wait_started(self, *procs: Proc, timeout: float = 30.0) -> None:
        def ready() -> bool:
            for p in procs:
                if not p.alive():
                    raise AssertionError(f"{p!r} exited early:\n{p.stderr()[-3000:]}")
            return all(p.started_workers() >= self.specs[p.pid].processes for p in procs)

        wait_until(ready, timeout, lambda: f"worker(s) {[p.name for p in procs]} to start\n{self.diagnosis()}")

    def live(self) -> list[Proc]:
        with self._lock:
            return [p for p in self.procs if p.alive()]

    def started(self) -> list[Proc]:
        return [p for p in self.live() if p.started_workers() >= 1]

    def respawn(self, proc: Proc, *, wait: bool = False) -> Proc:
        """A new worker with the same settings as ``proc`` (which is dead)."""
        return self.spawn(self.specs[proc.pid], wait=wait)

    def sigterm_all(self, timeout: float = 30.0) -> dict[str, int | None]:
        """SIGTERM every live worker (graceful stop) and wait; their exit codes by name."""
        procs = self.live()
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for p in procs:
            try:
                codes[p.name] = p.wait(timeout)
            except subprocess.TimeoutExpired:
                codes[p.name] = None
        return codes

    def stderr_all(self) -> str:
        return "\n".join(p.stderr() for p in self.procs)

    def diagnosis(self, tail: int = 15) -> str:
        parts = []
        for p in self.procs[-6:]:
            lines = "\n".join(p.stderr().splitlines()[-tail:])
            parts.append(f"--- {p!r} stderr (tail) ---\n{lines}")
        return "\n".join(parts)

    def close(self) -> None:
        for p in self.procs:
            if p.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)
            for pid in session_members(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


class Nemesis:
    """Every U(``interval``) seconds, a fault on one random started worker of ``cluster``, the
    kinds of ``faults`` in turn: ``"kill"`` is SIGKILL and a new worker in its place; ``"pause"``
    is SIGSTOP for ``pause_s`` seconds, then SIGCONT. ``keep`` workers are always left running.
    ``events`` lists (time, fault, worker name, pid)."""

    def __init__(self, cluster: Cluster, rng: random.Random, *, interval: tuple[float, float],
                 faults: Sequence[str] = ("kill",), pause_s: float = 3.0, keep: int = 0,
                 pause_guard: Callable[[Proc], bool] | None = None) -> None:
        self.cluster, self.rng, self.interval = cluster, rng, interval
        self.faults, self.pause_s, self.keep = list(faults), pause_s, keep
        # pause_guard(proc), asked once proc is stopped: False if it must not stay stopped now
        # (it holds a lock every other process would wait for); it is resumed and the fault skipped.
        self.pause_guard = pause_guard
        self.skipped_pauses = 0
        self._turn = 0
        self.events: list[tuple[float, str, str, int]] = []
        self._stop = threading.Event()
        self._paused: list[tuple[float, Proc]] = []
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def counts(self) -> dict[str, int]:
        return dict(Counter({"kill": "sigkill", "pause": "sigstop"}[f] for _, f, _, _ in self.events))

    def _resume_due(self, force: bool = False) -> None:
        now = time.monotonic()
        for item in list(self._paused):
            t, p = item
            if force or now >= t:
                with contextlib.suppress(ProcessLookupError):
                    p.send(signal.SIGCONT)
                self._paused.remove(item)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.rng.uniform(*self.interval)):
                self._resume_due()
                paused = {p.pid for _, p in self._paused}
                candidates = [p for p in self.cluster.started() if p.pid not in paused]
                if len(candidates) <= self.keep:  # leave this many running, untouched
                    continue
                victim = self.rng.choice(candidates)
                fault = self.faults[self._turn % len(self.faults)]  # in turn: each kind surely happens
                if fault == "kill":
                    with contextlib.suppress(ProcessLookupError):
                        victim.popen.kill()
                    victim.popen.wait(10)
                    self.events.append((time.time(), fault, victim.name, victim.pid))
                    self._turn += 1
                    self.cluster.respawn(victim)
                else:
                    with contextlib.suppress(ProcessLookupError):
                        victim.send(signal.SIGSTOP)
                    wait_until(lambda v=victim: is_stopped(v.pid) or not v.alive(), 5, f"{victim.name} to stop")
                    if self.pause_guard is not None and not self.pause_guard(victim):
                        with contextlib.suppress(ProcessLookupError):
                            victim.send(signal.SIGCONT)
                        self.skipped_pauses += 1
                        continue
                    self.events.append((time.time(), fault, victim.name, victim.pid))
                    self._turn += 1
                    self._paused.append((time.monotonic() + self.pause_s, victim))
        finally:
            self._resume_due(force=True)

    def start(self) -> Nemesis:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the nemesis did not stop"


def is_stopped(pid: int) -> bool:
    return (proc_stat(pid) or {}).get("state") == "T"
