"""Helpers for testing code that uses Conveyor.

* :func:`drain` (:func:`adrain` from a coroutine) runs every waiting job in this process,
  with the real worker, and returns what ran; failures raise :class:`JobFailed`.
* :func:`temporary_store` makes a fresh, empty store for a test and deletes it afterwards;
  :func:`using_store` points an app at it for a while.
* The pytest plugin (:mod:`conveyor.testing.plugin`, loaded by its entry point) has the
  ``conveyor_url`` and ``conveyor_app`` fixtures.

See the docs page "Testing your tasks".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .draining import DrainTimeout, JobFailed, adrain, drain
    from .stores import temporary_store, using_store

__all__ = [
    "DrainTimeout", "JobFailed", "adrain", "drain", "temporary_store", "using_store",
]
# Imported on first use: pytest loads the plugin (a submodule) in every run of a project
# with Conveyor installed, and that need not import the worker.
_HOME = {"DrainTimeout": "draining", "JobFailed": "draining", "adrain": "draining",
         "drain": "draining",
         "temporary_store": "stores", "using_store": "stores"}


def __getattr__(name: str) -> Any:
    # Plain imports, not importlib by a computed name: nothing here resolves names from data.
    home = _HOME.get(name)
    if home == "draining":
        from . import draining

        return getattr(draining, name)
    if home == "stores":
        from . import stores

        return getattr(stores, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
