"""The ``conveyor`` command line.

This module holds the root group, its global options and ``main`` (the console script); each
command (group) lives in a module of its own under ``commands/`` and is registered here (and
importable from here under its old name: ``conveyor.cli.worker`` is the worker command).
``context`` has what every command shares (the console, ``CliError``, ``load_app``, ``Ctx``),
``display`` how jobs and queues are printed.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ..errors import ConveyorError
from ..health import health_command
from .commands import bulk as _bulk  # noqa: F401 - adds `jobs bulk` and `dlq groups`
from .commands.alerts import alerts
from .commands.batches import batches
from .commands.cron import cron, cron_list
from .commands.dashboard import dashboard_cmd
from .commands.demo import demo
from .commands.dlq import dlq, dlq_list, dlq_purge, dlq_redrive, dlq_show
from .commands.jobs import enqueue, jobs, jobs_cancel, jobs_list, jobs_show
from .commands.migrate import migrate
from .commands.queues import queue
from .commands.stats import stats
from .commands.worker import worker
from .context import (
    PIPED_WIDTH,
    CliError,
    Ctx,
    console,
    fit_console_to_output,
    load_app,
    pass_ctx,
)
from .display import (
    SHOWN_CHARS,
    age,
    job_dict,
    jobs_table,
    show_job,
    shown,
    stats_dict,
    stats_view,
    when,
)

__all__ = [
    "PIPED_WIDTH",
    "SHOWN_CHARS",
    "STORE_CREATORS",
    "STORE_OPTIONAL",
    "CliError",
    "Ctx",
    "age",
    "alerts",
    "cli",
    "console",
    "cron",
    "cron_list",
    "dashboard_cmd",
    "demo",
    "dlq",
    "dlq_list",
    "dlq_purge",
    "dlq_redrive",
    "dlq_show",
    "enqueue",
    "job_dict",
    "jobs",
    "jobs_cancel",
    "jobs_list",
    "jobs_show",
    "jobs_table",
    "load_app",
    "main",
    "migrate",
    "pass_ctx",
    "show_job",
    "shown",
    "stats",
    "stats_dict",
    "stats_view",
    "when",
    "worker",
]

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--app", "app_spec", envvar="CONVEYOR_APP", metavar="MODULE:ATTR",
              help="Your Conveyor app, e.g. myproject.jobs:app ($CONVEYOR_APP).")
@click.option("--url", envvar="CONVEYOR_URL",
              help="Store URL, overriding the app's ($CONVEYOR_URL).")
@click.option("--state-url", envvar="CONVEYOR_STATE_URL", metavar="URL",
              help="A broker's companion store, overriding the app's ($CONVEYOR_STATE_URL).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(LOG_LEVELS, case_sensitive=False),
              help="DEBUG also logs every job start and success.")
@click.option("--log-format", default="text", show_default=True,
              type=click.Choice(["text", "json"]), envvar="CONVEYOR_LOG_FORMAT",
              help="json: one object per line, with job fields.")
@click.option("--verbose", is_flag=True,
              help="Show the traceback of a task module that fails to import.")
@click.version_option(package_name="conveyor")
@click.pass_context
def cli(ctx: click.Context, app_spec: str | None, url: str | None, state_url: str | None,
        log_level: str, log_format: str, verbose: bool) -> None:
    """Conveyor: background jobs with leases, retries and a dead-letter queue.

    --app, --url, --log-level, --log-format and --verbose may also follow the command:
    `conveyor worker --app myproject.jobs:app`.
    """
    from ..logs import configure_logging

    configure_logging(log_level, log_format)
    fit_console_to_output()
    ctx.obj = Ctx(app_spec, url)
    ctx.obj.state_url = state_url
    ctx.obj.log_level = log_level
    ctx.obj.log_format = log_format
    ctx.obj.verbose = verbose


def _set_global_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A global option given after the command: stored where the group put its own value."""
    obj = ctx.find_object(Ctx)
    if obj is None or value is None or value is False:
        return value
    if param.name in ("log_level", "log_format"):
        from ..logs import configure_logging

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
        return click.Option(list(decls), expose_value=False, callback=_set_global_option,
                            hidden=True, **kwargs)

    levels = click.Choice(LOG_LEVELS, case_sensitive=False)
    options = ([again("--app", "app_spec", metavar="MODULE:ATTR"), again("--url"),
                again("--state-url")] if store else [])
    return [*options, again("--log-level", type=levels),
            again("--log-format", type=click.Choice(["text", "json"])),
            again("--verbose", is_flag=True, default=None)]


def _add_global_options(group: click.Group) -> None:
    for command in group.commands.values():
        # The demo always runs on its own SQLite file: --app and --url mean nothing to it.
        command.params.extend(_global_options(store=command is not demo))
        if isinstance(command, click.Group):
            _add_global_options(command)


def main(args: list[str] | None = None, prog_name: str | None = None) -> None:
    """The ``conveyor`` command: ``args`` default to sys.argv (other front ends, such as
    Django's ``manage.py conveyor``, pass their own)."""
    try:
        cli.main(args=args, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ConveyorError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


for _command in (worker, enqueue, cron, stats, jobs, batches, dlq, queue, migrate, demo,
                 dashboard_cmd, alerts, health_command):
    cli.add_command(_command)
_add_global_options(cli)
# Commands that may create a new SQLite file (a first worker, a first job); the rest only read
# or change what is there. `cron list` shows the schedules without a store.
STORE_CREATORS: tuple[click.Command, ...] = (worker, enqueue, migrate, dashboard_cmd)
STORE_OPTIONAL: tuple[click.Command, ...] = (cron_list,)
