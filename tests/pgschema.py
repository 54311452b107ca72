"""PostgreSQL schemas for migration tests: a schema stopped at an old version, filled fast with
generate_series, a catalog to compare schemas by, and producers that enqueue through the
backend's own enqueue statement while something else (a migration) holds the store.

Importable as ``pgschema`` (tests/ is on sys.path)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from conveyor.backends.base import NewJob
from conveyor.backends.postgres import CHANNEL, ENQUEUE_ONE, _insert_params
from conveyor.backends.sql import load_migrations

# The enqueue statement as producers of a version before job uids (migration 008) send it: the
# current one returns the uid column, which a store being upgraded does not have yet. Newer
# processes migrate before they enqueue; older ones go on writing during the migration.
# The enqueue of a version before job uids and before the waiting state (whose unique index
# covers three states: migration 012 added 'waiting'), as such a producer still sends it.
PRE_UID_ENQUEUE_ONE = (ENQUEUE_ONE.replace(b"ins.uid, ", b"").replace(b"RETURNING id, uid, ", b"RETURNING id, ")
                       .replace(b"state IN ('waiting', 'scheduled', 'available', 'running')",
                                b"state IN ('scheduled', 'available', 'running')"))
assert PRE_UID_ENQUEUE_ONE.count(b"uid") == 0
assert PRE_UID_ENQUEUE_ONE.count(b"'waiting'") == 0

# The scripts of the versions a user may still be at (version 3 is the last one before the
# json columns); these files never change once shipped.
OLD_SCRIPTS = {version: script for version, script in load_migrations("postgres") if version <= 3}

# Migration 004 as it shipped first: one ALTER TYPE that rewrote conveyor_jobs under an
# exclusive lock. Users who ran it are at version 4 with this schema; the online 004 must end
# at the same columns, types, defaults and constraints.
LEGACY_004 = """
ALTER TABLE conveyor_jobs
    ALTER COLUMN args DROP DEFAULT,
    ALTER COLUMN args TYPE json USING args::json,
    ALTER COLUMN args SET DEFAULT '{}',
    ALTER COLUMN result TYPE json USING result::json;
