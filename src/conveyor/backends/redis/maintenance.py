"""Maintenance: reap expired leases, promote due scheduled jobs, sweep the queues' own sets into
the global indexes (for stores written before those existed), prune finished jobs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from ...errors import StorageFull
from ...job import JobState
from ..base import MAX_STALLS, ReapResult
from .core import RedisCore

# Queues one sweep call looks at (see sweep.lua): the first sweep of an unindexed store goes
# round all of them in calls of this many; after it, each reap sweeps one such slice, so a
# lease that only a queue's own ZSET knows (written by an older version) is found within a round.
SWEEP_QUEUES = 200
SWEEP_PER_REAP = 20
# The first prune of a store written before P:done:<state> copies every queue's finished sets
# into them (see sweep_done.lua): entries one call copies at most, spread over its queues.
DONE_SWEEP_BUDGET = 20_000
CLOCK_MARGIN_S = 5.0  # how far past its own clock the client looks for due entries (_due_bound)


class MaintenanceMixin(RedisCore):
    def reap(self, *, limit: int = 1000, now: float | None = None) -> ReapResult:
        if limit <= 0:
            return ReapResult()
        self._sweep_all(now)
        due = self._due_queues(self.keys.leases, f"({self._due_bound(now)!r}", limit)
        queues = due + self._sweep_slice()
        res = self._run("reap", queues, [self._now_arg(now), limit, MAX_STALLS], safe=True)
        of = {int(i): str(q, "utf-8") if isinstance(q, bytes) else str(q)
              for ids, names in ((res[1], res[4]), (res[2], res[5]))
              for i, q in zip(ids, names, strict=True)}
        return ReapResult(requeued=sorted(int(i) for i in res[1]),
                          dead=sorted(int(i) for i in res[2]), queues=of)

    def promote(self, *, limit: int = 1000, now: float | None = None) -> int:
        if limit <= 0:
            return 0
        self._sweep_all(now)
        queues = self._due_queues(self.keys.schedule, repr(self._due_bound(now)), limit)
        res = self._run("promote", queues, [self._now_arg(now), limit], safe=True)
        return int(res[1])

    @staticmethod
    def _due_bound(now: float | None) -> float:
        """The time up to which the client looks for due entries. Without an injected time it
        cannot know Redis's clock, so it looks a little past its own: the script decides by
        Redis's, and asks ('need') for a queue the client missed."""
        return now if now is not None else time.time() + CLOCK_MARGIN_S

    def _due_queues(self, key: str, bound: str, limit: int) -> list[str]:
        """The queues of the entries of P:leases or P:schedule due by ``bound``: the blocks the
        reap or promote script will need, read first so that it needs one call."""
        members = self._transport.call(
            "read due entries",
            lambda: self._transport.r.zrangebyscore(key, "-inf", bound, start=0, num=limit),
            safe=True)
        return list(dict.fromkeys(str(m).partition("/")[2] for m in members))

    def maintenance_turn(self, interval: float) -> bool:
        """A key taken with SET NX PX for ``interval``, left to expire: the first worker to ask
        in each interval reaps and promotes, the others skip (their calls would find
        nothing)."""
        ms = max(1, int(interval * 1000))
        took = self._transport.call(
            "maintenance turn",
            lambda: self._transport.r.set(self.keys.maintenance, self._id, nx=True, px=ms),
            safe=False)
        return bool(took)

    def _sweep_all(self, now: float | None) -> None:
        """Once per backend: if the store is not marked indexed (written by a version before
        P:leases and P:schedule), sweep every queue into them (see sweep.lua), then mark it."""
        if self._swept:
            return
        r = self._transport.r
        if not self._transport.call("check indexes", lambda: r.exists(self.keys.indexed),
                                    safe=True):
            queues = self._refresh_queues()
            for start in range(0, len(queues), SWEEP_QUEUES):
                self._run("sweep", queues[start:start + SWEEP_QUEUES], [self._now_arg(now), 1000],
                          safe=True)
            self._transport.call("mark indexed", lambda: r.set(self.keys.indexed, "1"),
                                 safe=True)
        self._swept = True

    def _sweep_slice(self) -> list[str]:
        """The next few queues of the queue set, going round it: each reap also sweeps them (a
        lease only a queue's own set knows, written by a worker of the previous version still
        running during an upgrade, is found within one round)."""
        chunk, self._sweep_at = self._round_robin(self._sweep_at)
        return chunk

    def _round_robin(self, at: int) -> tuple[list[str], int]:
        """The SWEEP_PER_REAP queues of the queue set from position ``at``, and where the next
        slice starts; the set is read again at the start of each round."""
        queues = self._all_queues()
        if at >= len(queues):
            at = 0
            queues = self._refresh_queues()
        return queues[at:at + SWEEP_PER_REAP], at + SWEEP_PER_REAP

    def _sweep_done_all(self) -> None:
        """Once per backend: if the store is not marked as having P:done:<state> (written by a
        version before them), copy every queue's finished sets into them (see sweep_done.lua),
        in bounded calls, then mark it."""
        if self._done_swept:
            return
        r = self._transport.r
        if not self._transport.call("check finished index",
                                    lambda: r.exists(self.keys.indexed_done), safe=True):
            cursors = {q: ["-inf"] * 3 for q in self._refresh_queues()}
            while cursors:
                batch = list(cursors)[:SWEEP_QUEUES]
                per_set = max(100, DONE_SWEEP_BUDGET // (3 * len(batch)))
                args = [per_set, *(c for q in batch for c in cursors[q])]
                res = self._run("sweep_done", batch, args, safe=True)
                for i, q in enumerate(batch):
                    nxt = [str(c) for c in res[1][3 * i:3 * i + 3]]
                    if any(nxt):
                        cursors[q] = nxt
                    else:
                        del cursors[q]
            # At maxmemory the mark is refused (SET is no script with allow-oom) while prune must
            # go on freeing memory: left unmarked, the store is copied again (idempotent) by the
            # next backend.
            with contextlib.suppress(StorageFull):
                self._transport.call("mark finished index",
                                     lambda: r.set(self.keys.indexed_done, "1"), safe=True)
        self._done_swept = True

    def prune(
        self, *, older_than: float, states: Sequence[JobState] = (JobState.SUCCEEDED,),
        limit: int = 1000, now: float | None = None,
    ) -> int:
        names = []
        for state in states:
            if not JobState(state).is_final:
                raise ValueError(f"prune only deletes finished jobs, not {state}")
            names.append(str(JobState(state)))
        if limit <= 0 or not names:
            return 0
        self._sweep_done_all()
        # The slice first: the script tidies (and sweeps) its first len(chunk) blocks.
        chunk, self._prune_at = self._round_robin(self._prune_at)
        bound = f"({self._due_bound(now) - float(older_than)!r}"
        due = [q for name in names
               for q in self._due_queues(self.keys.done_index(name), bound, 2 * limit)]
        args = [self._now_arg(now), repr(float(older_than)), limit, len(chunk), *names]
        res = self._run("prune", chunk + [q for q in due if q not in chunk], args, safe=True)
        return int(res[1])
