"""OpenTelemetry, when installed (``pip install 'conveyor[otel]'``): the trace context of the
code that enqueues travels in the job, and the worker runs each attempt in a span that
continues it. Without the package, every function here is a no-op.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.propagate import extract, inject
    from opentelemetry.trace import SpanKind, Status, StatusCode

    ENABLED = True
except ImportError:  # optional dependency
    ENABLED = False

if TYPE_CHECKING:
    from .executor import Outcome
    from .job import Job

META_KEY = "trace"
# The API loads a provider named here on first use (read once: the environment of a worker
# does not change under it).
_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def carrier() -> dict[str, str] | None:
    """The caller's trace context as W3C headers (``traceparent``...), or None."""
    if not ENABLED:
        return None
    headers: dict[str, str] = {}
    inject(headers)
    return headers or None


def _configured() -> bool:
    """Whether a tracer provider is set (or named by the environment). Without one every span
    is a no-op, and skipping it saves each job a no-op span's work (docs/benchmarks.md, "Design
    measurements"). (``_TRACER_PROVIDER`` is the API's global; if a release renames it, spans
    are made as before.)"""
    if getattr(trace, "_TRACER_PROVIDER", True) is not None:
        return True
    return _FROM_ENV


def start_attempt(job: Job) -> Any:
    """A CONSUMER span for this attempt, child of the enqueuer's span if the job carries one."""
    if not ENABLED or not _configured():
        return None
    headers = job.meta.get(META_KEY) if isinstance(job.meta, dict) else None
    parent = extract(headers) if isinstance(headers, dict) else None
    tracer = trace.get_tracer("conveyor")
    return tracer.start_span(
        f"conveyor.job {job.task}", context=parent, kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "conveyor", "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.id), "conveyor.task": job.task,
            "conveyor.attempt": job.attempts, "conveyor.max_attempts": job.max_attempts,
        },
    )


def activate(span: Any) -> None:
    """Make ``span`` current in the calling context (run inside the task's copied context)."""
    if ENABLED and span is not None:
        otel_context.attach(trace.set_span_in_context(span))


def finish(span: Any, outcome: Outcome) -> None:
    """Record the attempt's outcome (and its error, if any) on ``span`` and end it."""
    if not ENABLED or span is None:
        return
    span.set_attribute("conveyor.outcome", outcome.kind)
    if outcome.error is not None:
        span.set_attribute("conveyor.error.kind", outcome.error.kind)
        span.set_attribute("exception.type", outcome.error.type)
        span.set_attribute("exception.message", outcome.error.message)
        span.set_status(Status(StatusCode.ERROR, outcome.error.message[:200]))
    span.end()
