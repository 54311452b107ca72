"""The routes: every page and action of the dashboard. Handlers are plain functions run on
the thread pool (backends are sync); rendering and redirects are in rendering.py."""

from __future__ import annotations

import math
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..backends.base import QueueStats
from ..cron import tick_of
from ..job import Job, JobState
from . import charts, counts, search
from . import formatting as fmt
from .bulkpages import BulkPages
from .historyview import history_view, parse_range
from .params import (
    JobsQuery,
    one,
    parse_cursor,
    parse_ids,
    parse_jobs_query,
    parse_limit,
    parse_queue,
    parse_task,
    safe_next,
)
from .rendering import Rendering, log
from .security import SESSION_COOKIE, SESSION_TTL, client_of, cookie_header, token_matches
from .state import HERE
from .views import QueueRow, attempts_of, recent_rate, workers_by_queue

JOB_ACTIONS = ("retry", "cancel", "purge")
DEAD_ACTIONS = ("redrive", "purge")
CRON_ACTIONS = ("run", "disable", "enable")
QUEUE_ACTIONS = ("pause", "resume")
MAX_JOB_ID = 2**63 - 1  # every store keeps ids in a signed 64-bit integer
MAX_BATCH_ID_CHARS = 255  # app.batch ids are 32 hex digits: anything far longer is no batch
# Seconds between live refreshes (dashboard.js bounds them and backs off in a hidden tab).
LIST_REFRESH = 5
JOB_REFRESH = 2
FINAL_JOB_REFRESH = 10


