"""tests/conformance/test_app_worker.py on the local Redis Cluster (conftest.py here)."""

from conformance import conformance

globals().update(conformance("test_app_worker"))
