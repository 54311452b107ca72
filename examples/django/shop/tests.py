"""The shop example's tests: ``python manage.py test shop`` (SQLite), or with
``SHOP_DATABASE=postgresql://...`` for the transactional enqueue."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import skipUnless

from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test import Client, TransactionTestCase

from conveyor import HookEvent, Job, JobState
from conveyor.contrib.django import DjangoConveyor, app, db_connection, enqueue_on_commit
from conveyor.worker import Worker

from .models import Order
from .orders import place_order, place_order_atomically
from .tasks import ping, send_receipt

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


def wait_for(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s")
        time.sleep(0.02)
    return value


def finished(job_id: int) -> Job | None:
    job = app.get_job(job_id)
    return job if job.is_final else None


@contextlib.contextmanager
def worker(**options: Any) -> Iterator[Worker]:
    """A worker on a thread of this process, as `manage.py conveyor worker` runs one."""
    w = Worker(app, queues="default,emails", install_signal_handlers=False,
               poll_interval=0.1, **options)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    try:
        yield w
    finally:
        w.stop()
        thread.join(20)


def jobs_of(task_name: str) -> list[Job]:
    """The task's jobs, newest first."""
    return list(app.backend.list_jobs(task=task_name, limit=100).jobs)


class ShopTests(TransactionTestCase):  # real commits: on_commit callbacks and worker threads

    @classmethod
    def tearDownClass(cls) -> None:
        app.close()  # its connections must not outlive the test database
        super().tearDownClass()

    def test_tasks_are_discovered_from_tasks_py(self) -> None:
        assert app.tasks["shop.tasks.send_receipt"] is send_receipt
        assert app.tasks["shop.tasks.ping"] is ping

    def test_enqueue_on_commit_enqueues_only_committed_orders(self) -> None:
        before = {j.id for j in jobs_of("shop.tasks.send_receipt")}
        with contextlib.suppress(RuntimeError), transaction.atomic():
            order = Order.objects.create(email="x@example.com", total_cents=1)
            enqueue_on_commit(send_receipt, order.pk)
            raise RuntimeError("payment declined")  # rolled back: no job
        assert {j.id for j in jobs_of("shop.tasks.send_receipt")} == before
        order = place_order("ada@example.com", 1200)
        [job] = [j for j in jobs_of("shop.tasks.send_receipt") if j.id not in before]
        assert job.args == {"order_id": order.pk}

    def test_the_worker_runs_orm_tasks_and_closes_connections_around_each_job(self) -> None:
        closed_after: list[bool] = []

        # After conveyor.contrib.django's own hook: the task thread's connection is closed.
        @app.on("job_succeeded")
        def check(event: HookEvent) -> None:
            if event.job is not None and event.job.task == "shop.tasks.send_receipt":
                closed_after.append(connection.connection is None)

        order = place_order("grace@example.com", 500)
        [job] = [j for j in jobs_of("shop.tasks.send_receipt") if j.args["order_id"] == order.pk]
        with worker(concurrency=2):
            done = wait_for(lambda: finished(job.id))
        assert done.state is JobState.SUCCEEDED, done.errors
        assert done.result == f"receipt for order {order.pk} sent to grace@example.com"
        order.refresh_from_db()
        assert order.receipt_sent
        assert closed_after == [True], closed_after

    def test_the_web_view(self) -> None:
        r = Client().post("/orders", {"email": "linus@example.com", "total_cents": 99},
                          content_type="application/json")
        assert r.status_code == 201, r.content
        assert Order.objects.get(pk=r.json()["order"]).email == "linus@example.com"

    def test_manage_py_conveyor_worker(self) -> None:
        job = ping.enqueue()
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "shop_site.settings"}
        if connection.vendor == "postgresql":  # the worker's database: this test run's
            settings = connection.settings_dict
            env["SHOP_DATABASE"] = (f"postgresql://{settings['USER']}@{settings['HOST']}:"
                                    f"{settings['PORT']}/{settings['NAME']}")
        with subprocess.Popen([sys.executable, str(MANAGE), "conveyor", "worker",
                               "--queues", "default", "--poll-interval", "0.1"],
                              env=env, cwd=MANAGE.parent, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) as proc:
            try:
                done = wait_for(lambda: finished(job.id), timeout=30)
            finally:
                proc.send_signal(signal.SIGTERM)
                output = proc.communicate(timeout=30)[0].decode()
        assert done.state is JobState.SUCCEEDED and done.result == "pong", output
        assert proc.returncode == 0, output

    def test_the_store_in_djangos_database_needs_postgresql(self) -> None:
        if connection.vendor == "postgresql":
            made = DjangoConveyor(database="default")  # what CONVEYOR["database"] makes
            assert made.url.startswith("postgresql://")
            assert f"/{connection.settings_dict['NAME']}" in made.url  # the test database
            made.url = "sqlite:////tmp/x.db"  # an explicit URL (the CLI's --url) replaces it
            assert made.database is None and made.url == "sqlite:////tmp/x.db"
        else:
            with self.assertRaisesMessage(ImproperlyConfigured, "needs a PostgreSQL database"):
                _ = DjangoConveyor(database="default").url
            with self.assertRaisesMessage(ImproperlyConfigured, "needs PostgreSQL"):
                db_connection()

    @skipUnless(connection.vendor == "postgresql", "transactional enqueue needs PostgreSQL")
    def test_an_order_and_its_job_commit_together_through_djangos_connection(self) -> None:
        with contextlib.suppress(RuntimeError), transaction.atomic():
            order, job = place_order_atomically("x@example.com", 1)
            raise RuntimeError("payment declined")
        assert not Order.objects.filter(pk=order.pk).exists()
        assert job.id not in {j.id for j in jobs_of("shop.tasks.send_receipt")}

        order, job = place_order_atomically("ada@example.com", 1200)
        assert job.args == {"order_id": order.pk} and job.state is JobState.AVAILABLE
        assert app.get_job(job.id).args == job.args  # committed: visible to others
        with worker():
            done = wait_for(lambda: finished(job.id))
        assert done.state is JobState.SUCCEEDED, done.errors
        order.refresh_from_db()
        assert order.receipt_sent
