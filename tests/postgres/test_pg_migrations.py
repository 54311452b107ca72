"""PostgreSQL schema migrations: an upgraded store ends at exactly the schema of a new one
(columns, types, defaults, indexes, constraints), whatever version it started from; the online
type change resumes after a crash; concurrent migrators serialize; a lock held by a long
transaction is waited out in short tries instead of one long wait.

The big-table run (statement_timeout, concurrent enqueues, rows/s) is in
tests/scale/test_pg_migration_scale.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from pgschema import build_schema_at, catalog, fill, without_index_names
from stores import postgres_store

from conveyor.backends.base import NewJob
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.postgres import migrate as pg_migrate
from conveyor.cli import cli

ROWS = 3_000


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two fresh schemas: one to upgrade, one migrated from nothing to compare it with."""
    with postgres_store(tmp_path) as url, postgres_store(tmp_path) as fresh_url:
        PostgresBackend(fresh_url).close()
        yield url, fresh_url


def sums(url: str) -> tuple[Any, ...]:
    """Row counts and the text of every stored value, summed as hashes."""
    with psycopg.connect(url) as conn:
        jobs = conn.execute(
            "SELECT count(*), sum(hashtext(args::text)::bigint), sum(hashtext(coalesce(result::text, '-'))::bigint)"
            " FROM conveyor_jobs").fetchone()
        has_steps = conn.execute("SELECT to_regclass('conveyor_steps') IS NOT NULL").fetchone()
        steps = conn.execute("SELECT count(*), sum(hashtext(coalesce(result::text, '-'))::bigint)"
                             " FROM conveyor_steps").fetchone() if has_steps and has_steps[0] else (0, None)
    assert jobs is not None and steps is not None
    return (*jobs, *steps)


def upgrade(url: str) -> int:
    backend = PostgresBackend(url)
    try:
        return backend.schema_version()
    finally:
        backend.close()


