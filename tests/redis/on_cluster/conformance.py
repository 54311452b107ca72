"""Conformance modules taken as a wrapper module's own (see conftest.py here)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

CONFORMANCE = Path(__file__).resolve().parents[2] / "conformance"


def conformance(name: str) -> dict[str, Any]:
    """The names of conformance module ``name`` (its tests and fixtures), imported as pytest
    would (so its asserts are rewritten): a wrapper module here makes them its own."""
    if str(CONFORMANCE) not in sys.path:
        sys.path.insert(0, str(CONFORMANCE))
    module = importlib.import_module(name)
    return {k: v for k, v in vars(module).items() if not k.startswith("__")}


