"""The stores of the fault tests: a fresh SQLite file, or a fresh schema / key prefix on a
*private* PostgreSQL or Redis server that the tests start on their own port and data directory
(never the machine's shared ones). The fixtures are in conftest.py; tests import from here.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import harness  # noqa: F401  (puts the existing rigs on sys.path)
import psycopg
import pytest
from pgrig import PrivatePostgres, with_params
from processrig import Proc, db_write_locked
from redisrig import RedisServer

BACKEND_NAMES = ["sqlite", "postgres", "redis"]


class FaultPostgres(PrivatePostgres):
    """PrivatePostgres with room for a crowd of worker processes (and their killed sessions)."""

    def start(self) -> None:
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base} -c max_connections=300 "
                "-c shared_buffers=32MB")
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile), "-w",
                   "-t", "60", "-o", opts, "start"], timeout=90)


@dataclass
class FaultStore:
    """A fresh store for one test; ``pg``/``redis`` is the private server behind it, if any."""

    name: str
    url: str
    tmp: Path
    sqlite_path: Path | None = None
    pg: FaultPostgres | None = None
    redis: RedisServer | None = None

    def integrity(self) -> str | None:
        """SQLite's ``PRAGMA integrity_check`` (None for the servers)."""
        if self.sqlite_path is None:
            return None
        with contextlib.closing(sqlite3.connect(self.sqlite_path)) as conn:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])

    def with_app_name(self, name: str) -> str:
        """The URL with a PostgreSQL application_name (to find these sessions to kill)."""
        return with_params(self.url, application_name=name) if self.pg is not None else self.url

    def url_for(self, prefix: str) -> Callable[[str], str] | None:
        """For Cluster(url_for=...): on PostgreSQL, each worker's sessions are named ``prefix + name``."""
        if self.pg is None:
            return None
        return lambda name: self.with_app_name(f"{prefix}{name}")

    def pause_guard(self, prefix: str) -> Callable[[Proc], bool] | None:
        """For Nemesis(pause_guard=...): False while the stopped worker holds what every other
        writer waits for (SQLite's write lock; an open PostgreSQL transaction of a session named
        ``prefix + name``). Freezing it then stalls the whole store, which is not the fault meant."""
        if self.sqlite_path is not None:
            path = self.sqlite_path
            return lambda proc: not db_write_locked(path)
        if self.pg is not None:
            url = self.url

            def no_open_transaction(proc: Proc) -> bool:
                with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state <> 'idle'",
                        [f"{prefix}{proc.name}"]).fetchone()
                return row is None or int(row[0]) == 0

            return no_open_transaction
        return None


def ensure_pg(srv: FaultPostgres) -> None:
    if not srv.running():
        srv.start()


def ensure_redis(srv: RedisServer) -> None:
    if srv.proc is None or srv.proc.poll() is not None:
        srv.start()


@contextlib.contextmanager
def private_schema(srv: FaultPostgres) -> Iterator[str]:
    """A new schema on the private server; yields a URL whose search_path is it. Unlike
    pgrig.fresh_schema, no connection is held meanwhile: the test may restart the server."""
    schema = f"fault_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(srv.url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"'.encode())
    try:
        yield with_params(srv.url, options=f"-csearch_path={schema}")
    finally:
        ensure_pg(srv)
        with psycopg.connect(srv.url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(b"SET lock_timeout = '30s'")
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())


@contextlib.contextmanager
def open_fault_store(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FaultStore]:
    if name == "sqlite":
        db = tmp_path / "jobs.db"
        yield FaultStore(name, f"sqlite:///{db}", tmp_path, sqlite_path=db)
    elif name == "postgres":
        srv: FaultPostgres = request.getfixturevalue("private_pg_server")
        ensure_pg(srv)
        with private_schema(srv) as url:
            yield FaultStore(name, url, tmp_path, pg=srv)
    elif name == "redis":
        rsrv: RedisServer = request.getfixturevalue("private_redis_server")
        ensure_redis(rsrv)
        yield FaultStore(name, f"redis://127.0.0.1:{rsrv.port}/0?prefix=f{uuid.uuid4().hex[:10]}", tmp_path,
                         redis=rsrv)
    else:
        raise ValueError(name)


