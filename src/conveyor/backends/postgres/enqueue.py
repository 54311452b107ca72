"""Enqueueing on PostgreSQL, in the backend's own transaction or in the caller's (sync or async),
and the exactly-once step records.

The enqueue is written once, as a generator of statements (a plan): it yields each statement
and receives its rows. ``run_plan`` executes a plan on a sync cursor, ``arun_plan`` on an async
one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import psycopg
from psycopg import errors as pgerrors
from psycopg import pq
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from ...errors import InvalidName, JobNotFound, StoreError, UnknownParent
from ...payload import NAME_RE
from ..base import CronState, EnqueueResult, NewBatch, NewJob, depth_limits, refuse_overflow
from ..common import new_uids
from .connection import PooledBackend, bounded, translate
from .outbox import mark_created
from .queries import CHANNEL, DEPTH_LOCK, ENQUEUE_ONE, Q

UNIQUE_RACE_TRIES = 3  # a unique key that changes hands between insert and lookup is tried again
# From this many jobs a batch of _batchable jobs goes in by COPY (_plain_copy_plan); below it,
# one statement (insert_plain) is the fewer round trips and costs less (the crossover measured by
# calls of 10 to 1,000 jobs, docs/benchmarks.md).
COPY_MIN_JOBS = 100


class Enqueuing(PooledBackend):
    """The producer's side of PostgresBackend."""

    def enqueue_many(
        self, jobs: Sequence[NewJob], *, now: float | None = None,
        connection: psycopg.Connection[Any] | None = None, batches: Sequence[NewBatch] = (),
    ) -> list[EnqueueResult]:
        """With ``connection``, the jobs are written in the caller's transaction (a savepoint
        inside it): rolled back, there are no jobs; committed, there is exactly one each."""
        if not jobs and not batches:
            return []
        if connection is not None:
            try:
                with bounded(connection):
                    _join_transaction(connection)
                    # A savepoint: the batch is all or nothing.
                    with connection.transaction(), \
                            connection.cursor(row_factory=dict_row) as cur:
                        return run_plan(cur, _enqueue_plan(jobs, now, batches))
            except psycopg.Error as exc:
                raise translate(exc) from exc
        if len(jobs) == 1 and not batches and _plain(jobs[0]) and not self.outbox:
            # The common case in one autocommit statement: the insert and its wake-up commit
            # together (the notification is delivered at that commit), one round trip instead
            # of BEGIN, insert, notify and COMMIT.
            params = {**_insert_params(jobs[0], now, None), "channel": CHANNEL}
            try:
                with self._live_connection() as conn:
                    row = conn.execute(ENQUEUE_ONE, params).fetchone()
            except psycopg.Error as exc:
                raise translate(exc) from exc
            assert row is not None  # no unique key: the insert always writes its row
            return [EnqueueResult(row["id"], True, row["at"], row["uid"])]
        with self._tx() as conn, conn.cursor() as cur:
            results = run_plan(cur, _enqueue_plan(jobs, now, batches))
            if self.outbox:
                mark_created(conn, results)
            return results

    async def aenqueue_many(
        self, jobs: Sequence[NewJob], *, connection: psycopg.AsyncConnection[Any],
        now: float | None = None,
    ) -> list[EnqueueResult]:
        """``enqueue_many`` inside the caller's transaction on an async connection."""
        if not jobs:
            return []
        try:
            with bounded(connection):
                if (not connection.autocommit
                        and connection.info.transaction_status == TransactionStatus.IDLE):
                    await connection.execute("BEGIN")
                async with connection.transaction(), \
                        connection.cursor(row_factory=dict_row) as cur:
                    return await arun_plan(cur, _enqueue_plan(jobs, now))
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        with self._tx() as conn:
            taken = conn.execute(Q["cron_take"],
                                 {"name": schedule, "tick": tick, "now": now}).fetchone()
            if taken is None:
                return None  # this tick or a later one was taken already
            if job is None or not taken["runs"]:
                return None  # a first sight, or a disabled schedule: the tick is only recorded
            with conn.cursor() as cur:
                # QueueFull raised here rolls the whole transaction back: the tick is not taken.
                [result] = run_plan(cur, _enqueue_plan([job], now))
            if self.outbox:
                mark_created(conn, [result])
            conn.execute(Q["cron_last_job"], {"name": schedule, "id": result.id})
        return result

    def cron_ticks(self) -> dict[str, float]:
        with self._tx() as conn:
            return {r["name"]: float(r["last_tick"]) for r in conn.execute(Q["cron_ticks"])}

    def set_cron_enabled(self, schedule: str, enabled: bool, *,
                         now: float | None = None) -> bool:
        with self._tx() as conn:
            changed = conn.execute(Q["cron_enable" if enabled else "cron_disable"],
                                   {"name": schedule, "now": now})
            return changed.fetchone() is not None

    def cron_states(self) -> dict[str, CronState]:
        with self._tx() as conn:
            return {r["name"]: CronState(r["name"], float(r["last_tick"]), r["last_job_id"],
                                         r["disabled_at"], r["enabled_at"])
                    for r in conn.execute(Q["cron_states"])}

    def record_step(self, job_id: int, step: str, result: str | None, *, uid: str | None,
                    connection: psycopg.Connection[Any] | None = None,
                    ) -> tuple[bool, str | None]:
        """With ``connection``, the record joins that connection's open transaction (the caller
        commits): with the task's own writes, it happens exactly once."""
        _check_step_name(step)
        if connection is not None:
            try:
                with bounded(connection), connection.cursor(row_factory=dict_row) as cur:
                    return _record_step(cur, job_id, step, result, uid)
            except psycopg.Error as exc:
                raise translate(exc) from exc
        with self._tx() as conn, conn.cursor() as cur:
            return _record_step(cur, job_id, step, result, uid)


