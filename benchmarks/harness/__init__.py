"""The benchmark harness behind ``benchmarks/run.py``: one driver per store, one report.

The store drivers reuse the scenario code of ``sqlite_bench.py``, ``postgres_bench.py`` and
``redis_bench.py`` (imported, not copied) and add the two scenarios those lack: a drain by two
worker processes, and latency under a steady load of half the system's own measured drain rate.
"""
