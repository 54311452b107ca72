"""Queue weights: parsing ``--queues`` and splitting free slots across queues."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import ConfigurationError, InvalidName
from conveyor.worker import parse_queues, plan_claims


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("high:6,default:3,low:1", {"high": 6, "default": 3, "low": 1}),
        ("default", {"default": 1}),
        (" a:2 , b ,", {"a": 2, "b": 1}),
        (["x", "y:4"], {"x": 1, "y": 4}),
        ({"p": 5, "q": 1}, {"p": 5, "q": 1}),
        ("ns:emails:3", {"ns:emails": 3}),  # a queue name with a colon and a weight
        ("ns:emails", {"ns:emails": 1}),  # ... and without one: the part after ':' is no number
    ],
)
def test_parse_queues(spec: object, expected: dict[str, int]) -> None:
    result = parse_queues(spec)  # type: ignore[arg-type]
    assert result == expected
    assert list(result) == list(expected)  # order kept: it is the tie-break order


@pytest.mark.parametrize("spec", ["", " , ", [], {}, "a:0", "a:-1", {"a": 0}])
def test_parse_queues_refuses_bad_specs(spec: object) -> None:
    with pytest.raises(ConfigurationError):
        parse_queues(spec)  # type: ignore[arg-type]


def test_parse_queues_refuses_a_non_ascii_digit_weight_clearly() -> None:
    # "²".isdigit() is True but int("²") fails: must still be a ConfigurationError naming the part.
    with pytest.raises((ConfigurationError, InvalidName)) as info:
        parse_queues("high:²")
    assert "high" in str(info.value)


@pytest.mark.parametrize("spec", ["bad name:1", "a/b", ["ü"]])
def test_parse_queues_refuses_bad_names(spec: object) -> None:
    with pytest.raises(InvalidName):
        parse_queues(spec)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    weights=st.dictionaries(
        st.sampled_from(["high", "default", "low", "q1", "q2", "q3"]),
        st.integers(1, 20),
        min_size=1,
    ),
    free=st.integers(0, 64),
    seed=st.integers(0, 2**32 - 1),
)
def test_plan_claims_splits_exactly_the_free_slots_over_known_queues(
    weights: dict[str, int], free: int, seed: int
) -> None:
    plan = plan_claims(free, weights, random.Random(seed))
    names = [name for name, _ in plan]
    assert sorted(names) == sorted(weights)  # every queue once, nothing else
    assert all(count >= 0 for _, count in plan)
    assert sum(count for _, count in plan) == free


def test_plan_claims_with_one_queue_gives_it_everything() -> None:
    assert plan_claims(7, {"only": 3}, random.Random(0)) == [("only", 7)]


@pytest.mark.parametrize("free", [1, 8])
def test_plan_claims_shares_follow_the_weights_over_many_rounds(free: int) -> None:
    weights = {"high": 6, "default": 3, "low": 1}
    rng = random.Random(20240601)
    totals: Counter[str] = Counter()
    rounds = 40_000 // free
    for _ in range(rounds):
        for name, count in plan_claims(free, weights, rng):
            totals[name] += count
    total = sum(totals.values())
    assert total == rounds * free
    for name, weight in weights.items():
        assert totals[name] / total == pytest.approx(weight / 10, abs=0.02), (name, totals)


def test_plan_claims_order_favours_heavier_queues() -> None:
    """The order decides who gets leftover slots; heavier queues should come first more often."""
    weights = {"high": 6, "default": 3, "low": 1}
    rng = random.Random(7)
    first = Counter(plan_claims(1, weights, rng)[0][0] for _ in range(20_000))
    assert first["high"] > first["default"] > first["low"] > 0


def test_plan_claims_is_deterministic_for_a_seed() -> None:
    weights = {"a": 2, "b": 5, "c": 1}
    assert [plan_claims(5, weights, random.Random(3)) for _ in range(3)] == [
        plan_claims(5, weights, random.Random(3))
    ] * 3
