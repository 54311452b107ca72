"""A broker companion's outbox on Redis (Backend.outbox_sweep): P:outbox, a ZSET of the jobs
whose message the broker has not confirmed, score = since when. The enqueue script marks the
jobs it creates while ``outbox`` is on (enqueue.lua); the sweep is outbox_sweep.lua."""

from __future__ import annotations

from collections.abc import Sequence

from ...job import Job
from .core import RedisCore


class OutboxMixin(RedisCore):
    def outbox_mark(self, job_ids: Sequence[int], *, now: float | None = None) -> None:
        if not job_ids:
            return
        at = self.now() if now is None else float(now)
        key = self.keys.store["outbox"]
        marks = {str(int(i)): at for i in job_ids}
        self._transport.call("mark the outbox",
                             lambda: self._transport.r.zadd(key, marks), safe=True)

    def outbox_confirm(self, job_ids: Sequence[int]) -> None:
        if not job_ids:
            return
        key = self.keys.store["outbox"]
        ids = [str(int(i)) for i in job_ids]
        self._transport.call("confirm the outbox",
                             lambda: self._transport.r.zrem(key, *ids), safe=True)

    def outbox_sweep(self, *, older_than: float, limit: int = 100,
                     now: float | None = None) -> list[Job]:
        while True:  # past batches of marks that need no message (base.py)
            looked, due = self._run("outbox_sweep", [], [self._now_arg(now),
                                                         repr(float(older_than)), int(limit)],
                                    safe=False)
            if due or int(looked) < limit:
                break
        jobs = [self.get(int(i)) for i in due]
        return sorted((j for j in jobs if j is not None), key=lambda j: j.id)
