"""Schema migrations of the PostgreSQL backend, safe on big tables that stay in use.

A migration runs on a connection of its own, outside the pools: without their
``statement_timeout`` (a step may rightly take minutes on millions of rows) and with a short
``lock_timeout``. A statement that needs a lock another transaction holds gives up after
LOCK_TIMEOUT_MS and is tried again after a growing pause, so it never sits in the lock queue
for long with enqueues queued behind it. Many processes may start at once: a session advisory
lock lets one migrate while the others wait for it, then find the work done.

Most migrations are SQL files (``sql/postgres/NNN_name.sql``), each run in one transaction. A
file whose first line is ``-- conveyor: no transaction`` runs statement by statement outside a
transaction, as ``CREATE INDEX CONCURRENTLY`` must. A change of a column's type would rewrite
the table under an exclusive lock, so it is done online instead (:class:`JsonColumns`): new
columns kept in step by a trigger, a backfill in short batches that resumes where it stopped,
a NOT NULL proven by a validated CHECK, and a short switch. Progress goes to the log.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql
from psycopg.rows import dict_row

from ...errors import StoreError
from ..sql import migration_files, split_statements

log = logging.getLogger("conveyor.postgres.migrate")

LOCK_TIMEOUT_MS = 1_000  # longest wait for a lock: enqueues queued behind it wait this long at most
LOCK_TRIES = 60  # then the migration fails with an error naming the step
MAX_PAUSE_S = 10.0  # longest pause between two tries
BATCH_ROWS = 5_000  # rows per backfill transaction: each holds its rows' locks briefly
PROGRESS_EVERY_S = 1.0
LOCK = "hashtext('conveyor_migrate:' || current_schema())"
NO_TRANSACTION = "-- conveyor: no transaction"
_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I)

T = TypeVar("T")
Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class JsonColumns:
    """Change ``columns`` of ``table`` from jsonb to json without rewriting it under a lock.

    ``key`` is the table's primary key (the backfill walks it); ``not_null`` and ``defaults``
    are what the columns had and keep."""

    table: str
    key: tuple[str, ...]
    columns: tuple[str, ...]
    not_null: tuple[str, ...] = ()
    defaults: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    script: str = ""
    online: tuple[JsonColumns, ...] = ()

    @property
    def transactional(self) -> bool:
        return not self.script.startswith(NO_TRANSACTION)


# Arguments, results and step results keep the JSON text as written: json, not jsonb. jsonb
# stores numbers as numeric and prints them back normalized (the float 4.15369378901283e+16
# came back as the integer 41536937890128300), so a task saw other values than it was given on
# SQLite and Redis. Nothing queries inside these columns (errors and meta, which the store does
# edit, stay jsonb). Values stored before keep their normalized text. Shipped first as one
# ALTER TYPE, which rewrote conveyor_jobs under an exclusive lock; stores that ran it have the
# same columns, types and defaults (only the columns' order differs).
EXACT_JSON = (
    JsonColumns("conveyor_jobs", ("id",), ("args", "result"), not_null=("args",),
                defaults=(("args", "'{}'"),)),
    JsonColumns("conveyor_steps", ("job_id", "step"), ("result",)),
)


def migrations() -> list[Migration]:
    found = [Migration(v, name, script) for v, name, script in migration_files("postgres")]
    found.append(Migration(4, "004_exact_json", online=EXACT_JSON))
    found.sort(key=lambda m: m.version)
    for a, b in itertools.pairwise(found):
        if a.version == b.version:
            raise RuntimeError(
                f"two PostgreSQL migrations numbered {a.version:03d}: {a.name}, {b.name}")
    return found


MIGRATIONS = migrations()
LATEST = MIGRATIONS[-1].version


def migrate(conninfo: str) -> None:
    """Bring the schema of ``conninfo``'s search_path to LATEST (or wait for whoever does)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # Session settings of this connection only: the pools keep their statement_timeout.
        conn.execute("SET statement_timeout = 0")
        conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
        conn.execute("SET idle_in_transaction_session_timeout = 0")
        _wait_for_lock(conn)
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS conveyor_schema_migrations ("
                         " version integer PRIMARY KEY,"
                         " applied_at timestamptz NOT NULL DEFAULT now())")
            applied = {version for (version,) in
                       conn.execute("SELECT version FROM conveyor_schema_migrations")}
            for m in MIGRATIONS:
                if m.version in applied:
                    continue
                started = time.monotonic()
                if m.online:
                    _online(conn, m)
                elif m.transactional:
                    _retrying(conn, m.name, partial(_run_script, conn, m))
                else:
                    _outside_transaction(conn, m)
                log.info("applied PostgreSQL migration %s in %.1fs", m.name,
                         time.monotonic() - started)
        finally:
            with suppress(psycopg.Error):  # a broken session has let go of it already
                conn.execute(f"SELECT pg_advisory_unlock({LOCK})")


