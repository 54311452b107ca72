"""Live updates and consistent counts (issue 38, item 6): on SQLite, PostgreSQL and Redis.

The lists and the job page refresh themselves with the overview's mechanism (the page re-fetched
at its own URL, its <main id="live"> swapped), so what is tested here is what such a refresh
gets: the page asks for it with a bounded interval, a refresh request is answered like any page
load (filters, cursor, auth), and the overview's numbers say what they count.
"""

from __future__ import annotations

import re

from dashkit import CSRF_RE, enqueue, kill_job, make_client, post
from starlette.testclient import TestClient
from support import wait_until

from conveyor import Conveyor
from conveyor.backends.base import Lease, WorkerInfo
from conveyor.dashboard import DashboardApp, create_app

REFRESH = {"X-Requested-With": "conveyor-refresh"}  # what dashboard.js sends
TOKEN = "Vb3kQ9xLr7TmN2pWz5YcH8dJ4sFgA6eU0iOwR1qZtKy"


def refresh_of(page: str) -> int:
    m = re.search(r'<body data-refresh="(\d+)"', page)
    assert m, "no data-refresh on <body>"
    return int(m.group(1))


def text(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))


def card(page: str, label: str) -> str:
    """The text of the overview's stat card with this label."""
    cards = re.findall(r'<(?:div|a) class="card stat[^"]*"[^>]*>(.*?)</(?:div|a)>\s*(?=<(?:div|a) '
                       r'class="card stat|</section>)', page, re.S)
    for c in cards:
        if f'<div class="label">{label}</div>' in c:
            return text(c).strip()
    raise AssertionError(f"no card {label!r}")


def test_lists_and_the_job_page_refresh_themselves_within_bounds(app: Conveyor,
                                                                 client: TestClient) -> None:
    b = app.backend
    dead = kill_job(b, "live-a")
    [waiting] = enqueue(b, "live-a")
    for path in ("/", "/jobs", "/jobs?state=dead&queue=live-a", "/dead", "/dead?queue=live-a",
                 f"/jobs/{waiting}", f"/jobs/{dead}"):
        seconds = refresh_of(client.get(path).text)
        assert 1 <= seconds <= 60, (path, seconds)
    # A job on its way is watched closely; a finished one (which only a redrive moves) less.
    assert refresh_of(client.get(f"/jobs/{waiting}").text) < refresh_of(
        client.get(f"/jobs/{dead}").text)


def test_a_refresh_keeps_the_filter_and_the_page(app: Conveyor, client: TestClient) -> None:
    b = app.backend
    ids = enqueue(b, "live-f", n=5)
    enqueue(b, "live-other", n=2)
    path = f"/jobs?queue=live-f&limit=2&cursor={ids[3]}"
    first = client.get(path, headers=REFRESH).text
    shown = [int(i) for i in re.findall(r'href="/jobs/(\d+)">#', first)]
    assert shown == [ids[2], ids[1]]
    # The job moves on: the same refresh shows its new state, on the same rows.
    [job] = b.claim("live-f", 1, worker_id="w-live", lease_s=30)
    assert job.id == ids[0]
    again = client.get(path, headers=REFRESH).text
    assert [int(i) for i in re.findall(r'href="/jobs/(\d+)">#', again)] == shown


def test_a_refreshed_job_page_follows_the_job(app: Conveyor, client: TestClient) -> None:
    b = app.backend
    [job_id] = enqueue(b, "live-j", args={"order": 9})
    page = client.get(f"/jobs/{job_id}", headers=REFRESH).text
    assert 'class="state st-available"' in page and "Not attempted yet." in page
    [job] = b.claim("live-j", 1, worker_id="w-live-j", lease_s=30)
    assert job.lease_token
    page = client.get(f"/jobs/{job_id}", headers=REFRESH).text
    assert 'st-running' in page and "Attempt 1" in page and "w-live-j" in page
    b.ack(Lease(job.id, job.lease_token), '{"shipped": 9}')
    page = client.get(f"/jobs/{job_id}", headers=REFRESH).text
    assert "st-succeeded" in page and "&#34;shipped&#34;: 9" in page


def test_a_refresh_is_authenticated_like_a_page_load(app: Conveyor) -> None:
    dash = create_app(app, token=TOKEN, sample_interval=3600)
    try:
        with make_client(dash) as c:
            r = c.get("/dead", headers=REFRESH)
            assert r.status_code == 303 and r.headers["location"].startswith("/login")
            assert "dead-form" not in r.text  # no content for a stranger's refresh
            ok = c.get("/dead", headers={**REFRESH, "Authorization": f"Bearer {TOKEN}"})
            assert ok.status_code == 200 and 'id="live"' in ok.text
            assert ok.headers["cache-control"] == "no-store"
    finally:
        dash.close()


