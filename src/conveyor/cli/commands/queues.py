"""``conveyor queue``: pause and resume a queue, and list the queues with their depth, oldest
waiting job and pause. The pause is kept in the store, so every worker honours it at once."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from ...backends import redact_url
from ...backends.base import QueueStats
from ..context import Ctx, console, pass_ctx, queue_filter
from ..display import age, when


@click.group("queue")
def queue() -> None:
    """Pause, resume and list queues."""


def _name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    checked = queue_filter(ctx, param, value)
    assert checked is not None
    return checked


@queue.command("pause")
@click.argument("name", callback=_name)
@pass_ctx
def queue_pause(obj: Ctx, name: str) -> None:
    """Stop every worker taking jobs of queue NAME. Jobs already running finish (a drain);
    enqueues still succeed and wait until `conveyor queue resume NAME`."""
    backend = obj.app.backend
    if backend.pause_queue(name):
        click.echo(f"paused queue {name}: no worker takes its jobs; running ones finish")
    else:
        since = backend.paused_queues().get(name)
        click.echo(f"queue {name} was paused already (since {when(since)})")


@queue.command("resume")
@click.argument("name", callback=_name)
@pass_ctx
def queue_resume(obj: Ctx, name: str) -> None:
    """Let workers take jobs of queue NAME again (idle workers are woken at once)."""
    if obj.app.backend.resume_queue(name):
        click.echo(f"resumed queue {name}")
    else:
        click.echo(f"queue {name} was not paused")


def _queue_dict(q: QueueStats) -> dict[str, Any]:
    return {"queue": q.queue, "depth": q.depth, "oldest_waiting_s": q.oldest_available_age,
            "scheduled": q.scheduled, "running": q.running, "dead": q.dead,
            "paused": q.paused, "paused_since": q.paused_since}


@queue.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def queue_list(obj: Ctx, as_json: bool) -> None:
    """Every queue with jobs waiting, running or dead, or paused: its depth, its oldest waiting
    job's age, and since when it is paused."""
    stats = obj.app.backend.stats(finished=False)
    if as_json:
        click.echo(json.dumps([_queue_dict(q) for q in stats.queues], indent=2))
        return
    table = Table(title=f"queues on {redact_url(obj.app.url)}", title_justify="left")
    for column in ("queue", "depth", "oldest waiting", "scheduled", "running", "dead",
                   "paused since"):
        table.add_column(column, justify="left" if column in ("queue", "paused since")
                         else "right")
    for q in stats.queues:
        table.add_row(q.queue, str(q.depth), age(q.oldest_available_age), str(q.scheduled),
                      str(q.running), str(q.dead),
                      f"[yellow]{when(q.paused_since)}[/]" if q.paused else "-")
    if not stats.queues:
        # stats(finished=False) keeps the listing cheap: a queue holding only finished jobs is
        # idle and not listed (conveyor stats shows those counts).
        click.echo("no queue has jobs waiting, running or dead, and none is paused")
        return
    console.print(table)
