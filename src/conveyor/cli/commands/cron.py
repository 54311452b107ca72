"""``conveyor cron``: the app's cron schedules, with their last tick taken and next run."""

from __future__ import annotations

import json
import os
import time

import click
from rich.table import Table

from ...backends import sqlite_path
from ..context import Ctx, console, pass_ctx


@click.group()
def cron() -> None:
    """Cron schedules of the app."""


@cron.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def cron_list(obj: Ctx, as_json: bool) -> None:
    """Every schedule with its last tick taken and its next run."""
    app = obj.require_tasks("cron list")
    path = sqlite_path(app.url)
    if path is not None and not os.path.exists(path):
        # No store yet: nothing taken, and no empty file made to say so.
        now, taken = time.time(), {}
    else:
        now, taken = app.backend.now(), app.backend.cron_ticks()
    rows = []
    for name, s in sorted(app.schedules.items()):
        last = taken.get(name)
        rows.append({
            "name": name, "expression": s.expression, "timezone": s.timezone, "task": s.task,
            "queue": s.queue,
            "last_tick": s.tick_datetime(last).isoformat() if last is not None else None,
            "next_run": s.tick_datetime(s.next_tick(now)).isoformat(),
        })
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo("no cron schedules: add them with @app.cron(\"*/5 * * * *\") "
                   "or app.schedule(task, ...)")
        return
    table = Table()
    for col in ("schedule", "cron", "timezone", "task", "queue", "last tick", "next run"):
        table.add_column(col, overflow="fold")  # wrap, never cut: these are names and times to copy
    for r in rows:
        table.add_row(r["name"], r["expression"], r["timezone"], r["task"], r["queue"],
                      r["last_tick"] or "-", r["next_run"])
    console.print(table)
