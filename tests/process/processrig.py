"""Process-level test rig: real ``conveyor worker`` processes on a fresh SQLite file per test
(the ``rig`` fixture is in conftest.py).

Every process is started through :class:`Rig` in its own session (so a signal meant for one
never reaches the test runner or another test's processes) with its stdout and stderr in
files under the test's ``tmp_path``. The teardown SIGKILLs, by Popen handle, whatever is still
running, then any process left in those sessions (children of a supervisor that died first).

Tests never sleep for fixed times: they poll the store or a marker file with a deadline.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import procapp

from conveyor import Conveyor, Job, JobState, Task
from conveyor.backends.base import QueueStats

PROC_DIR = Path(__file__).resolve().parent
POLL_S = 0.02
T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str | Callable[[], str],
               interval: float = POLL_S) -> T:
    """Poll ``predicate`` every ``interval`` s until it returns something truthy; return it.

    Raises AssertionError naming ``what`` (a str, or a callable producing a diagnosis) on timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g}s waiting for {detail}")
        time.sleep(interval)


# -- /proc helpers (Linux) -----------------------------------------------------------------
def proc_stat(pid: int) -> dict[str, Any] | None:
    """State, ppid, pgrp and session of a live process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return {"state": fields[0], "ppid": int(fields[1]), "pgrp": int(fields[2]), "session": int(fields[3])}


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/<pid>/task/<pid>/children)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return sorted(int(p) for p in text.split())


def session_members(session: int) -> list[int]:
    """Live (non-zombie) processes of ``session`` that run conveyor."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        st = proc_stat(pid)
        if st is None or st["session"] != session or st["state"] == "Z":
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"conveyor" in cmdline:
            found.append(pid)
    return sorted(found)


def db_write_locked(db: Path) -> bool:
    """True if some connection holds the SQLite write lock on ``db`` right now, or a writer holds
    one of the write-turn files beside it (backends/sqlite/turns.py), which every other writer
    of the store queues behind as well."""
    if turn_held(db):
        return True
    conn = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return True
        raise
    finally:
        conn.close()


