"""The shop's tasks: found by conveyor.contrib.django (every installed app's tasks.py)."""

from conveyor import Reject
from conveyor.contrib.django import app

from .models import Order


@app.task(queue="emails", max_attempts=5)
def send_receipt(order_id: int) -> str:
    """Runs on a worker thread: the ORM works as in a view, its connection handled per job."""
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        raise Reject(f"order {order_id} no longer exists")  # dead at once: no retry helps
    # ... send the email here; then record it (a retry after a crash may send it twice:
    # pass current_job().uid to the mail API as an idempotency key where it takes one).
    Order.objects.filter(pk=order.pk).update(receipt_sent=True)
    return f"receipt for order {order.pk} sent to {order.email}"


@app.task
def ping() -> str:
    return "pong"
