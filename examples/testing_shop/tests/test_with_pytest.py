"""Testing tasks with pytest: the ``conveyor_app`` fixture and ``drain``."""

import math

import pytest
import shop

from conveyor import JobState
from conveyor.testing import JobFailed, drain


def test_an_order_sends_its_receipt(conveyor_app):
    # conveyor_app is shop.app, on a fresh store for this test only.
    shop.place_order.enqueue(42, "ada@example.com")

    ran = drain(conveyor_app)  # runs the order, then the receipt it enqueued

    assert [job.task for job in ran] == ["shop.place_order", "shop.send_receipt"]
    assert ran[-1].result == "receipt 42 sent to ada@example.com (attempt 1)"


def test_a_failing_task_fails_the_test(conveyor_app):
    shop.send_receipt.options(max_attempts=1).enqueue(7, "not-an-address")

    with pytest.raises(JobFailed) as failed:
        drain(conveyor_app)

    assert failed.value.job.state is JobState.DEAD
    assert failed.value.error["type"] == "ValueError"


def test_failures_can_be_collected_instead(conveyor_app):
    shop.send_receipt.options(max_attempts=1).enqueue(7, "not-an-address")

    [job] = drain(conveyor_app, raise_failures=False)

    assert job.state is JobState.DEAD
    assert "not an email address" in job.last_error["message"]


def test_retries_run_when_time_is_advanced(conveyor_app):
    job = shop.sync_stock.enqueue("SKU-1")

    # Without advance the retry, due in a minute, would still be waiting (a JobFailed).
    [done] = drain(conveyor_app, advance=math.inf)

    assert done.id == job.id
    assert done.result == "SKU-1 synced"
    assert len(done.errors) == 2  # the two busy attempts
