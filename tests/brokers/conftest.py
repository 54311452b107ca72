"""The broker suite's fixtures: defined in brokerkit.py (see there), named here for pytest."""

from brokerkit import (  # noqa: F401 - fixtures, found by pytest through this module
    broker,
    open_broker,
    sqs_backend,
    sqs_client,
    sqs_endpoint,
    sqs_url,
    transport,
)
