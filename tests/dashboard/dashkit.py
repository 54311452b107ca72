"""Helpers for the dashboard tests: an HTTP client from loopback, forms with a CSRF token and
an Origin, and jobs made through the store's own transitions."""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.testclient import TestClient

from conveyor.backends.base import Backend, ErrorInfo, Lease, NewJob

BASE = "http://127.0.0.1:8000"
ORIGIN = {"Origin": BASE}
CSRF_RE = re.compile(r'name="csrf_token" value="([0-9a-f]{64})"')


def make_client(app: Any, *, base_url: str = BASE, client: tuple[str, int] = ("127.0.0.1", 50123),
                **kwargs: Any) -> TestClient:
    return TestClient(app, base_url=base_url, client=client, follow_redirects=False, **kwargs)


def csrf_of(client: TestClient, path: str = "/dead") -> str:
    """The CSRF token a page of the dashboard hands this client (its cookie is kept by the client)."""
    r = client.get(path)
    assert r.status_code == 200, r.text
    m = CSRF_RE.search(r.text)
    assert m, "no CSRF token on the page"
    return m.group(1)


def post(client: TestClient, path: str, data: dict[str, Any], *, token: str | None = None,
         headers: dict[str, str] | None = None) -> Any:
    form = dict(data)
    form.setdefault("csrf_token", token if token is not None else csrf_of(client))
    return client.post(path, data=form, headers={**ORIGIN, **(headers or {})})


def kill_job(backend: Backend, queue: str = "default", *, task: str = "t.fail", args: dict[str, Any] | None = None,
             message: str = "boom", traceback: str = "Traceback (most recent call last):\n  ...\nValueError: boom",
             worker: str = "w-test", unique_key: str | None = None) -> int:
    """A dead job made through the store's own transitions: enqueue, claim, kill."""
    [res] = backend.enqueue_many([NewJob(task=task, queue=queue, args=json.dumps(args or {"n": 1}),
                                         max_attempts=3, timeout=30, unique_key=unique_key)])
    jobs = backend.claim(queue, 1, worker_id=worker, lease_s=30)
    assert [j.id for j in jobs] == [res.id], "the store handed out another job: use a fresh queue"
    job = jobs[0]
    assert job.lease_token is not None
    backend.kill(Lease(job.id, job.lease_token), ErrorInfo("exception", message, "ValueError", traceback))
    return res.id


def enqueue(backend: Backend, queue: str = "default", *, task: str = "t.task", args: dict[str, Any] | None = None,
            n: int = 1, delay: float = 0.0) -> list[int]:
    results = backend.enqueue_many([
        NewJob(task=task, queue=queue, args=json.dumps(args if args is not None else {"i": i}), max_attempts=3,
               timeout=30, delay=delay)
        for i in range(n)
    ])
    return [r.id for r in results]
