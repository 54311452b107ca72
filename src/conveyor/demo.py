"""``conveyor demo``: Conveyor at work on an embedded SQLite file, in one process.

A producer thread enqueues a mix of jobs that look like real work (emails, image
resizes, card charges, inventory syncs, reports, feeds, partner webhooks), a worker
thread runs them, and the terminal shows the queues and the latest failures live.
Some jobs fail on purpose: card charges hit a flaky gateway and succeed on retry,
reports sometimes overrun their timeout, bad SKUs are rejected, and one partner's
webhook is always down, so the dead-letter queue fills up too.

The tasks live on the module-level ``app`` below, so another terminal can look at the
same store while the demo runs::

    conveyor --app conveyor.demo:app stats
    conveyor --app conveyor.demo:app dlq list
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import shlex
import shutil
import signal
import sqlite3
import sys
import threading
import time
import types
import urllib.parse
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .app import Conveyor
from .backends.base import Stats
from .errors import ConfigurationError, Reject
from .executor import current_job
from .job import Job, JobState
from .retry import RetryPolicy
from .worker import Worker

app = Conveyor(os.environ.get("CONVEYOR_URL") or "sqlite:///conveyor-demo.db", visibility_timeout=10)

DEFAULT_DB = "conveyor-demo.db"
QUEUES = "high:6,default:3,low:1"
QUEUE_NAMES = ("high", "default", "low")
CONCURRENCY = 8
TASK_PREFIX = f"{__name__}."

# Small backoff so retries show up within a second instead of after minutes.
FAST_RETRY = RetryPolicy(base=0.2, factor=2.0, cap=2.0)


# -- the demo's tasks -----------------------------------------------------------------------
class PaymentGatewayTimeout(Exception):
    """The card network did not answer in time: a transient error, worth retrying."""


def _attempt() -> int:
    ctx = current_job()
    return ctx.attempt if ctx is not None else 1


def _chance(key: str, rate: float) -> bool:
    """A coin toss that always lands the same way for the same key (so test runs repeat)."""
    return random.Random(key).random() < rate


@app.task(queue="high", max_attempts=5, timeout=10, retry=FAST_RETRY)
def send_welcome_email(user_id: int) -> dict[str, Any]:
    """Render and send the welcome email of one user."""
    time.sleep(random.uniform(0.02, 0.2))
    return {"user_id": user_id, "message_id": f"<welcome-{user_id}@mail.example.com>"}


@app.task(queue="default", max_attempts=5, timeout=10, retry=FAST_RETRY)
def resize_image(image_id: int, width: int) -> dict[str, Any]:
    """Make one thumbnail of an uploaded image."""
    time.sleep(random.uniform(0.05, 0.25) * (1 + width / 1280))
    return {"image_id": image_id, "width": width, "url": f"https://cdn.example.com/i/{image_id}_{width}w.webp"}


@app.task(queue="high", max_attempts=5, timeout=10, retry=FAST_RETRY)
def charge_card(order_id: int) -> dict[str, Any]:
    """Charge the card of one order. The gateway times out on ~30% of first tries."""
    attempt = _attempt()
    time.sleep(random.uniform(0.05, 0.15))
    if _chance(f"charge:{order_id}:{attempt}", 0.3 if attempt == 1 else 0.1):
        raise PaymentGatewayTimeout(f"card network did not answer within 5s (order {order_id})")
    return {"order_id": order_id, "charge_id": f"ch_{order_id:06d}{attempt}", "attempt": attempt}


SKU_PATTERN = re.compile(r"SKU-\d{5}")


@app.task(queue="default", max_attempts=5, timeout=10, retry=FAST_RETRY)
def sync_inventory(sku: str) -> dict[str, Any]:
    """Pull the stock level of one SKU from the warehouse. A malformed SKU can never succeed."""
    time.sleep(random.uniform(0.02, 0.1))
    if not SKU_PATTERN.fullmatch(sku):
        raise Reject(f"unknown SKU {sku!r}: not in the catalog, retrying cannot help")
    return {"sku": sku, "in_stock": random.Random(sku).randint(0, 400)}


@app.task(queue="default", max_attempts=3, timeout=5, retry=FAST_RETRY)
def call_partner_webhook(partner_id: int) -> None:
    """Notify a partner's endpoint. This partner's server is down for the whole demo."""
    time.sleep(random.uniform(0.05, 0.1))
    raise ConnectionRefusedError(f"partner-{partner_id}.example.com:443 refused the connection")


@app.task(queue="low", max_attempts=3, timeout=1, retry=FAST_RETRY)
def build_report(report_id: int) -> dict[str, Any]:
    """Build a sales report. Usually 0.3-0.8 s; sometimes 2 s, past its 1 s timeout."""
    attempt = _attempt()
    slow = _chance(f"report:{report_id}:{attempt}", 0.35 if attempt == 1 else 0.1)
    time.sleep(2.0 if slow else random.uniform(0.3, 0.8))
    return {"report_id": report_id, "rows": random.Random(report_id).randint(100, 5000)}


@app.task(queue="low", max_attempts=5, timeout=5, retry=FAST_RETRY)
async def refresh_feed(user_id: int) -> dict[str, Any]:
    """Rebuild one user's feed; async, so it runs on the worker's event loop, not a thread."""
    await asyncio.sleep(random.uniform(0.05, 0.3))
    return {"user_id": user_id, "items": random.Random(user_id).randint(5, 50)}


@app.cron("* * * * *", name="minutely-digest", queue="low")
def send_digest() -> dict[str, Any]:
    """A cron job: every minute, one digest however many workers run the scheduler."""
    ctx = current_job()
    tick = ctx.cron_tick.isoformat() if ctx is not None and ctx.cron_tick is not None else None
    return {"tick": tick, "sent": random.randint(10, 40)}


def use_database(path: str | os.PathLike[str]) -> str:
    """Point the demo app at the SQLite file ``path``; returns the store URL."""
    url = sqlite_url(path)
    app.close()
    app.url = url
    return url


def sqlite_url(path: str | os.PathLike[str]) -> str:
    return f"sqlite:///{os.path.abspath(path)}"


# -- the producer -----------------------------------------------------------------------------
GOOD_SKUS = [f"SKU-{n:05d}" for n in (10234, 10871, 20417, 31337, 40960, 52001, 60666, 77810)]
BAD_SKUS = ["SKU-1O234", "SKU-", "sku 40960", "SKU-999999"]  # typos, as they happen in real feeds


class Producer:
    """Enqueues a burst of ~60 jobs, then a few per second until stopped."""

    def __init__(self, stop: threading.Event, rng: random.Random | None = None) -> None:
        self.stop = stop
        self.rng = rng or random.Random()
        self.enqueued = 0
        self.errors = 0
        self._ids: Counter[str] = Counter()
        self._mix: list[tuple[int, Callable[[], None]]] = [
            (25, self._email), (18, self._resize), (16, self._charge), (12, self._inventory),
            (14, self._feed), (8, self._report), (2, self._webhook), (3, self._bad_sku),
        ]

    def _next(self, kind: str, base: int) -> int:
        self._ids[kind] += 1
        return base + self._ids[kind]

    def burst(self) -> None:
        """The start: 60 jobs, mostly in batches (one store transaction per ``enqueue_many``)."""
        jobs = send_welcome_email.enqueue_many([(self._next("user", 1000),) for _ in range(12)])
        for _ in range(3):  # drip emails: scheduled a few seconds ahead
            send_welcome_email.options(delay=self.rng.uniform(2.0, 6.0)).enqueue(self._next("user", 1000))
        images = [self._next("image", 5000) for _ in range(5)]
        jobs += resize_image.enqueue_many([(i, w) for i in images for w in (320, 1280)])
        jobs += charge_card.enqueue_many([(self._next("order", 7000),) for _ in range(8)])
        for _ in range(2):  # express checkout jumps the line: lower priority runs first
            charge_card.options(priority=-10).enqueue(self._next("order", 7000))
        jobs += sync_inventory.enqueue_many([(sku,) for sku in GOOD_SKUS[:6]] + [(BAD_SKUS[0],), (BAD_SKUS[1],)])
        jobs += refresh_feed.enqueue_many([(self._next("user", 1000),) for _ in range(8)])
        jobs += build_report.enqueue_many([(self._next("report", 300),) for _ in range(6)])
        jobs += call_partner_webhook.enqueue_many([(17,), (42,)])
        self.enqueued += len(jobs) + 5

    def run(self) -> None:
        next_wave = time.monotonic() + self.rng.uniform(6.0, 10.0)
        while not self.stop.wait(self.rng.uniform(0.15, 0.45)):
            if time.monotonic() >= next_wave:
                next_wave = time.monotonic() + self.rng.uniform(10.0, 16.0)
                try:
                    self.enqueued += self.wave()
                except Exception:
                    self.errors += 1
                    logging.getLogger("conveyor.demo").exception("producer: enqueue failed")
            for _ in range(self.rng.choice((1, 1, 2))):
                step = self.rng.choices([f for _, f in self._mix], [w for w, _ in self._mix])[0]
                try:
                    step()
                    self.enqueued += 1
                except Exception:
                    self.errors += 1
                    logging.getLogger("conveyor.demo").exception("producer: enqueue failed")

    def wave(self) -> int:
        """Now and then a batch arrives at once, so queues build up a backlog and drain it."""
        kind = self.rng.choice(("signups", "catalog", "reports"))
        if kind == "signups":  # a marketing email went out: many new users at once
            jobs = send_welcome_email.enqueue_many([(self._next("user", 1000),) for _ in range(40)])
        elif kind == "catalog":  # a seller uploaded a catalog: every image in three widths
            images = [self._next("image", 5000) for _ in range(15)]
            jobs = resize_image.enqueue_many([(i, w) for i in images for w in (320, 640, 1280)])
        else:  # end of day: the low-priority queue gets a pile of reports
            jobs = build_report.enqueue_many([(self._next("report", 300),) for _ in range(12)])
        return len(jobs)

    def _email(self) -> None:
        user = self._next("user", 1000)
        if self.rng.random() < 0.2:
            send_welcome_email.options(delay=self.rng.uniform(1.0, 5.0)).enqueue(user)
        else:
            send_welcome_email.enqueue(user)

    def _resize(self) -> None:
        resize_image.enqueue(self._next("image", 5000), self.rng.choice((320, 640, 1280)))

    def _charge(self) -> None:
        order = self._next("order", 7000)
        priority = -10 if self.rng.random() < 0.15 else 0
        charge_card.options(priority=priority).enqueue(order)

    def _inventory(self) -> None:
        sync_inventory.enqueue(self.rng.choice(GOOD_SKUS))

    def _bad_sku(self) -> None:
        sync_inventory.enqueue(self.rng.choice(BAD_SKUS))

    def _feed(self) -> None:
        refresh_feed.enqueue(self._next("user", 1000))

    def _report(self) -> None:
        build_report.enqueue(self._next("report", 300))

    def _webhook(self) -> None:
        call_partner_webhook.enqueue(self.rng.choice((17, 42, 99)))


# -- what the store says ----------------------------------------------------------------------
def short_task(name: str) -> str:
    return name.removeprefix(TASK_PREFIX)


def call_text(job: Job, limit: int = 40) -> str:
    args = ", ".join(repr(v) for v in job.args.values())
    text = f"{short_task(job.task)}({args})"
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Event:
    """One failed attempt, read back from a job's stored errors."""

    at: float
    job: Job
    attempt: int
    kind: str
    message: str
    dead: bool


