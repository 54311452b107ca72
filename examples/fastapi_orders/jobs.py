"""The Conveyor app of the FastAPI example and its task.

Run a worker from the ``examples/`` directory::

    DATABASE_URL=postgresql://localhost/shop conveyor --app fastapi_orders.jobs:app worker
"""

from __future__ import annotations

import os

from conveyor import Conveyor, Reject, current_job

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://localhost/shop")

# The jobs live in the same database as the orders, so that an order and its job can be
# written in one transaction (and a task's writes can commit together with its success).
app = Conveyor(DATABASE_URL, visibility_timeout=30)


@app.task(queue="receipts", max_attempts=5, timeout=30)
def issue_receipt(order_id: int) -> None:
    """Write the order's receipt exactly once, however often this job runs.

    The job is at-least-once like any other: a worker may die after writing and before
    acknowledging. ``current_job().transaction()`` makes the receipt row and the job's
    success one PostgreSQL transaction, so a second run can never add a second receipt
    (and the plain INSERT needs no ``ON CONFLICT``).
    """
    ctx = current_job()
    if ctx is None:
        raise RuntimeError("issue_receipt runs in a worker; enqueue it with issue_receipt.enqueue(order_id)")
    with ctx.transaction(result={"order_id": order_id}) as conn:
        cur = conn.execute(
            "INSERT INTO receipts (order_id, total_cents) SELECT id, total_cents FROM orders WHERE id = %s",
            (order_id,),
        )
        if cur.rowcount == 0:
            raise Reject(f"order {order_id} does not exist")  # rolls the block back; retrying cannot help