def test_running_jobs_and_busy_slots_are_labelled_and_their_gap_explained(
        app: Conveyor, client: TestClient) -> None:
    """The store counts a job running from its claim; a worker counts a busy slot from its last
    heartbeat. Both are shown, each saying what it counts, and a gap between them is explained."""
    b = app.backend
    now = b.now()
    # A live worker whose last heartbeat reported 1 running job; it has claimed 3 since.
    b.record_worker(WorkerInfo(id="host-l:1:live", queues=["live-r"], concurrency=4, host="host-l",
                               pid=1, started_at=now - 100, last_seen=now, running=1))
    enqueue(b, "live-r", n=5)
    assert len(b.claim("live-r", 3, worker_id="host-l:1:live", lease_s=30)) == 3
    # A job still leased to a worker that stopped heartbeating, its lease already run out.
    assert len(b.claim("live-r", 1, worker_id="gone:9:dead", lease_s=0.05)) == 1
    wait_until(lambda: sum(q.expired_leases for q in b.stats().queues) == 1)
    page = client.get("/").text
    running = card(page, "Running jobs")
    assert running.startswith("Running jobs 4 "), running
    assert "in the store" in running
    assert "1 of 4 worker slots busy" in running and "last heartbeat" in running
    assert "2 claimed since their worker's last heartbeat" in running, running
    assert "1 on a worker with no heartbeat" in running, running
    assert "1 with an expired lease" in running, running


def test_counts_that_agree_need_no_explanation(app: Conveyor, client: TestClient) -> None:
    b = app.backend
    now = b.now()
    b.record_worker(WorkerInfo(id="host-q:1:ok", queues=["live-q"], concurrency=2, host="host-q",
                               pid=1, started_at=now - 100, last_seen=now, running=1))
    enqueue(b, "live-q")
    b.claim("live-q", 1, worker_id="host-q:1:ok", lease_s=30)
    running = card(client.get("/").text, "Running jobs")
    assert "Running jobs 1 " in running and "1 of 2 worker slots busy" in running
    assert "differ" not in running


def test_throughput_card_and_chart_say_which_window_they_show(
        app: Conveyor, dash: DashboardApp, client: TestClient) -> None:
    b = app.backend
    sampler = dash.dashboard.sampler
    wait_until(sampler.snapshot, message="the sampler's first reading")  # then it sleeps an hour
    sampler.samples.clear()
    sampler.interval = 1.0
    t = b.now()
    sampler.offer(b.stats(now=t - 20))
    enqueue(b, "live-t", n=4)
    for job in b.claim("live-t", 4, worker_id="w", lease_s=30):
        assert job.lease_token
        b.ack(Lease(job.id, job.lease_token), None)
    sampler.offer(b.stats(now=t - 10))
    page = client.get("/").text
    throughput = card(page, "Throughput")
    # 4 jobs between the first reading and now (about 20 s): per second, as the chart plots it,
    # over the window the samples cover, not an unlabelled "last minute".
    value = float(re.search(r"Throughput ([\d.]+)/s ", throughput).group(1))  # type: ignore[union-attr]
    assert 0.15 <= value <= 0.2, throughput
    assert re.search(r"mean of the last (19|2\d) s \(4 jobs\)", throughput), throughput
    # The chart's legend number is its latest step (0/s: nothing finished since t - 10),
    # labelled as such so it is not read as contradicting the card's mean.
    # (The store's history charts come first on the page, per minute; this is the live one.)
    legends = [text(x) for x in re.findall(r'<ul class="legend">(.*?)</ul>', page, re.S)]
    legend = next(x for x in legends if "succeeded/s" in x)
    assert re.search(r"succeeded/s latest( \d+ s)? 0\.00", legend), legend


def test_forms_in_a_refreshed_page_still_post(app: Conveyor, client: TestClient) -> None:
    """The content a refresh swaps in carries the browser's CSRF token: its buttons work, and a
    post without the token is still refused."""
    b = app.backend
    first = kill_job(b, "live-c")
    loaded = CSRF_RE.search(client.get("/dead").text)
    refreshed = CSRF_RE.search(client.get("/dead", headers=REFRESH).text)
    assert loaded and refreshed and loaded.group(1) == refreshed.group(1)
    refused = post(client, "/dead/purge", {"ids": str(first), "confirmed": "yes"}, token="0" * 64)
    assert refused.status_code == 403 and b.get(first) is not None
    done = post(client, "/dead/purge", {"ids": str(first), "confirmed": "yes"},
                token=refreshed.group(1))
    assert done.status_code == 303 and b.get(first) is None
