"""The production-shape tier: long, big, wide.

Every test under tests/scale runs twice over in the project's life: at a CI size inside
``make test`` (seconds, small tables, a few slots), and at full size under ``make scale``
(``CONVEYOR_SCALE=full``: minutes, a million rows, dozens of slots), where it prints the
figures docs/reliability.md tabulates. A test picks its sizes with :func:`size` and records
what it measured with :func:`report`; the assertions are the same at both sizes.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

FULL = os.environ.get("CONVEYOR_SCALE") == "full"


def size(ci: Any, full: Any) -> Any:
    """``full`` under ``make scale``, ``ci`` otherwise."""
    return full if FULL else ci


def report(test: str, backend: str, **figures: Any) -> None:
    """Print one test's figures, and append them to $CONVEYOR_SCALE_REPORT when it is set."""
    row = {"test": test, "backend": backend, "profile": "full" if FULL else "ci",
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **figures}
    print(f"\nSCALE {json.dumps(row)}")
    path = os.environ.get("CONVEYOR_SCALE_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(row) + "\n")
