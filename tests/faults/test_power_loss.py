"""R5c and R3b: power loss, simulated by dropping every write that was not fsynced.

There is no VM or fault-injecting file system here, so the tests trace the stores' file I/O
with an LD_PRELOAD shim (powerloss/shim.c, built with gcc at test time) and rebuild, from the
files before the run plus the shim's log, what a disk could hold after a power cut at any point
of the log (powerloss/replay.py). The stores run on a real disk, as usual; nothing is slowed
but by the logging.

**Crash model** (replay.py has the details). At a cut:

* durable: every write or truncate of a file that had completed before an ``fsync`` or
  ``fdatasync`` of that file *began*, if that sync returned before the cut;
* volatile: the rest of the file's writes before the cut. Per file, independently, one of:
  ``prefix`` (they reach the disk in order up to a random point; the first lost write may be
  torn at a 512-byte sector boundary), ``reorder`` (SQLite's documented assumptions: writes
  may be reordered, so any subset lands; one lost write may be torn into any subset of its
  sectors; a gap a lost write leaves past the end of a file holds garbage, not zeros; bytes
  outside a write's range never change, "powersafe overwrite"), ``none`` (only fsynced data
  survives) or ``all`` (every completed write survives: a process crash);
* namespace changes (create, unlink, rename) take effect at once, in order. SQLite's ``-shm``
  (a memory map) is left out of the rebuilt directory: SQLite rebuilds it after a crash.

The shim's log is checked against the disk after each run (replaying everything must give
exactly the real files), so a write the shim could not see would fail the test, not pass it.

**The runs.** A producer process enqueues jobs one at a time; a worker process claims 1-3 and
acks them (one by one or together). Each process, after a call *returned*, appends a marker
line to a file in the traced directory and prints it to the test over a pipe
(powerloss/child.py). Both are SIGKILLed at a random moment: the power cut at the end of the
log, judged against the lines the pipe delivered. Every run also yields more cuts at random
positions of its log, judged against the markers before the cut (a marker's place in the log
is after the acknowledged call's fsync).

After each rebuild, Conveyor opens the database (SQLite recovers its WAL) and the test checks:

* R5c ``synchronous=full`` (the default, so its run uses a URL without the option):
  ``integrity_check`` and ``quick_check`` ok, still WAL; every
  acknowledged enqueue present with its id (lost = 0); every acknowledged completion still
  ``succeeded``; no half-written row; no row the producer never enqueued; then a worker drains
  what is left (the product's Worker once per run, a claim/ack loop for the extra cuts) and
  every job ends ``succeeded``.
* R5c ``synchronous=normal`` (``?synchronous=normal``, the opt-out): the same, except that acknowledged commits may be
  missing, but only as a suffix: if enqueue k is there, every enqueue acknowledged before k is
  (the same for completions), and none acknowledged before the WAL's last completed fsync (a
  checkpoint) is missing. The losses, and how far back they reach, are reported: this is what
  NORMAL trades. (A checkpoint, and so an fsync, comes only every 1,000 WAL pages: at a low
  write rate the commits at risk can span minutes or hours.) In both modes the ``all`` model,
  a process crash, loses nothing.
* R3b Redis (``appendonly yes``), a private redis-server on its own port and directory, traced:
  ``appendfsync always`` loses nothing acknowledged and no enqueue is acknowledged before its
  AOF write; ``everysec`` loses only a suffix, acknowledged within the last 2 s before the cut
  (Redis's documented worst case; about 1 s is typical), and nothing whose AOF write completed
  before the last fsync. Redis gets only the ``prefix`` and ``none`` models: an append-only
  file is not claimed to survive reordered writes (SQLite is). Reported for ``everysec``: the
  enqueues Redis acknowledged *before* writing them to the AOF (it postpones the write while
  its once-a-second background fsync is queued or running, and still replies), which even a
  crash of the redis-server process would lose.

Seeds: ``CONVEYOR_FAULT_SEED`` replays the run lengths, cut positions and crash choices; the
logs themselves depend on timing. A failure names the run's directory (its ``trace.log`` and
``initial/`` snapshot), the cut and the model; ``replay.Trace(...).crash(cut,
random.Random(key), model)`` rebuilds exactly that state again.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from harness import PROFILE, Report, all_jobs, make_rng, pick, unfinished
from powerloss import replay
from powerloss.child import QUEUE, make_app
from processrig import wait_until

from conveyor import JobState
from conveyor.backends.base import Backend, Lease
from conveyor.worker import Worker

pytestmark = [pytest.mark.faults, pytest.mark.process]

HERE = Path(__file__).resolve().parent
POWERLOSS = HERE / "powerloss"
CHILD = POWERLOSS / "child.py"

MARKER = "acked.log"
TRIALS = pick(3, 12)  # traced runs per mode, each ended by a SIGKILL (a cut at the log's end)
CUTS = pick(10, 40)  # more cuts per run, at random places in its log
RUN_S = pick((0.4, 1.2), (0.4, 3.0))  # how long the processes run before the power fails
REDIS_TRIALS = pick(2, 6)
EVERYSEC_RUN_S = 2.5  # the last Redis everysec run, if no run before it saw an fsync of the AOF
REDIS_CUTS = pick(6, 25)


# -- the shim --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """powerloss/shim.c, compiled for this run (gcc is required: no skip, CI counts skips as failures)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("the power-loss tests build an LD_PRELOAD shim with gcc, which is not installed "
                    "(Debian: apt-get install gcc)", pytrace=False)
    out = tmp_path_factory.mktemp("powerloss-shim") / "shim.so"
    res = subprocess.run([gcc, "-O2", "-Wall", "-Wextra", "-shared", "-fPIC", "-o", str(out),
                          str(POWERLOSS / "shim.c"), "-ldl"], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"building the power-loss shim failed:\n{res.stderr}", pytrace=False)
    return out


