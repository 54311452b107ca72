"""The overview's totals that come from two sources, worked out so they can be shown together.

Running jobs: the store counts a job running from the moment it is claimed until its outcome is
written; a worker reports its busy slots in its heartbeat. The two differ for good reasons (a
job claimed since the last heartbeat or held for a free slot, one finished since, a worker that
died with jobs leased) and the overview names them instead of showing two numbers that disagree.

Throughput: the card and the chart read the same samples; the card is a mean over a window it
states, in the chart's unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..backends.base import Backend, Stats
from ..job import JobState
from . import formatting as fmt
from .sampler import Sample

# Running jobs read to explain a gap between the store's count and the workers' (as the workers
# page reads them): beyond this the explanation says it is partial.
RUNNING_LISTED = 500
THROUGHPUT_WINDOW = 60.0


@dataclass
class RunningCounts:
    store: int  # jobs in the running state
    reported: int  # jobs the live workers' last heartbeats say run in their slots
    stuck: int  # slots held by a thread past its job's end: busy, but no running job
    capacity: int
    heartbeat_age: float | None = None  # the oldest of the live workers' last heartbeats
    unreported: int = 0  # on a live worker beyond its last heartbeat's count
    finished_since: int = 0  # in a heartbeat's count, no longer running in the store
    orphaned: int = 0  # leased to no live worker (stopped heartbeating, or died)
    expired: int = 0  # lease run out, not yet taken back by a reaper
    partial: bool = False  # more running jobs than were read to explain the gap

    @property
    def busy(self) -> int:
        return self.reported + self.stuck

    @property
    def differ(self) -> bool:
        return self.store != self.busy or self.expired > 0


def running_counts(stats: Stats, backend: Backend) -> RunningCounts:
    live = {w.id: w.running for w in stats.workers}
    counts = RunningCounts(
        store=sum(q.running for q in stats.queues),
        reported=sum(live.values()),
        stuck=sum(w.stuck for w in stats.workers),
        capacity=sum(w.concurrency for w in stats.workers),
        heartbeat_age=max((stats.now - w.last_seen for w in stats.workers), default=None),
        expired=sum(q.expired_leases for q in stats.queues),
    )
    if counts.store == counts.reported:
        return counts
    # Only a gap costs a read: which worker each running job is leased to.
    page = backend.list_jobs(state=JobState.RUNNING, limit=RUNNING_LISTED)
    counts.partial = page.next_cursor is not None
    per_worker: dict[str, int] = {}
    for job in page.jobs:
        wid = job.worker_id or ""
        if wid in live:
            per_worker[wid] = per_worker.get(wid, 0) + 1
        else:
            counts.orphaned += 1
    for wid, reported in live.items():
        gap = per_worker.get(wid, 0) - reported
        if gap > 0:
            counts.unreported += gap
        else:
            counts.finished_since -= gap
    return counts


@dataclass
class Throughput:
    per_second: float | None
    span: float  # seconds the mean is over
    jobs: int  # succeeded in that span


def throughput(samples: Sequence[Sample], window: float = THROUGHPUT_WINDOW) -> Throughput:
    """Succeeded jobs per second over about the last ``window`` seconds of samples: the same
    readings and unit as the throughput chart, over a span the card states."""
    if len(samples) < 2:
        return Throughput(None, 0.0, 0)
    last = samples[-1]
    first = next((s for s in samples if last.at - s.at <= window), samples[0])
    if first is last:
        first = samples[-2]
    span = last.at - first.at
    done = sum(q.succeeded for q in last.queues.values()) - sum(
        q.succeeded for q in first.queues.values())
    if span <= 0 or done < 0:  # pruning deleted finished jobs: no rate, as the chart's gap
        return Throughput(None, span, 0)
    return Throughput(done / span, span, done)


def per_second(value: float | None) -> str:
    """A rate in the chart's unit, whatever its size (fmt.rate switches to /min below 1/s)."""
    if value is None:
        return fmt.NONE
    if value == 0:
        return "0/s"
    if value >= 100:
        return f"{value:,.0f}/s"
    if value >= 1:
        return f"{value:.1f}/s"
    return f"{value:.2g}/s"
