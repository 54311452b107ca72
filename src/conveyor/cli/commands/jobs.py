"""``conveyor enqueue`` and ``conveyor jobs``: put one job in, look at jobs, cancel one."""

from __future__ import annotations

import json

import click

from ...job import JobState
from ..context import Ctx, console, pass_ctx, queue_filter, task_filter
from ..display import job_dict, jobs_table, show_job


@click.command()
@click.argument("task_name")
@click.option("--args", "args_json", default="[]",
              help='JSON: a list of positional args or an object of keyword args.')
@click.option("--queue", default=None)
@click.option("--delay", type=float, default=None, help="Seconds from now.")
@click.option("--priority", type=int, default=None, help="Lower runs first.")
@click.option("--unique-key", default=None)
@click.option("--fair-key", default=None,
              help="Tenant: the queue is shared round-robin between fair keys.")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@pass_ctx
def enqueue(obj: Ctx, task_name: str, args_json: str, queue: str | None, delay: float | None,
            priority: int | None, unique_key: str | None, fair_key: str | None,
            as_json: bool) -> None:
    """Enqueue one job of TASK_NAME."""
    app = obj.require_tasks("enqueue")
    task = app.get_task(task_name)
    try:
        parsed = json.loads(args_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--args") from None
    call = task.options(queue=queue, delay=delay, priority=priority, unique_key=unique_key,
                        fair_key=fair_key)
    if isinstance(parsed, list):
        job = call.enqueue(*parsed)
    elif isinstance(parsed, dict):
        job = call.enqueue(**parsed)
    else:
        raise click.BadParameter("must be a JSON list (positional) or object (keyword)",
                                 param_hint="--args")
    if as_json:
        click.echo(json.dumps(job_dict(job)))
    else:
        click.echo(f"enqueued job {job.id} ({job.task} on {job.queue}, {job.state})")


@click.group()
def jobs() -> None:
    """Inspect and cancel jobs."""


@jobs.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def jobs_show(obj: Ctx, job_id: int, as_json: bool) -> None:
    """Everything about one job, with every failed attempt."""
    job = obj.app.get_job(job_id)
    if as_json:
        click.echo(json.dumps(job_dict(job), indent=2))
    else:
        show_job(job)


@jobs.command("list")
@click.option("--state", type=click.Choice([s.value for s in JobState]))
@click.option("--queue", callback=queue_filter, help="Only this queue.")
@click.option("--task", callback=task_filter, help="Only this task.")
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def jobs_list(obj: Ctx, state: str | None, queue: str | None, task: str | None, limit: int,
              as_json: bool) -> None:
    """Newest jobs first."""
    page = obj.app.backend.list_jobs(state=JobState(state) if state else None, queue=queue,
                                     task=task, limit=limit)
    if as_json:
        click.echo(json.dumps([job_dict(j) for j in page.jobs], indent=2))
    else:
        console.print(jobs_table(page.jobs, f"jobs ({len(page.jobs)} shown)"))


@jobs.command("cancel")
@click.argument("job_id", type=int)
@pass_ctx
def jobs_cancel(obj: Ctx, job_id: int) -> None:
    """Cancel a waiting or running job."""
    if obj.app.cancel(job_id):
        click.echo(f"cancelled job {job_id}")
    else:
        raise click.ClickException(f"job {job_id} does not exist or is already finished")