def recent_failures(jobs: Sequence[Job], limit: int) -> list[Event]:
    events: list[Event] = []
    for job in jobs:
        for i, err in enumerate(job.errors):
            final = job.state is JobState.DEAD and i == len(job.errors) - 1
            kind = str(err.get("kind") or "error")
            etype = short_task(str(err.get("type") or ""))
            message = str(err.get("message") or "")
            if kind == "timeout":
                message = f"timed out after {job.timeout:g}s"
            elif etype and kind != "rejected":
                message = f"{etype}: {message}"
            events.append(Event(at=float(err.get("at") or 0.0), job=job, attempt=int(err.get("attempt") or 0),
                                kind=kind, message=message, dead=final))
    events.sort(key=lambda e: (e.at, e.job.id), reverse=True)
    return events[:limit]


@dataclass
class Summary:
    """Counts over every job in the store (read page by page at the end of a run)."""

    by_state: Counter[str] = field(default_factory=Counter)
    succeeded_after_retry: int = 0
    failed_attempts: int = 0
    dead_ids: list[int] = field(default_factory=list)
    dead_by_task: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_state.values())


def summarize(conveyor: Conveyor) -> Summary:
    summary = Summary()
    cursor: int | None = None
    while True:
        page = conveyor.backend.list_jobs(cursor=cursor, limit=500)
        for job in page.jobs:
            summary.by_state[str(job.state)] += 1
            summary.failed_attempts += len(job.errors)
            if job.state is JobState.SUCCEEDED and job.attempts >= 2:
                summary.succeeded_after_retry += 1
            if job.state is JobState.DEAD:
                summary.dead_ids.append(job.id)
                summary.dead_by_task[short_task(job.task)] += 1
        if page.next_cursor is None:
            return summary
        cursor = page.next_cursor


