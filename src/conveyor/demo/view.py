"""The demo's live terminal view: queues, totals, the latest failures and what to try."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..backends.base import Stats
from ..job import Job, JobState
from . import CONCURRENCY, QUEUE_NAMES, QUEUES, app
from .store import call_text, recent_failures

if TYPE_CHECKING:
    from .run import DemoRun


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.1f}m"


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


class LiveView:
    """The screen of one run, redrawn a few times a second from the store and the run's state."""

    def __init__(self, run: DemoRun) -> None:
        self.run = run
        self.rates: deque[tuple[float, int]] = deque(maxlen=40)  # (time, jobs finished)
        self.last_dead_id: int | None = None

    def render(self, *, stopping: bool, done: bool = False) -> RenderableType:
        stats = app.backend.stats()
        recent = app.backend.list_jobs(limit=250).jobs
        top = [self._header(stopping=stopping, done=done), self._queue_table(stats),
               self._totals(stats)]
        footer = self._footer(stopping=stopping, done=done)
        # Give the failures panel whatever height is left, so the view fills the terminal but
        # never overflows it (Live would crop it).
        console = self.run.console
        used = len(console.render_lines(Group(*top, footer), console.options, pad=False))
        n_events = max(1, min(12, console.size.height - used - 3))
        return Group(*top, self._events_panel(recent, n_events), footer)

    def _header(self, *, stopping: bool, done: bool) -> RenderableType:
        run = self.run
        text = Text()
        text.append(" Conveyor demo ", style="bold white on blue")
        text.append(f"  up {run.elapsed():.1f}s · ", style="bold")
        if done:
            text.append(f"stopped: {run.stop_reason}", style="bold green")
        elif stopping:
            text.append("stopping: finishing the running jobs", style="bold yellow")
            if run.interrupts < 2:
                text.append(" (Ctrl-C again to hurry)", style="yellow")
        else:
            if run.duration is not None:
                left = max(0.0, run.duration - run.elapsed())
                text.append(f"stops by itself in {left:.0f}s · ", style="dim")
            text.append("Ctrl-C to stop", style="bold")
        weights = QUEUES.replace(",", " ")
        text.append(f"\n producer → SQLite store → worker ({CONCURRENCY} slots, weights {weights})",
                    style="dim")
        if run.dashboard is not None:
            text.append("\n dashboard ", style="bold")
            text.append(run.dashboard.url, style="bold cyan underline")
            text.append("  (open it in a browser)", style="dim")
        elif run.dashboard_note:
            text.append(f"\n {run.dashboard_note}", style="yellow")
        return text

    def _queue_table(self, stats: Stats) -> Table:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 2),
                      header_style="bold")
        table.add_column("queue")
        wide = self.run.console.width >= 90
        for col in ("waiting", "oldest wait" if wide else "oldest", "scheduled", "running",
                    "succeeded", "dead", "lease expiries" if wide else "lease exp"):
            table.add_column(col, justify="right")
        by_name = {q.queue: q for q in stats.queues}
        names = list(QUEUE_NAMES) + sorted(set(by_name) - set(QUEUE_NAMES))
        for name in names:
            q = by_name.get(name)
            if q is None:
                table.add_row(f"[bold]{name}[/bold]", "0", "-", "0", "0", "0", "0", "0")
                continue
            oldest = q.oldest_available_age
            oldest_text = _age(oldest)
            if oldest is not None and oldest > 5:
                oldest_text = f"[yellow]{oldest_text}[/yellow]"
            table.add_row(
                f"[bold]{name}[/bold]", f"[bold]{q.depth}[/bold]" if q.depth else "0", oldest_text,
                str(q.scheduled), f"[cyan]{q.running}[/cyan]" if q.running else "0",
                f"[green]{q.succeeded}[/green]", f"[red]{q.dead}[/red]" if q.dead else "0",
                f"[magenta]{q.lease_expiries}[/magenta]" if q.lease_expiries else "0",
            )
        return table

    def _totals(self, stats: Stats) -> RenderableType:
        succeeded = sum(q.succeeded for q in stats.queues)
        dead = sum(q.dead for q in stats.queues)
        now = time.monotonic()
        self.rates.append((now, succeeded + dead))
        while len(self.rates) > 2 and now - self.rates[0][0] > 5:
            self.rates.popleft()
        t0, n0 = self.rates[0]
        rate = (succeeded + dead - n0) / (now - t0) if now - t0 > 0.5 else 0.0
        retried = self.run.worker.counters.retried if self.run.worker else 0
        text = Text.from_markup(
            f" enqueued [bold]{self.run.producer.enqueued}[/bold] · "
            f"succeeded [green]{succeeded}[/green] · retries [yellow]{retried}[/yellow] · "
            f"dead [red]{dead}[/red] · [bold]{rate:.1f}[/bold] jobs/s"
        )
        if stats.workers:
            w = stats.workers[0]
            heartbeat = _age(max(0.0, stats.now - w.last_seen))
            text.append(f"\n worker {w.id} · last heartbeat {heartbeat} ago", style="dim")
        else:
            state = "stopped" if self.run.worker_done else "starting"
            text.append(f"\n worker {state}", style="dim")
        return text

    def _events_panel(self, recent: Sequence[Job], n: int) -> Panel:
        events = recent_failures(recent, n)
        grid = Table.grid(padding=(0, 1), expand=True)
        grid.add_column(no_wrap=True, style="dim")
        grid.add_column(no_wrap=True, width=7)
        grid.add_column(no_wrap=True, justify="right")
        grid.add_column(no_wrap=True, max_width=30, overflow="ellipsis")
        grid.add_column(no_wrap=True, justify="right")
        grid.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
        for e in events:
            if e.dead:
                tag = "[bold red]dead[/bold red]"
            elif e.kind == "timeout":
                tag = "[magenta]timeout[/magenta]"
            elif e.kind == "lease_expired":
                tag = "[magenta]expired[/magenta]"
            else:
                tag = "[yellow]retry[/yellow]"
            grid.add_row(_clock(e.at), tag, f"#{e.job.id}", escape(call_text(e.job)),
                         f"{e.attempt}/{e.job.max_attempts}", escape(e.message))
        dead = [j.id for j in recent if j.state is JobState.DEAD]
        if dead:
            self.last_dead_id = max(dead)
        if not events:
            grid.add_row("", "", "", "[dim]no failures yet[/dim]", "", "")
        for _ in range(n - max(len(events), 1)):
            grid.add_row("", "", "", "", "", "")
        title = ("[bold]latest failures[/bold] "
                 "[dim](retry: runs again · dead: in the dead-letter queue)[/dim]")
        return Panel(grid, title=title, title_align="left", border_style="dim", padding=(0, 1))

    def _footer(self, *, stopping: bool, done: bool) -> RenderableType:
        text = Text()
        text.append(" store ", style="bold")
        text.append(str(self.run.db))
        if self.run.removed_old:
            text.append(" (started fresh; --keep keeps old jobs)", style="dim")
        where = ":" if self.run.export_line else " (from this directory):"
        text.append(f"\n Try in another terminal{where}\n", style="bold")
        lines = [self.run.export_line] if self.run.export_line else []
        job_id = self.last_dead_id
        cmd = self.run.cmd
        lines += [f"{cmd} stats", f"{cmd} dlq list", f"{cmd} dlq redrive --all",
                  f"{cmd} jobs show {job_id if job_id else 'ID'}"]
        text.append("\n".join(f"   {line}" for line in lines), style="cyan")
        return text
