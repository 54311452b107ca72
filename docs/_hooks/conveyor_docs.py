"""MkDocs hook: reference tables generated from the code itself, so the docs cannot drift.

Markers in a page's Markdown are replaced at build time:

``<!-- conveyor:params module:Qualified.name -->``
    A table of that callable's keyword parameters: name, type and default from its signature;
    the description from its docstring (an ``Args:`` section, or for a dataclass the
    docstrings of its fields) or, failing that, from ``DESCRIPTIONS`` below. A parameter described nowhere still appears, marked as such.
``<!-- conveyor:cli -->``
    Every command of the ``conveyor`` CLI, walked from the click group: usage, help text, and
    each option as ``--help`` prints it, with its environment variable.
``<!-- conveyor:env -->``
    Every ``CONVEYOR_*`` environment variable the package reads (found in its source).

A marker naming something that no longer exists fails the build. The hook also puts
``dashboard.md`` into the navigation under Operations when that page exists.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import re
from pathlib import Path
from typing import Any

import click
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "conveyor"
MARKER = re.compile(r"<!--\s*conveyor:(\w+)\s*([^>]*?)\s*-->")

# Descriptions for parameters whose docstrings do not (yet) describe them, keyed by
# "Qualified.name.param" or, for options shared by several callables, by "*.param".
DESCRIPTIONS: dict[str, str] = {
    # Conveyor(...)
    "Conveyor.__init__.url": "Store URL: `sqlite:///file.db`, `postgresql://...` or `redis://...`. "
    "Without it, `$CONVEYOR_URL`, then `sqlite:///conveyor.db`.",
    "Conveyor.__init__.visibility_timeout": "Lease length in seconds. A worker heartbeats every third of "
    "it; a job whose worker stops heartbeating for this long is given to another worker.",
    "Conveyor.__init__.default_queue": "Queue of tasks that name none.",
    "Conveyor.__init__.default_timeout": "Seconds an attempt may run, for tasks that set no `timeout` "
    "(there is no 'forever').",
    "Conveyor.__init__.default_max_attempts": "Attempts before a job goes `dead`, for tasks that set no "
    "`max_attempts`.",
    "Conveyor.__init__.retry": "Backoff between attempts for tasks that set none. Default: "
    "`RetryPolicy(base=2.0, factor=2.0, cap=3600.0)`, full jitter.",
    "Conveyor.__init__.max_payload_bytes": "Largest JSON encoding of a job's arguments; past it, "
    "enqueue raises `PayloadTooLarge` and writes nothing.",
    "Conveyor.__init__.max_result_bytes": "Largest JSON encoding of a task's result (or a `ctx.once()` "
    "step's); past it, nothing is written and the job goes dead (`result_too_large`, `ResultTooLarge`), "
    "without retries.",
    "Conveyor.__init__.result_ttl": "Seconds succeeded and cancelled jobs are kept (then pruned by the "
    "workers); 0 keeps them forever.",
    "Conveyor.__init__.dead_ttl": "Seconds dead jobs are kept; `None` keeps them until purged.",
    "Conveyor.__init__.pool_size": "PostgreSQL only: fixes the connection pool's size (as "
    "`?pool_max_size=` in the URL). Default: 10 plus the concurrency of the workers in the process.",
    "Conveyor.__init__.include": "Modules that define the app's tasks, e.g. `[\"myapp.tasks\"]`: "
    "imported by workers and by the commands that need the tasks (`enqueue`, `cron list`, the "
    "dashboard). See [tasks in several modules](../concepts.md#tasks-in-several-modules).",
    # @app.task(...)
    "Conveyor.task.name": "Name stored in each job. Default `module.function`; set it to keep jobs "
    "runnable when the function moves.",
    "Conveyor.task.queue": "Queue its jobs go to (default: the app's `default_queue`).",
    "Conveyor.task.max_attempts": "Attempts before a job goes `dead` (default: the app's).",
    "Conveyor.task.timeout": "Seconds one attempt may run (default: the app's `default_timeout`).",
    "Conveyor.task.priority": "Default priority of its jobs: lower runs first (-32768..32767).",
    "Conveyor.task.retry": "Its `RetryPolicy` (default: the app's).",
    "*.retry_on": "Exception classes that are retried (and their subclasses); any other goes dead "
    "at once (a timeout counts as a `TimeoutError`). Default: every exception is retried. See "
    "the Retries page.",
    "*.dead_on": "Exception classes that go dead at once, whatever `retry_on` says. See the "
    "Retries page.",
    # .options(...)
    "Task.options.delay": "Run no earlier than this many seconds (or a `timedelta`) from now.",
    "Task.options.run_at": "Run no earlier than this aware `datetime` (or unix time).",
    "Task.options.priority": "Lower runs first within the queue (-32768..32767).",
    "Task.options.queue": "Another queue for this job.",
    "Task.options.unique_key": "While a job with this key is unfinished, enqueueing another returns "
    "the existing job instead (at most 255 characters).",
    "Task.options.max_attempts": "Attempts for this job.",
    "Task.options.timeout": "Seconds one attempt of this job may run.",
    "Task.options.connection": "PostgreSQL only: a psycopg connection whose transaction the job joins; "
    "it exists only if that transaction commits.",
    "Task.options.wait_if_full": "Seconds to keep retrying while the queue is at its `max_depth` before "
    "raising `QueueFull` (not with `connection`).",
    "Task.options.unique_for": "Seconds (or a `timedelta`) a *succeeded* job keeps answering for its "
    "`unique_key`; needs `unique_key`.",
    "Task.options.fair_key": "A tenant: the queue is shared round-robin between the fair keys with "
    "waiting jobs (at most 255 characters).",
    "Task.options.concurrency_key": "At most `concurrency_limit` running jobs with this key, across all "
    "workers (default key: the task's name).",
    "Task.options.concurrency_limit": "The limit for `concurrency_key`; jobs over it wait without using "
    "attempts.",
    "Task.options.rate_key": "At most `rate_limit` starts per period with this key (default key: the "
    "task's name).",
    "Task.options.rate_limit": "`\"100/m\"`, `\"5/10s\"`, `\"1000/hour\"` or `(count, seconds)`: starts "
    "per sliding window for `rate_key`.",
    "Conveyor.task.concurrency_limit": "At most this many of its jobs run at once across all workers "
    "(keyed by the task's name).",
    "Conveyor.task.rate_limit": "At most this many of its jobs start per period, e.g. `\"100/m\"` "
    "(keyed by the task's name).",
    # @app.cron(...) and app.schedule(...)
    "Conveyor.cron.expression": "A cron expression (croniter syntax): `\"5 * * * *\"`, "
    "`\"0 9 * * mon-fri\"`, `\"@daily\"`.",
    "Conveyor.cron.name": "The schedule's name (default: the task's name); one job per (name, tick).",
    "Conveyor.cron.timezone": "The time zone ticks are computed in (an IANA name).",
    "Conveyor.cron.kwargs": "Keyword arguments passed to every run; checked against the function now.",
    "Conveyor.cron.priority": "Priority of the tick jobs.",
    "Conveyor.cron.queue": "Queue of the task (default: the app's `default_queue`).",
    "Conveyor.cron.max_attempts": "Attempts of each tick job (default: the app's).",
    "Conveyor.cron.timeout": "Seconds one attempt may run (default: the app's).",
    "Conveyor.cron.retry": "The task's `RetryPolicy` (default: the app's).",
    "Conveyor.schedule.task": "A registered task, or its name.",
    "Conveyor.schedule.expression": "A cron expression (croniter syntax).",
    "Conveyor.schedule.name": "The schedule's name (default: the task's name); give one to schedule a "
    "task twice.",
    "Conveyor.schedule.timezone": "The time zone ticks are computed in (an IANA name).",
    "Conveyor.schedule.kwargs": "Keyword arguments passed to every run; checked against the function now.",
    "Conveyor.schedule.priority": "Priority of the tick jobs.",
    "Conveyor.schedule.queue": "Queue of the tick jobs (default: the task's).",
    "Worker.__init__.scheduler": "Run the app's cron schedules in this worker too (safe in any number "
    "of workers).",
    # app.queue(...)
    "Conveyor.queue.name": "The queue.",
    "Conveyor.queue.max_depth": "Most jobs that may wait (scheduled or available) in the queue; past "
    "it, enqueue raises `QueueFull`. `None` removes the limit.",
    # Worker(...)
    "Worker.__init__.app": "The `Conveyor` app whose tasks it runs.",
    "Worker.__init__.queues": "`\"high:6,default:3,low:1\"`, a list of names, or a dict of weights.",
    "Worker.__init__.concurrency": "Jobs run at once (threads for sync tasks; async tasks share the loop).",
    "Worker.__init__.visibility_timeout": "Lease length in seconds (default: the app's).",
    "Worker.__init__.poll_interval": "Longest idle wait between checks for jobs, in seconds.",
    "Worker.__init__.grace_period": "Seconds running jobs may finish after a stop before they are "
    "released back to the queue.",
    "Worker.__init__.maintenance_interval": "Seconds between reaping expired leases and promoting due jobs.",
    "Worker.__init__.prune_interval": "Seconds between deletions of finished jobs past their TTL.",
    "Worker.__init__.worker_id": "Its id in the store (default `host:pid:random`).",
    "Worker.__init__.install_signal_handlers": "Stop gracefully on SIGTERM/SIGINT (the loop must run in "
    "the main thread).",
    "Worker.__init__.metrics": "Where to record Prometheus metrics (default: the app's, if enabled).",
    "Worker.__init__.strict": "Strict priority between queues: the heaviest queue with work takes every "
    "free slot.",
    "Worker.__init__.stuck_grace": "Seconds every slot may stay stuck (sync tasks running past their timeout, "
    "whose threads cannot be killed) before the worker stops with `exit_code` 75 (`EXIT_STUCK`) for its "
    "supervisor to start a fresh process.",
}

# Variables that are not (only) a CLI option's; the others are described by their option's help.
ENV_DESCRIPTIONS: dict[str, str] = {
    "CONVEYOR_URL": "The store URL, when `Conveyor()` gets none; `--url` for the CLI.",
}


# -- parameters ------------------------------------------------------------------------------
def _resolve(target: str) -> Any:
    module_name, _, qualname = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"conveyor:params {target}: {exc}") from exc
    return obj


def _docstring_args(fn: Any) -> dict[str, str]:
    """Descriptions from a Google-style ``Args:`` section, if the docstring has one."""
    doc = inspect.getdoc(fn) or ""
    found: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\n((?:[ \t]+.*\n?|\n)+)", doc, re.M)
    if not match:
        return found
    current = None
    for line in match.group(1).splitlines():
        item = re.match(r"^ {4}(\*{0,2}\w+)(?: \([^)]*\))?:\s*(.*)$", line)
        if item:
            current = item.group(1).lstrip("*")
            found[current] = item.group(2)
        elif current and line.strip():
            found[current] += " " + line.strip()
    return found


def _attribute_docs(cls: Any) -> dict[str, str]:
    """Docstrings of a class's annotated attributes (the string right after ``name: type``)."""
    import ast
    import textwrap

    if not inspect.isclass(cls):
        return {}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    found: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            found[node.target.id] = inspect.cleandoc(after.value.value).replace("``", "`")
    return found


