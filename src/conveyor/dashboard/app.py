"""The dashboard: a Starlette app rendered on the server from the Backend interface alone.

``create_app(conveyor)`` returns an ASGI app: serve it with ``conveyor dashboard`` or mount
it inside your own (``Mount("/conveyor", app=create_app(app, token=...))``). Every page
reads the store through ``list_jobs``, ``get`` and ``stats``; every action is ``redrive``,
``purge`` or ``cancel``. Page costs do not grow with the store: lists are cursor pages
(``id < cursor``), never offsets or counts, and text search scans a bounded window.

This module builds the app (``create_app``); the rest of the package: ``pages`` (every route),
``rendering`` (request plumbing, templates, errors, redirects), ``params`` (query strings and
forms), ``search``, ``views`` (attempts, rates), ``state`` (the Dashboard settings object),
``security`` (auth, sessions, CSRF, headers), ``sampler`` and ``charts`` (live charts and
alerts), ``historyview`` (the charts of the store's history),
``server`` (uvicorn).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from ..alerts import Rule
from ..app import Conveyor
from ..errors import ConfigurationError, Unsupported
from .pages import Pages
from .params import MAX_PAGE_SIZE as MAX_PAGE_SIZE
from .params import PAGE_SIZE as PAGE_SIZE
from .sampler import Sampler
from .security import SecurityMiddleware, make_auth
from .state import Dashboard


class DashboardApp:
    """The ASGI app ``create_app`` returns; ``.dashboard`` is its state (sampler and settings)."""

    def __init__(self, dashboard: Dashboard, asgi: Callable[[Scope, Receive, Send], Any],
                 routes: Sequence[BaseRoute]) -> None:
        self.dashboard = dashboard
        self._asgi = asgi
        self.routes = list(routes)  # for introspection (the security tests walk every route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._asgi(scope, receive, send)

    def close(self) -> None:
        self.dashboard.sampler.stop()


def create_app(
    conveyor: Conveyor | str,
    *,
    token: str | None = None,
    basic_auth: str | tuple[str, str] | None = None,
    secret: str | bytes | None = None,
    allowed_hosts: Iterable[str] = (),
    sample_interval: float = 5.0,
    history: int = 720,
    alert_rules: Sequence[Rule] | None = None,
    title: str = "Conveyor",
    forwarded_allow_ips: str | Sequence[str] | None = None,
) -> DashboardApp:
    """Build the dashboard for ``conveyor`` (an app, or a store URL).

    Without ``token`` or ``basic_auth`` it answers loopback clients only. ``secret`` signs its
    cookies (default: derived from the credentials, so replicas with the same settings agree).
    ``allowed_hosts`` adds Host names it answers to besides loopback. ``alert_rules`` are the
    rules whose firing alerts the overview shows (default: dead jobs, queues without workers,
    jobs past their timeout, stuck worker slots, a job waiting more than 5 minutes).
    ``forwarded_allow_ips``: the proxies (addresses, networks, or ``"*"``) whose
    ``X-Forwarded-Proto`` and ``X-Forwarded-For`` are believed (uvicorn's setting and
    middleware); by default no proxy header is.
    """
    app = Conveyor(conveyor) if isinstance(conveyor, str) else conveyor
    auth = make_auth(token=token, basic_auth=basic_auth, secret=secret, allowed_hosts=allowed_hosts)
    sampler = Sampler(lambda: app.backend, interval=sample_interval, history=history,
                      rules=alert_rules)
    dash = Dashboard(app, auth, sampler, title=title)
    pages = Pages(dash)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        sampler.ensure_started()
        try:
            yield
        finally:
            await run_in_threadpool(sampler.stop)

    star = Starlette(
        routes=pages.routes(),
        lifespan=lifespan,
        exception_handlers={HTTPException: pages.http_error, Unsupported: pages.unsupported},
    )
    asgi: Any = SecurityMiddleware(star, auth)
    if forwarded_allow_ips and not auth.enabled:
        raise ConfigurationError(
            "refusing to trust proxy headers without authentication: a proxy in front serves "
            "clients beyond this machine. Set a token (--token or $CONVEYOR_DASHBOARD_TOKEN) or "
            "basic auth (--basic-auth).")
    if forwarded_allow_ips:
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        trusted: str | list[str]
        if isinstance(forwarded_allow_ips, str):
            trusted = forwarded_allow_ips
        else:
            trusted = list(forwarded_allow_ips)
        asgi = ProxyHeadersMiddleware(asgi, trusted_hosts=trusted)
    return DashboardApp(dash, asgi, star.routes)
