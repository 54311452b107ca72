"""The store's own batched write of exactly what a bulk enqueue stores, with no Conveyor code:
the baseline of the target "bulk enqueue within 2x of the store's raw batched write rate".

Conveyor first stores one job (outside the timing) so the baseline copies a real row: the same
table and indexes (SQLite, PostgreSQL), the same hash and index keys (Redis). Then N copies, with
their own ids and arguments, go in 1000 per batch by the fastest plain means each store has:
``executemany`` in one transaction per batch (SQLite, Conveyor's pragmas), ``COPY`` in one
transaction per batch (PostgreSQL), one pipeline per batch (Redis, no Lua). The row reports as
system ``raw-writes``, scenario ``enqueue_many``: the report's ratio conveyor / raw-writes for
bulk enqueue is the figure the target is about.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from sqlite_bench import BATCH

from harness.common import Row

SYSTEM = "raw-writes"


def _row(n: int, seconds: float, how: str) -> Row:
    return Row(SYSTEM, "enqueue_many", n, n / seconds, note=f"{how}, batches of {BATCH}; no Conveyor code")


def sqlite(tmp: Path, a: argparse.Namespace) -> Row:
    from bench_conveyor_app import make_app
    from sqlite_bench import sqlite_url

    n = a.jobs
    db = tmp / f"raw-{uuid.uuid4().hex[:6]}.db"
    app, noop = make_app(sqlite_url(db))
    template = noop.enqueue(0).id
    app.close()
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")  # Conveyor's default
        conn.row_factory = sqlite3.Row
        row = dict(conn.execute("SELECT * FROM conveyor_jobs WHERE id = ?", [template]).fetchone())
        conn.row_factory = None
        cols = [c for c in row if c not in ("id", "args")]
        sql = (f"INSERT INTO conveyor_jobs (args, {', '.join(cols)}) "
               f"VALUES (?, {', '.join('?' for _ in cols)})")
        rest = [row[c] for c in cols]
        t0 = time.perf_counter()
        for start in range(0, n, BATCH):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(sql, ([f'{{"i":{i}}}', *rest] for i in range(start, min(n, start + BATCH))))
            conn.execute("COMMIT")
        dt = time.perf_counter() - t0
        assert conn.execute("SELECT count(*) FROM conveyor_jobs").fetchone()[0] == n + 1
    return _row(n, dt, "executemany INSERT of the same row into conveyor_jobs, one transaction each")


def postgres(a: argparse.Namespace) -> Row:
    import postgres_bench as pb
    import psycopg
    from bench_conveyor_app import make_app
    from psycopg.rows import dict_row
    from psycopg.types.json import Jsonb

    n = a.jobs
    with pb.fresh_database(a.pg_url, "raw") as url:
        app, noop = make_app(url)
        template = noop.enqueue(0).id
        app.close()
        with psycopg.connect(url, row_factory=dict_row) as conn:
            row = conn.execute("SELECT * FROM conveyor_jobs WHERE id = %s", [template]).fetchone()
            assert row is not None
            conn.commit()
            cols = [c for c in row if c not in ("id", "args")]
            rest = [Jsonb(row[c]) if isinstance(row[c], dict | list) else row[c] for c in cols]
            copy_sql = f"COPY conveyor_jobs (args, {', '.join(cols)}) FROM STDIN"
            t0 = time.perf_counter()
            for start in range(0, n, BATCH):
                with conn.transaction(), conn.cursor() as cur, cur.copy(copy_sql) as copy:
                    for i in range(start, min(n, start + BATCH)):
                        copy.write_row([f'{{"i":{i}}}', *rest])
            dt = time.perf_counter() - t0
            count = conn.execute("SELECT count(*) AS n FROM conveyor_jobs").fetchone()
            assert count is not None and count["n"] == n + 1
    return _row(n, dt, "COPY of the same row into conveyor_jobs, one transaction each")


def redis(a: argparse.Namespace, url: str) -> Row:
    """``url``: a Redis URL with a ``prefix`` of its own; every key under it is deleted after."""
    import redis as redis_py
    from bench_redis_conveyor import make_app

    n = a.jobs
    app, noop, _ = make_app(url)
    template = noop.enqueue(0).id
    app.backend.stats()  # folds the queue's inbox: the template is indexed like the rows below
    p = app.backend.keys.p  # type: ignore[attr-defined]
    app.close()
    r = redis_py.Redis.from_url(url.split("?")[0])
    try:
        fields: dict[Any, Any] = r.hgetall(f"{p}:job:{template}")
        queue = fields[b"queue"].decode()
        member_head = fields[b"m"][:-16]
        q = f"{p}:q:{queue}"
        t0 = time.perf_counter()
        for start in range(0, n, BATCH):
            ids = range(start + 1, min(n, start + BATCH) + 1)
            pipe = r.pipeline(transaction=False)
            pipe.incrby(f"{p}:ids", len(ids))
            for i in ids:
                pipe.hset(f"{p}:job:r{i}", mapping={**fields, b"args": f'{{"i":{i}}}', b"m": member_head + b"%016d" % i})
            by_id = {f"r{i}": i for i in ids}
            pipe.zadd(f"{p}:jobs", by_id)
            pipe.zadd(f"{p}:state:available", by_id)
            pipe.zadd(f"{q}:jobs", by_id)
            pipe.zadd(f"{q}:due", {f"r{i}": float(fields[b"run_at"]) for i in ids})
            pipe.zadd(f"{q}:available", {member_head + b"%016d" % i: float(fields[b"priority"]) for i in ids})
            pipe.sadd(f"{p}:queues", queue)
            pipe.lpush(f"{q}:wake", "1")
            pipe.execute()
        dt = time.perf_counter() - t0
        assert r.zcard(f"{p}:jobs") == n + 1
    finally:
        for key in r.scan_iter(match=f"{p}*", count=1000):
            r.delete(key)
        r.close()
    return _row(n, dt, "one pipeline of the same HSET and ZADDs per batch, no Lua")
