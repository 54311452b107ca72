"""tests/conformance/test_history.py on the local Redis Cluster (conftest.py here)."""

from conformance import conformance

globals().update(conformance("test_history"))
