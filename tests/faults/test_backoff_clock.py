"""R8 against a real clock: a retry never starts before its delay has passed on the store's
clock, and the scheduled run_at is computed from store time (every backend)."""

from __future__ import annotations

from support import running_worker, wait_for_job

from conveyor import Conveyor, Retry, current_job
from conveyor.job import JobState

DELAYS = (0.3, 0.6, 0.2)


def test_r8_retries_wait_their_delay_on_the_store_clock(app: Conveyor) -> None:
    starts: list[float] = []

    @app.task(name="flaky", max_attempts=len(DELAYS) + 1)
    def flaky() -> str:
        ctx = current_job()
        assert ctx is not None
        starts.append(app.backend.now())
        if ctx.attempt <= len(DELAYS):
            raise Retry(delay=DELAYS[ctx.attempt - 1])
        return "done"

    job = flaky.enqueue()
    with running_worker(app, poll_interval=0.05):
        done = wait_for_job(app, job.id, timeout=30)
    assert done.state is JobState.SUCCEEDED and done.attempts == len(DELAYS) + 1
    failed_at = [e["at"] for e in done.errors]
    assert len(failed_at) == len(DELAYS)
    for n, delay in enumerate(DELAYS):
        waited = starts[n + 1] - failed_at[n]
        # Never early (a few ms for the clock read in the task); not stuck either.
        assert waited >= delay - 0.01, (n, delay, waited)
        assert waited < delay + 5.0, (n, delay, waited)
