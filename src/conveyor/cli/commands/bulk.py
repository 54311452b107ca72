"""``conveyor jobs bulk`` and ``conveyor dlq groups``: act on every job a filter selects, in
bounded batches; dead jobs grouped by cause."""

from __future__ import annotations

import datetime as dt
import json
import re

import click
from rich.table import Table

from ...bulk import BULK_BATCH, BulkAction, JobFilter, count
from ...job import JobState
from ..context import Ctx, console, pass_ctx, queue_filter, task_filter
from .dlq import dlq
from .jobs import jobs

_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
VERBS = {BulkAction.RETRY: "retry", BulkAction.RUN_NOW: "run now", BulkAction.CANCEL: "cancel",
         BulkAction.DELETE: "delete"}


def parse_time(value: str | None, now: float) -> float | None:
    """Unix seconds, an ISO 8601 time (UTC unless it says), or a span ago: 30m, 2h, 7d."""
    if value is None:
        return None
    text = value.strip()
    if m := _AGO.fullmatch(text):
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give unix seconds, an ISO time or a span such as "
                                 "30m, 2h, 7d") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


@jobs.command("bulk")
@click.argument("action", type=click.Choice([a.value for a in BulkAction]))
@click.option("--state", type=click.Choice([s.value for s in JobState]))
@click.option("--queue", callback=queue_filter, help="Only this queue.")
@click.option("--task", callback=task_filter, help="Only this task.")
@click.option("--error-group", "error_group", metavar="KEY",
              help="Only jobs whose last error is of this group (`conveyor dlq groups`).")
@click.option("--since", help="Only jobs created (or --finished: finished) at or after this.")
@click.option("--until", help="Only jobs created (or --finished: finished) before this.")
@click.option("--finished", "by_finished", is_flag=True,
              help="--since/--until bound finished_at instead of created_at.")
@click.option("--batch", default=BULK_BATCH, show_default=True, type=click.IntRange(1, 10_000),
              help="Jobs per batch (each batch is one call to the store).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_ctx
def jobs_bulk(obj: Ctx, action: str, state: str | None, queue: str | None, task: str | None,
              error_group: str | None, since: str | None, until: str | None, by_finished: bool,
              batch: int, yes: bool) -> None:
    """Apply ACTION to every job the filter selects: retry (dead jobs redriven, failed ones
    waiting for a retry due now), run_now (scheduled jobs due now), cancel (unfinished jobs),
    delete (finished jobs). Prints the count first and asks before acting."""
    backend = obj.app.backend
    now = backend.now()
    where = JobFilter(state=JobState(state) if state else None, queue=queue, task=task,
                      error_group=error_group, since=parse_time(since, now),
                      until=parse_time(until, now),
                      time_field="finished_at" if by_finished else "created_at")
    act = BulkAction(action)
    n, exact = count(backend, act, where)
    shown = f"{n:,}" if exact else f"at least {n:,}"
    click.echo(f"{shown} job(s) match: {VERBS[act]} them")
    if n == 0:
        return
    if not yes:
        click.confirm(f"{VERBS[act].capitalize()} {shown} job(s)?", abort=True)
    done, cursor = 0, None
    while True:
        result = backend.bulk(act, where, limit=batch, cursor=cursor)
        done += result.done
        cursor = result.cursor
        if result.done or not result.more:
            click.echo(f"  {done:,} done", err=True)
        if not result.more:
            break
    click.echo(f"{VERBS[act]}: {done:,} job(s) done")


@dlq.command("groups")
@click.option("--queue", callback=queue_filter, help="Only this queue.")
@click.option("--task", callback=task_filter, help="Only this task.")
@click.option("--retrying", is_flag=True,
              help="Failed jobs waiting for a retry instead of dead ones.")
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def dlq_groups(obj: Ctx, queue: str | None, task: str | None, retrying: bool, limit: int,
               as_json: bool) -> None:
    """Dead jobs grouped by cause (task, error type, message with ids and numbers taken out),
    most jobs first. Act on a group with `conveyor jobs bulk retry --error-group KEY`."""
    state = JobState.SCHEDULED if retrying else JobState.DEAD
    out = obj.app.backend.error_groups(state=state, queue=queue, task=task, limit=limit)
    if as_json:
        click.echo(json.dumps({"complete": out.complete, "scanned": out.scanned, "groups": [
            {"key": g.key, "task": g.task, "error_type": g.error_type, "message": g.message,
             "count": g.count, "first_seen": g.first_seen, "last_seen": g.last_seen,
             "sample_id": g.sample_id} for g in out.groups]}, indent=2))
        return
    table = Table(title=f"{'retrying' if retrying else 'dead'} jobs by cause")
    for name in ("key", "count", "task", "error", "first seen", "last seen", "sample"):
        table.add_column(name, justify="right" if name in ("count", "sample") else "left")
    for g in out.groups:
        table.add_row(g.key, f"{g.count:,}", g.task, f"{g.error_type}: {g.message}",
                      _when(g.first_seen), _when(g.last_seen), str(g.sample_id))
    console.print(table)
    if not out.complete:
        click.echo(f"counted over the newest {out.scanned:,} jobs only", err=True)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