# -- the demo run -----------------------------------------------------------------------------
DEMO_TABLES = {"conveyor_jobs", "conveyor_counters", "conveyor_workers", "conveyor_queue_clock",
               "conveyor_fair_tags", "conveyor_cron", "conveyor_rate_claims", "sqlite_sequence"}


def _not_a_demo_store(path: Path) -> str | None:
    """Why ``path`` is not the demo's own store, or None if it is (or is empty)."""
    if path.is_dir():
        return "is a directory"
    if path.stat().st_size == 0:
        return None
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables - DEMO_TABLES:
                return f"is a SQLite database with other tables ({', '.join(sorted(tables - DEMO_TABLES))})"
            if "conveyor_jobs" in tables:
                row = conn.execute(
                    "SELECT task FROM conveyor_jobs WHERE task NOT LIKE ? LIMIT 1", (f"{TASK_PREFIX}%",)
                ).fetchone()
                if row is not None:
                    return f"holds jobs that are not the demo's (task {row[0]!r})"
    except sqlite3.DatabaseError as exc:
        return f"is not a Conveyor store ({exc})"
    return None


def _live_worker(path: Path) -> str | None:
    """A worker that heartbeat the store at ``path`` in the last 15 s, described; or None."""
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    with contextlib.suppress(sqlite3.DatabaseError), contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        row = conn.execute("SELECT id, last_seen FROM conveyor_workers ORDER BY last_seen DESC LIMIT 1").fetchone()
        if row is not None and time.time() - row[1] < 15:
            return f"worker {row[0]}, last seen {max(0.0, time.time() - row[1]):.0f}s ago"
    return None


