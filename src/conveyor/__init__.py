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
    UnknownParent,
    UnknownTask,
    Unsupported,
    WaitInTask,
    WaitTimeout,
)
from .executor import JobContext, current_job
from .hooks import HookEvent
from .job import Job, JobState
from .pending import PendingJob
from .retry import RetryPolicy
from .task import Task
from .workflow import Batch, Group, Signature

__all__ = [
    "ArgumentsError",
    "Batch",
    "ConfigurationError",
    "Conveyor",
    "ConveyorError",
    "Group",
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
    "PendingJob",
    "QueueFull",
    "Reject",
    "ResultTooLarge",
    "Retry",
    "RetryPolicy",
    "Signature",
    "SignatureInvalid",
    "StorageFull",
    "StoreError",
    "StoreUnavailable",
    "Task",
    "UnknownParent",
    "UnknownTask",
    "Unsupported",
    "WaitInTask",
    "WaitTimeout",
    "current_job",
]
