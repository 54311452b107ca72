"""The pytest plugin (entry point ``pytest11``): a user's test file with the ``conveyor_app``
fixture, run by pytest's own ``pytester``, on a SQLite file by default and on PostgreSQL or
Redis when CONVEYOR_TEST_URL names one.

Each run is a subprocess: a plain ``pytest`` run, which finds the plugin through its entry
point, and leaves this process's modules alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from stores import POSTGRES_URL, REDIS_URL

from conveyor.testing import temporary_store

pytest_plugins = ["pytester"]

USER_APP = """
from conveyor import Conveyor, current_job

app = Conveyor("sqlite:////nonexistent/dir/production.db")

@app.task(name="shout")
def shout(word: str) -> str:
    ctx = current_job()
    return f"{word.upper()}!{ctx.attempt}"
"""

USER_TESTS = """
import os

from conveyor import JobState
from conveyor.testing import drain

import myapp

def test_enqueue_and_drain(conveyor_app):
    assert conveyor_app is myapp.app  # the user's app, with its tasks
    job = myapp.shout.enqueue("hi")
    [done] = drain(conveyor_app)
    assert done.id == job.id and done.state is JobState.SUCCEEDED
    assert done.result == "HI!1"

def test_each_test_has_a_fresh_store(conveyor_app, conveyor_url):
    assert conveyor_app.url == conveyor_url
    assert conveyor_app.backend.list_jobs().jobs == []
    myapp.shout.enqueue("again")
    assert len(drain(conveyor_app)) == 1

def test_the_app_is_given_back_afterwards():
    assert myapp.app.url == "sqlite:////nonexistent/dir/production.db"
"""


def make_project(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(myapp=USER_APP, test_user=USER_TESTS)
    pytester.makeini("[pytest]\nconveyor_app = myapp:app\n")


def test_a_user_test_file_passes_on_sqlite(pytester: pytest.Pytester,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONVEYOR_TEST_URL", raising=False)
    make_project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_an_app_fixture_without_configuration(pytester: pytest.Pytester,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """No conveyor_app option: a fresh app of its own, on the temporary store."""
    monkeypatch.delenv("CONVEYOR_TEST_URL", raising=False)
    pytester.makepyfile(test_bare="""
        from conveyor.testing import drain

        def test_bare(conveyor_app, tmp_path):
            @conveyor_app.task(name="double")
            def double(n):
                return 2 * n

            double.enqueue(21)
            assert [j.result for j in drain(conveyor_app)] == [42]
            assert conveyor_app.url.startswith("sqlite:///" + str(tmp_path))
    """)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_bad_app_option_says_so(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(conveyor_app):\n    pass\n")
    pytester.makeini("[pytest]\nconveyor_app = nosuchmodule:app\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*conveyor_app*nosuchmodule*"])


@pytest.fixture(params=[POSTGRES_URL, REDIS_URL], ids=["postgres", "redis"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A server's URL, once a temporary store was made and deleted there. Asked for before
    ``pytester``: that fixture drops, when its test ends, the modules imported after it was
    set up, and a second copy of psycopg's, imported later, fails this process's PostgreSQL
    connections."""
    base: str = request.param
    try:
        with temporary_store(base, tmp_path):
            leftovers(base)
    except Exception as exc:  # the service is down: skipped, as in the conformance suite
        pytest.skip(f"{base} unavailable: {exc}")
    return base


def test_a_server_store_from_the_environment(server: str, pytester: pytest.Pytester,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    base = server
    monkeypatch.setenv("CONVEYOR_TEST_URL", base)
    make_project(pytester)
    pytester.makepyfile(test_where=f"""
        def test_where(conveyor_url):
            assert conveyor_url.startswith({base.split("://")[0] + "://"!r})
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    assert leftovers(base) == []


def leftovers(base: str) -> list[str]:
    """Stores the plugin made and did not delete: schemas or keys named conveyor_test_*."""
    if base.startswith("postgresql"):
        import psycopg

        with psycopg.connect(base, autocommit=True) as conn:
            rows = conn.execute("SELECT nspname FROM pg_namespace "
                                "WHERE nspname LIKE 'conveyor_pytest_%'").fetchall()
        return [r[0] for r in rows]
    import redis

    client = redis.Redis.from_url(base)
    try:
        return [k.decode() for k in client.scan_iter(match="{conveyor_pytest_*", count=1000)]
    finally:
        client.close()