def traced_env(shim: Path, root: Path, log: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CONVEYOR_APP", None)
    env.update(LD_PRELOAD=str(shim), POWERLOSS_DIR=str(root), POWERLOSS_LOG=str(log), PYTHONUNBUFFERED="1")
    return env


@dataclass
class Ack:
    index: int  # record index of the marker's write in the shim's log
    t: float  # when it was written
    kind: str  # "E" enqueue, "A" completion
    job: int
    n: int | None = None


@dataclass
class TracedRun:
    """One traced run: the directory, its snapshot before, the log, and what was acknowledged."""

    dir: Path
    root: Path
    trace: replay.Trace
    piped: list[str]
    acks: list[Ack]
    killed_at: float
    aof_written: dict[int, int] | None = None  # Redis: see aof_writes()

    def acked(self, cut: int) -> tuple[list[Ack], list[Ack]]:
        """Enqueues and completions acknowledged before record ``cut``, each in its process's
        order. At the end of the log (the kill), those the pipe delivered to the test."""
        before = [a for a in self.acks if a.index < cut]
        if cut == len(self.trace.records):
            piped = set(self.piped)
            before = [a for a in before if (f"E {a.n} {a.job}" if a.kind == "E" else f"A {a.job}") in piped]
        return [a for a in before if a.kind == "E"], [a for a in before if a.kind == "A"]

    def attempted_n(self) -> int:
        """One more than the highest n the producer may have stored (it enqueues one at a time)."""
        return max((a.n for a in self.acks if a.kind == "E" and a.n is not None), default=-1) + 2


def read_acks(trace: replay.Trace) -> list[Ack]:
    acks = []
    for r in trace.writes_to(MARKER):
        parts = r.data.decode().split()
        if parts[0] == "E":
            acks.append(Ack(r.index, r.ts, "E", int(parts[2]), int(parts[1])))
        else:
            acks.append(Ack(r.index, r.ts, "A", int(parts[1])))
    return acks


@contextlib.contextmanager
def process_group(argvs: list[list[str]], env: dict[str, str], cwd: Path) -> Iterator[tuple[list[str], Callable[[], float]]]:
    """Start ``argvs`` in one new process group, collecting their stdout lines; ``cut()`` SIGKILLs
    the whole group at once (by its id) and returns when."""
    procs: list[subprocess.Popen[str]] = []
    lines: list[str] = []
    readers = []
    for i, argv in enumerate(argvs):
        with open(cwd / f"p{i}.stderr", "wb") as err:
            procs.append(subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=err, text=True, process_group=procs[0].pid if procs else 0))

    def read(p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line.strip())

    for p in procs:
        readers.append(threading.Thread(target=read, args=(p,), daemon=True))
        readers[-1].start()
    pgid = procs[0].pid
    killed = {"t": 0.0}

    def cut() -> float:
        if not killed["t"]:
            killed["t"] = time.time()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            for p in procs:
                p.wait(10)
            for t in readers:
                t.join(10)
        return killed["t"]

    try:
        yield lines, cut
    finally:
        cut()


def run_traced(shim: Path, run_dir: Path, root: Path, argvs: list[list[str]], run_s: float,
               ready: Callable[[list[str]], bool], *, ignore: set[str]) -> TracedRun:
    """Snapshot ``root``, run ``argvs`` traced for ``run_s`` after ``ready``, cut the power, parse."""
    snapshot = replay.Snapshot.take(root)
    shutil.copytree(root, run_dir / "initial")
    log = run_dir / "trace.log"
    with process_group(argvs, traced_env(shim, root, log), run_dir) as (lines, cut):
        wait_until(lambda: ready(lines), 30, lambda: "the traced processes to start working:\n"
                   + "\n".join((run_dir / f"p{i}.stderr").read_text()[-2000:] for i in range(len(argvs))))
        time.sleep(run_s)
        killed_at = cut()
    records, torn = replay.read_log(log)
    trace = replay.Trace(root, snapshot, records, ignore=ignore, torn_records=torn)
    # The model stands on a complete log: replaying all of it must give the files on disk.
    problems = trace.check_complete(root)
    assert not problems, f"the shim's log does not explain the files ({run_dir}): {problems}"
    assert trace.unknown_ops == 0, f"{trace.unknown_ops} writes to files the shim never saw opened"
    acks = read_acks(trace)
    marked = {f"{a.kind} {a.n} {a.job}" if a.kind == "E" else f"A {a.job}" for a in acks}
    missing = [line for line in lines if line[:2] in ("E ", "A ") and line not in marked]
    assert not missing, f"acknowledged over the pipe but not in the log: {missing[:5]}"
    return TracedRun(run_dir, root, trace, list(lines), acks, killed_at)


