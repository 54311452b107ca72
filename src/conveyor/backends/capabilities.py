"""What a store can do, named as protocols so mypy checks every use, instead of probing with
``getattr`` and silencing the checker.

Every store has the first four; :class:`~conveyor.backends.base.Backend` declares their
methods (abstract, or with a default), and the check at the end of this module keeps the two
in step:

* :class:`WakeUps`: waiting for jobs with the store's wake-ups (SQLite's in-process signal
  and ``data_version``, PostgreSQL's LISTEN/NOTIFY, Redis's blocking pop);
* :class:`CronStore`: cron ticks taken once across any number of schedulers, and the
  schedules' controls (disabled or not, the last run's job);
* :class:`StepStore`: exactly-once step records (``JobContext.once``);
* :class:`FinishWaits`: waiting for one job to finish (``job.wait``), woken by the store.

Two are optional: :class:`LoopClaims` (``Backend.loop_claims`` returns one or None) and
:class:`TransactionalStore`, a store whose writes can join the caller's own database
transaction (PostgreSQL); :func:`transactional` tells whether a backend is one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..job import Job
from .types import ClaimReply, CronState, EnqueueResult, Lease, NewBatch, NewJob


class WakeUps(Protocol):
    """Idle waiting (listen/notify): see ``Backend.wait_for_jobs``, ``wait_and_claim`` and
    ``wake``."""

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, *,
                      verify: bool = True) -> bool: ...

    def wait_and_claim(
        self, queues: Sequence[str], timeout: float, claims: Sequence[tuple[str, int]], *,
        worker_id: str, lease_s: float, start: int | None = None,
    ) -> tuple[bool, list[Job] | None]: ...

    def wake(self) -> None: ...


class CronStore(Protocol):
    """Cron ticks and controls: see ``Backend.cron_enqueue``, ``cron_ticks``,
    ``set_cron_enabled`` and ``cron_states``."""

    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None: ...

    def cron_ticks(self) -> dict[str, float]: ...

    def set_cron_enabled(self, schedule: str, enabled: bool, *,
                         now: float | None = None) -> bool: ...

    def cron_states(self) -> dict[str, CronState]: ...


class StepStore(Protocol):
    """Step records: see ``Backend.record_step``."""

    def record_step(self, job_id: int, step: str, result: str | None, *,
                    uid: str | None) -> tuple[bool, str | None]: ...


class FinishWaits(Protocol):
    """``job.wait``: see ``Backend.wait_finished`` and ``finish_watch``. The default polls the
    job; a store overrides ``finish_watch`` to wake waiters when a job finishes. The finishing
    writes (ack, kill, cancel) must cost nothing extra while nobody waits: each store keeps
    a cheap mark of waited-for jobs (a flag on the row, a key, an in-process count) and
    signals only for those."""

    finish_poll: tuple[float, float]

    def wait_finished(self, job_id: int, timeout: float) -> Job | None: ...

    def finish_watch(self, job_id: int) -> AbstractContextManager[Callable[[float], None]]: ...


@runtime_checkable
class TransactionalStore(Protocol):
    """A store whose writes can join a transaction of the caller's (PostgreSQL): a job
    enqueued with ``connection=`` exists only if the caller commits, and a task's
    ``JobContext.transaction()`` commits its own writes, its step records and its job's
    success together. ``connection`` is the store's own connection type (a psycopg
    ``Connection``; ``AsyncConnection`` for the ``a`` methods); without it each method is the
    plain ``Backend`` one."""

    supports_transactions: bool

    def completion_connection(self) -> AbstractContextManager[Any]:
        """A connection with an open transaction, for a task's writes plus its ack."""
        ...

    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None,
                     connection: Any = None,
                     batches: Sequence[NewBatch] = ()) -> list[EnqueueResult]: ...

    async def aenqueue_many(self, jobs: Sequence[NewJob], *, connection: Any,
                            now: float | None = None) -> list[EnqueueResult]: ...

    def get(self, job_id: int, *, connection: Any = None) -> Job | None: ...

    async def aget(self, job_id: int, *, connection: Any) -> Job | None: ...

    def ack(self, lease: Lease, result: str | None, *, now: float | None = None,
            connection: Any = None) -> None: ...

    def record_step(self, job_id: int, step: str, result: str | None, *, uid: str | None,
                    connection: Any = None) -> tuple[bool, str | None]: ...


def transactional(backend: object) -> TransactionalStore | None:
    """``backend`` as a :class:`TransactionalStore`, or None if its writes cannot join a
    caller's transaction."""
    if isinstance(backend, TransactionalStore) and backend.supports_transactions:
        return backend
    return None


class LoopClaims(Protocol):
    """``ack_and_claim`` made from the worker's event loop, with the store's reply waking the
    loop itself: no hand-off to a thread and back (see docs/benchmarks.md, "Design
    measurements"). Only the plain round trip is made on the loop. Anything that could block
    (no connection yet, a broken one, a reply that needs the careful path) comes back as a
    function that finishes the call the blocking way, for the worker to run on a thread; its
    result or error is then the call's, as ``Backend.ack_and_claim`` would give them."""

    async def ack_and_claim(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, *,
        worker_id: str, lease_s: float, wanted: Callable[[], bool] | None = None,
        on_reply: Callable[[int], None] | None = None, start: int | None = None,
    ) -> ClaimReply | Callable[[], ClaimReply]:
        """``wanted``: the worker's "not stopping". A returned function that has sent nothing
        yet asks it before it claims; False makes it claim nothing (its acks are still
        written). One that finishes a call already sent settles what the store did.
        ``on_reply``: called with the number of jobs claimed once the store's reply is in,
        before it is read into jobs; it may send the next claim with ``claim_ahead``.
        ``start``: as ``Backend.claim``'s."""
        ...

    def claim_ahead(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, *,
        worker_id: str, lease_s: float,
    ) -> Any:
        """Send an ``ack_and_claim`` without waiting for it; None if it could not be sent at
        once, and then nothing was. ``finish`` takes what it returns, before any other call.
        Its jobs are claimed held (``start=0``): the worker's slots are busy when it is sent."""
        ...

    async def finish(self, ahead: Any, on_reply: Callable[[int], None] | None = None,
                     ) -> ClaimReply | Callable[[], ClaimReply]:
        """The outcome of a claim ``claim_ahead`` sent, as ``ack_and_claim`` gives it."""
        ...

    def close(self) -> None:
        """Close its connection (the worker calls it once its claims are over)."""


if TYPE_CHECKING:
    from .base import Backend
    from .postgres import PostgresBackend

    def _kept(backend: Backend, pg: PostgresBackend,
              ) -> tuple[WakeUps, CronStore, StepStore, FinishWaits, TransactionalStore]:
        """Never called: mypy checks here that the Backend contract keeps the signatures of
        the capabilities every store has, and PostgreSQL those of transactional completion."""
        return backend, backend, backend, backend, pg
