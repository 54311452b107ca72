"""tests/conformance/test_backend_leases.py on one app of six partitions over the local cluster's shards
(partitioned.py here)."""

from conformance import conformance
from partitioned import store_url  # noqa: F401 - the fixture these tests run on

globals().update(conformance("test_backend_leases"))
