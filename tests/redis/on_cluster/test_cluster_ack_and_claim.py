"""tests/conformance/test_ack_and_claim.py on the local Redis Cluster (conftest.py here)."""

from conformance import conformance

globals().update(conformance("test_ack_and_claim"))
