"""PostgreSQL pools in a forked child: sized for the child's own workers, not the parent's.

The main pool grows by the task slots of the workers running in the process
(``reserve_connections``). A child forked while the parent runs a worker has none of them,
and a parent thread may be resizing at the very moment of the fork (holding the size lock).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pgrig import fresh_backend
from support import collect, forked

from conveyor.backends.postgres import CONTROL_SIZE, POOL_ROOM, PostgresBackend


@pytest.fixture
def backend() -> Iterator[PostgresBackend]:
    with fresh_backend() as b:  # skips locally, fails in CI, if PostgreSQL is unreachable
        yield b


def test_a_forked_child_sizes_its_pools_for_its_own_workers(backend: PostgresBackend) -> None:
    backend.reserve_connections(40)  # a worker with 40 slots runs in the parent
    assert backend._pool.max_size == POOL_ROOM + 40

    def child() -> list[int]:
        fresh = [backend._pool.max_size, backend._control.max_size]
        backend.reserve_connections(2)  # the child's own worker
        backend.now()  # and the store answers on the child's own connections
        return [*fresh, backend._pool.max_size, backend._control.max_size]

    with backend._size_lock:  # a parent thread is resizing while the process forks
        children = [forked(child)]
    [sizes] = collect(children, 30)
    assert sizes == [POOL_ROOM, CONTROL_SIZE, POOL_ROOM + 2, CONTROL_SIZE]
    assert backend._pool.max_size == POOL_ROOM + 40  # the parent's are its own
    backend.now()
