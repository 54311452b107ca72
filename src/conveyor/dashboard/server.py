"""Serving the dashboard with uvicorn: in the foreground (``conveyor dashboard``) or on a
background thread (``conveyor demo``)."""

from __future__ import annotations

import contextlib
import signal
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn

from ..app import Conveyor
from ..errors import ConfigurationError
from .app import DashboardApp, create_app
from .security import check_bind, make_auth


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


@dataclass(frozen=True)
class TLS:
    """A certificate (chain) and its private key, PEM files: the dashboard speaks https itself."""

    cert: str
    key: str


def tls_of(cert: str | None, key: str | None) -> TLS | None:
    """Both or neither; the files are loaded once here so a wrong path or a key that does not
    match fails at start with a clear message, not in the server thread."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigurationError(
            "TLS needs both a certificate and its key (--tls-cert and --tls-key)")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot use the TLS certificate {cert!r} with the key {key!r}: {exc}") from None
    return TLS(cert, key)


def url_of(sock: socket.socket, host: str, root: str = "/", *, https: bool = False) -> str:
    port = sock.getsockname()[1]
    shown = host if host.strip("[]") not in ("0.0.0.0", "::") else "127.0.0.1"
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"{'https' if https else 'http'}://{shown}:{port}{root}"


def _server(app: DashboardApp, *, log_level: str, tls: TLS | None = None) -> uvicorn.Server:
    # proxy_headers stays off in uvicorn: the app applies uvicorn's own ProxyHeadersMiddleware
    # itself when given forwarded_allow_ips (so a mounted dashboard gets it too), and uvicorn's
    # default would trust 127.0.0.1 without being asked.
    config = uvicorn.Config(
        app, log_level=log_level, proxy_headers=False, server_header=False, lifespan="on",
        access_log=False, timeout_graceful_shutdown=3,
        ssl_certfile=tls.cert if tls else None, ssl_keyfile=tls.key if tls else None,
    )
    return uvicorn.Server(config)


def prepare(conveyor: Conveyor, *, host: str, port: int, token: str | None, basic_auth: str | None,
            **options: Any) -> tuple[DashboardApp, socket.socket]:
    """Check the settings (refusing a non-loopback bind without auth), build the app, bind."""
    check_bind(host, make_auth(token=token, basic_auth=basic_auth))
    app = create_app(conveyor, token=token, basic_auth=basic_auth, **options)
    return app, _listen(host, port)


def serve(conveyor: Conveyor, *, host: str = "127.0.0.1", port: int = 8000,
          token: str | None = None, basic_auth: str | None = None, log_level: str = "warning",
          on_ready: Any = None, tls_cert: str | None = None, tls_key: str | None = None,
          **options: Any) -> None:
    """Serve in the foreground until SIGINT/SIGTERM; over https with ``tls_cert`` and
    ``tls_key``."""
    tls = tls_of(tls_cert, tls_key)
    app, sock = prepare(conveyor, host=host, port=port, token=token, basic_auth=basic_auth,
                        **options)
    if on_ready is not None:
        on_ready(url_of(sock, host, https=tls is not None))
    server = _server(app, log_level=log_level, tls=tls)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it to the handler that was there
    # before: make that one a clean exit, so a supervisor sees 0 as for the worker.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        server.run(sockets=[sock])
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        app.close()
        sock.close()


@dataclass
class RunningDashboard:
    url: str
    app: DashboardApp
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout)
        self.app.close()


def start_in_thread(conveyor: Conveyor, *, host: str = "127.0.0.1", port: int = 8000,
                    fallback_to_any_port: bool = False, token: str | None = None,
                    basic_auth: str | None = None, tls_cert: str | None = None,
                    tls_key: str | None = None, **options: Any) -> RunningDashboard:
    """Serve on a daemon thread; returns once it accepts connections. With
    ``fallback_to_any_port``, a busy ``port`` makes it pick a free one instead of failing."""
    tls = tls_of(tls_cert, tls_key)
    try:
        app, sock = prepare(conveyor, host=host, port=port, token=token, basic_auth=basic_auth,
                            **options)
    except ConfigurationError:
        if not fallback_to_any_port or port == 0:
            raise
        app, sock = prepare(conveyor, host=host, port=0, token=token, basic_auth=basic_auth,
                            **options)
    server = _server(app, log_level="error", tls=tls)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="conveyor-dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        server.should_exit = True
        with contextlib.suppress(OSError):
            sock.close()
        raise ConfigurationError("the dashboard did not start within 10 s")
    return RunningDashboard(url_of(sock, host, https=tls is not None), app, server, thread)
