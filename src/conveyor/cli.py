"""The ``conveyor`` command line."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import json
import logging
import os
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import click
from rich.console import Console, Group
from rich.table import Table

from .app import Conveyor
from .backends import redact_url, sqlite_path
from .backends.base import Stats
from .errors import ConveyorError, InvalidName
from .health import health_command
from .job import Job, JobState
from .payload import check_queue_name, check_task_name
from .redact import redact, shown_json, shown_text

console = Console(highlight=False, emoji=False)  # job data is printed as written: a:smile: stays text
# Piped or redirected, a line is as long as its content: grep and less get whole names and errors.
PIPED_WIDTH = 100_000


def _fit_console_to_output() -> None:
    """Wrap at the terminal's width on a terminal, not at all when piped ($COLUMNS still wins)."""
    console.width = PIPED_WIDTH if not console.is_terminal and "COLUMNS" not in os.environ else None  # type: ignore[assignment]


class CliError(click.ClickException):
    """A one-line ``error: ...`` on stderr, exit 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


def _where(exc: BaseException) -> str | None:
    """``file:line`` in the user's code where ``exc`` was raised: the innermost frame outside
    the standard library, installed packages and Conveyor itself (a KeyError from
    ``os.environ[...]`` is reported at the line that read it, not inside ``os``); for a
    project installed as a package, the innermost outside the standard library and Conveyor."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f"{_shown_path(exc.filename)}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    ours = [os.path.dirname(__file__), *(sysconfig.get_path(k) for k in ("stdlib", "platstdlib"))]
    installed = [sysconfig.get_path(k) for k in ("purelib", "platlib")]
    for skip in ([*ours, *installed], ours):
        mine = [f for f in frames if not any(f.filename.startswith(d + os.sep) for d in skip if d)]
        if mine:
            return f"{_shown_path(mine[-1].filename)}:{mine[-1].lineno}"
    return None


