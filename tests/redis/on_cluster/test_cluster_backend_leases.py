"""tests/conformance/test_backend_leases.py on the local Redis Cluster (conftest.py here)."""

from conformance import conformance

globals().update(conformance("test_backend_leases"))
