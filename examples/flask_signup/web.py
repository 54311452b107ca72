"""Flask: sign a user up and queue their welcome email inside the request's transaction.

From the ``examples/`` directory (``pip install 'conveyor[postgres,examples]'``)::

    export DATABASE_URL=postgresql://localhost/signup
    flask --app flask_signup.web run                  # finds create_app()
    conveyor --app flask_signup.jobs:app worker       # a worker, in another terminal

    curl -X POST localhost:5000/signup -H 'content-type: application/json' -d '{"email": "ada@example.com"}'
"""

from __future__ import annotations

import secrets
from typing import Any

import psycopg
from flask import Flask, abort, jsonify, request
from psycopg_pool import ConnectionPool

from . import jobs

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email         text   NOT NULL UNIQUE,
    referral_code text   NOT NULL UNIQUE,
    credits       int    NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS outbox (
    idempotency_key text PRIMARY KEY,
    recipient       text NOT NULL,
    subject         text NOT NULL,
    sent_at         timestamptz NOT NULL DEFAULT now()
);
"""


def create_app(database_url: str | None = None) -> Flask:
    web = Flask(__name__)
    pool = ConnectionPool(database_url or jobs.DATABASE_URL, min_size=1, max_size=10, open=True)
    with pool.connection() as conn:
        conn.execute(SCHEMA)
    # Open Conveyor's store (creating its tables) at start rather than in the first request.
    _ = jobs.app.backend
    web.extensions["pool"] = pool

    @web.post("/signup")
    def signup() -> tuple[Any, int]:
        data = request.get_json(silent=True) or {}
        email = data.get("email")
        if not isinstance(email, str) or "@" not in email:
            abort(400, "give an email address")
        # pool.connection() commits when the block ends normally and rolls back when an
        # exception (abort() included) leaves it: one transaction per request.
        with pool.connection() as conn:
            try:
                row = conn.execute(
                    "INSERT INTO users (email, referral_code) VALUES (%s, %s) RETURNING id",
                    (email, secrets.token_hex(4)),
                ).fetchone()
            except psycopg.errors.UniqueViolation:
                abort(409, "that email is already signed up")
            assert row is not None
            user_id: int = row[0]

            # Written in this transaction: the email goes out only if the sign-up commits.
            job = jobs.send_welcome_email.enqueue(user_id, connection=conn)

            code = data.get("referral_code")
            if code is not None:
                credited = conn.execute(
                    "UPDATE users SET credits = credits + 10 WHERE referral_code = %s AND id <> %s",
                    (code, user_id),
                ).rowcount
                if credited == 0:
                    # Rolls back the new user and the welcome email job with it.
                    abort(400, f"unknown referral code {code!r}")
            referral_code = conn.execute("SELECT referral_code FROM users WHERE id = %s", (user_id,)).fetchone()
        assert referral_code is not None
        return jsonify(user_id=user_id, referral_code=referral_code[0], welcome_job_id=job.id), 201

    @web.get("/users/<int:user_id>")
    def user(user_id: int) -> Any:
        with pool.connection() as conn:
            row = conn.execute("SELECT email, credits FROM users WHERE id = %s", (user_id,)).fetchone()
        if row is None:
            abort(404)
        return jsonify(user_id=user_id, email=row[0], credits=row[1])

    return web
