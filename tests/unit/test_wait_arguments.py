"""job.wait's arguments are checked before the store is asked anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor import ConfigurationError, Conveyor
from conveyor.errors import WaitTimeout


@pytest.mark.parametrize("timeout", [-1, float("nan"), "5", True])
def test_a_bad_timeout_is_refused(tmp_path: Path, timeout: object) -> None:
    app = Conveyor(f"sqlite:///{tmp_path}/c.db")

    @app.task(name="t")
    def t() -> None: ...

    job = t.enqueue()
    with pytest.raises(ConfigurationError, match="timeout must be"):
        job.wait(timeout=timeout)  # type: ignore[arg-type]
    app.close()


def test_wait_timeout_is_a_builtin_timeout_error() -> None:
    assert issubclass(WaitTimeout, TimeoutError)