def forget(run: TracedRun, verdicts: list[Verdict]) -> None:
    """Delete a run's log and snapshot (tens of MB) unless one of its cuts failed."""
    if not any(v.problems for v in verdicts if v.run == run.dir):
        (run.dir / "trace.log").unlink(missing_ok=True)
        shutil.rmtree(run.dir / "initial", ignore_errors=True)


def cut_plan(run: TracedRun, rng: random.Random, n_cuts: int, models: tuple[str, ...],
             final_models: tuple[str, ...]) -> list[tuple[int, str]]:
    """The power cuts of one run: the kill (end of log) under each of ``final_models``, and
    ``n_cuts`` more under a random one of ``models``: half at random positions of the log, half
    while an fsync was under way (just before it returned: what it was flushing is not durable)."""
    end = len(run.trace.records)
    syncing = [r.index for r in run.trace.records if r.type == replay.FSYNC_END]
    plan = [(end, m) for m in final_models]
    for _ in range(n_cuts):
        cut = rng.choice(syncing) if syncing and rng.random() < 0.5 else rng.randint(1, end)
        plan.append((cut, rng.choice(models)))
    return plan


# -- SQLite ------------------------------------------------------------------------------------------
def sqlite_rows(db: Path) -> dict[str, Any]:
    try:
        return _sqlite_rows(db)
    except sqlite3.DatabaseError as exc:  # "database disk image is malformed" before any check ran
        return {"integrity": [f"{type(exc).__name__}: {exc}"], "journal_mode": None, "broken": []}


def _sqlite_rows(db: Path) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        checks = [conn.execute("PRAGMA integrity_check").fetchone()[0], conn.execute("PRAGMA quick_check").fetchone()[0]]
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        broken = conn.execute("""SELECT id, state FROM conveyor_jobs WHERE args IS NULL OR task IS NULL
            OR state NOT IN ('scheduled','available','running','succeeded','dead','cancelled')
            OR (state = 'running' AND (lease_token IS NULL OR lease_expires_at IS NULL OR attempt < 1))
            OR (state IN ('succeeded','dead','cancelled') AND (finished_at IS NULL OR lease_token IS NOT NULL))
            OR (state = 'succeeded' AND result IS NULL) OR attempt > max_attempts""").fetchall()
    return {"integrity": checks, "journal_mode": mode, "broken": broken}


@dataclass
class Verdict:
    """What one rebuilt state held, judged against the acknowledgements before its cut."""

    run: Path
    cut: int
    model: str
    acked_enqueues: int
    acked_completions: int
    lost_enqueues: list[int]  # n of acknowledged enqueues missing (or with another id)
    lost_completions: list[int]  # ids of acknowledged completions no longer succeeded
    problems: list[str] = field(default_factory=list)
    volatile_ops: int = 0
    dropped_ops: int = 0
    torn: int = 0
    unacked_present: int = 0  # enqueues in flight at the cut that made it
    seconds: float = 0.0  # rebuilding, checking and draining this cut took
    lost_window_s: float = 0.0  # from the oldest lost acknowledgement to the cut


def cut_time(run: TracedRun, cut: int) -> float:
    return run.killed_at if cut == len(run.trace.records) else run.trace.records[cut - 1].ts


def lost_acks(v: Verdict, enq: list[Ack], done: list[Ack]) -> list[Ack]:
    lost_n, lost_ids = set(v.lost_enqueues), set(v.lost_completions)
    return [a for a in enq if a.n in lost_n] + [a for a in done if a.job in lost_ids]


def judge(jobs: list[Any], enq: list[Ack], done: list[Ack], attempted_n: int) -> tuple[list[int], list[int], list[str], int]:
    """Lost enqueues (by n, in ack order), lost completions (by id), problems, unacknowledged present."""
    problems = []
    by_n: dict[int, Any] = {}
    for j in jobs:
        n = j.args.get("n") if isinstance(j.args, dict) else None
        if not isinstance(n, int) or not 0 <= n < attempted_n:
            problems.append(f"job {j.id} was never enqueued (args {j.args!r})")
        elif n in by_n:
            problems.append(f"enqueue n={n} made two jobs ({by_n[n].id}, {j.id})")
        else:
            by_n[n] = j
    by_id = {j.id: j for j in jobs}
    lost_e = [a.n for a in enq if a.n is not None and (a.n not in by_n or by_n[a.n].id != a.job)]
    lost_d = [a.job for a in done if a.job not in by_id or by_id[a.job].state is not JobState.SUCCEEDED]
    acked_n = {a.n for a in enq}
    return lost_e, lost_d, problems, sum(1 for n in by_n if n not in acked_n)


