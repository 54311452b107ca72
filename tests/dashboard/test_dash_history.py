"""The dashboard's history charts read the store (backends/history.py): two dashboards show the
same numbers, a restarted one shows them still, and ``?range=`` picks the window."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from dashkit import enqueue, make_client

from conveyor import Conveyor
from conveyor.backends.base import HistoryPoint
from conveyor.backends.history import HOUR, MINUTE
from conveyor.dashboard import create_app

TOTALS = re.compile(r'id="history-(processed|failed|dead)" data-value="(\d+)"')


def shown(app: Conveyor, path: str) -> dict[str, int]:
    """The history totals a fresh dashboard on ``app`` shows at ``path``."""
    dash = create_app(app, sample_interval=3600)
    try:
        with make_client(dash) as client:
            page = client.get(path)
            assert page.status_code == 200, page.text
            return {k: int(v.replace(",", "")) for k, v in TOTALS.findall(page.text)}
    finally:
        dash.close()


def seed(app: Conveyor) -> float:
    """Rows as workers flush them: this minute, 3 hours ago, and 3 days ago (rolled to hours)."""
    b = app.backend
    now = b.now()
    minute = int(now) - int(now) % MINUTE
    b.record_history([
        HistoryPoint("emails", minute, processed=40, failed=3, dead=1, wait_sum=8.0, run_sum=4.0),
        HistoryPoint("reports", minute, processed=2),
        HistoryPoint("emails", minute - 3 * HOUR, processed=100),
        HistoryPoint("emails", minute - 3 * 86400, processed=1000, dead=5),
    ])
    b.rollup_history(keep_days=7)  # the 3-day-old minute becomes an hourly row
    enqueue(b, "emails")  # a queue page is there for a queue with jobs (or workers)
    enqueue(b, "reports")
    return now


def test_two_dashboards_agree_and_a_restart_keeps_the_numbers(
        make_app: Callable[..., Conveyor]) -> None:
    one, two = make_app(), make_app()  # two processes' apps on one store
    seed(one)
    first = shown(one, "/")
    assert first == {"processed": 42, "failed": 3, "dead": 1}
    assert shown(two, "/") == first
    assert shown(one, "/") == first  # a dashboard started again: the store still has them


def test_the_range_in_the_url_picks_the_window(make_app: Callable[..., Conveyor]) -> None:
    app = make_app()
    seed(app)
    assert shown(app, "/?range=1h")["processed"] == 42
    assert shown(app, "/?range=6h")["processed"] == 142
    assert shown(app, "/?range=24h")["processed"] == 142
    assert shown(app, "/?range=7d") == {"processed": 1142, "failed": 3, "dead": 6}
    assert shown(app, "/?range=nonsense")["processed"] == 42  # the default, 1 h
    assert shown(app, "/queues/emails?range=7d")["processed"] == 1140
    assert shown(app, "/queues/reports?range=7d")["processed"] == 2


def test_the_charts_draw_the_history_and_the_picker_marks_the_range(
        make_app: Callable[..., Conveyor]) -> None:
    app = make_app()
    seed(app)
    dash = create_app(app, sample_interval=3600)
    try:
        with make_client(dash) as client:
            page = client.get("/?range=6h").text
    finally:
        dash.close()
    assert page.count('<figure class="hchart card">') == 3
    assert 'class="line ok"' in page and 'class="line bad"' in page
    assert re.search(r'class="range on" href="/\?range=6h#history"[^>]*aria-current="true"', page)
    assert "Live throughput" in page  # this process's own samples, still there, named as live
    assert 'id="history-wait">56 ms<' in page  # 8 s of pickup over 142 successes in 6 h


def test_conveyor_stats_history_shows_the_same_numbers(make_app: Callable[..., Conveyor]) -> None:
    from click.testing import CliRunner

    from conveyor.cli import cli

    app = make_app()
    seed(app)
    runner = CliRunner()
    out = runner.invoke(cli, ["stats", "--history", "7d", "--json", "--url", app.url])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert {q: (v["succeeded"], v["failed"], v["dead"]) for q, v in got["queues"].items()} == {
        "emails": (1140, 3, 6), "reports": (2, 0, 0)}
    assert sum(got["queues"]["emails"]["succeeded_per_bucket"]) == 1140
    table = runner.invoke(cli, ["stats", "--history", "1h", "--url", app.url])
    assert table.exit_code == 0, table.output
    assert "history, last 1 h" in table.output
    assert re.search(r"emails\s+│\s+40\s+│\s+3\s+│\s+1\s+│", table.output), table.output
    assert runner.invoke(cli, ["stats", "--history", "2h", "--url", app.url]).exit_code == 2
