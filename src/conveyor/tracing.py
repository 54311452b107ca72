"""OpenTelemetry, when installed (``pip install 'conveyor[otel]'``): the trace context of the
code that enqueues travels in the job, and the worker runs each attempt in a span that
continues it. Without the package, every function here is a no-op.

The worker side is a pair of lifecycle hooks (docs/hooks.md), registered first on every app:
job_started opens the attempt's span and makes it current in the task's context; the
outcome's event (job_succeeded, job_failed, job_dead) ends it.
"""

from __future__ import annotations

import contextvars
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
    from .hooks import HookEvent, Hooks
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


# The attempt's span, between its job_started hook and its outcome's (the same context: the
# task's).
_span: contextvars.ContextVar[Any] = contextvars.ContextVar("conveyor_span", default=None)
# The span's conveyor.outcome attribute, by hook event.
_OUTCOMES = {"job_succeeded": "succeeded", "job_failed": "retry", "job_dead": "dead"}


def install(hooks: Hooks) -> None:
    """Register the worker's spans as hooks (the app does it when created)."""
    if not ENABLED:
        return
    hooks.add("job_started", started, wanted=_configured)
    for name in _OUTCOMES:
        hooks.add(name, finished, wanted=_configured)


def started(event: HookEvent) -> None:
    """job_started: open the attempt's span and make it current for the task."""
    if not _configured():
        return
    assert event.job is not None
    span = start_attempt(event.job)
    _span.set(span)
    otel_context.attach(trace.set_span_in_context(span))


def finished(event: HookEvent) -> None:
    """The outcome's event: record it (and its error, if any) on the span and end it."""
    span = _span.get()
    if span is None:  # a job that could not start (unknown task, bad signature): dead at once
        if not _configured():
            return
        assert event.job is not None
        span = start_attempt(event.job)
    else:
        _span.set(None)
    outcome = _OUTCOMES[event.name]
    if event.name == "job_succeeded":
        from .executor import current_job

        ctx = current_job()
        if ctx is not None and ctx.completed:
            outcome = "completed"  # its success committed in the task's transaction
    span.set_attribute("conveyor.outcome", outcome)
    error = event.error
    if error is not None:
        span.set_attribute("conveyor.error.kind", error.kind)
        span.set_attribute("exception.type", error.type)
        span.set_attribute("exception.message", error.message)
        span.set_status(Status(StatusCode.ERROR, error.message[:200]))
    span.end()
