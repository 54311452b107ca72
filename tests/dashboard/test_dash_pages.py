"""The dashboard's pages show what the store holds: on SQLite, PostgreSQL and Redis."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import pytest
from dashkit import enqueue, kill_job
from starlette.testclient import TestClient
from support import wait_until

from conveyor import Conveyor
from conveyor.backends.base import ErrorInfo, Lease, WorkerInfo
from conveyor.dashboard import DashboardApp
from conveyor.dashboard import app as dashapp
from conveyor.dashboard import search as dashsearch
from conveyor.job import JobState


class Cells(HTMLParser):
    """Rows of the overview's queue table: {queue: {column: text}}."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self._queue: str | None = None
        self._col: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-queue"):
            self._queue = a["data-queue"]
            self.rows[self._queue or ""] = {}
        if tag == "td" and self._queue and a.get("data-col"):
            self._col = a["data-col"]
            self.rows[self._queue][self._col or ""] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._col = None
        if tag == "tr":
            self._queue = None

    def handle_data(self, data: str) -> None:
        if self._queue and self._col:
            self.rows[self._queue][self._col] += data.strip()


def queue_rows(page: str) -> dict[str, dict[str, str]]:
    p = Cells()
    p.feed(page)
    return p.rows


def job_ids(page: str) -> list[int]:
    """Job ids in the order the page's job table lists them."""
    body = page.split("<tbody>", 1)[1] if "<tbody>" in page else page
    return [int(m) for m in re.findall(r'href="/jobs/(\d+)">#\d+</a>', body)]


def number(text: str) -> int:
    return int(text.replace("\u202f", "").replace(",", ""))


def test_overview_numbers_match_the_store(app: Conveyor, client: TestClient) -> None:
    b = app.backend
    enqueue(b, "emails", n=3)
    enqueue(b, "emails", n=2, delay=3600)
    kill_job(b, "reports")
    enqueue(b, "reports", n=2)
    b.claim("reports", 1, worker_id="w1", lease_s=30)
    stats = b.stats()
    page = client.get("/")
    assert page.status_code == 200
    rows = queue_rows(page.text)
    assert set(rows) == {q.queue for q in stats.queues} == {"emails", "reports"}
    for q in stats.queues:
        row = rows[q.queue]
        assert number(row["waiting"]) == q.depth
        assert number(row["scheduled"]) == q.scheduled
        assert number(row["running"]) == q.running
        assert number(row["dead"]) == q.dead
        assert number(row["succeeded"]) == q.succeeded
    assert 'id="total-waiting">4<' in page.text  # 3 on emails + 1 left on reports
    assert 'id="total-dead">1<' in page.text
    assert "dead_jobs" in page.text  # the dead-jobs alert fires
    assert "no_live_workers" in page.text


def test_charts_draw_from_samples(app: Conveyor, dash: DashboardApp, client: TestClient) -> None:
    b = app.backend
    sampler = dash.dashboard.sampler
    wait_until(sampler.snapshot, message="the sampler's first reading")
    sampler.samples.clear()
    sampler.interval = 1.0  # readings closer than half of it are not kept
    t = b.now()
    sampler.offer(b.stats(now=t - 20))  # the store's clock is injectable: no sleeping
    enqueue(b, "q", n=4)
    for job in b.claim("q", 4, worker_id="w", lease_s=30):
        assert job.lease_token
        b.ack(Lease(job.id, job.lease_token), None)
    sampler.offer(b.stats(now=t - 10))
    page = client.get("/").text
    assert page.count("<svg viewBox=") == 3, "three charts: throughput, failures, backlog"
    assert 'class="line ok"' in page  # the throughput line
    assert 'text-anchor="end">0.4</text>' in page  # 4 jobs in the 10 s between readings: 0.4/s tops the axis


def test_queue_page(app: Conveyor, client: TestClient) -> None:
    enqueue(app.backend, "emails", n=2)
    page = client.get("/queues/emails")
    assert page.status_code == 200
    assert 'id="q-waiting">2<' in page.text
    assert client.get("/queues/nothing-here").status_code == 404
    assert client.get("/queues/bad%20name").status_code == 400


