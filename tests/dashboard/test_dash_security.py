"""Secure by default: who may see the dashboard, who may change anything, and what every
response says to the browser. Runs on every store; every route is found from the router,
so a route added later is checked without anyone remembering to add it here."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from typing import Any

import pytest
from dashkit import BASE, ORIGIN, csrf_of, enqueue, kill_job, make_client, post
from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor.dashboard import DashboardApp, create_app
from conveyor.dashboard.security import check_bind, make_auth
from conveyor.errors import ConfigurationError

TOKEN = "q7XzR2vK9pLmW4tN8bYc6HdJ3sFgA5eU1iOwQxZr0Vk"  # secrets.token_urlsafe(32)
PUBLIC = {"/healthz", "/login"}
SAMPLE_PARAMS = {"queue": "default", "job_id": "1", "action": "retry", "batch_id": "b-1",
                 "key": "0123456789abcdef", "schedule": "nightly"}


def routes_of(dash: DashboardApp) -> list[tuple[str, str]]:
    """(method, concrete path) for every route the dashboard's router has."""
    out = []
    for route in dash.routes:
        if isinstance(route, Mount):
            out.append(("GET", route.path + "/dashboard.css"))
            continue
        assert isinstance(route, Route)
        path = re.sub(r"\{(\w+)(:\w+)?\}", lambda m: SAMPLE_PARAMS[m.group(1)], route.path)
        for method in sorted(route.methods or {"GET"}):
            if method != "HEAD":
                out.append((method, path))
    return out


def snapshot(app: Conveyor) -> list[tuple[int, str, int]]:
    jobs, cursor = [], None
    while True:
        page = app.backend.list_jobs(cursor=cursor, limit=500)
        jobs += [(j.id, str(j.state), j.attempts) for j in page.jobs]
        if page.next_cursor is None:
            return jobs
        cursor = page.next_cursor


@pytest.fixture
def token_dash(app: Conveyor) -> Iterator[DashboardApp]:
    d = create_app(app, token=TOKEN, sample_interval=3600)
    yield d
    d.close()


# -- headers ---------------------------------------------------------------------------------
def test_every_response_carries_a_strict_policy(app: Conveyor, dash: DashboardApp, client: TestClient) -> None:
    kill_job(app.backend)
    for method, path in [*routes_of(dash), ("GET", "/no-such-page")]:
        r = client.request(method, path, headers=ORIGIN)
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp, path
        assert "frame-ancestors 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff", path
        assert r.headers["x-frame-options"] == "DENY"
        if not path.startswith("/static/"):
            assert r.headers["cache-control"] == "no-store", path
    assert client.get("/healthz").headers["content-type"] == "application/json"


def test_pages_have_no_inline_script_or_style(app: Conveyor, client: TestClient) -> None:
    job = kill_job(app.backend)
    for path in ("/", "/jobs", f"/jobs/{job}", "/dead", "/workers", "/cron", "/queues/default"):
        page = client.get(path).text
        assert re.findall(r"<script(?![^>]*\bsrc=\"/static/)", page) == [], path
        assert " style=" not in page and "<style" not in page, path
        assert not re.search(r"\son[a-z]+=", page), path


# -- who may look ------------------------------------------------------------------------------
def test_without_auth_only_loopback_clients_are_served(dash: DashboardApp) -> None:
    with make_client(dash, client=("203.0.113.7", 40000)) as remote:
        for method, path in routes_of(dash):
            r = remote.request(method, path, headers={**ORIGIN, "X-Forwarded-For": "127.0.0.1"})
            assert r.status_code == 403, (method, path)
            assert "configure a token or basic auth" in r.text.lower()


def test_without_auth_a_foreign_host_name_is_refused(dash: DashboardApp) -> None:
    """DNS rebinding: evil.example re-pointed at 127.0.0.1 still says Host: evil.example."""
    with make_client(dash, base_url="http://evil.example:8000") as c:
        assert c.get("/").status_code == 400
    for host in ("http://localhost:8000", "http://127.0.0.1:8000", "http://[::1]:8000"):
        with make_client(dash, base_url=host) as c:
            assert c.get("/healthz").status_code == 200, host


def test_allowed_hosts_extend_the_loopback_names(app: Conveyor) -> None:
    d = create_app(app, token=TOKEN, allowed_hosts=["jobs.internal"], sample_interval=3600)
    try:
        with make_client(d, base_url="http://jobs.internal") as c:
            assert c.get("/healthz").status_code == 200
        with make_client(d, base_url="http://other.internal") as c:
            assert c.get("/healthz").status_code == 400
    finally:
        d.close()


