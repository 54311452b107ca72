"""JSON payloads: strict encoding, size limit, and binding to a task's signature. No pickle.

Arguments are stored as the dict of bound parameters (``{"user_id": 42}``), so the store and
the dashboard show names, and a worker rebuilds the call from the signature it has now.
"""

from __future__ import annotations

import inspect
import json
import json.encoder
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import (
    ArgumentsError,
    ConfigurationError,
    InvalidName,
    PayloadError,
    PayloadTooLarge,
    ResultTooLarge,
)

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
# A result is written with its job and read back by every list of jobs: big enough for any
# summary or id list, small enough that one cannot bloat a Redis or a page of `jobs list`.
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024
MAX_DEPTH = 64
MAX_INT_BITS = 4096

# json.dumps with these options builds a new encoder per call; one, kept, encodes the same.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _not_json(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# JSONEncoder.encode still builds its C encoder anew on every call (a large share of encoding a
# small payload: docs/benchmarks.md, "Design measurements"); this is that same C encoder with
# _ENCODER's options, built once. Without the circular-reference check: _check_value's depth
# limit has refused a cycle before it runs.
_c_json: Any = json.encoder  # its C helpers are private (and absent without the C module)
_C_ENCODE = (
    _c_json.c_make_encoder(None, _not_json, _c_json.c_encode_basestring, None, ":", ",",
                           False, False, False)
    if getattr(_c_json, "c_make_encoder", None) and getattr(_c_json, "c_encode_basestring", None)
    else None
)


def _dumps(value: object) -> str:
    if _C_ENCODE is None:
        return _ENCODER.encode(value)
    return "".join(_C_ENCODE(value, 0))

NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")  # step names
# Queue names may also hold braces: on Redis, ``emails{acme}`` and ``reports{acme}`` share a
# hash tag, so the partition of an app spread over shards (backends/redis/partitions.py).
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_.:{}-]{1,128}$")
TASK_NAME_RE = re.compile(r"^[A-Za-z0-9_.:<>-]{1,255}$")


def check_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue name (1-128 of ``A-Z a-z 0-9 _ . : - { }``);
    else raise InvalidName."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
        raise InvalidName(
            f"invalid queue name {name!r}: use 1-128 characters from A-Z a-z 0-9 _ . : - {{ }}"
        )
    return name


def check_task_name(name: object) -> str:
    """Return ``name`` if it is a valid task name (1-255 of ``A-Z a-z 0-9 _ . : < > -``); else
    raise InvalidName."""
    if not isinstance(name, str) or not TASK_NAME_RE.fullmatch(name):
        raise InvalidName(
            f"invalid task name {name!r}: use 1-255 characters from A-Z a-z 0-9 _ . : < > -"
        )
    return name