def _join_transaction(conn: psycopg.Connection[Any]) -> None:
    """Open the caller's transaction if none is open yet, so the caller's commit or rollback
    decides. (``conn.transaction()`` on an idle connection would commit on its own.)"""
    if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        conn.execute("BEGIN")


def _plain(job: NewJob) -> bool:
    """A job whose enqueue is the insert alone: no unique key to look up, no queue depth to
    check under a lock, no fair tag to reserve."""
    return (job.unique_key is None and job.max_depth is None and job.fair_key is None
            and not _in_workflow(job))


def _batchable(job: NewJob) -> bool:
    """A job _plain_batch_plan writes with its neighbours: a plain one, or one whose only extra
    is a depth limit (checked once after the whole batch is written, see _finish_plan)."""
    return (job.unique_key is None and job.fair_key is None and not _in_workflow(job))


def _in_workflow(job: NewJob) -> bool:
    """A job with parents, or of a batch: written by _workflow_plan."""
    return bool(job.after or job.after_refs or job.batch_id or job.callback_of)


def _bulk(job: NewJob) -> bool:
    """A job of a workflow write that insert_plain can write with its neighbours: no parents
    to lock and count, nothing to decide per job (a unique key, a fair tag, a depth limit), and
    not a callback (one has parents). A batch member, mostly."""
    return (job.unique_key is None and job.max_depth is None and job.fair_key is None
            and not job.after and not job.after_refs and job.callback_of is None)


def _plain_values(job: NewJob, has_children: bool = False) -> tuple[Any, ...]:
    """What a plain job shares with its run in insert_plain's JSON document, in that order."""
    return (job.queue, job.task, job.priority, job.run_at, max(job.delay, 0.0), job.max_attempts,
            job.timeout, job.meta, job.concurrency_key, job.concurrency_limit, job.rate_key,
            job.rate_limit, job.rate_period, job.batch_id, has_children)


