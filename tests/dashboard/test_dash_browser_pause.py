"""Pause and resume a queue in a real browser (issue 38): Debian's chromium driven by
Playwright, against a real server, a real worker and a SQLite store. Click Pause, see the badge
while the worker leaves the queue's jobs alone; click Resume, see them run. Keeps the screenshot
docs/dashboard.md shows (docs/assets/dashboard/queue-paused.png) current."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import running_worker, wait_for_job, wait_until
from test_dash_browser import Page, browser  # noqa: F401  (the module's chromium fixture)

from conveyor import Conveyor, JobState
from conveyor.dashboard import RunningDashboard, start_in_thread

DOC_SHOT = Path(__file__).resolve().parents[2] / "docs" / "assets" / "dashboard" / "queue-paused.png"


@pytest.fixture
def mail(tmp_path: Path) -> Iterator[tuple[Conveyor, RunningDashboard]]:
    app = Conveyor(f"sqlite:///{tmp_path}/pause.db")

    @app.task(name="mail.send", queue="mail")
    def send(n: int) -> int:
        return n

    dash = start_in_thread(app, port=0, sample_interval=0.5, title="Conveyor")
    try:
        yield app, dash
    finally:
        dash.stop()
        app.close()


def test_pause_a_queue_see_the_badge_and_resume_it(
        browser: Any, mail: tuple[Conveyor, RunningDashboard]) -> None:  # noqa: F811
    app, dash = mail
    send = app.tasks["mail.send"]
    tab = Page(browser, dash.url)
    try:
        with running_worker(app, queues="mail", concurrency=2):
            assert wait_for_job(app, send.enqueue(0).id).state is JobState.SUCCEEDED
            tab.go("/queues/mail")
            assert tab.page.locator("#q-paused").count() == 0
            tab.page.click("#q-pause-toggle")
            tab.page.wait_for_load_state("networkidle")
            assert tab.page.inner_text("#q-paused") == "paused"
            assert "Queue mail is paused" in tab.page.inner_text(".flash")
            assert tab.page.inner_text("#q-pause-toggle") == "Resume"
            assert app.backend.paused_queues().keys() == {"mail"}

            held = send.enqueue_many([(i,) for i in range(1, 8)])
            # The worker is up and idle, and leaves them alone: the page says they wait.
            wait_until(lambda: tab.go("/queues/mail") and tab.page.inner_text("#q-waiting") == "7",
                       timeout=10, interval=0.2)
            assert all(app.get_job(j.id).state is JobState.AVAILABLE for j in held)
            tab.page.set_viewport_size({"width": 1200, "height": 560})
            DOC_SHOT.parent.mkdir(parents=True, exist_ok=True)
            tab.page.screenshot(path=str(DOC_SHOT))

            tab.page.click("#q-pause-toggle")
            tab.page.wait_for_load_state("networkidle")
            assert "Queue mail is resumed" in tab.page.inner_text(".flash")
            assert tab.page.locator("#q-paused").count() == 0
            for j in held:
                assert wait_for_job(app, j.id).state is JobState.SUCCEEDED

            # The overview's queues table has the same control.
            tab.go("/")
            row = tab.page.locator('#queues tr[data-queue="mail"]')
            row.locator('button[data-action="pause"]').click()
            tab.page.wait_for_load_state("networkidle")
            row = tab.page.locator('#queues tr[data-queue="mail"]')
            assert row.locator('[data-col="paused"]').inner_text() == "paused"
            row.locator('button[data-action="resume"]').click()
            tab.page.wait_for_load_state("networkidle")
            assert tab.page.locator('#queues tr[data-queue="mail"] [data-col="paused"]').count() == 0
            assert app.backend.paused_queues() == {}
    finally:
        tab.close()


def test_a_queue_named_with_braces_is_reached_and_paused_from_the_overview(
        browser: Any, mail: tuple[Conveyor, RunningDashboard]) -> None:  # noqa: F811
    """Braces in a queue name (a Redis hash tag): the browser follows the overview's link to
    the queue's page and pauses it there, and the page names the queue as it is."""
    app, dash = mail
    job = app.tasks["mail.send"].options(queue="emails{acme}").enqueue(1)
    tab = Page(browser, dash.url)
    try:
        tab.go("/")
        tab.page.click('#queues tr[data-queue="emails{acme}"] a[href^="/queues/"]')
        tab.page.wait_for_load_state("networkidle")
        assert tab.page.url.endswith("/queues/emails%7Bacme%7D")
        assert "emails{acme}" in tab.page.inner_text("h1")
        tab.page.click("#q-pause-toggle")
        tab.page.wait_for_load_state("networkidle")
        assert tab.page.inner_text("#q-paused") == "paused"
        assert "Queue emails{acme} is paused" in tab.page.inner_text(".flash")
        assert app.backend.paused_queues().keys() == {"emails{acme}"}
        assert app.get_job(job.id).state is JobState.AVAILABLE
    finally:
        tab.close()
