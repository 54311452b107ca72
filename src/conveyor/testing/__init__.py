"""Helpers for testing code that uses Conveyor.

* :func:`drain` (:func:`adrain` from a coroutine) runs every waiting job in this process,
  with the real worker, and returns what ran; failures raise :class:`JobFailed`.
* :func:`temporary_store` makes a fresh, empty store for a test and deletes it afterwards.
* The pytest plugin (:mod:`conveyor.testing.plugin`, loaded by its entry point) has the
  ``conveyor_url`` and ``conveyor_app`` fixtures.

See the docs page "Testing your tasks".
"""

from .drain import DrainTimeout, JobFailed, adrain, drain

__all__ = ["DrainTimeout", "JobFailed", "adrain", "drain"]
