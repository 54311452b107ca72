"""What the pages derive from jobs and samples: a job's attempts, rates, workers per queue."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..backends.base import QueueStats, WorkerInfo
from ..job import Job, JobState
from . import formatting as fmt
from .sampler import Sample


@dataclass
class Attempt:
    number: int
    outcome: str  # "failed", "timeout", "lease expired", "rejected", "running", "succeeded", ...
    css: str
    worker: str | None
    started: float | None = None
    ended: float | None = None
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    round_start: bool = False

    @property
    def duration(self) -> float | None:
        if self.started is None or self.ended is None or self.ended < self.started:
            return None
        return self.ended - self.started


@dataclass
class QueueRow:
    stats: QueueStats
    rate: float | None
    spark: str
    workers: int

ERROR_OUTCOMES = {"timeout": ("timed out", "warn"), "lease_expired": ("lease expired", "warn"),
                  "rejected": ("rejected", "bad"), "retry": ("asked to retry", "warn"),
                  "unknown_task": ("unknown task", "bad"),
                  "bad_arguments": ("bad arguments", "bad"),
                  "dead_on": ("not retried (dead_on)", "bad"),
                  "not_in_retry_on": ("not retried (retry_on)", "bad"),
                  "cancelled": ("cancelled", "muted")}


def attempts_of(job: Job) -> list[Attempt]:
    """Every attempt, oldest first: each failed one from the job's error records, then the
    running or finished last one. A redrive starts the numbering again: marked as a new round."""
    out: list[Attempt] = []
    previous = 0
    for i, err in enumerate(job.errors):
        number = int(err.get("attempt") or 0)
        outcome, css = ERROR_OUTCOMES.get(str(err.get("kind") or ""), ("failed", "bad"))
        at = err.get("at")
        a = Attempt(number=number, outcome=outcome, css=css, worker=err.get("worker_id"),
                    ended=float(at) if isinstance(at, int | float) else None,
                    error_type=str(err.get("type") or ""),
                    message=fmt.mask(str(err.get("message") or "")),
                    traceback=fmt.mask(str(err.get("traceback") or "")),
                    round_start=i > 0 and number <= previous)
        previous = number
        out.append(a)
    new_round = bool(out) and job.attempts <= previous
    if job.state is JobState.RUNNING:
        out.append(Attempt(job.attempts, "running", "run", job.worker_id,
                           started=job.attempted_at, round_start=new_round))
    elif job.state is JobState.SUCCEEDED:
        out.append(Attempt(job.attempts, "succeeded", "ok", job.worker_id,
                           started=job.attempted_at, ended=job.finished_at, round_start=new_round))
    elif job.state is JobState.CANCELLED:
        out.append(Attempt(job.attempts, "cancelled", "muted", job.worker_id,
                           started=job.attempted_at, ended=job.finished_at))
    elif (out and job.attempted_at is not None and out[-1].number == job.attempts
          and job.attempts > 0):
        # The last failure was the latest claim (dead, or waiting for a retry): it began then.
        out[-1].started = job.attempted_at
    return out


def recent_rate(samples: Sequence[Sample], pick: Callable[[QueueStats], float],
                queue: str | None = None, window: float = 60.0) -> float | None:
    """Increase per second of a counter over about the last ``window`` seconds of samples."""
    if len(samples) < 2:
        return None
    last = samples[-1]
    first = next((s for s in samples if last.at - s.at <= window), samples[0])
    if first is last:
        first = samples[-2]

    def total(s: Sample) -> float:
        if queue is not None:
            q = s.queues.get(queue)
            return pick(q) if q else 0.0
        return sum(pick(q) for q in s.queues.values())

    span = last.at - first.at
    delta = total(last) - total(first)
    return delta / span if span > 0 and delta >= 0 else None


def workers_by_queue(workers: Sequence[WorkerInfo]) -> dict[str, int]:
    out: dict[str, int] = {}
    for w in workers:
        for q in w.queues:
            out[q] = out.get(q, 0) + 1
    return out
