"""Jobs as the scripts store and return them: a job's hash read into a Job, the error text a
script writes, lease tokens, and the name, value replies of the readers."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ...job import Job, JobState, make_job
from ..base import ErrorInfo, new_claim_id
from .scripts import OOM_SLACK

STEP_PREFIX = "step:"  # a step record is the field step:<name> of the job's hash
# The fields whose values a claim returns in this order for a job that has no others (BASE in
# claim.lua); a job with others comes back as its hash's field, value pairs instead.
CLAIM_BASE = ("task", "args", "priority", "run_at", "attempt", "max_attempts", "timeout_s",
              "meta", "created_at", "uid")
# The heads of a claim's answers that hold no jobs (claim.lua): limits hold every waiting job
# back ('hold'), or none waits ('empty').
NO_JOBS = ("hold", "empty")
# The last_outcome a settle of each kind leaves on the job (with its token as last_token).
SETTLED_AS = {"ack": ("succeeded",), "kill": ("dead",),
              "retry": ("scheduled", "available", "dead")}


_raw_decode = json.JSONDecoder().raw_decode


def loads(text: str) -> Any:
    """``json.loads(text)`` for a value the scripts stored as written (no whitespace around
    it): raw_decode skips the whitespace checks that are a good part of decoding small args;
    anything else (whitespace, trailing text, an error) goes to json.loads, which decides."""
    try:
        value, end = _raw_decode(text)
    except ValueError:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def named(flat: Sequence[Any]) -> dict[str, Any]:
    """A script's flat name, value list as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _error_members(error: ErrorInfo) -> str:
    """The error's own members as JSON text without braces; the script adds attempt, at and
    worker."""
    return json.dumps(
        {"kind": error.kind, "type": error.type, "message": error.message,
         "traceback": error.traceback},
        ensure_ascii=False,
    )[1:-1]


def _cut(error: ErrorInfo) -> ErrorInfo:
    """``error`` made to fit OOM_SLACK: the traceback keeps its end (where the exception was
    raised), the message and type their start."""
    note = "[cut: Redis was at maxmemory]\n...\n"
    room = OOM_SLACK // 2
    tb = error.traceback
    if len(tb) > room:
        tb = note + tb[len(tb) - (room - len(note)):]
    quarter = OOM_SLACK // 4
    message = error.message
    if len(message) > quarter:
        message = message[:quarter - 3] + "..."
    return dataclasses.replace(error, message=message, type=error.type[:128], traceback=tb)


def _tokens(n: int, claim_id: str | None = None) -> list[str]:
    """``n`` lease tokens for one claim: its claim id (24 hex digits, 96 random bits; a new one
    if None) and the token's place in the claim (8 hex digits). A claimer whose reply was lost
    finds the claim's leases by the id (release_claim)."""
    head = new_claim_id() if claim_id is None else claim_id
    return [f"{head}{i:08x}" for i in range(n)]


def _start_arg(start: int | None, limit: int) -> int:
    """The claim script's ``start``: how many of the jobs start at once (all, if None)."""
    return limit if start is None else max(start, 0)


def _opt_float(value: str | None) -> float | None:
    return None if value is None else float(value)


_NO_LIMITS: Mapping[str, Any] = MappingProxyType({})


def _limits(h: dict[str, str]) -> Mapping[str, Any]:
    """The job's concurrency and rate limit fields, stored only when set (most jobs have
    none)."""
    if "concurrency_key" not in h and "rate_key" not in h:
        return _NO_LIMITS
    limits: dict[str, Any] = {}
    if "concurrency_key" in h:
        limits.update(concurrency_key=h["concurrency_key"],
                      concurrency_limit=int(h["concurrency_limit"]))
    if "rate_key" in h:
        limits.update(rate_key=h["rate_key"], rate_limit=int(h["rate_limit"]),
                      rate_period=float(h["rate_period"]))
    return limits


def _links(h: dict[str, str]) -> Mapping[str, Any]:
    """The job's workflow fields, stored only when set: its parents (the field 'parents', ids
    joined by ','), on_parent_failure (with them), batch_id and callback_of."""
    if "parents" not in h and "batch_id" not in h and "callback_of" not in h:
        return _NO_LIMITS
    links: dict[str, Any] = {"batch_id": h.get("batch_id"), "callback_of": h.get("callback_of")}
    if h.get("parents"):
        links["parents"] = tuple(sorted(int(i) for i in h["parents"].split(",")))
        links["on_parent_failure"] = h.get("on_parent_failure", "cancel")
    return links


def _to_job(job_id: int, h: dict[str, str], errors: Sequence[str]) -> Job:
    raw_meta = h.get("meta", "{}")
    meta = {} if raw_meta == "{}" else json.loads(raw_meta)
    redriven = h.get("redriven")
    if redriven is not None and isinstance(meta, dict):
        # Kept apart from meta so the script never re-encodes the caller's JSON (cjson would
        # round floats to 14 digits); merged here as the SQL stores do with json_set.
        base = meta.get("redriven")
        before = base if isinstance(base, int) and not isinstance(base, bool) else 0
        meta["redriven"] = before + int(redriven)
    return make_job(
        id=job_id, task=h["task"], queue=h["queue"], args=json.loads(h["args"]),
        state=JobState(h["state"]), attempts=int(h["attempt"]),
        max_attempts=int(h["max_attempts"]), priority=int(h["priority"]),
        run_at=float(h["run_at"]), timeout=float(h["timeout_s"]),
        created_at=float(h["created_at"]), uid=h.get("uid"),
        attempted_at=_opt_float(h.get("attempted_at")),
        finished_at=_opt_float(h.get("finished_at")),
        result=json.loads(h["result"]) if "result" in h else None,
        errors=[json.loads(e) for e in errors], unique_key=h.get("unique_key"),
        worker_id=h.get("worker_id"), lease_token=h.get("lease_token"),
        lease_expires_at=_opt_float(h.get("lease_expires_at")), meta=meta,
        fair_key=h.get("fair_key"), stalls=int(h.get("stalls", 0)), **_limits(h), **_links(h),
        # k[:1] first: most jobs have no step, and a method call per field is the dearer test.
        steps={k[len(STEP_PREFIX):]: json.loads(v) for k, v in h.items()
               if k[:1] == "s" and k.startswith(STEP_PREFIX)},
    )
