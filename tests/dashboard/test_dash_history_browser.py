"""The history charts in a real browser (Debian's chromium, Playwright): a real worker's
outcomes, flushed to a SQLite store, drawn by a real server; picking a time range changes the
URL and the window. Keeps docs/assets/dashboard/history.png (docs/dashboard.md) current.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support import running_worker, wait_until
from test_dash_browser import Page, browser  # noqa: F401 - the module's browser fixture

from conveyor import Conveyor, Retry
from conveyor.backends.base import HistoryPoint
from conveyor.backends.history import MINUTE
from conveyor.dashboard import start_in_thread

SHOT = Path(__file__).resolve().parents[2] / "docs" / "assets" / "dashboard" / "history.png"


def test_pick_a_time_range_and_see_the_stores_history(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    app = Conveyor(f"sqlite:///{tmp_path}/shop.db")

    @app.task(name="shop.send_email", queue="emails")
    def send_email(user_id: int) -> None:
        return None

    @app.task(name="shop.charge_card", queue="payments", max_attempts=2)
    def charge_card(order_id: int) -> None:
        if order_id % 4 == 0:
            raise Retry(delay=0.01, reason="gateway busy")

    backend = app.backend
    now = backend.now()
    minute = int(now) - int(now) % MINUTE
    # The hours before: what earlier workers wrote (a gentle wave, a bad stretch of failures).
    backend.record_history([
        HistoryPoint(q, minute - i * MINUTE, processed=20 + (i * 7) % 23 + (10 if q == "emails"
                                                                            else 0),
                     failed=3 if 30 < i < 40 and q == "payments" else 0,
                     dead=1 if i in (34, 36) and q == "payments" else 0,
                     wait_sum=0.05 * (i % 9 + 1) * 20, run_sum=0.02 * 20)
        for i in range(1, 6 * 60, 3) for q in ("emails", "payments")])
    with running_worker(app, queues="emails,payments", history_interval=3600) as wt:
        send_email.enqueue_many([(i,) for i in range(30)])
        charge_card.enqueue_many([(i,) for i in range(12)])
        w = wt.worker
        wait_until(lambda: (w.counters.succeeded, w.counters.retried, w.counters.dead)
                   == (39, 3, 3), message="every outcome counted")
        assert w.flush_history() >= 2  # a point per queue and minute (two, if none turned)
    dash = start_in_thread(app, port=0, sample_interval=3600)
    tab = Page(browser, dash.url)
    try:
        tab.go("/")
        # The page's window: the hour up to the end of the store's current minute.
        end = int(backend.now()) // MINUTE * MINUTE + MINUTE
        assert tab.page.get_attribute("#history-processed", "data-value") == str(
            sum(p.processed for p in backend.history(since=end - 3600, until=end)))
        assert tab.page.locator(".hchart svg").count() == 3
        tab.page.click('a.range[data-range="6h"]')
        tab.page.wait_for_load_state("networkidle")
        assert tab.page.url.endswith("/?range=6h#history")
        assert tab.page.inner_text(".range.on") == "6 h"
        end = int(backend.now()) // MINUTE * MINUTE + MINUTE
        in_store = backend.history(since=end - 6 * 3600, until=end)
        assert tab.page.get_attribute("#history-processed", "data-value") == str(
            sum(p.processed for p in in_store))
        assert tab.page.get_attribute("#history-dead", "data-value") == str(
            sum(p.dead for p in in_store))
        assert "last 6 h, per 5 min" in tab.page.inner_text("#history")
        SHOT.parent.mkdir(parents=True, exist_ok=True)
        tab.page.locator("#history").screenshot(path=str(SHOT))
        assert tab.console_errors == []
    finally:
        tab.close()
        dash.stop()
