"""``conveyor dlq``: the dead-letter queue: list, show, redrive and purge dead jobs."""

from __future__ import annotations

import json

import click

from ...job import JobState
from ..context import CliError, Ctx, console, pass_ctx, queue_filter
from ..display import job_dict, jobs_table, show_job


@click.group()
def dlq() -> None:
    """The dead-letter queue: jobs that failed for good."""


@dlq.command("list")
@click.option("--queue", callback=queue_filter, help="Only this queue.")
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def dlq_list(obj: Ctx, queue: str | None, limit: int, as_json: bool) -> None:
    """Dead jobs, newest first."""
    page = obj.app.backend.list_jobs(state=JobState.DEAD, queue=queue, limit=limit)
    if as_json:
        click.echo(json.dumps([job_dict(j) for j in page.jobs], indent=2))
    else:
        console.print(jobs_table(page.jobs, f"dead jobs ({len(page.jobs)} shown)"))


@dlq.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True,
              help="Print the job as JSON (as `jobs show --json`).")
@pass_ctx
def dlq_show(obj: Ctx, job_id: int, as_json: bool) -> None:
    """One dead job with every error and traceback."""
    job = obj.app.get_job(job_id)
    if job.state is not JobState.DEAD:
        raise CliError(f"job {job_id} is not in the dead-letter queue: it is {job.state} "
                       f"(`conveyor jobs show {job_id}` shows any job)")
    if as_json:
        click.echo(json.dumps(job_dict(job), indent=2))
    else:
        show_job(job)


@dlq.command("redrive")
@click.argument("job_ids", type=int, nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead job (of --queue, if given).")
@click.option("--queue", callback=queue_filter, help="Only this queue.")
@pass_ctx
def dlq_redrive(obj: Ctx, job_ids: tuple[int, ...], all_: bool, queue: str | None) -> None:
    """Send dead jobs back to their queue with attempts reset."""
    if not job_ids and not all_:
        raise click.UsageError("give job ids, or --all")
    if job_ids and all_:
        raise click.UsageError("give job ids or --all, not both")
    n = obj.app.backend.redrive(None if all_ else list(job_ids), queue=queue)
    click.echo(f"redrove {n} job(s)")
    if job_ids and n < len(job_ids):
        click.echo(f"{len(job_ids) - n} id(s) were not dead jobs and were left alone", err=True)


@dlq.command("purge")
@click.argument("job_ids", type=int, nargs=-1)
@click.option("--queue", callback=queue_filter, help="Only this queue.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_ctx
def dlq_purge(obj: Ctx, job_ids: tuple[int, ...], queue: str | None, yes: bool) -> None:
    """Delete dead jobs (these ids, or all of --queue, or all)."""
    if not yes and not job_ids:
        click.confirm(f"Delete every dead job{' on ' + queue if queue else ''}?", abort=True)
    n = obj.app.backend.purge(state=JobState.DEAD, queue=queue, job_ids=list(job_ids) or None)
    if n == 0 and not job_ids:
        click.echo(f"no dead jobs{' on queue ' + queue if queue else ''}: nothing purged")
        return
    click.echo(f"purged {n} dead job(s)")
    if job_ids and n < len(job_ids):
        click.echo(f"{len(job_ids) - n} id(s) were not dead jobs and were left alone", err=True)
