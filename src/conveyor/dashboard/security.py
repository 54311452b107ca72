"""Who may see the dashboard and who may change anything through it.

One ASGI middleware wraps every route, so a route added later is covered without anyone
remembering to protect it:

* **Without authentication** the dashboard answers only loopback clients, and only for a
  loopback ``Host`` (``127.0.0.1``, ``localhost``, ``[::1]``). The Host check stops DNS
  rebinding: a web page on ``evil.example`` that re-points its name at 127.0.0.1 still sends
  ``Host: evil.example``. Any other Host name (``allowed_hosts``) needs credentials: a proxy on
  this machine would otherwise serve anyone it forwards. Proxy headers are trusted only from
  the addresses in ``forwarded_allow_ips`` (uvicorn's own middleware rewrites the client and
  the scheme).
* **With a token or basic auth** every route needs it, except ``/static/``, ``/healthz``
  and the login page. A browser logs in once with the token (a form) and gets an HttpOnly,
  signed session cookie (``Secure`` when the scheme is https) that logging out revokes;
  scripts send ``Authorization: Bearer <token>``. Failed attempts from one client are slowed
  down exponentially (answered 429, nothing sleeps).
* **Every state-changing request** is a POST with a form body
  (``application/x-www-form-urlencoded``, else 415), an ``Origin`` (or ``Referer``) of this
  very site, with the scheme the client used (else 403), and a CSRF token (else 403). The
  token is an HMAC of a random per-browser cookie (signed double submit), so a token from
  another browser is refused.
* **Every response** carries a strict Content-Security-Policy (``default-src 'self'``: no
  inline script or style, no third-party origin), ``nosniff``, ``frame-ancestors 'none'``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import math
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConfigurationError
from .guard import Guard
from .tokens import token_bits

CSRF_COOKIE = "conveyor_csrf"
SESSION_COOKIE = "conveyor_session"
FLASH_COOKIE = "conveyor_flash"
CSRF_FIELD = "csrf_token"
SESSION_TTL = 12 * 3600.0
MAX_FORM_BYTES = 256 * 1024
MIN_TOKEN_BITS = 128
MIN_PASSWORD_CHARS = 12
MAKE_TOKEN = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'

CSP = ("default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; "
       "object-src 'none'")
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=(), payment=()"),
]
# Reachable without credentials: what a load balancer and the login page need.
PUBLIC_PREFIXES = ("/static/",)
PUBLIC_PATHS = frozenset({"/healthz", "/login"})
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class AuthConfig:
    """How the dashboard checks who is asking. Empty: loopback only."""

    token: str | None = None
    basic: tuple[str, str] | None = None
    secret: bytes = field(default=b"", repr=False)  # signs cookies (make_auth derives it)
    allowed_hosts: tuple[str, ...] = ()
    guard: Guard = field(default_factory=lambda: Guard(), repr=False, compare=False)

    @property
    def enabled(self) -> bool:
        return self.token is not None or self.basic is not None

    def new_session(self, now: float | None = None) -> str:
        return make_session(self.secret, now)

    def session_valid(self, value: str, now: float | None = None) -> bool:
        sid = session_id(self.secret, value, now)
        return sid is not None and not self.guard.revoked(sid)

    def revoke(self, value: str, now: float | None = None) -> None:
        """Log a session out on this server: its cookie, even a copy, is no longer accepted."""
        sid = session_id(self.secret, value, now)
        if sid is not None:
            self.guard.revoke(sid, int(value.partition(".")[0]) + SESSION_TTL)

    def __repr__(self) -> str:  # never print a credential
        kinds = [k for k, v in (("token", self.token), ("basic", self.basic)) if v is not None]
        return f"AuthConfig({'+'.join(kinds) or 'loopback only'})"


def make_auth(*, token: str | None = None, basic_auth: str | tuple[str, str] | None = None,
              secret: str | bytes | None = None, allowed_hosts: Iterable[str] = ()) -> AuthConfig:
    """Validate the settings and build the config. Weak credentials are refused, not warned
    about."""
    if token is not None:
        token = token.strip()
        bits = token_bits(token)
        if bits < MIN_TOKEN_BITS:
            raise ConfigurationError(
                f"the dashboard token is too weak: about {bits:.0f} bits of entropy, "
                f"{MIN_TOKEN_BITS} needed (a random token of 22+ letters and digits; no words, "
                f"repeats or runs). Generate one with: {MAKE_TOKEN}")
    basic: tuple[str, str] | None = None
    if basic_auth is not None:
        if isinstance(basic_auth, str):
            user, sep, password = basic_auth.partition(":")
            if not sep:
                raise ConfigurationError("basic auth must be given as USER:PASSWORD")
        else:
            user, password = basic_auth
        if not user or ":" in user:
            raise ConfigurationError("basic auth needs a user name without ':'")
        if len(password) < MIN_PASSWORD_CHARS:
            raise ConfigurationError(
                f"the basic-auth password must be at least {MIN_PASSWORD_CHARS} characters "
                f"(got {len(password)})")
        basic = (user, password)
    if isinstance(secret, str):
        secret = secret.encode()
    # The cookie key: an HMAC of the credentials under a server-side key, random per process
    # unless ``secret`` is given (replicas that share it accept each other's cookies). Never a
    # plain hash of the token, which anyone holding a cookie could test token guesses against;
    # changing the credentials still logs every session out.
    material = json.dumps([token, list(basic) if basic else None]).encode()
    key = secret or secrets.token_bytes(32)
    derived = hmac.new(key, b"conveyor-dashboard-v1\x00" + material, hashlib.sha256).digest()
    hosts = tuple(_hostname(h.strip()) or h.strip().lower() for h in allowed_hosts if h.strip())
    beyond = [h for h in hosts if not is_loopback(h)]
    if beyond and token is None and basic is None:
        raise ConfigurationError(
            f"refusing to answer to {', '.join(beyond)} without authentication: a proxy "
            "forwarding that name would serve anyone who reaches it. Set a token (--token or "
            "$CONVEYOR_DASHBOARD_TOKEN) or basic auth (--basic-auth USER:PASSWORD).")
    return AuthConfig(token=token, basic=basic, secret=derived, allowed_hosts=hosts)


def check_bind(host: str, auth: AuthConfig) -> None:
    """Refuse to listen beyond loopback without credentials."""
    if not is_loopback(host) and not auth.enabled:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host!r} without authentication: anyone who can "
            "reach that address could redrive, purge and cancel jobs. Set a token (--token or "
            "$CONVEYOR_DASHBOARD_TOKEN) or basic auth (--basic-auth USER:PASSWORD or "
            "$CONVEYOR_DASHBOARD_BASIC_AUTH), or bind 127.0.0.1 and reach it through an SSH "
            "tunnel.")


def _sign(secret: bytes, purpose: str, value: str) -> str:
    return hmac.new(secret, f"{purpose}\x00{value}".encode(), hashlib.sha256).hexdigest()


def csrf_token_for(secret: bytes, cookie_value: str) -> str:
    return _sign(secret, "csrf", cookie_value)


def make_session(secret: bytes, now: float | None = None) -> str:
    """``issued.id.signature``: the id lets one session be revoked without touching the others."""
    body = f"{int(now if now is not None else time.time())}.{secrets.token_urlsafe(16)}"
    return f"{body}.{_sign(secret, 'session', body)}"


def session_id(secret: bytes, value: str, now: float | None = None) -> str | None:
    """The session's id if ``value`` is a session this key signed and it has not expired."""
    body, _, sig = value.rpartition(".")
    issued, _, sid = body.partition(".")
    if not issued.isdigit() or len(issued) > 12 or not sid:
        return None
    if not hmac.compare_digest(sig, _sign(secret, "session", body)):
        return None
    age = (now if now is not None else time.time()) - int(issued)
    return sid if 0 <= age <= SESSION_TTL else None


