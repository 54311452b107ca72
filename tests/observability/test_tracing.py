"""OpenTelemetry: the enqueuer's trace continues in the worker, one span per attempt."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support import running_worker, wait_for_job

from conveyor import Conveyor, JobState, Retry, current_job

_exporter = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_exporter))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process; every test shares it and clears it.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(_provider)
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def test_attempt_spans_continue_the_enqueuers_trace(app: Conveyor, spans: InMemorySpanExporter) -> None:
    @app.task(name="traced")
    def traced(n: int) -> int:
        ctx = current_job()
        assert ctx is not None
        with trace.get_tracer("test").start_as_current_span("inside-task"):
            pass
        if ctx.attempt == 1:
            raise Retry(delay=0.01)
        return n

    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("web-request") as parent:
        job = traced.enqueue(5)
    assert "traceparent" in app.get_job(job.id).meta["trace"]

    with running_worker(app, concurrency=1):
        done = wait_for_job(app, job.id)
    assert done.state is JobState.SUCCEEDED

    finished = spans.get_finished_spans()
    attempts = [s for s in finished if s.name == "conveyor.job traced"]
    assert len(attempts) == 2  # one span per attempt
    trace_id = parent.get_span_context().trace_id
    for s in attempts:
        assert s.kind is SpanKind.CONSUMER
        assert s.context.trace_id == trace_id
        assert s.parent is not None and s.parent.span_id == parent.get_span_context().span_id
        assert s.attributes["messaging.message.id"] == str(job.id)
    first, second = sorted(attempts, key=lambda s: s.attributes["conveyor.attempt"])
    assert first.attributes["conveyor.outcome"] == "retry"
    assert first.status.status_code is StatusCode.ERROR
    assert second.attributes["conveyor.outcome"] == "succeeded"
    # Spans the task opens are children of its attempt span, in the worker's thread too.
    inner = [s for s in finished if s.name == "inside-task"]
    assert {s.parent.span_id for s in inner if s.parent} == {a.context.span_id for a in attempts}


def test_no_trace_context_no_meta(app: Conveyor, spans: InMemorySpanExporter) -> None:
    @app.task(name="plain")
    def plain() -> None: ...

    job = plain.enqueue()  # no active span
    assert app.get_job(job.id).meta == {}
    with running_worker(app, concurrency=1):
        wait_for_job(app, job.id)
    [span] = [s for s in spans.get_finished_spans() if s.name == "conveyor.job plain"]
    assert span.parent is None
