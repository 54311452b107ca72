"""``conveyor demo``: the command; the demo itself is conveyor.demo."""

from __future__ import annotations

import os
import sys

import click
from rich.console import Console


@click.command()
@click.option("--db", "db_path", default="conveyor-demo.db", show_default=True, metavar="PATH",
              type=click.Path(dir_okay=False), help="The demo's SQLite file.")
@click.option("--fresh/--keep", default=True, show_default=True,
              help="Delete the demo's SQLite file first (only if it holds nothing but demo jobs), "
                   "or keep it.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="Stop by itself after this long (default: run until Ctrl-C).")
@click.option("--live/--no-live", default=None,
              help="Live terminal view, or plain log lines (default: live when stdout is a "
                   "terminal).")
@click.option("--dashboard/--no-dashboard", default=True, show_default=True,
              help="Serve the web dashboard on 127.0.0.1 while the demo runs.")
@click.option("--dashboard-port", default=8000, show_default=True,
              type=click.IntRange(min=0, max=65535),
              help="The dashboard's port (taken: any free port).")
def demo(db_path: str, fresh: bool, duration: float | None, live: bool | None, dashboard: bool,
         dashboard_port: int) -> None:
    """See Conveyor work: a producer and a worker on an embedded SQLite file, live.

    Always uses its own SQLite file (--db), never --url or $CONVEYOR_URL. The tasks are in
    conveyor.demo, so `conveyor --app conveyor.demo:app stats` works from another terminal.
    """
    from ...demo import run_demo

    # Its own console: the live view fills the terminal, and piped lines are short anyway.
    code = run_demo(db_path, duration=duration, live=live, fresh=fresh,
                    console=Console(highlight=False),
                    dashboard_port=dashboard_port if dashboard else None)
    sys.stdout.flush()
    sys.stderr.flush()
    # A demo task past its timeout may still be sleeping in its thread; don't wait for it.
    os._exit(code)
