"""A write turn held by a process that stopped does not hold other writers past the bound: the
waiter goes on to SQLite's own lock (which, free here, lets it write at once)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from conveyor.backends.sqlite.turns import WriteTurns


@pytest.mark.timeout(30)  # a blocking wait (no bound) would hang here
def test_a_turn_held_elsewhere_is_waited_for_only_until_the_bound(tmp_path: Path) -> None:
    path = str(tmp_path / "jobs.db")
    # Another open file description holding the turn file, as a stopped process would.
    held = os.open(f"{path}-writers.turn", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_EX)
    turns = WriteTurns(path, wait_s=0.2)
    try:
        entered = False
        with turns.turn():
            entered = True
        assert entered
        # And once it is let go, a turn is taken as before.
        fcntl.flock(held, fcntl.LOCK_UN)
        with turns.turn():
            pass
    finally:
        turns.close()
        os.close(held)