def _check_value(value: object, path: str, depth: int) -> None:
    """Refuse anything that would not come back equal from JSON, on every backend."""
    if depth > MAX_DEPTH:
        raise PayloadError(f"{path} is nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise PayloadError(f"{path} is an integer of {value.bit_length()} bits, too large to "
                               "store as JSON")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{path} is {value!r}, which JSON cannot represent")
        return
    if isinstance(value, str):
        _check_str(value, path)
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_value(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(
                    f"{path} has a key {key!r} of type {type(key).__name__}; "
                    "JSON object keys must be str"
                )
            _check_str(key, f"{path} key")
            _check_value(item, f"{path}[{key!r}]", depth + 1)
        return
    raise PayloadError(
        f"{path} is a {type(value).__name__}, which is not JSON: pass ids and plain values "
        "(str, int, float, bool, None, list, dict)"
    )


def _check_str(value: str, path: str) -> None:
    if "\x00" in value:
        # PostgreSQL jsonb cannot hold NUL; refuse it everywhere so backends agree.
        raise PayloadError(f"{path} contains a NUL character (\\x00), which cannot be stored")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(
            f"{path} is not valid Unicode text (lone surrogate?): {exc.reason}") from None


def encode(value: object, *, what: str = "args", limit: int | None = None) -> str:
    """Encode a JSON value strictly; raise PayloadError naming what is wrong."""
    _check_value(value, what, 0)
    try:
        text = _dumps(value)
    except (ValueError, TypeError) as exc:  # e.g. an int too long to print
        raise PayloadError(f"{what} cannot be encoded as JSON: {exc}") from None
    if limit is not None and (size := _size_over(text, limit)):
        raise PayloadTooLarge(
            f"{what} is {size} bytes as JSON, over the limit of {limit} bytes; "
            "store the data elsewhere and pass its id"
        )
    return text


def encode_result(value: object, *, what: str, limit: int | None) -> str:
    """Encode a task's (or a step's) result; raise ResultTooLarge over ``limit`` bytes."""
    text = encode(value, what=what)
    if limit is not None and (size := _size_over(text, limit)):
        raise ResultTooLarge(
            f"{what} is {size} bytes as JSON, over the limit of {limit} bytes "
            "(Conveyor(max_result_bytes=...)); store the data elsewhere and return its id"
        )
    return text


def _size_over(text: str, limit: int) -> int:
    """The UTF-8 size of ``text`` if it is over ``limit`` bytes, else 0."""
    if len(text) * 4 <= limit:  # UTF-8 takes at most 4 bytes a character: no need to count
        return 0
    size = len(text.encode("utf-8"))
    return size if size > limit else 0


def decode(text: str | bytes | None) -> Any:
    """The value of a stored JSON text (None stays None)."""
    if text is None:
        return None
    return json.loads(text)


def plain_parameters(sig: inspect.Signature) -> tuple[str, ...] | None:
    """The parameter names if every parameter is an ordinary one (positional or keyword, no
    ``*args``, ``**kwargs``, keyword-only or positional-only): then a call giving each of them
    positionally binds by zipping, which is what ``Signature.bind`` returns, for much less
    (docs/benchmarks.md, "Design measurements")."""
    params = sig.parameters.values()
    if all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return tuple(p.name for p in params)
    return None


def bind_arguments(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    task_name: str = "",
    sig: inspect.Signature | None = None,
    names: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Bind a call to ``fn``'s signature and return the named arguments to store.
    ``names``: ``plain_parameters(sig)``, if the caller keeps it."""
    if names is not None and not kwargs and len(args) == len(names):
        return dict(zip(names, args, strict=True))
    sig = sig or inspect.signature(fn)
    try:
        bound = sig.bind(*args, **(kwargs or {}))
    except TypeError as exc:
        raise ArgumentsError(f"arguments for task {task_name or fn.__name__}{sig}: {exc}") from None
    return dict(bound.arguments)


def rebuild_call(
    fn: Callable[..., Any], stored: Mapping[str, Any], sig: inspect.Signature | None = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Turn stored named arguments back into (args, kwargs) for ``fn``; raise ArgumentsError if
    they no longer fit."""
    sig = sig or inspect.signature(fn)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    params = sig.parameters
    unknown = [k for k in stored if k not in params]
    if unknown:
        raise ArgumentsError(f"stored arguments {unknown} are not parameters of {fn.__name__}{sig}")
    for name, param in params.items():
        if name not in stored:
            continue
        value = stored[name]
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            if not isinstance(value, list):
                raise ArgumentsError(f"stored *{name} is not a list")
            args.extend(value)
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            if not isinstance(value, dict):
                raise ArgumentsError(f"stored **{name} is not an object")
            kwargs.update(value)
        elif param.kind is inspect.Parameter.POSITIONAL_ONLY or (
            param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            and not kwargs
            and _all_before_present(params, name, stored)
        ):
            args.append(value)
        else:
            kwargs[name] = value
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise ArgumentsError(f"stored arguments do not fit {fn.__name__}{sig}: {exc}") from None
    return tuple(args), kwargs


def _all_before_present(params: Mapping[str, inspect.Parameter], name: str,
                        stored: Mapping[str, Any]) -> bool:
    # A positional-or-keyword parameter may go positionally only if every one before it did,
    # which is what lets a following *args still receive its values.
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for other, param in params.items():
        if other == name:
            return True
        if param.kind in positional and other not in stored:
            return False
    return True


# meta key of a job whose first parameter is filled with its parent's result when it runs
# (a chain with pass_result=True; executor.Execution fills it).
PASS_RESULT_KEY = "pass_result"


def first_parameter(sig: inspect.Signature, task_name: str) -> str:
    """The parameter a chain with ``pass_result`` fills with the previous step's result."""
    params = list(sig.parameters.values())
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise ConfigurationError(
            f"task {task_name} cannot take the previous step's result (pass_result=True): "
            "its first parameter must be an ordinary positional one")
    return params[0].name