def _plain_runs(jobs: Sequence[NewJob],
                has_children: Sequence[bool] | None = None) -> list[list[Any]]:
    """insert_plain's document: consecutive jobs with the same _plain_values as one run,
    ``[*values, [args, ...]]``, in batch order. ``has_children``: per job, whether a later job
    of the write names it (none does, without)."""
    runs: list[list[Any]] = []
    last: tuple[Any, ...] | None = None
    for i, job in enumerate(jobs):
        values = _plain_values(job, has_children is not None and has_children[i])
        if values != last:
            runs.append([*values, []])
            last = values
        runs[-1][-1].append(job.args)
    return runs


def _insert_params(job: NewJob, now: float | None, fair_tag: int | None) -> dict[str, Any]:
    return {
        "queue": job.queue, "task": job.task, "args": job.args, "priority": job.priority,
        "run_at": job.run_at, "delay": max(job.delay, 0.0), "max_attempts": job.max_attempts,
        "timeout_s": job.timeout, "unique_key": job.unique_key, "meta": job.meta, "now": now,
        "fair_key": job.fair_key, "fair_tag": fair_tag, "unique_for": job.unique_for,
        "concurrency_key": job.concurrency_key, "concurrency_limit": job.concurrency_limit,
        "rate_key": job.rate_key, "rate_limit": job.rate_limit, "rate_period": job.rate_period,
    }


# -- plans ----------------------------------------------------------------------------------------

T = TypeVar("T")


@dataclass(frozen=True)
class _Stmt:
    """One statement of a plan. ``fetch``: "none", "one" (a row or None), "all" (the rows),
    "many" (executemany of ``params``, a list: one RETURNING row or None per parameter set),
    "copy" (a COPY ... FROM STDIN of ``params``, its data as text) or "can_copy" (no statement:
    whether the connection can COPY now, see _can_copy)."""

    fetch: str
    sql: str
    params: Any


Plan = Generator[_Stmt, Any, T]


def _can_copy(pgconn: pq.abc.PGconn) -> bool:
    """COPY is refused in pipeline mode, which a caller's connection may be in."""
    return pgconn.pipeline_status == pq.PipelineStatus.OFF


def run_plan(cur: psycopg.Cursor[dict[str, Any]], plan: Plan[T]) -> T:
    reply: Any = None
    try:
        while True:
            stmt = plan.send(reply)
            if stmt.fetch == "can_copy":
                reply = _can_copy(cur.connection.pgconn)
                continue
            if stmt.fetch == "copy":
                with cur.copy(stmt.sql) as copy:
                    copy.write(stmt.params)
                reply = None
                continue
            if stmt.fetch == "many":
                cur.executemany(stmt.sql, stmt.params, returning=True)
                rows: list[dict[str, Any] | None] = []
                while True:
                    rows.append(cur.fetchone())
                    if not cur.nextset():
                        break
                reply = rows
                continue
            cur.execute(stmt.sql, stmt.params)
            if stmt.fetch == "one":
                reply = cur.fetchone()
            elif stmt.fetch == "all":
                reply = cur.fetchall()
            else:
                reply = None
    except StopIteration as done:
        return cast(T, done.value)


async def arun_plan(cur: psycopg.AsyncCursor[dict[str, Any]], plan: Plan[T]) -> T:
    reply: Any = None
    try:
        while True:
            stmt = plan.send(reply)
            if stmt.fetch == "can_copy":
                reply = _can_copy(cur.connection.pgconn)
                continue
            if stmt.fetch == "copy":
                async with cur.copy(stmt.sql) as acopy:
                    await acopy.write(stmt.params)
                reply = None
                continue
            if stmt.fetch == "many":
                await cur.executemany(stmt.sql, stmt.params, returning=True)
                rows: list[dict[str, Any] | None] = []
                while True:
                    rows.append(await cur.fetchone())
                    if not cur.nextset():
                        break
                reply = rows
                continue
            await cur.execute(stmt.sql, stmt.params)
            if stmt.fetch == "one":
                reply = await cur.fetchone()
            elif stmt.fetch == "all":
                reply = await cur.fetchall()
            else:
                reply = None
    except StopIteration as done:
        return cast(T, done.value)