def encode_flash(secret: bytes, data: dict[str, Any]) -> str:
    raw = json.dumps(data, separators=(",", ":")).encode()
    body = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return f"{body}.{_sign(secret, 'flash', body)[:32]}"


def decode_flash(secret: bytes, value: str) -> dict[str, Any] | None:
    body, _, sig = value.partition(".")
    if not body or not hmac.compare_digest(sig, _sign(secret, "flash", body)[:32]):
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, binascii.Error):
        return None
    return data if isinstance(data, dict) else None


def token_matches(auth: AuthConfig, presented: str) -> bool:
    return auth.token is not None and hmac.compare_digest(presented.encode(), auth.token.encode())


def _basic_matches(auth: AuthConfig, header_value: str) -> bool:
    if auth.basic is None:
        return False
    try:
        decoded = base64.b64decode(header_value, validate=True).decode("utf-8")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return False
    user, _, password = decoded.partition(":")
    # Both compared every time: no early exit that tells which half was wrong.
    ok_user = hmac.compare_digest(user.encode(), auth.basic[0].encode())
    ok_pass = hmac.compare_digest(password.encode(), auth.basic[1].encode())
    return ok_user and ok_pass


def cookie_header(name: str, value: str, *, path: str, secure: bool, max_age: int | None = None,
                  same_site: str = "Lax") -> bytes:
    parts = [f"{name}={value}", f"Path={path}", "HttpOnly", f"SameSite={same_site}"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts).encode("latin-1")


