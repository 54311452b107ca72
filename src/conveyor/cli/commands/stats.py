"""``conveyor stats``: depth, age and counts per queue, live workers; once or refreshed."""

from __future__ import annotations

import contextlib
import json
import time

import click

from ..context import Ctx, console, pass_ctx
from ..display import stats_dict, stats_view
from ..history import RANGE_KEYS, history_dict, history_table


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", default=1.0, show_default=True)
@click.option("--history", "history", type=click.Choice(RANGE_KEYS), default=None,
              help="Instead: the store's history per queue over this range (what the workers "
                   "wrote: succeeded, failed, dead, latency).")
@pass_ctx
def stats(obj: Ctx, as_json: bool, watch: bool, interval: float, history: str | None) -> None:
    """Depth and oldest waiting age per queue, counts by state, live workers."""
    backend = obj.app.backend
    if history is not None:
        if as_json:
            click.echo(json.dumps(history_dict(backend, history), indent=2))
        else:
            console.print(history_table(backend, obj.app.url, history))
        return
    if as_json and not watch:
        click.echo(json.dumps(stats_dict(backend.stats()), indent=2))
        return
    if not watch:
        console.print(stats_view(backend.stats(), obj.app.url))
        return
    from rich.live import Live

    if as_json:
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                click.echo(json.dumps(stats_dict(backend.stats())))
                time.sleep(interval)
        return
    previous = backend.stats()
    live = Live(stats_view(previous, obj.app.url), console=console, auto_refresh=False)
    with live, contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(interval)
            current = backend.stats()
            live.update(stats_view(current, obj.app.url, previous), refresh=True)
            previous = current
