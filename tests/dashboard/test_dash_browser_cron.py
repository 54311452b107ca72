"""The cron controls in a real browser (Debian's chromium driven by Playwright) against a real
server, a real worker and a SQLite store: Disable and Run now clicked as an operator would.

Keeps docs/assets/dashboard/cron-controls.png (shown in docs/dashboard.md) current.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from support import running_worker, wait_until
from test_dash_browser import browser  # noqa: F401 - the shared browser fixture, by name

from conveyor import Conveyor
from conveyor.cron import Scheduler
from conveyor.dashboard import start_in_thread
from conveyor.job import JobState

ASSET = Path(__file__).resolve().parents[2] / "docs" / "assets" / "dashboard" / "cron-controls.png"



def build_app(tmp_path: Path) -> Conveyor:
    app = Conveyor(f"sqlite:///{tmp_path}/cron.db")

    @app.task(name="shop.cleanup")
    def cleanup() -> None:
        return None

    @app.task(name="shop.sync_prices")
    def sync_prices() -> None:
        return None

    app.schedule(cleanup, "0 3 * * *", name="nightly-cleanup", timezone="Europe/Berlin")
    app.schedule(sync_prices, "*/10 * * * *", name="sync-prices")

    return app


def test_disable_and_run_now_from_the_cron_page(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    app = build_app(tmp_path)
    # The sync ran on its last tick (a real scheduler and worker), so its last run shows.
    scheduler = Scheduler(app)
    scheduler.run_pending(now=time.time() - 3600)  # first sight, an hour ago
    [tick_job] = [m for m in scheduler.run_pending()
                  if app.get_job(m.id).meta["cron"]["schedule"] == "sync-prices"]
    with running_worker(app, queues="default", concurrency=1):
        wait_until(lambda: app.get_job(tick_job.id).state is JobState.SUCCEEDED, timeout=20)
    dash = start_in_thread(app, port=0, sample_interval=60, title="Conveyor")
    context = browser.new_context(viewport={"width": 1280, "height": 560})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    try:
        page.goto(dash.url.rstrip("/") + "/cron")
        row = page.locator("#cron-sync-prices")
        assert "enabled" in row.locator(".cron-status").inner_text()
        assert f"#{tick_job.id}" in row.locator(".cron-last").inner_text()
        assert "succeeded" in row.locator(".cron-last").inner_text()

        page.click("#run-nightly-cleanup")
        page.wait_for_load_state("networkidle")
        assert "run by hand" in page.inner_text(".flash")
        manual = [j for j in app.backend.list_jobs(limit=10).jobs if j.meta["cron"].get("manual")]
        assert len(manual) == 1 and manual[0].meta["cron"]["schedule"] == "nightly-cleanup"
        assert page.url.endswith(f"/jobs/{manual[0].id}")
        assert app.backend.cron_states()["nightly-cleanup"].last_job_id != manual[0].id

        page.goto(dash.url.rstrip("/") + "/cron")
        page.click("#disable-sync-prices")
        page.wait_for_load_state("networkidle")
        assert "is disabled" in page.inner_text(".flash")
        assert app.backend.cron_states()["sync-prices"].disabled
        row = page.locator("#cron-sync-prices")
        assert "disabled" in row.locator(".cron-status").inner_text()
        assert page.locator("#enable-sync-prices").count() == 1
        # Disabled in the store: no scheduler enqueues its next tick.
        made = Scheduler(app).run_pending(now=time.time() + 3600)
        assert [app.get_job(m.id).meta["cron"]["schedule"] for m in made] in (
            [], ["nightly-cleanup"])
        assert app.backend.cron_states()["sync-prices"].last_job_id == tick_job.id
        ASSET.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ASSET))
        assert errors == [], f"console errors (CSP violations?): {errors}"
    finally:
        context.close()
        dash.stop()
        app.close()
