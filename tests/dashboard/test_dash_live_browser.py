"""Live updates and the phone layout in a real browser (issue 38, item 6): Debian's chromium
driven by Playwright against a real server, a real worker and a SQLite store.

Each test marks the window (a property a reload would lose) and then watches the page change
on its own. The pictures in docs/dashboard.md ("Live updates") are taken here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from dashkit import kill_job
from support import running_worker, wait_until
from test_dash_browser import Page, browser, fill_store, shop, tab  # noqa: F401

from conveyor import Conveyor
from conveyor.dashboard import RunningDashboard
from conveyor.dashboard import pages as dashpages
from conveyor.job import JobState

DOCS = Path(__file__).resolve().parents[2] / "docs" / "assets" / "dashboard"
PHONE = {"width": 390, "height": 844}
MAIN_PAGES = ("/", "/jobs", "/dead", "/workers", "/cron", "/queues/default")


@pytest.fixture
def quick_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lists refresh every second here (5 s by default), so the tests wait less."""
    monkeypatch.setattr(dashpages, "LIST_REFRESH", 1)


def mark(page: Page) -> None:
    page.page.evaluate("window.__notReloaded = true")


def not_reloaded(page: Page) -> bool:
    return bool(page.page.evaluate("window.__notReloaded === true"))


def test_a_job_page_follows_its_job_from_available_to_succeeded(
        shop: tuple[Conveyor, RunningDashboard], tab: Page) -> None:  # noqa: F811
    app, _ = shop
    gate = threading.Event()

    @app.task(name="shop.pack_parcel", queue="default")
    def pack_parcel(order_id: int) -> dict[str, Any]:
        gate.wait(20)
        return {"order_id": order_id, "parcel": "P-1"}

    job = pack_parcel.enqueue(4711)
    tab.go(f"/jobs/{job.id}")
    assert tab.page.inner_text("h1 .state") == "available"
    assert "Not attempted yet." in tab.page.inner_text("#live")
    mark(tab)
    with running_worker(app, queues="default", concurrency=1):
        wait_until(lambda: tab.page.inner_text("h1 .state") == "running", timeout=15, interval=0.2)
        assert "Attempt 1" in tab.page.inner_text(".attempts")
        gate.set()
        wait_until(lambda: tab.page.inner_text("h1 .state") == "succeeded", timeout=15,
                   interval=0.2)
    assert not_reloaded(tab), "the page was reloaded instead of updated in place"
    assert '"parcel": "P-1"' in tab.page.inner_text("#result")
    attempts = tab.page.inner_text(".attempts")
    assert "Attempt 1" in attempts and "succeeded" in attempts
    assert tab.page.locator("#cancel").count() == 0  # a finished job offers no cancel
    DOCS.mkdir(parents=True, exist_ok=True)
    tab.page.set_viewport_size({"width": 1240, "height": 860})
    tab.page.screenshot(path=str(DOCS / "live-job.png"))


def test_the_dead_list_gains_a_row_but_not_under_a_selection(
        shop: tuple[Conveyor, RunningDashboard], tab: Page, quick_lists: None) -> None:  # noqa: F811
    app, _ = shop
    first = kill_job(app.backend, "default", task="shop.charge_card", message="card declined")
    tab.go("/dead")
    rows = "#dead-form tbody input[name=ids]"
    assert tab.page.locator(rows).count() == 1
    mark(tab)
    # Nothing changed but the relative times: refreshes leave the rows where they are (the
    # same elements, not a copy swapped in).
    tab.page.evaluate("document.querySelector('#dead-form tbody tr').__kept = true")
    updated = tab.page.get_attribute("html", "data-updated")
    wait_until(lambda: tab.page.get_attribute("html", "data-updated") != updated, timeout=10,
               interval=0.2)
    assert tab.page.evaluate("document.querySelector('#dead-form tbody tr').__kept === true")
    second = kill_job(app.backend, "default", task="shop.charge_card", message="gateway down")
    wait_until(lambda: tab.page.locator(rows).count() == 2, timeout=10, interval=0.2)
    assert tab.page.locator("#dead-form tbody tr").first.inner_text().strip().startswith(f"#{second}")
    # A ticked box holds the list still: the row it names cannot move under the next click.
    tab.page.check(f'{rows}[value="{first}"]')
    third = kill_job(app.backend, "default", task="shop.charge_card", message="gateway down")
    tab.page.wait_for_timeout(3000)  # three refresh intervals
    assert tab.page.locator(rows).count() == 2
    tab.page.uncheck(f'{rows}[value="{first}"]')
    tab.page.locator("h1").click()  # focus leaves the checkbox
    tab.page.mouse.move(0, 0)
    wait_until(lambda: tab.page.locator(rows).count() == 3, timeout=10, interval=0.2)
    assert tab.page.locator(f'{rows}[value="{third}"]').count() == 1
    assert not_reloaded(tab)
    # The count in the navigation follows too.
    wait_until(lambda: "3" in tab.page.inner_text(".mainnav .pill"), timeout=10)


