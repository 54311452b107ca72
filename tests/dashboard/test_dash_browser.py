"""The dashboard in a real browser: Debian's chromium driven by Playwright, against a real
server, a real worker and a SQLite store.

Screenshots of the main pages are saved under test-output/dashboard/ (git-ignored) so a
person can look at them. No test here needs a network: everything is on 127.0.0.1.
"""

from __future__ import annotations

import http.server
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import running_worker, wait_until

from conveyor import Conveyor, Reject
from conveyor.dashboard import RunningDashboard, start_in_thread
from conveyor.errors import ConfigurationError
from conveyor.job import JobState

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update"]
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "dashboard"
XSS = "<img src=x onerror=alert(1)>"
TOKEN = "Vb3kQ9xLr7TmN2pWz5YcH8dJ4sFgA6eU0iOwR1qZtKy"  # secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        reason = f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A browser tab that fails the test on a JavaScript dialog (an XSS that ran) and records
    console errors (a Content-Security-Policy violation shows up there)."""

    def __init__(self, browser: Any, base: str, **context: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1440, "height": 900}, **context)
        self.page = self.context.new_page()
        self.base = base.rstrip("/")
        self.dialogs: list[str] = []
        self.console_errors: list[str] = []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text))

    def go(self, path: str) -> Any:
        response = self.page.goto(self.base + path)
        self.page.wait_for_load_state("networkidle")
        return response

    def shot(self, name: str) -> Path:
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        assert self.dialogs == [], f"a script from job data ran: {self.dialogs}"
        assert self.console_errors == [], f"console errors (CSP violations?): {self.console_errors}"
        self.context.close()


FLAKY = {"fail": True}


def build_app(tmp_path: Path) -> Conveyor:
    app = Conveyor(f"sqlite:///{tmp_path}/browser.db", visibility_timeout=10)

    @app.task(name="shop.charge_card", queue="default", max_attempts=1)
    def charge_card(order_id: int) -> dict[str, int]:
        if FLAKY["fail"]:
            raise ConnectionError(f"payment gateway unreachable for order {order_id}")
        return {"order_id": order_id, "charged": 1}

    @app.task(name="shop.send_email", queue="high")
    def send_email(user_id: int) -> None:
        return None

    @app.task(name="shop.import_feed", queue="default", max_attempts=1)
    def import_feed(note: str) -> None:
        raise Reject(f"cannot parse {note}")

    @app.task(name="shop.build_report", queue="reports")
    def build_report(report_id: int) -> None:
        return None

    if hasattr(app, "cron"):
        app.cron("0 3 * * *", name="nightly-cleanup", timezone="Europe/Berlin")(lambda: None)  # type: ignore[attr-defined]
    return app


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[tuple[Conveyor, RunningDashboard]]:
    FLAKY["fail"] = True
    app = build_app(tmp_path)
    dash = start_in_thread(app, port=0, sample_interval=0.5, title="Conveyor")
    try:
        yield app, dash
    finally:
        dash.stop()
        app.close()


@pytest.fixture
def tab(browser: Any, shop: tuple[Conveyor, RunningDashboard]) -> Iterator[Page]:
    page = Page(browser, shop[1].url)
    yield page
    page.close()


def task(app: Conveyor, name: str) -> Any:
    return app.tasks[name]


def fill_store(app: Conveyor) -> dict[str, Any]:
    """Jobs in every state the pages show, run by a real worker until the store is quiet."""
    emails = task(app, "shop.send_email").enqueue_many([(i,) for i in range(1, 41)])
    charges = [task(app, "shop.charge_card").enqueue(7000 + i) for i in range(3)]
    feed = task(app, "shop.import_feed").enqueue(XSS)
    with running_worker(app, queues="high,default", concurrency=4):
        wait_until(lambda: all(app.get_job(j.id).is_final for j in [*emails, *charges, feed]), timeout=20)
    task(app, "shop.build_report").enqueue_many([(i,) for i in range(5)])  # waiting: no worker on "reports"
    task(app, "shop.build_report").options(delay=3600).enqueue(99)
    return {"charges": charges, "feed": feed}


def numbers(tab: Page) -> dict[str, dict[str, int]]:
    rows: dict[str, dict[str, int]] = {}
    for row in tab.page.locator("#queues tbody tr[data-queue]").all():
        name = row.get_attribute("data-queue")
        rows[name] = {col: int(re.sub(r"\D", "", row.locator(f'td[data-col="{col}"]').inner_text()) or 0)
                      for col in ("waiting", "scheduled", "running", "succeeded", "dead")}
    return rows


def test_overview_matches_the_store(shop: tuple[Conveyor, RunningDashboard], tab: Page) -> None:
    app, _ = shop
    fill_store(app)
    tab.go("/")
    stats = app.backend.stats()
    shown = numbers(tab)
    assert set(shown) == {q.queue for q in stats.queues} == {"high", "default", "reports"}
    for q in stats.queues:
        assert shown[q.queue] == {"waiting": q.depth, "scheduled": q.scheduled, "running": q.running,
                                  "succeeded": q.succeeded, "dead": q.dead}, q.queue
    assert tab.page.inner_text("#total-dead") == str(sum(q.dead for q in stats.queues)) == "4"
    assert tab.page.inner_text("#total-waiting") == "5"
    assert "no_live_workers" in tab.page.inner_text(".alerts")  # reports has work and no worker
    # Let the sampler draw a few points, then keep pictures of the pages.
    wait_until(lambda: tab.go("/") and tab.page.locator(".chart svg").count() == 3, timeout=10, interval=0.5)
    tab.shot("01-overview")
    tab.go("/queues/default")
    tab.shot("02-queue-default")
    tab.go("/jobs")
    tab.shot("03-jobs")
    tab.go("/jobs?state=dead&q=gateway")
    assert tab.page.locator("table.jobs tbody tr").count() == 3
    tab.go("/workers")
    tab.shot("06-workers")
    tab.go("/cron")
    tab.shot("07-cron")


def test_open_a_dead_job_redrive_it_and_see_it_run(shop: tuple[Conveyor, RunningDashboard], tab: Page) -> None:
    app, _ = shop
    charge = fill_store(app)["charges"][0]
    tab.go("/dead")
    tab.shot("04-dead-letters")
    tab.page.click(f'a[href="/jobs/{charge.id}"]')
    tab.page.wait_for_load_state("networkidle")
    assert "payment gateway unreachable" in tab.page.inner_text(".attempts")
    assert "ConnectionError" in tab.page.inner_text(".attempts")
    tab.shot("05-job-dead")
    tab.page.click("#retry")
    assert "Retry?" in tab.page.inner_text("h1")
    tab.shot("08-confirm-retry")
    FLAKY["fail"] = False  # the gateway is back
    tab.page.click("#confirm")
    tab.page.wait_for_load_state("networkidle")
    assert "is back on queue default" in tab.page.inner_text(".flash")
    assert app.get_job(charge.id).state is JobState.AVAILABLE
    with running_worker(app, queues="default", concurrency=2):
        wait_until(lambda: app.get_job(charge.id).state is JobState.SUCCEEDED, timeout=15)
    tab.go(f"/jobs/{charge.id}")
    assert tab.page.inner_text("h1 .state") == "succeeded"
    attempts = tab.page.inner_text(".attempts")
    assert "Redriven" in attempts and "succeeded" in attempts and "payment gateway unreachable" in attempts
    assert '"charged": 1' in tab.page.inner_text("#result")
    tab.shot("09-job-succeeded-after-redrive")


def test_script_in_job_data_renders_as_text(shop: tuple[Conveyor, RunningDashboard], tab: Page) -> None:
    app, _ = shop
    feed = fill_store(app)["feed"]
    for path in ("/", "/jobs", "/dead", f"/jobs/{feed.id}", "/jobs?q=onerror"):
        tab.go(path)
        assert tab.page.locator("img").count() == 0, path  # the payload did not become an element
    tab.go(f"/jobs/{feed.id}")
    assert XSS in tab.page.inner_text("#args")
    assert f"cannot parse {XSS}" in tab.page.inner_text(".attempts")
    tab.shot("10-job-with-script-payload")


def test_admin_action_without_csrf_token_is_refused(shop: tuple[Conveyor, RunningDashboard], tab: Page) -> None:
    app, dash = shop
    charge = fill_store(app)["charges"][0]
    tab.go("/dead")
    status = tab.page.evaluate("""async (id) => {
        const r = await fetch('/dead/purge', {method: 'POST', body: 'confirmed=yes&ids=' + id,
            headers: {'Content-Type': 'application/x-www-form-urlencoded'}});
        return r.status; }""", charge.id)
    assert status == 403
    assert app.get_job(charge.id).state is JobState.DEAD
    # A page on another origin posting a form at the dashboard: refused, nothing changes.
    with attacker_site(dash.url, charge.id) as evil_url:
        tab.page.goto(evil_url)
        tab.page.wait_for_load_state("networkidle")
        assert "Cross-site request refused" in tab.page.content() or "CSRF" in tab.page.content()
    assert app.get_job(charge.id).state is JobState.DEAD
    tab.console_errors.clear()  # the two refusals (403) and the attacker page's missing favicon


class _Attacker(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class attacker_site:
    """A page on another origin (another port) that submits a purge form to the dashboard."""

    def __init__(self, target: str, job_id: int) -> None:
        handler = type("Handler", (_Attacker,), {"body": (
            f'<form id="f" method="post" action="{target}dead/purge">'
            f'<input name="ids" value="{job_id}"><input name="confirmed" value="yes"></form>'
            '<script>document.getElementById("f").submit()</script>').encode()})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_non_loopback_bind_needs_auth_and_refuses_strangers(tmp_path: Path, browser: Any) -> None:
    app = build_app(tmp_path)
    try:
        with pytest.raises(ConfigurationError, match="without authentication"):
            start_in_thread(app, host="0.0.0.0", port=0)
        dash = start_in_thread(app, host="0.0.0.0", port=0, token=TOKEN)
        try:
            import httpx

            base = dash.url.rstrip("/")
            assert httpx.get(base + "/dead", follow_redirects=False).status_code == 303
            assert httpx.post(base + "/dead/purge", data={"all": "yes", "confirmed": "yes"}).status_code == 401
            assert httpx.get(base + "/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
            tab = Page(browser, dash.url)
            tab.go("/dead")
            assert tab.page.url.startswith(base + "/login?next=")
            tab.shot("11-login")
            tab.page.fill("input[name=token]", TOKEN)
            tab.page.click("main button[type=submit]")
            tab.page.wait_for_load_state("networkidle")
            assert tab.page.url == base + "/dead"
            assert "Dead-letter queue" in tab.page.inner_text("h1")
            tab.close()
        finally:
            dash.stop()
    finally:
        app.close()


def test_over_https_login_act_and_log_out(tmp_path: Path, browser: Any, self_signed: tuple[str, str]) -> None:
    """Served over TLS: the URL is https, the browser logs in, its session cookie is Secure, an
    action (a POST with an https Origin) goes through; after logging out, a copy of the old
    cookie is refused."""
    app = build_app(tmp_path)
    charge = task(app, "shop.charge_card").enqueue(1)
    with running_worker(app, queues="default", concurrency=1):
        wait_until(lambda: app.get_job(charge.id).state is JobState.DEAD, timeout=20)
    cert, key = self_signed
    dash = start_in_thread(app, port=0, token=TOKEN, tls_cert=cert, tls_key=key, sample_interval=3600)
    tab = Page(browser, dash.url, ignore_https_errors=True)
    try:
        assert dash.url.startswith("https://127.0.0.1:")
        tab.go(f"/jobs/{charge.id}")
        assert "/login?next=" in tab.page.url
        tab.page.fill("input[name=token]", TOKEN)
        tab.page.click("main button[type=submit]")
        tab.page.wait_for_load_state("networkidle")
        session = next(c for c in tab.context.cookies() if c["name"] == "conveyor_session")
        assert session["secure"] and session["httpOnly"]
        assert all(c["secure"] for c in tab.context.cookies())
        tab.page.click("#retry")
        tab.page.click("#confirm")
        tab.page.wait_for_load_state("networkidle")
        assert "is back on queue default" in tab.page.inner_text(".flash")
        assert app.get_job(charge.id).state is JobState.AVAILABLE
        tab.shot("12-https-after-retry")
        tab.page.click("header button.link")  # Log out
        tab.page.wait_for_load_state("networkidle")
        assert "/login" in tab.page.url
        tab.context.add_cookies([session])  # the cookie, kept from before the logout
        tab.go("/dead")
        assert "/login?next=" in tab.page.url
    finally:
        tab.close()
        dash.stop()
        app.close()


def test_behind_a_proxy_that_terminates_https(tmp_path: Path) -> None:
    """A proxy on this machine (127.0.0.1, trusted) speaks https to the browser and http to the
    dashboard, saying so in X-Forwarded-Proto: the browser's https Origin is accepted and every
    cookie is Secure. The test plays the proxy, passing the browser's cookies along."""
    import httpx

    app = build_app(tmp_path)
    job = task(app, "shop.build_report").enqueue(1)
    dash = start_in_thread(app, port=0, token=TOKEN, forwarded_allow_ips="127.0.0.1", sample_interval=3600)
    proxied = {"Host": "jobs.example", "X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.9",
               "Origin": "https://jobs.example"}
    jar: dict[str, str] = {}  # the browser's cookies (Secure: it talks https to the proxy)

    def send(method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**proxied, **kwargs.pop("headers", {}), "Cookie": "; ".join(f"{k}={v}" for k, v in jar.items())}
        r = httpx.request(method, dash.url.rstrip("/") + path, headers=headers, follow_redirects=False, **kwargs)
        for k, v in r.headers.multi_items():
            if k == "set-cookie":
                assert "Secure" in v, v
                name, _, value = v.split(";")[0].partition("=")
                jar[name] = value
        return r

    try:
        csrf = re.search(r'name="csrf_token" value="(\w+)"', send("GET", "/login").text)
        assert csrf
        r = send("POST", "/login", data={"csrf_token": csrf.group(1), "token": TOKEN})
        assert r.status_code == 303, r.text
        assert "conveyor_session" in jar
        r = send("POST", f"/jobs/{job.id}/cancel", data={"csrf_token": csrf.group(1), "confirmed": "yes"})
        assert r.status_code == 303, r.text
        assert app.get_job(job.id).state is JobState.CANCELLED
        r = send("POST", "/logout", data={"csrf_token": csrf.group(1)}, headers={"X-Forwarded-Proto": "http"})
        assert r.status_code == 403  # the proxy said http: an https Origin is another site
    finally:
        dash.stop()
        app.close()


def test_screenshots_were_written() -> None:
    """Runs last in this module: the pictures are where the docs say (when chromium ran)."""
    if not SHOTS.exists():
        reason = f"no browser run: {CHROMIUM} is missing"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    names = sorted(p.name for p in SHOTS.glob("*.png"))
    print(f"\ndashboard screenshots in {SHOTS}: {', '.join(names)}")
    assert names


_: Callable[..., Any] = wait_until
