"""The job page shows flow-control fields: fair key, concurrency and rate limits, recorded
exactly-once steps, and a cron job's tick; all escaped."""

from __future__ import annotations

from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor.cron import Scheduler


def test_the_job_page_shows_limits_steps_and_cron_tick(app: Conveyor, client: TestClient) -> None:
    @app.cron("0 9 * * *", name="morning", timezone="Europe/Paris")
    def morning() -> None: ...

    @app.task(name="limited", concurrency_limit=2, rate_limit="10/m")
    def limited(x: int) -> None: ...

    job = limited.options(fair_key="tenant-<b>x</b>").enqueue(1)
    app.backend.record_step(job.id, "charge-card", '{"charge": "ch_<i>1</i>"}', uid=job.uid)
    page = client.get(f"/jobs/{job.id}").text
    assert "tenant-&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert "at most 2 running" in page and "10 per 1m" in page.replace("1m 00s", "1m")
    assert "Steps done" in page and "charge-card" in page and "ch_&lt;i&gt;1&lt;/i&gt;" in page

    Scheduler(app).run_pending(now=1_767_000_000.0)  # first sight: recorded, not run
    [made] = Scheduler(app).run_pending(now=1_767_000_000.0 + 86_400)
    cron_page = client.get(f"/jobs/{made.id}").text
    assert "Cron tick" in cron_page and "T09:00:00+01:00" in cron_page