def _enqueue_plan(jobs: Sequence[NewJob], now: float | None,
                  batches: Sequence[NewBatch] = ()) -> Plan[list[EnqueueResult]]:
    """Write a batch in the open transaction; raising (QueueFull) lets the caller roll it back."""
    _check_refs(jobs)
    limits = depth_limits(jobs)
    for queue in sorted(limits):
        # Serialise enqueuers of a limited queue (sorted: no deadlock between batches), so
        # two of them cannot both see room for the last slot.
        yield _Stmt("none", DEPTH_LOCK, [queue])
    if batches or any(_in_workflow(job) for job in jobs):
        return (yield from _workflow_plan(jobs, now, batches, limits))
    if len(jobs) > 1 and all(_batchable(job) for job in jobs):
        return (yield from _plain_batch_plan(jobs, now, limits))
    tags = yield from _fair_tags_plan(jobs, now)
    params = [_insert_params(job, now, tag) for job, tag in zip(jobs, tags, strict=True)]
    rows: list[dict[str, Any] | None] = yield _Stmt("many", Q["insert"], params)
    results: list[EnqueueResult] = []
    for job, param, row in zip(jobs, params, rows, strict=True):
        result, _ = yield from _created_or_held(job, Q["insert"], param, row, now)
        results.append(result)
    yield from _finish_plan(jobs, results, limits,
                            {j.queue for j, r in zip(jobs, results, strict=True) if r.created})
    return results


def _created_or_held(job: NewJob, insert: str, param: dict[str, Any],
                     row: dict[str, Any] | None, now: float | None
                     ) -> Plan[tuple[EnqueueResult, dict[str, Any] | None]]:
    """The result of an insert that answered ``row`` (None: its unique key is held): the new
    job, or the job holding the key, and the inserted row (None when held). The holder may
    finish (or its window close) between the insert and the look for it: then insert again."""
    for _ in range(UNIQUE_RACE_TRIES):
        if row is not None:
            return EnqueueResult(row["id"], True, row["at"], row["uid"]), row
        found = yield _Stmt("one", Q["find_unique"], {"unique_key": job.unique_key, "now": now})
        if found is not None:
            return EnqueueResult(found["id"], False, found["at"]), None
        row = yield _Stmt("one", insert, param)
    raise StoreError(f"unique key {job.unique_key!r} keeps changing hands during enqueue; retry")


def _finish_plan(jobs: Sequence[NewJob], results: list[EnqueueResult], limits: dict[str, int],
                 woken: set[str]) -> Plan[None]:
    """The depth check of limited queues, and the wake-up of the queues that got a job."""
    for queue, limit in sorted(limits.items()):
        depth = yield _Stmt("one", Q["depth"], {"queue": queue})
        refuse_overflow(queue, limit, depth["n"], jobs, results)
    if woken:
        # Delivered at commit, so a woken worker always finds the job.
        yield _Stmt("none", Q["notify"], {"channel": CHANNEL, "queues": sorted(woken)})


def _check_refs(jobs: Sequence[NewJob]) -> None:
    """after_refs name earlier positions only (no cycle can form); checked before any write."""
    for i, job in enumerate(jobs):
        for ref in job.after_refs:
            if not 0 <= ref < i:
                raise UnknownParent(ref, f"after_refs of job {i} must name an earlier position")


FINAL = frozenset({"succeeded", "dead", "cancelled"})


