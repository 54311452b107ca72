"""Fork safety: a forked child never uses, nor closes, what its parent's backends hold.

An app used before ``os.fork()`` (gunicorn ``--preload``, multiprocessing's fork start method)
hands the child copies of its sockets and SQLite handles, and of its locks in whatever state
the parent's other threads held them. Two processes on one socket mix their conversations;
closing a copy can end the parent's session (psycopg sends Terminate); a lock held by a parent
thread is never released in the child.

So, in the child right after the fork (one ``os.register_at_fork`` hook for the process):
first the module-level resets (``on_fork_in_child``), then each live backend's
``_after_fork_in_child``, which drops what it inherited and makes fresh locks; connections
are then made afresh on first use. What a backend drops is handed to ``keep_inherited`` and
kept for the child's whole life, never closed or finalized while it runs.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("conveyor.backends")


class ForkAware(Protocol):
    def _after_fork_in_child(self) -> None: ...


_backends: weakref.WeakSet[ForkAware] = weakref.WeakSet()
_module_resets: list[Callable[[], None]] = []
_inherited: list[object] = []


def register(backend: ForkAware) -> None:
    """Reset ``backend`` in every child forked while it lives."""
    _backends.add(backend)


def on_fork_in_child(reset: Callable[[], None]) -> None:
    """Run ``reset`` in a forked child before any backend's own reset (module-level state)."""
    _module_resets.append(reset)


def keep_inherited(*objects: object) -> None:
    """Hold the parent's objects for the child's life: dropped, their finalizers could close
    or talk on what is still the parent's."""
    _inherited.extend(objects)


def _after_fork_in_child() -> None:
    for reset in [*_module_resets, *(b._after_fork_in_child for b in list(_backends))]:
        try:
            reset()
        except Exception:  # one backend's failure must not leave the others shared
            log.exception("resetting %r in a forked child failed", reset)


os.register_at_fork(after_in_child=_after_fork_in_child)
