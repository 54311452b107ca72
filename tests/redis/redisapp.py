"""The app that Redis process tests' workers load: ``conveyor --app redisapp:app worker``.

``app = Conveyor()`` takes its store from ``$CONVEYOR_URL``.
"""

from __future__ import annotations

import time

from conveyor import Conveyor, RetryPolicy

app = Conveyor(retry=RetryPolicy(base=0.1, factor=2.0, cap=0.5))


@app.task(name="echo", max_attempts=20, timeout=30)
def echo(n: int, sleep: float = 0.0) -> int:
    if sleep:
        time.sleep(sleep)
    return n
