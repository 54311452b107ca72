"""P1: a Hypothesis state machine of the job lifecycle, run against every backend with an
injected clock. A plain-Python model predicts each operation's outcome (including which jobs a
claim hands out, in order) and the whole store is compared with it after every step.

Operations: enqueue (now or delayed), claim, heartbeat, ack, retry, kill, release, advance the
clock, reap, redrive, cancel; every lease operation may use a stale token (a zombie).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, rule
from stores import BACKENDS, BackendSpec, BackendUnavailable, _unavailable
from support import new_job

from conveyor.backends import open_backend
from conveyor.backends.base import Backend, ErrorInfo, Lease
from conveyor.errors import LeaseLost
from conveyor.job import JobState

T0 = 1_700_000_000.0
LEASE = 30.0
EXAMPLES = int(os.environ.get("CONVEYOR_MODEL_EXAMPLES", "60"))
STEPS = int(os.environ.get("CONVEYOR_MODEL_STEPS", "50"))


@dataclass
class ModelJob:
    id: int
    state: JobState
    attempt: int
    max_attempts: int
    run_at: float
    tag: int
    token: str | None = None
    lease_until: float | None = None


class Model:
    """What the store must hold: the contract of backends/base.py in plain Python."""

    def __init__(self) -> None:
        self.jobs: dict[int, ModelJob] = {}
        self.vtime = 0

    def claimable(self, now: float) -> list[ModelJob]:
        for j in self.jobs.values():
            if j.state is JobState.SCHEDULED and j.run_at <= now:
                j.state = JobState.AVAILABLE
        waiting = [j for j in self.jobs.values() if j.state is JobState.AVAILABLE]
        return sorted(waiting, key=lambda j: (j.tag, j.run_at, j.id))

    def holds(self, lease: Lease, now: float, *, expiry_matters: bool = True) -> ModelJob | None:
        j = self.jobs.get(lease.job_id)
        if j is None or j.state is not JobState.RUNNING or j.token != lease.token:
            return None
        if expiry_matters and (j.lease_until is None or j.lease_until < now):
            return None
        return j

    @staticmethod
    def finish(j: ModelJob, state: JobState) -> None:
        j.state, j.token, j.lease_until = state, None, None


def make_machine(spec: BackendSpec, root: Path) -> type[RuleBasedStateMachine]:
    class Lifecycle(RuleBasedStateMachine):
        jobs = Bundle("jobs")
        leases = Bundle("leases")

        def __init__(self) -> None:
            super().__init__()
            self.stack = contextlib.ExitStack()
            where = root / uuid.uuid4().hex[:8]
            where.mkdir()
            url = self.stack.enter_context(spec.store(where))
            self.backend: Backend = open_backend(url)
            self.stack.callback(self.backend.close)
            self.model = Model()
            self.now = T0

        def teardown(self) -> None:
            self.stack.close()

        # -- producer ---------------------------------------------------------------------------
        @rule(target=jobs, max_attempts=st.integers(1, 3), delay=st.sampled_from([0, 0, 5, 40]))
        def enqueue(self, max_attempts: int, delay: int) -> int:
            [res] = self.backend.enqueue_many([new_job(max_attempts=max_attempts, delay=float(delay))], now=self.now)
            assert res.created and res.id not in self.model.jobs
            self.model.jobs[res.id] = ModelJob(
                id=res.id, state=JobState.SCHEDULED if delay else JobState.AVAILABLE, attempt=0,
                max_attempts=max_attempts, run_at=self.now + delay, tag=self.model.vtime + 1,
            )
            return res.id

        # -- worker -----------------------------------------------------------------------------
        @rule(target=leases, n=st.integers(1, 3))
        def claim(self, n: int) -> Any:
            expected = self.model.claimable(self.now)[:n]
            got = self.backend.claim("default", n, worker_id="w", lease_s=LEASE, now=self.now)
            assert [j.id for j in got] == [j.id for j in expected]
            out = []
            for job, m in zip(got, expected, strict=True):
                assert job.lease_token is not None
                m.state, m.attempt, m.token, m.lease_until = JobState.RUNNING, m.attempt + 1, job.lease_token, self.now + LEASE
                assert job.attempts == m.attempt
                out.append(Lease(job.id, job.lease_token))
            if expected:
                self.model.vtime = max(self.model.vtime, *(m.tag for m in expected))
            return multiple(*out)

        @rule(lease=leases)
        def heartbeat(self, lease: Lease) -> None:
            held = self.model.holds(lease, self.now)
            lost = self.backend.heartbeat([lease], lease_s=LEASE, now=self.now)
            assert (lease.job_id in lost) == (held is None)
            if held is not None:
                held.lease_until = self.now + LEASE

        @rule(lease=leases)
        def ack(self, lease: Lease) -> None:
            held = self.model.holds(lease, self.now)
            try:
                self.backend.ack(lease, '"ok"', now=self.now)
            except LeaseLost:
                assert held is None, "a valid ack was refused"
                return
            assert held is not None, "a stale ack was accepted"
            self.model.finish(held, JobState.SUCCEEDED)

        @rule(lease=leases, delay=st.sampled_from([0, 0, 10]))
        def retry(self, lease: Lease, delay: int) -> None:
            held = self.model.holds(lease, self.now)
            try:
                state = self.backend.retry(lease, ErrorInfo("exception", "boom"), delay=float(delay), now=self.now)
            except LeaseLost:
                assert held is None, "a valid retry was refused"
                return
            assert held is not None, "a stale retry was accepted"
            if held.attempt >= held.max_attempts:
                self.model.finish(held, JobState.DEAD)
            else:
                self.model.finish(held, JobState.SCHEDULED if delay else JobState.AVAILABLE)
                held.run_at = self.now + delay
            assert state is held.state

        @rule(lease=leases)
        def kill(self, lease: Lease) -> None:
            held = self.model.holds(lease, self.now)
            try:
                self.backend.kill(lease, ErrorInfo("rejected", "no"), now=self.now)
            except LeaseLost:
                assert held is None, "a valid kill was refused"
                return
            assert held is not None, "a stale kill was accepted"
            self.model.finish(held, JobState.DEAD)

        @rule(lease=leases)
        def release(self, lease: Lease) -> None:
            # Shutdown gives jobs back even if the lease just ran out, as long as no one else has it.
            held = self.model.holds(lease, self.now, expiry_matters=False)
            released = self.backend.release([lease], now=self.now)
            assert released == ([lease.job_id] if held is not None else [])
            if held is not None:
                self.model.finish(held, JobState.AVAILABLE)
                held.attempt -= 1

        # -- time and maintenance ---------------------------------------------------------------
        @rule(dt=st.sampled_from([1, 10, 29, 31, 45]))
        def advance(self, dt: int) -> None:
            self.now += dt

        @rule()
        def reap(self) -> None:
            result = self.backend.reap(now=self.now)
            expired = [j for j in self.model.jobs.values()
                       if j.state is JobState.RUNNING and j.lease_until is not None and j.lease_until < self.now]
            assert sorted(result.requeued + result.dead) == sorted(j.id for j in expired)
            for j in expired:
                self.model.finish(j, JobState.DEAD if j.attempt >= j.max_attempts else JobState.AVAILABLE)
            assert sorted(result.dead) == sorted(j.id for j in expired if j.state is JobState.DEAD)

        # -- administration ---------------------------------------------------------------------
        @rule(job_id=jobs)
        def redrive(self, job_id: int) -> None:
            m = self.model.jobs[job_id]
            n = self.backend.redrive([job_id], now=self.now)
            assert n == (1 if m.state is JobState.DEAD else 0)
            if n:
                m.state, m.attempt, m.run_at, m.tag = JobState.AVAILABLE, 0, self.now, self.model.vtime + 1

        @rule(job_id=jobs)
        def cancel(self, job_id: int) -> None:
            m = self.model.jobs[job_id]
            done = self.backend.cancel(job_id, now=self.now)
            assert done == (not m.state.is_final)
            if done:
                self.model.finish(m, JobState.CANCELLED)

        # -- invariants -------------------------------------------------------------------------
        @invariant()
        def store_matches_model(self) -> None:
            for m in self.model.jobs.values():
                job = self.backend.get(m.id)
                assert job is not None, f"job {m.id} was lost"
                state = m.state
                if state is JobState.SCHEDULED and m.run_at <= self.now:
                    # Due but not promoted yet: either reading is right until a claim or promote.
                    assert job.state in (JobState.SCHEDULED, JobState.AVAILABLE), (m, job)
                else:
                    assert job.state is state, (m, job)
                assert job.attempts == m.attempt, (m, job)
                assert 0 <= job.attempts <= job.max_attempts
                if state is JobState.RUNNING:
                    assert job.lease_token == m.token
                    assert job.lease_expires_at == pytest.approx(m.lease_until)
                else:
                    assert job.lease_token is None
                assert (job.finished_at is not None) == state.is_final, (m, job)

    Lifecycle.TestCase.settings = settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    return Lifecycle


@pytest.mark.parametrize("spec", BACKENDS, ids=[s.name for s in BACKENDS])
def test_job_lifecycle_matches_the_model(spec: BackendSpec, tmp_path: Path) -> None:
    (tmp_path / "probe").mkdir()
    try:
        with spec.store(tmp_path / "probe"):
            pass
    except BackendUnavailable as exc:
        _unavailable(spec.name, exc)
    make_machine(spec, tmp_path).TestCase().runTest()
