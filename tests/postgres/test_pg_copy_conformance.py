"""The enqueue conformance tests again on PostgreSQL with every batch of two plain jobs or more
sent through the COPY path (CONVEYOR_TEST_PG_COPY_MIN_JOBS, see tests/conftest.py): what the
one-statement path guarantees there (ids, clock, uids, meta, depth limits, wake-ups, the
outbox), the COPY path guarantees too. Run in a child pytest, as the setting applies to a
whole session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
MODULES = ["test_backend_enqueue_claim.py", "test_app_enqueue.py", "test_backpressure.py",
           "test_job_uid.py", "test_outbox.py"]


@pytest.mark.timeout(600)
def test_the_enqueue_conformance_tests_pass_by_copy() -> None:
    env = {**os.environ, "CONVEYOR_TEST_PG_COPY_MIN_JOBS": "2",
           "PYTHONPATH": os.pathsep.join([str(TESTS / "postgres"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pgcopyspy", "-p", "no:cacheprovider", "-q",
         "-k", "postgres", *(str(TESTS / "conformance" / m) for m in MODULES)],
        cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=580, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "SKIPPED: postgres" not in out, out[-2000:]
    found = re.search(r"pgcopyspy: (\d+) COPY writes in (\d+) tests", out)
    assert found is not None, out[-2000:]
    # The suite's batches of plain jobs, each of which went in by COPY.
    assert int(found[1]) >= 10 and int(found[2]) >= 10, found[0]