def _cell(text: str) -> str:
    """Text for one table cell: one line, pipes escaped outside code spans (inside them a
    pipe does not split the cell, and an escape would show)."""
    parts = text.replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _annotation(param: inspect.Parameter) -> str:
    ann = param.annotation
    if ann is inspect.Parameter.empty:
        return ""
    text = ann if isinstance(ann, str) else inspect.formatannotation(ann)
    return _cell(f"`{text}`")


def params_table(target: str) -> str:
    fn = _resolve(target)
    qualname = target.partition(":")[2]
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"conveyor:params {target}: no signature ({exc})") from exc
    from_doc = _attribute_docs(fn) | _docstring_args(fn)
    rows = ["| parameter | type | default | description |", "|---|---|---|---|"]
    for name, param in sig.parameters.items():
        if name in ("self", "cls", "fn") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = "required" if param.default is param.empty else f"`{param.default!r}`"
        text = from_doc.get(name) or DESCRIPTIONS.get(f"{qualname}.{name}") or DESCRIPTIONS.get(f"*.{name}")
        rows.append(f"| `{name}` | {_annotation(param)} | {_cell(default)} | "
                    f"{_cell(text) if text else '*not described yet*'} |")
    return "\n".join(rows)


# -- CLI ---------------------------------------------------------------------------------------
def _command_section(cmd: click.Command, ctx: click.Context, depth: int) -> list[str]:
    path = ctx.command_path
    out = [f"{'#' * min(depth, 4)} `{path}`", ""]
    help_text = inspect.cleandoc(cmd.help or "")
    if help_text:
        out += [help_text.replace("\b\n", ""), ""]
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    out += ["```text", f"{path} {usage}".rstrip(), "```", ""]
    records = []
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        opts, text = record
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str) and envvar not in text:
            text = f"{text} (env `{envvar}`)".strip()
        records.append(f"| {_cell(f'`{opts}`')} | {_cell(text)} |")
    if records:
        out += ["| option | description |", "|---|---|", *records, ""]
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            sub_ctx = click.Context(sub, info_name=name, parent=ctx)
            out += _command_section(sub, sub_ctx, depth + 1)
    return out


