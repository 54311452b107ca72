"""Ids repeat after a data loss; step records and acks still never cross between jobs.

A generation of jobs (A) is claimed and half of it records a "charge" step; then the store
loses everything, id counter included (see tests/dataloss.py), and a new generation (B) takes
the same ids. The attempts of A go on: every late step record and ack must be refused, every
B job must come with no step and record its own. The figures: how many ids repeated, how
many late writes were refused, and what a uid costs at enqueue (the time per job of the B
batches, uid made and stored; nothing here asserts a time)."""

from __future__ import annotations

import json
import time

from dataloss import lose_everything
from scalekit import report, size
from support import new_job

from conveyor.backends.base import Backend, Lease
from conveyor.errors import JobNotFound, LeaseLost
from conveyor.job import Job

JOBS = size(2_000, 50_000)
BATCH = 500


def _generation(backend: Backend, tag: str) -> tuple[list[str | None], list[Job], float]:
    """Enqueue JOBS jobs in batches and claim them all: (uids, claimed jobs, enqueue seconds)."""
    uids: list[str | None] = []
    took = 0.0
    for start in range(0, JOBS, BATCH):
        batch = [new_job(args={"gen": tag, "n": n}) for n in range(start, min(start + BATCH, JOBS))]
        t0 = time.perf_counter()
        uids += [r.uid for r in backend.enqueue_many(batch)]
        took += time.perf_counter() - t0
    claimed: list[Job] = []
    while len(claimed) < JOBS:
        got = backend.claim("default", BATCH, worker_id=f"w-{tag}", lease_s=600)
        assert got, f"only {len(claimed)} of {JOBS} claimed"
        claimed += got
    return uids, claimed, took


def test_ids_reused_after_a_data_loss_never_share_steps(backend: Backend) -> None:
    a_uids, a_jobs, _ = _generation(backend, "A")
    for job in a_jobs[::2]:
        assert backend.record_step(job.id, "charge", json.dumps({"order": "A"}), uid=job.uid)[0]

    lose_everything(backend)
    b_uids, b_jobs, b_enqueue_s = _generation(backend, "B")
    reused = len({j.id for j in a_jobs} & {j.id for j in b_jobs})

    refused_steps = refused_acks = 0
    t0 = time.perf_counter()
    for job in a_jobs:
        try:
            backend.record_step(job.id, "refund", json.dumps({"order": "A"}), uid=job.uid)
        except JobNotFound:
            refused_steps += 1
        try:
            backend.ack(Lease(job.id, job.lease_token or ""), json.dumps("A done"))
        except LeaseLost:
            refused_acks += 1
    late_s = time.perf_counter() - t0

    leaked = sum(1 for j in b_jobs if j.steps)
    own = sum(backend.record_step(j.id, "charge", json.dumps({"order": "B"}), uid=j.uid)[0] for j in b_jobs)
    stored = [backend.get(j.id) for j in b_jobs[:: max(1, JOBS // 500)]]
    wrong = sum(1 for j in stored if j is None or j.steps != {"charge": {"order": "B"}} or j.state != "running")

    report("uid_after_data_loss", type(backend).__name__.removesuffix("Backend").lower(),
           jobs=JOBS, ids_reused=reused, late_steps_refused=refused_steps, late_acks_refused=refused_acks,
           steps_leaked=leaked, enqueue_us_per_job=round(b_enqueue_s / JOBS * 1e6, 1),
           late_write_us=round(late_s / (2 * JOBS) * 1e6, 1))
    assert reused == JOBS
    assert refused_steps == JOBS and refused_acks == JOBS
    assert leaked == 0 and own == JOBS and wrong == 0
    assert len(set(a_uids + b_uids)) == 2 * JOBS and None not in a_uids + b_uids
