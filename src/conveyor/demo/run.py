"""One demo run: the worker and producer threads, signals, the plain output for a pipe or
CI, and the summary at the end. The live terminal view is in view.py."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import sys
import threading
import time
import types
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape

from ..worker import Worker
from . import CONCURRENCY, DEFAULT_DB, QUEUE_NAMES, QUEUES, app, sqlite_url, use_database
from .producer import Producer
from .store import prepare_store, summarize
from .view import LiveView


def cli_prefix() -> str:
    """How the user can run ``conveyor`` from another terminal."""
    here = Path(sys.executable).parent / "conveyor"
    found = shutil.which("conveyor")
    if found and here.exists() and Path(found).resolve() == here.resolve():
        return "conveyor"
    if here.exists():
        try:
            rel = os.path.relpath(here)
        except ValueError:
            rel = str(here)
        return shlex.quote(rel if not rel.startswith("..") else str(here))
    if found:
        return "conveyor"
    return f"{shlex.quote(sys.executable)} -m conveyor"


class _KeepErrors(logging.Handler):
    """While the live view owns the screen, worker logs would scribble over it. Expected job
    outcomes (retries, dead jobs) are shown in the view already; unexpected errors (those with
    a traceback) are kept and printed after the view closes."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: deque[logging.LogRecord] = deque(maxlen=20)

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


@contextlib.contextmanager
def _quiet_conveyor_logs() -> Iterator[_KeepErrors]:
    logger = logging.getLogger("conveyor")
    handler = _KeepErrors()
    saved = logger.propagate
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved


