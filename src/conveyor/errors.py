"""Every exception Conveyor raises on purpose, plus the two a task raises to steer its job."""

from __future__ import annotations

from typing import Any


class ConveyorError(Exception):
    """Base class of the errors Conveyor raises itself."""


class PayloadError(ConveyorError, ValueError):
    """The arguments of a job cannot be stored: not JSON, too deep, or otherwise unfit."""


class PayloadTooLarge(PayloadError):
    """The encoded arguments are larger than the configured limit."""


class ResultTooLarge(PayloadTooLarge):
    """A task's result, or a step's, is larger than ``Conveyor(max_result_bytes=...)``.
    Its job goes dead at once (kind ``result_too_large``): running it again would return the
    same."""


class ArgumentsError(PayloadError, TypeError):
    """The arguments do not bind to the task's signature."""


class InvalidName(ConveyorError, ValueError):
    """A queue or task name does not match the allowed pattern."""


class UnknownTask(ConveyorError, LookupError):
    """No task with this name is registered on the app."""


class JobNotFound(ConveyorError, LookupError):
    """No job with this id exists in the store."""


class UnknownParent(JobNotFound, ValueError):
    """A job's ``after=`` names a job the store does not hold (never enqueued, or pruned), or
    refers to a job later in the same write (which would allow a cycle). Nothing was written."""

    def __init__(self, job_id: int | str, detail: str = "") -> None:
        self.job_id = job_id
        msg = f"after= names job {job_id}, which the store does not hold"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class UnknownSchedule(ConveyorError, LookupError):
    """No cron schedule of that name is registered on the app."""


class LeaseLost(ConveyorError):
    """The caller's lease on a job is gone: it expired, was reaped, released or cancelled.

    A worker that gets this must drop the job: another attempt may already own it.
    """

    def __init__(self, job_id: int, detail: str = "") -> None:
        self.job_id = job_id
        msg = f"lease on job {job_id} is no longer held by this worker"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class QueueFull(ConveyorError):
    """Enqueue refused because the queue is at its configured max_depth; nothing was written."""

    def __init__(self, message: str, *, queue: str = "", depth: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.queue = queue
        self.depth = depth
        self.limit = limit


class WaitTimeout(ConveyorError, TimeoutError):
    """``job.wait(timeout=...)`` ran out of time before the job finished (a TimeoutError).
    ``job`` is the job as it was last seen."""

    def __init__(self, job: Any, timeout: float | None) -> None:
        super().__init__(f"job {job.id} is still {job.state} after waiting {timeout}s")
        self.job = job


class WaitInTask(ConveyorError, RuntimeError):
    """``job.wait()`` called inside a task: refused, as it can deadlock the worker's pool."""


class ConfigurationError(ConveyorError, ValueError):
    """A URL, option or argument to Conveyor itself is wrong."""


class IncludeError(ConfigurationError):
    """A module of ``Conveyor(include=...)`` failed to import; its exception is the cause."""

    def __init__(self, module: str, exc: BaseException) -> None:
        what = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        super().__init__(f"cannot import {module}: {type(exc).__name__}: {what}")
        self.module = module


class Retry(Exception):
    """Raise inside a task to ask for another attempt after ``delay`` seconds.

    If the job has used all its attempts it goes to the dead-letter queue instead.
    """

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None and not (0 <= delay < float("inf")):
            raise ValueError(
                f"Retry delay must be a finite, non-negative number of seconds, got {delay!r}")
        self.delay = delay
        self.reason = reason
        default = f"retry requested in {delay}s" if delay is not None else "retry requested"
        super().__init__(reason or default)


class Reject(Exception):
    """Raise inside a task to fail the job permanently: it goes to the dead-letter queue at once."""

    def __init__(self, reason: str = "rejected") -> None:
        self.reason = reason
        super().__init__(reason)


class SignatureInvalid(ConveyorError):
    """A job's signature is missing or does not match (recorded on the job; it goes dead)."""


class Unsupported(ConveyorError, NotImplementedError):
    """The store cannot do this: a message broker (RabbitMQ, SQS) holds messages, not a job
    table, so it cannot look a job up by id, list jobs, keep results or cron ticks, and so on.
    The message names the capability and how to get it (a store that has it, or a companion
    store where one is supported). Nothing was written."""

    def __init__(self, capability: str, store: str, hint: str = "") -> None:
        self.capability = capability
        self.store = store
        msg = f"{store} cannot {capability}"
        super().__init__(f"{msg}: {hint}" if hint else msg)


class StoreError(ConveyorError):
    """The store failed or could not be reached; the operation did not happen."""


class StorageFull(StoreError):
    """The store is out of disk space; the operation did not happen."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (down, restarting, or not answering in time).

    The message says whether the operation did not happen or, when a reply was lost in
    flight, may have happened.
    """


class ClaimLost(StoreUnavailable):
    """The reply to a claim that carried acks was lost: the claim may have happened (its jobs
    come back when their leases run out), and the acks were checked one by one afterwards.
    ``acks_held`` says, for each, whether it was written: they are settled, not to be sent again."""

    def __init__(self, message: str, acks_held: list[bool]) -> None:
        super().__init__(message)
        self.acks_held = acks_held
