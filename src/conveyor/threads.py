"""The threads that run sync tasks for a worker's event loop.

A ThreadPoolExecutor hands each call's result back through a concurrent Future, a
``call_soon_threadsafe`` and a write to the loop's self-pipe, and takes a Python-level
semaphore on every submit. For many short jobs that is most of a job's cost. Here calls go
in through a C ``SimpleQueue``, and results come back in batches: a thread that finishes
while the loop has not yet collected the previous results adds its own to them instead of
waking the loop again. A call's timeout is not an asyncio timer per call either (creating and
cancelling one was a twentieth of a short job's cost): see _Deadlines.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class CallTimedOut(Exception):
    """A call's timeout ran out: its future fails with this (the thread itself runs on)."""


class ThreadCall:
    """One call on a task thread; ``future`` resolves on the loop. ``done()`` and
    ``add_done_callback`` (run on the thread that finished it) tell when the thread itself is
    free again: a call whose awaiter gave up (a timeout) may still be running."""

    __slots__ = ("_callbacks", "_finished", "error", "fn", "future", "result")

    def __init__(self, fn: Callable[[], Any], future: asyncio.Future[Any]) -> None:
        # Dropped once it ran: it is mostly a method of the object that holds this call (an
        # Execution's ``thread``), a reference cycle that would wait for the garbage collector.
        self.fn: Callable[[], Any] | None = fn
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
_NOT_OURS = object()  # submit() called from a thread that is not one of the pool's


class _Deadlines:
    """The timeouts of the calls on the threads, with one asyncio timer for all of them. Calls
    with the same timeout expire in the order they started, so each timeout length keeps its
    calls in a queue in start order, and the timer follows the earliest deadline at the queues'
    heads. A call that finished is dropped when it reaches the head (or when its queue is
    compacted, should a long call at the head hold many finished ones behind it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()  # calls are submitted from the loop and from store threads
        self._queues: dict[float, collections.deque[tuple[float, ThreadCall]]] = {}
        self._compact_at: dict[float, int] = {}
        self._at = math.inf  # when the timer fires (the loop's clock, time.monotonic)
        self._timer: asyncio.TimerHandle | None = None

    def add(self, call: ThreadCall, timeout: float) -> None:
        """From any thread: fail ``call.future`` with CallTimedOut ``timeout`` s from now."""
        deadline = time.monotonic() + timeout
        with self._lock:
            calls = self._queues.get(timeout)
            if calls is None:
                calls = self._queues[timeout] = collections.deque()
            while calls and calls[0][1]._finished:
                calls.popleft()
            if len(calls) > self._compact_at.get(timeout, 64):
                live = (c for c in calls if not c[1]._finished)
                calls = self._queues[timeout] = collections.deque(live)
                self._compact_at[timeout] = max(64, 2 * len(calls))
            calls.append((deadline, call))
            sooner = deadline < self._at
            if sooner:
                self._at = deadline
        if sooner:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                self._loop.call_soon_threadsafe(self._arm)

    def _arm(self) -> None:
        """On the loop: (re)set the timer to the earliest deadline."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None if self._at == math.inf else self._loop.call_at(self._at, self._fire)

    def _fire(self) -> None:
        now = time.monotonic()
        expired: list[ThreadCall] = []
        with self._lock:
            for timeout in list(self._queues):
                calls = self._queues[timeout]
                while calls and (calls[0][1]._finished or calls[0][0] <= now):
                    _, call = calls.popleft()
                    if not call._finished:
                        expired.append(call)
                if not calls:
                    del self._queues[timeout]
            self._at = min((calls[0][0] for calls in self._queues.values()), default=math.inf)
        self._timer = None
        self._arm()
        for call in expired:
            if not call.future.done():
                call.future.set_exception(CallTimedOut())

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class TaskThreads:
    """``size`` daemon threads (a task stuck past shutdown must not keep the process alive;
    its job's lease was released or runs out)."""

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop,
                 name: str = "conveyor-task") -> None:
        self._loop = loop
        self._deadlines = _Deadlines(loop)
        self._calls: queue.SimpleQueue[ThreadCall | None] = queue.SimpleQueue()
        self._finished: collections.deque[ThreadCall] = collections.deque()
        self._wake_pending = False
        self._closed = False
        # On each of these threads: its call to run next (here=True).
        self._local = threading.local()
        self._threads = [threading.Thread(target=self._serve, name=f"{name}_{i}", daemon=True)
                         for i in range(size)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[[], Any], timeout: float | None = None, *,
               here: bool = False) -> ThreadCall:
        """Run ``fn`` on a free thread; await ``.future`` for its result, which fails with
        CallTimedOut if ``timeout`` seconds pass first (the thread runs on). Callable from the
        loop and from other threads (the future is the loop's).
        ``here``: made from a call running on one of these threads, ``fn`` runs on that same
        thread the moment the current call returns, instead of waking another (the worker's
        idle wait hands its first claimed job to itself: a thread hop is a tenth of an idle
        worker's enqueue-to-start time). One such call per current call; any other is queued."""
        if self._closed:
            raise RuntimeError("task threads are shut down")
        call = ThreadCall(fn, self._loop.create_future())
        if timeout is not None:
            self._deadlines.add(call, timeout)
        if here:
            local = self._local
            mine = getattr(local, "next", _NOT_OURS)
            if mine is None:
                local.next = call
                return call
            if mine is _NOT_OURS:
                # A thread not of the pool (the loop's, a store's): said once, so that its
                # next calls find the attribute (a getattr that misses raises and catches an
                # AttributeError: ten times the cost of one that finds it).
                local.next = _NOT_OURS
        self._calls.put(call)
        return call

    def shutdown(self) -> None:
        self._closed = True
        self._deadlines.close()
        for _ in self._threads:
            self._calls.put(None)

    def _serve(self) -> None:
        local = self._local
        while True:
            call = self._calls.get()
            if call is None:  # shutdown
                return
            while call is not None:
                local.next = None
                if not self._run(call):
                    return
                call = local.next  # a call this one handed to its own thread (submit's here)

    def _run(self, call: ThreadCall) -> bool:
        """Run one call and hand its result to the loop; False once the loop is closed."""
        fn, call.fn = call.fn, None
        assert fn is not None
        try:
            call.result = fn()
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
                return False
        return True

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
