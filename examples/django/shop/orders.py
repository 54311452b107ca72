"""Placing an order: the order row and its receipt job must not part ways."""

from django.db import transaction

from conveyor import Job
from conveyor.contrib.django import db_connection, enqueue_on_commit

from .models import Order
from .tasks import send_receipt


def place_order(email: str, total_cents: int) -> Order:
    """Any store: the job is enqueued once the order is committed (never for a rolled-back
    order; lost if the process dies between the commit and the enqueue)."""
    with transaction.atomic():
        order = Order.objects.create(email=email, total_cents=total_cents)
        enqueue_on_commit(send_receipt, order.pk)
    return order


def place_order_atomically(email: str, total_cents: int) -> tuple[Order, Job]:
    """PostgreSQL with CONVEYOR = {"database": "default"}: the job is written through
    Django's own connection, in the order's transaction: both commit, or neither."""
    with transaction.atomic():
        order = Order.objects.create(email=email, total_cents=total_cents)
        job = send_receipt.enqueue(order.pk, connection=db_connection())
    return order, job
