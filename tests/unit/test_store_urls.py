"""Store URLs: parsing sqlite URLs, choosing a backend, redacting passwords."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conveyor import ConfigurationError, Conveyor
from conveyor.backends import open_backend, redact_url
from conveyor.backends.sqlite import parse_sqlite_url


def test_relative_path_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_sqlite_url("sqlite:///conveyor.db") == (str(tmp_path / "conveyor.db"), {})
    assert parse_sqlite_url("sqlite:///data/jobs.db") == (str(tmp_path / "data" / "jobs.db"), {})


def test_absolute_path_has_four_slashes() -> None:
    assert parse_sqlite_url("sqlite:////var/lib/conveyor/jobs.db") == (
        "/var/lib/conveyor/jobs.db",
        {},
    )


def test_known_options_are_parsed() -> None:
    path, options = parse_sqlite_url("sqlite:////tmp/x.db?synchronous=full&busy_timeout=10")
    assert path == "/tmp/x.db"
    assert options == {"synchronous": "full", "busy_timeout": "10"}


@pytest.mark.parametrize(
    "url", ["sqlite:///:memory:", "sqlite://", "sqlite:///", "sqlite:///?synchronous=full"]
)
def test_in_memory_or_missing_path_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_sqlite_url(url)
    assert "file path" in str(info.value)


def test_unknown_option_is_refused_and_named() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_sqlite_url("sqlite:////tmp/x.db?journal=off&busy_timeout=3")
    assert "journal" in str(info.value)


def test_not_a_sqlite_url_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        parse_sqlite_url("postgresql://localhost/db")


@pytest.mark.parametrize(
    "url", ["sqlite:////tmp/x.db?synchronous=sometimes", "sqlite:////tmp/x.db?busy_timeout=soon"]
)
def test_bad_option_values_are_refused_when_opening(url: str) -> None:
    with pytest.raises(ConfigurationError):
        open_backend(url)


def test_open_backend_creates_and_migrates_the_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new/../fresh.db"
    b = open_backend(url)
    try:
        assert os.path.exists(tmp_path / "fresh.db")
        assert b.list_jobs().jobs == []
        assert b.url == url
    finally:
        b.close()


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("mysql://u:hunter2@db/x", "unsupported"),
        ("conveyor.db", "unsupported"),
    ],
)
def test_open_backend_refuses_unavailable_or_unknown_schemes(url: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        open_backend(url)
    assert fragment in str(info.value)
    assert "hunter2" not in str(info.value)


def test_postgres_with_a_wrong_role_fails_at_once_with_a_clear_error() -> None:
    from conveyor.errors import StoreError

    with pytest.raises(StoreError) as info:
        open_backend("postgresql://no_such_role:hunter2@127.0.0.1:5432/test")
    assert "no_such_role" in str(info.value)
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql://user:secret@db.example:5432/jobs",
            "postgresql://user:***@db.example:5432/jobs",
        ),
        ("redis://:secret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("rediss://user:p%40ss@cache/1", "rediss://user:***@cache/1"),
        ("postgresql://same:same@db/x", "postgresql://same:***@db/x"),
        ("redis://u:pa@ss@host/0", "redis://u:***@host/0"),
        ("postgresql://user@db/jobs", "postgresql://user@db/jobs"),
        ("sqlite:////var/lib/c.db", "sqlite:////var/lib/c.db"),
    ],
)
def test_redact_url_hides_passwords(url: str, expected: str) -> None:
    assert redact_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://db.example/jobs?user=app&password=secret",
        "postgresql://app@db.example/jobs?sslmode=require&password=secret",
    ],
)
def test_redact_url_hides_a_password_given_as_a_query_parameter(url: str) -> None:
    # libpq accepts the password as a URI query parameter; it must not reach logs either.
    redacted = redact_url(url)
    assert "secret" not in redacted
    assert "db.example/jobs" in redacted


def test_app_repr_does_not_show_the_password() -> None:
    app = Conveyor("postgresql://user:hunter2@db/jobs")
    assert "hunter2" not in repr(app)
    assert "user:***@db" in repr(app)
