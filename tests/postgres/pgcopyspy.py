"""A pytest plugin (``-p pgcopyspy``) for test_pg_copy_conformance.py: counts the tests in which
PostgreSQL's enqueue went by COPY (enqueue._plain_copy_plan), so that run can show it reached
the path it is meant to test."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from conveyor.backends.base import EnqueueResult
from conveyor.backends.postgres import enqueue as pg_enqueue

copies = 0
tests_by_copy: set[str] = set()
_real = pg_enqueue._plain_copy_plan


def _counted(runs: list[list[Any]], n: int, now: float | None
             ) -> pg_enqueue.Plan[Sequence[EnqueueResult]]:
    global copies
    copies += 1
    return (yield from _real(runs, n, now))


pg_enqueue._plain_copy_plan = _counted  # type: ignore[assignment]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    before = copies
    try:
        return (yield)
    finally:
        if copies > before:
            tests_by_copy.add(item.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"pgcopyspy: {copies} COPY writes in {len(tests_by_copy)} tests")
