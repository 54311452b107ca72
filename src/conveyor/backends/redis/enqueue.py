"""Writing jobs: enqueue (in chunks, or one plain job by the lean script), cron ticks, and
step records."""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Sequence
from typing import Any, cast

from ...errors import (
    InvalidName,
    JobNotFound,
    PayloadError,
    QueueFull,
    StoreError,
    UnknownParent,
)
from ...payload import NAME_RE
from ..base import (
    CronState,
    EnqueueResult,
    NewBatch,
    NewJob,
    new_uid_text,
    new_uids,
    queue_full,
)
from .core import MAX_CACHED_QUEUES, RedisCore
from .scripts import OOM_SLACK

# Most jobs one enqueue script call writes. Redis runs one script at a time and every other
# client waits meanwhile (heartbeats too): a batch of tens of thousands of jobs in one script
# held every other client for over a second.
ENQUEUE_CHUNK = 1000


class EnqueueMixin(RedisCore):
    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None,
                     batches: Sequence[NewBatch] = ()) -> list[EnqueueResult]:
        """Up to ENQUEUE_CHUNK jobs: one atomic script, all or nothing. A bigger batch is every
        job checked first (a bad one anywhere writes nothing), then written ENQUEUE_CHUNK jobs
        per script, in order, each chunk all or nothing, so Redis is never held for long. A
        chunk that fails (QueueFull, StorageFull, StoreUnavailable) leaves the chunks before it
        written, and the error says how many jobs that is. Ids increase in batch order; another
        producer's jobs may come between two chunks.

        A batch with dependencies (after, after_refs) or batches is never split: a reference
        may cross any chunk boundary, and the parents' checks and the children's edges must be
        one write, so it is one script however long."""
        if not jobs and not batches:
            return []
        if len(jobs) <= ENQUEUE_CHUNK or batches or any(_linked(j) for j in jobs):
            res = self._enqueue(jobs, "", 0.0, now, batches)
            assert res is not None
            return res
        _runs(jobs)  # every job checked before the first chunk is written
        done: list[EnqueueResult] = []
        for start in range(0, len(jobs), ENQUEUE_CHUNK):
            try:
                res = self._enqueue(jobs[start:start + ENQUEUE_CHUNK], "", 0.0, now)
            except (QueueFull, StoreError) as exc:
                if not done:
                    raise
                raise _partly_written(exc, len(done), len(jobs)) from exc
            assert res is not None
            done += res
        return done

    def _enqueue(self, jobs: Sequence[NewJob], cron: str, tick: float,
                 now: float | None,
                 batches: Sequence[NewBatch] = ()) -> list[EnqueueResult] | None:
        """Run the enqueue script; with a cron schedule name, only if it takes that tick (None
        if not)."""
        if not cron and not batches and len(jobs) == 1 and _plain(jobs[0]) and not self.outbox:
            return [self._enqueue_one(jobs[0], now)]
        head: list[Any] = [self._now_arg(now), cron, repr(float(tick)), len(batches),
                           "1" if self.outbox else "0"]
        for batch in batches:
            _check_batch_id(batch.id, "NewBatch.id")
            if batch.parent_id is not None:
                _check_batch_id(batch.parent_id, "NewBatch.parent_id")
        runs, texts, queues = _runs(jobs)
        uid_text = new_uid_text(len(jobs))
        args: list[Any] = [*head, uid_text, len(queues)]  # (one queue per run)
        for batch in batches:
            args += [batch.id, batch.parent_id or ""]
        args += runs
        args += texts
        res = self._run("enqueue", queues, args, safe=False)
        if res and res[0] == "full":
            raise queue_full(str(res[1]), int(res[2]), int(res[3]))
        if res and res[0] == "unknown":
            raise UnknownParent(str(res[1]), f"{res[2]}; nothing was written")
        if res and res[0] == "batch":
            raise StoreError(f"batch {res[1]!r} {res[2]}; nothing was written")
        if res and res[0] in ("taken", "off"):
            return None
        at = float(res[0])
        results = []
        for n, i in enumerate(range(1, len(res), 2)):
            if int(res[i + 1]):
                uid = uid_text[32 * n:32 * n + 32]
                results.append(EnqueueResult(int(res[i]), True, at, uid))
            else:
                results.append(EnqueueResult(int(res[i]), False, at, None))
        return results

    def _enqueue_one(self, job: NewJob, now: float | None) -> EnqueueResult:
        """One plain job (see _plain) by enqueue_one.lua, which writes what the enqueue script
        would with a tenth of its work: most enqueues are one such job, each a round trip."""
        _validate(job, 0)
        keys = self._one_keys.get(job.queue)
        if keys is None:
            keys = self.keys.enqueue_one(job.queue)
            if len(self._one_keys) > MAX_CACHED_QUEUES:
                self._one_keys.clear()
            self._one_keys[job.queue] = keys
        [uid] = new_uids(1)
        args = [self._now_arg(now), job.queue, job.task, job.args, str(job.priority),
                str(job.max_attempts), repr(float(job.timeout)), job.meta, uid]
        res = self._transport.call(
            "enqueue", functools.partial(self._script, "enqueue_one", keys, args), safe=False)
        return EnqueueResult(int(res[1]), True, float(res[0]), uid)

    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        if not isinstance(schedule, str) or not schedule:
            raise ValueError(f"cron schedule name must be a non-empty str, got {schedule!r}")
        if isinstance(tick, bool) or not isinstance(tick, int | float) or not math.isfinite(tick):
            raise ValueError(f"cron tick must be a finite unix time, got {tick!r}")
        res = self._enqueue([] if job is None else [job], schedule, float(tick), now)
        return res[0] if res else None

    def cron_ticks(self) -> dict[str, float]:
        ticks = self._transport.call(
            "read cron ticks", lambda: self._transport.r.hgetall(self.keys.cron), safe=True)
        return {str(name): float(tick) for name, tick in ticks.items()}

    def set_cron_enabled(self, schedule: str, enabled: bool, *,
                         now: float | None = None) -> bool:
        if not isinstance(schedule, str) or not schedule:
            raise ValueError(f"cron schedule name must be a non-empty str, got {schedule!r}")
        args = [self._now_arg(now), schedule, "1" if enabled else "0"]
        return bool(int(self._run("cron_control", [], args, safe=False)))

    def cron_states(self) -> dict[str, CronState]:
        store = self.keys.store

        def read() -> list[dict[Any, Any]]:
            with self._transport.r.pipeline(transaction=True) as pipe:
                for key in (self.keys.cron, store["cron_jobs"], store["cron_off"],
                            store["cron_on"]):
                    pipe.hgetall(key)
                return list(pipe.execute())

        ticks, jobs, off, on = self._transport.call("read cron states", read, safe=True)

        def num(values: dict[Any, Any], name: str) -> float | None:
            value = values.get(name)
            return None if value is None else float(value)

        return {str(name): CronState(
            str(name), float(tick), None if name not in jobs else int(jobs[name]),
            num(off, name), num(on, name)) for name, tick in sorted(ticks.items())}

    def record_step(self, job_id: int, step: str, result: str | None, *,
                    uid: str | None) -> tuple[bool, str | None]:
        if not isinstance(step, str) or not NAME_RE.fullmatch(step):
            raise InvalidName(f"step name must match {NAME_RE.pattern}, got {step!r}")
        if result is not None and not isinstance(result, str):
            raise PayloadError(
                f"the result of step {step!r} must be JSON text, got {type(result).__name__}")
        # Safe to resend: HSETNX changes nothing the second time, and the answer is the stored
        # text.
        text = "null" if result is None else result
        # (see STRICT_SCRIPTS)
        name = "record_step" if len(text) <= OOM_SLACK else "record_step:strict"
        res = self._run(name, [], [int(job_id), step, text, uid or ""], safe=True)
        if res[0] == "missing":
            raise JobNotFound(f"no job with id {job_id}")
        if res[0] == "other":
            raise JobNotFound(f"no job with id {job_id} and uid {uid}: the id now names another "
                              "job (the store lost data and counted its ids again)")
        stored = str(res[2])
        return bool(int(res[1])), None if stored == "null" else stored


