"""Big job data in the views: many dead jobs each carrying a 60,000-character argument, and
succeeded jobs with results just under max_result_bytes (1 MiB). Every dashboard page, a
text search over the whole window and the CLI's lists answer, clipped and without secrets;
the figures are how long each took (nothing here asserts a time)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from click.testing import CliRunner
from scalekit import report, size
from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor import cli as cli_mod
from conveyor.backends.base import ErrorInfo, Lease, NewJob
from conveyor.dashboard import create_app
from conveyor.payload import DEFAULT_MAX_RESULT_BYTES
from conveyor.redact import mask_text

SECRET = "hunter2-canary"
ARG_CHARS = 60_000


def seed(app: Conveyor, dead: int, big_results: int) -> tuple[list[int], list[int]]:
    b = app.backend
    dead_ids: list[int] = []
    for start in range(0, dead, 100):
        n = min(100, dead - start)
        b.enqueue_many([NewJob(task="t.bad", queue="big", max_attempts=1, timeout=30, args=json.dumps(
            {"blob": "A:" * (ARG_CHARS // 2), "dsn": f"postgres://u:{SECRET}@db/x", "i": start + i}))
            for i in range(n)])
        for job in b.claim("big", n, worker_id="w", lease_s=60):
            assert job.lease_token
            b.kill(Lease(job.id, job.lease_token), ErrorInfo(
                "exception", f"token={SECRET} " + "x://a:" * 300, "ValueError", "a@" * 2_000))
            dead_ids.append(job.id)
    result_ids: list[int] = []
    value = f"redis://:{SECRET}@cache/0 " + "x" * (DEFAULT_MAX_RESULT_BYTES - 100)
    for _ in range(big_results):
        [res] = b.enqueue_many([NewJob(task="t.big", queue="res", args="{}", max_attempts=1, timeout=30)])
        [job] = b.claim("res", 1, worker_id="w", lease_s=60)
        assert job.lease_token
        b.ack(Lease(job.id, job.lease_token), json.dumps(value))
        result_ids.append(res.id)
    return dead_ids, result_ids


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t0, 3)


def test_views_of_big_values(app: Conveyor, store_url: str) -> None:
    dead, big = size(ci=(20, 2), full=(2_000, 20))
    (dead_ids, result_ids), seed_s = timed(lambda: seed(app, dead, big))
    figures: dict[str, Any] = {"dead_jobs": dead, "arg_chars": ARG_CHARS, "big_results": big, "seed_s": seed_s}

    d = create_app(app, sample_interval=3600)
    try:
        with TestClient(d, base_url="http://127.0.0.1:8000", client=("127.0.0.1", 50123)) as client:
            pages = {"overview": "/", "dead": "/dead", "jobs": "/jobs", "search": "/jobs?q=zzz-not-there",
                     "dead_job": f"/jobs/{dead_ids[-1]}", "big_result": f"/jobs/{result_ids[-1]}"}
            for name, path in pages.items():
                page, figures[f"{name}_s"] = timed(lambda path=path: client.get(path))
                assert page.status_code == 200, path
                assert SECRET not in page.text and len(page.text) < 400_000, path
    finally:
        d.close()

    runner = CliRunner()
    for name, args in {"cli_jobs_list": ["jobs", "list", "--limit", "50"],
                       "cli_dlq_list": ["dlq", "list", "--limit", "50"],
                       "cli_show_result": ["jobs", "show", str(result_ids[-1])],
                       "cli_show_dead": ["dlq", "show", str(dead_ids[-1])]}.items():
        out, figures[f"{name}_s"] = timed(lambda args=args: runner.invoke(cli_mod.cli, ["--url", store_url, *args]))
        assert out.exit_code == 0, out.output
        assert SECRET not in out.output and len(out.output) < 200_000, name

    hostile = "a:" * 5_000_000
    _, figures["mask_10MB_s"] = timed(lambda: mask_text(hostile))
    report("views_of_big_values", app.backend.__class__.__name__, **figures)
