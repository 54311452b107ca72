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

TOKEN = "s3cret-token-for-tests-0123456789"
PUBLIC = {"/healthz", "/login"}
SAMPLE_PARAMS = {"queue": "default", "job_id": "1", "action": "retry"}


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
    d = create_app(app, allowed_hosts=["jobs.internal"], sample_interval=3600)
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


@pytest.mark.parametrize("kwargs", [{"token": "short"}, {"basic_auth": "ops:short"}, {"basic_auth": "no-colon"},
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