# Every field of a NewJob but its args: the jobs of one run share these (see _runs).
_shape = operator.attrgetter(*(f.name for f in dataclasses.fields(NewJob) if f.name != "args"))


def _runs(jobs: Sequence[NewJob]) -> tuple[list[Any], list[str], list[str]]:
    """The jobs as the enqueue script takes them: runs (per run, how many jobs, then the fields
    they share: see enqueue.lua), every job's args, and each run's queue. Consecutive jobs whose
    fields but args are the very same objects (a bulk enqueue's jobs, made by one constructor
    in task.py) are one run, checked and encoded once: per job, only its args are checked and
    sent. Identity, not equality: 1 == 1.0 == True, and only one of them is a valid
    priority."""
    runs: list[Any] = []
    texts: list[str] = []
    queues: list[str] = []
    if not jobs:
        return runs, texts, queues
    first = jobs[0]  # the current run's first job
    shape: tuple[Any, ...] | None = None  # its fields, once a later job needs them
    count_at = 0  # where the current run's count is
    count = 0
    for n, job in enumerate(jobs):
        # The two fields most often a job's own are looked at first: a batch of one-job runs
        # (each job with a unique key or parents of its own) tells a new run without the rest.
        same = False
        if n and job.unique_key is first.unique_key and job.after_refs is first.after_refs:
            if shape is None:
                shape = _shape(first)
            same = all(map(operator.is_, _shape(job), shape))
        if not same:
            if count:
                runs[count_at] = count
            first, shape, count = job, None, 0
            _validate(job, n)
            _validate_links(job, n)
            count_at = len(runs)
            runs += [0, job.queue, job.task, str(job.priority), repr(float(job.delay)),
                     "" if job.run_at is None else repr(float(job.run_at)),
                     str(job.max_attempts), repr(float(job.timeout)),
                     "0" if job.unique_key is None else "1", job.unique_key or "", job.meta,
                     "" if job.max_depth is None else str(int(job.max_depth)),
                     "" if job.unique_for is None else repr(float(job.unique_for)),
                     "0" if job.fair_key is None else "1", job.fair_key or "",
                     job.concurrency_key or "",
                     "" if job.concurrency_limit is None else str(job.concurrency_limit),
                     job.rate_key or "", "" if job.rate_limit is None else str(job.rate_limit),
                     "" if job.rate_period is None else repr(float(job.rate_period)),
                     ",".join(str(int(i)) for i in job.after),
                     ",".join(str(int(i)) for i in job.after_refs),
                     job.on_parent_failure, job.batch_id or "", job.callback_of or ""]
            queues.append(job.queue)
        elif not isinstance(cast(Any, job.args), str):
            _validate(job, n)  # (raises: the args are not JSON text)
        texts.append(job.args)
        count += 1
    if count:
        runs[count_at] = count
    return runs, texts, queues