def test_with_a_token_every_route_needs_it(token_dash: DashboardApp) -> None:
    with make_client(token_dash, client=("203.0.113.7", 40000)) as remote:
        for method, path in routes_of(token_dash):
            if path in PUBLIC or path.startswith("/static/"):
                continue
            r = remote.request(method, path, headers=ORIGIN)
            if method == "GET":
                assert r.status_code == 303 and r.headers["location"].startswith("/login?next="), (method, path)
            else:
                assert r.status_code == 401, (method, path)
        assert remote.get("/healthz").status_code == 200
        assert remote.get("/static/dashboard.css").status_code == 200
        assert remote.get("/", headers={"Authorization": "Bearer wrong-token-wrong-token"}).status_code == 303
        assert remote.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_token_login_sets_a_signed_httponly_session(token_dash: DashboardApp) -> None:
    with make_client(token_dash, client=("203.0.113.7", 40000)) as c:
        login = c.get("/login?next=/dead")
        assert 'class="store"' not in login.text and 'class="mainnav"' not in login.text  # nothing for strangers
        token = re.search(r'name="csrf_token" value="(\w+)"', login.text)
        assert token
        bad = c.post("/login", data={"csrf_token": token.group(1), "token": "nope", "next": "/dead"},
                     headers=ORIGIN)
        assert bad.status_code == 401 and "not right" in bad.text
        ok = c.post("/login", data={"csrf_token": token.group(1), "token": TOKEN, "next": "/dead"}, headers=ORIGIN)
        assert ok.status_code == 303 and ok.headers["location"] == "/dead"
        cookie = next(v for k, v in ok.headers.multi_items() if k == "set-cookie" and "conveyor_session" in v)
        assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie
        assert c.get("/dead").status_code == 200
        # A forged or tampered session is not a session.
        c.cookies.clear()
        c.cookies.set("conveyor_session", "9999999999.deadbeef")
        assert c.get("/dead").status_code == 303


def test_login_next_never_leaves_the_dashboard(token_dash: DashboardApp) -> None:
    with make_client(token_dash) as c:
        token = csrf_of(c, "/login")
        for nxt in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
            r = c.post("/login", data={"csrf_token": token, "token": TOKEN, "next": nxt}, headers=ORIGIN)
            assert r.status_code == 303 and r.headers["location"] == "/", nxt


