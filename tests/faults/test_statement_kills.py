"""R1c: a process SIGKILLed at an exact statement inside the store's own transaction, on every
backend (the plan's ``in_ack_before_commit`` kill point, and R5's ``in_txn`` variant).

The kills come from statement_killer.py: the child process installs a hook before it builds
the app (src/ is not touched). On SQLite a trace callback on every connection; on PostgreSQL
wrappers of psycopg's ``Cursor.execute``/``executemany`` and of the connection's ``BEGIN`` and
``COMMIT``; on Redis a wrapper of redis-py's socket write. The child makes the store calls a
worker or a producer makes, one of them the *planned* call, and kills itself at the planned
point of that call's transaction:

* every transition of a job that writes: ``enqueue_many`` (a batch of K jobs),
  ``cron_enqueue`` (a schedule's tick and its job), ``claim`` (K jobs), ``heartbeat`` (K
  leases), ``ack_many`` (K jobs), ``retry``, ``release`` (K leases), ``reap`` (K expired leases)
  and ``promote`` (K due jobs);
* SQLite and PostgreSQL: one case per statement of the transaction, from the first statement
  after ``BEGIN`` to the ``COMMIT`` itself (killed before it runs, or is sent), plus after the
  ``COMMIT`` returned; on PostgreSQL also after ``COMMIT`` was sent and before its reply was
  read. PostgreSQL's claim is one autocommit statement (acks, promotion and claim as CTEs):
  killed before it is sent and after it returned. The statements come from a traced run of
  the same call (the control case: nothing killed), so a change in the store's SQL changes
  the points, and each is printed;
* Redis (one Lua script per transition): before the ``EVALSHA`` was written, after it was
  written and before its reply was read, and with the socket cut in the middle of it (a
  batch of acks is one ``ack_many`` script);
* and a real ``conveyor worker`` (the plan's ``in_ack_before_commit``): K jobs claimed in one
  claim, all side effects done, killed at its first ack transaction (``ack_and_claim``, its
  acks and its next claim in one transaction, statement or pipeline, or ``ack_many`` when it
  idles), before ``COMMIT`` runs (SQLite), before ``COMMIT`` or the one-statement
  ack-and-claim is sent (PostgreSQL), or after the scripts were sent (Redis).

Pass criteria, per kill point (each case runs alone on a queue of its own):

1. The hook fired where planned: the child died of SIGKILL (signal 9; the control case exited
   0), and its record names the planned call and the statement, equal to the traced run's
   statement at that index (so no case passes vacuously).
2. The store is consistent right after the kill: SQLite ``integrity_check`` and
   ``quick_check`` ok, still WAL; every job whole (a running job has its lease, token, worker
   and attempt; no other job holds a lease; finished jobs have ``finished_at``; only
   succeeded jobs have a result; one error record per failed attempt, numbered 1..n); each
   queue's lease-expiry counter equals its ``lease_expired`` error records; every claimed
   job's fair tag is at most its round's virtual time; on Redis every job in exactly the
   state indexes (global and per queue, with the right scores) its hash names, and no index
   entry without a job.
3. The killed transaction is wholly applied or wholly absent, never part: a batch enqueue
   leaves 0 or K jobs, a claim K running jobs or K untouched ones, a cron tick is taken with
   its job or not at all; "absent" means untouched: a job being acked, retried, released or
   heartbeated is still running under the very lease token the dead process held. Killed before
   ``COMMIT`` ran (or was sent, or before the script was written): absent. Killed after
   ``COMMIT`` returned: applied. PostgreSQL's "COMMIT sent, reply unread" and Redis's "script
   sent, reply unread" may go either way (the client cannot know); the outcome is reported.
   A Redis pipeline cut after m whole scripts: exactly those applied (each script is atomic),
   a script cut in half: absent.
4. After a normal worker drains every queue: lost 0, unexpected 0, every enqueued job
   succeeded, results from the last attempt, nothing running; and per job exactly what the
   outcome implies (attempts, side effects, error kinds), e.g. an ack killed before its
   COMMIT: the lease ran out, the job was reaped and ran again, attempts 2, side effects 2,
   errors [lease_expired]; applied: attempts 1, side effects 1. Duplicates equal the sum of
   what each case implies, exactly.

Sizes: CI K = 3, each point once; full K = 5, each point 3 times.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from faultstore import FaultStore
from harness import (
    History,
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
from statement_killer import normalize

from conveyor import Conveyor, Job, JobState
from conveyor.backends.base import Backend

pytestmark = [pytest.mark.faults, pytest.mark.process]

HERE = Path(__file__).resolve().parent
KILLER = HERE / "statement_killer.py"

K = pick(3, 5)  # jobs per call (retry: 1)
REPEATS = pick(1, 3)  # each kill point this many times
LEASE = 1.0  # the killed child's lease, and the drain worker's
# promote and reap act on the whole store: they go first, while nothing else is due or expired.
OPS = ("promote", "reap", "enqueue_many", "cron_enqueue", "claim", "heartbeat", "ack_many", "retry", "release")
SINGLE = {"retry", "cron_enqueue"}  # calls on one job
ERROR_KINDS = {"exception", "timeout", "rejected", "retry", "unknown_task", "bad_arguments", "lease_expired"}

# Per (transition, outcome): what the job must look like once a normal worker drained the store:
# (attempts, side effects, error kinds), None for "no job at all".
FINAL: dict[tuple[str, str], tuple[int, int, list[str]] | None] = {
    ("enqueue_many", "absent"): None,
    ("enqueue_many", "applied"): (1, 1, []),
    ("cron_enqueue", "absent"): None,  # the tick not taken either
    ("cron_enqueue", "applied"): (1, 1, []),
    ("claim", "absent"): (1, 1, []),
    ("claim", "applied"): (2, 1, ["lease_expired"]),  # claimed, never run, lease ran out
    ("heartbeat", "absent"): (2, 1, ["lease_expired"]),  # the holder died: its lease runs out
    ("heartbeat", "applied"): (2, 1, ["lease_expired"]),  # ... a lease later
    ("ack_many", "absent"): (2, 2, ["lease_expired"]),  # side effect done, ack lost: runs again
    ("ack_many", "applied"): (1, 1, []),
    ("retry", "absent"): (2, 2, ["lease_expired"]),
    ("retry", "applied"): (2, 2, ["exception"]),
    ("release", "absent"): (2, 1, ["lease_expired"]),
    ("release", "applied"): (1, 1, []),  # given back unrun: the attempt not counted
    ("reap", "absent"): (2, 1, ["lease_expired"]),  # the test reaps it itself right after
    ("reap", "applied"): (2, 1, ["lease_expired"]),
    ("promote", "absent"): (1, 1, []),  # the test promotes it itself right after
    ("promote", "applied"): (1, 1, []),
}


def expected_outcome(at: Any) -> str:
    """What a kill at ``at`` must leave of the call: absent, applied, or either (unknowable)."""
    if isinstance(at, int) or at in ("commit", "before_send"):
        return "absent"
    if at in ("after_commit", "trace"):
        return "applied"
    if at == "cut":
        return "cut"
    return "either"  # commit_sent, after_send: on the wire, the reply never read


# -- the store's invariants -----------------------------------------------------------------------
def job_problems(j: Job) -> list[str]:
    w = f"job {j.id} (n={j.args.get('n') if isinstance(j.args, dict) else '?'}, {j.state}, attempts {j.attempts})"
    out = []
    if not j.task or not j.queue or not isinstance(j.args, dict) or "n" not in j.args or j.max_attempts < 1:
        out.append(f"{w}: not whole (task {j.task!r}, queue {j.queue!r}, args {j.args!r})")
    if not 0 <= j.attempts <= j.max_attempts:
        out.append(f"{w}: attempts outside 0..{j.max_attempts}")
    if j.state is JobState.RUNNING:
        if j.lease_token is None or j.lease_expires_at is None or j.worker_id is None or j.attempts < 1 \
                or j.attempted_at is None:
            out.append(f"{w}: running without a whole lease (token {j.lease_token!r}, expires "
                       f"{j.lease_expires_at!r}, worker {j.worker_id!r}, attempted_at {j.attempted_at!r})")
    elif j.lease_token is not None or j.lease_expires_at is not None:
        out.append(f"{w}: holds a lease ({j.lease_token!r}, {j.lease_expires_at!r}) but is not running")
    if j.state.is_final != (j.finished_at is not None):
        out.append(f"{w}: finished_at {j.finished_at!r} does not fit the state")
    if (j.state is JobState.SUCCEEDED) != (j.result is not None):
        out.append(f"{w}: result {j.result!r} does not fit the state")
    if j.attempts >= 1 and j.attempted_at is None:
        out.append(f"{w}: attempted but no attempted_at")
    if j.state is not JobState.CANCELLED:
        failed = j.attempts - (1 if j.state in (JobState.RUNNING, JobState.SUCCEEDED) else 0)
        numbered = [e.get("attempt") for e in j.errors]
        if numbered != list(range(1, failed + 1)):
            out.append(f"{w}: error records for attempts {numbered}, expected one for each of {failed} failed attempt(s)")
        kinds = {e.get("kind") for e in j.errors}
        if not kinds <= ERROR_KINDS:
            out.append(f"{w}: unknown error kinds {kinds - ERROR_KINDS}")
    return out


def sqlite_problems(db: Path) -> list[str]:
    out = []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        checks = [conn.execute("PRAGMA integrity_check").fetchall(), conn.execute("PRAGMA quick_check").fetchall()]
        if checks != [[("ok",)], [("ok",)]]:
            out.append(f"SQLite integrity_check / quick_check: {checks}")
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if mode != "wal":
            out.append(f"SQLite journal_mode is {mode}, not wal")
        # Every claimed job's tag is within its round: the claim raised the round's vtime in its transaction.
        behind = conn.execute("""SELECT j.id, j.fair_tag, c.vtime FROM conveyor_jobs AS j
            LEFT JOIN conveyor_queue_clock AS c ON c.queue = j.queue AND c.priority = j.priority
            WHERE j.attempt >= 1 AND (c.vtime IS NULL OR j.fair_tag > c.vtime)""").fetchall()
        if behind:
            out.append(f"claimed jobs with a fair tag past their round's vtime (id, tag, vtime): {behind[:10]}")
    return out


def pg_problems(url: str) -> list[str]:
    out = []
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        behind = conn.execute("""SELECT j.id, j.fair_tag, c.vtime FROM conveyor_jobs AS j
            LEFT JOIN conveyor_queue_clock AS c ON c.queue = j.queue AND c.priority = j.priority
            WHERE j.attempt >= 1 AND (c.vtime IS NULL OR j.fair_tag > c.vtime)""").fetchall()
        if behind:
            out.append(f"claimed jobs with a fair tag past their round's vtime (id, tag, vtime): {behind[:10]}")
        stuck = conn.execute("""SELECT application_name, state FROM pg_stat_activity
            WHERE application_name LIKE 'sk-%' AND state LIKE 'idle in transaction%'""").fetchall()
        if stuck:
            out.append(f"sessions of killed processes still in a transaction: {stuck}")
    return out


REDIS_STATES = ("scheduled", "available", "running", "succeeded", "dead", "cancelled")


def redis_problems(store: FaultStore) -> list[str]:
    """Every job hash in exactly the indexes its state names (docs in lua/_common.lua), and no
    index entry without its job."""
    assert store.redis is not None
    prefix = parse_qs(urlsplit(store.url).query)["prefix"][0]
    p = "{" + prefix + "}"
    r = store.redis.client()
    out: list[str] = []
    try:
        queues = sorted(r.smembers(f"{p}:queues"))
        state_sets = {s: set(r.zrange(f"{p}:state:{s}", 0, -1)) for s in REDIS_STATES}
        everything = set(r.zrange(f"{p}:jobs", 0, -1))
        per_q: dict[tuple[str, str], dict[str, float]] = {}
        for q in queues:
            for what in ("scheduled", "running", "succeeded", "dead", "cancelled", "jobs", "due"):
                per_q[(q, what)] = dict(r.zrange(f"{p}:q:{q}:{what}", 0, -1, withscores=True))
            per_q[(q, "available")] = dict(r.zrange(f"{p}:q:{q}:available", 0, -1, withscores=True))
        fair = {q: r.hgetall(f"{p}:q:{q}:fair") for q in queues}
        ids = everything.union(*state_sets.values())
        for (_, what), members in per_q.items():
            ids |= {str(int(m[-16:])) for m in members} if what == "available" else set(members)
        pipe = r.pipeline(transaction=False)
        for i in sorted(ids, key=int):
            pipe.hgetall(f"{p}:job:{i}")
        hashes = dict(zip(sorted(ids, key=int), pipe.execute(), strict=True))
        avail_ids = {q: {str(int(m[-16:])): m for m in per_q[(q, "available")]} for q in queues}
        for i, h in hashes.items():
            if not h:
                out.append(f"job {i}: named by an index, but it has no hash")
                continue
            st, q = h.get("state"), h.get("queue")
            if st not in REDIS_STATES or q not in queues:
                out.append(f"job {i}: hash not whole (state {st!r}, queue {q!r})")
                continue
            where = f"job {i} ({st}, queue {q})"
            if i not in everything or i not in per_q[(q, "jobs")]:
                out.append(f"{where}: missing from the job listings")
            wrong = [s for s in REDIS_STATES if (i in state_sets[s]) != (s == st)]
            if wrong:
                out.append(f"{where}: global state index wrong for {wrong}")
            for s in ("scheduled", "running", "succeeded", "dead", "cancelled"):
                if (i in per_q[(q, s)]) != (s == st):
                    out.append(f"{where}: in queue index {s}: {i in per_q[(q, s)]}")
            if (i in avail_ids[q]) != (st == "available") or (i in per_q[(q, "due")]) != (st == "available"):
                out.append(f"{where}: available/due index disagrees with the state")
            if st == "available" and avail_ids[q].get(i) != h.get("m"):
                out.append(f"{where}: available member {avail_ids[q].get(i)!r} is not the hash's {h.get('m')!r}")
            if st == "running" and per_q[(q, "running")].get(i) != float(h.get("lease_expires_at", "nan")):
                out.append(f"{where}: running score {per_q[(q, 'running')].get(i)} != lease_expires_at "
                           f"{h.get('lease_expires_at')}")
            if st == "scheduled" and per_q[(q, "scheduled")].get(i) != float(h.get("run_at", "nan")):
                out.append(f"{where}: scheduled score != run_at")
            if int(h.get("attempt", 0)) >= 1:
                vtime = int(fair[q].get(f"v:{int(h.get('priority', 0))}", 0))
                if int(h.get("fair_tag", 0)) > vtime:
                    out.append(f"{where}: fair tag {h.get('fair_tag')} past its round's vtime {vtime}")
        for q in queues:
            # store_problems listed every job and read the stats first: both fold the inboxes.
            if r.llen(f"{p}:q:{q}:inbox"):
                out.append(f"queue {q}: inbox not folded by list_jobs and stats")
            if int(fair[q].get("gated", 0) or 0) != 0:
                out.append(f"queue {q}: gated count {fair[q].get('gated')} without any limited job")
    finally:
        r.close()
    return out


def store_problems(store: FaultStore, backend: Backend) -> list[str]:
    """Every invariant of a consistent store that is broken now, in words."""
    jobs = all_jobs(backend)
    out = [p for j in jobs for p in job_problems(j)]
    expired: Counter[str] = Counter()
    for j in jobs:
        expired[j.queue] += sum(1 for e in j.errors if e.get("kind") == "lease_expired")
    counted = {q.queue: q.lease_expiries for q in backend.stats().queues}
    for q in sorted(set(expired) | set(counted)):
        if expired[q] != counted.get(q, 0):
            out.append(f"queue {q}: {counted.get(q, 0)} lease expiries counted, {expired[q]} lease_expired "
                       "errors recorded (a reap half-applied?)")
    if store.sqlite_path is not None:
        out += sqlite_problems(store.sqlite_path)
    elif store.pg is not None:
        out += pg_problems(store.url)
    elif store.redis is not None:
        out += redis_problems(store)
    return out


# -- the outcome of one killed call, per job ----------------------------------------------------------
def classify(case: Case, job: Job | None, tick_taken: bool = False) -> str:
    """``applied``, ``absent`` or a description of a job the call left half-written."""
    op = case.op
    kinds = [e.get("kind") for e in job.errors] if job is not None else []
    held = case.leases.get(job.id) if job is not None else None  # the lease the killed process held
    # Still running under the very lease the killed process held, nothing recorded since.
    old_lease = (job is not None and job.state is JobState.RUNNING and job.attempts == 1 and not kinds
                 and held is not None and job.lease_token == held[0])
    if job is None:
        if op == "enqueue_many" or (op == "cron_enqueue" and not tick_taken):
            return "absent"
        return f"half-written: no job (tick taken: {tick_taken})" if op == "cron_enqueue" else "missing"
    if op == "enqueue_many":
        if job.state is JobState.AVAILABLE and job.attempts == 0 and not kinds:
            return "applied"
    elif op == "cron_enqueue":
        if job.state is JobState.AVAILABLE and job.attempts == 0 and not kinds and tick_taken:
            return "applied"
    elif op == "claim":
        if job.state is JobState.AVAILABLE and job.attempts == 0 and job.lease_token is None:
            return "absent"
        if job.state is JobState.RUNNING and job.attempts == 1 and job.worker_id == case.worker_id \
                and job.lease_token and (held is None or job.lease_token == held[0]):
            return "applied"
    elif op == "heartbeat":
        assert held is not None and held[1] is not None
        if old_lease and job.lease_expires_at == held[1]:
            return "absent"
        # Extended by 2 x LEASE from a later time: at least a lease past the claim's expiry.
        if old_lease and (job.lease_expires_at or 0) >= held[1] + LEASE:
            return "applied"
    elif op == "ack_many":
        if old_lease and job.result is None:
            return "absent"
        if job.state is JobState.SUCCEEDED and job.attempts == 1 and not kinds \
                and isinstance(job.result, dict) and job.result.get("pid") == case.pid:
            return "applied"
    elif op == "retry":
        if old_lease:
            return "absent"
        if job.state is JobState.AVAILABLE and job.attempts == 1 and kinds == ["exception"]:
            return "applied"
    elif op == "release":
        if old_lease:
            return "absent"
        if job.state is JobState.AVAILABLE and job.attempts == 0 and not kinds and job.lease_token is None:
            return "applied"
    elif op == "reap":
        if job.state is JobState.RUNNING and job.attempts == 1 and not kinds and job.worker_id == "sk-parent":
            return "absent"
        if job.state is JobState.AVAILABLE and job.attempts == 1 and kinds == ["lease_expired"]:
            return "applied"
    elif op == "promote":
        if job.state is JobState.SCHEDULED and job.attempts == 0:
            return "absent"
        if job.state is JobState.AVAILABLE and job.attempts == 0:
            return "applied"
    return (f"half-written: {job.state}, attempts {job.attempts}, errors {kinds}, worker {job.worker_id}, "
            f"lease {job.lease_token} until {job.lease_expires_at} (held {held}), result {job.result}")


# -- the child processes ----------------------------------------------------------------------------
class Zygote:
    """statement_killer.py's zygote: forks one case per spec; reports each child's end."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.stderr_path = tmp / "zygote.stderr"
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, str(KILLER), "zygote"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, cwd=tmp, env=env,
                                         start_new_session=True)
        self._buf = b""
        self.child: int | None = None

    def _line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the case did not end within {timeout}s\n{self.stderr()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    raise AssertionError(f"the zygote exited ({self.proc.poll()})\n{self.stderr()}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return dict(json.loads(line))

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def run(self, spec: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(spec) + "\n").encode())
        self.proc.stdin.flush()
        self.child = int(self._line(15)["pid"])
        status = self._line(timeout)
        self.child = None
        return status

    def close(self) -> None:
        if self.child is not None and (proc_stat(self.child) or {}).get("ppid") == self.proc.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(10)


@dataclass
class Case:
    name: str
    op: str
    at: Any
    queue: str
    ns: list[int]
    cut_after: int = 0
    worker_id: str | None = None
    pid: int = 0
    schedule: str = ""
    tick: float = 0.0
    leases: dict[int, tuple[str, float | None]] = field(default_factory=dict)  # job id -> (token, expires)
    fired: dict[str, Any] | None = None
    outcome: dict[int, str] = field(default_factory=dict)


class Run:
    """The cases of one backend, one after another, and what each left."""

    def __init__(self, store: FaultStore, app: Conveyor, tmp: Path) -> None:
        self.store, self.app, self.tmp = store, app, tmp
        self.backend = app.backend
        self.history = History()
        self.log = tmp / "effects.jsonl"
        self.cases: list[Case] = []
        self.traces: dict[str, list[str]] = {}
        env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_FAULTPOINT"}
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        self.env = env
        self.zygote = Zygote(tmp, env)
        self.task = app.tasks["fault.work"]

    @property
    def queues(self) -> list[str]:
        return [c.queue for c in self.cases]

    def close(self) -> None:
        self.zygote.close()

    # -- before the kill: the jobs the call works on --------------------------------------------
    def _enqueue(self, queue: str, ns: list[int], **options: Any) -> None:
        queued = self.task.options(queue=queue, **options)
        for n in ns:
            assert self.history.record(n, lambda n=n: queued.enqueue(n).id) is not None  # type: ignore[misc]

    def _prepare(self, op: str, queue: str, ns: list[int]) -> None:
        if op in ("enqueue_many", "cron_enqueue"):
            for n in ns:
                self.history.invoke(n)
        elif op == "promote":
            self._enqueue(queue, ns, delay=0.05)
            due = max(j.run_at for j in all_jobs(self.backend, queue=queue))
            wait_until(lambda: self.backend.now() > due, 5, "the jobs to come due")
        elif op == "reap":
            self._enqueue(queue, ns)
            jobs = self.backend.claim(queue, len(ns), worker_id="sk-parent", lease_s=0.05)
            assert len(jobs) == len(ns)
            until = max(j.lease_expires_at or 0.0 for j in jobs)
            wait_until(lambda: self.backend.now() > until, 5, "the leases to run out")
        else:
            self._enqueue(queue, ns)

    # -- after the kill: settled, consistent, and whole ---------------------------------------------
    def _settle(self, case: Case, app_name: str) -> None:
        """Wait until the server is done with the dead process: its PostgreSQL sessions ended
        (a transaction left open is rolled back), its Redis connection closed (a command it
        wrote has run)."""
        if self.store.pg is not None:
            def gone() -> bool:
                with psycopg.connect(self.store.url, autocommit=True, connect_timeout=5) as conn:
                    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                       [app_name]).fetchone()
                return row is not None and int(row[0]) == 0

            wait_until(gone, 15, f"the PostgreSQL sessions of {case.name} to end")
        elif self.store.redis is not None and case.fired and case.fired.get("laddr"):
            addr = case.fired["laddr"]
            r = self.store.redis.client()
            try:
                wait_until(lambda: all(c.get("addr") != addr for c in r.client_list()), 15,
                           f"the Redis connection of {case.name} ({addr}) to close")
            finally:
                r.close()

    def _check_after(self, case: Case) -> None:
        problems = store_problems(self.store, self.backend)
        assert not problems, f"{case.name} ({case.fired}): the store is inconsistent:\n" + "\n".join(problems[:20])
        by_n = {int(j.args["n"]): j for j in all_jobs(self.backend, queue=case.queue)}
        tick_taken = False
        if case.op == "cron_enqueue":
            ticks = self.backend.cron_ticks()
            assert ticks.get(case.schedule) in (None, case.tick), (case.name, ticks.get(case.schedule))
            tick_taken = case.schedule in ticks
        case.outcome = {n: classify(case, by_n.get(n), tick_taken) for n in case.ns}
        half = {n: o for n, o in case.outcome.items() if o not in ("applied", "absent")}
        assert not half, f"{case.name}: killed at {case.fired}, jobs left half-written: {half}"
        want = expected_outcome(case.at)
        got = set(case.outcome.values())
        ids = (case.fired or {}).get("ids") or []
        if want == "cut" and case.op == "ack_many":
            job_n = {j.id: n for n, j in by_n.items()}
            acked = {job_n[i] for i in ids[:case.cut_after]}
            assert case.outcome == {n: "applied" if n in acked else "absent" for n in case.ns}, \
                f"{case.name}: a pipeline cut after {case.cut_after} whole ack script(s): {case.outcome}"
        elif want == "cut":
            assert got == {"absent"}, f"{case.name}: a script cut in half must do nothing: {case.outcome}"
        else:
            # One transaction (one script): all of the call's jobs went the same way.
            assert len(got) == 1, f"{case.name}: killed at {case.fired}, the call was applied in part: {case.outcome}"
            if want != "either":
                assert got == {want}, f"{case.name}: killed at {case.fired}: expected {want}, found {case.outcome}"
        # Leave nothing due or expired for the next case's promote or reap to pick up.
        if case.op == "reap" and got == {"absent"}:
            requeued = set(self.backend.reap().requeued)
            assert {by_n[n].id for n in case.ns} <= requeued, (case.name, requeued)
        if case.op == "promote" and got == {"absent"}:
            assert self.backend.promote() >= len(case.ns), case.name

    # -- one case ---------------------------------------------------------------------------------
    def run(self, op: str, at: Any, *, cut_after: int = 0) -> Case:
        idx = len(self.cases)
        label = at if at != "cut" else f"cut{cut_after}"
        case = Case(name=f"{op}@{label}#{idx}", op=op, at=at, queue=f"sk{idx}_{op}",
                    ns=list(range(idx * 100, idx * 100 + (1 if op in SINGLE else K))), cut_after=cut_after,
                    worker_id=f"sk-{idx}", schedule=f"sk-cron-{idx}", tick=1_700_000_000.0 + idx)
        self.cases.append(case)
        self._prepare(op, case.queue, case.ns)
        record = self.tmp / f"case{idx}.jsonl"
        app_name = f"sk-{idx}"
        spec = {"backend": self.store.name, "url": self.store.with_app_name(app_name), "record": str(record),
                "plan": {"op": op, "at": at, "cut_after": cut_after}, "queue": case.queue, "ns": case.ns,
                "k": len(case.ns), "worker_id": case.worker_id, "lease": LEASE, "log": str(self.log),
                "schedule": case.schedule, "tick": case.tick}
        status = self.zygote.run(spec)
        case.pid = int(status["pid"])
        recs = read_effects(record)
        errors = [r["traceback"] for r in recs if r.get("event") == "error"]
        assert not errors, f"{case.name}: the child failed:\n{errors[0]}"
        events = [r for r in recs if r.get("event") not in ("trace", "enqueued", "claimed")]
        claimed: dict[str, list[Any]] = next((r["leases"] for r in recs if r.get("event") == "claimed"), {})
        case.leases = {int(i): (str(t), float(e)) for i, (t, e) in claimed.items()}
        trace = next((r["statements"] for r in recs if r.get("event") == "trace"), None)
        if at == "trace":
            assert status == {"pid": case.pid, "signal": None, "exit": 0}, (case.name, status)
            assert trace is not None and not events, (case.name, recs)
            self.traces[op] = trace
        else:
            # The hook fired, at the planned statement, and the process died of it.
            assert status["signal"] == signal.SIGKILL, f"{case.name}: the child ended {status}, not by SIGKILL: {recs}"
            assert len(events) == 1, (case.name, recs)
            case.fired = events[0]
            assert case.fired["op"] == op and case.fired["pid"] == case.pid, (case.name, case.fired)
            index = case.fired["index"]
            if isinstance(at, int):
                assert index == at, (case.name, case.fired)
            assert case.fired["statement"] == normalize(self.traces[op][index]), \
                f"{case.name}: killed at {case.fired['statement']!r}, the traced run had {self.traces[op][index]!r}"
        if op in ("enqueue_many", "cron_enqueue"):
            made = next((r["ids"] for r in recs if r.get("event") == "enqueued"), None)
            for n in case.ns:
                if made is not None:
                    self.history.ok(n, int(made[str(n)]))
                else:
                    self.history.info(n, RuntimeError("killed inside the enqueue call"))
        self._settle(case, app_name)
        self._check_after(case)
        return case

    # -- the real worker ---------------------------------------------------------------------------
    def run_worker(self, at: str) -> Case:
        """A real ``conveyor worker`` (concurrency K) killed in its first ack transaction."""
        idx = len(self.cases)
        case = Case(name=f"worker ack@{at}#{idx}", op="ack_many", at=at, queue=f"sk{idx}_worker",
                    ns=list(range(idx * 100, idx * 100 + K)))
        self.cases.append(case)
        queued = self.task.options(queue=case.queue)
        for n in case.ns:
            # together=K: the K attempts meet after their side effects (faultapp), so all are done
            # before the first ack is written.
            assert self.history.record(n, lambda n=n: queued.enqueue(n, together=K).id) is not None  # type: ignore[misc]
        record = self.tmp / f"case{idx}.jsonl"
        app_name = f"sk-{idx}"
        # Its first ack call: ack_and_claim while the claim loop runs, ack_many while it idles.
        plan = {"backend": self.store.name, "op": "any_ack", "at": at, "record": str(record)}
        # CONVEYOR_FAULTPOINT names no point of src/conveyor/faultpoints.py: it only turns on faultapp's barrier.
        env = {**self.env, "CONVEYOR_URL": self.store.with_app_name(app_name), "FAULT_LOG": str(self.log),
               "PYTHONUNBUFFERED": "1", "CONVEYOR_FAULTPOINT": "statement_kill"}
        argv = [sys.executable, str(KILLER), "worker", json.dumps(plan), "--app", "faultapp:app", "worker",
                "--queues", case.queue, "--concurrency", str(K), "--visibility-timeout", str(LEASE),
                "--grace", "5", "--poll-interval", "0.2", "--no-scheduler"]
        out, err = self.tmp / "killed-worker.stdout", self.tmp / "killed-worker.stderr"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen(argv, env=env, cwd=self.tmp, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                                    start_new_session=True)
        try:
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        case.pid = proc.pid
        recs = read_effects(record)
        assert code == -signal.SIGKILL, f"the worker exited {code}:\n{err.read_text()[-3000:]}"
        assert len(recs) == 1, recs
        case.fired = recs[0]
        assert case.fired["op"] == "any_ack", case.fired
        if self.store.name == "redis":
            sent = set(case.fired["statement"].split(" + "))
            assert sent & {"EVALSHA ack", "EVALSHA ack_many"}, case.fired
            assert sent <= {"EVALSHA ack", "EVALSHA ack_many", "EVALSHA claim"}, case.fired
        elif case.fired["statement"] != "COMMIT":
            # PostgreSQL's ack_and_claim is one autocommit statement: killed before it was sent.
            assert self.store.name == "postgres" and case.fired["statement"].startswith("WITH acked AS"), case.fired
        self._settle(case, app_name)
        problems = store_problems(self.store, self.backend)
        assert not problems, f"{case.name} ({case.fired}): the store is inconsistent:\n" + "\n".join(problems[:20])
        by_n = {int(j.args["n"]): j for j in all_jobs(self.backend, queue=case.queue)}
        batch = set(case.fired["ids"])
        # The batch's leases as the worker sent them; jobs outside it were never in an ack call.
        case.leases = {j.id: (j.lease_token or "", None) for j in by_n.values() if j.id not in batch}
        case.leases.update(zip(case.fired["ids"], ((t, None) for t in case.fired["tokens"]), strict=True))
        case.outcome = {n: classify(case, by_n[n]) for n in case.ns}
        in_batch = {case.outcome[n] for n in case.ns if by_n[n].id in batch}
        assert batch and len(in_batch) == 1, f"{case.name}: the ack batch {sorted(batch)} went in part: {case.outcome}"
        if self.store.name != "redis":
            assert in_batch == {"absent"}, case.outcome
        # Jobs outside the killed batch were never acked at all.
        assert all(case.outcome[n] == "absent" for n in case.ns if by_n[n].id not in batch), case.outcome
        return case


