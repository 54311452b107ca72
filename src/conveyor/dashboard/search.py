"""Text search over jobs: a bounded window per request, newest first, with a cursor to go on."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..backends.base import Backend
from ..job import Job
from . import formatting as fmt
from .params import JobsQuery

SEARCH_WINDOW = 2000  # jobs a text search looks at per request, newest first
SEARCH_CHARS = 4_000  # of each job's arguments and of each error message a text search reads
SEARCH_BATCH = 500
SEARCH_CALLS = 40  # list_jobs calls per search request, at most (Redis pages can come back short)
ID_QUERY = re.compile(r"#?\s*(\d{1,18})")


@dataclass
class SearchResult:
    jobs: list[Job]
    next_cursor: int | None
    scanned: int = 0
    window_full: bool = False  # stopped at SEARCH_WINDOW before the end of the store
    exact: Job | None = None



def job_text(job: Job) -> str:
    """What text search looks in: the args (with secrets masked), the unique key, error messages."""
    parts = [fmt.to_json(job.args, limit=SEARCH_CHARS), job.unique_key or ""]
    parts += [fmt.mask(f"{e.get('type') or ''} {e.get('message') or ''}", SEARCH_CHARS)
              for e in job.errors]
    return "\n".join(parts).lower()


def search_jobs(backend: Backend, query: JobsQuery) -> SearchResult:
    """One page of jobs matching the filters and, with ``q``, the text. An id (``123`` or
    ``#123``) is also looked up exactly. The text scan reads at most SEARCH_WINDOW jobs per
    request, newest first, and returns a cursor to scan on from where it stopped."""
    exact = None
    if query.q and (m := ID_QUERY.fullmatch(query.q)) and query.cursor is None:
        exact = backend.get(int(m.group(1)))
    if not query.q:
        page = backend.list_jobs(state=query.state, queue=query.queue, task=query.task,
                                 cursor=query.cursor,
                                 limit=query.limit)
        return SearchResult(page.jobs, page.next_cursor, scanned=len(page.jobs))
    needle = query.q.lower()
    found: list[Job] = []
    scanned = 0
    cursor = query.cursor
    for _ in range(SEARCH_CALLS):
        batch = min(SEARCH_BATCH, SEARCH_WINDOW - scanned)
        page = backend.list_jobs(state=query.state, queue=query.queue, task=query.task,
                                 cursor=cursor,
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
