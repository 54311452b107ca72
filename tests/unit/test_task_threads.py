"""TaskThreads: calls on threads handed back to the event loop, and their timeouts (one timer
for all calls, see threads._Deadlines)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from conveyor.threads import CallTimedOut, TaskThreads


def run(coro_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(coro_fn())


def test_results_and_errors_come_back_to_the_loop() -> None:
    async def main() -> None:
        pool = TaskThreads(2, asyncio.get_running_loop())
        try:
            ok = pool.submit(lambda: 41 + 1, timeout=5)
            bad = pool.submit(lambda: 1 / 0, timeout=5)
            assert await ok.future == 42
            with pytest.raises(ZeroDivisionError):
                await bad.future
        finally:
            pool.shutdown()

    run(main)


def test_a_call_past_its_timeout_fails_while_its_thread_runs_on() -> None:
    release = threading.Event()

    async def main() -> None:
        pool = TaskThreads(2, asyncio.get_running_loop())
        try:
            started = time.monotonic()
            slow = pool.submit(release.wait, timeout=0.2)
            with pytest.raises(CallTimedOut):
                await slow.future
            assert 0.15 <= time.monotonic() - started < 2.0
            assert not slow.done()  # the thread itself is still in the call
            release.set()
            for _ in range(200):
                if slow.done():
                    break
                await asyncio.sleep(0.01)
            assert slow.done()
        finally:
            release.set()
            pool.shutdown()

    run(main)


def test_calls_that_finish_in_time_never_time_out() -> None:
    async def main() -> None:
        pool = TaskThreads(4, asyncio.get_running_loop())
        try:
            calls = [pool.submit(functools.partial(int, i), timeout=0.3) for i in range(500)]
            assert [await c.future for c in calls] == list(range(500))
            await asyncio.sleep(0.5)  # past every deadline: nothing fires on a finished call
            assert all(c.future.done() and not c.future.exception() for c in calls)
        finally:
            pool.shutdown()

    run(main)


def test_a_shorter_timeout_submitted_later_fires_first() -> None:
    release = threading.Event()

    async def main() -> None:
        pool = TaskThreads(2, asyncio.get_running_loop())
        try:
            long_one = pool.submit(release.wait, timeout=30)
            short = pool.submit(release.wait, timeout=0.2)
            started = time.monotonic()
            with pytest.raises(CallTimedOut):
                await short.future
            assert time.monotonic() - started < 2.0
            assert not long_one.future.done()
        finally:
            release.set()
            pool.shutdown()

    run(main)


def test_finished_calls_behind_a_long_one_do_not_pile_up() -> None:
    """A long call at the head of its timeout's queue: the finished calls behind it are
    compacted away as new ones come, so the queue stays near the running calls."""
    release = threading.Event()

    async def main() -> None:
        pool = TaskThreads(2, asyncio.get_running_loop())
        try:
            pool.submit(release.wait, timeout=60)
            for _ in range(20):
                batch = [pool.submit(lambda: None, timeout=60) for _ in range(100)]
                for c in batch:
                    await c.future
            queue = pool._deadlines._queues[60]
            assert len(queue) < 300, len(queue)
        finally:
            release.set()
            pool.shutdown()

    run(main)


def test_calls_submitted_from_another_thread_time_out_too() -> None:
    release = threading.Event()

    async def main() -> None:
        pool = TaskThreads(2, asyncio.get_running_loop())
        try:
            box: list[object] = []
            t = threading.Thread(target=lambda: box.append(pool.submit(release.wait, timeout=0.2)))
            t.start()
            t.join()
            call = box[0]
            with pytest.raises(CallTimedOut):
                await call.future  # type: ignore[attr-defined]
        finally:
            release.set()
            pool.shutdown()

    run(main)


def test_a_call_handed_here_runs_on_the_same_thread_once_the_current_call_returns() -> None:
    """submit(here=True) from a call on a pool thread: the worker's idle wait starting the
    first job it claimed on its own thread. The current call's result reaches the loop first;
    a second such call, and one made off the pool, go to whichever thread is free."""

    async def main() -> None:
        pool = TaskThreads(3, asyncio.get_running_loop())
        order: list[str] = []
        try:
            def job(name: str) -> str:
                order.append(name)
                return threading.current_thread().name

            def wait() -> tuple[str, Any, Any]:
                first = pool.submit(functools.partial(job, "first"), timeout=5, here=True)
                second = pool.submit(functools.partial(job, "second"), timeout=5, here=True)
                time.sleep(0.05)  # the second is on another thread meanwhile; the first waits for us
                order.append("wait returns")
                return threading.current_thread().name, first, second

            waited_on, first, second = await pool.submit(wait).future
            assert await first.future == waited_on
            assert await second.future != waited_on
            assert order.index("wait returns") < order.index("first")

            outside = pool.submit(functools.partial(job, "outside"), here=True)  # from the loop: queued
            assert (await outside.future).startswith("conveyor-task_")
        finally:
            pool.shutdown()

    run(main)