def cli_reference() -> str:
    from conveyor.cli import cli

    ctx = click.Context(cli, info_name="conveyor", max_content_width=100)
    return "\n".join(_command_section(cli, ctx, 2))


# -- environment -------------------------------------------------------------------------------
def _cli_envvars() -> dict[str, str]:
    """Environment variables of CLI options, described by the option's own help."""
    from conveyor.cli import cli

    found: dict[str, str] = {}

    def walk(cmd: click.Command, ctx: click.Context) -> None:
        for param in cmd.get_params(ctx):
            envvar = getattr(param, "envvar", None)
            record = param.get_help_record(ctx)
            if isinstance(envvar, str) and record is not None:
                found.setdefault(envvar, f"`{ctx.command_path} {record[0]}`: {record[1]}")
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None:
                    walk(sub, click.Context(sub, info_name=name, parent=ctx))

    walk(cli, click.Context(cli, info_name="conveyor"))
    return found


def env_reference() -> str:
    from_cli = _cli_envvars()
    found: dict[str, set[str]] = {}
    pattern = re.compile(r"""(?:environ(?:\.get)?\(|environ\[|envvar=)\s*["'](CONVEYOR_[A-Z0-9_]+)["']""")
    for path in sorted(SRC.rglob("*.py")):
        for name in pattern.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, set()).add(path.relative_to(SRC.parent).as_posix())
    rows = ["| variable | meaning | read in |", "|---|---|---|"]
    for name in sorted(found):
        where = ", ".join(f"`{p}`" for p in sorted(found[name]))
        text = ENV_DESCRIPTIONS.get(name) or from_cli.get(name) or "*not described yet*"
        rows.append(f"| `{name}` | {_cell(text)} | {where} |")
    return "\n".join(rows)


# -- hooks -------------------------------------------------------------------------------------
def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    def replace(match: re.Match[str]) -> str:
        kind, arg = match.group(1), match.group(2)
        if kind == "params":
            return params_table(arg)
        if kind == "cli":
            return cli_reference()
        if kind == "env":
            return env_reference()
        raise PluginError(f"{page.file.src_path}: unknown marker conveyor:{kind}")

    return MARKER.sub(replace, markdown)


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Link the dashboard page under Operations once it exists (it is written separately)."""
    docs = Path(config["docs_dir"])
    nav = config["nav"]
    if not (docs / "dashboard.md").exists() or nav is None or _in_nav(nav, "dashboard.md"):
        return config
    for section in nav:
        if isinstance(section, dict) and "Operations" in section and isinstance(section["Operations"], list):
            section["Operations"].append({"Dashboard": "dashboard.md"})
            break
    return config


def _in_nav(nav: Any, path: str) -> bool:
    if isinstance(nav, str):
        return nav == path
    if isinstance(nav, list):
        return any(_in_nav(item, path) for item in nav)
    if isinstance(nav, dict):
        return any(_in_nav(value, path) for value in nav.values())
    return False
