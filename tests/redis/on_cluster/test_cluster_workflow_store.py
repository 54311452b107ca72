"""tests/conformance/test_workflow_store.py on the local Redis Cluster (conftest.py here)."""

from conformance import conformance

globals().update(conformance("test_workflow_store"))