def suffix_only(flags: list[bool]) -> bool:
    """True when the lost ones (False) all come after the kept ones: a suffix of the history."""
    return flags == sorted(flags, reverse=True)


def drain_loop(backend: Backend, timeout: float = 30) -> int:
    """A fresh worker's work, without its waiting: leases of the dead processes are expired by
    reaping at a later clock, then everything is claimed and acked. Returns jobs completed."""
    done = 0
    deadline = time.monotonic() + timeout
    while unfinished(backend):
        assert time.monotonic() < deadline, "the drain did not finish"
        backend.reap(now=time.time() + 3600)
        jobs = backend.claim(QUEUE, 200, worker_id="pl-drain", lease_s=60)
        done += sum(backend.ack_many([(Lease(j.id, j.lease_token or ""), json.dumps(j.args["n"])) for j in jobs]))
    return done


def drain_worker(url: str, timeout: float = 30) -> int:
    """The product's Worker, in this process, until nothing is waiting or running."""
    app = make_app(url)
    worker = Worker(app, concurrency=4, visibility_timeout=1.0, poll_interval=0.05, maintenance_interval=0.2,
                    install_signal_handlers=False, scheduler=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: unfinished(app.backend) == 0, timeout, "the worker to drain the rebuilt store")
    finally:
        worker.stop()
        thread.join(30)
        app.close()
    return worker.counters.succeeded


def check_sqlite_cut(run: TracedRun, cut: int, model: str, key: str, sync: str, *, real_worker: bool) -> Verdict:
    t0 = time.monotonic()
    files, info = run.trace.crash(cut, random.Random(key), model)
    dest = run.dir / f"cut-{cut}-{model}"
    replay.write_files(files, dest)
    db = dest / "jobs.db"
    where = f"run {run.dir}, cut {cut} of {len(run.trace.records)}, model {model}, key {key!r}"
    enq, done = run.acked(cut)
    v = Verdict(run.dir, cut, model, len(enq), len(done), [], [], volatile_ops=info.volatile(),
                dropped_ops=info.volatile() - info.kept(), torn=info.torn())
    state = sqlite_rows(db)
    if state["integrity"] != ["ok", "ok"]:
        v.problems.append(f"integrity_check/quick_check: {state['integrity']}")
        return v  # the rest would only repeat it
    if state["journal_mode"] != "wal":
        v.problems.append(f"journal_mode {state['journal_mode']}")
    if state["broken"]:
        v.problems.append(f"half-written rows: {state['broken'][:10]}")
    url = sqlite_url(db, sync)
    app = make_app(url)
    try:
        jobs = all_jobs(app.backend)
        v.lost_enqueues, v.lost_completions, problems, v.unacked_present = judge(jobs, enq, done, run.attempted_n())
        v.problems += problems
        lost = lost_acks(v, enq, done)
        if lost:
            v.lost_window_s = round(cut_time(run, cut) - min(a.t for a in lost), 3)
        if sync == "full" and (v.lost_enqueues or v.lost_completions):
            v.problems.append(f"acknowledged and lost under synchronous=full: enqueues n={v.lost_enqueues[:20]}, "
                              f"completions of jobs {v.lost_completions[:20]}")
        present = {a.n for a in enq} - set(v.lost_enqueues)
        if not suffix_only([a.n in present for a in enq]):
            v.problems.append(f"lost enqueues are not a suffix of the acknowledged ones: {v.lost_enqueues[:20]}")
        if not suffix_only([a.job not in set(v.lost_completions) for a in done]):
            v.problems.append(f"lost completions are not a suffix: {v.lost_completions[:20]}")
        if model == "all" and (v.lost_enqueues or v.lost_completions):
            v.problems.append("a process crash (every completed write kept) lost acknowledged commits")
        # Nothing acknowledged before the WAL's last completed fsync may be gone.
        wal = run.trace.names_at(cut).get("jobs.db-wal")
        synced_upto = wal.barrier(cut) if wal is not None else -1
        early = [a.n for a in enq if a.index < synced_upto and a.n in v.lost_enqueues]
        early += [a.job for a in done if a.index < synced_upto and a.job in v.lost_completions]
        if early:
            v.problems.append(f"lost although acknowledged before the WAL's last fsync: {early[:20]}")
        if real_worker:
            app.close()
            drain_worker(url)
            app = make_app(url)
        else:
            drain_loop(app.backend)
        after = all_jobs(app.backend)
        stuck = [(j.id, str(j.state)) for j in after if j.state is not JobState.SUCCEEDED]
        if stuck:
            v.problems.append(f"not succeeded after the drain: {stuck[:10]}")
    finally:
        app.close()
    if sqlite_rows(db)["integrity"] != ["ok", "ok"]:
        v.problems.append("integrity_check failed after the drain")
    v.problems = [f"{p} [{where}]" for p in v.problems]
    if not v.problems:
        shutil.rmtree(dest)
    v.seconds = time.monotonic() - t0
    return v