def test_job_list_cursor_pages_walk_every_job_once(app: Conveyor, client: TestClient) -> None:
    ids = enqueue(app.backend, "a", n=7) + enqueue(app.backend, "b", task="t.other", n=3)
    seen: list[int] = []
    url = "/jobs?limit=3"
    for _ in range(10):
        page = client.get(url)
        assert page.status_code == 200
        seen += job_ids(page.text)
        older = re.search(r'id="older" href="([^"]+)"', page.text)
        if not older:
            break
        url = html.unescape(older.group(1))
    assert seen == sorted(ids, reverse=True)


def test_job_list_filters(app: Conveyor, client: TestClient) -> None:
    a = enqueue(app.backend, "a", task="t.one", n=3)
    b = enqueue(app.backend, "b", task="t.two", n=2)
    dead = kill_job(app.backend, "c")
    assert job_ids(client.get("/jobs?queue=b").text) == sorted(b, reverse=True)
    assert job_ids(client.get("/jobs?task=t.one").text) == sorted(a, reverse=True)
    assert job_ids(client.get("/jobs?state=dead").text) == [dead]
    assert job_ids(client.get("/jobs?state=available&queue=a").text) == sorted(a, reverse=True)


@pytest.mark.parametrize("query", ["state=nope", "queue=a%20b", "cursor=abc", "cursor=-1", "task=a/b",
                                   "q=" + "x" * 257, "limit=ten"])
def test_bad_parameters_are_a_400_with_a_reason(client: TestClient, query: str) -> None:
    r = client.get(f"/jobs?{query}")
    assert r.status_code == 400
    assert "Bad request" in r.text


def test_page_size_is_capped(app: Conveyor, client: TestClient) -> None:
    enqueue(app.backend, "a", n=dashapp.MAX_PAGE_SIZE + 5)
    page = client.get("/jobs?limit=1000000000")
    assert page.status_code == 200
    assert len(job_ids(page.text)) == dashapp.MAX_PAGE_SIZE


def test_search_by_id_and_by_text(app: Conveyor, client: TestClient) -> None:
    b = app.backend
    [alice] = enqueue(b, "a", args={"email": "alice@example.com"})
    enqueue(b, "a", args={"email": "bob@example.com"}, n=3)
    dead = kill_job(b, "c", message="partner-42.example.com refused the connection")
    page = client.get("/jobs?q=alice@example").text
    assert job_ids(page) == [alice]
    assert job_ids(client.get("/jobs?q=REFUSED").text) == [dead]  # error messages, any case
    exact = client.get(f"/jobs?q=%23{alice}").text
    assert "Job id match" in exact and f'href="/jobs/{alice}"' in exact
    assert "No job has id 999999" in client.get("/jobs?q=999999").text


def test_text_search_scans_a_bounded_window_and_can_go_on(app: Conveyor, client: TestClient,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashsearch, "SEARCH_WINDOW", 4)
    monkeypatch.setattr(dashsearch, "SEARCH_BATCH", 2)
    b = app.backend
    [old] = enqueue(b, "a", args={"needle": "found-me"})
    enqueue(b, "a", args={"x": 1}, n=6)
    first = client.get("/jobs?q=found-me").text
    assert job_ids(first) == []
    assert "search older jobs" in first
    more = re.search(r'href="([^"]+)">search older jobs', first)
    assert more
    second = client.get(html.unescape(more.group(1))).text
    assert job_ids(second) == [old]


