"""Pausing a queue (backends/base.py, "Pausing a queue"): a paused queue is claimed by no claim
path of any store, while enqueues, promotion, running jobs and the queue's numbers go on; resume
wakes idle workers. Backend-level cases, then a real Worker through the ``app`` fixtures.

Conditions are awaited by polling the store with a deadline, never by fixed sleeps."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest
from support import T0, enqueue_one, new_job, running_worker, wait_for_job, wait_until

from conveyor import Conveyor, JobState
from conveyor.backends.base import Backend, Lease, QueueStats
from conveyor.job import Job

LEASE = 30.0


def lease_of(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def queue_stats(backend: Backend, queue: str, now: float | None = None) -> QueueStats:
    [q] = [q for q in backend.stats(now=now).queues if q.queue == queue]
    return q


@pytest.mark.needs("pause")
def test_pause_and_resume_say_whether_they_changed_anything(backend: Backend) -> None:
    assert backend.paused_queues() == {}
    assert backend.pause_queue("mail", now=T0) is True
    assert backend.pause_queue("mail", now=T0 + 5) is False  # paused already: since stays
    assert backend.paused_queues() == {"mail": T0}
    assert backend.pause_queue("billing", now=T0 + 1) is True
    assert backend.paused_queues() == {"mail": T0, "billing": T0 + 1}
    assert backend.resume_queue("mail", now=T0 + 2) is True
    assert backend.resume_queue("mail", now=T0 + 3) is False
    assert backend.resume_queue("never-paused") is False
    assert backend.paused_queues() == {"billing": T0 + 1}


@pytest.mark.needs("pause")
def test_pause_uses_the_store_clock_by_default(backend: Backend) -> None:
    before = backend.now()
    assert backend.pause_queue("mail")
    since = backend.paused_queues()["mail"]
    assert before - 1 <= since <= backend.now() + 1


@pytest.mark.needs("pause")
def test_a_paused_queue_is_not_claimed_and_others_are(backend: Backend) -> None:
    held = enqueue_one(backend, queue="mail")
    free = enqueue_one(backend, queue="other")
    assert backend.pause_queue("mail", now=T0)
    assert backend.claim("mail", 10, worker_id="w", lease_s=LEASE, now=T0 + 1) == []
    [job] = backend.claim("other", 10, worker_id="w", lease_s=LEASE, now=T0 + 1)
    assert job.id == free
    assert backend.get(held).state is JobState.AVAILABLE  # type: ignore[union-attr]

    assert backend.resume_queue("mail", now=T0 + 2)
    [job] = backend.claim("mail", 10, worker_id="w", lease_s=LEASE, now=T0 + 3)
    assert job.id == held


@pytest.mark.needs("pause")
def test_ack_and_claim_writes_the_acks_and_claims_nothing_paused(backend: Backend) -> None:
    first = enqueue_one(backend, queue="mail")
    second = enqueue_one(backend, queue="mail")
    [job] = backend.claim("mail", 1, worker_id="w", lease_s=LEASE, now=T0)
    assert job.id == first
    assert backend.pause_queue("mail", now=T0 + 1)
    held, jobs = backend.ack_and_claim([(lease_of(job), json.dumps(1))], "mail", 5,
                                       worker_id="w", lease_s=LEASE, now=T0 + 2)
    assert (held, jobs) == ([True], [])
    assert backend.get(first).state is JobState.SUCCEEDED  # type: ignore[union-attr]
    assert backend.get(second).state is JobState.AVAILABLE  # type: ignore[union-attr]


@pytest.mark.needs("limits")
def test_limited_jobs_of_a_paused_queue_are_not_claimed(backend: Backend) -> None:
    enqueue_one(backend, queue="mail", concurrency_key="smtp", concurrency_limit=2)
    enqueue_one(backend, queue="mail", rate_key="api", rate_limit=5, rate_period=60.0)
    assert backend.pause_queue("mail", now=T0)
    assert backend.claim("mail", 10, worker_id="w", lease_s=LEASE, now=T0 + 1) == []
    assert backend.resume_queue("mail", now=T0 + 2)
    assert len(backend.claim("mail", 10, worker_id="w", lease_s=LEASE, now=T0 + 3)) == 2


@pytest.mark.needs("pause")
def test_running_jobs_finish_and_enqueues_and_promotion_go_on(backend: Backend) -> None:
    running_id = enqueue_one(backend, queue="mail")
    [job] = backend.claim("mail", 1, worker_id="w", lease_s=LEASE, now=T0)
    assert backend.pause_queue("mail", now=T0 + 1)
    # The running job's lease is kept and its ack lands ("drain").
    assert backend.heartbeat([lease_of(job)], lease_s=LEASE, now=T0 + 2) == set()
    backend.ack(lease_of(job), json.dumps("done"), now=T0 + 3)
    assert backend.get(running_id).state is JobState.SUCCEEDED  # type: ignore[union-attr]

    [res] = backend.enqueue_many([new_job(queue="mail")], now=T0 + 4)
    assert res.created
    scheduled = enqueue_one(backend, queue="mail", now=T0 + 4, delay=10.0)
    assert backend.promote(now=T0 + 20) == 1
    assert backend.get(scheduled).state is JobState.AVAILABLE  # type: ignore[union-attr]
    assert backend.claim("mail", 10, worker_id="w", lease_s=LEASE, now=T0 + 21) == []
    q = queue_stats(backend, "mail", now=T0 + 24)
    assert (q.paused, q.available, q.succeeded) == (True, 2, 1)
    assert q.oldest_available_age == pytest.approx(20.0)  # still measured while paused


@pytest.mark.needs("pause")
def test_stats_show_paused_queues_even_without_jobs(backend: Backend) -> None:
    enqueue_one(backend, queue="busy")
    assert backend.pause_queue("empty", now=T0)
    stats = backend.stats(now=T0 + 1)
    by_name = {q.queue: q for q in stats.queues}
    assert by_name["empty"] == QueueStats(queue="empty", paused=True, paused_since=T0)
    assert by_name["busy"].paused is False
    assert [q.queue for q in stats.queues] == sorted(by_name)
    backend.resume_queue("empty", now=T0 + 2)
    assert "empty" not in {q.queue for q in backend.stats(now=T0 + 3).queues}


@pytest.mark.needs("pause")
def test_an_idle_wait_on_a_paused_queue_does_not_report_its_jobs(backend: Backend) -> None:
    job_id = enqueue_one(backend, queue="mail", now=time.time())
    assert backend.pause_queue("mail")
    # The jobs wait, but nobody may claim them: an idle worker sleeps out its poll instead of
    # waking at once to an empty claim, again and again.
    assert backend.wait_for_jobs(["mail"], 0.3) is False
    _, jobs = backend.wait_and_claim(["mail"], 0.3, [("mail", 4)], worker_id="w",
                                     lease_s=LEASE)
    assert not jobs
    assert backend.get(job_id).state is JobState.AVAILABLE  # type: ignore[union-attr]
    assert backend.resume_queue("mail")
    assert backend.wait_for_jobs(["mail"], 10) is True


@pytest.mark.parametrize("same_connection", [True, False], ids=["same", "other"])
@pytest.mark.needs("pause")
def test_resume_wakes_an_idle_waiter(backend: Backend, open_store: Callable[[], Backend],
                                     same_connection: bool) -> None:
    enqueue_one(backend, queue="mail", now=time.time())
    assert backend.pause_queue("mail")
    out: dict[str, object] = {}
    started = threading.Event()

    def wait() -> None:
        started.set()
        t = time.monotonic()
        out["result"] = backend.wait_for_jobs(["mail"], 30)
        out["elapsed"] = time.monotonic() - t

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    assert started.wait(5)
    other = backend if same_connection else open_store()
    time.sleep(0.2)  # let the waiter settle into its sleep (a resume before it is fine too)
    assert other.resume_queue("mail")
    thread.join(20)
    assert out["result"] is True
    assert float(out["elapsed"]) < 15  # type: ignore[arg-type]  # woken, not its 30 s timeout


# -- through a real worker -------------------------------------------------------------------


@pytest.mark.needs("pause")
def test_a_worker_runs_nothing_of_a_paused_queue_until_resumed(
        make_app: Callable[..., Conveyor]) -> None:
    app = make_app()
    ran: list[str] = []

    @app.task(name="mail.send", queue="mail")
    def send(n: int) -> int:
        ran.append(f"mail{n}")
        return n

    @app.task(name="other.work", queue="other")
    def work(n: int) -> int:
        ran.append(f"other{n}")
        return n

    assert app.backend.pause_queue("mail")
    held = [send.enqueue(i) for i in range(3)]  # enqueue while paused succeeds
    with running_worker(app, queues=["mail", "other"]):
        # The worker claims: a job of the other queue runs, and later ones too.
        for i in range(3):
            assert wait_for_job(app, work.enqueue(i).id).state is JobState.SUCCEEDED
        assert all(app.get_job(j.id).state is JobState.AVAILABLE for j in held)
        assert not [r for r in ran if r.startswith("mail")]
        assert app.backend.stats().queues[0].paused is True  # "mail" sorts first

        assert app.backend.resume_queue("mail")
        for j in held:
            assert wait_for_job(app, j.id).state is JobState.SUCCEEDED


@pytest.mark.needs("pause")
def test_a_running_job_finishes_after_its_queue_is_paused(
        make_app: Callable[..., Conveyor]) -> None:
    app = make_app()
    started, release = threading.Event(), threading.Event()

    @app.task(name="mail.slow", queue="mail")
    def slow() -> str:
        started.set()
        assert release.wait(20)
        return "drained"

    @app.task(name="mail.next", queue="mail")
    def after() -> str:
        return "ran"

    with running_worker(app, queues=["mail"]):
        first = slow.enqueue()
        assert started.wait(10)
        assert app.backend.pause_queue("mail")
        second = after.enqueue()
        release.set()
        done = wait_for_job(app, first.id)
        assert (done.state, done.result) == (JobState.SUCCEEDED, "drained")
        # The idle worker stays idle: the job enqueued while paused waits.
        wait_until(lambda: app.backend.stats().queues[0].running == 0)
        assert app.get_job(second.id).state is JobState.AVAILABLE
        assert app.backend.resume_queue("mail")
        assert wait_for_job(app, second.id).result == "ran"
