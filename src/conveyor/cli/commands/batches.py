"""``conveyor batches show``: a batch's counts and callbacks (see docs/workflows.md)."""

from __future__ import annotations

import json

import click

from ..context import Ctx, pass_ctx
from ..display import batch_dict, show_batch


@click.group()
def batches() -> None:
    """Look at batches (app.batch)."""


@batches.command("show")
@click.argument("batch_id")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def batches_show(obj: Ctx, batch_id: str, as_json: bool) -> None:
    """A batch's members by state (nested batches included) and its callbacks' job ids."""
    info = obj.app.get_batch(batch_id)
    if info is None:
        raise click.ClickException(
            f"no batch {batch_id!r} in the store (never written, or pruned with its last member)")
    if as_json:
        click.echo(json.dumps(batch_dict(info), indent=2))
    else:
        show_batch(info)
