"""The PostgreSQL backend's statements (``sql/postgres/queries.sql``), ready to run, and the
helpers that read the rows they return."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from ...job import Job, JobState, make_job
from ..base import ErrorInfo
from ..sql import load_queries

NOW = "coalesce(to_timestamp(%(now)s::float8), now())"
# The time the statement started, for the limited claim: later than the transaction's now().
STMT_NOW = "coalesce(to_timestamp(%(now)s::float8), statement_timestamp())"
# A job row's columns, named: a statement returning ``j.*`` is prepared with the table's shape,
# and PostgreSQL refuses it once a later release's migration adds a column ("cached plan must
# not change result type"), which would stop every running worker of the old release.
JOB_COLUMNS = ("id", "queue", "task", "state", "priority", "run_at", "attempt", "max_attempts",
               "timeout_s", "lease_token", "lease_expires_at", "worker_id", "unique_key",
               "errors", "meta", "created_at", "attempted_at", "finished_at", "fair_key",
               "fair_tag", "unique_for", "concurrency_key", "concurrency_limit", "rate_key",
               "rate_limit", "rate_period", "args", "result", "uid", "stalls", "parents",
               "on_parent_failure", "batch_id", "callback_of")


def _job_columns(sql: str) -> str:
    """``:JOB(alias)`` becomes ``alias.id, alias.queue, ...``."""
    return re.sub(r":JOB\((\w+)\)",
                  lambda m: ", ".join(f"{m[1]}.{c}" for c in JOB_COLUMNS), sql)


def _locked_ids(sql: str) -> str:
    """``:LOCKED_IDS(lock clause)`` becomes a query of the rows whose ids ``%(ids)s`` holds,
    each locked by a lookup of its own id, over the ids sorted: locks are taken in id order,
    and the plan is a primary-key lookup per id at any table size (ack_many in queries.sql
    says why a scan for ``id = ANY(ids)`` must not be the plan)."""
    return re.sub(r":LOCKED_IDS\(([A-Z ]+)\)",
                  lambda m: ("SELECT j.id FROM (SELECT unnest(%(ids)s::bigint[]) AS id ORDER BY 1)"
                             " AS u CROSS JOIN LATERAL (SELECT id FROM conveyor_jobs"
                             f" WHERE id = u.id {m[1]}) AS j"), sql)


_RAW = load_queries("postgres")
_FORGET_GONE = _RAW.pop("forget_gone")  # the shared end of prune and purge
Q = {name: _locked_ids(_job_columns(sql.replace(":FORGET_GONE", _FORGET_GONE)
                                    .replace(":NOW", NOW).replace(":STMT_NOW", STMT_NOW)))
     for name, sql in _RAW.items()}
KEEP_ERRORS = 20
CHANNEL = "conveyor_wake"
DEPTH_LOCK = ("SELECT pg_advisory_xact_lock("
              "hashtext('conveyor_depth:' || current_schema() || ':' || %s))")
# A plain job's enqueue (see enqueue._plain): the insert, and its wake-up delivered at the same
# commit.
ENQUEUE_ONE = ("WITH ins AS (" + Q["insert"].strip().rstrip(";") + ")\n"
               "SELECT ins.id, ins.uid, ins.at, pg_notify(%(channel)s, %(queue)s) FROM ins"
               ).encode()
TRY_LOCK = "SELECT pg_try_advisory_lock(hashtextextended(%s || current_schema(), 0)) AS held"


@functools.lru_cache(maxsize=256)
def ack_claim_sql(limit: int) -> bytes:
    """The ack_claim statement with its LIMIT written in. As a parameter, the planner would
    guess LIMIT at 10% of the table, so the generic plan (a hash join over a scan of every job)
    never wins and each call is planned anew. As a constant, once psycopg has prepared the
    statement (one per distinct limit: a worker asks for 1 to its number of slots), PostgreSQL
    switches to the generic plan, the same index scan and nested loop, and stops planning it."""
    return Q["ack_claim"].replace("%(limit)s", str(int(limit))).encode()


def notify(conn: psycopg.Connection[Any], queues: Sequence[str]) -> None:
    """Wake idle workers of these queues; delivered at commit, so a woken worker always finds
    the job."""
    distinct = sorted(set(queues))
    if distinct:
        conn.execute(Q["notify"], {"channel": CHANNEL, "queues": distinct})


def notify_freed(conn: psycopg.Connection[Any], rows: Sequence[dict[str, Any]]) -> None:
    """Jobs with a concurrency key left ``running``: a slot is free, so wake idle workers of
    their queues for the jobs the limit held back. Nothing at all for jobs without a key."""
    notify(conn, [r["queue"] for r in rows if r["concurrency_key"] is not None])


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def row_to_job(row: dict[str, Any]) -> Job:
    return make_job(
        id=row["id"], task=row["task"], queue=row["queue"], args=row["args"],
        state=JobState(row["state"]), attempts=row["attempt"], max_attempts=row["max_attempts"],
        priority=row["priority"], run_at=row["run_at"].timestamp(),
        timeout=float(row["timeout_s"]), created_at=row["created_at"].timestamp(),
        uid=row["uid"], attempted_at=_ts(row["attempted_at"]),
        finished_at=_ts(row["finished_at"]), result=row["result"], errors=row["errors"],
        unique_key=row["unique_key"], worker_id=row["worker_id"],
        lease_token=row["lease_token"], lease_expires_at=_ts(row["lease_expires_at"]),
        meta=row["meta"], fair_key=row["fair_key"], steps=row["steps"],
        concurrency_key=row["concurrency_key"], concurrency_limit=row["concurrency_limit"],
        rate_key=row["rate_key"], rate_limit=row["rate_limit"], rate_period=row["rate_period"],
        stalls=row["stalls"], parents=tuple(sorted(row["parents"] or ())),
        on_parent_failure=row["on_parent_failure"] or "cancel", batch_id=row["batch_id"],
        callback_of=row["callback_of"],
    )


def claimed_jobs(rows: list[dict[str, Any]]) -> list[Job]:
    """Claimed rows as jobs, in claim order."""
    rows.sort(key=lambda r: (r["priority"], r["fair_tag"], r["run_at"], r["id"]))
    return [row_to_job(r) for r in rows]


def error_json(error: ErrorInfo) -> str:
    return json.dumps({"kind": error.kind, "type": error.type, "message": error.message,
                       "traceback": error.traceback}, ensure_ascii=False)

def forget_batches(conn: Any, batches: list[str]) -> None:
    """Delete the records of these batches if their last member went (prune, purge), then of
    the batches they were nested in, in the caller's transaction."""
    while batches:
        gone = conn.execute(Q["prune_batches"], {"ids": batches}).fetchall()
        batches = sorted({r["parent_id"] for r in gone if r["parent_id"]})