class Pages(Rendering):
    """The routes. Handlers are plain functions run on the thread pool (backends are sync)."""

    @property
    def _bulk(self) -> BulkPages:
        return BulkPages(self.d)

    def routes(self) -> list[Route | Mount]:
        get, post = ["GET", "HEAD"], ["POST"]
        return [
            Route("/", self._page(self.overview), methods=get, name="overview"),
            Route("/queues/{queue}", self._page(self.queue), methods=get, name="queue"),
            Route("/queues/{queue}/{action}", self._page(self.queue_action, form=True),
                  methods=post, name="queue_action"),
            Route("/jobs", self._page(self.jobs), methods=get, name="jobs"),
            Route("/jobs/{job_id:int}", self._page(self.job), methods=get, name="job"),
            Route("/jobs/{job_id:int}/{action}", self._page(self.job_action, form=True),
                  methods=post, name="job_action"),
            Route("/batches/{batch_id}", self._page(self.batch), methods=get, name="batch"),
            Route("/dead", self._page(self.dead), methods=get, name="dead"),
            Route("/dead/{action}", self._page(self.dead_action, form=True), methods=post,
                  name="dead_action"),
            *self._bulk.routes(),
            Route("/workers", self._page(self.workers), methods=get, name="workers"),
            Route("/cron", self._page(self.cron), methods=get, name="cron"),
            Route("/cron/{schedule}/{action}", self._page(self.cron_action, form=True),
                  methods=post, name="cron_action"),
            Route("/login", self._page(self.login), methods=get, name="login"),
            Route("/login", self._page(self.login_post, form=True), methods=post,
                  name="login_post"),
            Route("/logout", self._page(self.logout, form=True), methods=post, name="logout"),
            Route("/healthz", self._page(self.healthz, sample=False), methods=get, name="healthz"),
            Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
        ]

    # -- pages -------------------------------------------------------------------------------
    def overview(self, request: Request, _: dict[str, list[str]]) -> Response:
        stats = self.d.backend.stats()
        self.d.sampler.observe(stats)
        samples = self.d.sampler.snapshot()
        serving = workers_by_queue(stats.workers)
        rows = [QueueRow(q, recent_rate(samples, lambda s: float(s.succeeded), q.queue),
                         charts.sparkline(samples, q.queue), serving.get(q.queue, 0))
                for q in stats.queues]
        ages = [q.oldest_available_age for q in stats.queues]
        totals = {
            "waiting": sum(q.depth for q in stats.queues),
            "scheduled": sum(q.scheduled for q in stats.queues),
            "running": sum(q.running for q in stats.queues),
            "dead": sum(q.dead for q in stats.queues),
            "succeeded": sum(q.succeeded for q in stats.queues),
            "oldest": max((age for age in ages if age is not None), default=None),
        }
        return self.render(
            request, "overview.html", now=stats.now, stats=stats, rows=rows, totals=totals,
            running=counts.running_counts(stats, self.d.backend),
            throughput=counts.throughput(samples), per_second=counts.per_second,
            nav_dead=totals["dead"], alerts=self.d.sampler.alerts(), refresh=5,
            interval=self.d.sampler.interval,
            charts=_live([charts.throughput_chart(samples), charts.failures_chart(samples),
                          charts.backlog_chart(samples)]),
            history=history_view(self.d.backend, parse_range(request.query_params.get("range")),
                                 now=stats.now),
        )

    def queue(self, request: Request, _: dict[str, list[str]]) -> Response:
        name = parse_queue(str(request.path_params["queue"]))
        assert name is not None
        stats = self._stats()
        q = next((x for x in stats.queues if x.queue == name), None)
        workers = [w for w in stats.workers if name in w.queues]
        if q is None and not workers:
            return self.error(request, 404, "No such queue",
                              f"The store has no jobs on queue {name!r} and no live worker "
                              "serves it.")
        q = q or QueueStats(queue=name)
        samples = self.d.sampler.snapshot()
        recent = self.d.backend.list_jobs(queue=name, limit=20).jobs
        return self.render(
            request, "queue.html", now=stats.now, q=q, workers=workers, recent=recent, refresh=5,
            rate=recent_rate(samples, lambda s: float(s.succeeded), name),
            charts=_live([charts.throughput_chart(samples, name),
                          charts.failures_chart(samples, name),
                          charts.backlog_chart(samples, name)]),
            history=history_view(self.d.backend, parse_range(request.query_params.get("range")),
                                 now=stats.now, queue=name),
        )

    def queue_action(self, request: Request, form: dict[str, list[str]]) -> Response:
        """Pause or resume a queue: one click, no confirmation page. Neither loses or changes a
        job, and in an incident the button should act at once (running jobs finish)."""
        name = parse_queue(str(request.path_params["queue"]))
        assert name is not None
        action = str(request.path_params["action"])
        if action not in QUEUE_ACTIONS:
            return self.error(request, 404, "Not found", "There is no such action.")
        back = safe_next((form.get("next") or [""])[0], f"/queues/{quote(name, safe=':')}")
        if action == "pause":
            if self.d.backend.pause_queue(name):
                return self.redirect(request, back, f"Queue {name} is paused: workers take none "
                                     "of its jobs; the running ones finish.")
            return self.redirect(request, back, f"Queue {name} was paused already.", "warn")
        if self.d.backend.resume_queue(name):
            return self.redirect(request, back, f"Queue {name} is resumed.")
        return self.redirect(request, back, f"Queue {name} was not paused.", "warn")

    def jobs(self, request: Request, _: dict[str, list[str]]) -> Response:
        query = parse_jobs_query(request.query_params)
        result = search.search_jobs(self.d.backend, query)
        queues = self._known_queues()
        tasks = sorted(self.d.conveyor.tasks)
        return self.render(request, "jobs.html", now=self.d.backend.now(), query=query,
                           result=result, queues=queues, tasks=tasks,
                           search_window=search.SEARCH_WINDOW,
                           # a text search scans a window of jobs per load: refreshed less often
                           refresh=LIST_REFRESH * 3 if query.q else LIST_REFRESH)

    def _known_queues(self) -> list[str]:
        samples = self.d.sampler.snapshot()
        if samples:
            names = set(samples[-1].queues)
        else:
            names = {q.queue for q in self.d.backend.stats().queues}
        names |= {t.queue for t in self.d.conveyor.tasks.values()}
        return sorted(names)

    def job(self, request: Request, _: dict[str, list[str]]) -> Response:
        job_id = int(request.path_params["job_id"])
        job = self.d.backend.get(job_id) if job_id <= MAX_JOB_ID else None
        if job is None:
            return self.error(request, 404, "No such job",
                              f"Job {job_id} is not in the store (it may have been purged or "
                              "pruned).")
        now = self.d.backend.now()
        has_result = job.result is not None
        tick = tick_of(job)
        return self.render(request, "job.html", now=now, job=job, attempts=attempts_of(job),
                           args_json=fmt.to_json(job.args, pretty=True),
                           result_json=fmt.to_json(job.result, pretty=True) if has_result else None,
                           meta_json=fmt.to_json(job.meta, pretty=True) if job.meta else None,
                           steps_json=fmt.to_json(job.steps, pretty=True) if job.steps else None,
                           cron_tick=tick.isoformat() if tick else None,
                           known_task=job.task in self.d.conveyor.tasks,
                           # only a redrive moves a finished job on: watched less closely
                           refresh=FINAL_JOB_REFRESH if job.is_final else JOB_REFRESH)

    def batch(self, request: Request, _: dict[str, list[str]]) -> Response:
        batch_id = str(request.path_params["batch_id"])
        info = (self.d.backend.get_batch(batch_id) if len(batch_id) <= MAX_BATCH_ID_CHARS
                else None)
        if info is None:
            return self.error(request, 404, "No such batch",
                              "The store has no such batch (never written, or pruned with its "
                              "last member).")
        return self.render(request, "batch.html", now=self.d.backend.now(), info=info)

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
            verbs = {"retry": ("Retry", f"Send dead job #{job_id} back to queue {job.queue} with "
                                        "its attempts reset. Its errors are kept.", "primary"),
                     "cancel": ("Cancel job", f"Cancel job #{job_id}. A waiting job never runs; a "
                                              "running job's worker is told to stop it.", "danger"),
                     "purge": ("Purge", f"Delete dead job #{job_id} and its history from the "
                                        "store. This cannot be undone.", "danger")}
            verb, text, css = verbs[action]
            action_url = self.url(request, "job_action", job_id=job_id, action=action)
            return self.render(request, "confirm.html", now=0.0, verb=verb, text=text, css=css,
                               jobs=[job], more=0, action_url=action_url, fields=[], back=back)
        if action == "retry":
            n = self.d.backend.redrive([job_id])
            if n:
                return self.redirect(request, back, f"Job #{job_id} is back on queue {job.queue}.")
            return self.redirect(request, back, f"Job #{job_id} was not retried: only dead jobs "
                                 "can be (or a newer job holds its unique key).", "warn")
        if action == "cancel":
            if self.d.conveyor.cancel(job_id):
                return self.redirect(request, back, f"Job #{job_id} is cancelled.")
            return self.redirect(request, back, f"Job #{job_id} was already finished.", "warn")
        n = self.d.backend.purge(state=JobState.DEAD, job_ids=[job_id])
        if n:
            return self.redirect(request, "/dead", f"Job #{job_id} was purged.")
        return self.redirect(request, back,
                             f"Job #{job_id} was not purged: only dead jobs can be.", "warn")

    def dead(self, request: Request, _: dict[str, list[str]]) -> Response:
        params = request.query_params
        query = JobsQuery(state=JobState.DEAD, queue=parse_queue(one(params, "queue")),
                          task=parse_task(one(params, "task")),
                          cursor=parse_cursor(one(params, "cursor")),
                          limit=parse_limit(one(params, "limit")))
        page = self.d.backend.list_jobs(state=JobState.DEAD, queue=query.queue, task=query.task,
                                        cursor=query.cursor, limit=query.limit)
        stats = self._stats(finished=False)
        by_queue = [(q.queue, q.dead) for q in stats.queues if q.dead]
        total = sum(n for _, n in by_queue)
        in_scope = dict(by_queue).get(query.queue, 0) if query.queue else total
        groups = self._bulk.groups() if query.cursor is None else None
        return self.render(request, "dead.html", now=stats.now, query=query, page=page,
                           by_queue=by_queue, total=total, in_scope=in_scope, nav_dead=total,
                           groups=groups, refresh=LIST_REFRESH)

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
        if action == "redrive":
            outcome = " They go back to their queues with attempts reset."
        else:
            outcome = " They are deleted from the store. This cannot be undone."
        if not confirmed:
            fields = [("queue", queue or ""), ("next", back)]
            if every:
                stats = self._stats(finished=False)
                n = sum(q.dead for q in stats.queues if queue is None or q.queue == queue)
                where = f" on queue {queue}" if queue else ""
                text = f"{verb} every dead job{where}: {n} job(s) now." + outcome
                fields.append(("all", "yes"))
                jobs: list[Job] = []
            else:
                jobs = [j for j in (self.d.backend.get(i) for i in ids[:50]) if j is not None]
                text = f"{verb} {len(ids)} selected dead job(s)." + outcome
                fields += [("ids", str(i)) for i in ids]
            return self.render(request, "confirm.html", now=0.0, verb=verb, text=text,
                               css="primary" if action == "redrive" else "danger", jobs=jobs,
                               more=max(0, len(ids) - len(jobs)) if not every else 0,
                               action_url=self.url(request, "dead_action", action=action),
                               fields=fields, back=back)
        if action == "redrive":
            n = self.d.backend.redrive(None if every else ids, queue=queue)
            skipped = ""
            if not every and n != len(ids):
                skipped = (f" ({len(ids) - n} were no longer dead, or a newer job holds their "
                           "unique key)")
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
        return self.render(request, "workers.html", now=stats.now,
                           nav_dead=sum(q.dead for q in stats.queues),
                           workers=stats.workers, by_worker=by_worker,
                           orphans=orphans, more_running=running.next_cursor is not None, refresh=5,
                           stale_after=max(lease / 3 * 2, 5.0))

    def cron(self, request: Request, _: dict[str, list[str]]) -> Response:
        from .cronview import cron_rows

        now = self.d.backend.now()
        rows, note = cron_rows(self.d.conveyor, self.d.backend, now)
        return self.render(request, "cron.html", now=now, rows=rows, note=note, refresh=15)

    def cron_action(self, request: Request, _: dict[str, list[str]]) -> Response:
        """Run a schedule now, or disable or enable it (kept in the store: every scheduler
        honours it). Plain buttons, no confirmation page: each is undone by another."""
        from ..cron import run_now

        name = str(request.path_params["schedule"])
        action = str(request.path_params["action"])
        if action not in CRON_ACTIONS:
            return self.error(request, 404, "Not found", "There is no such action.")
        if name not in self.d.conveyor.schedules:
            return self.redirect(request, "/cron", "There is no cron schedule of that name on "
                                 "this app.", "warn")
        if action == "run":
            made = run_now(self.d.conveyor, name)
            return self.redirect(request, f"/jobs/{made.id}",
                                 f"Schedule {name}: job #{made.id} enqueued, run by hand.")
        enable = action == "enable"
        if self.d.backend.set_cron_enabled(name, enable):
            text = (f"Schedule {name} is enabled: it runs again from its next tick." if enable
                    else f"Schedule {name} is disabled: its ticks enqueue nothing.")
            return self.redirect(request, "/cron", text)
        return self.redirect(request, "/cron",
                             f"Schedule {name} was already {action}d.", "warn")

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
            response = self.render(request, "login.html", status=429, now=0.0, next=nxt,
                                   failed=False, wait=seconds)
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
            SESSION_COOKIE, "", path=state.get("cookie_path", "/"),
            secure=state.get("secure_cookies", False), max_age=0)))
        return response

    def healthz(self, request: Request, _: dict[str, list[str]]) -> Response:
        try:
            self.d.backend.now()
        except Exception as exc:
            log.warning("dashboard: health check: store unavailable: %s", exc)
            return JSONResponse({"status": "store unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})


def _live(drawn: list[charts.Chart]) -> list[charts.Chart]:
    """The charts of this dashboard's own samples, titled as live (the store's history is
    charted beside them)."""
    for c in drawn:
        c.title = f"Live {c.title.lower()}"
    return drawn