def sqlite_url(db: Path, sync: str) -> str:
    """The store's URL as a user writes it: FULL is the default, so its runs name no option."""
    return f"sqlite:///{db}" if sync == "full" else f"sqlite:///{db}?synchronous={sync}"


def sqlite_mode(shim: Path, tmp_path: Path, sync: str) -> tuple[int, list[Verdict], list[TracedRun]]:
    seed, rng = make_rng(f"R5c power loss, synchronous={sync}")
    verdicts: list[Verdict] = []
    runs: list[TracedRun] = []
    from conveyor.backends.sqlite import SqliteBackend

    for trial in range(TRIALS):
        run_dir = tmp_path / f"run{trial}"
        root = run_dir / "db"
        root.mkdir(parents=True)
        url = sqlite_url(root / "jobs.db", sync)
        SqliteBackend(url).close()  # the schema: on disk before the power fails
        argvs = [[sys.executable, str(CHILD), role, url, str(root / MARKER), str(rng.randrange(2**32))]
                 for role in ("producer", "worker")]
        run = run_traced(shim, run_dir, root, argvs, rng.uniform(*RUN_S),
                         lambda lines: any(x.startswith("A ") for x in lines), ignore={MARKER})
        runs.append(run)
        fsyncs = run.trace.fsync_counts()
        assert run.trace.records and fsyncs.get("jobs.db-wal", 0) > 0, f"the shim saw no WAL fsync: {fsyncs}"
        if sync == "full":
            commits = sum(1 for a in run.acks if a.kind == "E")
            assert fsyncs["jobs.db-wal"] >= commits, f"synchronous=full: {fsyncs} fsyncs for {commits} enqueues"
        plan = cut_plan(run, rng, CUTS, ("prefix", "reorder", "none"), ("prefix", "reorder", "none", "all"))
        for i, (cut, model) in enumerate(plan):
            key = f"{seed}:{trial}:{i}:{cut}:{model}"
            verdicts.append(check_sqlite_cut(run, cut, model, key, sync, real_worker=i == 0))
        shutil.rmtree(root)
        forget(run, verdicts)
    return seed, verdicts, runs


def emit(name: str, backend: str, seed: int, verdicts: list[Verdict], runs: list[TracedRun],
         figures: dict[str, Any], lost_is_problem: bool) -> Report:
    rep = Report(name=name, backend=backend, seed=seed)
    rep.attempted = rep.ok = sum(1 for r in runs for a in r.acks if a.kind == "E")  # acknowledged, per run
    rep.recovered = [0] * sum(v.unacked_present for v in verdicts)
    if lost_is_problem:
        rep.lost = [n for v in verdicts for n in v.lost_enqueues]
    rep.faults = {"power_cuts": len(verdicts), "sigkill": len(runs)}
    lost = [len(v.lost_enqueues) for v in verdicts]
    rep.figures = {
        "profile": PROFILE,
        "acknowledgements_checked": sum(v.acked_enqueues + v.acked_completions for v in verdicts),
        "acked_enqueues_lost_per_cut": f"max {max(lost, default=0)}, cuts with a loss {sum(1 for x in lost if x)}",
        "acked_completions_undone": sum(len(v.lost_completions) for v in verdicts),
        "max_lost_window_s": max((v.lost_window_s for v in verdicts), default=0.0),
        "volatile_ops_dropped": sum(v.dropped_ops for v in verdicts),
        "torn_writes": sum(v.torn for v in verdicts),
        "log_records": sum(len(r.trace.records) for r in runs),
        "log_records_cut_by_the_kill": sum(r.trace.torn_records for r in runs),
        "check_s_per_cut": f"mean {sum(v.seconds for v in verdicts) / max(len(verdicts), 1):.2f}, "
                           f"max {max((v.seconds for v in verdicts), default=0):.2f}",
        "fsyncs": {k: sum(n for r in runs for p, n in r.trace.fsync_counts().items() if p.endswith(k))
                   for k in figures.pop("files", [".incr.aof"])},
        **figures,
    }
    rep.emit()
    return rep


@pytest.mark.timeout(pick(120, 900))
def test_sqlite_full_loses_nothing_acknowledged(shim: Path, tmp_path: Path) -> None:
    seed, verdicts, runs = sqlite_mode(shim, tmp_path, "full")
    emit("R5c power loss, synchronous=full", "sqlite", seed, verdicts, runs,
         {"files": ["jobs.db-wal", "jobs.db"], "integrity": "ok" if not any(v.problems for v in verdicts) else "FAILED"},
         lost_is_problem=True)
    problems = [p for v in verdicts for p in v.problems]
    assert not problems, "\n".join(problems[:20])
    # Not vacuous: the model threw writes away, and there was something to lose.
    assert sum(v.dropped_ops for v in verdicts) > 0, "no cut dropped a write: the model did nothing"
    assert sum(v.acked_enqueues for v in verdicts) >= TRIALS * 20, "hardly anything was acknowledged"


