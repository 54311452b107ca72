"""``conveyor alerts``: evaluate alert rules on the store and notify (conveyor.alerts)."""

from __future__ import annotations

import contextlib
import sys

import click

from ..context import Ctx, pass_ctx


@click.command()
@click.option("--dead/--no-dead", default=True, show_default=True,
              help="Alert while a queue has dead jobs.")
@click.option("--depth", type=click.IntRange(min=0), default=None,
              help="Alert when more jobs than this wait.")
@click.option("--age", type=click.FloatRange(min=0), default=None,
              help="Alert when the oldest waiting job is older than this many seconds.")
@click.option("--no-workers/--allow-no-workers", "no_workers", default=True, show_default=True,
              help="Alert when a queue has waiting jobs and no live worker.")
@click.option("--lease-expiry-rate", type=click.FloatRange(min=0), default=None,
              help="Alert above this many lease expiries per minute on a queue.")
@click.option("--past-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Alert when jobs run this many seconds past their timeout.")
@click.option("--stuck-slots", type=click.IntRange(min=0), default=0, show_default=True,
              help="Alert when a worker has more than this many slots stuck on sync tasks running "
                   "past their timeout (their threads cannot be killed).")
@click.option("--webhook", "webhooks", multiple=True,
              help="POST incidents as JSON here (repeatable).")
@click.option("--interval", default=15.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--once", is_flag=True,
              help="Evaluate once, print what fires, exit 1 if anything does.")
@pass_ctx
def alerts(obj: Ctx, dead: bool, depth: int | None, age: float | None, no_workers: bool,
           lease_expiry_rate: float | None, past_timeout: float, stuck_slots: int,
           webhooks: tuple[str, ...], interval: float, once: bool) -> None:
    """Watch the store and notify (log, webhooks) when an alert fires and when it resolves.

    Run one of these per store: evaluators do not coordinate.
    """
    from ...alerts import (
        Action,
        Alerting,
        DeadJobs,
        JobsPastTimeout,
        LeaseExpiryRate,
        NoLiveWorkers,
        OldestJobAge,
        QueueDepth,
        Rule,
        StuckSlots,
        Webhook,
        log_action,
    )

    rules: list[Rule] = [JobsPastTimeout(grace=past_timeout), StuckSlots(stuck_slots)]
    if dead:
        rules.append(DeadJobs())
    if depth is not None:
        rules.append(QueueDepth(depth))
    if age is not None:
        rules.append(OldestJobAge(age))
    if no_workers:
        rules.append(NoLiveWorkers())
    if lease_expiry_rate is not None:
        rules.append(LeaseExpiryRate(lease_expiry_rate))
    actions: list[Action] = [] if once else [log_action, *(Webhook(url) for url in webhooks)]
    alerting = Alerting(obj.app.backend, rules, actions, interval=interval)
    if once:
        fired = alerting.evaluate()
        for incident in fired:
            click.echo(f"FIRING {incident.severity} {incident.key}: {incident.summary}")
        if not fired:
            click.echo("no alerts firing")
        sys.exit(1 if fired else 0)
    click.echo(f"evaluating {len(rules)} rule(s) every {interval:g}s; Ctrl-C stops", err=True)
    with contextlib.suppress(KeyboardInterrupt):
        alerting.run()