def turn_held(db: Path) -> bool:
    """True if some process holds ``db``'s write-turn door or turn file (an exclusive flock)."""
    for suffix in ("-writers.door", "-writers.turn"):
        try:
            fd = os.open(f"{db}{suffix}", os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing lets go of a lock this call took
    return False


def read_marker(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a marker file written by procapp.mark()."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


# -- processes -------------------------------------------------------------------------------
class Proc:
    """One process we started: its Popen handle and the files holding its output."""

    def __init__(self, popen: subprocess.Popen[bytes], name: str, stdout: Path, stderr: Path) -> None:
        self.popen = popen
        self.name = name
        self.stdout_path = stdout
        self.stderr_path = stderr

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def send(self, sig: int) -> None:
        """Send ``sig`` through the Popen handle (a no-op once the process was reaped)."""
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def started_workers(self) -> int:
        """How many worker loops in this process (or its supervised children) have started."""
        return len(re.findall(r"worker \S+ started: queues", self.stderr()))

    def __repr__(self) -> str:
        return f"<Proc {self.name} pid={self.pid} rc={self.popen.returncode}>"


class Rig:
    """A fresh store plus the processes of one test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.db = tmp_path / "jobs.db"
        self.url = f"sqlite:///{self.db}"
        env = dict(os.environ)
        env.pop("CONVEYOR_APP", None)
        env["CONVEYOR_URL"] = self.url
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROC_DIR), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env
        # The test's own handle on the store, with the same tasks as procapp (so enqueue validates).
        self.app = Conveyor(self.url)
        for t in procapp.app.tasks.values():
            self.app.task(name=t.name, queue=t.queue, max_attempts=t.max_attempts, timeout=t.timeout,
                          retry=t.retry_policy)(t.fn)
        self.procs: list[Proc] = []
        self._n = 0

    # processes
    def spawn(self, *args: str, name: str | None = None) -> Proc:
        self._n += 1
        name = name or f"p{self._n}"
        out, err = self.tmp / f"{name}.stdout", self.tmp / f"{name}.stderr"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            popen = subprocess.Popen(
                [sys.executable, "-m", "conveyor", "--app", "procapp:app", *args],
                env=self.env, cwd=self.tmp, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                start_new_session=True,
            )
        proc = Proc(popen, name, out, err)
        self.procs.append(proc)
        return proc

    def worker(self, *, queues: str = "default", concurrency: int = 4, visibility_timeout: float = 1.0,
               grace: float = 5.0, poll_interval: float = 0.2, processes: int | None = None,
               name: str | None = None, wait_started: bool = True) -> Proc:
        args = ["worker", "--queues", queues, "--concurrency", str(concurrency),
                "--visibility-timeout", str(visibility_timeout), "--grace", str(grace),
                "--poll-interval", str(poll_interval)]
        if processes is not None:
            args += ["--processes", str(processes)]
        proc = self.spawn(*args, name=name)
        if wait_started:
            self.wait_started(proc, processes or 1)
        return proc

    def wait_started(self, proc: Proc, count: int = 1, timeout: float = 20.0) -> None:
        """Wait until ``count`` worker loops of ``proc`` run (signal handlers are installed by then)."""
        def ready() -> bool:
            if not proc.alive():
                raise AssertionError(f"{proc!r} exited early:\n{proc.stderr()}")
            return proc.started_workers() >= count
        self.wait_until(ready, timeout, f"{count} worker(s) of {proc.name} to start")

    def cli(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run one ``conveyor --app procapp:app ...`` command to completion."""
        return subprocess.run(
            [sys.executable, "-m", "conveyor", "--app", "procapp:app", *args],
            env={**self.env, "COLUMNS": "250"}, cwd=self.tmp, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=timeout, start_new_session=True,
        )

    def diagnosis(self) -> str:
        parts = []
        for p in self.procs:
            tail = "\n".join(p.stderr().splitlines()[-25:])
            parts.append(f"--- {p!r} stderr (tail) ---\n{tail}")
        return "\n".join(parts)

    def wait_until(self, predicate: Callable[[], T], timeout: float, what: str) -> T:
        return wait_until(predicate, timeout, lambda: f"{what}\n{self.diagnosis()}")

    def close(self) -> None:
        for p in self.procs:
            if p.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)
            # Children of a supervisor outlive it if it was killed: they are in its session.
            for pid in session_members(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.app.close()

    # store
    def task(self, name: str) -> Task[Any, Any]:
        return self.app.tasks[name]

    def job(self, job_id: int) -> Job:
        return self.app.get_job(job_id)

    def wait_job(self, job_id: int, states: Iterable[JobState] = (JobState.SUCCEEDED, JobState.DEAD,
                 JobState.CANCELLED), timeout: float = 20.0) -> Job:
        wanted = set(states)

        def check() -> Job | None:
            job = self.job(job_id)
            return job if job.state in wanted else None

        return self.wait_until(check, timeout,
                               f"job {job_id} to reach {sorted(map(str, wanted))} (now {self.job(job_id)})")

    def wait_jobs(self, job_ids: Iterable[int], states: Iterable[JobState] = (JobState.SUCCEEDED,),
                  timeout: float = 30.0) -> list[Job]:
        ids = list(job_ids)
        wanted = {str(s) for s in states}
        placeholders = ",".join("?" * len(ids))

        def pending() -> int:
            with contextlib.closing(sqlite3.connect(self.db)) as conn:
                (n,) = conn.execute(
                    f"SELECT count(*) FROM conveyor_jobs WHERE id IN ({placeholders}) AND state NOT IN "
                    f"({','.join('?' * len(wanted))})", [*ids, *wanted],
                ).fetchone()
            return int(n)

        self.wait_until(lambda: pending() == 0, timeout,
                        f"{len(ids)} jobs to reach {sorted(wanted)} (pending: {pending()})")
        return [self.job(i) for i in ids]

    def row(self, job_id: int) -> tuple[Any, ...]:
        """The job's raw row, straight from the file (for byte-for-byte comparisons)."""
        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            row = conn.execute("SELECT * FROM conveyor_jobs WHERE id = ?", (job_id,)).fetchone()
        assert row is not None
        return tuple(row)

    def count(self, where: str = "1", params: Iterable[Any] = ()) -> int:
        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            (n,) = conn.execute(f"SELECT count(*) FROM conveyor_jobs WHERE {where}", list(params)).fetchone()
        return int(n)

    def queue_stats(self, queue: str = "default") -> QueueStats:
        for q in self.app.backend.stats().queues:
            if q.queue == queue:
                return q
        return QueueStats(queue=queue)

    def integrity(self) -> str:
        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])

    # marker files
    def marker(self, name: str = "marker") -> Path:
        return self.tmp / f"{name}.jsonl"

    def wait_marker(self, path: Path, predicate: Callable[[list[dict[str, Any]]], bool],
                    what: str, timeout: float = 20.0) -> list[dict[str, Any]]:
        def check() -> list[dict[str, Any]] | None:
            recs = read_marker(path)
            return recs if predicate(recs) else None

        return self.wait_until(check, timeout, f"marker {path.name}: {what} (has {read_marker(path)})")

    def stop_outside_write(self, proc: Proc, tries: int = 100) -> None:
        """SIGSTOP ``proc`` at a moment it does not hold the store's write lock.

        A process frozen inside a write transaction would stall every other writer (SQLite has
        one write lock), which is a property of the store, not what a zombie test is about.
        """
        for _ in range(tries):
            proc.send(signal.SIGSTOP)
            self.wait_until(lambda: (proc_stat(proc.pid) or {}).get("state") == "T", 5, f"{proc.name} to stop")
            if not db_write_locked(self.db):
                return
            proc.send(signal.SIGCONT)
            self.wait_until(lambda: (proc_stat(proc.pid) or {}).get("state") != "T", 5,
                            f"{proc.name} to resume")
        raise AssertionError(f"could not stop {proc.name} outside a write transaction")


def job_records(recs: list[dict[str, Any]], job_id: int, event: str = "start") -> list[dict[str, Any]]:
    return [r for r in recs if r["job"] == job_id and r["event"] == event]