def _shown_path(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def load_app(spec: str, *, verbose: bool = False) -> Conveyor:
    """``package.module:attribute`` to the Conveyor instance it names.

    Whatever importing the module raises (a SyntaxError, a KeyError reading a setting, ...)
    becomes one line naming the module, the exception and where it was raised; ``verbose``
    prints the traceback first.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise click.UsageError(f"--app {spec!r}: expected module:attribute, e.g. myproject.jobs:app")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        if verbose:
            click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
        what = exc.msg if isinstance(exc, SyntaxError) else str(exc).strip().splitlines()[0] if str(exc) else ""
        where = _where(exc)
        raise CliError(f"cannot import {module_name}: {type(exc).__name__}: {what}"
                       + (f" ({where})" if where else "")
                       + ("" if verbose else "; --verbose for the traceback")) from None
    app = getattr(module, attr or "app", None)
    if not isinstance(app, Conveyor):
        raise click.UsageError(f"--app {spec!r}: {module_name}.{attr or 'app'} is not a Conveyor app")
    return app


class Ctx:
    def __init__(self, app_spec: str | None, url: str | None) -> None:
        self.app_spec = app_spec
        self.url = url
        self.log_level = "INFO"
        self.log_format = "text"
        self.verbose = False
        self._app: Conveyor | None = None

    @property
    def app(self) -> Conveyor:
        if self._app is None:
            if self.app_spec:
                app = load_app(self.app_spec, verbose=self.verbose)
                if self.url:
                    app.url = self.url
            else:
                app = Conveyor(self.url)
            self._check_store(app)
            self._app = app
        return self._app

    def _check_store(self, app: Conveyor) -> None:
        """A SQLite file that does not exist yet: commands that only read refuse to create an
        empty one (a wrong directory or URL would otherwise show an empty store, as if the jobs
        were gone); the others create it and say where."""
        path = sqlite_path(app.url)
        if path is None or os.path.exists(path):
            return
        current = click.get_current_context(silent=True)
        command = current.command if current is not None else None
        if command in STORE_OPTIONAL:
            return
        if command in STORE_CREATORS:
            click.echo(f"conveyor: created a new empty store at {path}", err=True)
            return
        source = ("--url or $CONVEYOR_URL" if self.url else f"the URL of {self.app_spec}" if self.app_spec
                  else "the default: no --app or --url given")
        raise CliError(f"no store at {path} ({source}); give --app or --url for your store "
                       "(a relative sqlite:/// path is relative to the current directory), "
                       "or create this one with `conveyor migrate`")

    def require_tasks(self, what: str) -> Conveyor:
        if not self.app_spec:
            raise click.UsageError(f"{what} needs --app module:attribute (or $CONVEYOR_APP) to know the tasks")
        return self.app


pass_ctx = click.make_pass_decorator(Ctx)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--app", "app_spec", envvar="CONVEYOR_APP", metavar="MODULE:ATTR",
              help="Your Conveyor app, e.g. myproject.jobs:app ($CONVEYOR_APP).")
@click.option("--url", envvar="CONVEYOR_URL", help="Store URL, overriding the app's ($CONVEYOR_URL).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="DEBUG also logs every job start and success.")
@click.option("--log-format", default="text", show_default=True, type=click.Choice(["text", "json"]),
              envvar="CONVEYOR_LOG_FORMAT", help="json: one object per line, with job fields.")
@click.option("--verbose", is_flag=True, help="Show the traceback of a task module that fails to import.")
@click.version_option(package_name="conveyor")
@click.pass_context
def cli(ctx: click.Context, app_spec: str | None, url: str | None, log_level: str, log_format: str,
        verbose: bool) -> None:
    """Conveyor: background jobs with leases, retries and a dead-letter queue.

    --app, --url, --log-level, --log-format and --verbose may also follow the command:
    `conveyor worker --app myproject.jobs:app`.
    """
    from .logs import configure_logging

    configure_logging(log_level, log_format)
    _fit_console_to_output()
    ctx.obj = Ctx(app_spec, url)
    ctx.obj.log_level = log_level
    ctx.obj.log_format = log_format
    ctx.obj.verbose = verbose


def _set_global_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A global option given after the command: stored where the group put its own value."""
    obj = ctx.find_object(Ctx)
    if obj is None or value is None or value is False:
        return value
    if param.name in ("log_level", "log_format"):
        from .logs import configure_logging

        setattr(obj, param.name, value)
        configure_logging(obj.log_level, obj.log_format)
    else:
        setattr(obj, str(param.name), value)
    return value


def _global_options(*, store: bool) -> list[click.Parameter]:
    """The group's options again, for after a command (``conveyor worker --app x:app``). Without
    defaults or $CONVEYOR_* variables: those the group has already applied. Hidden from each
    command's help, which would repeat them all; `conveyor --help` describes them once."""

    def again(*decls: str, **kwargs: Any) -> click.Option:
        return click.Option(list(decls), expose_value=False, callback=_set_global_option, hidden=True, **kwargs)

    levels = click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False)
    options = [again("--app", "app_spec", metavar="MODULE:ATTR"), again("--url")] if store else []
    return [*options, again("--log-level", type=levels), again("--log-format", type=click.Choice(["text", "json"])),
            again("--verbose", is_flag=True, default=None)]


def _add_global_options(group: click.Group) -> None:
    for command in group.commands.values():
        # The demo always runs on its own SQLite file: --app and --url mean nothing to it.
        command.params.extend(_global_options(store=command is not demo))
        if isinstance(command, click.Group):
            _add_global_options(command)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ConveyorError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


# -- worker ------------------------------------------------------------------------------
@cli.command()
@click.option("--queues", "-q", default=None, help="Queues with weights: high:6,default:3,low:1 "
              "(default: every queue the app's tasks use).")
@click.option("--concurrency", "-c", default=8, show_default=True, type=click.IntRange(min=1),
              help="Jobs run at once per process.")
@click.option("--prefetch", default=0, show_default=True, type=click.IntRange(min=0),
              help="Jobs to claim beyond the free slots and hold, leased, until a slot frees: faster for "
                   "short jobs; held jobs wait behind running ones (even urgent ones), and no other worker "
                   "can take them.")
