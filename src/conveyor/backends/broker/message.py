"""A job as a broker message: one JSON object carrying everything the job's lifecycle needs, so
a worker that receives it knows the task, its arguments, the attempts already made and the
errors kept. JSON only (never pickle): a message is data any consumer can read.

``attempts`` counts the attempts made before this message was published (a retry publishes the
job again with the failed attempt counted). The broker counts deliveries of one message itself,
so the attempt a delivery starts is ``attempts + deliveries``: a delivery the broker took back
from a dead worker and handed out again cost an attempt, as a lease that ran out does in the
stores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from ...job import Job, JobState

VERSION = 1
KEEP_ERRORS = 20


@dataclass(frozen=True)
class Body:
    id: int
    uid: str
    task: str
    queue: str
    args: str  # JSON text, as NewJob.args
    meta: str  # JSON text
    priority: int
    max_attempts: int
    timeout: float
    created_at: float
    run_at: float
    attempts: int = 0
    errors: tuple[dict[str, Any], ...] = ()
    state: str = JobState.AVAILABLE.value  # "dead" in the dead lane
    finished_at: float | None = None
    worker_id: str | None = None
    # Kept for the job's lifetime: a broker that groups messages (SQS FIFO) groups by fair_key.
    fair_key: str | None = None
    unique_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields of a later version, kept

    def encode(self) -> bytes:
        doc = {
            **self.extra, "v": VERSION, "id": self.id, "uid": self.uid, "task": self.task,
            "queue": self.queue, "args": self.args, "meta": self.meta,
            "priority": self.priority, "max_attempts": self.max_attempts,
            "timeout": self.timeout, "created_at": self.created_at, "run_at": self.run_at,
            "attempts": self.attempts, "errors": list(self.errors[-KEEP_ERRORS:]),
            "state": self.state, "finished_at": self.finished_at, "worker_id": self.worker_id,
        }
        for key in ("fair_key", "unique_key"):  # only when set: most jobs have neither
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        return json.dumps(doc, separators=(",", ":")).encode()

    def failed(self, attempt: int, error: dict[str, Any], **changes: Any) -> Body:
        """This job after its attempt ``attempt`` failed with ``error`` (an ErrorInfo dict)."""
        errors = (*self.errors, error)[-KEEP_ERRORS:]
        return replace(self, attempts=attempt, errors=errors, **changes)

    def job(self, *, attempts: int, state: JobState, lease_token: str | None = None,
            lease_expires_at: float | None = None, attempted_at: float | None = None,
            worker_id: str | None = None) -> Job:
        return Job(
            id=self.id, uid=self.uid, task=self.task, queue=self.queue,
            args=json.loads(self.args), state=state, attempts=attempts,
            max_attempts=self.max_attempts, priority=self.priority, run_at=self.run_at,
            timeout=self.timeout, created_at=self.created_at, attempted_at=attempted_at,
            finished_at=self.finished_at, errors=list(self.errors),
            worker_id=worker_id or self.worker_id, lease_token=lease_token,
            lease_expires_at=lease_expires_at, meta=json.loads(self.meta),
            fair_key=self.fair_key, unique_key=self.unique_key,
        )


class BadMessage(ValueError):
    """A message that is not a Conveyor job (another producer's, or damaged)."""


_FIELDS = ("id", "uid", "task", "queue", "args", "meta", "priority", "max_attempts", "timeout",
           "created_at", "run_at")


def decode(raw: bytes) -> Body:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadMessage(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("v"), int):
        raise BadMessage("not a Conveyor job message (no version)")
    missing = [k for k in _FIELDS if k not in doc]
    if missing:
        raise BadMessage(f"a job message without {', '.join(missing)}")
    known = {*_FIELDS, "v", "attempts", "errors", "state", "finished_at", "worker_id",
             "fair_key", "unique_key"}
    try:
        return Body(
            id=int(doc["id"]), uid=str(doc["uid"]), task=str(doc["task"]),
            queue=str(doc["queue"]), args=str(doc["args"]), meta=str(doc["meta"]),
            priority=int(doc["priority"]), max_attempts=int(doc["max_attempts"]),
            timeout=float(doc["timeout"]), created_at=float(doc["created_at"]),
            run_at=float(doc["run_at"]), attempts=int(doc.get("attempts", 0)),
            errors=tuple(doc.get("errors") or ()), state=str(doc.get("state", "available")),
            finished_at=doc.get("finished_at"), worker_id=doc.get("worker_id"),
            fair_key=_text(doc.get("fair_key")), unique_key=_text(doc.get("unique_key")),
            extra={k: v for k, v in doc.items() if k not in known},
        )
    except (TypeError, ValueError) as exc:
        raise BadMessage(f"a job message with a field of the wrong type: {exc}") from None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
