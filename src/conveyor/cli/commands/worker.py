"""``conveyor worker``: run jobs, in this process or in several under a supervisor."""

from __future__ import annotations

import logging
import os
import sys

import click

from ...backends import redact_url
from ..context import Ctx, pass_ctx


@click.command()
@click.option("--queues", "-q", default=None,
              help="Queues with weights: high:6,default:3,low:1 "
                   "(default: every queue the app's tasks use).")
@click.option("--concurrency", "-c", default=8, show_default=True, type=click.IntRange(min=1),
              help="Jobs run at once per process.")
@click.option("--prefetch", default=0, show_default=True, type=click.IntRange(min=0),
              help="Jobs to claim beyond the free slots and hold, leased, until a slot frees: "
                   "faster for short jobs; held jobs wait behind running ones (even urgent ones), "
                   "and no other worker can take them.")
@click.option("--prefetch-hold", default=1.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds a prefetched job may wait for a slot before it is given back to its "
                   "queue.")
@click.option("--processes", "-p", default=1, show_default=True, type=click.IntRange(min=1),
              help="Worker processes; more than 1 runs them under a supervisor that restarts "
                   "crashed ones.")
@click.option("--visibility-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Lease length in seconds (default: the app's).")
@click.option("--grace", "grace_period", default=30.0, show_default=True,
              type=click.FloatRange(min=0),
              help="Seconds to finish running jobs after SIGTERM before releasing them.")
@click.option("--poll-interval", default=1.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Longest idle wait between checks, seconds.")
@click.option("--stuck-grace", default=60.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds every slot may stay stuck (sync tasks running past their timeout, "
                   "whose threads cannot be killed) before the process exits with code 75 for "
                   "its supervisor to restart it.")
@click.option("--strict", is_flag=True,
              help="Strict priority between queues: the heaviest with work first (weights order "
                   "them).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=None,
              help="Serve Prometheus metrics on this port (with --processes N: ports "
                   "PORT..PORT+N-1).")
@click.option("--metrics-addr", default="127.0.0.1", show_default=True,
              help="Address for --metrics-port.")
@click.option("--no-scheduler", is_flag=True,
              help="Don't run the app's cron schedules in this worker (any number of workers may "
                   "run them).")
@click.option("--heartbeat-file", envvar="CONVEYOR_HEARTBEAT_FILE",
              type=click.Path(dir_okay=False),
              help="Rewrite this file at every heartbeat, for `conveyor health` (a liveness "
                   "probe; $CONVEYOR_HEARTBEAT_FILE; needs --processes 1).")
@click.option("--burst", is_flag=True,
              help="Exit (with code 0) once the queues have no available or due job and the "
                   "jobs this worker started have finished: for CI, tests, batch runs.")
@pass_ctx
def worker(obj: Ctx, queues: str | None, concurrency: int, prefetch: int, prefetch_hold: float,
           processes: int, visibility_timeout: float | None, grace_period: float,
           poll_interval: float, stuck_grace: float, strict: bool, metrics_port: int | None,
           metrics_addr: str, no_scheduler: bool, heartbeat_file: str | None,
           burst: bool) -> None:
    """Run jobs. SIGTERM or Ctrl-C stops gracefully; a second one hurries."""
    app = obj.require_tasks("worker")
    if not queues:
        queues = ",".join(sorted({t.queue for t in app.tasks.values()} or {app.default_queue}))
    from ...worker import Worker

    # Built here even when children will run it: a bad option fails now, not in a restart loop.
    w = Worker(app, queues=queues, concurrency=concurrency, visibility_timeout=visibility_timeout,
               grace_period=grace_period, poll_interval=poll_interval, strict=strict,
               scheduler=not no_scheduler, prefetch=prefetch, prefetch_hold=prefetch_hold,
               stuck_grace=stuck_grace, heartbeat_file=heartbeat_file, burst=burst)
    if processes > 1 and burst:
        raise click.UsageError("--burst needs --processes 1 (a supervisor restarts the workers "
                               "that exit)")
    if processes > 1 and heartbeat_file:
        raise click.UsageError("--heartbeat-file needs --processes 1: a probe checks one process "
                               "(run more containers or units instead)")
    if processes > 1:
        from ...supervisor import Supervisor

        argv = [sys.executable, "-m", "conveyor", "--app", obj.app_spec or ""]
        if obj.url:
            # Through the environment, not argv: a password on a command line is readable by
            # anyone in ps.
            os.environ["CONVEYOR_URL"] = obj.url
        argv += ["--log-level", logging.getLevelName(logging.getLogger().level),
                 "--log-format", obj.log_format,
                 "worker", "--queues", queues,
                 "--concurrency", str(concurrency), "--prefetch", str(prefetch),
                 "--prefetch-hold", str(prefetch_hold),
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
               + f", lease {w.lease_s:g}s" + (", burst" if burst else ""), err=True)
    w.run()
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads of sync tasks that outlived their timeout cannot be joined; don't wait for them.
    # Non-zero (EXIT_STUCK) if it stopped because every slot was stuck on one: restart it.
    os._exit(w.exit_code)