def test_job_page_shows_every_attempt(app: Conveyor, client: TestClient) -> None:
    b = app.backend
    [job_id] = enqueue(b, "a", args={"order": 7})
    for attempt, worker in ((1, "worker-one"), (2, "worker-two")):
        [job] = b.claim("a", 1, worker_id=worker, lease_s=30)
        assert job.lease_token
        b.retry(Lease(job.id, job.lease_token),
                ErrorInfo("exception", f"gateway timeout {attempt}", "TimeoutError", f"Traceback attempt {attempt}"),
                delay=0)
    [job] = b.claim("a", 1, worker_id="worker-three", lease_s=30)
    assert job.lease_token
    b.kill(Lease(job.id, job.lease_token), ErrorInfo("rejected", "no such order", "Reject", "Traceback final"))
    page = client.get(f"/jobs/{job_id}").text
    for text in ("Attempt 1", "Attempt 2", "Attempt 3", "worker-one", "worker-two", "worker-three",
                 "gateway timeout 1", "gateway timeout 2", "no such order", "Traceback attempt 1",
                 "Traceback final", "rejected", "&#34;order&#34;: 7"):
        assert text in page, text
    assert "st-dead" in page
    # Redriven and run to success: a new round of attempts, the old errors kept.
    assert b.redrive([job_id]) == 1
    [job] = b.claim("a", 1, worker_id="worker-four", lease_s=30)
    assert job.lease_token
    b.ack(Lease(job.id, job.lease_token), '{"charged": true}')
    page = client.get(f"/jobs/{job_id}").text
    assert "Redriven: attempts counted again" in page
    assert "succeeded" in page and "worker-four" in page and "&#34;charged&#34;: true" in page
    assert client.get("/jobs/987654321").status_code == 404


def test_workers_page_lists_workers_and_their_running_jobs(app: Conveyor, client: TestClient) -> None:
    b = app.backend
    now = b.now()
    b.record_worker(WorkerInfo(id="host-a:1:abc", queues=["a"], concurrency=4, host="host-a", pid=1,
                               started_at=now - 100, last_seen=now, running=1))
    enqueue(b, "a")
    enqueue(b, "z")
    [running] = b.claim("a", 1, worker_id="host-a:1:abc", lease_s=30)
    [orphan] = b.claim("z", 1, worker_id="gone:9:zzz", lease_s=30)
    page = client.get("/workers").text
    assert "host-a:1:abc" in page and f"#{running.id}" in page
    assert "stopped heartbeating" in page and f"#{orphan.id}" in page


def test_cron_page(app: Conveyor, client: TestClient) -> None:
    assert "No cron schedules are registered" in client.get("/cron").text

    @app.cron("*/5 * * * *", name="nightly-report", timezone="Europe/Berlin")
    def report() -> None: ...

    page = client.get("/cron")
    assert page.status_code == 200
    assert "nightly-report" in page.text and "*/5 * * * *" in page.text and "Europe/Berlin" in page.text
    assert "never" in page.text


def test_healthz_and_static(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    css = client.get("/static/dashboard.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert client.get("/static/dashboard.js").headers["content-type"].startswith(("text/javascript",
                                                                                "application/javascript"))


def test_dead_letter_page_lists_dead_jobs_only(app: Conveyor, client: TestClient) -> None:
    dead = [kill_job(app.backend, "c", args={"n": i}) for i in range(3)]
    enqueue(app.backend, "c", n=2)
    page = client.get("/dead").text
    assert job_ids(page) == sorted(dead, reverse=True)
    assert "Redrive all 3" in page and "Purge all 3" in page
    assert job_ids(client.get("/dead?queue=other").text) == []
    assert app.backend.list_jobs(state=JobState.DEAD).jobs


def test_stuck_slots_show_on_the_overview_and_workers_page(app: Conveyor, client: TestClient) -> None:
    b = app.backend
    now = b.now()
    b.record_worker(WorkerInfo(id="host-s:1:hung", queues=["a"], concurrency=2, host="host-s", pid=1,
                               started_at=now - 100, last_seen=now, running=0, stuck=2))
    def text(path: str) -> str:
        return re.sub(r"<[^>]+>", "", client.get(path).text)

    workers = text("/workers")
    assert "0 of 2 busy, 2 stuck" in workers and "sync tasks running past their timeout" in workers
    overview = text("/")
    assert "2 of 2 worker slots busy, 2 stuck" in overview
    assert "stuck_slots:host-s:1:hung" in overview or "host-s:1:hung has 2 of 2 slot(s) stuck" in overview
