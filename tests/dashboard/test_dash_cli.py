"""`conveyor dashboard` and `conveyor demo` as a user runs them: real processes, real sockets."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conveyor.dashboard.security import make_auth

pytestmark = pytest.mark.process

TOKEN = "Hc4nT8wQz1LrK6vXp3YbM9dS5gJfA2eU7iOtR0qZkWy"  # secrets.token_urlsafe(32)
SECRET = "replicas-share-this-key-7Jq2Vx9Lk4Tz"


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    e["PYTHONUNBUFFERED"] = "1"
    e.update(extra)
    return e


def conveyor(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, timeout=60,
                          **kwargs)  # type: ignore[call-overload,no-any-return]


def read_url(stream: object, pattern: str, deadline: float) -> str:
    seen = []
    while time.monotonic() < deadline:
        line = stream.readline()  # type: ignore[attr-defined]
        if not line:
            break
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m.group(1)
    raise AssertionError(f"no URL printed; output so far: {''.join(seen)}")


def test_refuses_a_public_bind_without_auth(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    r = conveyor("--url", url, "dashboard", "--host", "0.0.0.0", "--port", "0", env=env())
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refusing to serve the dashboard on '0.0.0.0' without authentication" in r.stderr
    r = conveyor("--url", url, "dashboard", "--token", "short", env=env())
    assert r.returncode == 2 and "too weak" in r.stderr and "secrets.token_urlsafe(32)" in r.stderr, r.stderr
    # A Host name other than loopback is what a proxy forwards: it needs credentials too.
    r = conveyor("--url", url, "dashboard", "--allowed-host", "jobs.example", "--port", "0", env=env())
    assert r.returncode == 2 and "refusing to answer to jobs.example without authentication" in r.stderr, r.stderr


def test_public_bind_with_a_token_refuses_strangers(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "--url", f"sqlite:///{tmp_path}/c.db", "dashboard", "--host", "0.0.0.0",
         "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env(CONVEYOR_DASHBOARD_TOKEN=TOKEN, CONVEYOR_DASHBOARD_SECRET=SECRET))
    try:
        base = read_url(proc.stderr, r"dashboard on (http://\S+?)/? \(token\)", time.monotonic() + 30)
        assert httpx.get(base + "/", follow_redirects=False).status_code == 303
        assert httpx.get(base + "/jobs", headers={"Authorization": "Bearer not-the-token-at-all"},
                         follow_redirects=False).status_code == 303
        assert httpx.post(base + "/dead/purge", data={"all": "yes", "confirmed": "yes"}).status_code == 401
        # A session made by a replica sharing the secret is accepted; one made under another key is not.
        replica = make_auth(token=TOKEN, secret=SECRET).new_session()
        assert httpx.get(base + "/", cookies={"conveyor_session": replica}).status_code == 200
        stranger = make_auth(token=TOKEN).new_session()
        assert httpx.get(base + "/", cookies={"conveyor_session": stranger}, follow_redirects=False).status_code == 303
        ok = httpx.get(base + "/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and "Overview" in ok.text
        assert TOKEN not in ok.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_https_behind_a_proxy_from_the_command_line(tmp_path: Path, self_signed: tuple[str, str]) -> None:
    """--tls-cert/--tls-key serve https, and the start line says so and names the trusted proxy;
    a key that is not the certificate's stops it at start."""
    cert, key = self_signed
    url = f"sqlite:///{tmp_path}/c.db"
    other = tmp_path / "other.pem"
    subprocess.run(["openssl", "genrsa", "-out", str(other), "2048"], check=True, capture_output=True, timeout=60)
    r = conveyor("--url", url, "dashboard", "--port", "0", "--tls-cert", cert, "--tls-key", str(other),
                 env=env(CONVEYOR_DASHBOARD_TOKEN=TOKEN))
    assert r.returncode == 2 and "cannot use the TLS certificate" in r.stderr, r.stderr
    r = conveyor("--url", url, "dashboard", "--port", "0", "--forwarded-allow-ips", "127.0.0.1", env=env())
    assert r.returncode == 2 and "refusing to trust proxy headers without authentication" in r.stderr, r.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "--url", url, "dashboard", "--port", "0", "--tls-cert", cert,
         "--tls-key", key, "--forwarded-allow-ips", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env(CONVEYOR_DASHBOARD_TOKEN=TOKEN))
    try:
        base = read_url(proc.stderr, r"dashboard on (https://\S+?)/? \(token, trusting proxy headers from 127\.0\.0\.1\)",
                        time.monotonic() + 30)
        with httpx.Client(verify=ssl.create_default_context(cafile=cert)) as tls:
            assert tls.get(base + "/healthz").status_code == 200
            r = tls.get(base + "/", headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200 and "Overview" in r.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_demo_serves_the_dashboard_with_live_jobs(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "demo", "--duration", "8", "--no-live", "--db", str(tmp_path / "d.db"),
         "--dashboard-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env())
    try:
        base = read_url(proc.stdout, r"^Dashboard: (http://\S+?)/?$", time.monotonic() + 30)
        deadline = time.monotonic() + 20
        while True:  # jobs flow: some have succeeded, and the page shows the demo's queues
            page = httpx.get(base + "/").text
            done = [int(n) for n in re.findall(r'data-col="succeeded">(\d+)<', page)]
            if {'data-queue="high"', 'data-queue="default"'} <= set(re.findall(r'data-queue="\w+"', page)) \
                    and sum(done) > 0:
                break
            assert time.monotonic() < deadline, "the dashboard never showed the demo's jobs"
            time.sleep(0.5)
        assert httpx.get(base + "/workers").text.count('class="card worker"') == 1
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
        assert "Demo finished" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