def test_the_job_list_refreshes_within_its_filter(
        shop: tuple[Conveyor, RunningDashboard], tab: Page, quick_lists: None) -> None:  # noqa: F811
    app, _ = shop
    reports = [app.tasks["shop.build_report"].enqueue(i) for i in range(2)]
    tab.go("/jobs?queue=reports")
    mark(tab)
    app.tasks["shop.send_email"].enqueue(1)  # another queue: outside the filter
    newest = app.tasks["shop.build_report"].enqueue(3)
    wait_until(lambda: tab.page.locator(f'#live a[href="/jobs/{newest.id}"]').count() == 1,
               timeout=10, interval=0.2)
    shown = tab.page.locator("table.jobs tbody td:first-child a").all_inner_texts()
    assert shown == [f"#{newest.id}", f"#{reports[1].id}", f"#{reports[0].id}"]
    assert tab.page.evaluate("location.search") == "?queue=reports"
    assert not_reloaded(tab)


def test_a_hidden_tab_asks_nothing_and_catches_up_when_shown(
        shop: tuple[Conveyor, RunningDashboard], tab: Page, quick_lists: None) -> None:  # noqa: F811
    asked: list[str] = []
    tab.go("/dead")
    tab.page.on("request", lambda r: asked.append(r.url) if "/dead" in r.url else None)

    def count() -> int:
        tab.page.wait_for_timeout(100)  # the sync API hears of requests only inside its calls
        return len(asked)

    wait_until(lambda: count() >= 2, timeout=10)  # every second while shown
    tab.page.evaluate("""Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
        document.dispatchEvent(new Event('visibilitychange'))""")
    tab.page.wait_for_timeout(1500)  # a request already on its way may still land
    before = len(asked)
    tab.page.wait_for_timeout(4000)
    assert count() == before, "a hidden tab kept polling"
    tab.page.evaluate("""Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
        document.dispatchEvent(new Event('visibilitychange'))""")
    wait_until(lambda: count() > before, timeout=2)


def test_on_a_phone_the_navigation_needs_no_sideways_scrolling(
        shop: tuple[Conveyor, RunningDashboard], browser: Any) -> None:  # noqa: F811
    app, dash = shop
    charge = fill_store(app)["charges"][0]
    phone = Page(browser, dash.url, is_mobile=True, has_touch=True)
    try:
        phone.page.set_viewport_size(PHONE)
        for path in (*MAIN_PAGES, f"/jobs/{charge.id}", "/jobs?state=dead"):
            phone.go(path)
            width = phone.page.evaluate("[document.scrollingElement.scrollWidth, innerWidth]")
            assert width[0] <= width[1], f"{path}: the page scrolls sideways ({width})"
            for link in phone.page.locator(".mainnav a").all():
                box = link.bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], \
                    f"{path}: {link.inner_text()} is off screen ({box})"
        phone.go("/")
        DOCS.mkdir(parents=True, exist_ok=True)
        phone.page.screenshot(path=str(DOCS / "phone-nav.png"))
        with phone.page.expect_navigation():
            phone.page.locator(".mainnav a", has_text="Dead letters").tap()
        assert phone.page.url.endswith("/dead")
        assert app.get_job(charge.id).state is JobState.DEAD
    finally:
        phone.close()

