"""Conveyor as a Django app: add ``"conveyor.contrib.django"`` to ``INSTALLED_APPS`` and a
``CONVEYOR`` setting, define tasks in each app's ``tasks.py`` on :data:`app`, and run
``manage.py conveyor worker``. See docs/django.md.

Settings: ``CONVEYOR = {"url": "postgresql://..."}`` (any other key is a ``Conveyor``
argument: ``visibility_timeout``, ``default_queue``...), or ``{"database": "default"}`` to keep
the jobs in that Django database (PostgreSQL): then a job can be enqueued in the same
transaction as your own writes, through Django's own connection (:func:`db_connection`).
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from ...app import Conveyor
from ...hooks import JOB_EVENTS, HookEvent

if TYPE_CHECKING:
    from ...task import Task

__all__ = ["DjangoConveyor", "app", "db_connection", "enqueue_on_commit", "get_app"]

_lock = threading.Lock()
_app: DjangoConveyor | None = None


class DjangoConveyor(Conveyor):
    """A Conveyor app configured from Django's settings. With ``database=alias``, its store
    is that Django database, its URL read when the store is first opened (so a test run uses
    the test database Django created)."""

    def __init__(self, url: str | None = None, *, database: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.database = database

    @property
    def url(self) -> str:
        if self.database is not None:
            return _url_of(self.database)
        return self._url

    @url.setter
    def url(self, url: str) -> None:
        self.database = None  # an explicit URL (the CLI's --url) wins
        Conveyor.url.fset(self, url)  # type: ignore[attr-defined]


def _url_of(alias: str) -> str:
    """A PostgreSQL URL for the Django database ``alias``."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections

    conn = connections[alias]
    if conn.vendor != "postgresql":
        raise ImproperlyConfigured(
            f'CONVEYOR = {{"database": {alias!r}}} needs a PostgreSQL database; {alias!r} is '
            f'{conn.vendor}: give CONVEYOR a "url" instead')
    s = conn.settings_dict
    user = quote(s.get("USER") or "", safe="")
    password = quote(str(s.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = s.get("HOST") or ""
    port = f":{s['PORT']}" if s.get("PORT") else ""
    query = {k: str(v) for k, v in (s.get("OPTIONS") or {}).items()
             if k in ("options", "sslmode", "sslrootcert", "sslcert", "sslkey",
                      "application_name", "connect_timeout")}
    qs = f"?{urlencode(query)}" if query else ""
    return f"postgresql://{auth}{quote(host, safe='')}{port}/{quote(s['NAME'], safe='')}{qs}"


def get_app() -> DjangoConveyor:
    """The project's Conveyor app, made from ``settings.CONVEYOR`` on first use."""
    global _app
    if _app is None:
        with _lock:
            if _app is None:
                from django.conf import settings
                from django.core.exceptions import ImproperlyConfigured

                options = dict(getattr(settings, "CONVEYOR", None) or {})
                if "url" in options and "database" in options:
                    raise ImproperlyConfigured(
                        'CONVEYOR takes "url" or "database" (a Django database), not both')
                made = DjangoConveyor(options.pop("url", None), **options)
                install_connection_hooks(made)
                _app = made
    return _app


def install_connection_hooks(app: Conveyor) -> None:
    """Close Django's unusable or expired database connections before and after each job, on
    the task's own thread, as Django does around each request (``CONN_MAX_AGE``)."""
    for name in JOB_EVENTS:
        app.on(name)(close_old_connections)


def close_old_connections(event: HookEvent) -> None:
    """A job hook: ``django.db.close_old_connections()`` on a sync task's thread. (An async
    task's hooks run on the event loop, where Django refuses sync database calls; its ORM
    calls go through ``sync_to_async`` threads, which Django manages.)"""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        from django.db import close_old_connections as close

        close()


def db_connection(using: str | None = None) -> Any:
    """Django's own psycopg 3 connection for the database ``using`` (default: ``default``),
    opened if it is not yet: ``task.enqueue(..., connection=db_connection())`` inside
    ``transaction.atomic()`` writes the job in that transaction, so it exists only if the
    transaction commits. The app's store must be that database (``CONVEYOR = {"database":
    "default"}``)."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import DEFAULT_DB_ALIAS, connections

    conn = connections[using or DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"transactional enqueue needs PostgreSQL; database {conn.alias!r} is {conn.vendor}"
            " (use enqueue_on_commit)")
    conn.ensure_connection()
    raw = conn.connection
    if type(raw).__module__.split(".")[0] != "psycopg":
        raise ImproperlyConfigured(
            "transactional enqueue needs Django on psycopg 3 (pip install 'psycopg[binary]'), "
            f"not {type(raw).__module__}")
    return raw


def enqueue_on_commit(task: Task[Any, Any], *args: Any, using: str | None = None,
                      **kwargs: Any) -> None:
    """Enqueue ``task(*args, **kwargs)`` once the current database transaction commits (at
    once outside one); nothing if it rolls back. Any store: the job is written after the
    commit, so a crash in between loses it (``db_connection`` on PostgreSQL does not)."""
    from django.db import transaction

    transaction.on_commit(lambda: task.enqueue(*args, **kwargs), using=using)


def __getattr__(name: str) -> Any:
    # ``from conveyor.contrib.django import app``: made from the settings on first use.
    if name == "app":
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
