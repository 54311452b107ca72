"""How the commands print jobs, queues and workers: rich tables, JSON dicts, short ages."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, replace
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from ..backends import redact_url
from ..backends.base import BatchInfo, Stats
from ..job import Job
from ..redact import redact, shown_json, shown_text
from .context import console

# What `jobs show` / `dlq show` print of one value or traceback; --json prints everything.
SHOWN_CHARS = 4_000


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


# -- stats ---------------------------------------------------------------------------------
def stats_dict(stats: Stats) -> dict[str, Any]:
    return {
        "now": stats.now,
        "queues": [asdict(q) | {"depth": q.depth} for q in stats.queues],
        "workers": [asdict(w) for w in stats.workers],
    }


def _finished(q: Any) -> int:
    return int(q.succeeded + q.dead + q.cancelled)


def stats_view(stats: Stats, url: str, previous: Stats | None = None) -> Group:
    """The queues table; with ``previous`` (the last refresh) also throughput and failure rate."""
    rates = previous is not None and stats.now > previous.now
    table = Table(title=f"queues on {redact_url(url)}", title_justify="left")
    columns = ["queue", "depth", "oldest waiting", "scheduled", "waiting", "running", "succeeded",
               "dead", "cancelled", "lease expiries"]
    if rates:
        columns += ["done/s", "failed"]
    for col in columns:
        table.add_column(col, justify="left" if col == "queue" else "right")
    before = {q.queue: q for q in previous.queues} if previous is not None else {}
    for q in stats.queues:
        row = [q.queue, str(q.depth), age(q.oldest_available_age), str(q.scheduled),
               str(q.waiting), str(q.running),
               str(q.succeeded), f"[red]{q.dead}[/red]" if q.dead else "0", str(q.cancelled),
               str(q.lease_expiries)]
        if rates:
            assert previous is not None
            old = before.get(q.queue)
            done = _finished(q) - (_finished(old) if old else 0)
            failed = q.dead - (old.dead if old else 0)
            # Pruning deletes finished jobs, which can make a window's count dip: show "-" then.
            row.append(f"{done / (stats.now - previous.now):.1f}" if done >= 0 else "-")
            row.append(f"{failed / done:.0%}" if done > 0 and failed >= 0 else "-")
        table.add_row(*row)
    if not stats.queues:
        table.add_row("(no jobs yet)", *[""] * (len(columns) - 1))
    workers = Table(title=f"live workers: {len(stats.workers)}", title_justify="left")
    for col in ("worker", "queues", "running", "stuck", "concurrency", "last heartbeat", "up"):
        workers.add_column(col)
    for w in stats.workers:
        stuck = f"[red]{w.stuck}[/red]" if w.stuck else "0"
        workers.add_row(w.id, ",".join(w.queues), str(w.running), stuck, str(w.concurrency),
                        age(stats.now - w.last_seen) + " ago", age(stats.now - w.started_at))
    return Group(table, workers)


# -- jobs ----------------------------------------------------------------------------------
def shown(job: Job) -> Job:
    """The job as screens show it: secret-named values and URL passwords masked."""
    return replace(job, args=redact(job.args), result=redact(job.result), errors=redact(job.errors),
                   meta=redact(job.meta), steps=redact(job.steps))


def job_dict(job: Job) -> dict[str, Any]:
    d = asdict(shown(job))
    d["state"] = str(job.state)
    d.pop("lease_token", None)
    return d


def show_job(job: Job) -> None:
    # Clipped before masking: a result of millions of characters shows at once.
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("id", str(job.id)), ("uid", job.uid or "-"), ("task", job.task), ("queue", job.queue),
        ("state", str(job.state)),
        ("attempts", f"{job.attempts}/{job.max_attempts}"), ("priority", str(job.priority)),
        ("args", shown_json(job.args, SHOWN_CHARS)), ("created", when(job.created_at)),
        ("run at", when(job.run_at)), ("last started", when(job.attempted_at)),
        ("finished", when(job.finished_at)), ("worker", job.worker_id or "-"),
        ("result", shown_json(job.result, SHOWN_CHARS) if job.result is not None else "-"),
        ("unique key", shown_text(job.unique_key, SHOWN_CHARS) if job.unique_key else "-"),
        ("timeout", f"{job.timeout:g}s"),
    ]
    # Workflows: only for a job that is part of one.
    if job.parents:
        rows.append(("parents", ", ".join(map(str, job.parents))))
        rows.append(("on parent failure", job.on_parent_failure))
    if job.batch_id is not None:
        rows.append(("batch", job.batch_id))
    if job.callback_of is not None:
        rows.append(("callback of", job.callback_of))
    for k, v in rows:
        table.add_row(k, escape(v))
    console.print(table)
    for err in job.errors:
        console.print(f"[bold]attempt {err.get('attempt')}[/bold] {when(err.get('at'))} "
                      f"[red]{escape(str(err.get('kind')))}[/red] "
                      f"{escape(str(err.get('type') or ''))}: "
                      f"{escape(shown_text(str(err.get('message')), SHOWN_CHARS))}")
        if err.get("traceback"):
            traceback = shown_text(str(err["traceback"]), SHOWN_CHARS).rstrip()
            console.print(escape(traceback), style="dim")


def jobs_table(jobs: list[Job], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("id", "task", "queue", "state", "attempts", "args", "last error", "finished"):
        table.add_column(col)
    for j in jobs:
        err = j.last_error
        if err:
            last_error = escape(shown_text(f"{err.get('kind')}: {err.get('message')}", 80,
                                           say_cut=False))
        else:
            last_error = "-"
        table.add_row(str(j.id), escape(j.task), j.queue, str(j.state),
                      f"{j.attempts}/{j.max_attempts}",
                      escape(shown_json(j.args, 60, say_cut=False)), last_error,
                      when(j.finished_at))
    return table


# -- batches -------------------------------------------------------------------------------
def show_batch(info: BatchInfo) -> None:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    done = f"{info.finished}/{info.total}" + (" (finished)" if info.is_finished else "")
    rows = [
        ("id", info.id), ("created", when(info.created_at)),
        ("inside batch", info.parent_id or "-"), ("total", str(info.total)),
        ("finished", done), ("waiting", str(info.waiting)), ("pending", str(info.pending)),
        ("succeeded", str(info.succeeded)), ("dead", str(info.dead)),
        ("cancelled", str(info.cancelled)),
        ("on success", str(info.on_success) if info.on_success is not None else "-"),
        ("on complete", str(info.on_complete) if info.on_complete is not None else "-"),
    ]
    for k, v in rows:
        table.add_row(k, escape(v))
    console.print(table)


def batch_dict(info: BatchInfo) -> dict[str, Any]:
    return asdict(info) | {"finished": info.finished, "is_finished": info.is_finished}
