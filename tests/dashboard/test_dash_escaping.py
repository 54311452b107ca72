"""Job data is data: script payloads in args, errors, tracebacks, task names, worker ids and
results render as text on every page, and secrets in args, errors and store URLs are masked."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from dashkit import csrf_of, post
from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor.backends.base import ErrorInfo, Lease, NewJob, WorkerInfo

PAYLOADS = [
    "<img src=x onerror=alert(1)>",
    '"><script>alert(1)</script>',
    "javascript:alert(1)",
    "{{7*7}}",
    "' onmouseover='alert(1)",
]
CANARY = "hunter2-CANARY"


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("img", "iframe", "object", "embed", "style"):
            self.problems.append(f"<{tag}> element")
        for name, value in attrs:
            if name.startswith("on"):
                self.problems.append(f"{name}= attribute on <{tag}>")
            if name in ("href", "src", "action", "formaction") and (value or "").strip().lower().startswith(
                    "javascript:"):
                self.problems.append(f"javascript: URL in {name}")
        if tag == "script" and not (dict(attrs).get("src") or "").startswith("/static/"):
            self.problems.append("<script> that is not the dashboard's own")


def injected(html_text: str) -> list[str]:
    parser = Tags()
    parser.feed(html_text)
    return parser.problems


def make_hostile_jobs(app: Conveyor) -> dict[str, int]:
    b = app.backend
    evil = " | ".join(PAYLOADS)
    now = b.now()
    b.record_worker(WorkerInfo(id="<b>w</b>" + PAYLOADS[0], queues=["evil"], concurrency=2, host=PAYLOADS[1],
                               pid=1, started_at=now, last_seen=now))
    args = {"note": evil, PAYLOADS[0]: PAYLOADS[1], "password": CANARY, "api_key": CANARY,
            "dsn": f"postgresql://ops:{CANARY}@db.internal/app"}
    res = b.enqueue_many([
        NewJob(task="evil.<b>task</b>", queue="evil", args=json.dumps(args), max_attempts=1, timeout=30,
               unique_key="key-" + PAYLOADS[1]),
        NewJob(task="evil.ok", queue="evil", args=json.dumps({"x": PAYLOADS[3]}), max_attempts=1, timeout=30),
        NewJob(task="evil.run", queue="evil", args=json.dumps({"y": PAYLOADS[4]}), max_attempts=1, timeout=30),
    ])
    ids = {"dead": res[0].id, "ok": res[1].id, "running": res[2].id}
    claimed = {j.id: j for j in b.claim("evil", 3, worker_id="<b>w</b>" + PAYLOADS[0], lease_s=60)}
    dead, ok = claimed[ids["dead"]], claimed[ids["ok"]]
    assert dead.lease_token and ok.lease_token
    b.kill(Lease(dead.id, dead.lease_token), ErrorInfo(
        "exception", f"{evil} while connecting to redis://:{CANARY}@cache:6379/0", PAYLOADS[1],
        f"Traceback (most recent call last):\n  File \"x.py\"\n{evil}\nValueError: {PAYLOADS[0]}"))
    b.ack(Lease(ok.id, ok.lease_token), json.dumps({"html": evil, "token": CANARY}))
    return ids


def test_payloads_render_as_text_on_every_page(app: Conveyor, client: TestClient) -> None:
    ids = make_hostile_jobs(app)
    pages = ["/", "/jobs", "/jobs?state=dead", "/jobs?q=onerror", "/jobs?q=%3Cimg", "/dead", "/dead?queue=evil",
             "/workers", "/cron", "/queues/evil", f"/jobs/{ids['dead']}", f"/jobs/{ids['ok']}",
             f"/jobs/{ids['running']}", "/jobs?state=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E",
             "/queues/%3Cimg%3E", "/no-such-page%3Cimg%20src=x%3E"]
    seen_escaped = 0
    for path in pages:
        r = client.get(path)
        assert r.status_code in (200, 400, 404), (path, r.status_code)
        assert injected(r.text) == [], path
        for raw in ("<img src=x", "<script>alert", "<b>task</b>", "<b>w</b>"):
            assert raw not in r.text, (path, raw)
        seen_escaped += r.text.count("&lt;img src=x onerror=alert(1)&gt;")
    assert seen_escaped > 10, "the payloads were not shown at all, so escaping was not tested"
    detail = client.get(f"/jobs/{ids['ok']}").text
    assert "{{7*7}}" in detail, "template syntax in data must be shown literally, never evaluated"
    # Confirmation pages show job data too.
    confirm = post(client, "/dead/purge", {"ids": str(ids["dead"])})
    assert confirm.status_code == 200 and injected(confirm.text) == []
    assert "&lt;b&gt;task&lt;/b&gt;" in confirm.text


def test_secrets_are_masked_everywhere(app: Conveyor, client: TestClient) -> None:
    ids = make_hostile_jobs(app)
    real_url = app.url
    app.url = f"postgresql://ops:{CANARY}@db.internal:5432/jobs?sslpassword={CANARY}"  # what the header shows
    try:
        for path in ["/", "/jobs", "/dead", "/workers", f"/jobs/{ids['dead']}", f"/jobs/{ids['ok']}",
                     "/jobs?q=connecting"]:
            page = client.get(path).text
            assert CANARY not in page, path
        detail = client.get(f"/jobs/{ids['dead']}").text
        assert "postgresql://ops:***@db.internal/app" in detail
        assert "redis://:***@cache:6379/0" in detail
        assert "&#34;password&#34;: &#34;***&#34;" in detail
        assert "ops:***@db.internal:5432" in client.get("/").text
        # Searching for a masked value finds nothing: search is no oracle for secrets.
        assert f'href="/jobs/{ids["dead"]}"' not in client.get(f"/jobs?q={CANARY}").text.split("<tbody>")[1]
    finally:
        app.url = real_url
    assert csrf_of(client)
