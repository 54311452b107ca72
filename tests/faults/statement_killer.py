"""The child processes of test_statement_kills.py: each SIGKILLs itself at one exact statement
inside one of the store's own transactions, through a hook it installs itself before it builds
the app. Nothing in src/ knows about it.

The hook, per backend (installed by ``install()``):

* **SQLite**: ``sqlite3.connect`` is wrapped so every connection the backend opens has a trace
  callback (``set_trace_callback``: SQLite calls it as each statement *starts* running, one
  call per row of an ``executemany``) and a ``Connection`` subclass whose ``execute`` notices a
  ``COMMIT`` that returned.
* **PostgreSQL**: ``psycopg.Cursor.execute``/``executemany`` (every statement the backend
  sends) and the connection's ``_exec_command`` (``BEGIN``, ``COMMIT``) are wrapped: the hook
  runs before a statement is handed to libpq. For ``COMMIT`` it can also wait until the
  command is on the wire and psycopg first waits for the reply (``commit_sent``), or until the
  reply was read (``after_commit``).
* **Redis**: ``redis.connection.AbstractConnection.send_packed_command`` is wrapped: the hook
  sees every command written to the socket and can kill before an ``EVALSHA`` is written
  (``before_send``), after it was written and before its reply is read (``after_send``), or
  after writing only part of it (``cut``: the first ``cut_after`` scripts of a pipeline whole,
  the next one half).

Which transaction: the backend's methods (``enqueue_many``, ``claim``, ``ack_many``, ``retry``,
``reap``, ``promote``) are wrapped to mark the thread running them; the *first* call of the
planned method in the process is the target. Its statements are counted from its first
``BEGIN`` (index 0), so a plan ``{"op": "ack_many", "at": 2}`` kills just before the
transaction's third statement runs. ``"at": "commit"`` is its first ``COMMIT``; ``"trace"``
kills nothing and records the statement list (the test derives the kill points from it).

Before killing, the hook appends one JSON line to the record file (the statement it killed at,
its index, the statements so far, the job ids of the call): a ``write()`` survives the SIGKILL
that follows, so the test can prove each kill happened where it was meant to.

Modes: ``python statement_killer.py zygote`` forks one scripted case per JSON line on stdin (a
case is a few store calls on a queue of its own, see ``run_case``) and answers with the
child's pid, then with how it ended; ``python statement_killer.py worker '<plan>' <args>``
installs the hook and runs ``conveyor <args>`` (a real worker).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import signal
import sqlite3
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

OPS = ("enqueue_many", "cron_enqueue", "claim", "heartbeat", "ack_many", "ack_and_claim", "ack", "retry", "release",
       "reap",
       "promote")

_LITERAL = re.compile(r"'(?:[^']|'')*'")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")


def normalize(text: str, limit: int = 160) -> str:
    """A statement without its values (literals and numbers as ?), whitespace collapsed: the
    same statement of two runs compares equal whatever ids, tokens and times it carried."""
    text = _NUMBER.sub("?", _LITERAL.sub("?", text))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_begin(text: str) -> bool:
    return text.lstrip().upper().startswith("BEGIN")


def _is_commit(text: str) -> bool:
    return text.strip().upper() == "COMMIT"


def _is_single_statement_ack(text: str) -> bool:
    """PostgreSQL's claim and ack_and_claim: acks, promotion and claim in one autocommit
    statement, its own transaction (no BEGIN/COMMIT). Its kill points: before it is sent
    ("commit") and after it returned ("after_commit")."""
    return text.lstrip().upper().startswith("WITH ACKED AS")


def _append(path: str, rec: dict[str, Any]) -> None:
    """One write() with O_APPEND: the line survives the SIGKILL that follows."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec, default=str) + "\n").encode())
    finally:
        os.close(fd)


