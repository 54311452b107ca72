"""A shop's background jobs: the module a project's tests import (``--app shop:app``)."""

from __future__ import annotations

from conveyor import Conveyor, Retry, current_job

app = Conveyor()  # the store comes from $CONVEYOR_URL in production

SENT: list[str] = []  # stands in for an email service


@app.task(max_attempts=3)
def send_receipt(order_id: int, email: str) -> str:
    if "@" not in email:
        raise ValueError(f"not an email address: {email!r}")
    ctx = current_job()
    assert ctx is not None
    SENT.append(email)
    return f"receipt {order_id} sent to {email} (attempt {ctx.attempt})"


@app.task
def place_order(order_id: int, email: str) -> int:
    send_receipt.enqueue(order_id, email)  # a job that enqueues another
    return order_id


@app.task(max_attempts=5)
def sync_stock(sku: str) -> str:
    ctx = current_job()
    assert ctx is not None
    if ctx.attempt < 3:
        raise Retry("the warehouse API is busy", delay=60)  # comes back in a minute
    return f"{sku} synced"