@pytest.mark.timeout(pick(120, 900))
def test_sqlite_normal_loses_only_a_suffix(shim: Path, tmp_path: Path) -> None:
    seed, verdicts, runs = sqlite_mode(shim, tmp_path, "normal")
    per_cut = [f"{v.model}:{len(v.lost_enqueues)}/{v.acked_enqueues}" for v in verdicts]
    print(f"\nacknowledged enqueues lost per cut (model:lost/acked): {' '.join(per_cut)}")
    emit("R5c power loss, synchronous=normal", "sqlite", seed, verdicts, runs,
         {"files": ["jobs.db-wal", "jobs.db"]}, lost_is_problem=False)
    problems = [p for v in verdicts for p in v.problems]
    assert not problems, "\n".join(problems[:20])
    # What NORMAL trades away shows: some cut lost acknowledged commits (the model bites).
    assert any(v.lost_enqueues or v.lost_completions for v in verdicts), "no cut lost anything under NORMAL"


# -- the simulator itself -------------------------------------------------------------------------------
SCRIPT = """
import os, sys, time
root = sys.argv[1]
f = os.open(os.path.join(root, "f"), os.O_WRONLY | os.O_CREAT, 0o644)
os.write(f, b"A" * 1000)
os.fsync(f)
os.write(f, b"B" * 1000)  # never synced
g = os.open(os.path.join(root, "g"), os.O_RDWR | os.O_CREAT, 0o644)
os.pwrite(g, b"x" * 700, 300)
os.writev(g, [b"y" * 10, b"z" * 20])
os.ftruncate(g, 900)
os.fdatasync(g)
os.pwrite(g, b"Q" * 100, 0)  # never synced
h = os.open(os.path.join(root, "h.tmp"), os.O_WRONLY | os.O_CREAT | os.O_SYNC, 0o644)
os.write(h, b"synced by O_SYNC")
os.close(h)
os.rename(os.path.join(root, "h.tmp"), os.path.join(root, "h"))
os.unlink(os.path.join(root, "old"))
print("ready", flush=True)
time.sleep(60)
"""


def test_simulator_drops_unsynced_writes_and_keeps_synced_ones(shim: Path, tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "old").write_bytes(b"to be unlinked")
    run = run_traced(shim, tmp_path, root, [[sys.executable, "-c", SCRIPT, str(root)]], 0.0,
                     lambda lines: "ready" in lines, ignore=set())
    trace = run.trace
    fsyncs = trace.fsync_counts()
    assert fsyncs == {"f": 1, "g": 1, "h": 0}, fsyncs
    g_synced = bytearray(b"\0" * 300 + b"x" * 700)
    g_synced[:30] = b"y" * 10 + b"z" * 20  # writev at the fd's position (0), then cut to 900
    g_synced = g_synced[:900]
    none, _ = trace.crash(len(trace.records), random.Random(1), "none")
    assert none == {"f": b"A" * 1000, "g": bytes(g_synced), "h": b"synced by O_SYNC"}, none.keys()
    everything, _ = trace.crash(len(trace.records), random.Random(1), "all")
    assert everything["f"] == b"A" * 1000 + b"B" * 1000
    assert everything["g"] == b"Q" * 100 + bytes(g_synced[100:])
    seen_f, seen_g = set(), set()
    for i in range(200):
        model = ("prefix", "reorder")[i % 2]
        files, _ = trace.crash(len(trace.records), random.Random(i), model)
        f, g = files["f"], files["g"]
        assert f.startswith(b"A" * 1000) and len(f) <= 2000, (model, len(f))
        assert set(f[1000:]) <= {ord("B")} or model == "reorder", (model, f[1000:])
        if model == "prefix":
            assert (b"A" * 1000 + b"B" * 1000).startswith(f), "prefix model: not a prefix"
            assert len(f) in (1000, 1024, 1536, 2000), len(f)  # cut at 512-byte sectors
        assert g[100:] == bytes(g_synced[100:]) and set(g[:100]) <= set(b"Qyz\0x"), model
        seen_f.add(len(f))
        seen_g.add(g[:100] == b"Q" * 100)
    assert {1000, 2000} <= seen_f and len(seen_f) > 2, f"the unsynced write was never dropped or torn: {seen_f}"
    assert seen_g == {True, False}
    # A cut before the fsync of f began: nothing of f is durable yet.
    first_sync = next(r.index for r in trace.records if r.type == replay.FSYNC_BEGIN)
    early, _ = trace.crash(first_sync, random.Random(0), "none")
    assert early["f"] == b"" and "g" not in early and early["old"] == b"to be unlinked"


