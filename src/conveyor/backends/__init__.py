"""Stores. ``open_backend(url)`` picks one by the URL's scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigurationError
from .base import Backend

SCHEMES = {
    "sqlite": "SQLite (embedded, one machine)",
    "postgresql": "PostgreSQL",
    "postgres": "PostgreSQL",
    "redis": "Redis",
    "rediss": "Redis over TLS",
}


def open_backend(url: str) -> Backend:
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from .sqlite import SqliteBackend

        return SqliteBackend(url)
    if scheme in SCHEMES:
        raise ConfigurationError(
            f"the {SCHEMES[scheme]} backend is not available in this version of Conveyor yet; "
            "use sqlite:///path/to/file.db"
        )
    raise ConfigurationError(
        f"unsupported store URL {redact_url(url)!r}: expected sqlite:///file.db "
        "(postgresql:// and redis:// are planned)"
    )


def redact_url(url: str) -> str:
    """The URL with any password replaced, for logs and screens."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
