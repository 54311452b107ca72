"""The threads that run sync tasks for a worker's event loop.

A ThreadPoolExecutor hands each call's result back through a concurrent Future, a
``call_soon_threadsafe`` and a write to the loop's self-pipe, and takes a Python-level
semaphore on every submit. For many short jobs that is most of a job's cost. Here calls go
in through a C ``SimpleQueue``, and results come back in batches: a thread that finishes
while the loop has not yet collected the previous results adds its own to them instead of
waking the loop again.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Callable
from typing import Any


class ThreadCall:
    """One call on a task thread; ``future`` resolves on the loop. ``done()`` and
    ``add_done_callback`` (run on the thread that finished it) tell when the thread itself is
    free again: a call whose awaiter gave up (a timeout) may still be running."""

    __slots__ = ("_callbacks", "_finished", "error", "fn", "future", "result")

    def __init__(self, fn: Callable[[], Any], future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.future = future
        self.result: Any = None
        self.error: BaseException | None = None
        self._finished = False
        self._callbacks: list[Callable[[ThreadCall], object]] = []

    def done(self) -> bool:
        return self._finished

    def add_done_callback(self, fn: Callable[[ThreadCall], object]) -> None:
        with _callbacks_lock:
            if not self._finished:
                self._callbacks.append(fn)
                return
        fn(self)


_callbacks_lock = threading.Lock()


class TaskThreads:
    """``size`` daemon threads (a task stuck past shutdown must not keep the process alive;
    its job's lease was released or runs out)."""

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop, name: str = "conveyor-task") -> None:
        self._loop = loop
        self._calls: queue.SimpleQueue[ThreadCall | None] = queue.SimpleQueue()
        self._finished: collections.deque[ThreadCall] = collections.deque()
        self._wake_pending = False
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, name=f"{name}_{i}", daemon=True) for i in range(size)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[[], Any]) -> ThreadCall:
        """Run ``fn`` on a free thread (call from the loop); await ``.future`` for its result."""
        if self._closed:
            raise RuntimeError("task threads are shut down")
        call = ThreadCall(fn, self._loop.create_future())
        self._calls.put(call)
        return call

    def shutdown(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._calls.put(None)

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            try:
                call.result = call.fn()
            except BaseException as exc:  # handed to the awaiter, as a Future would
                call.error = exc
            with _callbacks_lock:
                call._finished = True
                callbacks, call._callbacks = call._callbacks, []
            for cb in callbacks:
                cb(call)
            self._finished.append(call)
            if not self._wake_pending:
                # The flag is cleared by _collect before it reads the deque, so a result
                # appended after that read always finds the flag clear and wakes the loop.
                self._wake_pending = True
                try:
                    self._loop.call_soon_threadsafe(self._collect)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    return

    def _collect(self) -> None:
        self._wake_pending = False
        finished = self._finished
        while finished:
            call = finished.popleft()
            fut = call.future
            if fut.done():  # the awaiter was cancelled (timeout, lease lost, shutdown)
                continue
            if call.error is not None:
                fut.set_exception(call.error)
            else:
                fut.set_result(call.result)