def test_simulator_catches_a_store_that_never_fsyncs(shim: Path, tmp_path: Path) -> None:
    """The negative control: ``synchronous=off`` never fsyncs, and the same checks must see
    it lose acknowledged jobs or corrupt the file (else the model would be too kind)."""
    from conveyor.backends.sqlite import SqliteBackend

    seed, rng = make_rng("power loss negative control, synchronous=off")
    root = tmp_path / "db"
    root.mkdir()
    url = f"sqlite:///{root / 'jobs.db'}?synchronous=off"
    SqliteBackend(url).close()
    argvs = [[sys.executable, str(CHILD), role, url, str(root / MARKER), str(rng.randrange(2**32))]
             for role in ("producer", "worker")]
    run = run_traced(shim, tmp_path, root, argvs, 1.0, lambda lines: any(x.startswith("A ") for x in lines),
                     ignore={MARKER})
    assert run.trace.fsync_counts().get("jobs.db-wal", 0) == 0
    verdicts = [check_sqlite_cut(run, cut, model, f"{seed}:{i}", "full", real_worker=False)
                for i, (cut, model) in enumerate(cut_plan(run, rng, 6, ("prefix", "reorder"), ("none",)))]
    caught = [v for v in verdicts if v.problems]
    print(f"\nsynchronous=off: {len(caught)} of {len(verdicts)} cuts lost acknowledged jobs or corrupted the file")
    assert caught, "power cuts on a store that never fsyncs went unnoticed: the simulator is vacuous"


# -- Redis --------------------------------------------------------------------------------------------
def redis_extra(fsync: str) -> tuple[str, ...]:
    # AOF rewrites off: the run appends to the AOF it starts with (a rewrite writes its new base
    # through stdio, which the shim does not see; the self-check would say so).
    return ("--appendfsync", fsync, "--auto-aof-rewrite-percentage", "0")


def aof_writes(run: TracedRun) -> dict[int, int]:
    """For each enqueue n, the log index at which the AOF write carrying it completed."""
    if run.aof_written is not None:
        return run.aof_written
    out: dict[int, int] = {}
    end = len(run.trace.records)
    for path, node in run.trace.names_at(end).items():
        if not path.endswith(".incr.aof"):
            continue
        for op in node.ops:
            if op.kind != "w" or op.end is None:
                continue
            for chunk in op.data.split(b'{"n":')[1:]:
                digits = chunk[:chunk.index(b"}")] if b"}" in chunk else b""
                if digits.isdigit():
                    out.setdefault(int(digits), op.end)
    run.aof_written = out
    return out


def acked_before_written(run: TracedRun) -> list[int]:
    """Enqueues the producer saw acknowledged before Redis had even written them to the AOF."""
    written = aof_writes(run)
    return [a.n for a in run.acks if a.kind == "E" and a.n is not None and a.index < written.get(a.n, 1 << 62)]


def check_redis_cut(run: TracedRun, cut: int, model: str, key: str, fsync: str) -> tuple[Verdict, dict[str, Any]]:
    from redisrig import RedisServer

    t0 = time.monotonic()
    files, info = run.trace.crash(cut, random.Random(key), model)
    dest = run.dir / f"cut-{cut}-{model}"
    replay.write_files(files, dest / "redis-data")
    where = f"run {run.dir}, cut {cut} of {len(run.trace.records)}, model {model}, key {key!r}"
    enq, done = run.acked(cut)
    v = Verdict(run.dir, cut, model, len(enq), len(done), [], [], volatile_ops=info.volatile(),
                dropped_ops=info.volatile() - info.kept(), torn=info.torn())
    extra: dict[str, Any] = {"truncated_aof_loaded": 0}
    srv = RedisServer(dest, extra=redis_extra(fsync))
    try:
        try:
            srv.start()
        except AssertionError:
            log = (dest / "redis.log").read_text(errors="replace")[-3000:]
            v.problems.append(f"redis-server did not start on the rebuilt AOF [{where}]:\n{log}")
            return v, extra
        extra["truncated_aof_loaded"] = int("aof-load-truncated" in (dest / "redis.log").read_text(errors="replace"))
        app = make_app(f"redis://127.0.0.1:{srv.port}/0?prefix=pl")
        try:
            jobs = all_jobs(app.backend)
            v.lost_enqueues, v.lost_completions, problems, v.unacked_present = judge(jobs, enq, done,
                                                                                     run.attempted_n())
            v.problems += problems
            lost = lost_acks(v, enq, done)
            if fsync == "always" and lost:
                v.problems.append(f"acknowledged and lost under appendfsync always: enqueues n={v.lost_enqueues[:20]}, "
                                  f"completions of jobs {v.lost_completions[:20]}")
            present = {a.n for a in enq} - set(v.lost_enqueues)
            if not suffix_only([a.n in present for a in enq]):
                v.problems.append(f"lost enqueues are not a suffix of the acknowledged ones: {v.lost_enqueues[:20]}")
            if not suffix_only([a.job not in set(v.lost_completions) for a in done]):
                v.problems.append(f"lost completions are not a suffix: {v.lost_completions[:20]}")
            # An enqueue whose AOF write completed before the last completed fsync began is on
            # the disk; Redis must load it. (The acknowledgement may come before the write: see
            # aof_writes.)
            aof = [n for p, n in run.trace.names_at(cut).items() if p.endswith(".incr.aof")]
            synced_upto = aof[0].barrier(cut) if aof else -1
            written = aof_writes(run)
            durable = [a.n for a in lost if a.kind == "E" and a.n in written and written[a.n] < synced_upto]
            if durable:
                v.problems.append(f"lost although written to the AOF before its last fsync: n={durable[:20]}")
            if lost:
                v.lost_window_s = round(cut_time(run, cut) - min(a.t for a in lost), 3)
                if v.lost_window_s > 2.0:
                    v.problems.append(f"lost acknowledgements up to {v.lost_window_s} s before the cut (> 2 s)")
            drain_loop(app.backend)
            stuck = [(j.id, str(j.state)) for j in all_jobs(app.backend) if j.state is not JobState.SUCCEEDED]
            if stuck:
                v.problems.append(f"not succeeded after the drain: {stuck[:10]}")
        finally:
            app.close()
    finally:
        srv.stop()
    v.problems = [f"{p} [{where}]" for p in v.problems]
    if not v.problems:
        shutil.rmtree(dest)
    v.seconds = time.monotonic() - t0
    return v, extra


