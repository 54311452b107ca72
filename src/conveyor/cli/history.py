"""``conveyor stats --history 1h``: the store's history per queue (backends/history.py), a row
per queue with its totals over the range and a sparkline of what succeeded."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from ..backends import redact_url
from ..backends.base import Backend
from ..dashboard.historyview import BY_KEY, Bucket, history_view

SPARKS = " ▁▂▃▄▅▆▇█"
RANGE_KEYS = tuple(BY_KEY)


def history_rows(backend: Backend, key: str) -> tuple[float, dict[str, tuple[Bucket, list[int]]]]:
    """Per queue: its totals over the range and its succeeded count per chart bucket."""
    rng = BY_KEY[key]
    now = backend.now()
    rows: dict[str, tuple[Bucket, list[int]]] = {}
    for queue in sorted({p.queue for p in backend.history(since=now - rng.seconds - 3600,
                                                          until=now + 60)}):
        view = history_view(backend, rng, now=now, queue=queue)
        [done] = view.charts[0].series
        rows[queue] = (view.total, [round((v or 0) * rng.bucket / 60) for _, v in done.points])
    return now, rows


def sparkline(values: list[int]) -> str:
    top = max(values, default=0)
    if top <= 0:
        return ""
    return "".join(SPARKS[0 if v <= 0 else max(1, round(v / top * (len(SPARKS) - 1)))]
                   for v in values)


def history_table(backend: Backend, url: str, key: str) -> Table:
    _, rows = history_rows(backend, key)
    table = Table(title=f"history, last {BY_KEY[key].label}, on {redact_url(url)}",
                  title_justify="left")
    for col in ("queue", "succeeded", "failed", "dead", "avg pickup", "avg run", "succeeded"):
        table.add_column(col, justify="left" if col == "queue" else "right")
    for queue, (total, spark) in rows.items():
        n = total.processed  # latency sums are of succeeded attempts
        table.add_row(queue, str(total.processed), str(total.failed), str(total.dead),
                      f"{total.wait_sum / n:.3f}s" if n else "-",
                      f"{total.run_sum / n:.3f}s" if n else "-", sparkline(spark))
    if not rows:
        table.caption = "no history in this range yet (workers write theirs about every 12 s)"
    return table


def history_dict(backend: Backend, key: str) -> dict[str, Any]:
    now, rows = history_rows(backend, key)
    return {"now": now, "range": key, "bucket_s": BY_KEY[key].bucket, "queues": {
        q: {"succeeded": t.processed, "failed": t.failed, "dead": t.dead,
            "wait_sum": t.wait_sum, "run_sum": t.run_sum, "succeeded_per_bucket": spark}
        for q, (t, spark) in rows.items()}}