class Tracker:
    """Follows the planned call (the first call of ``plan["op"]`` in this process) and kills
    the process at the planned point of its transaction."""

    def __init__(self, plan: dict[str, Any], record: str) -> None:
        self.op: str = plan["op"]
        self.at: Any = plan["at"]
        self.cut_after = int(plan.get("cut_after", 0))
        self.record = record
        self._local = threading.local()
        self._lock = threading.Lock()
        self.owner: int | None = None  # thread running the target call
        self.done = False
        self.began = False
        self.stmts: list[str] = []
        self.ids: list[int] = []
        self.tokens: list[str] = []

    # -- the backend's calls -------------------------------------------------------------
    def enter(self, op: str, leases: list[tuple[int, str]]) -> bool:
        if getattr(self._local, "op", None) is not None:
            return False  # nested (redis ack_many -> ack): the outer call is the one followed
        self._local.op = op
        with self._lock:
            # "any_ack": the first call that writes acks (a worker acks through ack_and_claim
            # while it is claiming, through ack_many while idle).
            wanted = op in ("ack_many", "ack_and_claim") if self.op == "any_ack" else op == self.op
            if wanted and not self.done and self.owner is None:
                self.owner = threading.get_ident()
                self.began, self.stmts = False, []
                self.ids, self.tokens = [i for i, _ in leases], [t for _, t in leases]
        return True

    def exit(self, *, unless_unsent: bool = False) -> None:
        """``unless_unsent``: a call that sent nothing (a claim from the event loop that handed
        its work to the blocking code) leaves the target to the call that does."""
        self._local.op = None
        with self._lock:
            if self.owner != threading.get_ident():
                return
            if unless_unsent and not self.stmts:
                self.owner = None
                return
            self.owner, self.done = None, True
        if self.at == "trace":
            _append(self.record, {"event": "trace", "op": self.op, "statements": self.stmts, "ids": self.ids,
                                  "pid": os.getpid()})

    def mine(self) -> bool:
        return self.owner == threading.get_ident() and not self.done

    # -- SQL statements ----------------------------------------------------------------------
    def statement(self, text: str) -> None:
        """Called before a statement runs (SQLite) or is sent (PostgreSQL)."""
        if not self.mine():
            return
        if not self.began:
            if _is_single_statement_ack(text):
                if not self.stmts:
                    self.stmts.append(normalize(text))
                if self.at == "commit":
                    self.fire("before its one-statement transaction was sent", 0, text)
                return
            if not _is_begin(text):
                return  # before the transaction: connection setup, the pool's liveness probe
            self.began = True
        index = len(self.stmts)
        self.stmts.append(normalize(text))
        if self.at == index or (self.at == "commit" and _is_commit(text)):
            self.fire(f"before statement {index} ran", index, text)

    def single_statement_returned(self, text: str) -> None:
        """PostgreSQL: a one-statement transaction (see _is_single_statement_ack) returned."""
        if self.mine() and not self.began and _is_single_statement_ack(text) and self.at == "after_commit":
            self.fire("after its one-statement transaction returned", 0, text)

    def committed(self) -> None:
        """A COMMIT of the transaction returned (SQLite) or its reply was read (PostgreSQL)."""
        if self.mine() and self.began and self.at == "after_commit":
            self.fire("after its COMMIT returned", len(self.stmts) - 1, "COMMIT")

    def commit_sent(self) -> None:
        """PostgreSQL: the COMMIT is on the wire; psycopg is about to wait for its reply."""
        if self.mine() and self.began and self.at == "commit_sent":
            self.fire("after COMMIT was sent, before its reply was read", len(self.stmts) - 1, "COMMIT")

    # -- the kill ------------------------------------------------------------------------------
    def fire(self, event: str, index: int, text: str, **extra: Any) -> None:
        _append(self.record, {"event": event, "op": self.op, "at": self.at, "index": index,
                              "statement": normalize(text), "statements": self.stmts, "ids": self.ids,
                              "tokens": self.tokens, "pid": os.getpid(), **extra})
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached: SIGKILL of oneself is delivered as kill() returns


def _leases_of(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[int, str]]:
    """The (job id, lease token) pairs a call works on, in its order."""
    if op in ("ack_many", "ack_and_claim"):
        leases = [lease for lease, _ in (args[0] if args else kwargs["acks"])]
    elif op in ("ack", "retry"):
        leases = [args[0] if args else kwargs["lease"]]
    elif op in ("heartbeat", "release"):
        leases = list(args[0] if args else kwargs["leases"])
    else:
        leases = []
    return [(int(lease.job_id), str(lease.token)) for lease in leases]


def _follow_calls(cls: type, tracker: Tracker) -> None:
    """Wrap the backend's transitions so the tracker knows which call a statement belongs to."""
    for name in OPS:
        orig = getattr(cls, name)

        def wrapper(self: Any, *args: Any, _orig: Any = orig, _name: str = name, **kwargs: Any) -> Any:
            entered = tracker.enter(_name, _leases_of(_name, args, kwargs))
            try:
                return _orig(self, *args, **kwargs)
            finally:
                if entered:
                    tracker.exit()

        setattr(cls, name, functools.wraps(orig)(wrapper))


