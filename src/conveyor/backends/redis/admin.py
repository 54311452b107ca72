"""Inspection and administration: get, list, stats, redrive, purge, cancel, the worker
registry, and the warnings a worker logs about this Redis's settings."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from typing import Any

import redis

from ...job import Job, JobState
from ...payload import check_queue_name
from ..base import BatchInfo, Page, QueueStats, Stats, WorkerInfo
from .codec import _to_job, named
from .core import RedisCore
from .keys import STATES
from .transport import _exposure_warnings

LIST_BUDGET = 20_000  # ids one list_jobs call looks at before it hands back a cursor
BATCH = 1000  # jobs one redrive/purge script handles, so a big DLQ never blocks Redis for long


class AdminMixin(RedisCore):
    def get(self, job_id: int) -> Job | None:
        keys = self.keys.get(job_id)
        flat, errors = self._transport.call(
            "get", functools.partial(self._script, "get", keys, []), safe=True)
        if not flat:
            return None
        return _to_job(job_id, dict(zip(flat[::2], flat[1::2], strict=True)), errors)

    def list_jobs(
        self, *, state: JobState | None = None, queue: str | None = None, task: str | None = None,
        cursor: int | None = None, limit: int = 50,
    ) -> Page:
        if limit <= 0:
            return Page(jobs=[], next_cursor=None)
        # The queue's block, or every queue's: the script folds their inboxes before it reads.
        args = ["" if cursor is None else int(cursor), limit, max(LIST_BUDGET, limit + 1),
                "" if state is None else str(JobState(state)), queue or "", task or ""]
        queues = self._all_queues() if queue is None else [queue]
        raw, next_cursor = self._run("list_jobs", queues, args, safe=True,
                                     all_queues=queue is None)
        return Page(jobs=[self._job(r) for r in raw],
                    next_cursor=int(next_cursor) if next_cursor else None)

    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0,
              finished: bool = True) -> Stats:
        # Every count here is a ZCARD/SCARD, cheap either way; ``finished=False`` still reports
        # succeeded/cancelled as 0, as the contract says.
        res = self._run("stats", self._all_queues(), [self._now_arg(now), repr(float(worker_ttl))],
                        safe=True, all_queues=True)
        top = named(res[1])
        t = float(top["now"])
        queues = []
        for rec in map(named, top["queues"]):
            counts = {s: int(rec.get(s, 0)) for s in STATES}
            if not finished:
                counts["succeeded"] = counts["cancelled"] = 0
            expiries = rec.get("expiries", "")
            if not any(counts.values()) and expiries == "":
                continue  # every job of this queue was pruned: as absent as on the SQL stores
            due, oldest = int(rec.get("due", 0)), rec.get("oldest", "")
            queues.append(QueueStats(
                queue=rec["queue"], waiting=counts["waiting"],
                scheduled=counts["scheduled"] - due,
                available=counts["available"] + due, running=counts["running"],
                succeeded=counts["succeeded"], dead=counts["dead"],
                cancelled=counts["cancelled"],
                oldest_available_age=max(0.0, t - float(oldest)) if oldest != "" else None,
                lease_expiries=int(expiries or 0), expired_leases=int(rec.get("expired", 0)),
            ))
        workers = []
        for rec in map(named, top["workers"]):
            d = json.loads(rec["info"])
            workers.append(WorkerInfo(
                id=rec["id"], queues=list(d["queues"]), concurrency=int(d["concurrency"]),
                host=str(d["host"]), pid=int(d["pid"]), started_at=float(d["started_at"]),
                last_seen=float(rec["last_seen"]), running=int(d["running"]),
                stuck=int(d.get("stuck", 0)),  # (absent: written before 'stuck' was)
            ))
        workers.sort(key=lambda w: (w.started_at, w.id))
        paused = {name: float(since) for name, since in named(top["paused"]).items()}
        queues = [dataclasses.replace(q, paused=True, paused_since=paused.pop(q.queue))
                  if q.queue in paused else q for q in queues]
        queues += [QueueStats(queue=name, paused=True, paused_since=since)
                   for name, since in paused.items()]  # listed even with no job
        return Stats(now=t, queues=sorted(queues, key=lambda q: q.queue), workers=workers)

    # -- pausing queues -----------------------------------------------------------------
    def pause_queue(self, queue: str, *, now: float | None = None) -> bool:
        check_queue_name(queue)
        return int(self._run("queue_pause", [queue], [self._now_arg(now), "pause"],
                             safe=True)) == 1

    def resume_queue(self, queue: str, *, now: float | None = None) -> bool:
        check_queue_name(queue)
        return int(self._run("queue_pause", [queue], [self._now_arg(now), "resume"],
                             safe=True)) == 1

    def paused_queues(self) -> dict[str, float]:
        flat = self._transport.call(
            "paused queues", lambda: self._transport.r.hgetall(self.keys.store["paused"]),
            safe=True)
        return {str(name): float(since) for name, since in flat.items()}

    def redrive(self, job_ids: Sequence[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> int:
        if job_ids is not None:
            total = 0
            ids = [int(i) for i in job_ids]
            for start in range(0, len(ids), BATCH):
                args = [self._now_arg(now), "ids", *ids[start:start + BATCH]]
                res = self._run("redrive", self._all_queues(), args, safe=False, all_queues=True)
                total += int(res[1])
            return total
        total, cursor = 0, "+inf"
        while True:
            args = [self._now_arg(now), "all", queue or "", cursor, BATCH]
            res = self._run("redrive", self._all_queues(), args, safe=False, all_queues=True)
            total += int(res[1])
            cursor = res[2]
            if not cursor:
                return total

    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        state = JobState(state)
        if not state.is_final:
            raise ValueError(f"purge only deletes finished jobs, not {state}")
        total = 0
        if job_ids is not None:
            ids = [int(i) for i in job_ids]
            for start in range(0, len(ids), BATCH):
                args = [str(state), queue or "", "ids", *ids[start:start + BATCH]]
                res = self._run("purge", self._all_queues(), args, safe=True, all_queues=True)
                total += int(res[1])
            return total
        while True:
            res = self._run("purge", self._all_queues(), [str(state), queue or "", "all", BATCH],
                            safe=True, all_queues=True)
            total += int(res[1])
            if not int(res[2]):
                return total

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        res = self._run("get_batch", [], [batch_id], safe=True)
        if not res:
            return None
        created_at, parent_id, on_success, on_complete = res[:4]
        counts = {str(s): int(n) for s, n in zip(res[4::2], res[5::2], strict=True)}
        return BatchInfo(
            id=batch_id, created_at=float(created_at), parent_id=parent_id or None,
            total=sum(counts.values()), waiting=counts.get("waiting", 0),
            pending=sum(counts.get(s, 0) for s in ("scheduled", "available", "running")),
            succeeded=counts.get("succeeded", 0), dead=counts.get("dead", 0),
            cancelled=counts.get("cancelled", 0),
            on_success=int(on_success) if on_success else None,
            on_complete=int(on_complete) if on_complete else None,
        )

    def make_due(self, job_ids: Sequence[int], *, now: float | None = None) -> int:
        ids = [int(i) for i in job_ids]
        total = 0
        for start in range(0, len(ids), BATCH):
            args = [self._now_arg(now), *ids[start:start + BATCH]]
            res = self._run("make_due", self._all_queues(), args, safe=True, all_queues=True)
            total += int(res[1])
        return total

    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        res = self._run("cancel", self._guess([job_id]), [self._now_arg(now), int(job_id)],
                        safe=False)
        done = bool(int(res[1]))
        if done:
            self._forget(job_id)
        return done

    def cancel_many(self, job_ids: Sequence[int], *, now: float | None = None) -> list[int]:
        ids = sorted({int(i) for i in job_ids})
        if not ids:
            return []
        # One script: the blocks of every queue the jobs and their cascades touch are asked
        # for ('need') before it writes anything.
        res = self._run("cancel_many", self._guess(ids), [self._now_arg(now), *ids],
                        safe=False)
        done = [int(i) for i in res[1:]]
        for i in done:
            self._forget(i)
        return done

    # -- workers --------------------------------------------------------------------------
    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        doc = json.dumps({
            "queues": list(info.queues), "concurrency": info.concurrency, "host": info.host,
            "pid": info.pid, "started_at": info.started_at, "running": info.running,
            "stuck": info.stuck,
        })
        self._run("record_worker", [], [self._now_arg(now), info.id, doc], safe=True)

    def remove_worker(self, worker_id: str) -> None:
        self._run("remove_worker", [], [worker_id], safe=True)

    def startup_warnings(self) -> list[str]:
        """Settings of this Redis that can lose or delete jobs, as sentences for the worker
        log."""
        t = self._transport
        where = self._where
        warnings: list[str] = []
        info: dict[str, Any] = t.call("read server info", lambda: t.r.info("persistence"),
                                      safe=True)
        memory: dict[str, Any] = t.call("read server info", lambda: t.r.info("memory"), safe=True)

        def config(name: str) -> str | None:
            def read() -> str | None:
                try:
                    got = t.r.config_get(name)
                except redis.ResponseError:
                    return None  # managed services often refuse CONFIG; say what INFO tells
                value = got.get(name) if isinstance(got, dict) else None
                return None if value is None else str(value)

            # A safe read: a broken connection is retried (unguarded, it ended the worker's
            # start).
            return t.call("read the config", read, safe=True)

        if not int(info.get("aof_enabled", 0)):
            save = config("save")
            if save == "":
                warnings.append(
                    f"Redis at {where} has no persistence (appendonly no, save \"\"): a restart "
                    "of Redis loses every job, including acknowledged enqueues. Use appendonly "
                    "yes (see docs/redis.md)."
                )
            else:
                rule = f" (save {save!r})" if save else ""
                warnings.append(
                    f"Redis at {where} persists by RDB snapshots only{rule}: a crash of Redis "
                    "loses the jobs enqueued and the results written since the last snapshot. "
                    "Use appendonly yes (see docs/redis.md)."
                )
        elif config("appendfsync") == "no":
            warnings.append(
                f"Redis at {where} uses appendfsync no: an OS crash or power loss can lose the "
                "last ~30 s of writes. Use appendfsync everysec or always (see docs/redis.md)."
            )
        warnings += _exposure_warnings(self._redis_url, where)
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        if policy != "noeviction":
            warnings.append(
                f"Redis at {where} has maxmemory-policy {policy}: under memory pressure Redis "
                "would silently delete jobs. Use maxmemory-policy noeviction."
            )
        return warnings
