"""Payloads: strict JSON encoding, the size limit, and binding calls to signatures and back."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import ArgumentsError, InvalidName, PayloadError, PayloadTooLarge
from conveyor.payload import (
    MAX_DEPTH,
    bind_arguments,
    check_queue_name,
    check_task_name,
    decode,
    encode,
    plain_parameters,
    rebuild_call,
)

# -- encode / decode -------------------------------------------------------------------------------

json_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(json_text, children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_encode_decode_round_trip(value: Any) -> None:
    text = encode(value)
    assert decode(text) == value
    assert decode(text.encode("utf-8")) == value
    assert json.loads(text) == value


def test_encode_is_compact_and_keeps_unicode() -> None:
    assert encode({"a": [1, 2], "b": "é✓"}) == '{"a":[1,2],"b":"é✓"}'
    assert decode(None) is None


def test_tuples_encode_as_lists() -> None:
    assert decode(encode({"t": (1, (2, 3))})) == {"t": [1, [2, 3]]}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (object(), "object"),
        ({1, 2}, "set"),
        (b"x", "bytes"),
        (float("nan"), "nan"),
        (float("-inf"), "inf"),
        ({1: "a"}, "key"),
        ("a\x00", "NUL"),
        ({"k\x00": 1}, "NUL"),
        ("\udcff", "surrogate"),
    ],
    ids=["object", "set", "bytes", "nan", "-inf", "int-key", "nul", "nul-key", "surrogate"],
)
def test_encode_refuses_what_json_cannot_hold_and_says_why(value: Any, fragment: str) -> None:
    with pytest.raises(PayloadError) as info:
        encode({"outer": [value]}, what="args of t")
    message = str(info.value)
    assert "args of t" in message
    assert "outer" in message  # the path to the bad value
    assert fragment.lower() in message.lower()


def test_an_int_too_long_to_print_is_refused_naming_the_argument() -> None:
    # Python refuses to print ints over 4300 digits; the error must still say where the value is.
    with pytest.raises(PayloadError) as info:
        encode({"outer": [10**5000]}, what="args of t")
    assert "args of t" in str(info.value)
    assert "outer" in str(info.value)


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_an_argument_may_nest_max_depth_levels_and_no_more() -> None:
    assert MAX_DEPTH == 64
    assert decode(encode({"x": _deep(MAX_DEPTH)})) == {"x": _deep(MAX_DEPTH)}
    with pytest.raises(PayloadError) as info:
        encode({"x": _deep(MAX_DEPTH + 1)})
    assert "64" in str(info.value)


def test_self_referencing_values_are_refused() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(PayloadError):
        encode(loop)


def test_size_limit_is_inclusive_and_in_utf8_bytes() -> None:
    text = encode({"s": "é" * 10})  # 8 bytes of structure + 20 bytes of text
    size = len(text.encode("utf-8"))
    assert size == 28
    assert encode({"s": "é" * 10}, limit=size) == text
    with pytest.raises(PayloadTooLarge) as info:
        encode({"s": "é" * 10}, limit=size - 1)
    assert "28 bytes" in str(info.value) and "27" in str(info.value)
    assert isinstance(info.value, PayloadError)


# -- names --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "a", "high.priority:eu-west_1", "Q" * 128,
                                  "emails{acme}", "{", "}{"])
def test_valid_queue_names(name: str) -> None:
    assert check_queue_name(name) == name


@pytest.mark.parametrize("name", ["", " ", "a b", "a/b", "ü", "q" * 129, None, 3, "x\n"])
def test_invalid_queue_names(name: Any) -> None:
    with pytest.raises(InvalidName) as info:
        check_queue_name(name)
    assert repr(name) in str(info.value)


def test_task_names_allow_qualified_local_names() -> None:
    assert check_task_name("tests.mod.test_x.<locals>.task") == "tests.mod.test_x.<locals>.task"
    for bad in ("", "a b", "t" * 256, "a;b"):
        with pytest.raises(InvalidName):
            check_task_name(bad)


# -- bind_arguments / rebuild_call ---------------------------------------------------------------------


def through_json(stored: dict[str, Any]) -> dict[str, Any]:
    result = decode(encode(stored))
    assert isinstance(result, dict)
    return result


def round_trip(fn: Any, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], Any]:
    """Bind, store as JSON, rebuild, call; returns (stored, result)."""
    stored = through_json(bind_arguments(fn, args, kwargs))
    a, kw = rebuild_call(fn, stored)
    return stored, fn(*a, **kw)


def plain(a, b=2, c=3):  # type: ignore[no-untyped-def]
    return [a, b, c]


def varargs(a, *rest, **extra):  # type: ignore[no-untyped-def]
    return [a, list(rest), extra]


def posonly(a, b=2, /, c=3):  # type: ignore[no-untyped-def]
    return [a, b, c]


def kwonly(a, *, k, m=5):  # type: ignore[no-untyped-def]
    return [a, k, m]


def everything(p1, p2=20, /, pk=30, *rest, ko, ko2=50, **extra):  # type: ignore[no-untyped-def]
    return [p1, p2, pk, list(rest), ko, ko2, extra]


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "stored"),
    [
        (plain, (1,), {}, {"a": 1}),
        (plain, (1, 5), {}, {"a": 1, "b": 5}),
        (plain, (1,), {"c": 9}, {"a": 1, "c": 9}),
        (plain, (), {"a": 1, "c": 9}, {"a": 1, "c": 9}),
        (varargs, (1, 2, 3), {"x": 4}, {"a": 1, "rest": [2, 3], "extra": {"x": 4}}),
        (varargs, (1,), {}, {"a": 1}),
        (
            varargs,
            (1,),
            {"a_": 1, "rest": "kw named like *rest"},
            {"a": 1, "extra": {"a_": 1, "rest": "kw named like *rest"}},
        ),
        (posonly, (1,), {}, {"a": 1}),
        (posonly, (1,), {"c": 7}, {"a": 1, "c": 7}),
        (posonly, (1, 2, 3), {}, {"a": 1, "b": 2, "c": 3}),
        (kwonly, (1,), {"k": 2}, {"a": 1, "k": 2}),
        (kwonly, (), {"a": 1, "k": 2, "m": 3}, {"a": 1, "k": 2, "m": 3}),
        (everything, (1,), {"ko": 4}, {"p1": 1, "ko": 4}),
        (
            everything,
            (1, 2, 3, 4, 5),
            {"ko": 6, "z": 7},
            {"p1": 1, "p2": 2, "pk": 3, "rest": [4, 5], "ko": 6, "extra": {"z": 7}},
        ),
        (everything, (1,), {"pk": 3, "ko": 4}, {"p1": 1, "pk": 3, "ko": 4}),
        # A positional-only name may also arrive in **extra: both must survive.
        (
            everything,
            (1,),
            {"p1": "in extra", "ko": 4},
            {"p1": 1, "ko": 4, "extra": {"p1": "in extra"}},
        ),
    ],
)
def test_bind_then_rebuild_calls_the_function_the_same_way(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stored: dict[str, Any]
) -> None:
    got_stored, result = round_trip(fn, *args, **kwargs)
    assert got_stored == stored
    assert result == fn(*args, **kwargs)


@settings(max_examples=300, deadline=None)
@given(
    positional=st.lists(json_values, min_size=1, max_size=6),
    ko=json_values,
    ko2=st.none() | st.just(("given",)),
    pk_by_keyword=st.booleans(),
    extra=st.dictionaries(
        st.sampled_from(["p1", "p2", "x", "y", "rest_", "é"]), json_values, max_size=4
    ),
)
def test_round_trip_property(
    positional: list[Any], ko: Any, ko2: Any, pk_by_keyword: bool, extra: dict[str, Any]
) -> None:
    if len(positional) < 2:
        # p2 unfilled yet named in **extra: Python accepts the call, but inspect.Signature.bind
        # on CPython 3.11 refuses it (CPython gh-87106, fixed in 3.12), so enqueue does too.
        extra.pop("p2", None)
    args = list(positional)
    kwargs: dict[str, Any] = {"ko": ko, **extra}
    if ko2 is not None:
        kwargs["ko2"] = ko2
    if pk_by_keyword and len(args) == 3:
        kwargs["pk"] = args.pop()
    _stored, result = round_trip(everything, *args, **kwargs)
    expected = everything(*args, **kwargs)
    assert result == json.loads(json.dumps(expected))


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"),
    [
        (plain, (), {}),
        (plain, (1, 2, 3, 4), {}),
        (plain, (1,), {"nope": 1}),
        (plain, (1,), {"a": 2}),
        (posonly, (), {"a": 1}),
        (kwonly, (1, 2), {}),
    ],
)
def test_bind_arguments_refuses_calls_that_do_not_fit(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(ArgumentsError) as info:
        bind_arguments(fn, args, kwargs, task_name="my.task")
    assert "my.task" in str(info.value)
    assert isinstance(info.value, TypeError) and isinstance(info.value, PayloadError)


@pytest.mark.parametrize(
    ("fn", "stored"),
    [
        (plain, {}),  # a required argument is missing
        (plain, {"a": 1, "gone": 2}),  # a parameter that no longer exists
        (varargs, {"a": 1, "rest": "not a list"}),
        (varargs, {"a": 1, "extra": [1, 2]}),
        (kwonly, {"a": 1}),
    ],
)
def test_rebuild_call_refuses_stored_arguments_that_no_longer_fit(
    fn: Any, stored: dict[str, Any]
) -> None:
    with pytest.raises(ArgumentsError):
        rebuild_call(fn, stored)


def test_rebuild_after_a_new_optional_parameter_is_added() -> None:
    stored = through_json(bind_arguments(plain, (1,), {}))

    def plain_v2(a, b=2, c=3, d="new"):  # type: ignore[no-untyped-def]
        return [a, b, c, d]

    a, kw = rebuild_call(plain_v2, stored)
    assert plain_v2(*a, **kw) == [1, 2, 3, "new"]


@pytest.mark.parametrize("fn", [plain, varargs, posonly, kwonly, everything, lambda: None, lambda x, y: None])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
def test_the_plain_parameters_shortcut_binds_as_the_signature_does(fn: Any, n: int) -> None:
    """Given ``names`` (only for a signature of ordinary parameters), a call of positional
    arguments binds to exactly what ``Signature.bind`` gives, and a call that does not fit still
    raises ArgumentsError."""
    sig = inspect.signature(fn)
    names = plain_parameters(sig)
    assert (names is not None) == all(p.kind is p.POSITIONAL_OR_KEYWORD for p in sig.parameters.values())
    args = tuple(range(10, 10 + n))
    try:
        expected: Any = dict(sig.bind(*args).arguments)
    except TypeError:
        expected = ArgumentsError
    if expected is ArgumentsError:
        with pytest.raises(ArgumentsError):
            bind_arguments(fn, args, {}, sig=sig, names=names)
    else:
        got = bind_arguments(fn, args, {}, sig=sig, names=names)
        assert got == expected and list(got) == list(expected)
