"""``conveyor cron``: the app's cron schedules (last tick, last run, next run), and their
controls, kept in the store: disable, enable, run now."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from typing import Any

import click
from rich.table import Table

from ...app import Conveyor
from ...backends import sqlite_path
from ...backends.base import CronState
from ...cron import Schedule, run_now
from ..context import Ctx, console, pass_ctx


@click.group()
def cron() -> None:
    """Cron schedules of the app."""


def _last_run(app: Conveyor, state: CronState | None) -> dict[str, Any] | None:
    """The job of the schedule's latest tick: its id, state, when it finished, its last error.
    ``state`` None: the job is no longer in the store (pruned or purged)."""
    if state is None or state.last_job_id is None:
        return None
    job = app.backend.get(state.last_job_id)
    if job is None:
        return {"job_id": state.last_job_id, "state": None, "finished_at": None, "error": None}
    error = job.last_error
    return {
        "job_id": job.id, "state": str(job.state),
        "finished_at": (dt.datetime.fromtimestamp(job.finished_at, dt.UTC).isoformat()
                        if job.finished_at is not None else None),
        "error": f"{error.get('type') or 'Error'}: {error.get('message', '')}" if error else None,
    }


@cron.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def cron_list(obj: Ctx, as_json: bool) -> None:
    """Every schedule: enabled or not, its last tick, its last run's outcome, its next run."""
    app = obj.require_tasks("cron list")
    path = sqlite_path(app.url)
    states: dict[str, CronState]
    if path is not None and not os.path.exists(path):
        # No store yet: nothing taken, and no empty file made to say so.
        now, states = time.time(), {}
    else:
        now, states = app.backend.now(), app.backend.cron_states()
    rows: list[dict[str, Any]] = []
    for name, s in sorted(app.schedules.items()):
        state = states.get(name)
        last = state.last_tick if state is not None else None
        disabled_at = state.disabled_at if state is not None else None
        rows.append({
            "name": name, "expression": s.expression, "timezone": s.timezone, "task": s.task,
            "queue": s.queue, "enabled": disabled_at is None,
            "disabled_at": s.tick_datetime(disabled_at).isoformat() if disabled_at else None,
            "last_tick": s.tick_datetime(last).isoformat() if last is not None else None,
            "last_run": _last_run(app, state),
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
    for col in ("schedule", "status", "cron", "timezone", "task", "queue", "last tick",
                "last run", "next run"):
        table.add_column(col, overflow="fold")  # wrap, never cut: these are names and times to copy
    for r in rows:
        run = r["last_run"]
        if run is None:
            outcome = "-"
        else:
            outcome = f"#{run['job_id']} {run['state'] or 'no longer stored'}"
            if run["error"] and run["state"] != "succeeded":
                outcome += f" ({run['error']})"
        table.add_row(r["name"], "enabled" if r["enabled"] else "disabled", r["expression"],
                      r["timezone"], r["task"], r["queue"], r["last_tick"] or "-", outcome,
                      r["next_run"] if r["enabled"] else f"{r['next_run']} (skipped)")
    console.print(table)


def _schedule(app: Conveyor, name: str) -> Schedule:
    schedule = app.schedules.get(name)
    if schedule is None:
        raise click.ClickException(
            f"no cron schedule named {name!r} is registered on this app (see: conveyor cron list)")
    return schedule


@cron.command("disable")
@click.argument("name")
@pass_ctx
def cron_disable(obj: Ctx, name: str) -> None:
    """Stop NAME's ticks from enqueuing, in every scheduler (stored; `cron enable` undoes it)."""
    app = obj.require_tasks("cron disable")
    _schedule(app, name)
    if app.backend.set_cron_enabled(name, False):
        click.echo(f"{name} is disabled: its ticks enqueue nothing until `conveyor cron enable "
                   f"{name}`")
    else:
        click.echo(f"{name} was already disabled")


@cron.command("enable")
@click.argument("name")
@pass_ctx
def cron_enable(obj: Ctx, name: str) -> None:
    """Let NAME's ticks enqueue again, from its next tick (the ticks it missed never run)."""
    app = obj.require_tasks("cron enable")
    schedule = _schedule(app, name)
    if app.backend.set_cron_enabled(name, True):
        after = schedule.tick_datetime(schedule.next_tick(app.backend.now())).isoformat()
        click.echo(f"{name} is enabled: its next run is {after}")
    else:
        click.echo(f"{name} was already enabled")


@cron.command("run")
@click.argument("name")
@pass_ctx
def cron_run(obj: Ctx, name: str) -> None:
    """Enqueue NAME's job now, outside its ticks (the schedule does not move)."""
    app = obj.require_tasks("cron run")
    _schedule(app, name)
    made = run_now(app, name)
    click.echo(f"enqueued job {made.id} ({name}, run by hand) on queue {app.schedules[name].queue}")
