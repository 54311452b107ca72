"""What a dashboard server remembers about sessions and clients: revoked sessions and failed
attempts. In memory, per process: replicas each keep their own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Failed attempts: this many are free, then each one doubles the wait, up to MAX_DELAY seconds.
FREE_FAILURES = 5
MAX_DELAY = 300.0
MAX_TRACKED_CLIENTS = 10_000


class Throttle:
    """Slows down guessing: per client address, after FREE_FAILURES failed attempts each new
    failure doubles the time before the next attempt is even looked at (up to MAX_DELAY).
    Callers refuse early attempts (429) instead of sleeping, so nothing blocks."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.failures: dict[str, tuple[int, float]] = {}  # client -> (failures, time of the last)
        self._lock = threading.Lock()

    def wait(self, client: str) -> float:
        """Seconds before ``client`` may try again; 0: now."""
        with self._lock:
            count, last = self.failures.get(client, (0, 0.0))
        if count < FREE_FAILURES:
            return 0.0
        return max(0.0, last + min(2.0 ** (count - FREE_FAILURES), MAX_DELAY) - self.clock())

    def failed(self, client: str) -> None:
        now = self.clock()
        with self._lock:
            count, _ = self.failures.pop(client, (0, 0.0))
            if len(self.failures) >= MAX_TRACKED_CLIENTS:  # bounded memory: forget the quiet ones
                self.failures = {c: v for c, v in self.failures.items()
                                 if now - v[1] < 2 * MAX_DELAY}
                while len(self.failures) >= MAX_TRACKED_CLIENTS:
                    del self.failures[next(iter(self.failures))]
            self.failures[client] = (count + 1, now)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self.failures.pop(client, None)


class Guard:
    """What a dashboard server remembers about sessions and clients (in memory, per process)."""

    def __init__(self) -> None:
        self.throttle = Throttle()
        self._revoked: dict[str, float] = {}  # session id -> when its cookie expires anyway
        self._lock = threading.Lock()

    def revoke(self, sid: str, expires: float) -> None:
        now = time.time()
        with self._lock:
            self._revoked = {s: e for s, e in self._revoked.items() if e > now}
            self._revoked[sid] = expires

    def revoked(self, sid: str) -> bool:
        with self._lock:
            return sid in self._revoked
