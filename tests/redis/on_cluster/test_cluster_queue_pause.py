"""tests/conformance/test_queue_pause.py on the local Redis Cluster (conftest.py here)."""

from conformance import conformance

globals().update(conformance("test_queue_pause"))
