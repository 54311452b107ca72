"""tests/conformance/test_fork.py on the local Redis Cluster (conftest.py here)."""

from conformance import conformance

globals().update(conformance("test_fork"))