def test_basic_auth(app: Conveyor) -> None:
    d = create_app(app, basic_auth="ops:correct-horse-battery", sample_interval=3600)
    try:
        with make_client(d, client=("203.0.113.7", 40000)) as c:
            r = c.get("/")
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
            wrong = base64.b64encode(b"ops:wrong-horse-battery").decode()
            assert c.get("/", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
            good = base64.b64encode(b"ops:correct-horse-battery").decode()
            assert c.get("/", headers={"Authorization": f"Basic {good}"}).status_code == 200
    finally:
        d.close()


def test_a_non_loopback_bind_needs_auth() -> None:
    for host in ("0.0.0.0", "::", "192.168.1.10", "example.com"):
        with pytest.raises(ConfigurationError, match="without authentication"):
            check_bind(host, make_auth())
        check_bind(host, make_auth(token=TOKEN))
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        check_bind(host, make_auth())


@pytest.mark.parametrize("kwargs", [{"token": "short"}, {"token": "a" * 64}, {"basic_auth": "ops:short"}, {"basic_auth": "no-colon"},
                                    {"basic_auth": ":passwordpassword"}])
def test_weak_credentials_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        make_auth(**kwargs)


def test_credentials_never_appear_in_repr() -> None:
    auth = make_auth(token=TOKEN, basic_auth="ops:correct-horse-battery")
    assert TOKEN not in repr(auth) and "correct-horse" not in repr(auth)


# -- who may change anything (CSRF) ----------------------------------------------------------------
ACTIONS = [
    ("/jobs/{dead}/retry", {"confirmed": "yes"}),
    ("/jobs/{dead}/purge", {"confirmed": "yes"}),
    ("/jobs/{waiting}/cancel", {"confirmed": "yes"}),
    ("/dead/redrive", {"confirmed": "yes", "all": "yes"}),
    ("/dead/purge", {"confirmed": "yes", "ids": "{dead}"}),
]


@pytest.mark.parametrize(("path", "form"), ACTIONS, ids=[a[0] for a in ACTIONS])
def test_actions_refuse_every_forgery_and_change_nothing(app: Conveyor, dash: DashboardApp, client: TestClient,
                                                         path: str, form: dict[str, str]) -> None:
    ids = {"dead": str(kill_job(app.backend)), "waiting": str(enqueue(app.backend, "w")[0])}
    path = path.format(**ids)
    form = {k: v.format(**ids) for k, v in form.items()}
    before = snapshot(app)
    token = csrf_of(client)
    with make_client(dash) as other:
        foreign_token = csrf_of(other)
    assert client.get(path).status_code == 405
    assert client.post(path, data=form, headers=ORIGIN).status_code == 403  # no token
    assert post(client, path, form, token=foreign_token).status_code == 403  # another browser's token
    assert post(client, path, form, token=token, headers={"Origin": "https://evil.example"}).status_code == 403
    assert post(client, path, form, token=token, headers={"Origin": "null"}).status_code == 403
    r = client.post(path, data={**form, "csrf_token": token}, headers={"Referer": "https://evil.example/x"})
    assert r.status_code == 403  # no Origin, a foreign Referer
    body = "&".join(f"{k}={v}" for k, v in {**form, "csrf_token": token}.items())
    assert client.post(path, content=body, headers={**ORIGIN, "Content-Type": "text/plain"}).status_code == 415
    assert client.post(path, json={**form, "csrf_token": token}, headers=ORIGIN).status_code == 415
    with make_client(dash) as fresh:  # a browser without the CSRF cookie at all
        assert post(fresh, path, form, token=token).status_code == 403
    assert snapshot(app) == before, "a refused request changed the store"
    # The same action, done right, does change the store: the refusals above were not vacuous.
    done = post(client, path, form, token=token)
    assert done.status_code == 303, done.text
    assert snapshot(app) != before


def test_an_action_asks_for_confirmation_first(app: Conveyor, client: TestClient) -> None:
    dead = kill_job(app.backend)
    before = snapshot(app)
    page = post(client, f"/jobs/{dead}/purge", {})
    assert page.status_code == 200 and "Purge?" in page.text and "cannot be undone" in page.text
    assert 'name="confirmed" value="yes"' in page.text
    assert snapshot(app) == before


# -- mounted inside another app ------------------------------------------------------------------------
def test_mounted_under_a_prefix(app: Conveyor) -> None:
    dead = kill_job(app.backend)
    dash = create_app(app, sample_interval=3600)
    outer = Starlette(routes=[Mount("/ops/conveyor", app=dash)])
    try:
        with make_client(outer) as c:
            page = c.get("/ops/conveyor/")
            assert page.status_code == 200
            assert 'href="/ops/conveyor/static/dashboard.css"' in page.text
            assert 'href="/ops/conveyor/jobs"' in page.text
            cookie = page.headers["set-cookie"]
            assert "Path=/ops/conveyor/" in cookie
            token = csrf_of(c, "/ops/conveyor/dead")
            r = c.post(f"/ops/conveyor/jobs/{dead}/retry", data={"csrf_token": token, "confirmed": "yes"},
                       headers={"Origin": BASE})
            assert r.status_code == 303 and r.headers["location"] == f"/ops/conveyor/jobs/{dead}"
            flash = c.get(r.headers["location"])
            assert "is back on queue" in flash.text
            assert c.get("/ops/conveyor/static/dashboard.js").status_code == 200
    finally:
        dash.close()
    assert str(app.get_job(dead).state) == "available"


# -- beyond loopback: a proxy in front, HTTPS ---------------------------------------------------------
def test_a_host_beyond_loopback_needs_a_token(app: Conveyor) -> None:
    """An --allowed-host is what a proxy on this machine forwards: without credentials the proxy
    would serve anyone. Loopback names stay allowed without credentials."""
    for host in ("jobs.internal", "10.0.0.5", "0.0.0.0"):
        with pytest.raises(ConfigurationError, match="without authentication"):
            create_app(app, allowed_hosts=[host])
        create_app(app, token=TOKEN, allowed_hosts=[host]).close()
    create_app(app, allowed_hosts=["localhost", "127.0.0.1", "[::1]"]).close()


def test_behind_a_trusted_proxy_the_scheme_is_the_clients(app: Conveyor) -> None:
    """X-Forwarded-Proto from a trusted proxy: an https Origin is this site and the cookies are
    Secure. The same headers from anyone else are ignored."""
    dead = kill_job(app.backend)
    d = create_app(app, token=TOKEN, forwarded_allow_ips="10.0.0.1", sample_interval=3600)
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.9", "Origin": "https://jobs.example"}
    try:
        with make_client(d, base_url="http://jobs.example", client=("10.0.0.1", 40000)) as proxy:
            token = csrf_of(proxy, "/login")
            login = proxy.post("/login", data={"csrf_token": token, "token": TOKEN, "next": "/dead"}, headers=https)
            assert login.status_code == 303, login.text
            cookies = [v for k, v in login.headers.multi_items() if k == "set-cookie"]
            assert cookies and all("Secure" in c for c in cookies), cookies
            # The proxy talks https to the browser, so the browser sends its Secure cookies back.
            jar = "; ".join(c.split(";")[0] for c in cookies)
            csrf = proxy.cookies["conveyor_csrf"]
            r = proxy.post(f"/jobs/{dead}/retry", data={"csrf_token": token, "confirmed": "yes"},
                           headers={**https, "Cookie": f"{jar}; conveyor_csrf={csrf}"})
            assert r.status_code == 303, r.text
        assert str(app.get_job(dead).state) == "available"
        with make_client(d, base_url="http://jobs.example", client=("203.0.113.7", 40000)) as stranger:
            token = csrf_of(stranger, "/login")
            r = stranger.post("/login", data={"csrf_token": token, "token": TOKEN}, headers=https)
            assert r.status_code == 403 and "Cross-site" in r.text
    finally:
        d.close()


def test_proxy_headers_are_ignored_unless_trusted(app: Conveyor) -> None:
    d = create_app(app, token=TOKEN, sample_interval=3600)
    try:
        with make_client(d, base_url="http://jobs.example") as c:
            token = csrf_of(c, "/login")
            r = c.post("/login", data={"csrf_token": token, "token": TOKEN},
                       headers={"X-Forwarded-Proto": "https", "Origin": "https://jobs.example"})
            assert r.status_code == 403
            ok = c.post("/login", data={"csrf_token": token, "token": TOKEN}, headers={"Origin": "http://jobs.example"})
            assert ok.status_code == 303 and "Secure" not in ok.headers["set-cookie"]
    finally:
        d.close()


def test_trusting_a_proxy_needs_credentials(app: Conveyor) -> None:
    """A proxy in front serves clients beyond this machine: no proxy trust without a token."""
    with pytest.raises(ConfigurationError, match="without authentication"):
        create_app(app, forwarded_allow_ips="127.0.0.1")
    create_app(app, token=TOKEN, forwarded_allow_ips="127.0.0.1").close()


def test_behind_a_trusted_proxy_each_client_is_slowed_on_its_own(app: Conveyor) -> None:
    """The proxy's X-Forwarded-For names the client: one guesser does not lock everyone out."""
    from conveyor.dashboard.guard import FREE_FAILURES

    d = create_app(app, token=TOKEN, forwarded_allow_ips="127.0.0.1", sample_interval=3600)
    freeze_clock(d)
    guesser = {"X-Forwarded-For": "203.0.113.7", "Authorization": "Bearer guess-guess-guess"}
    try:
        with make_client(d) as proxy:
            for _ in range(FREE_FAILURES):
                assert proxy.get("/", headers=guesser).status_code == 303
            assert proxy.get("/", headers=guesser).status_code == 429
            ok = proxy.get("/", headers={"X-Forwarded-For": "198.51.100.9", "Authorization": f"Bearer {TOKEN}"})
            assert ok.status_code == 200
            assert set(d.dashboard.auth.guard.throttle.failures) == {"203.0.113.7"}
    finally:
        d.close()


def test_over_https_cookies_are_secure_and_posts_work(app: Conveyor, token_dash: DashboardApp) -> None:
    dead = kill_job(app.backend)
    with make_client(token_dash, base_url="https://127.0.0.1:8443") as c:
        token = csrf_of(c, "/login")
        origin = {"Origin": "https://127.0.0.1:8443"}
        login = c.post("/login", data={"csrf_token": token, "token": TOKEN}, headers=origin)
        assert login.status_code == 303 and "Secure" in login.headers["set-cookie"]
        r = c.post(f"/jobs/{dead}/retry", data={"csrf_token": token, "confirmed": "yes"}, headers=origin)
        assert r.status_code == 303 and all("Secure" in v for k, v in r.headers.multi_items() if k == "set-cookie")
        assert c.post(f"/jobs/{dead}/retry", data={"csrf_token": token, "confirmed": "yes"},
                      headers={"Origin": "http://127.0.0.1:8443"}).status_code == 403


# -- sessions ----------------------------------------------------------------------------------------
def login(c: TestClient) -> str:
    token = csrf_of(c, "/login")
    r = c.post("/login", data={"csrf_token": token, "token": TOKEN}, headers=ORIGIN)
    assert r.status_code == 303, r.text
    return str(c.cookies["conveyor_session"])


def test_logout_revokes_the_session(token_dash: DashboardApp) -> None:
    with make_client(token_dash) as c, make_client(token_dash) as other:
        old = login(c)
        kept = login(other)
        assert c.get("/dead").status_code == 200
        r = post(c, "/logout", {})
        assert r.status_code == 303
        c.cookies.set("conveyor_session", old)  # a copy of the cookie kept from before
        assert c.get("/dead").status_code == 303
        assert c.get("/dead", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert other.cookies["conveyor_session"] == kept and other.get("/dead").status_code == 200


def test_the_cookie_key_is_salted_per_server(app: Conveyor) -> None:
    """Not a hash of the token: two servers with the same token sign differently unless they
    share a secret, and the key is not the plain sha256 of the credentials."""
    import hashlib
    import json

    one, two = make_auth(token=TOKEN), make_auth(token=TOKEN)
    assert one.secret != two.secret
    unsalted = hashlib.sha256(b"conveyor-dashboard-v1\x00" + json.dumps([TOKEN, None]).encode()).digest()
    assert unsalted not in (one.secret, two.secret)
    shared = "replica-secret-kept-in-the-vault-0123456789"
    assert make_auth(token=TOKEN, secret=shared).secret == make_auth(token=TOKEN, secret=shared).secret
    assert make_auth(token=TOKEN, secret=shared).secret != make_auth(token=TOKEN + "x", secret=shared).secret
    a, b = (create_app(app, token=TOKEN, secret=shared, sample_interval=3600) for _ in range(2))
    c3 = create_app(app, token=TOKEN, sample_interval=3600)
    try:
        with make_client(a) as ca, make_client(b) as cb, make_client(c3) as cc:
            session = login(ca)
            cb.cookies.set("conveyor_session", session)
            assert cb.get("/dead").status_code == 200  # a replica with the same secret
            cc.cookies.set("conveyor_session", session)
            assert cc.get("/dead").status_code == 303  # another server
    finally:
        for d in (a, b, c3):
            d.close()


# -- brute force -----------------------------------------------------------------------------------
def freeze_clock(dash: DashboardApp, at: float = 1000.0) -> list[float]:
    now = [at]
    dash.dashboard.auth.guard.throttle.clock = lambda: now[0]
    return now


def test_repeated_failed_logins_are_slowed(token_dash: DashboardApp) -> None:
    from conveyor.dashboard.guard import FREE_FAILURES

    now = freeze_clock(token_dash)
    with make_client(token_dash, client=("203.0.113.7", 40000)) as c, \
            make_client(token_dash, client=("198.51.100.9", 40000)) as other:
        token = csrf_of(c, "/login")
        for _ in range(FREE_FAILURES):
            r = c.post("/login", data={"csrf_token": token, "token": "not-it"}, headers=ORIGIN)
            assert r.status_code == 401
        r = c.post("/login", data={"csrf_token": token, "token": TOKEN}, headers=ORIGIN)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text  # even the right token
        assert c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 429
        assert login(other)  # another client is not slowed
        now[0] += int(r.headers["retry-after"])
        r = c.post("/login", data={"csrf_token": token, "token": TOKEN}, headers=ORIGIN)
        assert r.status_code == 303  # after the delay: in, and the count starts again
        for _ in range(FREE_FAILURES - 1):
            assert c.post("/login", data={"csrf_token": token, "token": "x"}, headers=ORIGIN).status_code == 401


def test_failed_bearer_tokens_are_slowed_and_the_delay_grows(token_dash: DashboardApp) -> None:
    from conveyor.dashboard.guard import FREE_FAILURES

    now = freeze_clock(token_dash)
    throttle = token_dash.dashboard.auth.guard.throttle
    with make_client(token_dash, client=("203.0.113.7", 40000)) as c:
        for _ in range(FREE_FAILURES):
            assert c.get("/", headers={"Authorization": "Bearer guess-guess-guess"}).status_code == 303
        delays = []
        for _ in range(4):
            r = c.get("/", headers={"Authorization": "Bearer guess-guess-guess"})
            assert r.status_code == 429
            delays.append(int(r.headers["retry-after"]))
            now[0] += delays[-1]
            assert c.get("/", headers={"Authorization": "Bearer guess-guess-guess"}).status_code == 303
        assert delays == sorted(delays) and delays[-1] > delays[0]
    assert len(throttle.failures) == 1


@pytest.mark.parametrize("weak", [
    "a" * 64, "0123456789" * 5, "password" * 6, "correct-horse-battery-staple-orange-purple", "Tr0ub4dor&3" * 3,
    "q7XzR2vK9pLmW4tN",  # random but 16 characters: about 95 bits
])
def test_weak_tokens_are_refused_with_a_way_to_make_one(weak: str) -> None:
    with pytest.raises(ConfigurationError, match=r"secrets\.token_urlsafe\(32\)"):
        make_auth(token=weak)


def test_random_tokens_are_accepted() -> None:
    import secrets

    for _ in range(50):
        make_auth(token=secrets.token_urlsafe(32))
        make_auth(token=secrets.token_hex(24))
    make_auth(token=TOKEN)


# -- what strangers and job data may show ----------------------------------------------------------
def test_strangers_never_see_the_store(tmp_path: Any) -> None:
    """The store is down and the sampler says why (its URL, host, database): only to those
    logged in."""
    from support import wait_until

    down = Conveyor("postgresql://alice:pw@127.0.0.1:1/ledgerdb")
    d = create_app(down, token=TOKEN, sample_interval=3600)
    try:
        d.dashboard.sampler.ensure_started()
        wait_until(lambda: d.dashboard.sampler.last_error is not None, timeout=30)
        with make_client(d, client=("203.0.113.7", 40000)) as c:
            page = c.get("/login").text
            assert "ledgerdb" not in page and "alice" not in page and "Sampling the store failed" not in page
            login(c)
            assert "ledgerdb" in c.get("/login").text  # the same page, logged in: the warning is there
    finally:
        d.close()


def test_control_characters_render_visibly(app: Conveyor, client: TestClient) -> None:
    job = kill_job(app.backend, message="bad\x01byte\x1b[31mred\u202eevil\x7f", args={"note": "ok\ttab"},
                   traceback="Traceback (most recent call last):\n  line\x08\nValueError: bad")
    page = client.get(f"/jobs/{job}").text
    for raw in ("\x01", "\x1b", "\u202e", "\x7f", "\x08"):
        assert raw not in page, repr(raw)
    assert "bad\\x01byte\\x1b[31mred\\u202eevil\\x7f" in page
    assert "Traceback (most recent call last):\n  line\\x08\nValueError: bad" in page  # newlines kept
    assert "ok\\ttab" in page  # JSON's own escape, unchanged


def test_a_nul_renders_visibly(tmp_path: Any) -> None:
    """PostgreSQL refuses NUL in text; SQLite and Redis keep it, so it reaches the page."""
    app = Conveyor(f"sqlite:///{tmp_path}/nul.db")
    d = create_app(app, sample_interval=3600)
    try:
        job = kill_job(app.backend, message="before\x00after")
        with make_client(d) as c:
            page = c.get(f"/jobs/{job}").text
        assert "\x00" not in page and "before\\x00after" in page
    finally:
        d.close()
        app.close()


def test_a_huge_job_id_is_not_found(app: Conveyor, client: TestClient) -> None:
    for job_id in ("99999999999999999999999999", str(2**63), str(2**63 - 1)):
        assert client.get(f"/jobs/{job_id}").status_code == 404, job_id
        r = post(client, f"/jobs/{job_id}/retry", {"confirmed": "yes"})
        assert r.status_code in (303, 404) and r.status_code != 503, job_id
    job = kill_job(app.backend)
    assert client.get(f"/jobs/{job}").status_code == 200


def test_a_crlf_in_a_message_cannot_forge_a_text_log_line() -> None:
    import logging

    from conveyor.logs import TextFormatter

    record = logging.LogRecord("conveyor.worker", logging.ERROR, __file__, 1,
                               "job %s failed: %s", (7, "boom\r\n2026-01-01 00:00:00 INFO conveyor: all good\x1b[2J"),
                               None)
    line = TextFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert line == "ERROR conveyor.worker: job 7 failed: boom\\r\\n2026-01-01 00:00:00 INFO conveyor: all good\\x1b[2J"
    plain = logging.LogRecord("conveyor", logging.INFO, __file__, 1, "plain message", None, None)
    assert TextFormatter("%(message)s").format(plain) == "plain message"
