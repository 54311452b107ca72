"""Optional HMAC signing of jobs: a worker runs only jobs an app holding the key enqueued.

Whoever can write to the store can otherwise make any registered task run with any
arguments. With ``Conveyor(signing_key=...)`` every enqueue (and every cron tick) stores an
HMAC-SHA256 of the job's task, queue and arguments in ``meta["sig"]``, and the worker checks
it before the task is looked up, its arguments bound or its code called: a job with a
missing, altered or foreign signature goes to the dead-letter queue as ``bad_signature``.

The MAC covers a canonical JSON form of the arguments (sorted keys, compact), so it does not
depend on how a store keeps JSON text. Rotation: sign with the new key and list the old one
in ``verify_keys`` until the jobs it signed are gone. Arguments are JSON only, and JSON
decoding builds nothing but dicts, lists and scalars, so reading the stored arguments before
checking them runs no code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ConfigurationError

META_KEY = "sig"
_DOMAIN = b"conveyor-job-v1\n"


def _key_bytes(key: str | bytes) -> bytes:
    raw = key.encode("utf-8") if isinstance(key, str) else key
    if not isinstance(raw, bytes) or len(raw) < 16:
        raise ConfigurationError(
            "a signing key must be at least 16 bytes (use secrets.token_hex(32))")
    return raw


def key_id(key: bytes) -> str:
    """A short public name for a key, so a worker knows which of its keys to check with."""
    return hashlib.sha256(b"conveyor-kid\n" + key).hexdigest()[:12]


def _message(task: str, queue: str, args: Mapping[str, Any]) -> bytes:
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                           allow_nan=False)
    return _DOMAIN + task.encode() + b"\n" + queue.encode() + b"\n" + canonical.encode()


class Signer:
    """Signs with one key; verifies with it and any older keys still accepted."""

    def __init__(self, key: str | bytes, verify_keys: Iterable[str | bytes] = ()) -> None:
        self._key = _key_bytes(key)
        self._kid = key_id(self._key)
        self._keys = {key_id(k): k for k in (_key_bytes(v) for v in verify_keys)}
        self._keys[self._kid] = self._key

    def sign(self, task: str, queue: str, args: Mapping[str, Any]) -> dict[str, str]:
        mac = hmac.new(self._key, _message(task, queue, args), hashlib.sha256).hexdigest()
        return {"kid": self._kid, "mac": mac}

    def problem(self, task: str, queue: str, args: object, meta: Mapping[str, Any]) -> str | None:
        """None if the job's signature is valid, else why not (for the dead-letter record)."""
        sig = meta.get(META_KEY)
        if not (isinstance(sig, dict) and isinstance(sig.get("mac"), str)
                and isinstance(sig.get("kid"), str)):
            return "the job carries no signature, and this worker runs only signed jobs"
        key = self._keys.get(sig["kid"])
        if key is None:
            return f"the job is signed with key {sig['kid']!r}, which this worker does not accept"
        if not isinstance(args, dict):
            return "the job's arguments are not an object"
        try:
            expected = hmac.new(key, _message(task, queue, args), hashlib.sha256).hexdigest()
        except (TypeError, ValueError):
            return "the job's arguments cannot be put in canonical form"
        if not hmac.compare_digest(expected, sig["mac"]):
            return ("the signature does not match the job's task, queue and arguments "
                    "(altered or forged)")
        return None
