"""Process-level rig for the PostgreSQL tests: real ``conveyor worker`` processes on a fresh
schema of the machine's PostgreSQL (or on a private server the test starts itself).

Every process is started in its own session with its stdout and stderr in files under the
test's ``tmp_path``; the teardown SIGKILLs, by Popen handle, whatever is still running. Tests
never sleep for fixed times to wait for an outcome: they poll the store with a deadline.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar
from urllib.parse import quote

import pgapp
import psycopg
import pytest

from conveyor import Conveyor, Task
from conveyor.backends.postgres import PostgresBackend

HERE = Path(__file__).resolve().parent
POSTGRES_URL = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
POLL_S = 0.05
T = TypeVar("T")


def unavailable(reason: str) -> NoReturn:
    """Skip locally; fail in CI, so a missing PostgreSQL can never turn the run green."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL unavailable: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unavailable: {reason}")


def with_params(url: str, **params: str) -> str:
    """``url`` with query parameters added (values URL-quoted)."""
    extra = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{extra}"


@contextlib.contextmanager
def fresh_schema(base_url: str = POSTGRES_URL) -> Iterator[str]:
    """A new, empty schema on ``base_url``'s database; yields a URL whose search_path is it."""
    schema = f"conveyor_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(base_url, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        unavailable(f"cannot connect to {base_url}: {exc}")
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield with_params(base_url, options=f"-csearch_path={schema}")
        finally:
            admin.execute("SET lock_timeout = '30s'")
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextlib.contextmanager
def fresh_backend() -> Iterator[PostgresBackend]:
    """A PostgresBackend on a fresh schema (fresh_schema), closed at the end."""
    with fresh_schema() as url:
        backend = PostgresBackend(url)
        try:
            yield backend
        finally:
            backend.close()


def wait_until(predicate: Callable[[], T], timeout: float, what: str | Callable[[], str],
               interval: float = POLL_S) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; AssertionError
    naming ``what`` (or the diagnosis it returns) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g}s waiting for {detail}")
        time.sleep(interval)


