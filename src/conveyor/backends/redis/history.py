"""History on Redis (backends/history.py): a HASH per minute and per hour, each indexed in a
ZSET (keys.py, HISTORY_KEYS); history_record.lua and history_rollup.lua write them."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

from ..history import FIELDS, HOUR, MINUTE, MINUTES_KEPT, HistoryPoint, check_points
from .core import RedisCore


class RedisHistory(RedisCore):
    def _history_script(self, name: str, args: Sequence[Any], *, safe: bool) -> Any:
        t = self._transport
        run = functools.partial(t.bare_scripts[name], keys=self.keys.history(), args=list(args))
        return t.call(name, run, safe=safe)

    def record_history(self, points: Sequence[HistoryPoint]) -> None:
        check_points(points)
        if not points:
            return
        args: list[Any] = []
        for p in points:
            args += [p.at, p.queue, p.processed, p.failed, p.dead, repr(float(p.wait_sum)),
                     repr(float(p.run_sum))]
        # Not safe to send twice: a retried flush whose first reply was lost would count twice.
        self._history_script("history_record", args, safe=False)

    def history(self, *, queue: str | None = None, since: float,
                until: float) -> list[HistoryPoint]:
        minutes_key, minute_prefix, hours_key, hour_prefix = self.keys.history()
        r = self._transport.r

        def read() -> list[HistoryPoint]:
            out: list[HistoryPoint] = []
            for span, index, prefix in ((MINUTE, minutes_key, minute_prefix),
                                        (HOUR, hours_key, hour_prefix)):
                buckets = cast(list[str], r.zrangebyscore(index, since, f"({until}"))
                pipe = r.pipeline(transaction=False)
                for b in buckets:
                    pipe.hgetall(prefix + b)
                for b, flat in zip(buckets, pipe.execute(), strict=True):
                    out += _points(int(float(b)), span, cast(dict[str, str], flat), queue)
            out.sort(key=lambda p: (p.at, p.queue, p.span))
            return out

        return self._transport.call("read the history", read, safe=True)

    def rollup_history(self, *, keep_days: float, limit: int = 1000,
                       now: float | None = None) -> int:
        args = [self._now_arg(now), repr(keep_days * 86400.0), limit, repr(MINUTES_KEPT)]
        # Safe to run twice: what a first run did is not due any more.
        return int(self._history_script("history_rollup", args, safe=True))


def _points(at: int, span: int, flat: dict[str, str], queue: str | None) -> list[HistoryPoint]:
    counts: dict[str, dict[str, float]] = {}
    for field, value in flat.items():
        name, _, q = field.partition(":")
        if name in FIELDS and (queue is None or q == queue):
            counts.setdefault(q, {})[name] = float(value)
    return [HistoryPoint(queue=q, at=at, span=span, processed=int(c.get("processed", 0)),
                         failed=int(c.get("failed", 0)), dead=int(c.get("dead", 0)),
                         wait_sum=c.get("wait_sum", 0.0), run_sum=c.get("run_sum", 0.0))
            for q, c in sorted(counts.items())]
