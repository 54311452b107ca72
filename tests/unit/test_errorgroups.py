"""The error-group normaliser: one cause is one group, different causes stay apart."""

from __future__ import annotations

import pytest

from conveyor.errorgroups import Grouper, group_key, normalise

CASES = [
    ("plain text stays", "connection refused", "connection refused"),
    ("digits", "timed out after 30 seconds", "timed out after <n> seconds"),
    ("long numbers", "order 123456789012 not found", "order <n> not found"),
    ("decimals", "took 1.25s", "took <n>s"),
    ("digits inside words", "shard7 is down", "shard<n> is down"),
    ("uuid", "no row 1b4e28ba-2fa1-11d2-883f-0016d3cca427 here", "no row <uuid> here"),
    ("uuid upper case", "id 1B4E28BA-2FA1-11D2-883F-0016D3CCA427", "id <uuid>"),
    ("hex address", "object at 0x7f3a2b1c", "object at <hex>"),
    ("hex id", "commit deadbeef1234 missing", "commit <hex> missing"),
    ("a word of hex letters is a word", "facade", "facade"),
    ("single quotes", "KeyError: 'user_42'", "KeyError: <str>"),
    ("double quotes", 'no such file "/tmp/a b.txt"', "no such file <str>"),
    ("an apostrophe is no quote", "can't reach 'db-3'", "can't reach <str>"),
    ("whitespace runs", "a  \n\t b", "a b"),
    ("empty", "", ""),
]


@pytest.mark.parametrize(("message", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_normalise(message: str, expected: str) -> None:
    assert normalise(message) == expected


SAME_CAUSE = [
    ("KeyError: 'user_1'", "KeyError: 'admin_99'"),
    ("user 12 not found", "user 998877 not found"),
    ("request 1b4e28ba-2fa1-11d2-883f-0016d3cca427 failed",
     "request 6fa459ea-ee8a-3ca4-894e-db77e160355e failed"),
    ("<Conn at 0x7f00aa>: reset", "<Conn at 0x1234>: reset"),
]


@pytest.mark.parametrize(("a", "b"), SAME_CAUSE)
def test_one_cause_one_group(a: str, b: str) -> None:
    assert group_key("t", "E", normalise(a)) == group_key("t", "E", normalise(b))


def test_different_causes_stay_apart() -> None:
    msg = normalise("user 1 not found")
    assert group_key("t", "E", msg) != group_key("t", "F", msg)
    assert group_key("t", "E", msg) != group_key("u", "E", msg)
    assert group_key("t", "E", msg) != group_key("t", "E", normalise("user 1 deleted"))


def test_key_is_stable_and_short() -> None:
    # Links (/errors/<key>) must survive a restart: the key is a hash, not an object id.
    assert group_key("t", "E", "m") == group_key("t", "E", "m")
    assert len(group_key("t", "E", "m")) == 16


def test_long_messages_are_bounded() -> None:
    assert len(normalise("x" * 100_000)) <= 200


def test_grouper_adds_rows_of_one_cause() -> None:
    g = Grouper()
    g.add("t", "KeyError", "'a'", 2, 10.0, 20.0, 5)
    g.add("t", "KeyError", "'b'", 1, 5.0, 30.0, 9)
    g.add("t", "ValueError", "bad", 1, 7.0, 7.0, 3)
    out = g.result(10, complete=True)
    assert out.scanned == 4
    first, second = out.groups
    assert (first.count, first.first_seen, first.last_seen, first.sample_id) == (3, 5.0, 30.0, 9)
    assert first.message == "<str>"
    assert second.error_type == "ValueError"
    assert out.find(first.key) is first
    assert g.result(1, complete=True).groups == [first]
