"""S2: with a signing key, workers run only jobs an app holding the key enqueued; an altered,
forged, unsigned or foreign-key job goes dead as bad_signature before its task is called."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from support import new_job, running_worker, wait_for_job

from conveyor import Conveyor
from conveyor.errors import ConfigurationError
from conveyor.job import JobState

KEY = "k" * 32
OLD = "o" * 32


def _app_with_task(make_app: Callable[..., Conveyor], calls: list[int], **kw: object) -> Conveyor:
    app = make_app(**kw)

    @app.task(name="transfer")
    def transfer(amount: int) -> int:
        calls.append(amount)
        return amount

    return app


@pytest.mark.needs("lookup")
def test_signed_jobs_run_and_tampered_ones_go_dead_unrun(make_app: Callable[..., Conveyor]) -> None:
    calls: list[int] = []
    app = _app_with_task(make_app, calls, signing_key=KEY)
    good = app.get_task("transfer").enqueue(10)
    assert good.meta["sig"]["mac"]
    # Someone with write access to the store: a copy of a valid signature on other arguments,
    # a job with no signature, and a signature made with a key nobody accepts.
    sig = good.meta["sig"]
    forged = [
        new_job("transfer", args={"amount": 1_000_000}, meta=json.dumps({"sig": sig})),
        new_job("transfer", args={"amount": 7}),
        new_job("transfer", args={"amount": 10}, meta=json.dumps({"sig": {"kid": "x" * 12, "mac": "00" * 32}})),
        new_job("transfer", queue="other", args={"amount": 10}, meta=json.dumps({"sig": sig})),
    ]
    bad = [r.id for r in app.backend.enqueue_many(forged)]
    with running_worker(app, queues="default,other"):
        assert wait_for_job(app, good.id).state is JobState.SUCCEEDED
        dead = [wait_for_job(app, i) for i in bad]
    assert calls == [10]
    for job in dead:
        assert job.state is JobState.DEAD and job.attempts == 1
        assert job.errors[-1]["kind"] == "bad_signature"


@pytest.mark.needs("lookup")
def test_key_rotation_accepts_the_old_key_while_listed(make_app: Callable[..., Conveyor]) -> None:
    calls: list[int] = []
    old_app = _app_with_task(make_app, calls, signing_key=OLD)
    job = old_app.get_task("transfer").enqueue(5)
    rotated = _app_with_task(make_app, calls, signing_key=KEY, verify_keys=[OLD])
    with running_worker(rotated):
        assert wait_for_job(rotated, job.id).state is JobState.SUCCEEDED
    later = old_app.get_task("transfer").enqueue(6)  # after the old key was dropped
    strict = _app_with_task(make_app, calls, signing_key=KEY)
    with running_worker(strict):
        assert wait_for_job(strict, later.id).errors[-1]["kind"] == "bad_signature"
    assert calls == [5]


@pytest.mark.needs("cron")
def test_cron_jobs_are_signed(make_app: Callable[..., Conveyor]) -> None:
    from conveyor.cron import Scheduler

    app = make_app(signing_key=KEY)

    @app.cron("* * * * *", name="tick", kwargs={"n": 1})
    def tick(n: int) -> int:
        return n

    Scheduler(app).run_pending(now=1_700_000_000.0)
    [made] = Scheduler(app).run_pending(now=1_700_000_061.0)
    with running_worker(app):
        assert wait_for_job(app, made.id).state is JobState.SUCCEEDED


def test_a_short_key_is_refused(make_app: Callable[..., Conveyor]) -> None:
    with pytest.raises(ConfigurationError, match="16 bytes"):
        make_app(signing_key="short")
    with pytest.raises(ConfigurationError, match="signing_key"):
        make_app(verify_keys=[OLD])