def _record(conn: Conn, m: Migration) -> None:
    conn.execute("INSERT INTO conveyor_schema_migrations (version) VALUES (%s)", [m.version])


def _run_script(conn: Conn, m: Migration) -> None:
    conn.execute(m.script.encode())  # bytes: run as one multi-statement script
    _record(conn, m)


def _wait_for_lock(conn: Conn) -> None:
    """The session lock, polled: a process waiting for another's long migration says so."""
    said = time.monotonic()
    pause = 0.05
    while not _one(conn, f"SELECT pg_try_advisory_lock({LOCK})"):
        if time.monotonic() - said > 10:
            log.info("waiting for another process to finish migrating the schema")
            said = time.monotonic()
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def _one(conn: Conn, query: str | sql.Composed, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def _retrying(conn: Conn, what: str, step: Callable[[], T], *, transaction: bool = True) -> T:
    """Run ``step`` (in a transaction of its own), again after a pause each time a lock was not
    had within the lock_timeout or a deadlock chose it."""
    pause = 0.1
    for attempt in range(1, LOCK_TRIES + 1):
        try:
            if not transaction:
                return step()
            with conn.transaction():
                return step()
        except (pgerrors.LockNotAvailable, pgerrors.DeadlockDetected) as exc:
            if attempt == LOCK_TRIES:
                raise StoreError(
                    f"PostgreSQL migration {what}: no lock after {LOCK_TRIES} tries of "
                    f"{LOCK_TIMEOUT_MS} ms (a long transaction holds the table? see "
                    f"pg_stat_activity): {str(exc).strip()}") from exc
            log.info("migration %s: lock busy, trying again in %.1fs", what, pause)
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, MAX_PAUSE_S)
    raise AssertionError("unreachable")


def _outside_transaction(conn: Conn, m: Migration) -> None:
    for statement in split_statements(m.script):
        index = _CONCURRENT_INDEX.search(statement)
        if index:
            build = partial(_build_index, conn, statement, index.group(1))
            _retrying(conn, m.name, build, transaction=False)
        else:
            _retrying(conn, m.name, partial(conn.execute, statement.encode()), transaction=False)
    _record(conn, m)


def _build_index(conn: Conn, statement: str, name: str) -> None:
    # A build that failed (crash, cancel) leaves an invalid index that IF NOT EXISTS would
    # keep: drop it and build again.
    invalid = _one(conn, "SELECT NOT i.indisvalid FROM pg_index i"
                         " WHERE i.indexrelid = to_regclass(%s)", [name])
    # No lock_timeout here: a concurrent build waits for the transactions already running to
    # end, but its lock lets reads and writes (and so enqueues) go on meanwhile.
    conn.execute("SET lock_timeout = 0")
    try:
        if invalid:
            conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(
                sql.Identifier(name)))
        log.info("building index %s (concurrently: writes go on)", name)
        conn.execute(statement.encode())
    finally:
        conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")


# -- online type change -------------------------------------------------------------------------

def _online(conn: Conn, m: Migration) -> None:
    for spec in m.online:
        _json_columns(conn, m, spec)

    def finish() -> None:
        _record(conn, m)
        if _one(conn, "SELECT to_regclass('conveyor_migration_progress') IS NOT NULL"):
            conn.execute("DELETE FROM conveyor_migration_progress WHERE version = %s", [m.version])
            if not _one(conn, "SELECT count(*) FROM conveyor_migration_progress"):
                conn.execute("DROP TABLE conveyor_migration_progress")
    _retrying(conn, m.name, finish)