class DemoRun:
    def __init__(self, db: Path, *, duration: float | None, live: bool, fresh: bool,
                 console: Console, dashboard_port: int | None = None) -> None:
        self.db = db.resolve() if db.exists() else Path(os.path.abspath(db))
        self.duration = duration
        self.live = live
        self.fresh = fresh
        self.console = console
        self.interrupts = 0
        self.stop_reason = ""
        self.removed_old = False
        self.started = time.monotonic()
        self.producer_stop = threading.Event()
        self.producer = Producer(self.producer_stop)
        self.worker: Worker | None = None
        self.worker_error: BaseException | None = None
        self.worker_done = False
        env_url = os.environ.get("CONVEYOR_URL")
        is_default = self.db == Path(os.path.abspath(DEFAULT_DB))
        self.export_line: str | None = None
        if not is_default or env_url:
            self.export_line = f"export CONVEYOR_URL={shlex.quote(sqlite_url(self.db))}"
        self.cmd = f"{cli_prefix()} --app conveyor.demo:app"
        self.dashboard_port = dashboard_port
        self.dashboard: Any = None  # a conveyor.dashboard.RunningDashboard once started
        self.dashboard_note = ""

    # -- lifecycle ----------------------------------------------------------------------
    def run(self) -> int:
        self.removed_old = prepare_store(self.db, fresh=self.fresh)
        self.db.parent.mkdir(parents=True, exist_ok=True)
        use_database(self.db)
        app.backend  # noqa: B018 - open and migrate now, so a bad path fails before anything starts
        self.worker = Worker(app, queues=QUEUES, concurrency=CONCURRENCY,
                             install_signal_handlers=False, grace_period=5.0, poll_interval=0.5)
        self._start_dashboard()
        self.started = time.monotonic()
        self.producer.burst()
        worker_thread = threading.Thread(target=self._run_worker, name="conveyor-demo-worker",
                                         daemon=True)
        producer_thread = threading.Thread(target=self.producer.run,
                                           name="conveyor-demo-producer", daemon=True)
        quiet = _quiet_conveyor_logs() if self.live else contextlib.nullcontext(None)
        with self._signals(), quiet as kept:
            worker_thread.start()
            producer_thread.start()
            if self.live:
                self._live_loop(worker_thread, producer_thread)
            else:
                self._plain_loop(worker_thread, producer_thread)
        for record in kept.records if kept is not None else ():
            self.console.print(f"[red]worker error:[/red] {escape(record.getMessage())}")
            if record.exc_info:
                trace = logging.Formatter().formatException(record.exc_info)
                self.console.print(escape(trace), style="dim")
        self._print_summary()
        if self.dashboard is not None:
            self.dashboard.stop()
        app.close()
        return 1 if self.worker_error is not None else 0

    def _start_dashboard(self) -> None:
        """The web dashboard on this store, on a thread (port taken: any free port)."""
        if self.dashboard_port is None:
            return
        try:
            from ..dashboard import start_in_thread

            self.dashboard = start_in_thread(app, port=self.dashboard_port,
                                             fallback_to_any_port=True, sample_interval=2.0,
                                             title="Conveyor demo")
        except Exception as exc:  # the demo works without it: say why, go on
            self.dashboard_note = f"dashboard not started: {exc}"
            return
        if self.live and _has_display():
            import webbrowser

            with contextlib.suppress(Exception):
                webbrowser.open(self.dashboard.url)

    def _run_worker(self) -> None:
        assert self.worker is not None
        try:
            self.worker.run()
        except BaseException as exc:
            self.worker_error = exc
            logging.getLogger("conveyor.demo").error("the worker stopped with an error: %r", exc)
        finally:
            self.worker_done = True

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: types.FrameType | None) -> None:
            self.interrupts += 1
            if not self.stop_reason:
                ctrl_c = signum == signal.SIGINT
                self.stop_reason = "stopped by Ctrl-C" if ctrl_c else "stopped by SIGTERM"
            if self.interrupts >= 2 and self.worker is not None:
                self.worker.stop(graceful=False)  # hurry: release the running jobs now

        saved = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)

    def _should_stop(self, worker_thread: threading.Thread) -> bool:
        if self.stop_reason:
            return True
        if not worker_thread.is_alive():
            self.stop_reason = "the worker stopped unexpectedly"
            return True
        if self.duration is not None and self.elapsed() >= self.duration:
            self.stop_reason = f"time limit of {self.duration:g}s reached"
            return True
        return False

    def _begin_stop(self, producer_thread: threading.Thread) -> None:
        self.producer_stop.set()
        producer_thread.join()
        assert self.worker is not None
        self.worker.stop()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # -- live view ------------------------------------------------------------------------
    def _live_loop(self, worker_thread: threading.Thread,
                   producer_thread: threading.Thread) -> None:
        view = LiveView(self)
        with Live(view.render(stopping=False), console=self.console, auto_refresh=False,
                  redirect_stdout=False, redirect_stderr=False) as live:
            stopping = False
            while worker_thread.is_alive():
                if not stopping and self._should_stop(worker_thread):
                    stopping = True
                    live.update(view.render(stopping=True), refresh=True)
                    self._begin_stop(producer_thread)
                time.sleep(0.25)
                live.update(view.render(stopping=stopping), refresh=True)
            worker_thread.join()
            if not stopping:
                self._should_stop(worker_thread)
                self.producer_stop.set()
                producer_thread.join()
            live.update(view.render(stopping=False, done=True), refresh=True)

    # -- plain output (no TTY, CI) ------------------------------------------------------------
    def _plain_loop(self, worker_thread: threading.Thread,
                    producer_thread: threading.Thread) -> None:
        say = self._say
        fresh = " (started fresh: the previous demo store was deleted)" if self.removed_old else ""
        if self.duration is not None:
            until = f"Stops after {self.duration:g}s."
        else:
            until = "Ctrl-C to stop."
        say(f"Conveyor demo: store {self.db}{fresh}")
        if self.dashboard is not None:
            say(f"Dashboard: {self.dashboard.url}")
        elif self.dashboard_note:
            say(self.dashboard_note)
        say(f"A producer enqueues jobs, a worker runs them ({CONCURRENCY} at a time, "
            f"queues {QUEUES}). {until}")
        if self.export_line:
            say(f"In another terminal: {self.export_line}")
        say(f"Try in another terminal: {self.cmd} stats | dlq list | dlq redrive --all "
            "| jobs show ID")
        next_line = time.monotonic() + 1.0
        stopping = False
        while worker_thread.is_alive():
            if not stopping and self._should_stop(worker_thread):
                stopping = True
                say(f"[{self.elapsed():6.1f}s] stopping ({self.stop_reason}): "
                    "no new jobs, finishing the running ones")
                self._begin_stop(producer_thread)
            if time.monotonic() >= next_line:
                next_line += 1.0
                say(self._status_line())
            time.sleep(0.1)
        worker_thread.join()
        if not stopping:
            self._should_stop(worker_thread)
            self.producer_stop.set()
            producer_thread.join()

    def _say(self, line: str) -> None:
        """A plain line: no markup, no wrapping (log collectors and CI keep lines whole)."""
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _print(self, markup: str = "") -> None:
        self.console.print(markup, highlight=False, soft_wrap=not self.live)

    def _status_line(self) -> str:
        stats = app.backend.stats()
        succeeded = sum(q.succeeded for q in stats.queues)
        dead = sum(q.dead for q in stats.queues)
        retried = self.worker.counters.retried if self.worker else 0
        by_name = {q.queue: q for q in stats.queues}
        queues = " ".join(
            f"{name}={by_name[name].depth}/{by_name[name].running}" if name in by_name
            else f"{name}=0/0"
            for name in QUEUE_NAMES
        )
        return (f"[{self.elapsed():6.1f}s] enqueued {self.producer.enqueued}, "
                f"succeeded {succeeded}, retries {retried}, dead {dead}; waiting/running {queues}")

    # -- the end --------------------------------------------------------------------------
    def _print_summary(self) -> None:
        s = summarize(app)
        out = self._print
        waiting = s.by_state["available"] + s.by_state["scheduled"] + s.by_state["running"]
        out()
        out(f"[bold]Demo finished after {self.elapsed():.1f}s[/bold] "
            f"({self.stop_reason or 'stopped'}).")
        if self.worker_error is not None:
            out(f"[red]The worker stopped with an error:[/red] {escape(repr(self.worker_error))}")
        dead_note = ", ".join(f"{n} {t}" for t, n in s.dead_by_task.most_common())
        rows = [
            (s.total, "jobs enqueued" if self.fresh else "jobs in the store", ""),
            (s.by_state["succeeded"], "succeeded",
             f"{s.succeeded_after_retry} of them after one or more retries"),
            (s.failed_attempts, "failed attempts",
             "each kept on its job with the error and traceback"),
            (s.by_state["dead"], "dead",
             f"in the dead-letter queue: {dead_note}" if dead_note else ""),
        ]
        if waiting:
            rows.append((waiting, "not finished", "still in the store; a worker will pick them up"))
        width = len(str(max(n for n, _, _ in rows)))
        for n, label, note in rows:
            out(f"  [bold]{n:>{width}}[/bold] {label}"
                + (f"  [dim]({escape(note)})[/dim]" if note else ""))
        out(f"Store: {escape(str(self.db))}  "
            "[dim](the next demo starts over; --keep continues)[/dim]")
        if self.export_line:
            out(f"  [cyan]{escape(self.export_line)}[/cyan]")
        example = s.dead_ids[0] if s.dead_ids else "ID"
        out("Look at the dead jobs, send them back to their queues, and run them:")
        for line in (f"{self.cmd} dlq list", f"{self.cmd} jobs show {example}",
                     f"{self.cmd} dlq redrive --all", f"{self.cmd} worker"):
            out(f"  [cyan]{escape(line)}[/cyan]")


def _has_display() -> bool:
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))

