"""tests/conformance/test_backend_admin.py on the local Redis Cluster (conftest.py here)."""

from conformance import conformance

globals().update(conformance("test_backend_admin"))
