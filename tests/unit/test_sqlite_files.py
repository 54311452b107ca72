"""SQLite's files: durable commits by default, and WAL mode entered or a clear error at open.

WAL is made impossible the way a file system does it, not by patching: SQLite keeps the log in
``<db>-wal`` and its index in ``<db>-shm`` beside the database, and a directory in their place
cannot be opened as a file (not even by root, as the tests run here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor import Conveyor, StoreError
from conveyor.backends.sqlite import SqliteBackend


def synchronous_of(url: str) -> int:
    backend = SqliteBackend(url)
    try:
        return int(backend._read("PRAGMA synchronous")[0][0])
    finally:
        backend.close()


def test_every_commit_is_synced_by_default(tmp_path: Path) -> None:
    # "durable when it returns" holds through a power cut only at FULL (2): NORMAL (1) syncs
    # the WAL at checkpoints only (see tests/faults/test_power_loss.py).
    assert synchronous_of(f"sqlite:///{tmp_path}/a.db") == 2
    assert synchronous_of(f"sqlite:///{tmp_path}/b.db?synchronous=normal") == 1


@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
@pytest.mark.parametrize("blocked", ["-wal", "-shm"])
def test_a_store_that_cannot_run_in_wal_mode_fails_at_open_and_says_why(
    tmp_path: Path, blocked: str, existing: bool,
) -> None:
    db = tmp_path / "jobs.db"
    if existing:  # migrated already: opening it needs no write of its own
        SqliteBackend(f"sqlite:///{db}").close()
        assert not (tmp_path / f"jobs.db{blocked}").exists()
    (tmp_path / f"jobs.db{blocked}").mkdir()
    app = Conveyor(f"sqlite:///{db}")
    with pytest.raises(StoreError) as info:
        app.backend  # noqa: B018 - opening is the call under test
    text = str(info.value)
    assert str(db) in text and "WAL" in text
    assert "writable" in text and "local file system" in text
