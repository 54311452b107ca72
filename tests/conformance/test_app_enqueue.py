"""App-level enqueue through the public API, on every backend: validation at enqueue
(nothing malformed is ever stored), enqueue_many, options, get_job and aenqueue."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from conveyor import (
    ArgumentsError,
    ConfigurationError,
    Conveyor,
    InvalidName,
    JobNotFound,
    JobState,
    PayloadError,
    PayloadTooLarge,
    Task,
)


def stored_ids(app: Conveyor) -> list[int]:
    page = app.backend.list_jobs(limit=10_000)
    assert page.next_cursor is None
    return [j.id for j in page.jobs]


def total_in_stats(app: Conveyor) -> int:
    return sum(
        q.scheduled + q.available + q.running + q.succeeded + q.dead + q.cancelled
        for q in app.backend.stats().queues
    )


class NothingStored:
    """Asserts that the store holds exactly what it held on entry (no new job, by list and stats)."""

    def __init__(self, app: Conveyor) -> None:
        self.app = app

    def __enter__(self) -> NothingStored:
        self.ids = stored_ids(self.app)
        self.total = total_in_stats(self.app)
        return self

    def __exit__(self, *exc: object) -> None:
        assert stored_ids(self.app) == self.ids
        assert total_in_stats(self.app) == self.total


@pytest.fixture
def send(app: Conveyor) -> Task[..., Any]:
    @app.task(name="emails.send", max_attempts=5, timeout=30)
    def send_email(user_id: int, template: str = "welcome", *, cc: list[str] | None = None) -> None:
        pass

    return send_email


@pytest.fixture
def echo(app: Conveyor) -> Task[..., Any]:
    @app.task(name="echo")
    def echo(x: Any) -> Any:
        return x

    return echo


# -- the happy path --------------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_enqueue_stores_a_job_and_get_job_returns_every_field(
    app: Conveyor, send: Task[..., Any]
) -> None:
    job = send.enqueue(42, cc=["boss@example.com"])
    assert isinstance(job.id, int)

    stored = app.get_job(job.id)
    assert stored.id == job.id
    assert stored.task == "emails.send"
    assert stored.queue == "default"
    assert stored.args == {"user_id": 42, "cc": ["boss@example.com"]}
    assert stored.state is JobState.AVAILABLE
    assert stored.attempts == 0
    assert stored.max_attempts == 5
    assert stored.priority == 0
    assert abs(stored.run_at - app.backend.now()) < 5
    assert stored.timeout == 30
    assert stored.result is None
    assert stored.errors == []
    # What enqueue returned agrees with the store.
    for field in (
        "id",
        "task",
        "queue",
        "args",
        "state",
        "attempts",
        "max_attempts",
        "priority",
        "run_at",
        "timeout",
        "created_at",
        "unique_key",
    ):
        assert getattr(job, field) == getattr(stored, field), field


@pytest.mark.needs("lookup")
def test_enqueue_keeps_unicode_and_nested_values_exactly(
    app: Conveyor, echo: Task[..., Any]
) -> None:
    value = {
        "text": "héllo ✓ 日本 \U0001f600",
        "n": [1, -2, 3.5, True, None, 10**30],
        "nested": {"a": {"b": []}},
    }
    job = echo.enqueue(value)
    assert app.get_job(job.id).args == {"x": value}


@pytest.mark.needs("lookup")
def test_get_job_of_a_missing_id_raises_job_not_found(app: Conveyor, echo: Task[..., Any]) -> None:
    job = echo.enqueue(1)
    with pytest.raises(JobNotFound):
        app.get_job(job.id + 1000)
    with pytest.raises(InvalidName):
        app.get_job("1")  # type: ignore[arg-type]


# -- validation at enqueue: nothing malformed is stored ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),  # missing user_id
        ((1, "t", "extra"), {}),  # too many positionals
        ((1,), {"bogus": 2}),  # unknown keyword
        ((1,), {"user_id": 2}),  # given twice
        ((1, "t", ["cc"]), {}),  # keyword-only given positionally
    ],
    ids=["missing", "too-many", "unknown-kw", "twice", "kw-only-positional"],
)
@pytest.mark.needs("listing")
def test_arguments_that_do_not_bind_raise_arguments_error(
    app: Conveyor, send: Task[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    send.enqueue(1)  # the store is not empty: "nothing new" is checked against it
    with NothingStored(app), pytest.raises(ArgumentsError) as info:
        send.enqueue(*args, **kwargs)
    assert "emails.send" in str(info.value)


@pytest.mark.needs("listing")
def test_positional_only_parameters_cannot_be_given_by_keyword(app: Conveyor) -> None:
    @app.task(name="posonly")
    def posonly(a: int, /, b: int) -> None:
        pass

    with NothingStored(app), pytest.raises(ArgumentsError):
        posonly.enqueue(a=1, b=2)
    job = posonly.enqueue(1, b=2)
    assert app.get_job(job.id).args == {"a": 1, "b": 2}


def _deep(n: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(n - 1):
        value = [value]
    return value


def _cyclic() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


NOT_JSON = {
    "object": object(),
    "set": {1, 2},
    "bytes": b"raw",
    "datetime": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": -math.inf,
    "int-keys": {1: "one"},
    "tuple-keys": {(1, 2): "pair"},
    "nul-in-str": "a\x00b",
    "nul-in-key": {"a\x00": 1},
    "lone-surrogate": "\ud800",
    "nan-nested": {"ok": [1, {"bad": float("nan")}]},
    "object-nested": [1, [2, [object()]]],
    "too-deep": _deep(100),
    "cyclic": _cyclic(),
    "int-too-long": 10**5000,
}


@pytest.mark.parametrize("value", list(NOT_JSON.values()), ids=list(NOT_JSON))
@pytest.mark.needs("listing")
def test_values_that_are_not_json_raise_payload_error(
    app: Conveyor, echo: Task[..., Any], value: Any
) -> None:
    echo.enqueue("fine")
    with NothingStored(app), pytest.raises(PayloadError) as info:
        echo.enqueue(value)
    assert not isinstance(info.value, ArgumentsError | PayloadTooLarge)
    assert "echo" in str(info.value)  # names the task whose arguments are wrong


@pytest.mark.needs("listing")
def test_payload_error_names_the_offending_argument(app: Conveyor) -> None:
    @app.task(name="two_args")
    def two_args(good: int, bad: Any) -> None:
        pass

    with NothingStored(app), pytest.raises(PayloadError) as info:
        two_args.enqueue(1, {"inner": object()})
    assert "bad" in str(info.value) and "inner" in str(info.value)


@pytest.mark.needs("lookup")
def test_moderate_nesting_is_accepted(app: Conveyor, echo: Task[..., Any]) -> None:
    job = echo.enqueue(_deep(30))
    assert app.get_job(job.id).args == {"x": _deep(30)}


def _encoded_size(bound: dict[str, Any]) -> int:
    return len(json.dumps(bound, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


@pytest.mark.parametrize("char", ["x", "é", "日"], ids=["ascii", "2-byte", "3-byte"])
@pytest.mark.needs("lookup")
def test_payload_size_limit_is_inclusive_and_counts_utf8_bytes(
    make_app: Callable[..., Conveyor], char: str
) -> None:
    limit = 200
    app = make_app(max_payload_bytes=limit)

    @app.task(name="blob")
    def blob(s: str) -> None:
        pass

    overhead = _encoded_size({"s": ""})
    width = len(char.encode("utf-8"))
    n = (limit - overhead) // width
    fits = char * n + "x" * ((limit - overhead) - n * width)
    assert _encoded_size({"s": fits}) == limit

    job = blob.enqueue(fits)
    assert app.get_job(job.id).args == {"s": fits}

    too_big = fits + char
    assert _encoded_size({"s": too_big}) > limit
    with NothingStored(app), pytest.raises(PayloadTooLarge) as info:
        blob.enqueue(too_big)
    assert str(limit) in str(info.value)


@pytest.mark.needs("listing")
def test_default_payload_limit_is_enforced(app: Conveyor, echo: Task[..., Any]) -> None:
    with NothingStored(app), pytest.raises(PayloadTooLarge):
        echo.enqueue("x" * (app.max_payload_bytes + 1))


BAD_QUEUES = ["", "has space", "a/b", "x" * 129, "ü", "new\nline", 5]
BAD_QUEUE_IDS = ["empty", "space", "slash", "too-long", "non-ascii", "newline", "int"]


@pytest.mark.parametrize("queue", BAD_QUEUES, ids=BAD_QUEUE_IDS)
@pytest.mark.needs("listing")
def test_invalid_queue_names_raise_invalid_name(
    app: Conveyor, echo: Task[..., Any], queue: Any
) -> None:
    echo.enqueue(1)
    with NothingStored(app), pytest.raises(InvalidName):
        echo.options(queue=queue).enqueue(1)


@pytest.mark.parametrize("queue", BAD_QUEUES, ids=BAD_QUEUE_IDS)
def test_task_decorator_refuses_invalid_queue_names(app: Conveyor, queue: Any) -> None:
    # An explicit queue="" must not silently become the default queue.
    with pytest.raises(InvalidName):
        app.task(name="elsewhere", queue=queue)(lambda: None)
    assert "elsewhere" not in app.tasks


@pytest.mark.parametrize("queue", ["a", "high.priority:eu-west_1", "x" * 128, "emails{acme}"])
@pytest.mark.needs("lookup")
def test_valid_queue_names_are_accepted(app: Conveyor, echo: Task[..., Any], queue: str) -> None:
    job = echo.options(queue=queue).enqueue(1)
    assert app.get_job(job.id).queue == queue


# Braces: a Redis hash tag (``emails{acme}`` and ``reports{acme}`` share a partition of an app
# spread over shards). Anywhere else they are two more characters, on every store and in every
# shape: a tag, a lone brace, a name that is all tag, one that looks like a URL placeholder.
BRACED = ["emails{acme}", "reports{acme}", "a}b{c", "{action}", "{}"]


@pytest.mark.needs("lookup")
def test_queue_names_with_braces_run_and_count_like_any(
    app: Conveyor, echo: Task[..., Any]
) -> None:
    from support import running_worker, wait_for_job

    jobs = {q: echo.options(queue=q).enqueue(q) for q in BRACED}
    with running_worker(app, queues=BRACED, concurrency=2):
        done = {q: wait_for_job(app, jobs[q].id) for q in BRACED}
    for q in BRACED:
        assert done[q].state == JobState.SUCCEEDED and done[q].result == q, done[q]
        assert done[q].queue == q
    by_queue = {q.queue: q for q in app.backend.stats().queues}
    for q in BRACED:
        assert by_queue[q].succeeded == 1, (q, by_queue.get(q))


@pytest.mark.needs("lookup", "pause")
def test_queue_names_with_braces_pause_and_resume(app: Conveyor, echo: Task[..., Any]) -> None:
    from support import running_worker, wait_for_job

    held = echo.options(queue="{action}").enqueue(1)
    other = echo.options(queue="emails{acme}").enqueue(2)
    assert app.backend.pause_queue("{action}") is True
    assert set(app.backend.paused_queues()) == {"{action}"}
    with running_worker(app, queues=["{action}", "emails{acme}"], concurrency=2):
        assert wait_for_job(app, other.id).state == JobState.SUCCEEDED
        assert app.get_job(held.id).state == JobState.AVAILABLE
        assert app.backend.resume_queue("{action}") is True
        assert wait_for_job(app, held.id).state == JobState.SUCCEEDED


@pytest.mark.parametrize(
    "name",
    ["", "has space", "x" * 256, "semi;colon"],
    ids=["empty", "space", "too-long", "semicolon"],
)
def test_invalid_task_names_raise_invalid_name(app: Conveyor, name: str) -> None:
    # An explicit name="" must not silently become the function's qualified name.
    with pytest.raises(InvalidName):
        app.task(name=name)(lambda: None)
    assert app.tasks == {}


# -- enqueue_many ---------------------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_enqueue_many_takes_tuples_and_dicts(app: Conveyor, send: Task[..., Any]) -> None:
    jobs = send.enqueue_many(
        [(1,), (2, "reset"), {"user_id": 3}, {"user_id": 4, "cc": ["x@y"]}, [5]]
    )
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
    assert [app.get_job(j.id).args for j in jobs] == [
        {"user_id": 1},
        {"user_id": 2, "template": "reset"},
        {"user_id": 3},
        {"user_id": 4, "cc": ["x@y"]},
        {"user_id": 5},
    ]
    assert all(app.get_job(j.id).state is JobState.AVAILABLE for j in jobs)
    assert sorted(stored_ids(app)) == [j.id for j in jobs]


ENQUEUE_KNOWS = ("id", "task", "queue", "args", "state", "attempts", "max_attempts", "priority", "run_at",
                 "timeout", "created_at", "unique_key", "meta", "errors", "steps", "result")


@pytest.mark.parametrize("opts", [{}, {"delay": 60, "priority": 3, "queue": "other", "max_attempts": 2},
                                  {"unique_key": "one-of-them"}], ids=["plain", "delayed", "unique"])
@pytest.mark.needs("lookup", "unique")
def test_enqueue_many_returns_what_the_store_holds(
    app: Conveyor, send: Task[..., Any], opts: dict[str, Any]
) -> None:
    """The jobs a bulk enqueue hands back are built from one shared template per batch: each is
    still its own, field for field what get_job reads, with lists and dicts of its own."""
    jobs = send.options(**opts).enqueue_many([(i, f"t{i}") for i in range(5)])
    for job in jobs:
        stored = app.get_job(job.id)
        for field in ENQUEUE_KNOWS:
            assert getattr(job, field) == getattr(stored, field), (field, job.id)
    if "unique_key" in opts:
        assert len({j.id for j in jobs}) == 1
        return
    assert [j.args for j in jobs] == [{"user_id": i, "template": f"t{i}"} for i in range(5)]
    assert len({id(j.errors) for j in jobs}) == len({id(j.steps) for j in jobs}) == len(jobs)
    jobs[0].errors.append({"kind": "mutated"})
    assert jobs[1].errors == []


@pytest.mark.parametrize(
    "bad_item",
    [(1, 2, 3, 4), {"nope": 1}, (object(),), "a string", 7, {"user_id": float("nan")}],
    ids=["too-many", "unknown-kw", "not-json", "str-item", "int-item", "nan"],
)
@pytest.mark.needs("listing")
def test_a_bad_item_in_enqueue_many_writes_nothing(
    app: Conveyor, send: Task[..., Any], bad_item: Any
) -> None:
    send.enqueue(0)
    with NothingStored(app), pytest.raises(PayloadError):
        send.enqueue_many([(1,), {"user_id": 2}, bad_item, (4,)])


@pytest.mark.needs("listing")
def test_enqueue_many_of_nothing(app: Conveyor, send: Task[..., Any]) -> None:
    with NothingStored(app):
        assert send.enqueue_many([]) == []


# -- options ------------------------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_options_delay_schedules_the_job(app: Conveyor, echo: Task[..., Any]) -> None:
    job = echo.options(delay=60).enqueue(1)
    stored = app.get_job(job.id)
    assert stored.state is JobState.SCHEDULED
    assert stored.run_at == pytest.approx(stored.created_at + 60)
    assert job.state is JobState.SCHEDULED

    job2 = echo.options(delay=dt.timedelta(minutes=2)).enqueue(2)
    stored2 = app.get_job(job2.id)
    assert stored2.state is JobState.SCHEDULED
    assert stored2.run_at == pytest.approx(stored2.created_at + 120)


@pytest.mark.needs("lookup")
def test_options_run_at_takes_an_aware_datetime(app: Conveyor, echo: Task[..., Any]) -> None:
    when = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    job = echo.options(run_at=when).enqueue(1)
    stored = app.get_job(job.id)
    assert stored.state is JobState.SCHEDULED
    assert stored.run_at == pytest.approx(when.timestamp())
    assert stored.run_at_datetime() == when

    other_tz = dt.datetime(2020, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    past = app.get_job(echo.options(run_at=other_tz).enqueue(2).id)
    assert past.run_at == other_tz.timestamp()
    assert past.state is JobState.AVAILABLE  # in the past: due at once


@pytest.mark.needs("listing")
def test_options_run_at_refuses_a_naive_datetime(app: Conveyor, echo: Task[..., Any]) -> None:
    with NothingStored(app), pytest.raises(ConfigurationError):
        echo.options(run_at=dt.datetime(2030, 1, 1)).enqueue(1)


@pytest.mark.needs("lookup")
def test_options_priority_queue_attempts_timeout(app: Conveyor, echo: Task[..., Any]) -> None:
    job = echo.options(priority=-5, queue="urgent", max_attempts=2, timeout=3.5).enqueue(1)
    stored = app.get_job(job.id)
    assert (stored.priority, stored.queue, stored.max_attempts, stored.timeout) == (
        -5,
        "urgent",
        2,
        3.5,
    )
    # options() does not change the task's own defaults.
    plain = app.get_job(echo.enqueue(2).id)
    assert (plain.priority, plain.queue, plain.max_attempts, plain.timeout) == (
        0,
        "default",
        app.default_max_attempts,
        app.default_timeout,
    )


@pytest.mark.parametrize(
    "opts",
    [
        {"delay": -1},
        {"delay": float("nan")},
        {"priority": 10**6},
        {"priority": 1.5},
        {"max_attempts": 0},
        {"timeout": 0},
        {"timeout": float("inf")},
        {"unique_key": ""},
        {"unique_key": "k" * 256},
    ],
    ids=[
        "neg-delay",
        "nan-delay",
        "huge-priority",
        "float-priority",
        "zero-attempts",
        "zero-timeout",
        "inf-timeout",
        "empty-key",
        "long-key",
    ],
)
@pytest.mark.needs("listing")
def test_bad_options_are_refused(app: Conveyor, echo: Task[..., Any], opts: dict[str, Any]) -> None:
    with NothingStored(app), pytest.raises(ConfigurationError):
        echo.options(**opts).enqueue(1)


@pytest.mark.needs("unique")
def test_options_unique_key_deduplicates_unfinished_jobs(
    app: Conveyor, echo: Task[..., Any]
) -> None:
    first = echo.options(unique_key="welcome:42").enqueue(1)
    second = echo.options(unique_key="welcome:42").enqueue(2)
    assert second.id == first.id
    assert second.args == {"x": 1}  # the existing job, not the new call
    assert stored_ids(app) == [first.id]
    other = echo.options(unique_key="welcome:43").enqueue(3)
    assert other.id != first.id

    assert app.backend.cancel(first.id)
    third = echo.options(unique_key="welcome:42").enqueue(4)
    assert third.id not in (first.id, other.id)
    assert app.get_job(third.id).args == {"x": 4}


# -- async ----------------------------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_aenqueue_from_async_code(app: Conveyor, send: Task[..., Any]) -> None:
    async def main() -> tuple[Any, Any]:
        one = await send.aenqueue(7, template="promo")
        many = await send.aenqueue_many([(8,), {"user_id": 9}])
        return one, many

    one, many = asyncio.run(main())
    assert app.get_job(one.id).args == {"user_id": 7, "template": "promo"}
    assert [app.get_job(j.id).args for j in many] == [{"user_id": 8}, {"user_id": 9}]
    assert sorted(stored_ids(app)) == sorted([one.id, *(j.id for j in many)])


@pytest.mark.needs("listing")
def test_aenqueue_validates_before_storing(app: Conveyor, send: Task[..., Any]) -> None:
    async def main() -> None:
        with pytest.raises(ArgumentsError):
            await send.aenqueue()
        with pytest.raises(PayloadError):
            await send.aenqueue(object())

    with NothingStored(app):
        asyncio.run(main())