def _workflow_plan(jobs: Sequence[NewJob], now: float | None, batches: Sequence[NewBatch],
                   limits: dict[str, int]) -> Plan[list[EnqueueResult]]:
    """Jobs with parents or of batches, in order (a reference needs the id of the job it
    names): each consecutive run of _bulk jobs (a batch's members) in one insert_plain, every
    other job in an insert of its own. Parents outside the call are locked and marked first,
    all in one statement in id order (link_parents); each child's state follows from theirs."""
    if batches:
        yield _Stmt("none", Q["insert_batches"], {
            "ids": [b.id for b in batches], "parent_ids": [b.parent_id for b in batches],
            "now": now})
    states: dict[int, str] = {}  # parent id -> its state, as locked (or as written here)
    outside = sorted({p for job in jobs for p in job.after})
    if outside:
        yield from _link_plan(outside, states)
    referenced = {r for job in jobs for r in job.after_refs}
    tags = yield from _fair_tags_plan(jobs, now)
    results: list[EnqueueResult] = []
    woken: set[str] = set()
    i = 0
    while i < len(jobs):
        end = i
        while end < len(jobs) and _bulk(jobs[end]):
            end += 1
        if end > i:
            run = jobs[i:end]
            yield from _bulk_plan(run, now, [j in referenced for j in range(i, end)],
                                  results, states)
            woken.update(job.queue for job in run)
            i = end
            continue
        job, tag = jobs[i], tags[i]
        # A reference to a job that was not created (its unique key is held) names the holder,
        # which is not locked yet.
        held = sorted({results[r].id for r in job.after_refs if not results[r].created}
                      - states.keys())
        if held:
            yield from _link_plan(held, states)
        parents = sorted(set(job.after) | {results[r].id for r in job.after_refs})
        failed = [p for p in parents if states[p] in ("dead", "cancelled")]
        param = {
            **_insert_params(job, now, tag), "has_children": i in referenced,
            "parents": parents or None,
            "parents_left": sum(states[p] not in FINAL for p in parents),
            "on_parent_failure": job.on_parent_failure if parents else None,
            "batch_id": job.batch_id, "callback_of": job.callback_of,
            "failed_parent": failed[0] if failed and job.on_parent_failure == "cancel" else None,
            "parent_ids": parents, "parent_done": [states[p] in FINAL for p in parents],
        }
        row = yield _Stmt("one", Q["insert_after"], param)
        result, row = yield from _created_or_held(job, Q["insert_after"], param, row, now)
        results.append(result)
        if row is not None:
            states[row["id"]] = row["state"]
            if row["state"] in ("available", "scheduled"):
                woken.add(job.queue)
        i += 1
    yield from _finish_plan(jobs, results, limits, woken)
    return results


def _bulk_plan(run: Sequence[NewJob], now: float | None, has_children: list[bool],
               results: list[EnqueueResult], states: dict[int, str]) -> Plan[None]:
    """Consecutive _bulk jobs in one insert_plain, their results and states appended. Each is
    new and, without parents, available or scheduled: a state a child counts as unfinished."""
    doc = json.dumps(_plain_runs(run, has_children), allow_nan=False)
    row = yield _Stmt("one", Q["insert_plain"], {"jobs": doc, "now": now})
    at = row["at"]
    for job_id, uid in zip(row["ids"], row["uids"], strict=True):
        results.append(EnqueueResult(job_id, True, at, uid))
        states[job_id] = "available"


def _link_plan(ids: list[int], states: dict[int, str]) -> Plan[None]:
    """Lock and mark these parents (link_parents), recording their states; UnknownParent for
    an id the store does not hold."""
    rows = yield _Stmt("all", Q["link_parents"], {"ids": ids})
    found = {r["id"]: r["state"] for r in rows}
    for p in ids:
        if p not in found:
            raise UnknownParent(p)
    unmarked = [{"id": r["id"]} for r in rows if not r["has_children"]]
    if unmarked:
        yield _Stmt("many", Q["mark_parent"], unmarked)
    states.update(found)