def read_marker(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a marker file written by pgapp.mark()."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def runs_per_job(recs: list[dict[str, Any]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for r in recs:
        counts[r["job"]] = counts.get(r["job"], 0) + 1
    return counts


# -- processes ---------------------------------------------------------------------------------
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

    def started_workers(self) -> int:
        return len(re.findall(r"worker \S+ started: queues", self.stderr()))

    def __repr__(self) -> str:
        return f"<Proc {self.name} pid={self.pid} rc={self.popen.returncode}>"


class PgRig:
    """A store URL plus the worker processes of one test."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.tmp = tmp_path
        self.url = url
        env = dict(os.environ)
        env.pop("CONVEYOR_APP", None)
        env["CONVEYOR_URL"] = url
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env
        # The test's own handle on the store, with pgapp's tasks (so enqueue validates).
        self.app = Conveyor(url)
        for t in pgapp.app.tasks.values():
            self.app.task(name=t.name, queue=t.queue, max_attempts=t.max_attempts, timeout=t.timeout,
                          retry=t.retry_policy)(t.fn)
        self.procs: list[Proc] = []
        self._n = 0

    def task(self, name: str = "pg.record") -> Task[Any, Any]:
        return self.app.tasks[name]

    def marker(self, name: str = "marker") -> Path:
        return self.tmp / f"{name}.jsonl"

    # processes
    def worker(self, *, concurrency: int = 4, visibility_timeout: float = 30.0, poll_interval: float = 0.5,
               grace: float = 5.0, name: str | None = None, url: str | None = None) -> Proc:
        """Start ``python -m conveyor --app pgapp:app worker ...`` (not waiting for it to start)."""
        self._n += 1
        name = name or f"w{self._n}"
        out, err = self.tmp / f"{name}.stdout", self.tmp / f"{name}.stderr"
        env = dict(self.env, CONVEYOR_URL=url or self.url)
        argv = [sys.executable, "-m", "conveyor", "--app", "pgapp:app", "worker", "--queues", "default",
                "--concurrency", str(concurrency), "--visibility-timeout", str(visibility_timeout),
                "--grace", str(grace), "--poll-interval", str(poll_interval)]
        with open(out, "wb") as fo, open(err, "wb") as fe:
            popen = subprocess.Popen(argv, env=env, cwd=self.tmp, stdin=subprocess.DEVNULL, stdout=fo,
                                     stderr=fe, start_new_session=True)
        proc = Proc(popen, name, out, err)
        self.procs.append(proc)
        return proc

    def wait_started(self, *procs: Proc, timeout: float = 30.0) -> None:
        def ready() -> bool:
            for p in procs:
                if not p.alive():
                    raise AssertionError(f"{p!r} exited early:\n{p.stderr()[-3000:]}")
            return all(p.started_workers() >= 1 for p in procs)

        self.wait_until(ready, timeout, "worker(s) to start")

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
                    p.popen.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)
        self.app.close()

    # store, read from outside the backend
    def sql(self, query: str, params: Any = None, url: str | None = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(url or self.url, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(query.encode(), params)
            return cur.fetchall() if cur.description is not None else []

    def states(self, url: str | None = None) -> dict[str, int]:
        rows = self.sql("SELECT state, count(*) FROM conveyor_jobs GROUP BY state", url=url)
        return {str(s): int(n) for s, n in rows}

    def wait_all(self, n: int, timeout: float, url: str | None = None) -> dict[str, int]:
        """Wait until ``n`` jobs exist and every one is finished; return the counts by state."""
        last: dict[str, int] = {}

        def done() -> dict[str, int] | None:
            nonlocal last
            last = self.states(url)
            finished = sum(v for k, v in last.items() if k in ("succeeded", "dead", "cancelled"))
            return last if finished >= n and sum(last.values()) == finished else None

        return wait_until(done, timeout, lambda: f"{n} jobs to finish (now {last})\n{self.diagnosis()}",
                          interval=0.2)


# -- a private PostgreSQL server ---------------------------------------------------------------
def _bindir() -> Path:
    env = os.environ.get("CONVEYOR_TEST_PG_BINDIR")
    if env:
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    if which:
        return Path(which).parent
    unavailable("no PostgreSQL server binaries (pg_ctl, initdb) found; set CONVEYOR_TEST_PG_BINDIR")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port, run by an unprivileged OS user (root may
    not run postgres): ``postgres`` if it exists, else ``nobody``. Superuser ``conveyor``,
    trust authentication on 127.0.0.1 only; the data lives in a temporary directory."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="conveyor-pg-"))
        self.data = self.base / "data"
        self.logfile = self.base / "server.log"
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            user = "postgres"
            try:
                pw = pwd.getpwnam(user)
            except KeyError:
                user, pw = "nobody", pwd.getpwnam("nobody")
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
            self.prefix = ["runuser", "-u", user, "--"]
        self.url = f"postgresql://conveyor@127.0.0.1:{self.port}/postgres"
        self._run([str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "conveyor",
                   "-E", "UTF8", "--no-locale", "--no-sync"], timeout=120)

    def _run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([*self.prefix, *argv], capture_output=True, text=True, timeout=timeout,
                             cwd=self.base, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}\n"
                               f"{self.log_tail()}")
        return res

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def start(self) -> None:
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base} -c max_connections=60")
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile), "-w",
                   "-t", "60", "-o", opts, "start"], timeout=90)

    def stop(self, mode: str = "fast") -> None:
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"],
                  timeout=90)

    def running(self) -> bool:
        res = subprocess.run([*self.prefix, str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"],
                             capture_output=True, text=True, timeout=30, cwd=self.base)
        return res.returncode == 0

    def cleanup(self) -> None:
        try:
            if self.data.exists() and self.running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
