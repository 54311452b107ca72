"""examples/fastapi_orders: the order and its receipt job commit together, or not at all."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from support import running_worker, wait_for_job

from conveyor import JobState
from conveyor.cli import load_app


@pytest.fixture
def shop(pg_url: str, load_example: Callable[..., ModuleType]) -> Iterator[tuple[ModuleType, TestClient]]:
    web = load_example("fastapi_orders.web", DATABASE_URL=pg_url)
    with TestClient(web.api) as client:  # runs the lifespan: tables, pool, Conveyor's store
        r = client.post("/products", json={"sku": "mug", "price_cents": 1200, "in_stock": 3})
        assert r.status_code == 201, r.text
        yield web, client


def _count(pg_url: str, table: str) -> int:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # table names are ours
    assert row is not None
    return int(row[0])


def _all_jobs(web: ModuleType) -> list[Any]:
    return list(web.jobs.app.backend.list_jobs(limit=100).jobs)


def test_an_order_commits_with_its_job_and_the_worker_issues_one_receipt(
    shop: tuple[ModuleType, TestClient], pg_url: str
) -> None:
    web, client = shop
    r = client.post("/orders", json={"email": "ada@example.com", "lines": [{"sku": "mug", "quantity": 2}]})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["total_cents"] == 2400

    app = web.jobs.app
    job = app.get_job(body["receipt_job_id"])
    assert job.state is JobState.AVAILABLE
    assert job.task == "fastapi_orders.jobs.issue_receipt" and job.queue == "receipts"
    assert job.args == {"order_id": body["order_id"]}
    assert client.get(f"/orders/{body['order_id']}").json()["receipt_issued"] is False

    # The worker the README starts: `conveyor --app fastapi_orders.jobs:app worker`.
    assert load_app("fastapi_orders.jobs:app") is app
    with running_worker(app, queues="receipts"):
        done = wait_for_job(app, job.id)
    assert done.state is JobState.SUCCEEDED, done.errors
    assert done.result == {"order_id": body["order_id"]}
    assert done.attempts == 1

    assert client.get(f"/orders/{body['order_id']}").json()["receipt_issued"] is True
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT order_id, total_cents FROM receipts").fetchall() == [(body["order_id"], 2400)]
        assert conn.execute("SELECT in_stock FROM products WHERE sku = 'mug'").fetchone() == (1,)
    assert [j.id for j in _all_jobs(web)] == [job.id]


def test_a_failed_request_rolls_back_the_order_and_its_job(
    shop: tuple[ModuleType, TestClient], pg_url: str
) -> None:
    web, client = shop
    # The job is enqueued before the stock check fails: the rollback takes it away too.
    r = client.post("/orders", json={"email": "bob@example.com", "lines": [{"sku": "mug", "quantity": 5}]})
    assert r.status_code == 409, r.text
    assert "not enough" in r.json()["detail"]

    assert _all_jobs(web) == []
    assert _count(pg_url, "orders") == 0
    assert _count(pg_url, "order_lines") == 0
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT in_stock FROM products WHERE sku = 'mug'").fetchone() == (3,)

    # A worker finds nothing to do, and the next good order still goes through.
    r = client.post("/orders", json={"email": "bob@example.com", "lines": [{"sku": "mug", "quantity": 3}]})
    assert r.status_code == 201, r.text
    app = web.jobs.app
    with running_worker(app, queues="receipts"):
        done = wait_for_job(app, r.json()["receipt_job_id"])
    assert done.state is JobState.SUCCEEDED
    assert _count(pg_url, "receipts") == 1
    assert len(_all_jobs(web)) == 1


def test_a_receipt_for_a_missing_order_goes_to_the_dead_letter_queue(
    shop: tuple[ModuleType, TestClient],
) -> None:
    web, _client = shop
    app = web.jobs.app
    job = web.jobs.issue_receipt.enqueue(999_999)  # no such order: Reject, no retries
    with running_worker(app, queues="receipts"):
        done = wait_for_job(app, job.id)
    assert done.state is JobState.DEAD
    assert done.attempts == 1
    assert done.errors[-1]["kind"] == "rejected"
