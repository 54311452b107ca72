"""A big batch of plain jobs goes into PostgreSQL by COPY (enqueue._plain_copy_plan): the rows it
writes are the rows the one-statement path (insert_plain) writes, but for their ids and uids.

Each test that compares the two paths runs the same batch through both, switching the path by
``COPY_MIN_JOBS``, and reads the rows back with SQL.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pgrig import fresh_schema
from psycopg.rows import dict_row
from support import T0, new_job

from conveyor import ConveyorError, QueueFull
from conveyor.backends.base import NewBatch, NewJob
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.postgres import enqueue as pg_enqueue
from conveyor.backends.postgres.queries import Q

BIG = 300  # over COPY_MIN_JOBS
# Every column an enqueue writes, but the two each job gets anew (id, uid).
COLUMNS = ("queue, task, args::text AS args, state, priority, run_at, attempt, max_attempts, "
           "timeout_s, unique_key, errors::text AS errors, meta::text AS meta, created_at, "
           "fair_key, fair_tag, unique_for, concurrency_key, concurrency_limit, rate_key, "
           "rate_limit, rate_period, parents, on_parent_failure, batch_id, callback_of, stalls, "
           "waited, has_children, lease_token, worker_id, attempted_at, finished_at")
AWKWARD = [
    {"s": 'tab \t newline \n return \r backslash \\ quote " slash /'},
    {"s": "\\N", "t": "\\.", "u": "é ü 漢字 😀 \u2028 \u2029 \x7f", "esc": "\\u0041"},
    {"big": 2**63 - 1, "f": 1e308, "tiny": 5e-324, "z": -0.0, "n": None, "e": [], "o": {}},
]


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture
def backend(pg_url: str) -> Iterator[PostgresBackend]:
    b = PostgresBackend(pg_url)
    yield b
    b.close()


def mixed_batch(n: int) -> list[NewJob]:
    """Plain jobs in runs of alike ones and single ones: queues, priorities, due and not yet,
    limits, meta, and args that COPY's text format must escape."""
    kinds: list[dict[str, Any]] = [
        {}, {"queue": "q2", "priority": 3}, {"delay": 30.0}, {"run_at": T0 - 5},
        {"run_at": T0 + 60.5, "meta": '{"m": "a\\tb"}'}, {"concurrency_key": "c\\k", "concurrency_limit": 2},
        {"rate_key": "r\tk", "rate_limit": 3, "rate_period": 1.5, "timeout": 4.25, "max_attempts": 7},
        {"task": "t.other", "queue": "q\\3", "priority": -2},
    ]
    jobs = []
    for i in range(n):
        kind = kinds[(i // 7) % len(kinds)] if i % 11 else kinds[i % len(kinds)]
        args = json.dumps({**AWKWARD[i % len(AWKWARD)], "i": i}, ensure_ascii=False)
        jobs.append(NewJob(**{"task": "t.task", "queue": "default", "max_attempts": 3,
                              "timeout": 30.0, **kind, "args": args}))
    return jobs


def rows(url: str, ids: list[int]) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        found = conn.execute(f"SELECT id, {COLUMNS} FROM conveyor_jobs WHERE id = ANY(%s) ORDER BY id",
                             [ids]).fetchall()
    by_id = {r.pop("id"): r for r in found}
    return [by_id[i] for i in ids]


def enqueue_by(path: str, backend: PostgresBackend, jobs: list[NewJob], monkeypatch: pytest.MonkeyPatch,
               **kw: Any) -> list[Any]:
    monkeypatch.setattr(pg_enqueue, "COPY_MIN_JOBS", 2 if path == "copy" else 10**9)
    return backend.enqueue_many(jobs, **kw)


def test_a_big_plain_batch_is_one_copy_after_one_read_of_the_clock_and_ids() -> None:
    jobs = [new_job(args={"i": i}) for i in range(pg_enqueue.COPY_MIN_JOBS)]
    plan = pg_enqueue._plain_batch_plan(jobs, T0)
    assert next(plan).fetch == "can_copy"
    first = plan.send(True)
    assert first.sql == Q["plain_copy_values"] and first.params["n"] == len(jobs)
    reply = {"ids": list(range(1, len(jobs) + 1)), "created_at": "2023-11-14 22:13:20+00", "at": T0,
             "states": ["available"], "run_ats": ["2023-11-14 22:13:20+00"], "fair_tags": [1]}
    copy = plan.send(reply)
    assert copy.fetch == "copy" and copy.sql.startswith("COPY conveyor_jobs (id, args, uid,")
    lines = copy.params.splitlines()
    assert [line.split("\t")[:2] for line in lines] == [[str(i + 1), f'{{"i": {i}}}'] for i in range(len(jobs))]
    notify = plan.send(None)
    assert notify.sql == Q["notify"] and notify.params["queues"] == ["default"]
    with pytest.raises(StopIteration) as done:
        plan.send(None)
    assert [r.id for r in done.value.value] == reply["ids"]
    # Below the threshold, or on a connection that cannot COPY now: the one statement.
    small = pg_enqueue._plain_batch_plan(jobs[:pg_enqueue.COPY_MIN_JOBS - 1], T0)
    assert next(small).sql == Q["insert_plain"]
    refused = pg_enqueue._plain_batch_plan(jobs, T0)
    assert next(refused).fetch == "can_copy" and refused.send(False).sql == Q["insert_plain"]


def test_copy_writes_the_rows_the_one_statement_writes(
        backend: PostgresBackend, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = mixed_batch(BIG)
    by_json = enqueue_by("json", backend, jobs, monkeypatch, now=T0)
    by_copy = enqueue_by("copy", backend, jobs, monkeypatch, now=T0)
    assert [(r.created, r.at) for r in by_copy] == [(True, T0)] * BIG
    assert rows(pg_url, [r.id for r in by_copy]) == rows(pg_url, [r.id for r in by_json])
    # Args byte for byte as the store keeps them, and as the app reads them back.
    for job, r in zip(jobs, by_copy, strict=True):
        got = backend.get(r.id)
        assert got is not None and got.args == json.loads(job.args) and got.uid == r.uid


def test_ids_come_back_in_call_order_and_are_what_a_claim_returns(
        backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    other = backend.enqueue_many([new_job(args={"other": True})], now=T0)  # an id before them
    results = enqueue_by("copy", backend, [new_job(args={"i": i}) for i in range(BIG)], monkeypatch,
                         now=T0)
    ids = [r.id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == BIG and ids[0] > other[0].id
    assert len({r.uid for r in results}) == BIG
    assert all(r.uid is not None and len(r.uid) == 32 and int(r.uid, 16) >= 0 for r in results)
    backend.claim("default", 1, worker_id="w0", lease_s=30, now=T0)  # the other job
    claimed = backend.claim("default", BIG, worker_id="w", lease_s=30, now=T0)
    assert [(j.id, j.uid, j.args) for j in claimed] == [(r.id, r.uid, {"i": i}) for i, r in enumerate(results)]


def test_created_at_and_run_at_are_the_store_clock_of_the_transaction(
        backend: PostgresBackend, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [new_job(args={"i": i}, delay=0.123457 if i % 2 else 0.0) for i in range(BIG)]
    exact = "extract(epoch FROM {})::numeric"  # to the microsecond, whatever the DateStyle
    with psycopg.connect(pg_url, row_factory=dict_row) as conn:
        # A session whose times print differently: the store's clock is still copied exactly.
        conn.execute("SET TIME ZONE 'Asia/Kathmandu'")
        conn.execute("SET DateStyle = 'SQL, DMY'")
        now = conn.execute(f"SELECT {exact.format('now()')} AS now, "
                           f"{exact.format('now() + make_interval(secs => 0.123457)')} AS later, "
                           "extract(epoch FROM now())::float8 AS at").fetchone()
        assert now is not None
        results = enqueue_by("copy", backend, jobs, monkeypatch, connection=conn)
        got = conn.execute(f"SELECT {exact.format('created_at')} AS created_at, "
                           f"{exact.format('run_at')} AS run_at, state FROM conveyor_jobs ORDER BY id"
                           ).fetchall()
    assert {r.at for r in results} == {now["at"]}
    assert [(g["created_at"], g["run_at"]) for g in got] == [
        (now["now"], now["later"] if i % 2 else now["now"]) for i in range(BIG)]
    assert [g["state"] for g in got] == ["scheduled" if i % 2 else "available" for i in range(BIG)]


def test_fair_tags_are_the_ones_the_one_statement_gives(
        backend: PostgresBackend, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute("INSERT INTO conveyor_queue_clock (queue, priority, vtime) VALUES ('default', 0, 41),"
                     " ('default', 2, 7)")
    jobs = [new_job(args={"i": i}, priority=(i // 100) % 3) for i in range(BIG)]
    by_json = enqueue_by("json", backend, jobs, monkeypatch, now=T0)
    by_copy = enqueue_by("copy", backend, jobs, monkeypatch, now=T0)
    with psycopg.connect(pg_url) as conn:
        tags = dict(conn.execute("SELECT id, fair_tag FROM conveyor_jobs").fetchall())
    assert [tags[r.id] for r in by_copy] == [tags[r.id] for r in by_json]
    assert [tags[r.id] for r in by_copy] == [{0: 42, 1: 1, 2: 8}[(i // 100) % 3] for i in range(BIG)]


def test_a_failing_row_leaves_nothing(backend: PostgresBackend, pg_url: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    kept = backend.enqueue_many([new_job(args={"keep": True})], now=T0)[0].id
    bad = NewJob(task="t.task", queue="default", args="{}", max_attempts=0, timeout=30.0)
    jobs = [new_job(args={"i": i}) for i in range(BIG)] + [bad]
    with pytest.raises(ConveyorError):
        enqueue_by("copy", backend, jobs, monkeypatch, now=T0)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT array_agg(id) FROM conveyor_jobs").fetchone() == ([kept],)
    # The caller's transaction: the failed batch is undone, the caller's other writes are not.
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE side (x int)")
        with pytest.raises(ConveyorError):
            enqueue_by("copy", backend, jobs, monkeypatch, connection=conn)
        conn.execute("INSERT INTO side VALUES (1)")
        results = enqueue_by("copy", backend, jobs[:-1], monkeypatch, connection=conn)
        conn.commit()
        assert conn.execute("SELECT count(*) FROM conveyor_jobs").fetchone() == (BIG + 1,)
        assert conn.execute("SELECT count(*) FROM side").fetchone() == (1,)
    assert backend.get(results[-1].id) is not None


def test_the_callers_transaction_decides(backend: PostgresBackend, pg_url: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [new_job(args={"i": i}) for i in range(BIG)]
    with psycopg.connect(pg_url) as conn:
        dropped = enqueue_by("copy", backend, jobs, monkeypatch, connection=conn)
        conn.rollback()
        kept = enqueue_by("copy", backend, jobs, monkeypatch, connection=conn)
        conn.commit()
    assert backend.get(dropped[0].id) is None and backend.get(dropped[-1].id) is None
    assert [backend.get(r.id) is not None for r in (kept[0], kept[-1])] == [True, True]

    async def on_async(commit: bool) -> list[Any]:
        async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
            made = await backend.aenqueue_many(jobs, connection=aconn)
            await (aconn.commit() if commit else aconn.rollback())
            return made

    async_kept = asyncio.run(on_async(True))
    async_dropped = asyncio.run(on_async(False))
    assert [r.id for r in async_kept] == sorted(r.id for r in async_kept)
    got = backend.get(async_kept[7].id)
    assert got is not None and got.args == {"i": 7} and got.uid == async_kept[7].uid
    assert backend.get(async_dropped[0].id) is None
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM conveyor_jobs").fetchone() == (2 * BIG,)


def test_one_wake_up_per_queue_at_commit(backend: PostgresBackend, pg_url: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The channel is one per database, shared with whatever else runs there: queue names of
    this test's own, and a sentinel sent last marks the end of what the listener can get."""
    queues = [f"wq{uuid.uuid4().hex[:10]}" for _ in range(2)]
    sentinel = f"{queues[0]}:end"
    listener = psycopg.connect(pg_url, autocommit=True)
    try:
        listener.execute(f"LISTEN {pg_enqueue.CHANNEL}")
        jobs = [new_job(args={"i": i}, queue=queues[i % 2]) for i in range(BIG)]
        with psycopg.connect(pg_url) as conn:
            enqueue_by("copy", backend, jobs, monkeypatch, connection=conn)
            early = [n.payload for n in listener.notifies(timeout=0.2)]
            conn.commit()
        enqueue_by("copy", backend, jobs, monkeypatch)
        listener.execute("SELECT pg_notify(%s, %s)", [pg_enqueue.CHANNEL, sentinel])
        got: list[str] = []
        for note in listener.notifies(timeout=30):
            if note.payload == sentinel:
                break
            got.append(note.payload)
    finally:
        listener.close()
    assert not set(early) & set(queues)  # nothing before the commit
    assert sorted(p for p in got if p in queues) == sorted(queues * 2)


def test_a_caller_in_pipeline_mode_gets_the_one_statement(
        backend: PostgresBackend, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL refuses COPY in pipeline mode; the caller's pipeline still takes the batch."""
    jobs = [new_job(args={"i": i}) for i in range(BIG)]
    with psycopg.connect(pg_url) as conn:
        with conn.pipeline():
            results = enqueue_by("copy", backend, jobs, monkeypatch, connection=conn)
        conn.commit()
    got = backend.get(results[-1].id)
    assert got is not None and got.args == {"i": BIG - 1} and got.uid == results[-1].uid


def spy_paths(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Per enqueue of the backend's own transaction, the kinds of statement its plan ran
    ("copy" among them when it went by COPY)."""
    calls: list[list[str]] = []
    real = pg_enqueue.run_plan

    def recording(cur: Any, plan: Any) -> Any:
        kinds: list[str] = []
        calls.append(kinds)

        def watched() -> Any:
            reply = None
            try:
                while True:
                    stmt = plan.send(reply)
                    kinds.append(stmt.fetch)
                    reply = yield stmt
            except StopIteration as done:
                return done.value

        return real(cur, watched())

    monkeypatch.setattr(pg_enqueue, "run_plan", recording)
    return calls


def count_jobs(url: str, queue: str | None = None) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM conveyor_jobs WHERE queue = coalesce(%s, queue)",
                           [queue]).fetchone()
    assert row is not None
    return int(row[0])


def test_a_depth_limited_big_batch_goes_by_copy_and_a_refusal_writes_nothing(
        backend: PostgresBackend, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = spy_paths(monkeypatch)
    limit = BIG + BIG // 2
    jobs = [new_job(args={"i": i}, queue="lim", max_depth=limit) for i in range(BIG)]
    first = enqueue_by("copy", backend, jobs, monkeypatch, now=T0)
    assert "copy" in paths[-1] and [r.id for r in first] == sorted(r.id for r in first)
    assert count_jobs(pg_url, "lim") == BIG
    # A second batch would take the queue past its limit: refused, and none of it written,
    # while another queue of the same batch without a limit is undone too.
    again = jobs + [new_job(args={"other": i}) for i in range(10)]
    with pytest.raises(QueueFull) as refused:
        enqueue_by("copy", backend, again, monkeypatch, now=T0)
    assert "copy" in paths[-1]
    assert (refused.value.queue, refused.value.depth, refused.value.limit) == ("lim", BIG, limit)
    assert count_jobs(pg_url) == BIG
    # In the caller's transaction: the savepoint is undone, the caller's own writes are kept.
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE side (x int)")
        conn.execute("INSERT INTO side VALUES (1)")
        with pytest.raises(QueueFull):
            enqueue_by("copy", backend, again, monkeypatch, connection=conn)
        conn.commit()
        assert conn.execute("SELECT count(*) FROM side").fetchone() == (1,)
    assert count_jobs(pg_url) == BIG
    # Room for exactly what is left: all of it written.
    rest = enqueue_by("copy", backend, jobs[:limit - BIG], monkeypatch, now=T0)
    assert "copy" in paths[-1] and len(rest) == limit - BIG
    assert count_jobs(pg_url, "lim") == limit


def test_a_waiting_worker_wakes_on_a_copy_batch(
        backend: PostgresBackend, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = f"wake{uuid.uuid4().hex[:10]}"
    paths = spy_paths(monkeypatch)
    waiter = PostgresBackend(pg_url)
    woke: list[tuple[bool, float]] = []

    def wait() -> None:
        t0 = time.monotonic()
        woke.append((waiter.wait_for_jobs([queue], timeout=60), time.monotonic() - t0))

    thread = threading.Thread(target=wait)
    try:
        thread.start()
        time.sleep(0.5)  # listening by now, most likely; if not, its first look finds the jobs
        results = enqueue_by("copy", backend, [new_job(args={"i": i}, queue=queue)
                                               for i in range(BIG)], monkeypatch)
        thread.join(60)
    finally:
        waiter.wake()
        thread.join(5)
        waiter.close()
    assert "copy" in paths[-1]
    [(ready, waited)] = woke
    assert ready and waited < 60
    claimed = backend.claim(queue, BIG, worker_id="w", lease_s=30)
    assert [j.id for j in claimed] == [r.id for r in results]


@pytest.mark.parametrize("odd", [
    {"unique_key": "u1"}, {"fair_key": "tenant"}, {"after_refs": (0,)}, {"batch_id": "b1"},
], ids=["unique", "fair", "after", "batch"])
def test_a_batch_with_one_job_copy_cannot_write_goes_the_current_way(
        backend: PostgresBackend, pg_url: str, monkeypatch: pytest.MonkeyPatch,
        odd: dict[str, Any]) -> None:
    paths = spy_paths(monkeypatch)
    batches = [NewBatch("b1")] if "batch_id" in odd else []
    jobs = [new_job(args={"i": i}) for i in range(BIG)]
    jobs[BIG // 2] = new_job(args={"odd": True}, **odd)
    results = enqueue_by("copy", backend, jobs, monkeypatch, now=T0, batches=batches)
    assert "copy" not in paths[-1]
    assert len(results) == BIG and all(r.created for r in results)
    assert [r.id for r in results] == sorted(r.id for r in results)
    got = backend.get(results[BIG // 2].id)
    assert got is not None and got.args == {"odd": True}
    if "unique_key" in odd:  # the key is still honoured: the job again returns the holder
        [held] = enqueue_by("copy", backend, [jobs[BIG // 2]], monkeypatch, now=T0)
        assert (held.id, held.created) == (results[BIG // 2].id, False)
    # The same batch without the odd job goes by COPY.
    plain = [j for i, j in enumerate(jobs) if i != BIG // 2]
    enqueue_by("copy", backend, plain, monkeypatch, now=T0)
    assert "copy" in paths[-1]


def test_the_outbox_marks_every_job_of_a_copy_batch(
        backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = spy_paths(monkeypatch)
    backend.outbox = True
    results = enqueue_by("copy", backend, [new_job(args={"i": i}) for i in range(BIG)],
                         monkeypatch, now=T0)
    assert "copy" in paths[-1]
    assert [j.id for j in backend.outbox_sweep(older_than=60, now=T0 + 59)] == []
    swept = backend.outbox_sweep(older_than=60, now=T0 + 61, limit=10 * BIG)
    assert [j.id for j in swept] == [r.id for r in results]
    backend.outbox_confirm([r.id for r in results])
    assert backend.outbox_sweep(older_than=60, now=T0 + 3600) == []
