"""``conveyor migrate``: create or upgrade the store's schema."""

from __future__ import annotations

import logging

import click

from ...backends import redact_url
from ..context import Ctx, pass_ctx


@click.command()
@pass_ctx
def migrate(obj: Ctx) -> None:
    """Create or upgrade the store's schema (also done on first use).

    On PostgreSQL, a step that changes a big table reports its progress (rows done / total)
    as it goes; stopped, it resumes where it was at the next run."""
    # Progress is logged: shown whatever --log-level says, since it is what this command is for.
    logging.getLogger("conveyor.postgres.migrate").setLevel(logging.INFO)
    backend = obj.app.backend
    version = backend.schema_version()
    click.echo(f"{redact_url(obj.app.url)}: schema version {'?' if version is None else version}")