# -- the hooks ------------------------------------------------------------------------------------
def _install_sqlite(tracker: Tracker) -> None:
    from conveyor.backends.sqlite import SqliteBackend

    class TracedConnection(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            cur = super().execute(sql, *args)
            if _is_commit(sql):
                tracker.committed()
            return cur

    connect: Any = sqlite3.connect

    def traced_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", TracedConnection)
        conn: sqlite3.Connection = connect(*args, **kwargs)
        conn.set_trace_callback(tracker.statement)
        return conn

    sqlite3.connect = traced_connect  # type: ignore[assignment]
    _follow_calls(SqliteBackend, tracker)


def _query_text(query: Any) -> str:
    if isinstance(query, bytes | bytearray | memoryview):
        return bytes(query).decode("utf-8", "replace")
    return query if isinstance(query, str) else repr(query)


def _install_postgres(tracker: Tracker) -> None:
    import psycopg
    from psycopg import _connection_base
    from psycopg.waiting import Wait

    from conveyor.backends.postgres import PostgresBackend

    cursor = psycopg.Cursor
    execute, executemany = cursor.execute, cursor.executemany

    def traced_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = _query_text(query)
        tracker.statement(text)
        result = execute(self, query, *args, **kwargs)
        tracker.single_statement_returned(text)
        return result

    def traced_executemany(self: Any, query: Any, params_seq: Any, *args: Any, **kwargs: Any) -> Any:
        params_seq = list(params_seq)
        tracker.statement(f"{_query_text(query)} [executemany x {len(params_seq)}]")
        return executemany(self, query, params_seq, *args, **kwargs)

    cursor.execute = traced_execute  # type: ignore[method-assign]
    cursor.executemany = traced_executemany  # type: ignore[method-assign]

    base = _connection_base.BaseConnection
    exec_command = base._exec_command

    def watch_commit(gen: Any) -> Any:
        """Drive psycopg's generator for COMMIT; tell the tracker when it first waits for the
        reply only (the command flushed: psycopg yields READ after its flush loop) and when
        the reply was read."""
        try:
            wait = next(gen)
        except StopIteration as stop:
            tracker.committed()
            return stop.value
        while True:
            if wait == Wait.R:
                tracker.commit_sent()
            ready = yield wait
            try:
                wait = gen.send(ready)
            except StopIteration as stop:
                tracker.committed()
                return stop.value

    def traced_exec_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        text = _query_text(command)
        tracker.statement(text)
        gen = exec_command(self, command, *args, **kwargs)
        if _is_commit(text) and tracker.mine() and tracker.at in ("commit_sent", "after_commit"):
            return watch_commit(gen)
        return gen

    base._exec_command = traced_exec_command  # type: ignore[method-assign]
    _follow_calls(PostgresBackend, tracker)


def _resp_commands(data: bytes) -> list[tuple[int, int, list[bytes]]]:
    """Split RESP-encoded commands: (start, end, [arguments]) each."""
    out = []
    pos = 0
    while pos < len(data):
        start = pos
        assert data[pos:pos + 1] == b"*", data[pos:pos + 20]
        eol = data.index(b"\r\n", pos)
        n = int(data[pos + 1:eol])
        pos = eol + 2
        argv = []
        for _ in range(n):
            assert data[pos:pos + 1] == b"$"
            eol = data.index(b"\r\n", pos)
            size = int(data[pos + 1:eol])
            argv.append(data[eol + 2:eol + 2 + size])
            pos = eol + 2 + size + 2
        out.append((start, pos, argv))
    return out


def _install_redis(tracker: Tracker) -> None:
    from redis.connection import AbstractConnection

    from conveyor.backends import redis as conveyor_redis

    script_of = {hashlib.sha1(conveyor_redis._load_script(n).encode()).hexdigest(): n
                 for n in conveyor_redis.SCRIPT_NAMES}
    send: Any = AbstractConnection.send_packed_command

    def describe(argv: list[bytes]) -> str:
        name = argv[0].decode().upper()
        if name == "EVALSHA":
            return f"EVALSHA {script_of.get(argv[1].decode(), argv[1].decode()[:10])}"
        return " ".join(a.decode("utf-8", "replace") for a in argv[:2]) if name == "SCRIPT" else name

    def traced_send(self: Any, command: Any, check_health: bool = True) -> Any:
        if not tracker.mine():
            return send(self, command, check_health)
        chunks = [command] if isinstance(command, str | bytes) else list(command)
        data = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
        cmds = _resp_commands(data)
        names = [describe(argv) for _, _, argv in cmds]
        scripts = [i for i, (_, _, argv) in enumerate(cmds) if argv[0].upper() == b"EVALSHA"]
        index = len(tracker.stmts)
        text = " + ".join(names)
        tracker.stmts.append(normalize(text))
        if not scripts or tracker.at == "trace":
            return send(self, command, check_health)
        # The call's first write with a script in it: the planned point is here.
        if tracker.at == "before_send":
            tracker.fire("before the script was sent", index, text)
        if self._sock is None:
            self.connect()
        host, port = self._sock.getsockname()[:2]
        laddr = f"{host}:{port}"
        if tracker.at == "after_send":
            send(self, command, check_health)
            tracker.fire("after the script was sent, before its reply was read", index, text, laddr=laddr,
                         sent_bytes=len(data))
        # cut: the first cut_after scripts whole, then half of the next one; nothing more
        whole = tracker.cut_after
        assert whole < len(scripts), (whole, names)
        start, end, _ = cmds[scripts[whole]]
        cut = start + (end - start) // 2
        self._sock.sendall(data[:cut])
        tracker.fire(f"after writing {whole} whole script(s) and half of the next", index, text, laddr=laddr,
                     whole_scripts=whole, sent_bytes=cut, total_bytes=len(data))
        return None

    AbstractConnection.send_packed_command = traced_send  # type: ignore[method-assign]
    _follow_calls(conveyor_redis.RedisBackend, tracker)
    _install_redis_loop(tracker, describe)


def _install_redis_loop(tracker: Tracker, describe: Any) -> None:
    """The same kill points for the claims a worker makes from its event loop
    (backends/redis/loop_claims.py): its ack_and_claim is followed as the backend's is, and the
    loop's socket writes (``sock_sendall``) as redis-py's."""
    import asyncio.selector_events

    from conveyor.backends.redis.loop_claims import RedisLoopClaims

    loop_call: Any = RedisLoopClaims.ack_and_claim

    async def traced_call(self: Any, acks: Any, *args: Any, **kwargs: Any) -> Any:
        op = "ack_and_claim" if acks else "claim"
        entered = tracker.enter(op, [(lease.job_id, lease.token) for lease, _ in acks])
        try:
            return await loop_call(self, acks, *args, **kwargs)
        finally:
            if entered:
                tracker.exit(unless_unsent=True)

    RedisLoopClaims.ack_and_claim = functools.wraps(loop_call)(traced_call)  # type: ignore[method-assign]
    loop_cls: Any = asyncio.selector_events.BaseSelectorEventLoop
    sendall: Any = loop_cls.sock_sendall

    async def traced_sendall(self: Any, sock: Any, data: Any) -> Any:
        if not tracker.mine():
            return await sendall(self, sock, data)
        data = bytes(data)
        cmds = _resp_commands(data)
        names = [describe(argv) for _, _, argv in cmds]
        scripts = [i for i, (_, _, argv) in enumerate(cmds) if argv[0].upper() == b"EVALSHA"]
        index = len(tracker.stmts)
        text = " + ".join(names)
        tracker.stmts.append(normalize(text))
        if not scripts or tracker.at == "trace":
            return await sendall(self, sock, data)
        if tracker.at == "before_send":
            tracker.fire("before the script was sent", index, text, via="event loop")
        host, port = sock.getsockname()[:2]
        laddr = f"{host}:{port}"
        if tracker.at == "after_send":
            await sendall(self, sock, data)
            tracker.fire("after the script was sent, before its reply was read", index, text, laddr=laddr,
                         sent_bytes=len(data), via="event loop")
        whole = tracker.cut_after
        assert whole < len(scripts), (whole, names)
        start, end, _ = cmds[scripts[whole]]
        cut = start + (end - start) // 2
        await sendall(self, sock, data[:cut])
        tracker.fire(f"after writing {whole} whole script(s) and half of the next", index, text, laddr=laddr,
                     whole_scripts=whole, sent_bytes=cut, total_bytes=len(data), via="event loop")
        return None

    loop_cls.sock_sendall = traced_sendall


def install(backend: str, plan: dict[str, Any], record: str) -> Tracker:
    tracker = Tracker(plan, record)
    {"sqlite": _install_sqlite, "postgres": _install_postgres, "redis": _install_redis}[backend](tracker)
    return tracker


# -- the scripted cases ---------------------------------------------------------------------------
def _effect(log: str, job: Any) -> str:
    """The side effect of one attempt, in faultapp's format; returns the attempt's result."""
    now = time.time()
    n = int(job.args["n"])
    _append(log, {"e": "done", "n": n, "job": job.id, "attempt": job.attempts, "pid": os.getpid(), "t": now,
                  "t0": now})
    return json.dumps({"n": n, "attempt": job.attempts, "pid": os.getpid()})


def run_case(spec: dict[str, Any]) -> None:
    """Install the hook, build the app, then make the case's store calls (the planned one last)."""
    install(spec["backend"], spec["plan"], spec["record"])
    from harness import client_app

    from conveyor.backends.base import ErrorInfo, Lease, NewJob

    app = client_app(spec["url"])
    backend = app.backend
    if spec["backend"] == "redis":
        # Every script cached on the server first: an EVALSHA the hook cuts must be one that runs.
        for script in backend._transport.scripts.values():  # type: ignore[attr-defined]
            backend._transport.r.script_load(script.script)  # type: ignore[attr-defined]
    op, queue, ns, k = spec["plan"]["op"], spec["queue"], spec["ns"], spec["k"]
    wid, lease = spec["worker_id"], spec["lease"]
    record = spec["record"]
    if op == "enqueue_many":
        jobs = app.tasks["fault.work"].options(queue=queue).enqueue_many([(n,) for n in ns])
        _append(record, {"event": "enqueued", "ids": {str(n): j.id for n, j in zip(ns, jobs, strict=True)}})
    elif op == "cron_enqueue":
        [n] = ns
        new = NewJob(task="fault.work", queue=queue, args=json.dumps({"n": n}), max_attempts=100, timeout=60.0)
        res = backend.cron_enqueue(spec["schedule"], spec["tick"], new)
        assert res is not None and res.created, res
        _append(record, {"event": "enqueued", "ids": {str(n): res.id}})
    elif op == "claim":
        jobs = backend.claim(queue, k, worker_id=wid, lease_s=lease)
        _append(record, {"event": "claimed", "leases": {j.id: [j.lease_token, j.lease_expires_at] for j in jobs}})
    elif op in ("heartbeat", "ack_many", "retry", "release"):
        jobs = backend.claim(queue, k, worker_id=wid, lease_s=lease)
        assert len(jobs) == k, (len(jobs), k)
        _append(record, {"event": "claimed", "leases": {j.id: [j.lease_token, j.lease_expires_at] for j in jobs}})
        leases = [Lease(j.id, j.lease_token or "") for j in jobs]
        if op == "heartbeat":
            # Twice the lease: an extended lease ends a whole lease later than the claim's.
            lost = backend.heartbeat(leases, lease_s=2 * lease)
            assert not lost, lost
        elif op == "release":
            assert sorted(backend.release(leases)) == sorted(j.id for j in jobs)
        elif op == "ack_many":
            backend.ack_many([(x, _effect(spec["log"], j)) for x, j in zip(leases, jobs, strict=True)])
        else:
            [job], [lease_] = jobs, leases
            _effect(spec["log"], job)
            backend.retry(lease_, ErrorInfo("exception", "statement-kill test: the attempt failed", "RuntimeError"),
                          delay=0.0)
    elif op == "reap":
        backend.reap()
    elif op == "promote":
        backend.promote()
    else:
        raise ValueError(op)
    app.close()


def zygote() -> None:
    """Fork a case per JSON line on stdin; answer ``{"pid"}`` at once, then how it ended.

    The modules a case needs are imported here, once (no thread, no connection yet): a case
    then costs a fork, not an interpreter start. The hooks are installed in each child."""
    import harness  # noqa: F401

    import conveyor.backends.postgres
    import conveyor.backends.redis
    import conveyor.backends.sqlite  # noqa: F401

    out = sys.stdout
    for line in sys.stdin:
        spec = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                sys.stdin.close()
                os.dup2(2, 1)  # the pipe to the test is the zygote's alone
                run_case(spec)
            except BaseException:
                _append(spec["record"], {"event": "error", "traceback": traceback.format_exc()})
                code = 2
            finally:
                os._exit(code)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"pid": pid, "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                              "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}) + "\n")
        out.flush()


def worker(plan_json: str, argv: list[str]) -> None:
    """A real ``conveyor`` process (``argv``: its arguments) with the hook installed first."""
    plan = json.loads(plan_json)
    install(plan["backend"], plan, plan["record"])
    from conveyor.cli import main

    sys.argv = ["conveyor", *argv]
    main()


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        zygote()
    elif sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3:])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} zygote | worker '<plan>' <conveyor args>")