def _column_type(conn: Conn, table: str, column: str) -> str | None:
    found = _one(conn, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                       " WHERE attrelid = to_regclass(%s)"
                       " AND attname = %s AND attnum > 0 AND NOT attisdropped", [table, column])
    return None if found is None else str(found)


def _json_columns(conn: Conn, m: Migration, spec: JsonColumns) -> None:
    first = spec.columns[0]
    if _column_type(conn, spec.table, first + "_json") is None:
        if _column_type(conn, spec.table, first) == "json":
            return  # switched already (a run that stopped after this table)
        if _retrying(conn, f"{m.name} {spec.table}: add columns", lambda: _prepare(conn, spec)):
            return  # the table was empty: switched at once
    _backfill(conn, m, spec)
    t = sql.Identifier(spec.table)
    for column in spec.not_null:
        check = sql.Identifier(f"{spec.table}_{column}_json_not_null")
        if not _one(conn, "SELECT 1 FROM pg_constraint"
                          " WHERE conrelid = to_regclass(%s) AND conname = %s",
                    [spec.table, f"{spec.table}_{column}_json_not_null"]):
            # Added only now: a NOT VALID check still holds every updated row to it.
            _retrying(conn, f"{m.name} {spec.table}.{column}: check", partial(conn.execute, sql.SQL(
                "ALTER TABLE {} ADD CONSTRAINT {} CHECK ({} IS NOT NULL) NOT VALID").format(
                    t, check, sql.Identifier(column + "_json"))))
        log.info("migration %s: %s: proving %s has no NULL", m.name, spec.table, column)
        # Scans the table under a lock that lets reads and writes go on; SET NOT NULL then
        # trusts the validated check instead of scanning under an exclusive lock.
        _retrying(conn, f"{m.name} {spec.table}.{column}: validate", partial(
            conn.execute, sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(t, check)))
    _retrying(conn, f"{m.name} {spec.table}: switch", lambda: _switch(conn, spec))


def _sync_function(spec: JsonColumns) -> sql.Identifier:
    return sql.Identifier(f"{spec.table}_json_sync")


def _prepare(conn: Conn, spec: JsonColumns) -> bool:
    """Add the new columns and their trigger; on an empty table (a new store), switch at once
    in the same transaction (whether it did)."""
    t, fn = sql.Identifier(spec.table), _sync_function(spec)
    conn.execute(sql.SQL("ALTER TABLE {} ").format(t) + sql.SQL(", ").join(
        sql.SQL("ADD COLUMN {} json").format(sql.Identifier(c + "_json")) for c in spec.columns))
    # The ALTER's lock keeps the table empty until this transaction ends.
    if not _one(conn, sql.SQL("SELECT EXISTS (SELECT FROM {})").format(t)):
        _switch(conn, spec, checked=False)
        return True
    # Writes during the backfill keep the new columns in step; rows before it get the backfill.
    sets = sql.SQL(" ").join(
        sql.SQL("NEW.{} := NEW.{}::json;").format(sql.Identifier(c + "_json"), sql.Identifier(c))
        for c in spec.columns)
    conn.execute(sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql"
                         " AS $$ BEGIN {} RETURN NEW; END $$").format(fn, sets))
    conn.execute(sql.SQL("CREATE TRIGGER {} BEFORE INSERT OR UPDATE OF {} ON {}"
                         " FOR EACH ROW EXECUTE FUNCTION {}()")
                 .format(fn, sql.SQL(", ").join(map(sql.Identifier, spec.columns)), t, fn))
    return False


