"""Request plumbing shared by every page: running a handler on the thread pool, URLs under
the mount point, rendering a template, error pages, redirects with a flash message."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ..backends import redact_url
from ..backends.base import Stats
from ..errors import Unsupported
from ..job import JobState
from . import formatting as fmt
from .params import BadRequest
from .security import FLASH_COOKIE, cookie_header, encode_flash
from .state import Dashboard

log = logging.getLogger("conveyor.dashboard")


class Rendering:
    """The plumbing under Pages: what every handler needs besides its own query."""

    def __init__(self, dash: Dashboard) -> None:
        self.d = dash

    def _page(self, fn: Callable[[Request, dict[str, list[str]]], Response], *, form: bool = False,
              sample: bool = True) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            data: dict[str, list[str]] = {}
            if form:
                from .security import parse_form

                data = parse_form(await request.body())
            if sample:
                self.d.sampler.ensure_started()
            try:
                return await run_in_threadpool(fn, request, data)
            except BadRequest as exc:
                return self.error(request, 400, "Bad request", str(exc))
            except Unsupported as exc:  # a broker without a companion store
                return self.error(request, 501, "Not available on this store", str(exc))
            except Exception as exc:
                log.exception("dashboard: %s %s failed", request.method, request.url.path)
                return self.error(request, 503, "The store did not answer",
                                  fmt.mask(f"{type(exc).__name__}: {exc}"))

        endpoint.__name__ = fn.__name__
        return endpoint

    def url(self, request: Request, name: str, query: dict[str, str] | None = None,
            **params: Any) -> str:
        root = request.scope.get("root_path", "") or ""
        # Quoted before Starlette puts them in: it inserts them as they are, so a queue named
        # "{action}" would be read as the route's next placeholder, and braces belong in a URL
        # percent-encoded.
        quoted = {k: quote(str(v), safe=":") for k, v in params.items()}
        path = root.rstrip("/") + str(request.app.url_path_for(name, **quoted))
        return path + ("?" + urlencode(query) if query else "")

    def render(self, request: Request, template: str, status: int = 200,
               **context: Any) -> Response:
        samples = self.d.sampler.snapshot()
        dead_total = sum(q.dead for q in samples[-1].queues.values()) if samples else None
        state = request.scope.get("state", {})
        base = {
            "request": request,
            "title": self.d.title,
            "version": _version(),
            "store": redact_url(self.d.conveyor.url),
            "csrf_token": state.get("csrf_token", ""),
            "auth_enabled": state.get("auth_enabled", False),
            "logged_in": state.get("logged_in", False),
            "authenticated": state.get("authenticated", False),
            "flash": state.get("flash"),
            "nav_dead": dead_total,
            "url": lambda name, query=None, **p: self.url(request, name, query, **p),
            "static": lambda path: self.url(request, "static", path=path),
            "here": self._here(request),
            "root": (request.scope.get("root_path", "") or "").rstrip("/"),
            "states": [s.value for s in JobState],
            "refresh": 0,
            "sampler_error": self.d.sampler.last_error,
            "ago": lambda ts, now=None: fmt.ago(
                ts, now if now is not None else context.get("now", 0.0)),
        }
        base.update(context)
        return self.d.templates.TemplateResponse(request, template, base, status_code=status)

    def _here(self, request: Request) -> str:
        """This page's path inside the dashboard (for "back to" after an action)."""
        root = request.scope.get("root_path", "") or ""
        path = request.url.path
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        return path + ("?" + request.url.query if request.url.query else "")

    def error(self, request: Request, status: int, heading: str, detail: str) -> Response:
        try:
            return self.render(request, "error.html", status=status, heading=heading, detail=detail,
                               now=0.0)
        except Exception:  # the error page itself failed: plain text, never a traceback
            log.exception("dashboard: rendering the error page failed")
            return PlainTextResponse(f"{heading}: {detail}\n", status_code=status)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return await run_in_threadpool(self.error, request, 404, "Not found",
                                           "There is no such page.")
        return PlainTextResponse(f"{exc.detail}\n", status_code=exc.status_code,
                                 headers=exc.headers)

    async def unsupported(self, request: Request, exc: Exception) -> Response:
        """A page the store cannot answer (a message broker without a companion store): said
        on the page, with the way out, instead of a server error."""
        return await run_in_threadpool(self.error, request, 501, "Not available on this store",
                                       str(exc))

    def redirect(self, request: Request, target: str, flash: str | None = None,
                 kind: str = "ok") -> Response:
        root = (request.scope.get("root_path", "") or "").rstrip("/")
        response = RedirectResponse(root + target, status_code=303)
        if flash:
            value = encode_flash(self.d.auth.secret, {"kind": kind, "text": flash})
            state = request.scope.get("state", {})
            response.raw_headers.append((b"set-cookie", cookie_header(
                FLASH_COOKIE, value, path=state.get("cookie_path", "/"),
                secure=state.get("secure_cookies", False), max_age=60)))
        return response

    def _stats(self, *, finished: bool = True) -> Stats:
        """Fresh stats. ``finished=False`` skips counting succeeded/cancelled jobs (the costly
        part on a big SQL store); such a reading is not a chart sample, its succeeded count
        is 0."""
        stats = self.d.backend.stats(finished=finished)
        if finished:
            self.d.sampler.offer(stats)
        return stats


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("conveyor")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "dev"

