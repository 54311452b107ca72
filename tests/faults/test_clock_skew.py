"""R12: workers whose clocks are an hour fast and an hour slow share a store. Leases and due
times come from the store's clock, so no lease is taken early (every job runs once, at its
first attempt) and no scheduled job starts before its run_at (every backend)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import wait_until

from conveyor import Conveyor
from conveyor.job import JobState

pytestmark = [pytest.mark.faults, pytest.mark.process]

APP = textwrap.dedent('''
    import json, os, time
    from conveyor import Conveyor, current_job

    app = Conveyor(visibility_timeout=2)

    @app.task(name="skew.work", max_attempts=5)
    def work(n: int) -> None:
        time.sleep(0.5)  # a quarter of the lease: heartbeats keep it, a skewed clock must not
        ctx = current_job()
        line = json.dumps({"n": n, "attempt": ctx.attempt if ctx else 0, "pid": os.getpid()})
        fd = os.open(os.environ["SKEW_MARKER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (line + "\\n").encode())
        os.close(fd)
''')

# Run the CLI with time.time shifted: the worker's own clock is wrong by `offset` seconds.
LAUNCH = ("import sys, time; _t = time.time; offset = float(sys.argv.pop(1)); "
          "time.time = lambda: _t() + offset; from conveyor.cli import main; sys.argv[0] = 'conveyor'; main()")


def test_r12_skewed_worker_clocks_change_nothing(store_url: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    module = f"skewapp_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(APP)
    marker = tmp_path / "runs.jsonl"
    env = {**os.environ, "CONVEYOR_URL": store_url, "SKEW_MARKER": str(marker),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    monkeypatch.setenv("CONVEYOR_URL", store_url)
    monkeypatch.syspath_prepend(str(tmp_path))
    app: Conveyor = importlib.import_module(module).app  # the workers' own app, to enqueue with
    try:
        task = app.tasks["skew.work"]
        now = app.backend.now()
        task.enqueue_many([(n,) for n in range(24)])
        later = [task.options(run_at=now + 3.0).enqueue(100 + n) for n in range(6)]
        procs = [
            subprocess.Popen([sys.executable, "-c", LAUNCH, str(offset), "--app", f"{module}:app", "--log-level",
                              "WARNING", "worker", "--concurrency", "4", "--queues", "default", "--grace", "5"],
                             env=env, cwd=tmp_path, stderr=subprocess.PIPE)
            for offset in (3600.0, -3600.0)
        ]
        try:
            def runs() -> list[dict[str, int]]:
                if not marker.exists():
                    return []
                return [json.loads(line) for line in marker.read_text().splitlines()]

            wait_until(lambda: len({r["n"] for r in runs()}) >= 30, timeout=60, message="all 30 jobs ran")
            # The skew took: each worker row's started_at comes from its own (wrong) clock.
            started = sorted(w.started_at for w in app.backend.stats().workers)
            assert len(started) == 2 and started[1] - started[0] > 7000, started
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            errs = [p.communicate(timeout=30)[1].decode(errors="replace") for p in procs]
        recs = runs()
        assert sorted(r["n"] for r in recs) == sorted([*range(24), *range(100, 106)]), errs
        assert all(r["attempt"] == 1 for r in recs), "a lease was taken early by a skewed clock"
        assert len({r["pid"] for r in recs}) == 2, "both skewed workers should have run jobs"
        for job in later:
            stored = app.get_job(job.id)
            assert stored.state is JobState.SUCCEEDED
            assert stored.attempted_at is not None and stored.attempted_at >= stored.run_at, stored
    finally:
        app.close()
        sys.modules.pop(module, None)
