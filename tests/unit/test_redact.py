"""Redaction: what it masks and what it leaves alone, on real-world shapes; and that its work
grows linearly with the text, so hostile data cannot stall the CLI, the dashboard or a worker."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.redact import MASK, mask_text, redact, shown_text

# (text as stored, text as shown). Each row is a shape seen in arguments, results, error
# messages or tracebacks: DSNs, query strings, libpq/ODBC strings, headers, reprs, JSON, env files.
MASKED = [
    # URLs whose password has / or @ in it (both are common in generated passwords)
    ("postgres://app:s3cr/et@db:5432/x", "postgres://app:***@db:5432/x"),
    ("postgres://app:p@ss@db/x", "postgres://app:***@db/x"),
    ("postgresql://app:a/b@c/d@db.internal:5432/jobs?sslmode=require",
     "postgresql://app:***@db.internal:5432/jobs?sslmode=require"),
    ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
    ("amqp://guest:guest@rabbit//", "amqp://guest:***@rabbit//"),
    ("https://user:pw@example.com/p?email=a@b.com", "https://user:***@example.com/p?email=a@b.com"),
    ("could not connect: postgresql://u:pw@h1/db, then mysql+pymysql://r:pw2@h2/db",
     "could not connect: postgresql://u:***@h1/db, then mysql+pymysql://r:***@h2/db"),
    ("https://x-access-token:ghs_abc123@github.com/o/r.git", "https://x-access-token:***@github.com/o/r.git"),
    # query-string secrets
    ("https://api.example.com/v1?api_key=abc123&page=2", "https://api.example.com/v1?api_key=***&page=2"),
    ("GET /cb?code=1&access_token=ya29.a0Af-x_Y&state=s", "GET /cb?code=1&access_token=***&state=s"),
    ("https://h/x?token=abc", "https://h/x?token=***"),
    ("POST /oauth?client_id=c&client_secret=shh", "POST /oauth?client_id=c&client_secret=***"),
    ("https://s3.example.com/b?X-Amz-Security-Token=FQo%2Bx&X-Amz-Expires=60",
     "https://s3.example.com/b?X-Amz-Security-Token=***&X-Amz-Expires=60"),
    # libpq and ODBC key=value strings
    ("host=db port=5432 user=app password=s3cret dbname=x", "host=db port=5432 user=app password=*** dbname=x"),
    ("host=db password='p w' dbname=x", "host=db password='***' dbname=x"),
    ("Server=db;Uid=app;Pwd=s3cret;Database=x", "Server=db;Uid=app;Pwd=***;Database=x"),
    # HTTP headers, alone and inside reprs
    ("Authorization: Bearer eyJhbGciOi.eyJzdWIi.sig", "Authorization: Bearer ***"),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    ("headers={'Authorization': 'Bearer abc.def', 'Accept': '*/*'}",
     "headers={'Authorization': 'Bearer ***', 'Accept': '*/*'}"),
    ("x-api-key: abc", "x-api-key: ***"),
    ("Cookie: sessionid=abc; csrftoken=def", "Cookie: ***; csrftoken=***"),
    ("curl -H 'Bearer 0123456789abcdefABCDEF'", "curl -H 'Bearer ***'"),
    # Python reprs and JSON in error text
    ("{'password': 'x'}", "{'password': '***'}"),
    ('{"token": "x", "user": "bob"}', '{"token": "***", "user": "bob"}'),
    ('{"api_key": "k\\"ey", "n": 1}', '{"api_key": "***", "n": 1}'),
    ('{"db": {"user": "u", "password": "it\'s"}}', '{"db": {"user": "u", "password": "***"}}'),
    ('{"refresh_token":"r1"}', '{"refresh_token":"***"}'),
    ("login(user='bob', password='hunter2')", "login(user='bob', password='***')"),
    ("Connection(passwd=hunter2, host=x)", "Connection(passwd=***, host=x)"),
    # env files, ini, YAML
    ("access_key=AKIAIOSFODNN7EXAMPLE", "access_key=***"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCY", "aws_secret_access_key = ***"),
    ("AWS_SECRET_ACCESS_KEY=wJalr", "AWS_SECRET_ACCESS_KEY=***"),
    ("PGPASSWORD=hunter2 psql -h db", "PGPASSWORD=*** psql -h db"),
    ("password: hunter2", "password: ***"),
    ("secret=abc", "secret=***"),
    ("passphrase=correct-horse", "passphrase=***"),
    ("auth=user:pw", "auth=***"),
    ("private_key: '-----BEGIN KEY-----'", "private_key: '***'"),
    ("password_confirmation=x&session_id=abc&jwt=eyJ.x", "password_confirmation=***&session_id=***&jwt=***"),
]

LEFT_ALONE = [
    "Written by the author: Jane",
    "author=Jane authored_by=Bob",
    "the password field is required",
    "passwordless login is enabled",
    "keyboard: us",
    "max_tokens=512",
    "token_count: 3",
    "tokenizer=bert",
    "secretary: Ann",
    "bypass=1 compass: north",
    "session_timeout=30",
    "if password == expected:",
    "KeyError: 'password'",
    "Enter password: ",
    "password=",
    '{"password": null, "token": ""}',
    "password=None",
    "Bearer tokens are described in RFC 6750",
    "postgres://app@db/x",
    "https://host:8080/path?page=2",
    "https://example.com/users/a@b.com",
    "https://mastodon.social/@alice",
    "ssh://git@github.com/org/repo.git",
    "mailto:bob@example.com",
    "a=1 b=2 key=user:42",
    "12:30:45 worker-1: job 42 done",
]


@pytest.mark.parametrize(("text", "shown"), MASKED)
def test_masks(text: str, shown: str) -> None:
    assert mask_text(text) == shown
    assert mask_text(shown) == shown  # masking twice changes nothing


@pytest.mark.parametrize("text", LEFT_ALONE)
def test_leaves_alone(text: str) -> None:
    assert mask_text(text) == text


@pytest.mark.parametrize(("value", "shown"), [
    ({"password": "x", "user": "u"}, {"password": MASK, "user": "u"}),
    ({"db_password": "x", "PGPASSWORD": "y", "api-key": "z"}, {"db_password": MASK, "PGPASSWORD": MASK, "api-key": MASK}),
    ({"Authorization": "Bearer x", "auth": {"user": "u"}}, {"Authorization": MASK, "auth": MASK}),
    ({"aws_secret_access_key": "k", "access_key": "a", "client_secret": "c"},
     {"aws_secret_access_key": MASK, "access_key": MASK, "client_secret": MASK}),
    ({"author": "Jane", "authored_by": "Bob", "keyboard": "us", "passwordless": True},
     {"author": "Jane", "authored_by": "Bob", "keyboard": "us", "passwordless": True}),
    ({"max_tokens": 512, "token_count": 3, "secretary": "Ann", "session_timeout": 30},
     {"max_tokens": 512, "token_count": 3, "secretary": "Ann", "session_timeout": 30}),
    ({"password": None, "token": ""}, {"password": None, "token": ""}),
    ({"password_confirmation": "x", "new_password": "y", "api_key_2": "z", "session_id": "s"},
     {"password_confirmation": MASK, "new_password": MASK, "api_key_2": MASK, "session_id": MASK}),
    ([{"dsn": "postgres://u:p/w@h/d"}], [{"dsn": "postgres://u:***@h/d"}]),
])
def test_redact_masks_values_of_secret_keys_only(value: Any, shown: Any) -> None:
    assert redact(value) == shown


# Hostile shapes: each made the old patterns backtrack over the rest of the text at every
# position. 10 MB each; linear work takes well under a second, the old quadratic one years.
HOSTILE = ["x", "a:", "://", "=", "a@", "a://b:", "password=", "token: ", "'password': '", "a:b@",
           "https://u:", "Bearer ", "\\\"", "Authorization: Basic "]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("unit", HOSTILE)
def test_linear_on_hostile_text(unit: str) -> None:
    text = unit * (10_000_000 // len(unit))
    shown = mask_text(text)
    assert len(shown) <= len(text) + len(MASK)


@pytest.mark.timeout(20)
def test_linear_on_a_hostile_structure() -> None:
    value = {"k" * 60_000: "a:" * 500_000, "list": ["://" * 100_000] * 20, "password": "x" * 1_000_000}
    shown = redact(value)
    assert shown["password"] == MASK and shown["list"][0] == "://" * 100_000


@pytest.mark.parametrize("cut", range(85, 125, 3))
def test_a_secret_cut_by_the_clip_is_still_masked(cut: int) -> None:
    text = "x" * 80 + " postgres://app:hunter2-hunter2@db/x password=hunter2-hunter2 " + "y" * 10_000
    shown = shown_text(text, cut)
    assert "hunter" not in shown and shown.endswith(f"… [{len(text) - cut:,} more characters]")
    assert shown.startswith("x" * 80)