def _plain_batch_plan(jobs: Sequence[NewJob], now: float | None,
                     limits: dict[str, int] | None = None) -> Plan[list[EnqueueResult]]:
    """A batch of _batchable jobs in one statement, instead of one insert per job; a big one by
    COPY (_plain_copy_plan). Then the depth check of ``limits`` (their queues locked by the
    caller) and the wake-up of each queue: a refusal raises, and the caller's rollback undoes
    the whole batch."""
    runs = _plain_runs(jobs)
    if len(jobs) >= COPY_MIN_JOBS and (yield _Stmt("can_copy", "", None)):
        results = yield from _plain_copy_plan(runs, len(jobs), now)
    else:
        doc = json.dumps(runs, allow_nan=False)
        row = yield _Stmt("one", Q["insert_plain"], {"jobs": doc, "now": now})
        at = row["at"]
        results = [EnqueueResult(i, True, at, uid)
                   for i, uid in zip(row["ids"], row["uids"], strict=True)]
    yield from _finish_plan(jobs, results, limits or {}, {j.queue for j in jobs})
    return results


# The columns a plain job's COPY row gives, in this order: the job's own three, then what its run
# shares (_copy_shared).
COPY_PLAIN = ("COPY conveyor_jobs (id, args, uid, queue, task, state, priority, run_at, "
              "max_attempts, timeout_s, meta, created_at, fair_tag, concurrency_key, "
              "concurrency_limit, rate_key, rate_limit, rate_period, batch_id, has_children) "
              "FROM STDIN")


def _plain_copy_plan(runs: list[list[Any]], n: int,
                     now: float | None) -> Plan[list[EnqueueResult]]:
    """insert_plain's rows written by COPY, which costs the server less per row than reading
    them out of a JSON document. plain_copy_values gives what the insert would compute in the
    store (its clock, each run's state, run_at and fair tag) and the ids; the rows are then
    copied as text lines, a run's shared columns formatted once."""
    keys = [[run[0], run[2], run[3], run[4]] for run in runs]  # queue, priority, run_at, delay
    row = yield _Stmt("one", Q["plain_copy_values"],
                      {"runs": json.dumps(keys, allow_nan=False), "n": n, "now": now})
    ids: list[int] = row["ids"]
    uids = new_uids(n)  # what a uid is on every store (common.py), not made per row in SQL
    lines: list[str] = []
    i = 0
    for run, state, run_at, tag in zip(runs, row["states"], row["run_ats"], row["fair_tags"],
                                       strict=True):
        tail = _copy_shared(run, state, run_at, row["created_at"], tag)
        for args in run[-1]:
            lines.append(f"{ids[i]}\t{_copy_text(args)}\t{uids[i]}\t{tail}")
            i += 1
    yield _Stmt("copy", COPY_PLAIN, "".join(lines))
    at = row["at"]
    return [EnqueueResult(job_id, True, at, uid) for job_id, uid in zip(ids, uids, strict=True)]


def _copy_shared(run: list[Any], state: str, run_at: str, created_at: str, tag: int) -> str:
    """The end of a COPY line (from queue on, see COPY_PLAIN) of the jobs of this run of
    _plain_runs."""
    values = (run[0], run[1], state, run[2], run_at, run[5], run[6], run[7], created_at, tag,
              run[8], run[9], run[10], run[11], run[12], run[13], run[14])
    return "\t".join(_copy_value(v) for v in values) + "\n"


def _copy_value(value: Any) -> str:
    """A value in COPY's text format: NULL as \\N, a float as its repr (read back exactly)."""
    if value is None:
        return "\\N"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"out of range float value: {value!r}")  # as json.dumps refuses
        return repr(value)
    if isinstance(value, bool | int):
        return str(int(value))
    return _copy_text(str(value))


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(text: str) -> str:
    """``text`` as a COPY text field: its backslashes, tabs and line ends escaped."""
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        return text.translate(_COPY_ESCAPES)
    return text


