"""Production shape: upgrading a PostgreSQL store that holds a big table.

A store at schema version 3 (before the json columns) holds many jobs and step records. The
backend migrates it while producers keep enqueueing, with the pool's statement_timeout set far
below what a rewrite of the table takes: the migration must not be subject to it, must not hold
a lock that stops enqueues for long, and must end at exactly the schema of a fresh install,
with every value kept.
"""

from __future__ import annotations

import logging
import re
import time

import psycopg
import pytest
from pgschema import Producers, build_schema_at, catalog, fill, without_index_names
from scalekit import report, size
from stores import postgres_store

from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.postgres import connection as pg_connection

ROWS = size(200_000, 1_000_000)
STEPS = ROWS // 10


def _checksum(url: str, top_id: int) -> tuple[int, int, int]:
    """The text of every pre-existing value, summed as hashes: equal before and after means
    the migration kept each one as PostgreSQL printed it."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT sum(hashtext(args::text)::bigint), sum(hashtext(coalesce(result::text, '-'))::bigint),"
            " (SELECT sum(hashtext(coalesce(result::text, '-'))::bigint) FROM conveyor_steps)"
            " FROM conveyor_jobs WHERE id <= %s", [top_id]).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


@pytest.mark.timeout(3600)
def test_pg_migration_of_a_big_table_while_enqueueing(tmp_path, monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, logger="conveyor.postgres")
    with postgres_store(tmp_path) as url, postgres_store(tmp_path) as fresh_url:
        build_schema_at(url, 3)
        fill(url, ROWS, scheduled=ROWS // 10, running=ROWS // 10, steps=STEPS)
        before = _checksum(url, ROWS)
        # Far below what rewriting the table takes: a migration run under it is cancelled.
        monkeypatch.setattr(pg_connection, "STATEMENT_TIMEOUT_MS", 300)
        producers = Producers(url, threads=2).start()
        try:
            assert producers.writing.wait(30)  # they are writing when the migration starts
            t0 = time.monotonic()
            backend = PostgresBackend(url)
            took = time.monotonic() - t0
        finally:
            producers.stop()
        try:
            assert producers.errors == []
            assert producers.enqueued, "the producers enqueued nothing"
            fresh = PostgresBackend(fresh_url)
            latest = fresh.schema_version()
            fresh.close()
            assert backend.schema_version() == latest
            for job_id in producers.enqueued[:: max(1, len(producers.enqueued) // 50)]:
                job = backend.get(job_id)
                assert job is not None and job.task == "app.fresh"
            with psycopg.connect(url) as conn:
                counted = conn.execute("SELECT count(*) FROM conveyor_jobs").fetchone()
            assert counted is not None and counted[0] == ROWS + len(producers.enqueued)
            assert _checksum(url, ROWS) == before
        finally:
            backend.close()
        assert without_index_names(catalog(url)) == without_index_names(catalog(fresh_url))
    # Progress went to the log, and the last word on each table is all its rows.
    progress = [m.groups() for r in caplog.records
                if (m := re.search(r"(conveyor_\w+): ([\d,]+)/([\d,]+) rows", r.getMessage()))]
    last = {table: (done, total) for table, done, total in progress}
    assert set(last) == {"conveyor_jobs", "conveyor_steps"}, progress
    assert all(done == total for done, total in last.values()), progress
    assert int(last["conveyor_jobs"][1].replace(",", "")) >= ROWS
    report("pg_migration_big_table", "postgres", rows=ROWS, steps=STEPS, migration_s=round(took, 1),
           rows_per_s=round(ROWS / took), longest_enqueue_s=round(producers.longest_s, 3),
           enqueues_during=len(producers.enqueued),
           lock_retries=sum("lock busy" in r.getMessage() for r in caplog.records))
