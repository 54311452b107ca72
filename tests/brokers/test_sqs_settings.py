"""sqs:// URLs and lane names (no server needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.backends.broker.sqs import _chunks
from conveyor.backends.broker.sqs_settings import (
    NAME_MAX,
    escape,
    lane_name,
    parse_lane_name,
    parse_sqs_url,
    unescape,
)
from conveyor.backends.broker.transport import Lane, Outgoing
from conveyor.errors import ConfigurationError, InvalidName

SQS_NAME = r"[A-Za-z0-9_-]{1,80}"


def test_local_endpoint_url() -> None:
    s = parse_sqs_url("sqs://localhost:4566/?region=eu-west-1&prefix=app&levels=-1,0,1"
                      "&max_receives=5&timeout=3")
    assert s.endpoint == "http://localhost:4566"
    assert (s.region, s.prefix, s.levels, s.max_receives, s.timeout) == (
        "eu-west-1", "app", (-1, 0, 1), 5, 3.0)
    assert s.access_key is None and s.secret_key is None


def test_aws_defaults() -> None:
    s = parse_sqs_url("sqs://")
    assert s.endpoint is None and s.region is None  # boto3's chain decides
    assert (s.prefix, s.levels, s.max_receives) == ("conveyor", (0,), 20)


def test_secure_endpoint_and_credentials_in_the_url() -> None:
    s = parse_sqs_url("sqs://AKID:se%2Fcret@sqs.example.com/?secure=true")
    assert s.endpoint == "https://sqs.example.com"
    assert s.region == "us-east-1"  # an endpoint without a region still signs
    assert (s.access_key, s.secret_key) == ("AKID", "se/cret")


@pytest.mark.parametrize("url", [
    "sqs://h/?prefix=my-app",  # "-" separates prefix and queue
    "sqs://h/?prefix=",
    "sqs://h/?levels=a,b",
    "sqs://h/?max_receives=0",
    "sqs://h/?timeout=-1",
    "sqs://h/?secure=maybe",
    "sqs://h/?regoin=us-east-1",  # a typo is refused, not ignored
    "sqs://h/some/path",
])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_sqs_url(url)


def test_lane_names() -> None:
    assert lane_name("app", "default", 0) == "app-default-p0"
    assert lane_name("app", "default", 2) == "app-default-p2"
    assert lane_name("app", "default", -1) == "app-default-pm1"
    assert lane_name("app", "default", None) == "app-default-dead"
    assert lane_name("app", "a.b:c_d-e", 0) == "app-a_db_cc__d-e-p0"


def test_names_read_back() -> None:
    assert parse_lane_name("app", "app-a_db_cc__d-e-p0") == ("a.b:c_d-e", 0)
    assert parse_lane_name("app", "app-x-pm3") == ("x", -3)
    assert parse_lane_name("app", "app-x-p-1-dead") == ("x-p-1", None)
    # not this prefix's, or not a lane
    assert parse_lane_name("app", "app2-x-p0") is None
    assert parse_lane_name("app", "app_x-y-p0") is None
    assert parse_lane_name("app", "app-x") is None
    assert parse_lane_name("app", "app-x_q-p0") is None  # "_q" is no escape this makes
    assert parse_lane_name("app", "app--p0") is None


def test_fifo_lane_names() -> None:
    assert parse_sqs_url("sqs://h/?fifo=true").fifo is True
    assert parse_sqs_url("sqs://h/").fifo is False
    assert lane_name("app", "default", 0, fifo=True) == "app-default-p0.fifo"
    assert lane_name("app", "default", None, fifo=True) == "app-default-dead.fifo"
    assert lane_name("app", "default", -1, fifo=True, delay=True) == "app-default-pm1-delay"
    assert parse_lane_name("app", "app-default-p0.fifo", fifo=True) == ("default", 0)
    assert parse_lane_name("app", "app-default-dead.fifo", fifo=True) == ("default", None)
    # Each kind reads only its own lanes; a delay queue is no lane.
    assert parse_lane_name("app", "app-default-p0.fifo") is None
    assert parse_lane_name("app", "app-default-p0", fifo=True) is None
    assert parse_lane_name("app", "app-default-p0-delay", fifo=True) is None
    assert parse_lane_name("app", "app-default-p0-delay") is None
    # Room is kept for the longer ending ("-delay"), for the dead lane too: a queue fits every
    # one of its names or none.
    fits = "q" * (NAME_MAX - len("app--dead-delay"))
    assert len(lane_name("app", fits, None, fifo=True)) == NAME_MAX - 1
    assert len(lane_name("app", "q" * (NAME_MAX - len("app--p0-delay")), 0, fifo=True,
                         delay=True)) == NAME_MAX
    with pytest.raises(InvalidName, match="FIFO endings"):
        lane_name("app", fits + "q", None, fifo=True)


def test_a_queue_too_long_for_sqs_is_refused_clearly() -> None:
    fits = "q" * (NAME_MAX - len("app--dead"))
    assert len(lane_name("app", fits, None)) == NAME_MAX
    with pytest.raises(InvalidName, match="too long for SQS"):
        lane_name("app", fits + "q", None)
    with pytest.raises(InvalidName):
        lane_name("app", "bad name", 0)  # Conveyor's own pattern first


@given(st.from_regex(r"[A-Za-z0-9_.:{}-]{1,128}", fullmatch=True),
       st.one_of(st.none(), st.integers(-50, 50)))
def test_every_queue_name_round_trips(queue: str, level: int | None) -> None:
    assert unescape(escape(queue)) == queue
    try:
        name = lane_name("pfx", queue, level)
    except InvalidName:
        assert len(escape(queue)) > NAME_MAX - 10
        return
    import re

    assert re.fullmatch(SQS_NAME, name)
    assert parse_lane_name("pfx", name) == (queue, level)
    try:
        fifo = lane_name("pfx", queue, level, fifo=True)
    except InvalidName:
        assert len(escape(queue)) > NAME_MAX - 16
        return
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,75}\.fifo", fifo)
    assert parse_lane_name("pfx", fifo, fifo=True) == (queue, level)


def test_batches_keep_to_sqs_limits() -> None:
    lane = Lane("q", 0)
    small = [Outgoing(lane, b"x" * 10) for _ in range(25)]
    assert [len(c) for c in _chunks(small)] == [10, 10, 5]
    big = [Outgoing(lane, b"x" * 100_000) for _ in range(5)]  # 256 KiB per batch at most
    assert [len(c) for c in _chunks(big)] == [2, 2, 1]
