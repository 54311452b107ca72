"""Kill points for the fault tests: ``CONVEYOR_FAULTPOINT=<name>`` makes the process SIGKILL
itself the first time it reaches ``hit(<name>)``.

The variable is read once, at import. Unset (always, outside the fault tests), ``hit`` is one
comparison and changes nothing. The points in the worker are ``after_claim`` (a claim returned
jobs), ``before_ack`` (a task returned; its ack is not sent yet) and ``after_ack`` (an ack's
store call returned). See tests/faults and docs/reliability.md.
"""

from __future__ import annotations

import os
import signal

_POINT = os.environ.get("CONVEYOR_FAULTPOINT") or None


def hit(name: str) -> None:
    """SIGKILL this process if ``CONVEYOR_FAULTPOINT`` named this point; otherwise do nothing."""
    if _POINT is not None and name == _POINT:
        os.kill(os.getpid(), signal.SIGKILL)