def redis_mode(shim: Path, tmp_path: Path, fsync: str) -> tuple[int, list[Verdict], list[TracedRun], dict[str, Any]]:
    from redisrig import RedisServer

    seed, rng = make_rng(f"R3b Redis power loss, appendfsync {fsync}")
    verdicts: list[Verdict] = []
    runs: list[TracedRun] = []
    truncated = acked_early = synced_runs = 0
    for trial in range(REDIS_TRIALS):
        run_dir = tmp_path / f"run{trial}"
        run_dir.mkdir()
        setup = RedisServer(run_dir, extra=redis_extra(fsync)).start()  # creates the AOF base, untraced
        try:
            with contextlib.suppress(Exception):
                setup.client().shutdown()  # a clean stop: the AOF files are complete and synced
            assert setup.proc is not None
            setup.proc.wait(10)
        finally:
            setup.stop()
        root = setup.dir
        url = f"redis://127.0.0.1:{setup.port}/0?prefix=pl"
        argvs = [setup.args] + [[sys.executable, str(CHILD), role, url, str(root / MARKER), str(rng.randrange(2**32))]
                                for role in ("producer", "worker")]
        run_s = rng.uniform(*RUN_S)
        if fsync == "everysec" and trial == REDIS_TRIALS - 1 and not synced_runs:
            # everysec syncs about once a second: runs shorter than that may all end before the
            # first, and one run must show that the shim sees the AOF's fsyncs at all.
            run_s = max(run_s, EVERYSEC_RUN_S)
        run = run_traced(shim, run_dir, root, argvs, run_s,
                         lambda lines: any(x.startswith("A ") for x in lines), ignore={MARKER})
        runs.append(run)
        early = acked_before_written(run)
        acked_early += len(early)
        if fsync == "always":
            assert not early, f"appendfsync always: enqueues acknowledged before their AOF write: {early[:10]}"
        aof = [p for p in run.trace.fsync_counts() if p.endswith(".incr.aof")]
        assert len(aof) == 1, f"expected one AOF incr file, got {run.trace.fsync_counts()}"
        synced = run.trace.fsync_counts()[aof[0]] > 0
        if fsync == "always":
            assert synced, "appendfsync always: the shim saw no fsync of the AOF"
        synced_runs += synced
        plan = cut_plan(run, rng, REDIS_CUTS, ("prefix", "prefix", "none"), ("prefix", "none", "all"))
        for i, (cut, model) in enumerate(plan):
            v, extra = check_redis_cut(run, cut, model, f"{seed}:{trial}:{i}:{cut}:{model}", fsync)
            verdicts.append(v)
            truncated += extra["truncated_aof_loaded"]
        shutil.rmtree(root)
        forget(run, verdicts)
    assert synced_runs, f"appendfsync {fsync}: the shim saw no fsync of the AOF in any run"
    return seed, verdicts, runs, {"rebuilds_loaded_with_a_truncated_aof": truncated,
                                   "enqueues_acked_before_their_aof_write": acked_early}


@pytest.mark.timeout(pick(120, 900))
@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_redis_aof_power_loss(shim: Path, tmp_path: Path, fsync: str) -> None:
    seed, verdicts, runs, figures = redis_mode(shim, tmp_path, fsync)
    per_cut = [f"{v.model}:{len(v.lost_enqueues)}/{v.acked_enqueues}" for v in verdicts]
    print(f"\nacknowledged enqueues lost per cut (model:lost/acked): {' '.join(per_cut)}")
    emit(f"R3b power loss, appendfsync {fsync}", "redis", seed, verdicts, runs, figures,
         lost_is_problem=fsync == "always")
    problems = [p for v in verdicts for p in v.problems]
    assert not problems, "\n".join(problems[:20])
    assert sum(v.dropped_ops for v in verdicts) > 0, "no cut dropped a write: the model did nothing"