def _linked(job: NewJob) -> bool:
    """Whether the job has dependencies or belongs to a batch (the general script, unsplit)."""
    return bool(job.after or job.after_refs or job.batch_id is not None
                or job.callback_of is not None)


def _check_batch_id(value: Any, what: str) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= 255:
        raise ValueError(f"{what} must be a str of 1-255 characters, got {value!r}")


def _validate_links(job: NewJob, n: int) -> None:
    """The workflow fields, checked before anything is sent (the script checks that parents
    and batches exist)."""
    for what, ids in (("after", job.after), ("after_refs", job.after_refs)):
        if not isinstance(ids, tuple | list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"job {n} of the batch: {what} must be a tuple of ints, got {ids!r}")
    if job.on_parent_failure not in ("cancel", "run"):
        raise ValueError(f"job {n} of the batch: on_parent_failure must be 'cancel' or 'run', "
                         f"got {job.on_parent_failure!r}")
    for what, value in (("batch_id", job.batch_id), ("callback_of", job.callback_of)):
        if value is not None:
            _check_batch_id(value, f"job {n} of the batch: {what}")


def _plain(job: NewJob) -> bool:
    """A job enqueue_one.lua can write: due now, and none of the options that need the enqueue
    script's checks or extra writes. (Anything else, a bad value included, goes the general
    way.)"""
    return (
        job.unique_key is None and job.unique_for is None and job.max_depth is None
        and job.fair_key is None and job.concurrency_key is None
        and job.concurrency_limit is None and job.rate_key is None and job.rate_limit is None
        and job.rate_period is None and job.run_at is None
        and type(job.delay) in (int, float) and job.delay <= 0 and not _linked(job)
    )


