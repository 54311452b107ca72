"""A store migrated under running processes: a release that adds a column to conveyor_jobs
is migrated by the first process of the new release while the old release's workers still
run. psycopg prepares a statement after a few runs, and PostgreSQL refuses a prepared
statement whose result type changed ("cached plan must not change result type"), so every
statement returning whole job rows must name its columns."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from pgrig import fresh_schema
from support import new_job

from conveyor.backends.base import Lease
from conveyor.backends.postgres import PostgresBackend


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


def test_claims_acks_and_reads_survive_a_column_added_under_them(pg_url: str) -> None:
    backend = PostgresBackend(pg_url)
    try:
        def round_trip() -> None:
            backend.enqueue_many([new_job() for _ in range(2)])
            jobs = backend.claim("default", 2, worker_id="w", lease_s=30)
            assert len(jobs) == 2
            assert backend.get(jobs[0].id) is not None
            assert backend.list_jobs(limit=5)
            follow = backend.ack_and_claim([(Lease(jobs[0].id, jobs[0].lease_token or ""), "1")],
                                           "default", 1, worker_id="w", lease_s=30)
            assert follow is not None
            backend.ack(Lease(jobs[1].id, jobs[1].lease_token or ""), "2")

        for _ in range(8):  # past psycopg's prepare threshold on every connection used
            round_trip()
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("ALTER TABLE conveyor_jobs ADD COLUMN added_by_a_later_release text")
        for _ in range(8):
            round_trip()
    finally:
        backend.close()
