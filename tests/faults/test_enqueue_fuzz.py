"""P2: hostile values through the public enqueue API on every backend. Each either round-trips
exactly (read back from the store) or raises a documented Conveyor error and writes nothing;
never a driver error, never a half-written row."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import Conveyor
from conveyor.errors import ConfigurationError, ConveyorError, InvalidName, PayloadError

EXAMPLES = int(os.environ.get("CONVEYOR_FUZZ_EXAMPLES", "60"))

hostile_text = st.one_of(
    st.text(max_size=50),
    st.sampled_from([
        "\x00", "a\x00b", "\ud800", "x\udfffy", "'; DROP TABLE conveyor_jobs;--", '"', "\\", "]]", "{{7*7}}",
        "<img src=x onerror=alert(1)>", "\u202e", "😀" * 10, "k" * 10_000, "%s%s%n", "$1", "KEYS *",
    ]),
)
hostile_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -0.0, 2**63, -(2**63), 2**64, 1e308, 5e-324]),
)
scalars = st.one_of(st.none(), st.booleans(), hostile_numbers, hostile_text)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)),
    max_leaves=20,
)
deep = st.integers(1, 200).map(lambda n: _nest(n))
not_json = st.sampled_from([object(), {1, 2}, b"bytes", (lambda: 0), complex(1, 2), {"k": {1}}, {1: "int key"}])


def _nest(n: int) -> Any:
    value: Any = "leaf"
    for _ in range(n):
        value = [value]
    return value


def _count(app: Conveyor) -> int:
    return sum(q.scheduled + q.available + q.running + q.succeeded + q.dead + q.cancelled
               for q in app.backend.stats().queues)


def _normalized(value: Any) -> Any:
    """What a JSON store gives back: tuples as lists (the only change a valid value may see)."""
    return json.loads(json.dumps(value, allow_nan=False))


def _check(app: Conveyor, call: Any, value: Any) -> None:
    before = _count(app)
    try:
        job = call()
    except (PayloadError, InvalidName, ConfigurationError) as exc:
        assert isinstance(exc, ConveyorError)
        assert str(exc)  # says what was wrong
        assert _count(app) == before, "a refused enqueue wrote something"
        return
    stored = app.get_job(job.id)
    assert stored.args == {"value": _normalized(value)}
    assert _count(app) == before + 1


def _target(value: Any) -> None: ...


settings_ = settings(max_examples=EXAMPLES, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings_
@given(value=st.one_of(values, deep, not_json))
def test_hostile_arguments_round_trip_or_are_refused_cleanly(app: Conveyor, value: Any) -> None:
    fuzz = app.tasks.get("fuzz") or app.task(name="fuzz")(_target)
    _check(app, lambda: fuzz.enqueue(value), value)


@settings_
@given(queue=st.one_of(hostile_text, st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True)),
       key=hostile_text, fair=hostile_text,
       priority=st.one_of(hostile_numbers, st.integers(-40000, 40000)))
def test_hostile_options_are_refused_or_stored_exactly(
    app: Conveyor, queue: str, key: str, fair: str, priority: Any,
) -> None:
    fuzz_opts = app.tasks.get("fuzz") or app.task(name="fuzz")(_target)

    key = f"{key}#{uuid.uuid4().hex}"  # one job per example: the store is shared across examples

    def call() -> Any:
        return fuzz_opts.options(queue=queue, unique_key=key, fair_key=fair, priority=priority).enqueue(1)

    before = _count(app)
    try:
        job = call()
    except (PayloadError, InvalidName, ConfigurationError) as exc:
        assert str(exc)
        assert _count(app) == before
        return
    stored = app.get_job(job.id)
    assert (stored.queue, stored.unique_key, stored.fair_key, stored.priority) == (queue, key, fair, priority)
    assert isinstance(priority, int) and not isinstance(priority, bool)
    STORED.append(queue)


STORED: list[str] = []  # the options fuzz must store some jobs, not only refuse them


def test_the_options_fuzz_stored_some_jobs() -> None:
    if STORED or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    raise AssertionError("no fuzzed enqueue was accepted: the strategy only produced refusals")
