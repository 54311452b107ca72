"""Fixtures of the process-level tests; the rig itself is in processrig.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from processrig import Rig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A fresh SQLite store and the real processes of one test, all killed at the end."""
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()