@pytest.mark.parametrize("start", [1, 2, 3, 4])
def test_upgraded_schema_equals_a_new_one(pair: tuple[str, str], start: int) -> None:
    """Version 4 here is the store as the first 004 (a table rewrite) left it."""
    url, fresh_url = pair
    build_schema_at(url, start)
    fill(url, ROWS, scheduled=100, running=100, steps=ROWS // 3 if start >= 2 else 0)
    before = sums(url)
    assert upgrade(url) == pg_migrate.LATEST
    assert without_index_names(catalog(url)) == without_index_names(catalog(fresh_url))
    assert sums(url) == before


def test_online_change_resumes_after_a_crash(pair: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, fresh_url = pair
    build_schema_at(url, 3)
    fill(url, ROWS, steps=ROWS // 3)
    before = sums(url)
    monkeypatch.setattr(pg_migrate, "BATCH_ROWS", 500)
    batches: list[str] = []
    real = pg_migrate._retrying

    def counting(conn: Any, what: str, step: Callable[[], Any], **kw: Any) -> Any:
        if what.endswith("backfill"):
            batches.append(what)
            if len(batches) == 3 and crash:
                raise RuntimeError("the migrating process died here")
        return real(conn, what, step, **kw)

    monkeypatch.setattr(pg_migrate, "_retrying", counting)
    crash = True
    with pytest.raises(RuntimeError, match="died here"):
        PostgresBackend(url)
    assert len(batches) == 3  # two batches of conveyor_jobs were committed
    crash = False
    batches.clear()
    assert upgrade(url) == pg_migrate.LATEST
    # The rest of conveyor_jobs (2,000 rows) and all of conveyor_steps (1,000): nothing twice.
    assert batches == ["004_exact_json conveyor_jobs: backfill"] * 4 + ["004_exact_json conveyor_steps: backfill"] * 2
    assert without_index_names(catalog(url)) == without_index_names(catalog(fresh_url))
    assert sums(url) == before


def test_concurrent_migrators_take_turns(pair: tuple[str, str]) -> None:
    url, fresh_url = pair
    build_schema_at(url, 3)
    fill(url, ROWS, steps=ROWS // 3)
    versions: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def run() -> None:
        start.wait()
        try:
            versions.append(upgrade(url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert versions == [pg_migrate.LATEST] * 4
    assert without_index_names(catalog(url)) == without_index_names(catalog(fresh_url))


class _OnLog(logging.Handler):
    """Runs ``action`` when a message containing ``needle`` is logged the ``on``-th time."""

    def __init__(self, needle: str, action: Callable[[], Any], on: int = 2) -> None:
        super().__init__()
        self.needle, self.action, self.on, self.seen = needle, action, on, 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.seen += 1
            if self.seen == self.on:
                self.action()


def test_a_held_lock_is_waited_out_in_short_tries(pair: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction holding conveyor_jobs (a task's long transaction()): the migration's
    ALTER gives up after lock_timeout and tries again, rather than queueing for the lock with
    every enqueue queued behind it; once the transaction ends, the migration goes through."""
    url, fresh_url = pair
    monkeypatch.setattr(pg_migrate, "LOCK_TIMEOUT_MS", 100)
    build_schema_at(url, 3)
    fill(url, ROWS)
    holder = psycopg.connect(url)
    holder.execute("SELECT count(*) FROM conveyor_jobs")  # ACCESS SHARE until commit
    handler = _OnLog("lock busy", holder.commit)
    logger = logging.getLogger("conveyor.postgres.migrate")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        assert upgrade(url) == pg_migrate.LATEST
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        holder.close()
    assert handler.seen >= 2  # tried, gave up, tried again while the lock was still held
    assert without_index_names(catalog(url)) == without_index_names(catalog(fresh_url))


def test_cli_migrate_reports_progress(pair: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = pair
    build_schema_at(url, 3)
    fill(url, ROWS, steps=ROWS // 3)
    monkeypatch.setattr(pg_migrate, "BATCH_ROWS", 1_000)
    result = CliRunner().invoke(cli, ["--url", url, "--log-level", "WARNING", "migrate"])
    assert result.exit_code == 0, result.output
    assert f"conveyor_jobs: {ROWS:,}/{ROWS:,} rows" in result.output
    assert f"conveyor_steps: {ROWS // 3:,}/{ROWS // 3:,} rows" in result.output
    assert f"schema version {pg_migrate.LATEST}" in result.output


def test_an_index_build_that_failed_is_built_again(pair: tuple[str, str]) -> None:
    """CREATE INDEX CONCURRENTLY that fails (lock timeout, crash) leaves an invalid index of
    its name, which IF NOT EXISTS would keep for ever: the next run drops and rebuilds it."""
    url, fresh_url = pair
    build_schema_at(url, 4)
    fill(url, ROWS, scheduled=100)
    with psycopg.connect(url, autocommit=True) as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("CREATE UNIQUE INDEX CONCURRENTLY conveyor_jobs_due ON conveyor_jobs (queue)")
    assert catalog(url)["invalid_indexes"] == [("conveyor_jobs_due",)]
    assert upgrade(url) == pg_migrate.LATEST
    assert without_index_names(catalog(url)) == without_index_names(catalog(fresh_url))


def test_an_index_build_waits_for_a_long_transaction_without_stopping_enqueues(
        pair: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A concurrent index build must wait for the transactions already running (a task's long
    transaction()). It waits with no lock_timeout, since its lock lets writes go on (rather than
    failing, leaving an invalid index and starting over): an enqueue during the wait goes
    through, and the build completes once the transaction ends."""
    url, fresh_url = pair
    monkeypatch.setattr(pg_migrate, "LOCK_TIMEOUT_MS", 50)
    build_schema_at(url, 4)
    fill(url, ROWS, scheduled=100)
    holder = psycopg.connect(url)
    holder.execute("UPDATE conveyor_jobs SET attempt = attempt WHERE id = 1")  # a writer: the build waits for it
    building = threading.Event()
    handler = _OnLog("building index conveyor_jobs_due", building.set, on=1)
    logger = logging.getLogger("conveyor.postgres.migrate")
    busy = _OnLog("lock busy", lambda: None, on=0)
    logger.addHandler(handler)
    logger.addHandler(busy)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    versions: list[int] = []
    migrating = threading.Thread(target=lambda: versions.append(upgrade(url)))
    try:
        migrating.start()
        assert building.wait(60)
        with psycopg.connect(url, autocommit=True) as watcher:
            # The build has waited for the open transaction far longer than the lock_timeout.
            while not busy.seen and not watcher.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX CONCURRENTLY%%'"
                    " AND wait_event_type = 'Lock' AND now() - query_start > interval '500 ms'").fetchone():
                watcher.execute("SELECT pg_sleep(0.05)")
        with psycopg.connect(url, autocommit=True) as producer:
            producer.execute("INSERT INTO conveyor_jobs (queue, task, max_attempts, timeout_s)"
                             " VALUES ('live', 'app.fresh', 1, 60)")
        assert migrating.is_alive()  # the build still waits for the open transaction
        holder.commit()
        migrating.join(60)
    finally:
        logger.removeHandler(handler)
        logger.removeHandler(busy)
        logger.setLevel(old_level)
        holder.close()
    assert busy.seen == 0
    assert versions == [pg_migrate.LATEST]
    assert without_index_names(catalog(url)) == without_index_names(catalog(fresh_url))


def test_job_uids_come_without_a_rewrite_and_old_rows_keep_working(pair: tuple[str, str]) -> None:
    """008 adds the uid column: the table is not rewritten (same file on disk), rows from
    before keep NULL and still take step records and acks; new rows get a uid each."""
    from conveyor.backends.base import Lease
    from conveyor.executor import JobContext

    url, _ = pair
    build_schema_at(url, 4)
    fill(url, ROWS, scheduled=0, running=0)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE conveyor_jobs SET state = 'available', result = NULL, finished_at = NULL,"
                     " queue = 'old' WHERE id <= 2")
        file_before = conn.execute("SELECT relfilenode FROM pg_class WHERE oid = 'conveyor_jobs'::regclass").fetchone()
    backend = PostgresBackend(url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            file_after = conn.execute("SELECT relfilenode FROM pg_class WHERE oid = 'conveyor_jobs'::regclass").fetchone()
            nulls = conn.execute("SELECT count(*) FROM conveyor_jobs WHERE uid IS NULL").fetchone()
        assert file_after == file_before
        assert nulls == (ROWS,)
        old = backend.claim("old", 1, worker_id="w", lease_s=30)[0]
        assert old.uid is None
        assert JobContext(old, backend).once("charge", lambda: "ch_old") == "ch_old"
        backend.ack(Lease(old.id, old.lease_token or ""), None)
        done = backend.get(old.id)
        assert done is not None and done.state == "succeeded" and done.steps == {"charge": "ch_old"}
        made = backend.enqueue_many([NewJob(task="app.work", queue="new", args="{}", max_attempts=1, timeout=5)] * 3)
        uids = {m.uid for m in made}
        assert len(uids) == 3 and all(u is not None and len(u) == 32 for u in uids)
    finally:
        backend.close()
