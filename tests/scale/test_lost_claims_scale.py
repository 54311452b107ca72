"""Killed connections under load on Redis: claims whose reply was lost cost no attempt
(issue 32 item 3). Before the fix, 42 ``CLIENT KILL``s during a run of max_attempts=1 jobs sent
12 jobs that never ran to the dead-letter queue.

A worker (concurrency 4, prefetch 4: plain claims, claims riding with acks, the idle wait's
claims, and claims sent ahead from the event loop) runs short max_attempts=1 jobs on a private
redis-server while a thread kills every client connection (``CLIENT KILL TYPE normal``) over
and over. Every job must succeed with attempts 1 (none dead, none run twice), and the claims
whose reply was lost must have been given back (counted by a spy on release_claim)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scalekit import report, size
from support import running_worker, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "redis"))
from redisrig import RedisServer

from conveyor import Conveyor, JobState
from conveyor.backends.redis import RedisBackend


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path, appendonly=False).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.timeout(900)
def test_lost_claims_under_client_kills(server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    n = size(2_000, 20_000)
    given_back = {"claims": 0, "jobs": 0}
    real_release_claim = RedisBackend.release_claim

    def release_claim(self: RedisBackend, *args: Any, **kw: Any) -> list[int]:
        released = real_release_claim(self, *args, **kw)
        given_back["claims"] += 1
        given_back["jobs"] += len(released)
        return released

    monkeypatch.setattr(RedisBackend, "release_claim", release_claim)
    app = Conveyor(server.url)
    admin = server.client()
    kills = {"n": 0, "clients": 0}
    done = threading.Event()

    def killer() -> None:
        while not done.wait(0.005):
            kills["clients"] += int(admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
            kills["n"] += 1

    try:
        @app.task(name="lost.double", max_attempts=1)
        def double(i: int) -> int:
            return 2 * i

        ids = [j.id for j in double.enqueue_many([(i,) for i in range(n)])]
        thread = threading.Thread(target=killer, daemon=True)
        with running_worker(app, concurrency=4, prefetch=4, poll_interval=0.05):
            # The kills start once the worker runs jobs: its start-up reads (startup_warnings'
            # CONFIG GET) are not what this measures.
            wait_until(lambda: (j := app.backend.get(ids[0])) is not None and j.state is JobState.SUCCEEDED,
                       30, message="the worker's first job")
            thread.start()
            try:
                def finished() -> bool:
                    stats = {q.queue: q for q in app.backend.stats().queues}["default"]
                    return stats.succeeded + stats.dead == n

                try:
                    wait_until(finished, size(120, 900), interval=0.2, message="every job to finish")
                except AssertionError as exc:
                    stuck = [j for j in (app.backend.get(i) for i in ids) if j is not None and not j.is_final]
                    raise AssertionError(f"{exc}; unfinished: {stuck[:5]}") from None
            finally:
                done.set()
                thread.join(5)
        jobs = [app.backend.get(i) for i in ids]
        dead = [j.id for j in jobs if j is not None and j.state is JobState.DEAD]
        reruns = [j.id for j in jobs if j is not None and j.attempts != 1]
        report("lost_claims_under_client_kills", "redis", jobs=n, kill_rounds=kills["n"],
               connections_killed=kills["clients"], claims_given_back=given_back["claims"],
               jobs_given_back=given_back["jobs"], dead=len(dead), attempts_not_1=len(reruns))
        assert kills["clients"] > 0
        assert dead == [], [app.backend.get(i) for i in dead[:3]]
        assert reruns == []
        assert all(j is not None and j.state is JobState.SUCCEEDED for j in jobs)
    finally:
        done.set()
        admin.close()
        app.close()
