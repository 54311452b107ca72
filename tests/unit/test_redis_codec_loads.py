"""codec.loads: the claim path's JSON decoding agrees with json.loads on every text."""

from __future__ import annotations

import json

import pytest

from conveyor.backends.redis.codec import loads

TEXTS = ['{"i": 1}', "{}", "[1, 2.5, null]", '"s"', " {}", "{} ", "\n[1]\t", '{"a": NaN}']


@pytest.mark.parametrize("text", TEXTS)
def test_loads_gives_what_json_loads_gives(text: str) -> None:
    assert repr(loads(text)) == repr(json.loads(text))


@pytest.mark.parametrize("text", ["{} x", "", "{", "[1]]"])
def test_loads_refuses_what_json_loads_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        loads(text)
    assert str(got.value) == str(expected.value)
