"""When a worker runs its next prune pass: by the rate the last pass found, within bounds."""

from __future__ import annotations

from conveyor.retention import PruneOutcome, next_pass_in

SHORTEST, LONGEST = 1.0, 60.0


def next_in(outcome: PruneOutcome, since_last: float) -> float:
    return next_pass_in(outcome, since_last, batch=1000, shortest=SHORTEST, longest=LONGEST)


def test_a_pass_that_stopped_with_more_is_followed_at_once() -> None:
    assert next_in(PruneOutcome(100_000, more=True), 60.0) == 0.0


def test_the_next_pass_comes_when_about_a_batch_is_due_again() -> None:
    assert next_in(PruneOutcome(6000), 60.0) == 10.0  # 100 jobs/s: a batch every 10 s


def test_slow_systems_prune_every_interval_and_fast_ones_every_round() -> None:
    assert next_in(PruneOutcome(10), 60.0) == LONGEST
    assert next_in(PruneOutcome(0), 60.0) == LONGEST
    assert next_in(PruneOutcome(skipped=True), 60.0) == LONGEST  # another worker prunes
    assert next_in(PruneOutcome(50_000), 5.0) == SHORTEST