ALTER TABLE conveyor_steps ALTER COLUMN result TYPE json USING result::json;
"""


def build_schema_at(url: str, version: int) -> None:
    """Create the schema of ``url`` as the migrations up to ``version`` left it (version 4 =
    the legacy rewrite), recorded in conveyor_schema_migrations."""
    scripts = {**OLD_SCRIPTS, 4: LEGACY_004}
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute("CREATE TABLE conveyor_schema_migrations ("
                     " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        for v in range(1, version + 1):
            conn.execute(scripts[v].encode())
            conn.execute("INSERT INTO conveyor_schema_migrations (version) VALUES (%s)", [v])


def fill(url: str, rows: int, *, scheduled: int = 0, running: int = 0, steps: int = 0) -> None:
    """Insert ``rows`` jobs in one statement: ``scheduled`` due over the next hour, ``running``
    with leases expiring over the hour around now, the rest succeeded with a result; and one
    step record for each of the first ``steps`` jobs."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO conveyor_jobs (queue, task, args, state, run_at, attempt, max_attempts,
                                       timeout_s, lease_token, lease_expires_at, worker_id,
                                       result, attempted_at, finished_at)
            SELECT 'q' || (g %% 8), 'app.work',
                   ('{"n": ' || g || ', "f": 4.15369378901283e+16}')::jsonb,
                   s.state,
                   CASE WHEN s.state = 'scheduled' THEN now() + (g %% 3600) * interval '1 second'
                        ELSE now() - interval '2 hours' END,
                   CASE WHEN s.state = 'scheduled' THEN 0 ELSE 1 END, 3, 60,
                   CASE WHEN s.state = 'running' THEN md5(g::text) END,
                   CASE WHEN s.state = 'running'
                        THEN now() + ((g %% 3600) - 1800) * interval '1 second' END,
                   CASE WHEN s.state = 'running' THEN 'w' || (g %% 48) END,
                   CASE WHEN s.state = 'succeeded' THEN ('{"ok": ' || g || '}')::jsonb END,
                   CASE WHEN s.state <> 'scheduled' THEN now() - interval '1 hour' END,
                   CASE WHEN s.state = 'succeeded' THEN now() - interval '30 minutes' END
            FROM generate_series(1, %(rows)s::int) AS g,
                 LATERAL (SELECT CASE WHEN g <= %(scheduled)s::int THEN 'scheduled'
                                      WHEN g <= %(scheduled)s::int + %(running)s::int THEN 'running'
                                      ELSE 'succeeded' END AS state) AS s
            """, {"rows": rows, "scheduled": scheduled, "running": running})
        if steps:
            conn.execute(
                "INSERT INTO conveyor_steps (job_id, step, result)"
                " SELECT id, 'charge', ('{\"paid\": ' || id || '}')::jsonb FROM conveyor_jobs"
                " ORDER BY id LIMIT %s", [steps])
        conn.execute("ANALYZE conveyor_jobs")
        if steps:
            conn.execute("ANALYZE conveyor_steps")


def catalog(url: str) -> dict[str, Any]:
    """What a schema is made of, independent of object ids and column order: columns (type,
    null, default), constraints, indexes, triggers, functions and tables of its search_path."""
    with psycopg.connect(url, autocommit=True) as conn:
        def rows(sql: str) -> list[tuple[Any, ...]]:
            return sorted(tuple(r) for r in conn.execute(sql))
        return {
            "tables": rows("SELECT c.relname, c.relkind FROM pg_class c"
                           " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'S', 'v')"),
            "columns": rows("SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, ''),"
                            " is_identity FROM information_schema.columns WHERE table_schema = current_schema()"),
            "constraints": rows("SELECT conrelid::regclass::text, conname, contype, convalidated,"
                                " pg_get_constraintdef(oid) FROM pg_constraint"
                                " WHERE connamespace = current_schema()::regnamespace"),
            "indexes": rows("SELECT tablename, indexname, indexdef FROM pg_indexes"
                            " WHERE schemaname = current_schema()"),
            "invalid_indexes": rows("SELECT indexrelid::regclass::text FROM pg_index i JOIN pg_class c"
                                    " ON c.oid = i.indexrelid WHERE NOT i.indisvalid"
                                    " AND c.relnamespace = current_schema()::regnamespace"),
            "triggers": rows("SELECT tgrelid::regclass::text, tgname FROM pg_trigger t JOIN pg_class c"
                             " ON c.oid = t.tgrelid WHERE NOT t.tgisinternal"
                             " AND c.relnamespace = current_schema()::regnamespace"),
            "functions": rows("SELECT proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace"),
        }


def without_index_names(cat: dict[str, Any]) -> dict[str, Any]:
    """The catalog with schema names stripped from index definitions (each test has its own)."""
    out = dict(cat)
    out["indexes"] = [(t, n, d.split(" USING ", 1)[1]) for t, n, d in cat["indexes"]]
    return out


@dataclass
class Producers:
    """Threads enqueueing one plain job at a time through the backend's own statement (as it was
    before job uids: see PRE_UID_ENQUEUE_ONE), each on its own connection, until stopped; every call's wall time and error is kept."""

    url: str
    threads: int = 2
    enqueued: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    longest_s: float = 0.0
    writing: threading.Event = field(default_factory=threading.Event)  # set at the first enqueue
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _running: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Producers:
        for n in range(self.threads):
            t = threading.Thread(target=self._produce, args=(n,), daemon=True)
            t.start()
            self._running.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._running:
            t.join(60)

    def _produce(self, n: int) -> None:
        job = NewJob(task="app.fresh", queue="live", args=f'{{"producer": {n}, "f": 4.15369378901283e+16}}',
                     max_attempts=3, timeout=60.0)
        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row) as conn:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    row = conn.execute(PRE_UID_ENQUEUE_ONE,
                                       {**_insert_params(job, None, None), "channel": CHANNEL}).fetchone()
                except psycopg.Error as exc:
                    with self._lock:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                took = time.monotonic() - t0
                with self._lock:
                    self.longest_s = max(self.longest_s, took)
                    assert row is not None
                    self.enqueued.append(int(row["id"]))
                self.writing.set()
                time.sleep(0.005)
