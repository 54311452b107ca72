"""RetryPolicy: exponential backoff with full jitter."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import Retry, RetryPolicy


def exact_ceiling(p: RetryPolicy, attempt: int) -> float:
    """min(cap, base * factor**(n-1)), computed the plain way (overflow means "above the cap")."""
    n = max(attempt, 1) - 1
    if p.base == 0:
        return 0.0
    try:
        raw = p.base * p.factor**n
    except OverflowError:
        raw = math.inf
    return min(p.cap, raw)


def test_ceiling_doubles_from_base_until_the_cap() -> None:
    p = RetryPolicy(base=1.0, factor=2.0, cap=100.0, jitter=False)
    assert [p.ceiling(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 64, 100, 100]


def test_attempts_below_one_count_as_the_first() -> None:
    p = RetryPolicy(base=3.0, factor=2.0, cap=100.0)
    assert p.ceiling(0) == p.ceiling(-5) == p.ceiling(1) == 3.0


def test_delay_stays_within_zero_and_the_ceiling() -> None:
    rng = random.Random(1)
    p = RetryPolicy(base=0.5, factor=3.0, cap=600.0)
    for attempt in range(1, 40):
        top = min(600.0, 0.5 * 3.0 ** (attempt - 1))
        assert p.ceiling(attempt) == pytest.approx(top)
        for _ in range(200):
            d = p.delay(attempt, rng)
            assert 0.0 <= d <= top


def test_ceiling_is_monotonic_non_decreasing() -> None:
    for p in (
        RetryPolicy(),
        RetryPolicy(base=0.01, factor=1.5, cap=7.0),
        RetryPolicy(base=2, factor=1, cap=5),
    ):
        ceilings = [p.ceiling(n) for n in range(1, 3000)]
        assert all(a <= b for a, b in itertools.pairwise(ceilings))
        assert ceilings[-1] == (min(p.cap, p.base) if p.factor == 1 else p.cap)


@pytest.mark.parametrize("attempt", [1_000, 10_000, 10**9])
def test_huge_attempt_numbers_do_not_overflow(attempt: int) -> None:
    p = RetryPolicy(base=1.0, factor=2.0, cap=3600.0)
    assert p.ceiling(attempt) == 3600.0
    assert 0.0 <= p.delay(attempt, random.Random(0)) <= 3600.0
    assert RetryPolicy(base=1.0, factor=1e100, cap=1e300).ceiling(attempt) == 1e300


@pytest.mark.parametrize(
    ("base", "cap"),
    [(1e-10, 1e300), (5e-324, 1.0), (1e-300, 1e10), (2.0, 5e-324)],
    ids=["tiny-base-huge-cap", "subnormal-base", "cap/base>1e308", "cap/base-underflows"],
)
def test_extreme_base_and_cap_do_not_overflow(base: float, cap: float) -> None:
    p = RetryPolicy(base=base, factor=2.0, cap=cap)
    for attempt in (1, 100, 1100, 10_000):
        top = p.ceiling(attempt)
        assert top == pytest.approx(exact_ceiling(p, attempt), rel=1e-9)
        assert 0.0 <= p.delay(attempt, random.Random(attempt)) <= top
    assert p.ceiling(10_000) == cap


def test_an_infinite_cap_is_refused_or_never_gives_an_infinite_delay() -> None:
    try:
        p = RetryPolicy(base=1.0, factor=2.0, cap=math.inf)
    except ValueError:
        return  # refused up front: fine
    for attempt in (1, 1100, 10_000):
        assert math.isfinite(p.ceiling(attempt))
        assert math.isfinite(p.delay(attempt, random.Random(0)))


def test_without_jitter_the_delay_is_the_ceiling() -> None:
    p = RetryPolicy(base=0.25, factor=2.0, cap=10.0, jitter=False)
    assert [p.delay(n) for n in range(1, 8)] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0]


def test_zero_base_or_zero_cap_means_no_delay() -> None:
    assert RetryPolicy(base=0.0).delay(5) == 0.0
    assert RetryPolicy(base=1.0, cap=0.0).delay(5) == 0.0


def test_full_jitter_mean_is_half_the_ceiling() -> None:
    rng = random.Random(12345)
    p = RetryPolicy(base=1.0, factor=2.0, cap=3600.0)
    for attempt in (1, 4, 20):
        top = p.ceiling(attempt)
        samples = [p.delay(attempt, rng) for _ in range(20_000)]
        assert statistics.fmean(samples) == pytest.approx(top / 2, rel=0.05)
        assert min(samples) >= 0 and max(samples) <= top
        # Spread over the whole range, not clustered: both quarters at the ends are hit.
        assert min(samples) < top / 4 and max(samples) > 3 * top / 4


@pytest.mark.parametrize(
    "kwargs",
    [{"base": -1.0}, {"factor": 0.5}, {"cap": -1.0}, {"base": math.nan}, {"factor": math.nan}],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


@settings(max_examples=400, deadline=None)
@given(
    base=st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1e4)),
    factor=st.floats(min_value=1.0, max_value=1e3),
    cap=st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1e7)),
    attempt=st.integers(min_value=-3, max_value=200_000),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_delay_property(base: float, factor: float, cap: float, attempt: int, seed: int) -> None:
    p = RetryPolicy(base=base, factor=factor, cap=cap)
    top = p.ceiling(attempt)
    assert top == pytest.approx(exact_ceiling(p, attempt), rel=1e-9, abs=1e-12)
    assert 0.0 <= top <= cap
    assert p.ceiling(attempt + 1) >= top
    d = p.delay(attempt, random.Random(seed))
    assert 0.0 <= d <= top
    assert RetryPolicy(base=base, factor=factor, cap=cap, jitter=False).delay(attempt) == top


@pytest.mark.parametrize("delay", [-0.1, math.nan])
def test_retry_exception_refuses_a_bad_delay(delay: float) -> None:
    with pytest.raises(ValueError):
        Retry(delay=delay)


def test_retry_exception_keeps_its_delay_and_reason() -> None:
    r = Retry(delay=1.5, reason="rate limited")
    assert (r.delay, r.reason, str(r)) == (1.5, "rate limited", "rate limited")
    assert Retry().delay is None


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0])
def test_retry_refuses_a_delay_that_is_not_a_finite_non_negative_number(bad: float) -> None:
    from conveyor import Retry

    with pytest.raises(ValueError, match="finite"):
        Retry(delay=bad)
