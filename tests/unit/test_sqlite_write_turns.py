"""SQLite writers in different processes take turns: a writer waiting for the write lock gets
it before a writer in another process that lets it go and at once wants it again.

SQLite's lock is no queue: the waiter sleeps in SQLite's busy handler and the writer that
commits and begins again takes the lock back first. A producer enqueuing back to back kept a
worker in another process from claiming for seconds that way (docs/benchmarks.md, 6 December).

Nothing is timed: this process holds a write transaction open, a child process asks to write
and is left until the operating system shows it asleep (waiting for the lock), then this
process commits and at once writes again; the job ids say whose write came first.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import new_job, wait_until

from conveyor.backends.sqlite import SqliteBackend

CHILD = """
import sys
from conveyor.backends.base import NewJob
from conveyor.backends.sqlite import SqliteBackend
backend = SqliteBackend(sys.argv[1])
backend.now()  # open, migrated, its connection made: its next wait is for the write lock
print("open", flush=True)
sys.stdin.readline()
print("writing", flush=True)
[result] = backend.enqueue_many([NewJob(task="t.child", queue="default", args="{}", max_attempts=1,
                                         timeout=60)])
print(result.id, flush=True)
backend.close()
"""


def state_of(pid: int) -> str:
    # /proc/<pid>/stat: "pid (comm) state ..."; S is asleep (in a lock wait or a nap)
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_writer_waiting_in_another_process_goes_before_the_next_write_here(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db"
    backend = SqliteBackend(url)
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD, url], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdin is not None and child.stdout is not None
            assert child.stdout.readline().strip() == "open"
            with backend._write(None):
                child.stdin.write("go\n")
                child.stdin.flush()
                assert child.stdout.readline().strip() == "writing"
                wait_until(lambda: state_of(child.pid) == "S",
                           message="the child to wait for the write lock")
            # Committed, and the next write asked for at once, as a producer does.
            [mine] = backend.enqueue_many([new_job()])
            child_id = int(child.stdout.readline())
            assert child.wait(30) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child_id < mine.id, "the waiting writer lost its turn to a writer coming back"
    finally:
        backend.close()