@click.option("--prefetch-hold", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds a prefetched job may wait for a slot before it is given back to its queue.")
@click.option("--processes", "-p", default=1, show_default=True, type=click.IntRange(min=1),
              help="Worker processes; more than 1 runs them under a supervisor that restarts crashed ones.")
@click.option("--visibility-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Lease length in seconds (default: the app's).")
@click.option("--grace", "grace_period", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to finish running jobs after SIGTERM before releasing them.")
@click.option("--poll-interval", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Longest idle wait between checks, seconds.")
@click.option("--stuck-grace", default=60.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds every slot may stay stuck (sync tasks running past their timeout, whose threads "
                   "cannot be killed) before the process exits with code 75 for its supervisor to restart it.")
@click.option("--strict", is_flag=True,
              help="Strict priority between queues: the heaviest with work first (weights order them).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=None,
              help="Serve Prometheus metrics on this port (with --processes N: ports PORT..PORT+N-1).")
@click.option("--metrics-addr", default="127.0.0.1", show_default=True, help="Address for --metrics-port.")
@click.option("--no-scheduler", is_flag=True,
              help="Don't run the app's cron schedules in this worker (any number of workers may run them).")
@click.option("--heartbeat-file", envvar="CONVEYOR_HEARTBEAT_FILE", type=click.Path(dir_okay=False),
              help="Rewrite this file at every heartbeat, for `conveyor health` (a liveness "
                   "probe; $CONVEYOR_HEARTBEAT_FILE; needs --processes 1).")
@pass_ctx
def worker(obj: Ctx, queues: str | None, concurrency: int, prefetch: int, prefetch_hold: float, processes: int,
           visibility_timeout: float | None,
           grace_period: float, poll_interval: float, stuck_grace: float, strict: bool, metrics_port: int | None,
           metrics_addr: str, no_scheduler: bool, heartbeat_file: str | None) -> None:
    """Run jobs. SIGTERM or Ctrl-C stops gracefully; a second one hurries."""
    app = obj.require_tasks("worker")
    if not queues:
        queues = ",".join(sorted({t.queue for t in app.tasks.values()} or {app.default_queue}))
    from .worker import Worker

    # Built here even when children will run it: a bad option fails now, not in a restart loop.
    w = Worker(app, queues=queues, concurrency=concurrency, visibility_timeout=visibility_timeout,
               grace_period=grace_period, poll_interval=poll_interval, strict=strict,
               scheduler=not no_scheduler, prefetch=prefetch, prefetch_hold=prefetch_hold,
               stuck_grace=stuck_grace, heartbeat_file=heartbeat_file)
    if processes > 1 and heartbeat_file:
        raise click.UsageError("--heartbeat-file needs --processes 1: a probe checks one process "
                               "(run more containers or units instead)")
    if processes > 1:
        from .supervisor import Supervisor

        argv = [sys.executable, "-m", "conveyor", "--app", obj.app_spec or ""]
        if obj.url:
            # Through the environment, not argv: a password on a command line is readable by anyone in ps.
            os.environ["CONVEYOR_URL"] = obj.url
        argv += ["--log-level", logging.getLevelName(logging.getLogger().level), "--log-format", obj.log_format,
                 "worker", "--queues", queues,
                 "--concurrency", str(concurrency), "--prefetch", str(prefetch), "--prefetch-hold", str(prefetch_hold),
                 "--grace", str(grace_period),
                 "--poll-interval", str(poll_interval), "--stuck-grace", str(stuck_grace)]
        if strict:
            argv.append("--strict")
        if no_scheduler:
            argv.append("--no-scheduler")
        if visibility_timeout is not None:
            argv += ["--visibility-timeout", str(visibility_timeout)]
        sys.exit(Supervisor(argv, processes, grace_period=grace_period, metrics_port=metrics_port,
                            metrics_addr=metrics_addr).run())

    if metrics_port is not None:
        w.metrics = app.enable_metrics()
        w.metrics.serve(metrics_port, metrics_addr)

    click.echo(f"conveyor worker {w.id} on {redact_url(app.url)}: queues {queues}, "
               f"concurrency {concurrency}" + (f" (+{prefetch} prefetched)" if prefetch else "")
               + f", lease {w.lease_s:g}s", err=True)
    w.run()
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads of sync tasks that outlived their timeout cannot be joined; don't wait for them.
    # Non-zero (EXIT_STUCK) if it stopped because every slot was stuck on one: restart it.
    os._exit(w.exit_code)


# -- enqueue -----------------------------------------------------------------------------
@cli.command()
@click.argument("task_name")
@click.option("--args", "args_json", default="[]", help='JSON: a list of positional args or an object of keyword args.')
@click.option("--queue", default=None)
@click.option("--delay", type=float, default=None, help="Seconds from now.")
@click.option("--priority", type=int, default=None, help="Lower runs first.")
@click.option("--unique-key", default=None)
@click.option("--fair-key", default=None, help="Tenant: the queue is shared round-robin between fair keys.")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@pass_ctx
def enqueue(obj: Ctx, task_name: str, args_json: str, queue: str | None, delay: float | None,
            priority: int | None, unique_key: str | None, fair_key: str | None, as_json: bool) -> None:
    """Enqueue one job of TASK_NAME."""
    app = obj.require_tasks("enqueue")
    task = app.get_task(task_name)
    try:
        parsed = json.loads(args_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--args") from None
    call = task.options(queue=queue, delay=delay, priority=priority, unique_key=unique_key, fair_key=fair_key)
    if isinstance(parsed, list):
        job = call.enqueue(*parsed)
    elif isinstance(parsed, dict):
        job = call.enqueue(**parsed)
    else:
        raise click.BadParameter("must be a JSON list (positional) or object (keyword)", param_hint="--args")
    if as_json:
        click.echo(json.dumps(job_dict(job)))
    else:
        click.echo(f"enqueued job {job.id} ({job.task} on {job.queue}, {job.state})")


# -- cron --------------------------------------------------------------------------------
@cli.group()
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
        now, taken = time.time(), {}  # no store yet: nothing taken, and no empty file made to say so
    else:
        now, taken = app.backend.now(), app.backend.cron_ticks()
    rows = []
    for name, s in sorted(app.schedules.items()):
        last = taken.get(name)
        rows.append({
            "name": name, "expression": s.expression, "timezone": s.timezone, "task": s.task, "queue": s.queue,
            "last_tick": s.tick_datetime(last).isoformat() if last is not None else None,
            "next_run": s.tick_datetime(s.next_tick(now)).isoformat(),
        })
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo("no cron schedules: add them with @app.cron(\"*/5 * * * *\") or app.schedule(task, ...)")
        return
    table = Table()
    for col in ("schedule", "cron", "timezone", "task", "queue", "last tick", "next run"):
        table.add_column(col, overflow="fold")  # wrap, never cut: these are names and times to copy
    for r in rows:
        table.add_row(r["name"], r["expression"], r["timezone"], r["task"], r["queue"],
                      r["last_tick"] or "-", r["next_run"])
    console.print(table)


# -- stats -------------------------------------------------------------------------------
def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def stats_dict(stats: Stats) -> dict[str, Any]:
    return {
        "now": stats.now,
        "queues": [asdict(q) | {"depth": q.depth} for q in stats.queues],
        "workers": [asdict(w) for w in stats.workers],
    }


def _finished(q: Any) -> int:
    return int(q.succeeded + q.dead + q.cancelled)


def stats_view(stats: Stats, url: str, previous: Stats | None = None) -> Group:
    """The queues table; with ``previous`` (the last refresh) also throughput and failure rate."""
    rates = previous is not None and stats.now > previous.now
    table = Table(title=f"queues on {redact_url(url)}", title_justify="left")
    columns = ["queue", "depth", "oldest waiting", "scheduled", "running", "succeeded", "dead",
               "cancelled", "lease expiries"]
    if rates:
        columns += ["done/s", "failed"]
    for col in columns:
        table.add_column(col, justify="left" if col == "queue" else "right")
    before = {q.queue: q for q in previous.queues} if previous is not None else {}
    for q in stats.queues:
        row = [q.queue, str(q.depth), age(q.oldest_available_age), str(q.scheduled), str(q.running),
               str(q.succeeded), f"[red]{q.dead}[/red]" if q.dead else "0", str(q.cancelled),
               str(q.lease_expiries)]
        if rates:
            assert previous is not None
            old = before.get(q.queue)
            done = _finished(q) - (_finished(old) if old else 0)
            failed = q.dead - (old.dead if old else 0)
            # Pruning deletes finished jobs, which can make a window's count dip: show "-" then.
            row.append(f"{done / (stats.now - previous.now):.1f}" if done >= 0 else "-")
            row.append(f"{failed / done:.0%}" if done > 0 and failed >= 0 else "-")
        table.add_row(*row)
    if not stats.queues:
        table.add_row("(no jobs yet)", *[""] * (len(columns) - 1))
    workers = Table(title=f"live workers: {len(stats.workers)}", title_justify="left")
    for col in ("worker", "queues", "running", "stuck", "concurrency", "last heartbeat", "up"):
        workers.add_column(col)
    for w in stats.workers:
        workers.add_row(w.id, ",".join(w.queues), str(w.running), f"[red]{w.stuck}[/red]" if w.stuck else "0",
                        str(w.concurrency),
                        age(stats.now - w.last_seen) + " ago", age(stats.now - w.started_at))
    return Group(table, workers)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", default=1.0, show_default=True)
@pass_ctx
def stats(obj: Ctx, as_json: bool, watch: bool, interval: float) -> None:
    """Depth and oldest waiting age per queue, counts by state, live workers."""
    backend = obj.app.backend
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
    with Live(stats_view(previous, obj.app.url), console=console, auto_refresh=False) as live, \
            contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(interval)
            current = backend.stats()
            live.update(stats_view(current, obj.app.url, previous), refresh=True)
            previous = current


# -- jobs --------------------------------------------------------------------------------
def _name(value: str | None, check: Callable[[object], str]) -> str | None:
    """A --queue/--task filter, refused with the name rule if it cannot be a name at all."""
    if value is None:
        return None
    try:
        return check(value)
    except InvalidName as exc:
        raise click.BadParameter(str(exc)) from None


def shown(job: Job) -> Job:
    """The job as screens show it: secret-named values and URL passwords masked."""
    return replace(job, args=redact(job.args), result=redact(job.result), errors=redact(job.errors),
                   meta=redact(job.meta), steps=redact(job.steps))


def job_dict(job: Job) -> dict[str, Any]:
    d = asdict(shown(job))
    d["state"] = str(job.state)
    d.pop("lease_token", None)
    return d


# What `jobs show` / `dlq show` print of one value or traceback; --json prints everything.
SHOWN_CHARS = 4_000


def show_job(job: Job) -> None:
    # Clipped before masking: a result of millions of characters shows at once.
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("id", str(job.id)), ("uid", job.uid or "-"), ("task", job.task), ("queue", job.queue), ("state", str(job.state)),
        ("attempts", f"{job.attempts}/{job.max_attempts}"), ("priority", str(job.priority)),
        ("args", shown_json(job.args, SHOWN_CHARS)), ("created", when(job.created_at)),
        ("run at", when(job.run_at)), ("last started", when(job.attempted_at)),
        ("finished", when(job.finished_at)), ("worker", job.worker_id or "-"),
        ("result", shown_json(job.result, SHOWN_CHARS) if job.result is not None else "-"),
        ("unique key", shown_text(job.unique_key, SHOWN_CHARS) if job.unique_key else "-"),
        ("timeout", f"{job.timeout:g}s"),
    ]
    for k, v in rows:
        table.add_row(k, _escape(v))
    console.print(table)
    for err in job.errors:
        console.print(f"[bold]attempt {err.get('attempt')}[/bold] {when(err.get('at'))} "
                      f"[red]{_escape(str(err.get('kind')))}[/red] {_escape(str(err.get('type') or ''))}: "
                      f"{_escape(shown_text(str(err.get('message')), SHOWN_CHARS))}")
        if err.get("traceback"):
            console.print(_escape(shown_text(str(err["traceback"]), SHOWN_CHARS).rstrip()), style="dim")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def jobs_table(jobs: list[Job], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("id", "task", "queue", "state", "attempts", "args", "last error", "finished"):
        table.add_column(col)
    for j in jobs:
        err = j.last_error
        table.add_row(str(j.id), _escape(j.task), j.queue, str(j.state), f"{j.attempts}/{j.max_attempts}",
                      _escape(shown_json(j.args, 60, say_cut=False)),
                      _escape(shown_text(f"{err.get('kind')}: {err.get('message')}", 80, say_cut=False)) if err else "-",
                      when(j.finished_at))
    return table


@cli.group()
def jobs() -> None:
    """Inspect and cancel jobs."""


@jobs.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def jobs_show(obj: Ctx, job_id: int, as_json: bool) -> None:
    """Everything about one job, with every failed attempt."""
    job = obj.app.get_job(job_id)
    if as_json:
        click.echo(json.dumps(job_dict(job), indent=2))
    else:
        show_job(job)


@jobs.command("list")
@click.option("--state", type=click.Choice([s.value for s in JobState]))
@click.option("--queue", callback=lambda _c, _p, v: _name(v, check_queue_name), help="Only this queue.")
@click.option("--task", callback=lambda _c, _p, v: _name(v, check_task_name), help="Only this task.")
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def jobs_list(obj: Ctx, state: str | None, queue: str | None, task: str | None, limit: int, as_json: bool) -> None:
    """Newest jobs first."""
    page = obj.app.backend.list_jobs(state=JobState(state) if state else None, queue=queue, task=task, limit=limit)
    if as_json:
        click.echo(json.dumps([job_dict(j) for j in page.jobs], indent=2))
    else:
        console.print(jobs_table(page.jobs, f"jobs ({len(page.jobs)} shown)"))


@jobs.command("cancel")
@click.argument("job_id", type=int)
@pass_ctx
def jobs_cancel(obj: Ctx, job_id: int) -> None:
    """Cancel a waiting or running job."""
    if obj.app.cancel(job_id):
        click.echo(f"cancelled job {job_id}")
    else:
        raise click.ClickException(f"job {job_id} does not exist or is already finished")


# -- dead-letter queue -------------------------------------------------------------------
@cli.group()
def dlq() -> None:
    """The dead-letter queue: jobs that failed for good."""


@dlq.command("list")
@click.option("--queue", callback=lambda _c, _p, v: _name(v, check_queue_name), help="Only this queue.")
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def dlq_list(obj: Ctx, queue: str | None, limit: int, as_json: bool) -> None:
    """Dead jobs, newest first."""
    page = obj.app.backend.list_jobs(state=JobState.DEAD, queue=queue, limit=limit)
    if as_json:
        click.echo(json.dumps([job_dict(j) for j in page.jobs], indent=2))
    else:
        console.print(jobs_table(page.jobs, f"dead jobs ({len(page.jobs)} shown)"))


@dlq.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON (as `jobs show --json`).")
@pass_ctx
def dlq_show(obj: Ctx, job_id: int, as_json: bool) -> None:
    """One dead job with every error and traceback."""
    job = obj.app.get_job(job_id)
    if job.state is not JobState.DEAD:
        raise CliError(f"job {job_id} is not in the dead-letter queue: it is {job.state} "
                       f"(`conveyor jobs show {job_id}` shows any job)")
    if as_json:
        click.echo(json.dumps(job_dict(job), indent=2))
    else:
        show_job(job)


@dlq.command("redrive")
@click.argument("job_ids", type=int, nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead job (of --queue, if given).")
@click.option("--queue", callback=lambda _c, _p, v: _name(v, check_queue_name), help="Only this queue.")
@pass_ctx
def dlq_redrive(obj: Ctx, job_ids: tuple[int, ...], all_: bool, queue: str | None) -> None:
    """Send dead jobs back to their queue with attempts reset."""
    if not job_ids and not all_:
        raise click.UsageError("give job ids, or --all")
    if job_ids and all_:
        raise click.UsageError("give job ids or --all, not both")
    n = obj.app.backend.redrive(None if all_ else list(job_ids), queue=queue)
    click.echo(f"redrove {n} job(s)")
    if job_ids and n < len(job_ids):
        click.echo(f"{len(job_ids) - n} id(s) were not dead jobs and were left alone", err=True)


@dlq.command("purge")
@click.argument("job_ids", type=int, nargs=-1)
@click.option("--queue", callback=lambda _c, _p, v: _name(v, check_queue_name), help="Only this queue.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_ctx
def dlq_purge(obj: Ctx, job_ids: tuple[int, ...], queue: str | None, yes: bool) -> None:
    """Delete dead jobs (these ids, or all of --queue, or all)."""
    if not yes and not job_ids:
        click.confirm(f"Delete every dead job{' on ' + queue if queue else ''}?", abort=True)
    n = obj.app.backend.purge(state=JobState.DEAD, queue=queue, job_ids=list(job_ids) or None)
    if n == 0 and not job_ids:
        click.echo(f"no dead jobs{' on queue ' + queue if queue else ''}: nothing purged")
        return
    click.echo(f"purged {n} dead job(s)")
    if job_ids and n < len(job_ids):
        click.echo(f"{len(job_ids) - n} id(s) were not dead jobs and were left alone", err=True)


# -- store -------------------------------------------------------------------------------
@cli.command()
@pass_ctx
def migrate(obj: Ctx) -> None:
    """Create or upgrade the store's schema (also done on first use).

    On PostgreSQL, a step that changes a big table reports its progress (rows done / total)
    as it goes; stopped, it resumes where it was at the next run."""
    # Progress is logged: shown whatever --log-level says, since it is what this command is for.
    logging.getLogger("conveyor.postgres.migrate").setLevel(logging.INFO)
    backend = obj.app.backend
    version = backend.schema_version()
    click.echo(f"{redact_url(obj.app.url)}: schema version {'?' if version is None else version}")


# -- demo --------------------------------------------------------------------------------
@cli.command()
@click.option("--db", "db_path", default="conveyor-demo.db", show_default=True, metavar="PATH",
              type=click.Path(dir_okay=False), help="The demo's SQLite file.")
@click.option("--fresh/--keep", default=True, show_default=True,
              help="Delete the demo's SQLite file first (only if it holds nothing but demo jobs), or keep it.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Stop by itself after this long (default: run until Ctrl-C).")
@click.option("--live/--no-live", default=None,
              help="Live terminal view, or plain log lines (default: live when stdout is a terminal).")
@click.option("--dashboard/--no-dashboard", default=True, show_default=True,
              help="Serve the web dashboard on 127.0.0.1 while the demo runs.")
@click.option("--dashboard-port", default=8000, show_default=True, type=click.IntRange(min=0, max=65535),
              help="The dashboard's port (taken: any free port).")
def demo(db_path: str, fresh: bool, duration: float | None, live: bool | None, dashboard: bool,
         dashboard_port: int) -> None:
    """See Conveyor work: a producer and a worker on an embedded SQLite file, live.

    Always uses its own SQLite file (--db), never --url or $CONVEYOR_URL. The tasks are in
    conveyor.demo, so `conveyor --app conveyor.demo:app stats` works from another terminal.
    """
    from .demo import run_demo

    # Its own console: the live view fills the terminal, and piped lines are short anyway.
    code = run_demo(db_path, duration=duration, live=live, fresh=fresh, console=Console(highlight=False),
                    dashboard_port=dashboard_port if dashboard else None)
    sys.stdout.flush()
    sys.stderr.flush()
    # A demo task past its timeout may still be sleeping in its thread; don't wait for it.
    os._exit(code)


# -- dashboard ---------------------------------------------------------------------------
@cli.command("dashboard")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="CONVEYOR_DASHBOARD_HOST",
              help="Address to listen on. Anything but loopback needs --token or --basic-auth.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(min=0, max=65535),
              envvar="CONVEYOR_DASHBOARD_PORT")
@click.option("--token", envvar="CONVEYOR_DASHBOARD_TOKEN", default=None, metavar="TOKEN",
              help="Require this token (128+ bits of randomness: python -c \"import secrets; "
                   "print(secrets.token_urlsafe(32))\"): a login form, or 'Authorization: Bearer'. "
                   "Prefer $CONVEYOR_DASHBOARD_TOKEN: other users can read command lines.")
@click.option("--basic-auth", envvar="CONVEYOR_DASHBOARD_BASIC_AUTH", default=None, metavar="USER:PASSWORD",
              help="Require HTTP basic auth (password 12+ characters; $CONVEYOR_DASHBOARD_BASIC_AUTH).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Also answer to this Host name (repeatable), e.g. behind a reverse proxy. A name "
                   "other than loopback needs --token or --basic-auth.")
@click.option("--forwarded-allow-ips", envvar="CONVEYOR_DASHBOARD_FORWARDED_ALLOW_IPS", default=None,
              metavar="ADDRESSES",
              help="Trust X-Forwarded-Proto and X-Forwarded-For from these proxies (comma-separated "
                   "addresses or networks, or '*'): the scheme and client they report are used. "
                   "Default: no proxy header is trusted.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None, metavar="PEM",
              envvar="CONVEYOR_DASHBOARD_TLS_CERT", help="Serve https with this certificate (chain); needs --tls-key.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None, metavar="PEM",
              envvar="CONVEYOR_DASHBOARD_TLS_KEY", help="The private key of --tls-cert.")
@click.option("--secret", envvar="CONVEYOR_DASHBOARD_SECRET", default=None, metavar="SECRET",
              help="Key for the session cookies, shared by replicas behind one address so each accepts "
                   "the others' sessions (default: random per process). Use $CONVEYOR_DASHBOARD_SECRET.")
@click.option("--sample-interval", default=5.0, show_default=True, type=click.FloatRange(min=0.5),
              help="Seconds between the store samples behind the charts and alerts.")
@pass_ctx
def dashboard_cmd(obj: Ctx, host: str, port: int, token: str | None, basic_auth: str | None,
                  allowed_hosts: tuple[str, ...], forwarded_allow_ips: str | None, tls_cert: str | None,
                  tls_key: str | None, secret: str | None, sample_interval: float) -> None:
    """Serve the web dashboard: queues, jobs, dead letters, workers, cron (docs/dashboard.md)."""
    from .dashboard import serve

    def ready(url: str) -> None:
        # Settings that would serve others without credentials are refused before this point,
        # so "loopback only" is true when it is printed.
        auth = "token" if token else "basic auth" if basic_auth else "no auth: loopback only"
        proxy = f", trusting proxy headers from {forwarded_allow_ips}" if forwarded_allow_ips else ""
        click.echo(f"conveyor dashboard on {url} ({auth}{proxy}) for {redact_url(obj.app.url)}; Ctrl-C stops",
                   err=True)

    try:
        serve(obj.app, host=host, port=port, token=token or None, basic_auth=basic_auth or None,
              allowed_hosts=allowed_hosts, forwarded_allow_ips=forwarded_allow_ips or None, tls_cert=tls_cert,
              tls_key=tls_key, secret=secret or None, sample_interval=sample_interval, on_ready=ready)
    except ConveyorError as exc:
        raise click.UsageError(str(exc)) from None


# -- alerts ------------------------------------------------------------------------------
@cli.command()
@click.option("--dead/--no-dead", default=True, show_default=True, help="Alert while a queue has dead jobs.")
@click.option("--depth", type=click.IntRange(min=0), default=None, help="Alert when more jobs than this wait.")
@click.option("--age", type=click.FloatRange(min=0), default=None,
              help="Alert when the oldest waiting job is older than this many seconds.")
@click.option("--no-workers/--allow-no-workers", "no_workers", default=True, show_default=True,
              help="Alert when a queue has waiting jobs and no live worker.")
@click.option("--lease-expiry-rate", type=click.FloatRange(min=0), default=None,
              help="Alert above this many lease expiries per minute on a queue.")
@click.option("--past-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Alert when jobs run this many seconds past their timeout.")
@click.option("--stuck-slots", type=click.IntRange(min=0), default=0, show_default=True,
              help="Alert when a worker has more than this many slots stuck on sync tasks running past "
                   "their timeout (their threads cannot be killed).")
@click.option("--webhook", "webhooks", multiple=True, help="POST incidents as JSON here (repeatable).")
@click.option("--interval", default=15.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--once", is_flag=True, help="Evaluate once, print what fires, exit 1 if anything does.")
@pass_ctx
def alerts(obj: Ctx, dead: bool, depth: int | None, age: float | None, no_workers: bool,
           lease_expiry_rate: float | None, past_timeout: float, stuck_slots: int, webhooks: tuple[str, ...],
           interval: float, once: bool) -> None:
    """Watch the store and notify (log, webhooks) when an alert fires and when it resolves.

    Run one of these per store: evaluators do not coordinate.
    """
    from .alerts import (
        Action,
        Alerting,
        DeadJobs,
        JobsPastTimeout,
        LeaseExpiryRate,
        NoLiveWorkers,
        OldestJobAge,
        QueueDepth,
        Rule,
        StuckSlots,
        Webhook,
        log_action,
    )

    rules: list[Rule] = [JobsPastTimeout(grace=past_timeout), StuckSlots(stuck_slots)]
    if dead:
        rules.append(DeadJobs())
    if depth is not None:
        rules.append(QueueDepth(depth))
    if age is not None:
        rules.append(OldestJobAge(age))
    if no_workers:
        rules.append(NoLiveWorkers())
    if lease_expiry_rate is not None:
        rules.append(LeaseExpiryRate(lease_expiry_rate))
    actions: list[Action] = [] if once else [log_action, *(Webhook(url) for url in webhooks)]
    alerting = Alerting(obj.app.backend, rules, actions, interval=interval)
    if once:
        fired = alerting.evaluate()
        for incident in fired:
            click.echo(f"FIRING {incident.severity} {incident.key}: {incident.summary}")
        if not fired:
            click.echo("no alerts firing")
        sys.exit(1 if fired else 0)
    click.echo(f"evaluating {len(rules)} rule(s) every {interval:g}s; Ctrl-C stops", err=True)
    with contextlib.suppress(KeyboardInterrupt):
        alerting.run()


cli.add_command(health_command)
_add_global_options(cli)
# Commands that may create a new SQLite file (a first worker, a first job); the rest only read
# or change what is there. `cron list` shows the schedules without a store.
STORE_CREATORS: tuple[click.Command, ...] = (worker, enqueue, migrate, dashboard_cmd)
STORE_OPTIONAL: tuple[click.Command, ...] = (cron_list,)
