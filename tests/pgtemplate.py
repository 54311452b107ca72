"""Migrated PostgreSQL stores for the test run: one schema per pytest session is migrated once
(the template) and each test gets a copy of it, made ahead by a background thread.

Migrating a fresh schema ran every migration again for every test, with the online steps'
lock waits and round trips. The copy replays the template's dump (``pg_dump`` of the schema,
its few rows included) in one transaction, which is several times cheaper, and happens before
the test asks for it; the used copies are dropped behind, so a test waits for neither. Without
``pg_dump`` (or one that cannot read the server) each copy is migrated instead, still ahead of
the test. A copy of the whole database (``CREATE DATABASE ... TEMPLATE``) was measured too:
it copies the database's system catalogs as well, and was slower than migrating.

Several pytest sessions may share the server (other checkouts, pytest-xdist workers): every
schema name carries this host, this process's pid and a random token; a session drops only
its own schemas, plus the leftovers of sessions of this host whose process is gone (a session
that was killed never reached its clean-up).

Importable as ``pgtemplate`` (tests/ is on sys.path); stores.py builds
``postgres_migrated_store`` on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

PREFIX = "conveyor_t_"
AHEAD = 2  # copies kept ready: a test takes one while the next is being made
TAKE_TIMEOUT_S = 120.0
# A used copy whose tables a test left locked (a connection still open) is tried again later
# instead of stalling the copies behind it.
DROP_LOCK_TIMEOUT = "2s"

_NAME = re.compile(rf"{PREFIX}([0-9a-f]{{6}})_(\d+)_([0-9a-f]{{6}})_\w+")
Conn = psycopg.Connection[Any]


def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def with_schema(url: str, schema: str) -> str:
    """``url`` with ``schema`` as its search_path, the shape the tests' store URLs have."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


def dump_script(url: str, schema: str) -> str | None:
    """The SQL that recreates ``schema`` and its rows, or None if pg_dump is missing or fails
    (say, older than the server)."""
    pg_dump = shutil.which("pg_dump")
    if pg_dump is None:
        return None
    done = subprocess.run(
        [pg_dump, "--inserts", "--no-owner", "--no-privileges", "--schema", schema, url],
        capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return None
    # psql meta-commands (\restrict) are for psql; the rest is plain SQL.
    return "\n".join(line for line in done.stdout.splitlines() if not line.startswith("\\"))


class TemplateSchema:
    """The session's template schema and the copies made of it."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.pid = os.getpid()
        self.tag = f"{PREFIX}{_host_tag()}_{self.pid}_{secrets.token_hex(3)}"
        self.template = f"{self.tag}_tpl"
        self._script: str | None = None
        self._admin: Conn | None = None
        self._made = 0
        self._ready: list[str] = []
        self._used: list[str] = []
        self._cond = threading.Condition()
        self._closing = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def url(self, schema: str) -> str:
        return with_schema(self.base_url, schema)

    def start(self) -> TemplateSchema:
        """Drop dead sessions' leftovers, migrate the template, start making copies. Raises
        psycopg.OperationalError if the server cannot be reached."""
        from conveyor.backends import open_backend

        self._admin = psycopg.connect(self.base_url, autocommit=True, connect_timeout=3)
        try:
            self._drop_leftovers()
            self._admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.template)))
            # Through the public API, as every test's first open_backend migrated before.
            open_backend(self.url(self.template)).close()
            self._script = dump_script(self.base_url, self.template)
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._run, name="pgtemplate", daemon=True)
        self._thread.start()
        return self

    def take(self) -> str:
        """A fresh copy of the template, for one test."""
        deadline = time.monotonic() + TAKE_TIMEOUT_S
        with self._cond:
            while not self._ready:
                if self._error is not None:
                    raise RuntimeError("copying the template schema failed") from self._error
                if self._closing or time.monotonic() > deadline:
                    raise RuntimeError("no copy of the template schema came")
                self._cond.wait(1.0)
            name = self._ready.pop(0)
            self._cond.notify_all()
            return name

    def give_back(self, name: str) -> None:
        """The test is over: its copy is dropped in the background."""
        with self._cond:
            self._used.append(name)
            self._cond.notify_all()

    def close(self) -> None:
        """Drop every schema of this session. Idempotent; does nothing in a forked child (its
        exit handlers must not drop the stores its parent's tests are using)."""
        if os.getpid() != self.pid:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(60)
        admin, self._admin = self._admin, None
        if admin is None:
            return
        with admin:
            # Every schema of this session's tag, the copies still taken included.
            for name in self._schemas(admin, self.tag + "_"):
                # If it fails, a later session drops it as a dead session's leftover.
                with contextlib.suppress(psycopg.Error):
                    self._drop(admin, name)
            self._ready.clear()
            self._used.clear()

    def _run(self) -> None:
        assert self._admin is not None
        try:
            while True:
                with self._cond:
                    while not self._closing and len(self._ready) >= AHEAD and not self._used:
                        self._cond.wait()
                    if self._closing:
                        return
                    drop = None if len(self._ready) < AHEAD else self._used.pop(0)
                if drop is None:
                    name = self._copy(self._admin)
                    with self._cond:
                        self._ready.append(name)
                        self._cond.notify_all()
                    continue
                try:
                    self._drop(self._admin, drop)
                except psycopg.errors.LockNotAvailable:
                    with self._cond:
                        self._used.append(drop)
        except BaseException as exc:
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _copy(self, admin: Conn) -> str:
        from conveyor.backends import open_backend

        self._made += 1
        name = f"{self.tag}_{self._made}"
        if self._script is None:
            admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
            open_backend(self.url(name)).close()
            return name
        with admin.transaction():
            admin.execute(self._script.replace(self.template, name).encode())
        admin.execute("RESET ALL")  # the dump's SETs (search_path '', timeouts off)
        return name

    @staticmethod
    def _drop(admin: Conn, name: str) -> None:
        with admin.transaction():
            admin.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))

    @staticmethod
    def _schemas(admin: Conn, prefix: str) -> list[str]:
        rows = admin.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s",
                             [prefix.replace("_", r"\_") + "%"]).fetchall()
        return [str(name) for (name,) in rows]

    def _drop_leftovers(self) -> None:
        """Drop the schemas of this host's sessions whose process is gone."""
        assert self._admin is not None
        host, me = _host_tag(), os.getpid()
        for name in self._schemas(self._admin, PREFIX):
            m = _NAME.fullmatch(name)
            if m is None or m[1] != host or name.startswith(self.tag):
                continue
            pid = int(m[2])
            if pid != me and _alive(pid):
                continue
            # Still locked by a straggler: a later session tries again.
            with contextlib.suppress(psycopg.Error):
                self._drop(self._admin, name)
