"""P4 of the reliability plan: properties of the cron schedule's tick arithmetic, over random
valid expressions and instants in three time zones (two of them with daylight saving).

- ``next_tick(t) > t``, and it is a tick: ``latest_tick(next_tick(t)) == next_tick(t)``;
  ``latest_tick(t) <= t < next_tick(latest_tick(t))``;
- nothing between ``t`` and ``next_tick(t)`` is skipped: ``next_tick(next_tick(t) - 0.5 s)``
  is ``next_tick(t)`` again;
- across a daylight-saving change, ticks strictly increase (no instant fires twice), and a
  schedule whose hour field is not ``*`` fires each wall-clock time at most once a day (the
  repeated hour when clocks go back is not a second 01:30).
"""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.cron import Schedule

ZONES = ("UTC", "Europe/Berlin", "America/New_York")
# Unix seconds between 2020 and 2031: both DST directions, leap days.
INSTANTS = st.floats(min_value=1_577_836_800, max_value=1_924_992_000, allow_nan=False)
# The days clocks change in each zone (2026): fall back and spring forward.
CHANGES = {
    "Europe/Berlin": [dt.datetime(2026, 10, 24, 12), dt.datetime(2026, 3, 28, 12)],
    "America/New_York": [dt.datetime(2026, 10, 31, 12), dt.datetime(2026, 3, 7, 12)],
    "UTC": [dt.datetime(2026, 10, 24, 12)],
}


def field(lo: int, hi: int) -> st.SearchStrategy[str]:
    value = st.integers(lo, hi)
    return st.one_of(
        st.just("*"),
        value.map(str),
        st.integers(2, max(2, (hi - lo) // 2)).map(lambda k: f"*/{k}"),
        st.tuples(value, value).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.lists(value, min_size=2, max_size=4, unique=True).map(lambda xs: ",".join(map(str, sorted(xs)))),
    )


EXPRESSIONS = st.tuples(field(0, 59), field(0, 23), st.sampled_from(["*", "1", "15", "1-10"]),
                        st.sampled_from(["*", "1-6", "3,10"]), st.sampled_from(["*", "1-5", "0"])).map(" ".join)


def schedule(expression: str, zone: str) -> Schedule:
    return Schedule(name="p4", expression=expression, task="t", queue="q", timezone=zone)


@settings(max_examples=150, deadline=None)
@given(expression=EXPRESSIONS, zone=st.sampled_from(ZONES), t=INSTANTS)
def test_next_tick_is_the_first_tick_strictly_after(expression: str, zone: str, t: float) -> None:
    s = schedule(expression, zone)
    nxt = s.next_tick(t)
    assert nxt > t
    assert s.latest_tick(nxt) == nxt
    assert s.next_tick(nxt - 0.5) == nxt
    assert s.next_tick(max(t, nxt - 0.5)) == nxt
    last = s.latest_tick(t)
    assert last <= t < s.next_tick(last)


@settings(max_examples=60, deadline=None)
@given(expression=EXPRESSIONS, zone=st.sampled_from(ZONES), which=st.integers(0, 1))
def test_no_instant_fires_twice_across_a_daylight_saving_change(expression: str, zone: str, which: int) -> None:
    s = schedule(expression, zone)
    day = CHANGES[zone][which % len(CHANGES[zone])]
    start = day.replace(tzinfo=ZoneInfo(zone)).timestamp()
    end = start + 36 * 3600
    ticks: list[float] = []
    t = start
    while len(ticks) < 3000:
        t = s.next_tick(t)
        if t > end:
            break
        ticks.append(t)
    assert all(a < b for a, b in itertools.pairwise(ticks)), "ticks must strictly increase"
    for a, b in list(itertools.pairwise(ticks))[:200]:
        assert s.latest_tick((a + b) / 2) == a, "the latest tick between two ticks is the first"
    if expression.split()[1] != "*":
        walls = [dt.datetime.fromtimestamp(x, ZoneInfo(zone)).replace(tzinfo=None, fold=0) for x in ticks]
        assert len(walls) == len(set(walls)), "a wall-clock time fired twice"


def test_every_minute_of_a_repeated_hour_is_skipped_to_the_next_day() -> None:
    """Found by the property above: at 01:59 EDT on 1 November 2026 the next tick of
    "* 1 * * *" is 01:00 the next day (the 60 ticks of the repeated 01:00-01:59 EST are
    repeats); the search gave up after 8 of them and raised ConfigurationError."""
    ny = ZoneInfo("America/New_York")
    s = schedule("* 1 * * *", "America/New_York")
    at_0159_edt = dt.datetime(2026, 11, 1, 5, 59, tzinfo=dt.UTC).timestamp()
    assert s.next_tick(at_0159_edt) == dt.datetime(2026, 11, 2, 1, 0, tzinfo=ny).timestamp()
    # And while the repeated hour runs, the latest tick is still 01:59 EDT.
    assert s.latest_tick(at_0159_edt + 1800) == at_0159_edt


@pytest.mark.parametrize("expression", ["* * * * *", "0 * * * *"])
def test_an_instant_a_fraction_of_a_microsecond_before_a_tick_is_before_it(expression: str) -> None:
    """datetime.fromtimestamp rounds to the nearest microsecond: 0.2 us before a tick became the
    tick itself, so latest_tick returned a tick after ``now`` and next_tick skipped that tick
    (found by the property above)."""
    s = schedule(expression, "UTC")
    t = 1924991999.9999998  # 2030-12-31 23:59:59.9999998 UTC; a tick at 1924992000
    assert s.latest_tick(t) <= t
    assert s.next_tick(t) == 1924992000.0
