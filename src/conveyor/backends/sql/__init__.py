"""Named SQL: each backend's queries live in ``<dialect>/queries.sql``, each under a
``-- name: x`` header."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.M)


def load_queries(dialect: str) -> dict[str, str]:
    text = resources.files(__name__).joinpath(dialect, "queries.sql").read_text("utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def migration_files(dialect: str) -> list[tuple[int, str, str]]:
    """Numbered migration scripts (``001_init.sql``...) in order: (version, name, script)."""
    folder = resources.files(__name__).joinpath(dialect)
    found = []
    for entry in folder.iterdir():
        m = re.fullmatch(r"((\d{3})_\w+)\.sql", entry.name)
        if m:
            found.append((int(m.group(2)), m.group(1), entry.read_text("utf-8")))
    return sorted(found)


def load_migrations(dialect: str) -> list[tuple[int, str]]:
    """Numbered migration scripts (``001_init.sql``...) in order: (version, script)."""
    return [(version, script) for version, _, script in migration_files(dialect)]


def split_statements(script: str) -> list[str]:
    """A script's statements, comment lines dropped (no ``;`` inside a statement's text)."""
    lines = [ln for ln in script.splitlines() if not ln.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
