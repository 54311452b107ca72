"""The dashboard: a Starlette app rendered on the server from the Backend interface alone.

``create_app(conveyor)`` returns an ASGI app: serve it with ``conveyor dashboard`` or mount
it inside your own (``Mount("/conveyor", app=create_app(app, token=...))``). Every page
reads the store through ``list_jobs``, ``get`` and ``stats``; every action is ``redrive``,
``purge`` or ``cancel``. Page costs do not grow with the store: lists are cursor pages
(``id < cursor``), never offsets or counts, and text search scans a bounded window.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import Receive, Scope, Send

from ..alerts import Rule
from ..app import Conveyor
from ..backends import redact_url
from ..backends.base import Backend, QueueStats, Stats, WorkerInfo
from ..cron import tick_of
from ..errors import ConfigurationError
from ..job import Job, JobState
from ..payload import NAME_RE, TASK_NAME_RE
from ..textsafe import escape_controls
from . import charts
from . import formatting as fmt
from .sampler import Sample, Sampler
from .security import (
    FLASH_COOKIE,
    SESSION_COOKIE,
    SESSION_TTL,
    AuthConfig,
    SecurityMiddleware,
    client_of,
    cookie_header,
    encode_flash,
    make_auth,
    token_matches,
)

log = logging.getLogger("conveyor.dashboard")

HERE = Path(__file__).parent
PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
SEARCH_WINDOW = 2000  # jobs a text search looks at per request, newest first (~0.2 s)
SEARCH_CHARS = 4_000  # of each job's arguments and of each error message a text search reads
SEARCH_BATCH = 500
SEARCH_CALLS = 40  # list_jobs calls per search request, at most (Redis pages can come back short)
MAX_QUERY = 256
MAX_IDS = 1000
JOB_ACTIONS = ("retry", "cancel", "purge")
DEAD_ACTIONS = ("redrive", "purge")
ID_QUERY = re.compile(r"#?\s*(\d{1,18})")
MAX_JOB_ID = 2**63 - 1  # every store keeps ids in a signed 64-bit integer


class BadRequest(Exception):
    """A parameter the page cannot use; shown to the user as a 400 with this message."""


@dataclass
class JobsQuery:
    state: JobState | None = None
    queue: str | None = None
    task: str | None = None
    q: str = ""
    cursor: int | None = None
    limit: int = PAGE_SIZE

    def params(self, **override: Any) -> dict[str, str]:
        values: dict[str, Any] = {"state": self.state.value if self.state else None, "queue": self.queue,
                                  "task": self.task, "q": self.q or None, "cursor": self.cursor,
                                  "limit": self.limit if self.limit != PAGE_SIZE else None}
        values.update(override)
        return {k: str(v) for k, v in values.items() if v not in (None, "")}


@dataclass
class SearchResult:
    jobs: list[Job]
    next_cursor: int | None
    scanned: int = 0
    window_full: bool = False  # stopped at SEARCH_WINDOW before the end of the store
    exact: Job | None = None


@dataclass
class Attempt:
    number: int
    outcome: str  # "failed", "timeout", "lease expired", "rejected", "running", "succeeded", ...
    css: str
    worker: str | None
    started: float | None = None
    ended: float | None = None
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    round_start: bool = False

    @property
    def duration(self) -> float | None:
        if self.started is None or self.ended is None or self.ended < self.started:
            return None
        return self.ended - self.started


@dataclass
class QueueRow:
    stats: QueueStats
    rate: float | None
    spark: str
    workers: int


@dataclass
class Dashboard:
    """The state behind one dashboard app: the Conveyor app, the auth settings, the sampler."""

    conveyor: Conveyor
    auth: AuthConfig
    sampler: Sampler
    title: str = "Conveyor"
    templates: Jinja2Templates = field(init=False)

    def __post_init__(self) -> None:
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every template, whatever its name: job data is never trusted
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            finalize=_visible,
        )
        env.filters.update(
            duration=fmt.duration, when=fmt.when, iso=fmt.iso, count=fmt.count, rate=fmt.rate,
            json=fmt.to_json, mask=fmt.mask, shorten=fmt.shorten, call=fmt.call_preview,
        )
        self.templates = Jinja2Templates(env=env)

    @property
    def backend(self) -> Backend:
        return self.conveyor.backend


def _visible(value: Any) -> Any:
    """Every value a template prints: control characters shown as escapes (newlines and tabs
    kept, tracebacks keep their shape). Markup is a macro's output, already made visible."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return escape_controls(value, keep="\n\t")
    return value


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
    jobs past their timeout, a job waiting more than 5 minutes). ``forwarded_allow_ips``: the
    proxies (addresses, networks, or ``"*"``) whose ``X-Forwarded-Proto`` and ``X-Forwarded-For``
    are believed (uvicorn's setting and middleware); by default no proxy header is.
    """
    app = Conveyor(conveyor) if isinstance(conveyor, str) else conveyor
    auth = make_auth(token=token, basic_auth=basic_auth, secret=secret, allowed_hosts=allowed_hosts)
    sampler = Sampler(lambda: app.backend, interval=sample_interval, history=history, rules=alert_rules)
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
        exception_handlers={HTTPException: pages.http_error},
    )
    asgi: Any = SecurityMiddleware(star, auth)
    if forwarded_allow_ips and not auth.enabled:
        raise ConfigurationError(
            "refusing to trust proxy headers without authentication: a proxy in front serves clients beyond "
            "this machine. Set a token (--token or $CONVEYOR_DASHBOARD_TOKEN) or basic auth (--basic-auth).")
    if forwarded_allow_ips:
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        trusted = forwarded_allow_ips if isinstance(forwarded_allow_ips, str) else list(forwarded_allow_ips)
        asgi = ProxyHeadersMiddleware(asgi, trusted_hosts=trusted)
    return DashboardApp(dash, asgi, star.routes)


# -- parameter parsing -----------------------------------------------------------------------------
def _one(params: Any, name: str) -> str:
    value = params.get(name)
    return value.strip() if isinstance(value, str) else ""


def parse_state(value: str) -> JobState | None:
    if not value:
        return None
    try:
        return JobState(value)
    except ValueError:
        raise BadRequest(f"unknown state {value!r}: one of {', '.join(s.value for s in JobState)}") from None


def parse_queue(value: str) -> str | None:
    if not value:
        return None
    if not NAME_RE.fullmatch(value):
        raise BadRequest("a queue name is 1-128 characters of letters, digits and _ . : -")
    return value


def parse_task(value: str) -> str | None:
    if not value:
        return None
    if not TASK_NAME_RE.fullmatch(value):
        raise BadRequest("a task name is 1-255 characters of letters, digits and _ . : < > -")
    return value


def parse_cursor(value: str) -> int | None:
    if not value:
        return None
    if not value.isdigit() or len(value) > 18:
        raise BadRequest("cursor must be a job id")
    return int(value)


def parse_limit(value: str) -> int:
    if not value:
        return PAGE_SIZE
    if not value.isdigit():
        raise BadRequest("limit must be a number")
    return max(1, min(MAX_PAGE_SIZE, int(value[:6])))


def parse_jobs_query(params: Any) -> JobsQuery:
    q = _one(params, "q")
    if len(q) > MAX_QUERY:
        raise BadRequest(f"search text is limited to {MAX_QUERY} characters")
    return JobsQuery(state=parse_state(_one(params, "state")), queue=parse_queue(_one(params, "queue")),
                     task=parse_task(_one(params, "task")), q=q, cursor=parse_cursor(_one(params, "cursor")),
                     limit=parse_limit(_one(params, "limit")))


def parse_ids(values: Sequence[str]) -> list[int]:
    if len(values) > MAX_IDS:
        raise BadRequest(f"at most {MAX_IDS} jobs per action")
    ids = []
    for v in values:
        if not v.strip().isdigit() or len(v.strip()) > 18:
            raise BadRequest(f"not a job id: {v[:40]!r}")
        ids.append(int(v))
    return sorted(set(ids), reverse=True)


def safe_next(value: str, default: str) -> str:
    """A path inside the dashboard to go back to; anything else (another site) is ignored."""
    if (not value or not value.startswith("/") or value.startswith("//") or "\\" in value
            or any(ord(c) < 32 for c in value) or len(value) > 2000):
        return default
    return value


# -- search -----------------------------------------------------------------------------------
def job_text(job: Job) -> str:
    """What text search looks in: the args (with secrets masked), the unique key, error messages."""
    parts = [fmt.to_json(job.args, limit=SEARCH_CHARS), job.unique_key or ""]
    parts += [fmt.mask(f"{e.get('type') or ''} {e.get('message') or ''}", SEARCH_CHARS) for e in job.errors]
    return "\n".join(parts).lower()


def search_jobs(backend: Backend, query: JobsQuery) -> SearchResult:
    """One page of jobs matching the filters and, with ``q``, the text. An id (``123`` or
    ``#123``) is also looked up exactly. The text scan reads at most SEARCH_WINDOW jobs per
    request, newest first, and returns a cursor to scan on from where it stopped."""
    exact = None
    if query.q and (m := ID_QUERY.fullmatch(query.q)) and query.cursor is None:
        exact = backend.get(int(m.group(1)))
    if not query.q:
        page = backend.list_jobs(state=query.state, queue=query.queue, task=query.task, cursor=query.cursor,
                                 limit=query.limit)
        return SearchResult(page.jobs, page.next_cursor, scanned=len(page.jobs))
    needle = query.q.lower()
    found: list[Job] = []
    scanned = 0
    cursor = query.cursor
    for _ in range(SEARCH_CALLS):
        batch = min(SEARCH_BATCH, SEARCH_WINDOW - scanned)
        page = backend.list_jobs(state=query.state, queue=query.queue, task=query.task, cursor=cursor,
                                 limit=batch)
        for job in page.jobs:
            scanned += 1
            if needle in job_text(job):
                found.append(job)
                if len(found) == query.limit:
                    return SearchResult(found, job.id, scanned, exact=exact)
        if page.next_cursor is None:
            return SearchResult(found, None, scanned, exact=exact)
        cursor = page.next_cursor
        if scanned >= SEARCH_WINDOW:
            break
    return SearchResult(found, cursor, scanned, window_full=True, exact=exact)


# -- derived views ------------------------------------------------------------------------------
ERROR_OUTCOMES = {"timeout": ("timed out", "warn"), "lease_expired": ("lease expired", "warn"),
                  "rejected": ("rejected", "bad"), "retry": ("asked to retry", "warn"),
                  "unknown_task": ("unknown task", "bad"), "bad_arguments": ("bad arguments", "bad"),
                  "cancelled": ("cancelled", "muted")}


def attempts_of(job: Job) -> list[Attempt]:
    """Every attempt, oldest first: each failed one from the job's error records, then the
    running or finished last one. A redrive starts the numbering again: marked as a new round."""
    out: list[Attempt] = []
    previous = 0
    for i, err in enumerate(job.errors):
        number = int(err.get("attempt") or 0)
        outcome, css = ERROR_OUTCOMES.get(str(err.get("kind") or ""), ("failed", "bad"))
        at = err.get("at")
        a = Attempt(number=number, outcome=outcome, css=css, worker=err.get("worker_id"),
                    ended=float(at) if isinstance(at, int | float) else None,
                    error_type=str(err.get("type") or ""), message=fmt.mask(str(err.get("message") or "")),
                    traceback=fmt.mask(str(err.get("traceback") or "")),
                    round_start=i > 0 and number <= previous)
        previous = number
        out.append(a)
    if job.state is JobState.RUNNING:
        out.append(Attempt(job.attempts, "running", "run", job.worker_id, started=job.attempted_at,
                           round_start=bool(out) and job.attempts <= previous))
    elif job.state is JobState.SUCCEEDED:
        out.append(Attempt(job.attempts, "succeeded", "ok", job.worker_id, started=job.attempted_at,
                           ended=job.finished_at, round_start=bool(out) and job.attempts <= previous))
    elif job.state is JobState.CANCELLED:
        out.append(Attempt(job.attempts, "cancelled", "muted", job.worker_id, started=job.attempted_at,
                           ended=job.finished_at))
    elif out and job.attempted_at is not None and out[-1].number == job.attempts and job.attempts > 0:
        # The last failure was the latest claim (dead, or waiting for a retry): it began then.
        out[-1].started = job.attempted_at
    return out


def recent_rate(samples: Sequence[Sample], pick: Callable[[QueueStats], float], queue: str | None = None,
                window: float = 60.0) -> float | None:
    """Increase per second of a counter over about the last ``window`` seconds of samples."""
    if len(samples) < 2:
        return None
    last = samples[-1]
    first = next((s for s in samples if last.at - s.at <= window), samples[0])
    if first is last:
        first = samples[-2]

    def total(s: Sample) -> float:
        if queue is not None:
            q = s.queues.get(queue)
            return pick(q) if q else 0.0
        return sum(pick(q) for q in s.queues.values())

    span = last.at - first.at
    delta = total(last) - total(first)
    return delta / span if span > 0 and delta >= 0 else None


def workers_by_queue(workers: Sequence[WorkerInfo]) -> dict[str, int]:
    out: dict[str, int] = {}
    for w in workers:
        for q in w.queues:
            out[q] = out.get(q, 0) + 1
    return out


class Pages:
    """The routes. Handlers are plain functions run on the thread pool (backends are sync)."""

    def __init__(self, dash: Dashboard) -> None:
        self.d = dash

    def routes(self) -> list[Route | Mount]:
        get, post = ["GET", "HEAD"], ["POST"]
        return [
            Route("/", self._page(self.overview), methods=get, name="overview"),
            Route("/queues/{queue}", self._page(self.queue), methods=get, name="queue"),
            Route("/jobs", self._page(self.jobs), methods=get, name="jobs"),
            Route("/jobs/{job_id:int}", self._page(self.job), methods=get, name="job"),
            Route("/jobs/{job_id:int}/{action}", self._page(self.job_action, form=True), methods=post,
                  name="job_action"),
            Route("/dead", self._page(self.dead), methods=get, name="dead"),
            Route("/dead/{action}", self._page(self.dead_action, form=True), methods=post, name="dead_action"),
            Route("/workers", self._page(self.workers), methods=get, name="workers"),
            Route("/cron", self._page(self.cron), methods=get, name="cron"),
            Route("/login", self._page(self.login), methods=get, name="login"),
            Route("/login", self._page(self.login_post, form=True), methods=post, name="login_post"),
            Route("/logout", self._page(self.logout, form=True), methods=post, name="logout"),
            Route("/healthz", self._page(self.healthz, sample=False), methods=get, name="healthz"),
            Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
        ]

    # -- plumbing ----------------------------------------------------------------------------
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
            except Exception as exc:
                log.exception("dashboard: %s %s failed", request.method, request.url.path)
                return self.error(request, 503, "The store did not answer",
                                  fmt.mask(f"{type(exc).__name__}: {exc}"))

        endpoint.__name__ = fn.__name__
        return endpoint

    def url(self, request: Request, name: str, query: dict[str, str] | None = None, **params: Any) -> str:
        root = request.scope.get("root_path", "") or ""
        path = root.rstrip("/") + str(request.app.url_path_for(name, **params))
        return path + ("?" + urlencode(query) if query else "")

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
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
            "ago": lambda ts, now=None: fmt.ago(ts, now if now is not None else context.get("now", 0.0)),
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
            return await run_in_threadpool(self.error, request, 404, "Not found", "There is no such page.")
        return PlainTextResponse(f"{exc.detail}\n", status_code=exc.status_code, headers=exc.headers)

    def redirect(self, request: Request, target: str, flash: str | None = None, kind: str = "ok") -> Response:
        root = (request.scope.get("root_path", "") or "").rstrip("/")
        response = RedirectResponse(root + target, status_code=303)
        if flash:
            value = encode_flash(self.d.auth.secret, {"kind": kind, "text": flash})
            state = request.scope.get("state", {})
            response.raw_headers.append((b"set-cookie", cookie_header(
                FLASH_COOKIE, value, path=state.get("cookie_path", "/"), secure=state.get("secure_cookies", False),
                max_age=60)))
        return response

    def _stats(self, *, finished: bool = True) -> Stats:
        """Fresh stats. ``finished=False`` skips counting succeeded/cancelled jobs (half the cost
        on a big SQL store); such a reading is not a chart sample, its succeeded count is 0."""
        stats = self.d.backend.stats(finished=finished)
        if finished:
            self.d.sampler.offer(stats)
        return stats

    # -- pages -------------------------------------------------------------------------------
    def overview(self, request: Request, _: dict[str, list[str]]) -> Response:
        stats = self.d.backend.stats()
        self.d.sampler.observe(stats)
        samples = self.d.sampler.snapshot()
        serving = workers_by_queue(stats.workers)
        rows = [QueueRow(q, recent_rate(samples, lambda s: float(s.succeeded), q.queue),
                         charts.sparkline(samples, q.queue), serving.get(q.queue, 0)) for q in stats.queues]
        totals = {
            "waiting": sum(q.depth for q in stats.queues),
            "scheduled": sum(q.scheduled for q in stats.queues),
            "running": sum(q.running for q in stats.queues),
            "dead": sum(q.dead for q in stats.queues),
            "succeeded": sum(q.succeeded for q in stats.queues),
            "oldest": max((q.oldest_available_age for q in stats.queues if q.oldest_available_age is not None),
                          default=None),
            "rate": recent_rate(samples, lambda s: float(s.succeeded)),
            "capacity": sum(w.concurrency for w in stats.workers),
            "busy": sum(w.running for w in stats.workers),
        }
        return self.render(
            request, "overview.html", now=stats.now, stats=stats, rows=rows, totals=totals, nav_dead=totals["dead"],
            alerts=self.d.sampler.alerts(), refresh=5, interval=self.d.sampler.interval,
            charts=[charts.throughput_chart(samples), charts.failures_chart(samples), charts.backlog_chart(samples)],
        )

    def queue(self, request: Request, _: dict[str, list[str]]) -> Response:
        name = parse_queue(str(request.path_params["queue"]))
        assert name is not None
        stats = self._stats()
        q = next((x for x in stats.queues if x.queue == name), None)
        workers = [w for w in stats.workers if name in w.queues]
        if q is None and not workers:
            return self.error(request, 404, "No such queue",
                              f"The store has no jobs on queue {name!r} and no live worker serves it.")
        q = q or QueueStats(queue=name)
        samples = self.d.sampler.snapshot()
        recent = self.d.backend.list_jobs(queue=name, limit=20).jobs
        return self.render(
            request, "queue.html", now=stats.now, q=q, workers=workers, recent=recent, refresh=5,
            rate=recent_rate(samples, lambda s: float(s.succeeded), name),
            charts=[charts.throughput_chart(samples, name), charts.failures_chart(samples, name),
                    charts.backlog_chart(samples, name)],
        )

    def jobs(self, request: Request, _: dict[str, list[str]]) -> Response:
        query = parse_jobs_query(request.query_params)
        result = search_jobs(self.d.backend, query)
        queues = self._known_queues()
        tasks = sorted(self.d.conveyor.tasks)
        return self.render(request, "jobs.html", now=self.d.backend.now(), query=query, result=result,
                           queues=queues, tasks=tasks, search_window=SEARCH_WINDOW)

    def _known_queues(self) -> list[str]:
        samples = self.d.sampler.snapshot()
        names = set(samples[-1].queues) if samples else {q.queue for q in self.d.backend.stats().queues}
        names |= {t.queue for t in self.d.conveyor.tasks.values()}
        return sorted(names)

    def job(self, request: Request, _: dict[str, list[str]]) -> Response:
        job_id = int(request.path_params["job_id"])
        job = self.d.backend.get(job_id) if job_id <= MAX_JOB_ID else None
        if job is None:
            return self.error(request, 404, "No such job",
                              f"Job {job_id} is not in the store (it may have been purged or pruned).")
        now = self.d.backend.now()
        return self.render(request, "job.html", now=now, job=job, attempts=attempts_of(job),
                           args_json=fmt.to_json(job.args, pretty=True),
                           result_json=fmt.to_json(job.result, pretty=True) if job.result is not None else None,
                           meta_json=fmt.to_json(job.meta, pretty=True) if job.meta else None,
                           steps_json=fmt.to_json(job.steps, pretty=True) if job.steps else None,
                           cron_tick=(tick.isoformat() if (tick := tick_of(job)) else None), known_task=job.task in self.d.conveyor.tasks)

    def job_action(self, request: Request, form: dict[str, list[str]]) -> Response:
        job_id = int(request.path_params["job_id"])
        action = str(request.path_params["action"])
        if action not in JOB_ACTIONS:
            return self.error(request, 404, "Not found", "There is no such action.")
        job = self.d.backend.get(job_id) if job_id <= MAX_JOB_ID else None
        back = f"/jobs/{job_id}"
        if job is None:
            return self.redirect(request, "/jobs", f"Job {job_id} is not in the store.", "warn")
        confirmed = (form.get("confirmed") or [""])[0] == "yes"
        if not confirmed:
            verbs = {"retry": ("Retry", f"Send dead job #{job_id} back to queue {job.queue} with its attempts "
                                        "reset. Its errors are kept.", "primary"),
                     "cancel": ("Cancel job", f"Cancel job #{job_id}. A waiting job never runs; a running job's "
                                          "worker is told to stop it.", "danger"),
                     "purge": ("Purge", f"Delete dead job #{job_id} and its history from the store. "
                                        "This cannot be undone.", "danger")}
            verb, text, css = verbs[action]
            return self.render(request, "confirm.html", now=0.0, verb=verb, text=text, css=css, jobs=[job], more=0,
                               action_url=self.url(request, "job_action", job_id=job_id, action=action),
                               fields=[], back=back)
        if action == "retry":
            n = self.d.backend.redrive([job_id])
            if n:
                return self.redirect(request, back, f"Job #{job_id} is back on queue {job.queue}.")
            return self.redirect(request, back, f"Job #{job_id} was not retried: only dead jobs can be "
                                 "(or a newer job holds its unique key).", "warn")
        if action == "cancel":
            if self.d.conveyor.cancel(job_id):
                return self.redirect(request, back, f"Job #{job_id} is cancelled.")
            return self.redirect(request, back, f"Job #{job_id} was already finished.", "warn")
        n = self.d.backend.purge(state=JobState.DEAD, job_ids=[job_id])
        if n:
            return self.redirect(request, "/dead", f"Job #{job_id} was purged.")
        return self.redirect(request, back, f"Job #{job_id} was not purged: only dead jobs can be.", "warn")

    def dead(self, request: Request, _: dict[str, list[str]]) -> Response:
        params = request.query_params
        query = JobsQuery(state=JobState.DEAD, queue=parse_queue(_one(params, "queue")),
                          task=parse_task(_one(params, "task")), cursor=parse_cursor(_one(params, "cursor")),
                          limit=parse_limit(_one(params, "limit")))
        page = self.d.backend.list_jobs(state=JobState.DEAD, queue=query.queue, task=query.task,
                                        cursor=query.cursor, limit=query.limit)
        stats = self._stats(finished=False)
        by_queue = [(q.queue, q.dead) for q in stats.queues if q.dead]
        total = sum(n for _, n in by_queue)
        in_scope = dict(by_queue).get(query.queue, 0) if query.queue else total
        return self.render(request, "dead.html", now=stats.now, query=query, page=page, by_queue=by_queue,
                           total=total, in_scope=in_scope, nav_dead=total)

    def dead_action(self, request: Request, form: dict[str, list[str]]) -> Response:
        action = str(request.path_params["action"])
        if action not in DEAD_ACTIONS:
            return self.error(request, 404, "Not found", "There is no such action.")
        queue = parse_queue((form.get("queue") or [""])[0].strip())
        every = (form.get("all") or [""])[0] == "yes"
        ids = parse_ids(form.get("ids") or [])
        back = safe_next((form.get("next") or [""])[0], "/dead")
        if not every and not ids:
            return self.redirect(request, back, "Select one or more jobs first.", "warn")
        confirmed = (form.get("confirmed") or [""])[0] == "yes"
        verb = "Redrive" if action == "redrive" else "Purge"
        if not confirmed:
            fields = [("queue", queue or ""), ("next", back)]
            if every:
                stats = self._stats(finished=False)
                n = sum(q.dead for q in stats.queues if queue is None or q.queue == queue)
                where = f" on queue {queue}" if queue else ""
                text = (f"{verb} every dead job{where}: {n} job(s) now."
                        + (" They go back to their queues with attempts reset." if action == "redrive"
                           else " They are deleted from the store. This cannot be undone."))
                fields.append(("all", "yes"))
                jobs: list[Job] = []
            else:
                jobs = [j for j in (self.d.backend.get(i) for i in ids[:50]) if j is not None]
                text = (f"{verb} {len(ids)} selected dead job(s)."
                        + (" They go back to their queues with attempts reset." if action == "redrive"
                           else " They are deleted from the store. This cannot be undone."))
                fields += [("ids", str(i)) for i in ids]
            return self.render(request, "confirm.html", now=0.0, verb=verb, text=text,
                               css="primary" if action == "redrive" else "danger", jobs=jobs,
                               more=max(0, len(ids) - len(jobs)) if not every else 0,
                               action_url=self.url(request, "dead_action", action=action), fields=fields,
                               back=back)
        if action == "redrive":
            n = self.d.backend.redrive(None if every else ids, queue=queue)
            skipped = "" if every or n == len(ids) else f" ({len(ids) - n} were no longer dead, or a newer job holds their unique key)"
            return self.redirect(request, back, f"Redrove {n} job(s){skipped}.")
        n = self.d.backend.purge(state=JobState.DEAD, queue=queue, job_ids=None if every else ids)
        skipped = "" if every or n == len(ids) else f" ({len(ids) - n} were no longer dead)"
        return self.redirect(request, back, f"Purged {n} dead job(s){skipped}.")

    def workers(self, request: Request, _: dict[str, list[str]]) -> Response:
        stats = self._stats(finished=False)
        running = self.d.backend.list_jobs(state=JobState.RUNNING, limit=500)
        by_worker: dict[str, list[Job]] = {}
        for job in running.jobs:
            by_worker.setdefault(job.worker_id or "", []).append(job)
        live = {w.id for w in stats.workers}
        orphans = [j for wid, jobs in by_worker.items() if wid not in live for j in jobs]
        lease = self.d.conveyor.visibility_timeout
        return self.render(request, "workers.html", now=stats.now, nav_dead=sum(q.dead for q in stats.queues),
                           workers=stats.workers, by_worker=by_worker,
                           orphans=orphans, more_running=running.next_cursor is not None, refresh=5,
                           stale_after=max(lease / 3 * 2, 5.0))

    def cron(self, request: Request, _: dict[str, list[str]]) -> Response:
        from .cronview import cron_rows

        now = self.d.backend.now()
        rows, note = cron_rows(self.d.conveyor, self.d.backend, now)
        return self.render(request, "cron.html", now=now, rows=rows, note=note, refresh=15)

    # -- authentication ------------------------------------------------------------------------
    def login(self, request: Request, _: dict[str, list[str]]) -> Response:
        if self.d.auth.token is None:
            return self.error(request, 404, "Not found", "This dashboard has no token login.")
        nxt = safe_next(request.query_params.get("next", ""), "/")
        return self.render(request, "login.html", now=0.0, next=nxt, failed=False)

    def login_post(self, request: Request, form: dict[str, list[str]]) -> Response:
        if self.d.auth.token is None:
            return self.error(request, 404, "Not found", "This dashboard has no token login.")
        nxt = safe_next((form.get("next") or [""])[0], "/")
        client = client_of(request.scope)
        throttle = self.d.auth.guard.throttle
        if wait := throttle.wait(client):
            seconds = max(1, math.ceil(wait))
            response = self.render(request, "login.html", status=429, now=0.0, next=nxt, failed=False, wait=seconds)
            response.headers["retry-after"] = str(seconds)
            return response
        if not token_matches(self.d.auth, (form.get("token") or [""])[0].strip()):
            throttle.failed(client)
            log.warning("dashboard: failed login from %s", client)
            return self.render(request, "login.html", status=401, now=0.0, next=nxt, failed=True)
        throttle.succeeded(client)
        response = self.redirect(request, nxt)
        state = request.scope.get("state", {})
        response.raw_headers.append((b"set-cookie", cookie_header(
            SESSION_COOKIE, self.d.auth.new_session(), path=state.get("cookie_path", "/"),
            secure=state.get("secure_cookies", False), max_age=int(SESSION_TTL))))
        return response

    def logout(self, request: Request, _: dict[str, list[str]]) -> Response:
        session = request.cookies.get(SESSION_COOKIE)
        if session:
            self.d.auth.revoke(session)
        response = self.redirect(request, "/login" if self.d.auth.token is not None else "/")
        state = request.scope.get("state", {})
        response.raw_headers.append((b"set-cookie", cookie_header(
            SESSION_COOKIE, "", path=state.get("cookie_path", "/"), secure=state.get("secure_cookies", False),
            max_age=0)))
        return response

    def healthz(self, request: Request, _: dict[str, list[str]]) -> Response:
        try:
            self.d.backend.now()
        except Exception as exc:
            log.warning("dashboard: health check: store unavailable: %s", exc)
            return JSONResponse({"status": "store unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("conveyor")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "dev"

