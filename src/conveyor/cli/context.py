"""What every command shares: the console, the error type, loading the app, the store check."""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from ..app import Conveyor
from ..backends import absolute_url, sqlite_path
from ..errors import IncludeError, InvalidName
from ..payload import check_queue_name, check_task_name

# Job data is printed as written: a:smile: stays text.
console = Console(highlight=False, emoji=False)
# Piped or redirected, a line is as long as its content: grep and less get whole names and errors.
PIPED_WIDTH = 100_000
# Conveyor's own source: frames in it are never "the user's code" when an import fails.
CONVEYOR_DIR = os.path.dirname(os.path.dirname(__file__))


def fit_console_to_output() -> None:
    """Wrap at the terminal's width on a terminal, not at all when piped ($COLUMNS still wins)."""
    piped = not console.is_terminal and "COLUMNS" not in os.environ
    console.width = PIPED_WIDTH if piped else None  # type: ignore[assignment]


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
    ours = [CONVEYOR_DIR, *(sysconfig.get_path(k) for k in ("stdlib", "platstdlib"))]
    installed = [sysconfig.get_path(k) for k in ("purelib", "platlib")]
    for skip in ([*ours, *installed], ours):
        mine = [f for f in frames if not any(f.filename.startswith(d + os.sep) for d in skip if d)]
        if mine:
            return f"{_shown_path(mine[-1].filename)}:{mine[-1].lineno}"
    return None


def _shown_path(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def import_failure(module_name: str, exc: BaseException, *, verbose: bool) -> CliError:
    """The one-line error for a module that raised ``exc`` at import (the app's module or one
    of its ``include``); ``verbose`` prints the traceback first."""
    if verbose:
        click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
    if isinstance(exc, SyntaxError):
        what = exc.msg
    else:
        what = str(exc).strip().splitlines()[0] if str(exc) else ""
    where = _where(exc)
    return CliError(f"cannot import {module_name}: {type(exc).__name__}: {what}"
                    + (f" ({where})" if where else "")
                    + ("" if verbose else "; --verbose for the traceback"))


def load_app(spec: str, *, verbose: bool = False) -> Conveyor:
    """``package.module:attribute`` to the Conveyor instance it names.

    Whatever importing the module raises (a SyntaxError, a KeyError reading a setting, ...)
    becomes one line naming the module, the exception and where it was raised; ``verbose``
    prints the traceback first.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise click.UsageError(
            f"--app {spec!r}: expected module:attribute, e.g. myproject.jobs:app")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise import_failure(module_name, exc, verbose=verbose) from None
    app = getattr(module, attr or "app", None)
    if not isinstance(app, Conveyor):
        raise click.UsageError(
            f"--app {spec!r}: {module_name}.{attr or 'app'} is not a Conveyor app")
    return app


class Ctx:
    def __init__(self, app_spec: str | None, url: str | None) -> None:
        self.app_spec = app_spec
        self.url = url
        self.state_url: str | None = None  # --state-url: a broker's companion store
        self.log_level = "INFO"
        self.log_format = "text"
        self.verbose = False
        self._app: Conveyor | None = None
        self._loaded_app: Conveyor | None = None

    @property
    def app(self) -> Conveyor:
        if self._app is None:
            app = self._loaded()
            self._check_store(app)
            self._app = app
        return self._app

    def _loaded(self) -> Conveyor:
        """The app of --app (with --url applied), before its store is looked at."""
        if self._loaded_app is None:
            if self.app_spec:
                app = load_app(self.app_spec, verbose=self.verbose)
                if self.url:
                    app.url = self.url
                if self.state_url:
                    app.state_url = absolute_url(self.state_url)
            else:
                app = Conveyor(self.url, state=self.state_url)
            self._loaded_app = app
        return self._loaded_app

    def _check_store(self, app: Conveyor) -> None:
        """A SQLite file that does not exist yet: commands that only read refuse to create an
        empty one (a wrong directory or URL would otherwise show an empty store, as if the jobs
        were gone); the others create it and say where."""
        from . import STORE_CREATORS, STORE_OPTIONAL  # the commands, registered in __init__

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
        if self.url:
            source = "--url or $CONVEYOR_URL"
        elif self.app_spec:
            source = f"the URL of {self.app_spec}"
        else:
            source = "the default: no --app or --url given"
        raise CliError(f"no store at {path} ({source}); give --app or --url for your store "
                       "(a relative sqlite:/// path is relative to the current directory), "
                       "or create this one with `conveyor migrate`")

    def require_tasks(self, what: str) -> Conveyor:
        """The app with every task registered: its ``include`` modules imported."""
        if not self.app_spec:
            raise click.UsageError(
                f"{what} needs --app module:attribute (or $CONVEYOR_APP) to know the tasks")
        return self.app_with_tasks()

    def app_with_tasks(self) -> Conveyor:
        """The app, with the modules of its ``include`` imported (none without --app)."""
        try:
            # Before the store is looked at: a task module that fails creates no empty store.
            self._loaded().import_includes()
        except IncludeError as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            raise import_failure(exc.module, cause, verbose=self.verbose) from None
        return self.app


pass_ctx = click.make_pass_decorator(Ctx)


def checked_name(value: str | None, check: Callable[[object], str]) -> str | None:
    """A --queue/--task filter, refused with the name rule if it cannot be a name at all."""
    if value is None:
        return None
    try:
        return check(value)
    except InvalidName as exc:
        raise click.BadParameter(str(exc)) from None


def queue_filter(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """The callback of a --queue filter option."""
    return checked_name(value, check_queue_name)


def task_filter(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """The callback of a --task filter option."""
    return checked_name(value, check_task_name)
