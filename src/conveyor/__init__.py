"""Conveyor: background jobs for Python with leases, retries and a dead-letter queue."""

from .app import Conveyor
from .errors import (
    ArgumentsError,
    ConfigurationError,
    ConveyorError,
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
from .job import Job, JobState
from .retry import RetryPolicy
from .task import Task

__all__ = [
    "ArgumentsError",
    "ConfigurationError",
    "Conveyor",
    "ConveyorError",
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
