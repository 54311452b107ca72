"""Conveyor: background jobs for Python with leases, retries and a dead-letter queue."""

from .app import Conveyor
from .errors import (
    ArgumentsError,
    ConfigurationError,
    ConveyorError,
    IncludeError,
    InvalidName,
    JobNotFound,
    LeaseLost,
    PayloadError,
    PayloadTooLarge,
    QueueFull,
    Reject,
    ResultTooLarge,
    Retry,
    SignatureInvalid,
    StorageFull,
    StoreError,
    StoreUnavailable,
    UnknownTask,
    WaitInTask,
    WaitTimeout,
)
from .executor import JobContext, current_job
from .hooks import HookEvent
from .job import Job, JobState
from .retry import RetryPolicy
from .task import Task

__all__ = [
    "ArgumentsError",
    "ConfigurationError",
    "Conveyor",
    "ConveyorError",
    "HookEvent",
    "IncludeError",
    "InvalidName",
    "Job",
    "JobContext",
    "JobNotFound",
    "JobState",
    "LeaseLost",
    "PayloadError",
    "PayloadTooLarge",
    "QueueFull",
    "Reject",
    "ResultTooLarge",
    "Retry",
    "RetryPolicy",
    "SignatureInvalid",
    "StorageFull",
    "StoreError",
    "StoreUnavailable",
    "Task",
    "UnknownTask",
    "WaitInTask",
    "WaitTimeout",
    "current_job",
]
