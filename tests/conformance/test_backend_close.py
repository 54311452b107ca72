"""Backend contract: ``close()`` from one thread while another thread's call is inside the store.

A stopped worker can leave a store call running in one of its threads (a reaper pass, a
heartbeat) while the app closes the backend. The call must finish or fail with a
``StoreError``; the process must not crash (closing an SQLite connection under a running
statement did: a segmentation fault in CI), and a call after ``close()`` says it is closed.

Each store is held still by a second client so the call is inside it when ``close()`` comes:
SQLite's write lock held by another connection, PostgreSQL's table lock, Redis's
``CLIENT PAUSE ... WRITE``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from support import new_job

from conveyor.backends import open_backend
from conveyor.backends.base import Backend
from conveyor.errors import StoreError

HOLD_S = 0.6


@contextlib.contextmanager
def store_held(url: str) -> Iterator[None]:
    """Writers to the store at ``url`` block until the block exits (at most a few seconds)."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        import sqlite3

        from conveyor.backends.sqlite import parse_sqlite_url

        raw = sqlite3.connect(parse_sqlite_url(url)[0], isolation_level=None)
        raw.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            raw.execute("ROLLBACK")
            raw.close()
    elif scheme.startswith("postgres"):
        import psycopg

        schema = parse_qs(urlsplit(url).query)["options"][0].split("=", 1)[1]
        with psycopg.connect(url.split("?", 1)[0], connect_timeout=3) as conn:
            conn.execute(f'LOCK TABLE "{schema}".conveyor_jobs IN ACCESS EXCLUSIVE MODE')
            yield
            conn.rollback()
    elif scheme.endswith("+cluster"):  # the node that serves the app's slot (its route)
        held = open_backend(url)
        client = held._transport.r  # type: ignore[attr-defined]
        client.client_pause(int(HOLD_S * 3 * 1000), all=False)  # writes (scripts too) wait
        try:
            yield
        finally:
            client.client_unpause()
            held.close()
    else:
        import redis

        client = redis.Redis.from_url(url.split("?", 1)[0], socket_timeout=5)
        client.client_pause(int(HOLD_S * 3 * 1000), all=False)  # writes (scripts too) wait
        try:
            yield
        finally:
            client.client_unpause()
            client.close()


@pytest.mark.needs("listing")
def test_close_during_a_call_in_another_thread(store_url: str, store_state: str | None) -> None:
    setup = open_backend(store_url, state=store_state)  # creates the schema before the hold
    setup.close()
    backend: Backend = open_backend(store_url, state=store_state)
    outcome: dict[str, object] = {}
    inside = threading.Event()

    def call() -> None:
        inside.set()
        try:
            outcome["ids"] = [r.id for r in backend.enqueue_many([new_job(args={"n": 1})])]
        except StoreError as exc:
            outcome["error"] = exc
        except BaseException as exc:  # anything else is a failure of the contract
            outcome["unexpected"] = exc

    # With a broker, its companion store: the record is written first.
    with store_held(store_state or store_url):
        t = threading.Thread(target=call)
        t.start()
        assert inside.wait(5)
        time.sleep(HOLD_S / 3)  # the call is blocked inside the store now
        assert t.is_alive(), outcome
        backend.close()  # from this thread, while the call is inside the store
        time.sleep(HOLD_S / 3)
    t.join(30)
    assert not t.is_alive(), "the call never returned after close()"
    assert "unexpected" not in outcome, outcome["unexpected"]
    assert ("ids" in outcome) != ("error" in outcome), outcome

    with pytest.raises(StoreError, match="closed"):
        backend.enqueue_many([new_job(args={"n": 2})])

    after = open_backend(store_url, state=store_state)
    try:
        stored = after.list_jobs(limit=10).jobs
        if "ids" in outcome:  # acknowledged: it is there, whole
            assert [j.id for j in stored] == outcome["ids"]
            assert stored[0].args == {"n": 1}
        else:  # refused: nothing half-written
            assert all(j.args == {"n": 1} for j in stored) and len(stored) <= 1
    finally:
        after.close()


def hammer_and_close(url: str, rounds: int, state: str | None) -> None:
    """Four threads calling the store as fast as they can while the main thread closes it,
    ``rounds`` times. Run in a child process: a crash must fail the test, not end the run."""
    from conveyor.backends.base import NewJob

    open_backend(url, state=state).close()
    unexpected: list[BaseException] = []
    for _ in range(rounds):
        b = open_backend(url, state=state)
        stop = threading.Event()

        def calls(b: Backend = b, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                try:
                    b.reap(limit=10)
                    b.enqueue_many([NewJob(task="t.task", queue="default", args="{}", max_attempts=3,
                                           timeout=30.0)])
                    b.stats()
                except StoreError:
                    return
                except BaseException as exc:
                    unexpected.append(exc)
                    return

        threads = [threading.Thread(target=calls) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.005)
        b.close()
        stop.set()
        for t in threads:
            t.join(30)
            assert not t.is_alive()
    assert not unexpected, unexpected[:3]


def test_close_races_with_calls_in_other_threads(store_url: str, store_state: str | None) -> None:
    """Closing while other threads keep calling: before the fix, SQLite crashed within a few
    dozen rounds (a connection closed between a call's check and its statement)."""
    import subprocess
    import sys

    rounds = 150 if store_url.startswith("sqlite") else 20
    tests = str(Path(__file__).parent.parent)
    state = [store_state] if store_state else []
    proc = subprocess.run([sys.executable, __file__, store_url, str(rounds), *state],
                          capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": tests})
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"


if __name__ == "__main__":
    import sys

    hammer_and_close(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
