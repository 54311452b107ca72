"""A companion's outbox sweep past a big backlog of marks that need no message.

Marks outlive their need when a producer dies after its publish but before clearing them, or
the store fails the clearing write: their jobs run and finish, the marks stay. A sweep clears
them as it meets them; the jobs still waiting for their message, behind that backlog, must
all come out of one sweep, not 100 per interval (the sweep used to end at the first batch of
marks that needed none).

CI: 20,000 stale marks and 500 waiting jobs. Full: 1,000,000 and 10,000, on every store.
"""

from __future__ import annotations

import resource
import time

from scalekit import report, size
from support import T0, new_job

from conveyor.backends import open_backend

STALE = size(20_000, 1_000_000)
WAITING = size(500, 10_000)
CHUNK = 10_000
GONE_IDS = 10**12  # ids no job has: the marks of jobs already gone


def test_one_sweep_finds_every_waiting_job_behind_a_million_stale_marks(store_url: str) -> None:
    backend = open_backend(store_url)
    backend.outbox = True
    try:
        for start in range(0, STALE, CHUNK):
            backend.outbox_mark(range(GONE_IDS + start, GONE_IDS + min(start + CHUNK, STALE)),
                                now=T0 - 10)  # older than every waiting job's mark
        waiting: list[int] = []
        for start in range(0, WAITING, 1000):
            made = backend.enqueue_many([new_job() for _ in range(min(1000, WAITING - start))],
                                        now=T0)
            waiting += [r.id for r in made]
        t0 = time.perf_counter()
        found: list[int] = []
        calls = 0
        while True:
            jobs = backend.outbox_sweep(older_than=60, limit=100, now=T0 + 61)
            calls += 1
            if not jobs:
                break
            found += [j.id for j in jobs]
            backend.outbox_confirm([j.id for j in jobs])
        took = time.perf_counter() - t0
        assert sorted(found) == sorted(waiting)
        assert backend.outbox_sweep(older_than=0, limit=100, now=T0 + 3600) == []  # all cleared
        report("outbox_sweep_past_stale_marks", store_url.split(":", 1)[0], stale=STALE,
               waiting=WAITING, sweep_calls=calls, sweep_s=round(took, 2),
               marks_per_s=round((STALE + WAITING) / max(took, 1e-9)),
               max_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    finally:
        backend.close()
