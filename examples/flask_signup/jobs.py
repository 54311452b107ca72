"""The Conveyor app of the Flask example, its task, and a stand-in for an email API.

Run a worker from the ``examples/`` directory::

    DATABASE_URL=postgresql://localhost/signup conveyor --app flask_signup.jobs:app worker
"""

from __future__ import annotations

import os

import psycopg

from conveyor import Conveyor, Reject

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://localhost/signup")

app = Conveyor(DATABASE_URL, visibility_timeout=30)


def send_email(to: str, subject: str, *, idempotency_key: str) -> bool:
    """A stand-in for an email provider's API that accepts an idempotency key (most do).

    It "sends" by writing to the ``outbox`` table; a second call with the same key is
    accepted and ignored, which is what the provider would do. Returns True if this call
    sent the email.
    """
    with psycopg.connect(DATABASE_URL) as conn:
        cur = conn.execute(
            "INSERT INTO outbox (idempotency_key, recipient, subject) VALUES (%s, %s, %s)"
            " ON CONFLICT (idempotency_key) DO NOTHING",
            (idempotency_key, to, subject),
        )
        return cur.rowcount == 1


@app.task(queue="emails", max_attempts=8, timeout=30)
def send_welcome_email(user_id: int) -> bool:
    """Email a new user. Safe to run twice: the provider dedupes on the idempotency key.

    The job carries only the user's id; the task reads the current address when it runs,
    so an address changed in the meantime is the one used.
    """
    with psycopg.connect(DATABASE_URL) as conn:
        row = conn.execute("SELECT email FROM users WHERE id = %s", (user_id,)).fetchone()
    if row is None:
        raise Reject(f"user {user_id} does not exist")  # retrying cannot help: dead at once
    # One key per email we mean to send, never per attempt: a re-run after a crash between
    # the provider's answer and the ack sends nothing new.
    return send_email(row[0], "Welcome!", idempotency_key=f"welcome:{user_id}")