def _fair_tags_plan(jobs: Sequence[NewJob], now: float | None) -> Plan[list[int | None]]:
    """The fair tag of each job with a fair key that will be new. None for the others: the
    insert gives a job without a fair key its round's ``vtime + 1``. A job whose unique key is
    held returns the holder and takes no tag (should the key change hands meanwhile, the
    insert still gives it one: its round's ``vtime + 1``)."""
    tags: list[int | None] = [None] * len(jobs)
    if all(job.fair_key is None for job in jobs):
        return tags
    keys = sorted({j.unique_key for j in jobs
                   if j.fair_key is not None and j.unique_key is not None})
    taken: set[str] = set()
    if keys:
        held = yield _Stmt("all", Q["unique_held"], {"keys": keys, "now": now})
        taken = {r["unique_key"] for r in held}
    new: list[tuple[int, tuple[str, int, str]]] = []
    for i, job in enumerate(jobs):
        if job.unique_key is not None:
            if job.unique_key in taken:  # held, or taken by an earlier job of this batch
                continue
            taken.add(job.unique_key)
        if job.fair_key is not None:
            new.append((i, (job.queue, job.priority, job.fair_key)))
    reserved = yield from _take_tags_plan([slot for _, slot in new])
    for (i, _), tag in zip(new, reserved, strict=True):
        tags[i] = tag
    return tags


def _take_tags_plan(slots: Sequence[tuple[str, int, str]]) -> Plan[list[int]]:
    """Tags for new jobs at these (queue, priority, fair key) slots, in order: each slot's jobs
    take consecutive tags from ``max(last_tag, vtime) + 1`` (backends/base.py)."""
    counts = Counter(slots)
    if not counts:
        return []
    order = sorted(counts)
    rows = yield _Stmt("all", Q["take_fair_tags"], {
        "queues": [q for q, _, _ in order], "priorities": [p for _, p, _ in order],
        "keys": [k for _, _, k in order], "counts": [counts[x] for x in order]})
    next_tag: dict[tuple[str, int, str], int] = {}
    for r in rows:
        slot = (r["queue"], r["priority"], r["fair_key"])
        next_tag[slot] = r["last_tag"] - counts[slot] + 1
    tags: list[int] = []
    for slot in slots:
        tags.append(next_tag[slot])
        next_tag[slot] += 1
    return tags


def retag_plan(rows: Sequence[dict[str, Any]]) -> Plan[None]:
    """Fresh fair tags for redriven jobs (rows of id, queue, priority, fair_key), in order."""
    fair = [r for r in rows if r["fair_key"] is not None]
    tags = yield from _take_tags_plan([(r["queue"], r["priority"], r["fair_key"]) for r in fair])
    tag_of = {r["id"]: tag for r, tag in zip(fair, tags, strict=True)}
    yield _Stmt("none", Q["retag"], {"ids": [r["id"] for r in rows],
                                     "tags": [tag_of.get(r["id"]) for r in rows]})


# -- exactly-once steps ---------------------------------------------------------------------------

def _check_step_name(step: str) -> None:
    if not isinstance(step, str) or not NAME_RE.fullmatch(step):
        raise InvalidName(f"step name must match {NAME_RE.pattern}, got {step!r}")


def _record_step(cur: psycopg.Cursor[dict[str, Any]], job_id: int, step: str,
                 result: str | None, uid: str | None) -> tuple[bool, str | None]:
    params = {"id": job_id, "step": step, "result": result, "uid": uid}
    try:
        if cur.execute(Q["record_step"], params).fetchone() is not None:
            return True, result
    except pgerrors.ForeignKeyViolation:
        raise JobNotFound(f"no job with id {job_id}") from None  # deleted while we recorded
    row = cur.execute(Q["read_step"], params).fetchone()
    assert row is not None
    if not row["job_found"]:
        # No such job, or the id names another job now (the store lost data and its sequence
        # handed the id out again): either way not this job.
        raise JobNotFound(f"no job with id {job_id} and uid {uid}")
    if not row["found"]:
        raise StoreError(f"step {step!r} of job {job_id}: record neither written nor found; retry")
    value = row["result"]  # the stored JSON text; SQL NULL is a step that returned None
    return False, None if value in (None, "null") else value
