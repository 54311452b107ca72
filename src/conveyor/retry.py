"""Retry policy: exponential backoff with full jitter; and which exceptions are retried.

Full jitter (a uniform draw between 0 and the exponential ceiling) spreads a burst of
failures out instead of retrying them in lock-step against a struggling dependency.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ConfigurationError, Reject, Retry

ExceptionClasses = tuple[type[Exception], ...]
# What retry_on/dead_on accept: one exception class or a sequence of them.
ExceptionFilter = type[Exception] | Sequence[type[Exception]]


@dataclass(frozen=True)
class RetryPolicy:
    """``delay(n)`` for failed attempt ``n`` (1-based) is uniform in
    ``[0, min(cap, base * factor**(n-1))]``."""

    base: float = 1.0
    """Seconds: the ceiling of the first retry's delay."""
    factor: float = 2.0
    """Each further attempt multiplies the ceiling by this (>= 1)."""
    cap: float = 3600.0
    """Seconds: no delay is longer than this."""
    jitter: bool = True
    """Draw the delay uniformly below the ceiling (full jitter); False: always the ceiling."""

    def __post_init__(self) -> None:
        values = (self.base, self.factor, self.cap)
        if not all(math.isfinite(v) for v in values) or not (
            self.base >= 0 and self.factor >= 1 and self.cap >= 0
        ):
            raise ValueError(f"invalid retry policy {self!r}: need finite base >= 0, factor >= 1, "
                             "cap >= 0 (seconds)")

    def ceiling(self, attempt: int) -> float:
        """The largest delay for this attempt, without jitter."""
        n = max(attempt, 1) - 1
        if self.base == 0 or self.cap == 0:
            return 0.0
        # Compare exponents first: factor**n overflows a float long before n reaches 2000.
        room = math.log(self.cap) - math.log(self.base)
        if self.factor > 1 and n * math.log(self.factor) >= room:
            return self.cap
        try:
            return min(self.cap, self.base * self.factor**n)
        except OverflowError:
            return self.cap

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retrying after failed attempt ``attempt`` (1-based)."""
        top = self.ceiling(attempt)
        if not self.jitter:
            return top
        return (rng or random).uniform(0.0, top)


DEFAULT_RETRY_POLICY = RetryPolicy()


def exception_classes(value: ExceptionFilter, what: str) -> ExceptionClasses:
    """A task's ``retry_on``/``dead_on`` as a tuple of exception classes (one class is a tuple
    of one), checked when the task is declared: a typo then fails at import, not at the first
    failure in production. Retry and Reject are refused: they already say what to do."""
    items = value if isinstance(value, list | tuple) else (value,)
    for cls in items:
        if not isinstance(cls, type) or not issubclass(cls, Exception):
            # A BaseException that is not an Exception (KeyboardInterrupt, SystemExit) never
            # reaches a task's outcome: it stops the worker, or is made a TaskExit.
            raise ConfigurationError(
                f"{what} must be exception classes (subclasses of Exception), e.g. "
                f"(ConnectionError, TimeoutError); got {cls!r} in {value!r}")
        if issubclass(cls, Retry | Reject):
            raise ConfigurationError(
                f"{what}: {cls.__name__} is not a failure to filter; raising it already "
                "decides (Retry: another attempt, Reject: dead at once)")
    return tuple(items)
