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

They stay in this module: their names (``conveyor.demo.charge_card`` ...) are what the store
holds. The rest of the demo: ``producer`` (what gets enqueued), ``store`` (reading results
back, checking a file may hold the demo), ``run`` (threads, signals, plain output, summary)
and ``view`` (the live terminal view).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..app import Conveyor
from ..errors import ConfigurationError, Reject
from ..executor import current_job
from ..retry import RetryPolicy

if TYPE_CHECKING:
    from rich.console import Console

app = Conveyor(os.environ.get("CONVEYOR_URL") or "sqlite:///conveyor-demo.db",
               visibility_timeout=10)

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
    url = f"https://cdn.example.com/i/{image_id}_{width}w.webp"
    return {"image_id": image_id, "width": width, "url": url}


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




def run_demo(db: str | os.PathLike[str] = DEFAULT_DB, *, duration: float | None = None,
             live: bool | None = None, fresh: bool = True, console: Console | None = None,
             dashboard_port: int | None = None) -> int:
    """Run the demo; returns the process exit code. ``dashboard_port``: serve the web
    dashboard on 127.0.0.1 at that port (0: any free port; None: no dashboard)."""
    # Imported here: a worker given --app conveyor.demo:app needs the tasks, not the screens.
    from rich.console import Console

    from .run import DemoRun

    out = console or Console(highlight=False)
    if live is None:
        live = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    if duration is not None and not duration > 0:
        raise ConfigurationError(f"--duration must be > 0 seconds, got {duration!r}")
    return DemoRun(Path(db), duration=duration, live=live, fresh=fresh, console=out,
                   dashboard_port=dashboard_port).run()
