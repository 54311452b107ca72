"""Error groups and bulk actions in a real browser (issue 38): open a group from the dead page and
redrive it; bulk-cancel a filter of the jobs page through its confirmation and progress pages.
Their screenshots are the ones docs/dashboard.md shows (docs/assets/dashboard/)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dash_browser import Page, browser, shop  # noqa: F401 - fixtures used by name

from conveyor import Conveyor
from conveyor.backends.base import ErrorInfo, Lease, NewJob
from conveyor.bulk import BULK_BATCH
from conveyor.dashboard import RunningDashboard
from conveyor.job import JobState

DOCS = Path(__file__).resolve().parents[2] / "docs" / "assets" / "dashboard"


@pytest.fixture
def tab(browser: Any, shop: tuple[Conveyor, RunningDashboard]) -> Iterator[Page]:  # noqa: F811
    page = Page(browser, shop[1].url)
    yield page
    page.close()


def dead(app: Conveyor, task: str, message: str, etype: str) -> int:
    [res] = app.backend.enqueue_many([NewJob(task=task, queue="default", args=json.dumps({}),
                                             max_attempts=1, timeout=30)])
    [job] = app.backend.claim("default", 1, worker_id="w-1", lease_s=30)
    app.backend.kill(Lease(job.id, job.lease_token or ""), ErrorInfo("exception", message, etype))
    return res.id


def shot(tab: Page, name: str) -> None:
    DOCS.mkdir(parents=True, exist_ok=True)
    tab.page.screenshot(path=str(DOCS / f"{name}.png"))


def test_open_an_error_group_and_redrive_it(shop: tuple[Conveyor, RunningDashboard],  # noqa: F811
                                            tab: Page) -> None:
    app, _ = shop
    charges = [dead(app, "shop.charge_card", f"payment gateway unreachable for order {n}",
                    "ConnectionError") for n in (1041, 1042, 1057)]
    feed = dead(app, "shop.import_feed", "cannot parse 'feed-2024-07.csv'", "Reject")
    tab.go("/dead")
    groups = tab.page.inner_text("#error-groups")
    assert "payment gateway unreachable for order <n>" in groups and "<str>" in groups
    tab.page.click("#error-groups a:has-text('payment gateway')")
    tab.page.wait_for_load_state("networkidle")
    assert tab.page.inner_text("#group-count") == "3"
    shot(tab, "error-groups")
    tab.page.click("#group-retry")
    assert tab.page.inner_text("h1") == "Retry 3 jobs?"
    tab.page.click("#confirm")
    tab.page.wait_for_load_state("networkidle")
    assert "Retried 3 job(s)." in tab.page.inner_text(".flash")
    assert {app.get_job(i).state for i in charges} == {JobState.AVAILABLE}
    assert app.get_job(feed).state is JobState.DEAD


def test_bulk_cancel_a_filter_with_confirmation_and_progress(
        shop: tuple[Conveyor, RunningDashboard], tab: Page) -> None:  # noqa: F811
    app, _ = shop
    n = BULK_BATCH + 34
    reports = app.backend.enqueue_many([
        NewJob(task="shop.build_report", queue="reports", args=json.dumps({"report_id": i}),
               max_attempts=3, timeout=30, delay=3600) for i in range(n)])
    [email] = app.backend.enqueue_many([NewJob(task="shop.send_email", queue="high",
                                               args="{}", max_attempts=3, timeout=30)])
    tab.go("/jobs?queue=reports&state=scheduled")
    tab.page.click("#bulk-cancel")
    tab.page.wait_for_load_state("networkidle")
    assert tab.page.inner_text("h1") == f"Cancel {n:,} jobs?"
    shot(tab, "bulk-actions")
    tab.page.click("#confirm")  # the progress page posts the second batch by itself
    tab.page.wait_for_selector(".flash", timeout=15_000)
    assert f"Cancelled {n:,} job(s)." in tab.page.inner_text(".flash")
    assert {app.get_job(r.id).state for r in reports} == {JobState.CANCELLED}
    assert app.get_job(email.id).state is JobState.AVAILABLE
