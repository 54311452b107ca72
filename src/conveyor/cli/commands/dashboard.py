"""``conveyor dashboard``: serve the web dashboard (conveyor.dashboard) on one store."""

from __future__ import annotations

import click

from ...backends import redact_url
from ...errors import ConveyorError
from ..context import Ctx, pass_ctx


@click.command("dashboard")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="CONVEYOR_DASHBOARD_HOST",
              help="Address to listen on. Anything but loopback needs --token or --basic-auth.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(min=0, max=65535),
              envvar="CONVEYOR_DASHBOARD_PORT")
@click.option("--token", envvar="CONVEYOR_DASHBOARD_TOKEN", default=None, metavar="TOKEN",
              help="Require this token (128+ bits of randomness: python -c \"import secrets; "
                   "print(secrets.token_urlsafe(32))\"): a login form, or 'Authorization: Bearer'. "
                   "Prefer $CONVEYOR_DASHBOARD_TOKEN: other users can read command lines.")
@click.option("--basic-auth", envvar="CONVEYOR_DASHBOARD_BASIC_AUTH", default=None,
              metavar="USER:PASSWORD",
              help="Require HTTP basic auth (password 12+ characters; "
                   "$CONVEYOR_DASHBOARD_BASIC_AUTH).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Also answer to this Host name (repeatable), e.g. behind a reverse proxy. "
                   "A name other than loopback needs --token or --basic-auth.")
@click.option("--forwarded-allow-ips", envvar="CONVEYOR_DASHBOARD_FORWARDED_ALLOW_IPS",
              default=None, metavar="ADDRESSES",
              help="Trust X-Forwarded-Proto and X-Forwarded-For from these proxies "
                   "(comma-separated addresses or networks, or '*'): the scheme and client they "
                   "report are used. "
                   "Default: no proxy header is trusted.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              metavar="PEM", envvar="CONVEYOR_DASHBOARD_TLS_CERT",
              help="Serve https with this certificate (chain); needs --tls-key.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
              metavar="PEM", envvar="CONVEYOR_DASHBOARD_TLS_KEY",
              help="The private key of --tls-cert.")
@click.option("--secret", envvar="CONVEYOR_DASHBOARD_SECRET", default=None, metavar="SECRET",
              help="Key for the session cookies, shared by replicas behind one address so each "
                   "accepts the others' sessions (default: random per process). Use "
                   "$CONVEYOR_DASHBOARD_SECRET.")
@click.option("--sample-interval", default=5.0, show_default=True,
              type=click.FloatRange(min=0.5),
              help="Seconds between the store samples behind the charts and alerts.")
@pass_ctx
def dashboard_cmd(obj: Ctx, host: str, port: int, token: str | None, basic_auth: str | None,
                  allowed_hosts: tuple[str, ...], forwarded_allow_ips: str | None,
                  tls_cert: str | None, tls_key: str | None, secret: str | None,
                  sample_interval: float) -> None:
    """Serve the web dashboard: queues, jobs, dead letters, workers, cron (docs/dashboard.md)."""
    from ...dashboard import serve

    def ready(url: str) -> None:
        # Settings that would serve others without credentials are refused before this point,
        # so "loopback only" is true when it is printed.
        auth = "token" if token else "basic auth" if basic_auth else "no auth: loopback only"
        proxy = ""
        if forwarded_allow_ips:
            proxy = f", trusting proxy headers from {forwarded_allow_ips}"
        click.echo(f"conveyor dashboard on {url} ({auth}{proxy}) for {redact_url(obj.app.url)}; "
                   "Ctrl-C stops", err=True)

    try:
        serve(obj.app_with_tasks(), host=host, port=port, token=token or None,
              basic_auth=basic_auth or None,
              allowed_hosts=allowed_hosts, forwarded_allow_ips=forwarded_allow_ips or None,
              tls_cert=tls_cert, tls_key=tls_key, secret=secret or None,
              sample_interval=sample_interval, on_ready=ready)
    except ConveyorError as exc:
        raise click.UsageError(str(exc)) from None
