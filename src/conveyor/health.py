"""Is this worker process alive? A heartbeat file for liveness probes (docs/deployment.md).

A worker started with ``--heartbeat-file PATH`` (or ``$CONVEYOR_HEARTBEAT_FILE``) rewrites
PATH each time its heartbeat loop has been round, every lease/3 seconds; ``conveyor health``
reads it and exits 1 once it is older than the lease. A Kubernetes exec probe, a Docker
HEALTHCHECK or a cron job runs the check.

Why a local file, not a question to the store (as ``celery inspect ping`` asks the broker):
a probe every few seconds from every pod would be one more store client per pod, and the
store cannot tell "this process" from "a process on this host". The file is written by the
very loop that heartbeats the leases, after its store call has returned, so it goes stale
exactly when that loop stops coming round: the process is frozen or killed, its event loop
is blocked by a task, or a store call hangs without ever failing.

Why a heartbeat the store refused still counts by default: a store that is down makes every
worker's heartbeat fail at once. Restarting them fixes nothing (they reconnect on their own)
and Kubernetes then holds each one back in CrashLoopBackOff for up to 5 minutes after the
store is back. ``conveyor health --store`` also asks for a heartbeat the store accepted, for
a check that should say so (a Docker health status, a monitoring script).

Writing the file costs a small local write per heartbeat, and the check a process start
(``conveyor health`` imports no app and opens no store).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

log = logging.getLogger("conveyor.health")

HEARTBEAT_FILE_ENV = "CONVEYOR_HEARTBEAT_FILE"
# Seconds a stopping worker may need after --grace: the release of the jobs still running,
# the last acks, removing its row. A platform's stop timeout (systemd TimeoutStopSec, Docker's
# --stop-timeout, Kubernetes terminationGracePeriodSeconds) should be at least --grace plus
# this, or it kills the worker while it gives its jobs back (they return at lease expiry).
STOP_MARGIN_S = 15.0


class HeartbeatFile:
    """What a worker writes at each heartbeat; does nothing without a path.

    ``max_age`` (the worker's lease) is written into the file, so the check needs no option
    to match the worker's settings: a worker silent for a whole lease has lost its leases.
    Never raises: a file that cannot be written is logged, and the check then fails.
    """

    def __init__(self, path: str | os.PathLike[str] | None, *, worker_id: str,
                 max_age: float) -> None:
        self.path = Path(path) if path else None
        self.worker_id = worker_id
        self.max_age = float(max_age)
        self.store_ok_at: float | None = None
        self._failing = False

    def beat(self, *, store_ok: bool) -> None:
        """The heartbeat loop has been round; ``store_ok``: the store took the heartbeat."""
        if self.path is None:
            return
        now = time.time()
        if store_ok:
            self.store_ok_at = now
        record = {"worker_id": self.worker_id, "pid": os.getpid(), "beat_at": now,
                  "store_ok_at": self.store_ok_at, "max_age": self.max_age}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.path)  # a check never reads a half-written file
        except OSError as exc:
            if not self._failing:
                log.error("cannot write the heartbeat file %s (%s): `conveyor health` will "
                          "report this worker dead", self.path, exc)
            self._failing = True
            return
        if self._failing:
            log.info("heartbeat file %s written again", self.path)
        self._failing = False

    def remove(self) -> None:
        """The worker has stopped: a check must not see a live heartbeat from it."""
        if self.path is not None:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cannot remove the heartbeat file %s: %s", self.path, exc)


@dataclass(frozen=True)
class Health:
    """The outcome of one check: ``ok`` and a line saying why."""

    ok: bool
    message: str


def check(path: str | os.PathLike[str], *, max_age: float | None = None, store: bool = False,
          now: float | None = None) -> Health:
    """Is the worker that writes ``path`` alive: did its heartbeat loop come round within
    ``max_age`` seconds (default: the worker's lease, from the file)? With ``store``, the
    store must also have taken a heartbeat within that time."""
    now = time.time() if now is None else now
    try:
        record: dict[str, Any] = json.loads(Path(path).read_text())
        beat_at = float(record["beat_at"])
        limit = float(record["max_age"]) if max_age is None else float(max_age)
    except FileNotFoundError:
        return Health(False, f"no heartbeat file at {path}: no worker has started with "
                             "--heartbeat-file there, or it has stopped")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Health(False, f"unreadable heartbeat file {path}: {type(exc).__name__}: {exc}")
    who = f"worker {record.get('worker_id')} (pid {record.get('pid')})"
    age = max(0.0, now - beat_at)
    if age > limit:
        return Health(False, f"{who}: last heartbeat {age:.1f}s ago, over {limit:g}s: "
                             "the process is frozen, stopped, or its heartbeat hangs")
    ok_at = record.get("store_ok_at")
    store_age = None if ok_at is None else max(0.0, now - float(ok_at))
    if store_age is None or store_age > limit:
        since = "never" if store_age is None else f"not for {store_age:.1f}s"
        if store:
            return Health(False, f"{who}: alive, but the store took its heartbeat {since}")
        store_note = f"; the store took its heartbeat {since} (it reconnects on its own)"
    else:
        store_note = f"; store took it {store_age:.1f}s ago"
    return Health(True, f"ok: {who} heartbeat {age:.1f}s ago (limit {limit:g}s){store_note}")


@click.command("health")
@click.option("--heartbeat-file", "path", envvar=HEARTBEAT_FILE_ENV, metavar="PATH",
              type=click.Path(dir_okay=False),
              help=f"The file the worker writes (its --heartbeat-file; ${HEARTBEAT_FILE_ENV}).")
@click.option("--max-age", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds since the last heartbeat beyond which the worker counts as dead "
                   "(default: the worker's lease, written in the file).")
@click.option("--store", is_flag=True,
              help="Also fail when the store has not taken a heartbeat within that time "
                   "(leave this off in a liveness probe: a restart does not bring a store back).")
def health_command(path: str | None, max_age: float | None, store: bool) -> None:
    """Exit 0 if the worker writing --heartbeat-file is alive, 1 if not (a liveness probe).

    Reads only that file: no app, no store. See docs/deployment.md."""
    if not path:
        raise click.UsageError(f"give --heartbeat-file PATH or ${HEARTBEAT_FILE_ENV}: the "
                               "file that `conveyor worker --heartbeat-file PATH` writes")
    result = check(path, max_age=max_age, store=store)
    click.echo(result.message)
    raise SystemExit(0 if result.ok else 1)