def _partly_written(exc: QueueFull | StoreError, written: int,
                    total: int) -> QueueFull | StoreError:
    """``exc`` of the chunk of enqueue_many that starts at job ``written`` (what it says
    applies to that chunk), with what became of the jobs before and after it."""
    last = min(written + ENQUEUE_CHUNK, total) - 1
    text = (f"{exc} (said of jobs {written}-{last} of a batch of {total}, written in chunks of "
            f"{ENQUEUE_CHUNK}); the first {written} jobs of the batch were enqueued before it, "
            "the jobs after it were not")
    if isinstance(exc, QueueFull):
        return QueueFull(text, queue=exc.queue, depth=exc.depth, limit=exc.limit)
    return type(exc)(text)


def _validate(job: NewJob, n: int) -> None:
    """The rules the SQL stores enforce with CHECK constraints, checked before anything is sent,
    because a Lua script that fails half-way does not roll back what it wrote."""

    def bad(why: str) -> StoreError:
        return StoreError(f"job {n} of the batch ({job.task!r}) breaks the store's rules: {why}; "
                          "nothing was written")

    def is_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    def is_finite(x: Any) -> bool:
        return isinstance(x, int | float) and math.isfinite(x)

    if not is_int(job.max_attempts) or job.max_attempts < 1:
        raise bad(f"max_attempts must be an int >= 1, got {job.max_attempts!r}")
    if not (is_finite(job.timeout) and job.timeout > 0):
        raise bad(f"timeout must be > 0 seconds, got {job.timeout!r}")
    if not isinstance(job.queue, str) or not 1 <= len(job.queue) <= 128:
        raise bad(f"queue name must be 1-128 characters, got {job.queue!r}")
    if not isinstance(job.task, str) or not 1 <= len(job.task) <= 255:
        raise bad(f"task name must be 1-255 characters, got {job.task!r}")
    if not is_int(job.priority) or abs(job.priority) > 2**53:
        raise bad(f"priority must be an int, got {job.priority!r}")
    if job.unique_for is not None and (isinstance(job.unique_for, bool)
                                       or not is_finite(job.unique_for)):
        raise bad(f"unique_for must be a finite number of seconds, got {job.unique_for!r}")
    if job.fair_key is not None and not isinstance(job.fair_key, str):
        raise bad(f"fair_key must be a str, got {job.fair_key!r}")
    if not is_finite(job.delay):
        raise bad(f"delay must be a finite number of seconds, got {job.delay!r}")
    if job.run_at is not None and not is_finite(job.run_at):
        raise bad(f"run_at must be a finite unix time, got {job.run_at!r}")
    if (job.concurrency_key is None) != (job.concurrency_limit is None):
        raise bad("concurrency_key and concurrency_limit go together")
    if job.concurrency_key is not None and not isinstance(job.concurrency_key, str):
        raise bad(f"concurrency_key must be a str, got {job.concurrency_key!r}")
    if job.concurrency_limit is not None and (
        not is_int(job.concurrency_limit) or not 1 <= job.concurrency_limit <= 2**53
    ):
        raise bad(f"concurrency_limit must be an int >= 1, got {job.concurrency_limit!r}")
    if not (job.rate_key is None) == (job.rate_limit is None) == (job.rate_period is None):
        raise bad("rate_key, rate_limit and rate_period go together")
    if job.rate_key is not None and not isinstance(job.rate_key, str):
        raise bad(f"rate_key must be a str, got {job.rate_key!r}")
    if job.rate_limit is not None and (
        not is_int(job.rate_limit) or not 1 <= job.rate_limit <= 2**53
    ):
        raise bad(f"rate_limit must be an int >= 1, got {job.rate_limit!r}")
    if job.rate_period is not None and (
        isinstance(job.rate_period, bool) or not is_finite(job.rate_period)
        or job.rate_period <= 0
    ):
        raise bad(f"rate_period must be a finite number of seconds > 0, got {job.rate_period!r}")
    for what, text in (("args", job.args), ("meta", job.meta)):
        if not isinstance(text, str):
            raise bad(f"{what} must be JSON text")