def parse_form(body: bytes) -> dict[str, list[str]]:
    return parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True,
                    max_num_fields=5000)


class SecurityMiddleware:
    """Host and client checks, authentication, CSRF and origin checks, security headers."""

    def __init__(self, app: ASGIApp, auth: AuthConfig) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        root = scope.get("root_path", "") or ""
        path = scope["path"]
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        secure = scope.get("scheme") == "https"
        cookie_path = root.rstrip("/") + "/"
        cookies = _cookies(headers.get("cookie", ""))
        method = scope["method"]

        refusal = self._refuse_host_or_client(scope, headers)
        if refusal is not None:
            await _plain(send, refusal[0], refusal[1])
            return

        public = path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)
        client = client_of(scope)
        if self.auth.enabled and headers.get("authorization"):
            wait = self.auth.guard.throttle.wait(client)
            if wait:
                await too_many_attempts(send, wait)
                return
        authenticated = not self.auth.enabled or self._authenticated(headers, cookies, client)
        if not public and not authenticated:
            await self._challenge(scope, send, method, root, path)
            return

        # The per-browser CSRF secret: issued on the first response that lacks it.
        csrf_cookie = cookies.get(CSRF_COOKIE, "")
        new_csrf = ""
        if len(csrf_cookie) < 32:
            csrf_cookie = new_csrf = secrets.token_urlsafe(32)
        state = scope.setdefault("state", {})
        state["csrf_token"] = csrf_token_for(self.auth.secret, csrf_cookie)
        state["auth_enabled"] = self.auth.enabled
        state["authenticated"] = authenticated  # the login page shows strangers no store details
        session = cookies.get(SESSION_COOKIE)
        state["logged_in"] = bool(self.auth.token is not None and session
                                  and self.auth.session_valid(session))
        state["cookie_path"] = cookie_path
        state["secure_cookies"] = secure
        flash = cookies.get(FLASH_COOKIE)
        state["flash"] = decode_flash(self.auth.secret, flash) if flash else None

        if method in UNSAFE_METHODS:
            problem, body = await self._check_unsafe(scope, receive, headers,
                                                     cookies.get(CSRF_COOKIE, ""))
            if problem is not None:
                await _plain(send, problem[0], problem[1])
                return
            receive = _replay(body)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                hdrs = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _OURS]
                hdrs += SECURITY_HEADERS
                if not path.startswith(PUBLIC_PREFIXES):
                    hdrs.append((b"cache-control", b"no-store"))
                if new_csrf:
                    hdrs.append((b"set-cookie", cookie_header(
                        CSRF_COOKIE, new_csrf, path=cookie_path, secure=secure,
                        same_site="Strict")))
                flash_set = FLASH_COOKIE.encode() + b"="
                if flash and not any(k == b"set-cookie" and v.startswith(flash_set)
                                     for k, v in hdrs):
                    hdrs.append((b"set-cookie", cookie_header(
                        FLASH_COOKIE, "", path=cookie_path, secure=secure, max_age=0)))
                message = {**message, "headers": hdrs}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _refuse_host_or_client(self, scope: Scope,
                               headers: dict[str, str]) -> tuple[int, str] | None:
        """Without credentials: loopback clients and loopback Host names only."""
        # With credentials any Host is fine unless allowed_hosts narrows it; without, only
        # loopback names (and allowed_hosts) are.
        if self.auth.allowed_hosts or not self.auth.enabled:
            host = _hostname(headers.get("host", ""))
            if host is None or not (is_loopback(host) or host in self.auth.allowed_hosts):
                return 400, ("Host not allowed. Without authentication the dashboard answers only "
                             "to localhost, 127.0.0.1 and [::1] (or the names in allowed_hosts).\n")
        if not self.auth.enabled:
            client = scope.get("client")
            if client is None or not is_loopback(str(client[0])):
                return 403, ("The dashboard has no authentication configured, so it answers only "
                             "loopback clients. Configure a token or basic auth to serve others.\n")
        return None

    def _authenticated(self, headers: dict[str, str], cookies: dict[str, str], client: str) -> bool:
        authz = headers.get("authorization", "")
        if authz:
            scheme, _, value = authz.partition(" ")
            if ((scheme.lower() == "bearer" and token_matches(self.auth, value.strip()))
                    or (scheme.lower() == "basic" and _basic_matches(self.auth, value.strip()))):
                self.auth.guard.throttle.succeeded(client)
                return True
            self.auth.guard.throttle.failed(client)
        session = cookies.get(SESSION_COOKIE)
        return bool(self.auth.token is not None and session and self.auth.session_valid(session))

    async def _challenge(self, scope: Scope, send: Send, method: str, root: str, path: str) -> None:
        if self.auth.token is not None and method in ("GET", "HEAD"):
            query = scope.get("query_string")
            target = path + ("?" + query.decode("latin-1") if query else "")
            location = f"{root}/login?next={quote(target, safe='')}"
            await _plain(send, 303, "Log in first.\n", [(b"location", location.encode("latin-1"))])
            return
        extra: list[tuple[bytes, bytes]] = []
        if self.auth.basic:
            extra = [(b"www-authenticate", b'Basic realm="Conveyor", charset="UTF-8"')]
        await _plain(send, 401, "Authentication required.\n", extra)

    async def _check_unsafe(self, scope: Scope, receive: Receive, headers: dict[str, str],
                            cookie: str) -> tuple[tuple[int, str] | None, bytes]:
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded":
            return (415, "State-changing requests must be HTML form posts "
                         "(application/x-www-form-urlencoded).\n"), b""
        if not self._same_origin(scope, headers):
            return (403, "Cross-site request refused: the Origin is not this dashboard.\n"), b""
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return (400, "client went away\n"), b""
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_FORM_BYTES:
                return (413, "Form too large.\n"), b""
        presented = (parse_form(body).get(CSRF_FIELD) or [""])[0]
        expected = csrf_token_for(self.auth.secret, cookie) if len(cookie) >= 32 else ""
        if not expected or not hmac.compare_digest(presented.encode(), expected.encode()):
            return (403, "Missing or invalid CSRF token: reload the page and try again.\n"), b""
        return None, body

    def _same_origin(self, scope: Scope, headers: dict[str, str]) -> bool:
        """Origin, else Referer, must name this site. Neither (a script, not a browser): allowed,
        the CSRF token still has to match."""
        claimed = headers.get("origin")
        if claimed is None:
            referer = headers.get("referer")
            if referer is None:
                return True
            parts = urlsplit(referer)
            claimed = f"{parts.scheme}://{parts.netloc}"
        if claimed == "null":
            return False
        scheme = scope.get("scheme", "http")
        host = headers.get("host", "")
        default_port = {"http": ":80", "https": ":443"}.get(scheme, "")
        ours = {f"{scheme}://{host}".lower()}
        if default_port and host.endswith(default_port):
            ours.add(f"{scheme}://{host[: -len(default_port)]}".lower())
        elif default_port:
            ours.add(f"{scheme}://{host}{default_port}".lower())
        return claimed.lower() in ours


_OURS = {k for k, _ in SECURITY_HEADERS} | {b"cache-control"}


def client_of(scope: Scope) -> str:
    """The client's address (after a trusted proxy's X-Forwarded-For, when one is configured)."""
    client = scope.get("client")
    return str(client[0]) if client else "?"


async def too_many_attempts(send: Send, wait: float) -> None:
    seconds = max(1, math.ceil(wait))
    await _plain(send, 429,
                 f"Too many failed attempts from your address: try again in {seconds} s.\n",
                 [(b"retry-after", str(seconds).encode())])


def _hostname(host_header: str) -> str | None:
    if not host_header:
        return None
    try:
        return (urlsplit(f"//{host_header}").hostname or "").lower() or None
    except ValueError:
        return None


def _cookies(header: str) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # a malformed Cookie header must not take the page down
        return {}
    return {k: m.value for k, m in jar.items()}


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive


async def _plain(send: Send, status: int, text: str,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store"), *SECURITY_HEADERS, *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
