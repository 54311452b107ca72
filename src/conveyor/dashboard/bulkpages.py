"""Error groups and bulk actions in the dashboard (issue 38): the group page
(``/errors/<key>``), and ``/bulk/<action>`` acting on any filter in batches.

A bulk action is three steps, each a POST (CSRF-checked and authenticated by the security
middleware, as every action): without ``confirmed`` it shows the count ("Cancel 1,234 jobs?");
confirmed, it runs one batch (``Backend.bulk``) and, while more remain, answers a progress page
whose form posts the next batch with the cursor (sent by a small script, or by hand); the last
batch redirects with what was done.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import bulk
from ..bulk import BulkAction, JobFilter
from ..errorgroups import ErrorGroups
from ..job import JobState
from .params import BadRequest, one, parse_queue, parse_state, parse_task, safe_next
from .rendering import Rendering

KEY_RE = re.compile(r"[0-9a-f]{16}")
GROUPS_SHOWN = 20  # groups on the dead page
GROUP_JOBS = 50  # jobs listed on a group's page
VERBS = {BulkAction.RETRY: ("Retry", "Retried", "primary"),
         BulkAction.RUN_NOW: ("Run now", "Made due", "primary"),
         BulkAction.CANCEL: ("Cancel", "Cancelled", "danger"),
         BulkAction.DELETE: ("Delete", "Deleted", "danger")}
EXPLAIN = {BulkAction.RETRY: "Dead jobs go back to their queues with attempts reset; failed "
                             "jobs waiting for a retry run now.",
           BulkAction.RUN_NOW: "Scheduled jobs become due now.",
           BulkAction.CANCEL: "Unfinished jobs are cancelled; a running job's worker is told to "
                              "stop it, and jobs waiting on a cancelled one are cancelled too.",
           BulkAction.DELETE: "Finished jobs are deleted from the store. This cannot be undone."}


def parse_key(value: str) -> str | None:
    if not value:
        return None
    if not KEY_RE.fullmatch(value):
        raise BadRequest("an error group key is 16 hex digits")
    return value


def parse_float(value: str, name: str) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise BadRequest(f"{name} must be unix seconds") from None


def filter_from(form: dict[str, list[str]]) -> JobFilter:
    def get(name: str) -> str:
        return (form.get(name) or [""])[0].strip()

    field = get("time_field") or "created_at"
    if field not in ("created_at", "finished_at"):
        raise BadRequest("time_field is created_at or finished_at")
    return JobFilter(state=parse_state(get("state")), queue=parse_queue(get("queue")),
                     task=parse_task(get("task")), error_group=parse_key(get("error_group")),
                     since=parse_float(get("since"), "since"),
                     until=parse_float(get("until"), "until"),
                     time_field="finished_at" if field == "finished_at" else "created_at",
                     search=get("q")[:256] or None)


def filter_fields(where: JobFilter) -> list[tuple[str, str]]:
    """The hidden fields that carry ``where`` to the next POST."""
    fields = [("state", where.state.value if where.state else ""), ("queue", where.queue or ""),
              ("task", where.task or ""), ("error_group", where.error_group or ""),
              ("q", where.search or ""), ("time_field", where.time_field)]
    fields += [(name, repr(v)) for name, v in (("since", where.since), ("until", where.until))
               if v is not None]
    return fields


class BulkPages(Rendering):
    def routes(self) -> list[Route]:
        return [
            Route("/errors/{key}", self._page(self.group), methods=["GET", "HEAD"],
                  name="error_group"),
            Route("/bulk/{action}", self._page(self.bulk_action, form=True), methods=["POST"],
                  name="bulk_action"),
        ]

    def groups(self, state: JobState = JobState.DEAD) -> ErrorGroups:
        return self.d.backend.error_groups(state=state, limit=GROUPS_SHOWN)

    def group(self, request: Request, _: dict[str, list[str]]) -> Response:
        key = str(request.path_params["key"])
        state = parse_state(one(request.query_params, "state")) or JobState.DEAD
        if state not in (JobState.DEAD, JobState.SCHEDULED):
            raise BadRequest("error groups are of dead or scheduled jobs")
        found = self.d.backend.error_groups(state=state, limit=10_000)
        group = found.find(key) if KEY_RE.fullmatch(key) else None
        if group is None:
            return self.error(request, 404, "No such error group",
                              "No job has this error now (redriven, purged, or the key is "
                              "wrong).")
        where = JobFilter(state=state, task=group.task, error_group=key)
        jobs, _looked, more = bulk.select(self.d.backend, BulkAction.RETRY, where, limit=GROUP_JOBS,
                                    cursor=None, scan=bulk.COUNT_SCAN)
        return self.render(request, "error_group.html", now=self.d.backend.now(), group=group,
                           jobs=jobs, more=more is not None, state=state.value,
                           complete=found.complete, scanned=found.scanned)

    def bulk_action(self, request: Request, form: dict[str, list[str]]) -> Response:
        try:
            action = BulkAction(str(request.path_params["action"]))
        except ValueError:
            return self.error(request, 404, "Not found", "There is no such action.")
        where = filter_from(form)
        back = safe_next((form.get("next") or [""])[0], "/jobs")
        verb, done_verb, css = VERBS[action]
        url = self.url(request, "bulk_action", action=action.value)
        fields = [*filter_fields(where), ("next", back)]
        if (form.get("confirmed") or [""])[0] != "yes":
            n, exact = bulk.count(self.d.backend, action, where)
            if n == 0:
                return self.redirect(request, back, f"No job matches: nothing to {verb.lower()}.",
                                     "warn")
            shown = f"{n:,}" if exact else f"at least {n:,}"
            return self.render(request, "confirm.html", now=0.0,
                               verb=f"{verb} {shown} job{'s' if n != 1 else ''}",
                               text=EXPLAIN[action] + " Done in batches of "
                               f"{bulk.BULK_BATCH}.", css=css, jobs=[], more=0,
                               action_url=url, fields=fields, back=back)
        done = _int((form.get("done") or [""])[0])
        cursor = _int((form.get("cursor") or [""])[0]) or None
        result = self.d.backend.bulk(action, where, cursor=cursor)
        done += result.done
        if not result.more:
            return self.redirect(request, back, f"{done_verb} {done:,} job(s).")
        fields += [("confirmed", "yes"), ("done", str(done)), ("cursor", str(result.cursor))]
        return self.render(request, "bulk_progress.html", now=0.0, verb=verb, done=done,
                           action_url=url, fields=fields, back=back)


def _int(value: str) -> int:
    return int(value) if value.isdigit() and len(value) < 19 else 0