def _backfill(conn: Conn, m: Migration, spec: JsonColumns) -> None:
    """Copy the old columns into the new ones in key order, BATCH_ROWS per transaction, up to
    the largest key present once the trigger was there (later rows have the trigger's copy).
    The position is committed with each batch: a run that stopped resumes after it."""
    t, keys = sql.Identifier(spec.table), sql.SQL(", ").join(map(sql.Identifier, spec.key))
    step = spec.table
    conn.execute("CREATE TABLE IF NOT EXISTS conveyor_migration_progress ("
                 " version integer NOT NULL, step text NOT NULL, position jsonb, upper jsonb,"
                 " done bigint NOT NULL DEFAULT 0, PRIMARY KEY (version, step))")
    marks = sql.SQL(", ").join([sql.Placeholder()] * len(spec.key))
    with conn.transaction():
        conn.execute("INSERT INTO conveyor_migration_progress (version, step) VALUES (%s, %s)"
                     " ON CONFLICT DO NOTHING", [m.version, step])
        with conn.cursor(row_factory=dict_row) as cur:
            progress = cur.execute("SELECT position, upper, done FROM conveyor_migration_progress"
                                   " WHERE version = %s AND step = %s FOR UPDATE",
                                   [m.version, step]).fetchone()
        assert progress is not None
        position, upper, done = progress["position"], progress["upper"], progress["done"]
        if upper is None:
            newest_first = sql.SQL(", ").join(
                sql.SQL("{} DESC").format(sql.Identifier(k)) for k in spec.key)
            last = conn.execute(sql.SQL("SELECT {} FROM {} ORDER BY {} LIMIT 1").format(
                keys, t, newest_first)).fetchone()
            upper = list(last) if last else []
            conn.execute("UPDATE conveyor_migration_progress SET upper = %s"
                         " WHERE version = %s AND step = %s",
                         [json.dumps(upper), m.version, step])
    if not upper:
        return  # an empty table
    below_upper = sql.SQL("({}) <= ({})").format(keys, marks)
    total = int(_one(conn, sql.SQL("SELECT count(*) FROM {} WHERE ").format(t) + below_upper,
                     upper))
    copy = sql.SQL(", ").join(
        sql.SQL("{} = {}::json").format(sql.Identifier(c + "_json"), sql.Identifier(c))
        for c in spec.columns)
    said = 0.0

    def batch() -> tuple[list[Any], int]:
        after = (sql.SQL("({}) > ({})").format(keys, marks) if position is not None
                 else sql.SQL("true"))
        lower = list(position) if position is not None else []
        end = conn.execute(
            sql.SQL("SELECT {} FROM {} WHERE {} AND {} ORDER BY {} OFFSET %s LIMIT 1").format(
                keys, t, after, below_upper, keys), [*lower, *upper, BATCH_ROWS - 1]).fetchone()
        stop = list(end) if end else upper
        cur = conn.execute(sql.SQL("UPDATE {} SET {} WHERE {} AND ({}) <= ({})").format(
            t, copy, after, keys, marks), [*lower, *stop])
        conn.execute("UPDATE conveyor_migration_progress SET position = %s, done = done + %s"
                     " WHERE version = %s AND step = %s",
                     [json.dumps(stop), cur.rowcount, m.version, step])
        return stop, cur.rowcount

    while position is None or list(position) != list(upper):
        position, n = _retrying(conn, f"{m.name} {step}: backfill", batch)
        done += n
        if time.monotonic() - said >= PROGRESS_EVERY_S or list(position) == list(upper):
            log.info("migration %s: %s: %s/%s rows", m.name, step, f"{min(done, total):,}",
                     f"{total:,}")
            said = time.monotonic()


def _switch(conn: Conn, spec: JsonColumns, *, checked: bool = True) -> None:
    """Put the new columns in the old ones' place. ``checked``: the trigger and the validated
    NOT NULL checks exist (else the table is empty and has neither)."""
    t, fn = sql.Identifier(spec.table), _sync_function(spec)
    if checked:
        conn.execute(sql.SQL("DROP TRIGGER {} ON {}").format(fn, t))
        conn.execute(sql.SQL("DROP FUNCTION {}()").format(fn))
    conn.execute(sql.SQL("ALTER TABLE {} ").format(t) + sql.SQL(", ").join(
        sql.SQL("DROP COLUMN {}").format(sql.Identifier(c)) for c in spec.columns))
    for c in spec.columns:
        conn.execute(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
            t, sql.Identifier(c + "_json"), sql.Identifier(c)))
    for c, default in spec.defaults:
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT ").format(
            t, sql.Identifier(c)) + sql.SQL(default))  # a literal of this module, not input
    for c in spec.not_null:
        # Trusts the validated check: no scan. The check goes after, in a statement of its own
        # (dropped in the same ALTER, it would go first and the NOT NULL would scan).
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET NOT NULL").format(
            t, sql.Identifier(c)))
        if checked:
            conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                t, sql.Identifier(f"{spec.table}_{c}_json_not_null")))