def kill_points(backend: str, op: str, trace: list[str]) -> list[tuple[Any, int]]:
    """The points to kill at, from the traced run's statements: (at, cut_after)."""
    if backend == "redis":
        scripts = [s for s in trace if "EVALSHA" in s]
        assert len(scripts) == 1, f"{op}: expected one write with the script(s), traced {trace}"
        cuts = range(scripts[0].count("EVALSHA")) if op == "ack_many" else range(1)
        return [("before_send", 0), ("after_send", 0), *(("cut", m) for m in cuts)]
    if backend == "postgres" and len(trace) == 1 and trace[0].startswith("WITH acked AS"):
        return [("commit", 0), ("after_commit", 0)]  # one autocommit statement: before it, after it
    assert len(trace) >= 3 and trace[0].upper().startswith("BEGIN") and trace[-1] == "COMMIT", (op, trace)
    points: list[tuple[Any, int]] = [(i, 0) for i in range(1, len(trace))]
    points.append(("after_commit", 0))
    if backend == "postgres":
        points.insert(-1, ("commit_sent", 0))
    return points


@pytest.mark.timeout(pick(240, 1500))
def test_statement_kills(fault_store: FaultStore, make_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    seed, _ = make_rng(f"R1c statement kills / {fault_store.name}")
    app = client_app(fault_store.url)  # also creates the schema before any child starts
    run = Run(fault_store, app, tmp_path)
    # A Redis store's one-time sweep into its global lease and schedule indexes comes with its
    # first reap or promote: done here, so the traced promote and reap are those calls alone.
    app.backend.reap()
    app.backend.promote()
    started = time.monotonic()
    try:
        for op in OPS:
            run.run(op, "trace")
            for _ in range(REPEATS):
                for at, cut_after in kill_points(fault_store.name, op, run.traces[op]):
                    run.run(op, at, cut_after=cut_after)
        worker_at = "after_send" if fault_store.name == "redis" else "commit"
        run.run_worker(worker_at)
        kills_s = time.monotonic() - started

        cluster = make_cluster(fault_store.url, log=run.log)
        cluster.spawn(WorkerSpec(concurrency=8, lease=LEASE, queues=",".join(run.queues)))
        drain_s = drain(app.backend, 60, cluster.diagnosis)

        effects = read_effects(run.log)
        jobs = all_jobs(app.backend)
        report = check("R1c statement kills", fault_store.name, seed, run.history, effects, jobs)
        runs: Counter[int] = Counter(int(r["n"]) for r in effects if r.get("e") == "done")
        by_n = {int(j.args["n"]): j for j in jobs}
        wrong = []
        expected_dups = 0
        for case in run.cases:
            for n in case.ns:
                final = FINAL[(case.op, case.outcome[n])]
                if final is None:
                    if n in by_n or runs[n]:
                        wrong.append(f"{case.name} n={n}: absent enqueue, yet job {by_n.get(n)} ran {runs[n]}x")
                    continue
                job = by_n.get(n)
                got = (job.state if job else None, job.attempts if job else None, runs[n],
                       [e.get("kind") for e in job.errors] if job else None)
                if got != (JobState.SUCCEEDED, *final):
                    wrong.append(f"{case.name} n={n} ({case.outcome[n]}): state, attempts, side effects, errors "
                                 f"{got}, expected {(JobState.SUCCEEDED, *final)}")
                expected_dups += final[1] - 1

        kills = [c for c in run.cases if c.fired is not None]
        per_op: dict[str, Counter[str]] = defaultdict(Counter)
        either: dict[str, Counter[str]] = defaultdict(Counter)
        for c in kills:
            kind = "worker" if c.name.startswith("worker") else c.op
            per_op[kind].update(c.outcome.values())
            if expected_outcome(c.at) == "either":
                either[f"{kind}@{c.at}"].update(c.outcome.values())
        report.faults = {"sigkill": len(kills),
                         "kill_points": len({(c.name.split("@")[0], str(c.at), c.cut_after) for c in kills})}
        report.figures = {
            "jobs_per_call": K, "repeats": REPEATS,
            "outcomes": {k: dict(v) for k, v in per_op.items()},
            "unknowable_outcomes": {k: dict(v) for k, v in either.items()},
            "statements": {op: " | ".join(t) for op, t in run.traces.items()},
            "kills_s": round(kills_s, 1), "drain_s": round(drain_s, 1),
        }
        report.emit()
        report.assert_clean(context=cluster.diagnosis())
        assert not wrong, "\n".join(wrong[:30])
        assert report.duplicated_total == expected_dups, (report.duplicated_total, expected_dups)
        problems = store_problems(fault_store, app.backend)
        assert not problems, "\n".join(problems[:20])
        # Not vacuous: every transition was killed, and both outcomes were seen.
        assert set(per_op) == {*OPS, "worker"}, sorted(per_op)
        seen: Counter[str] = Counter()
        for v in per_op.values():
            seen.update(v)
        assert seen["absent"] and seen["applied"], seen
    finally:
        run.close()
        app.close()