def prepare_store(path: Path, *, fresh: bool) -> bool:
    """Check that ``path`` may hold the demo; with ``fresh``, delete an old demo store there.

    The demo only ever deletes or writes to a file that is empty or holds nothing but demo
    jobs: its worker would otherwise claim another app's jobs on high/default/low and kill
    them as unknown tasks. Returns True if an old store was deleted.
    """
    if not path.exists():
        return False
    reason = _not_a_demo_store(path)
    if reason is not None:
        raise ConfigurationError(f"{path} {reason}; the demo will not touch it. Pick another --db.")
    if not fresh:
        return False
    worker = _live_worker(path)
    if worker is not None:
        raise ConfigurationError(
            f"{path} is in use by a running demo ({worker}); not deleting it. "
            "Stop that demo, pick another --db, or pass --keep to join it."
        )
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return True


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


class DemoRun:
    def __init__(self, db: Path, *, duration: float | None, live: bool, fresh: bool, console: Console,
                 dashboard_port: int | None = None) -> None:
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
        self.rates: deque[tuple[float, int]] = deque(maxlen=40)
        self.last_dead_id: int | None = None
        env_url = os.environ.get("CONVEYOR_URL")
        is_default = self.db == Path(os.path.abspath(DEFAULT_DB))
        self.export_line = None if is_default and not env_url else f"export CONVEYOR_URL={shlex.quote(sqlite_url(self.db))}"
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
        self.worker = Worker(app, queues=QUEUES, concurrency=CONCURRENCY, install_signal_handlers=False,
                             grace_period=5.0, poll_interval=0.5)
        self._start_dashboard()
        self.started = time.monotonic()
        self.producer.burst()
        worker_thread = threading.Thread(target=self._run_worker, name="conveyor-demo-worker", daemon=True)
        producer_thread = threading.Thread(target=self.producer.run, name="conveyor-demo-producer", daemon=True)
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
                self.console.print(escape(logging.Formatter().formatException(record.exc_info)), style="dim")
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
            from .dashboard import start_in_thread

            self.dashboard = start_in_thread(app, port=self.dashboard_port, fallback_to_any_port=True,
                                             sample_interval=2.0, title="Conveyor demo")
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
                self.stop_reason = "stopped by Ctrl-C" if signum == signal.SIGINT else "stopped by SIGTERM"
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
    def _live_loop(self, worker_thread: threading.Thread, producer_thread: threading.Thread) -> None:
        with Live(self._view(stopping=False), console=self.console, auto_refresh=False,
                  redirect_stdout=False, redirect_stderr=False) as live:
            stopping = False
            while worker_thread.is_alive():
                if not stopping and self._should_stop(worker_thread):
                    stopping = True
                    live.update(self._view(stopping=True), refresh=True)
                    self._begin_stop(producer_thread)
                time.sleep(0.25)
                live.update(self._view(stopping=stopping), refresh=True)
            worker_thread.join()
            if not stopping:
                self._should_stop(worker_thread)
                self.producer_stop.set()
                producer_thread.join()
            live.update(self._view(stopping=False, done=True), refresh=True)

    def _view(self, *, stopping: bool, done: bool = False) -> RenderableType:
        stats = app.backend.stats()
        recent = app.backend.list_jobs(limit=250).jobs
        top = [self._header(stopping=stopping, done=done), self._queue_table(stats), self._totals(stats)]
        footer = self._footer(stopping=stopping, done=done)
        # Give the failures panel whatever height is left, so the view fills the terminal but
        # never overflows it (Live would crop it).
        used = len(self.console.render_lines(Group(*top, footer), self.console.options, pad=False))
        n_events = max(1, min(12, self.console.size.height - used - 3))
        return Group(*top, self._events_panel(recent, n_events), footer)

    def _header(self, *, stopping: bool, done: bool) -> RenderableType:
        text = Text()
        text.append(" Conveyor demo ", style="bold white on blue")
        text.append(f"  up {self.elapsed():.1f}s · ", style="bold")
        if done:
            text.append(f"stopped: {self.stop_reason}", style="bold green")
        elif stopping:
            text.append("stopping: finishing the running jobs", style="bold yellow")
            if self.interrupts < 2:
                text.append(" (Ctrl-C again to hurry)", style="yellow")
        else:
            if self.duration is not None:
                text.append(f"stops by itself in {max(0.0, self.duration - self.elapsed()):.0f}s · ", style="dim")
            text.append("Ctrl-C to stop", style="bold")
        weights = QUEUES.replace(",", " ")
        text.append(f"\n producer → SQLite store → worker ({CONCURRENCY} slots, weights {weights})", style="dim")
        if self.dashboard is not None:
            text.append("\n dashboard ", style="bold")
            text.append(self.dashboard.url, style="bold cyan underline")
            text.append("  (open it in a browser)", style="dim")
        elif self.dashboard_note:
            text.append(f"\n {self.dashboard_note}", style="yellow")
        return text

    def _queue_table(self, stats: Stats) -> Table:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 2),
                      header_style="bold")
        table.add_column("queue")
        wide = self.console.width >= 90
        for col in ("waiting", "oldest wait" if wide else "oldest", "scheduled", "running", "succeeded", "dead",
                    "lease expiries" if wide else "lease exp"):
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
        retried = self.worker.counters.retried if self.worker else 0
        text = Text.from_markup(
            f" enqueued [bold]{self.producer.enqueued}[/bold] · succeeded [green]{succeeded}[/green] · "
            f"retries [yellow]{retried}[/yellow] · dead [red]{dead}[/red] · [bold]{rate:.1f}[/bold] jobs/s"
        )
        if stats.workers:
            w = stats.workers[0]
            text.append(f"\n worker {w.id} · last heartbeat {_age(max(0.0, stats.now - w.last_seen))} ago",
                        style="dim")
        else:
            text.append(f"\n worker {'stopped' if self.worker_done else 'starting'}", style="dim")
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
        return Panel(grid, title="[bold]latest failures[/bold] [dim](retry: runs again · dead: in the dead-letter "
                     "queue)[/dim]", title_align="left", border_style="dim", padding=(0, 1))

    def _footer(self, *, stopping: bool, done: bool) -> RenderableType:
        text = Text()
        text.append(" store ", style="bold")
        text.append(str(self.db))
        if self.removed_old:
            text.append(" (started fresh; --keep keeps old jobs)", style="dim")
        where = ":" if self.export_line else " (from this directory):"
        text.append(f"\n Try in another terminal{where}\n", style="bold")
        lines = [self.export_line] if self.export_line else []
        job_id = self.last_dead_id
        lines += [f"{self.cmd} stats", f"{self.cmd} dlq list", f"{self.cmd} dlq redrive --all",
                  f"{self.cmd} jobs show {job_id if job_id else 'ID'}"]
        text.append("\n".join(f"   {line}" for line in lines), style="cyan")
        return text

    # -- plain output (no TTY, CI) ----------------------------------------------------------------
    def _plain_loop(self, worker_thread: threading.Thread, producer_thread: threading.Thread) -> None:
        say = self._say
        fresh = " (started fresh: the previous demo store was deleted)" if self.removed_old else ""
        until = f"Stops after {self.duration:g}s." if self.duration is not None else "Ctrl-C to stop."
        say(f"Conveyor demo: store {self.db}{fresh}")
        if self.dashboard is not None:
            say(f"Dashboard: {self.dashboard.url}")
        elif self.dashboard_note:
            say(self.dashboard_note)
        say(f"A producer enqueues jobs, a worker runs them ({CONCURRENCY} at a time, queues {QUEUES}). {until}")
        if self.export_line:
            say(f"In another terminal: {self.export_line}")
        say(f"Try in another terminal: {self.cmd} stats | dlq list | dlq redrive --all | jobs show ID")
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
            f"{name}={by_name[name].depth}/{by_name[name].running}" if name in by_name else f"{name}=0/0"
            for name in QUEUE_NAMES
        )
        return (f"[{self.elapsed():6.1f}s] enqueued {self.producer.enqueued}, succeeded {succeeded}, "
                f"retries {retried}, dead {dead}; waiting/running {queues}")

    # -- the end --------------------------------------------------------------------------
    def _print_summary(self) -> None:
        s = summarize(app)
        out = self._print
        waiting = s.by_state["available"] + s.by_state["scheduled"] + s.by_state["running"]
        out()
        out(f"[bold]Demo finished after {self.elapsed():.1f}s[/bold] ({self.stop_reason or 'stopped'}).")
        if self.worker_error is not None:
            out(f"[red]The worker stopped with an error:[/red] {escape(repr(self.worker_error))}")
        dead_note = ", ".join(f"{n} {t}" for t, n in s.dead_by_task.most_common())
        rows = [
            (s.total, "jobs enqueued" if self.fresh else "jobs in the store", ""),
            (s.by_state["succeeded"], "succeeded", f"{s.succeeded_after_retry} of them after one or more retries"),
            (s.failed_attempts, "failed attempts", "each kept on its job with the error and traceback"),
            (s.by_state["dead"], "dead", f"in the dead-letter queue: {dead_note}" if dead_note else ""),
        ]
        if waiting:
            rows.append((waiting, "not finished", "still in the store; a worker will pick them up"))
        width = len(str(max(n for n, _, _ in rows)))
        for n, label, note in rows:
            out(f"  [bold]{n:>{width}}[/bold] {label}" + (f"  [dim]({escape(note)})[/dim]" if note else ""))
        out(f"Store: {escape(str(self.db))}  [dim](the next demo starts over; --keep continues)[/dim]")
        if self.export_line:
            out(f"  [cyan]{escape(self.export_line)}[/cyan]")
        example = s.dead_ids[0] if s.dead_ids else "ID"
        out("Look at the dead jobs, send them back to their queues, and run them:")
        for line in (f"{self.cmd} dlq list", f"{self.cmd} jobs show {example}", f"{self.cmd} dlq redrive --all",
                     f"{self.cmd} worker"):
            out(f"  [cyan]{escape(line)}[/cyan]")


def _has_display() -> bool:
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def run_demo(db: str | os.PathLike[str] = DEFAULT_DB, *, duration: float | None = None, live: bool | None = None,
             fresh: bool = True, console: Console | None = None, dashboard_port: int | None = None) -> int:
    """Run the demo; returns the process exit code. ``dashboard_port``: serve the web
    dashboard on 127.0.0.1 at that port (0: any free port; None: no dashboard)."""
    out = console or Console(highlight=False)
    if live is None:
        live = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    if duration is not None and not duration > 0:
        raise ConfigurationError(f"--duration must be > 0 seconds, got {duration!r}")
    return DemoRun(Path(db), duration=duration, live=live, fresh=fresh, console=out,
                   dashboard_port=dashboard_port).run()
