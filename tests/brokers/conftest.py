"""The broker suite's fixtures: defined in brokerkit.py (see there) and, the session's SQS
server, in tests/brokerstores.py; named here for pytest."""

from brokerkit import (  # noqa: F401 - fixtures, found by pytest through this module
    broker,
    open_broker,
    sqs_backend,
    sqs_client,
    sqs_url,
    transport,
)
from brokerstores import sqs_endpoint  # noqa: F401 - a fixture, as above
