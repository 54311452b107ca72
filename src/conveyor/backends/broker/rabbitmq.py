"""The RabbitMQ transport (``amqp://`` and ``amqps://`` URLs), on pika's blocking connection.

Lanes are quorum queues (replicated, durable; needs RabbitMQ 3.10 or later for message TTL and
at-least-once dead-lettering): ``<prefix>.<queue>.p<level>`` for jobs, ``<prefix>.<queue>.dead``
for the dead. A job lane dead-letters into its dead lane after ``delivery_limit`` hand-outs
(the broker's ``x-delivery-limit``: a backstop for a message that kills every worker before it
can be counted; the core counts attempts itself and usually gets there first).

* Job lanes are consumed (``basic.consume``, manual acks) with a prefetch of the worker's free
  slots (the first claim's limit, or ``?prefetch=``): a claim takes what the consumers
  delivered, lowest level first, and the rest up to its limit with ``basic.get`` (a consumer
  pushes only some time after it starts, and never past its prefetch); the dead lane, which
  nobody consumes, is read with ``basic.get`` alone. Messages delivered and never claimed
  are published again as fresh copies, so they are not charged a delivery: at close, and
  once nobody claimed or waited for ``UNCLAIMED_S`` (the worker stopped: the consumers are
  cancelled until the next claim), so other apps' workers get them.
* The lease is the connection: a message delivered to a consumer stays this connection's
  until it is acked; if the connection dies (the worker was killed, or froze past two
  heartbeats) RabbitMQ hands it out again with ``x-delivery-count`` one higher. Delivery tags
  belong to a channel: a holder whose channel is gone cannot ack (``settle`` says False), so a
  zombie never finishes a redelivered attempt.
* Publishes wait for publisher confirms, a batch's together (amqp_confirms.py, on a channel
  of their own), ``mandatory``, so a message that reaches no queue is an error, not a silent
  loss.
* Delays without timers in the worker: a ladder of delay queues ``<prefix>.delay.<ms>`` whose
  message TTL is a power of two times 100 ms, each dead-lettering back through the default
  exchange to the lane named by the message's routing key. A message waits in the largest step
  not longer than its delay; the core publishes it again with what is left when it comes back
  early, so a delay takes at most log2(delay / 100 ms) steps.
* pika's blocking connection is not thread-safe: every use holds one lock, and a pump thread
  serves heartbeats between calls, so a worker busy in long tasks keeps its connection (and
  its leases) alive, and a frozen process loses them.
* A forked child connects anew (forking.py): the parent's socket stays the parent's.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

import pika
import pika.exceptions as pex
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from ...errors import ConfigurationError, StoreError, StoreUnavailable
from .. import forking, redact_url
from ..base import Backend
from .amqp_confirms import ConfirmingPublisher, usable
from .companion import CompanionBackend
from .core import BrokerBackend
from .transport import Delivery, Lane, LaneDepth, Outgoing

log = logging.getLogger("conveyor.broker.rabbitmq")
# pika logs every channel it opens at INFO; a worker's log is for jobs. Left alone if the
# application set a level for it.
if logging.getLogger("pika").level == logging.NOTSET:
    logging.getLogger("pika").setLevel(logging.WARNING)
T = TypeVar("T")

STEP_MS = 100  # the shortest delay step
STEPS = 21  # 100 ms .. 100 ms * 2**20 (29 hours)
RETRY_BUDGET = 10.0  # seconds a call keeps trying to reach the broker
WAIT_SLICE = 0.02  # seconds an idle wait serves the connection while holding the lock
COUNT_SETTLE_S = 2.0  # the longest a counted give-back waits for the counts to hold it
# Seconds without a claim or wait after which the consumers' unclaimed messages go back to the
# queue. A worker waits or claims continuously while it has free slots, so only a stopped
# worker (or an app that runs none) goes this long; short, so another worker is not kept
# waiting for them.
UNCLAIMED_S = 2.0
_OURS = {"prefix", "levels", "delivery_limit", "expires", "prefetch"}
# What a lost or unreachable broker raises. pika's connection workflow lets some of its own
# errors out as they are (a handshake that timed out: not an AMQPError), and a garbled stream
# raises a protocol error: each means the connection is gone.
_GONE = (pex.AMQPError, AMQPConnectorException, ConnectionError, OSError)


def parse_levels(text: str, url: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        levels = ()
    if not levels:
        raise ConfigurationError(f"{url!r}: levels is a comma-separated list of integers "
                                 f"(priority levels with a lane each), got {text!r}")
    return levels


class _SharedLock:
    """The connection's lock (reentrant), for threads that take turns on one connection. A
    waiter serves the connection in short slices under it and takes it again at once: Python's
    locks are not fair, so a thread blocked on it (an enqueue, an ack) could wait for seconds
    behind a loop that releases and re-acquires. The waiter steps aside between slices while
    anyone is queued (``let_others_in``)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count = threading.Lock()
        self._queued = 0

    def __enter__(self) -> bool:
        with self._count:
            self._queued += 1
        try:
            return self._lock.acquire()
        finally:
            with self._count:
                self._queued -= 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def let_others_in(self) -> None:
        """Called without the lock: wait (briefly) until the threads queued for it got it."""
        for _ in range(50):
            if not self._queued:
                return
            time.sleep(0.0005)


def _announced_major(conn: Any) -> int:
    """The major version the broker announced at the handshake (0 if it did not say)."""
    version = conn._impl.server_properties.get("version", b"")
    if isinstance(version, bytes):
        version = version.decode("ascii", "replace")
    head = str(version).split(".", 1)[0]
    return int(head) if head.isdigit() else 0


class RabbitTransport:
    kind = "RabbitMQ"
    max_delay = STEP_MS * 2 ** (STEPS - 1) / 1000
    supports: frozenset[str] = frozenset()

    def __init__(self, url: str, *, prefix: str = "conveyor", delivery_limit: int = 20,
                 expires_ms: int | None = None, heartbeat_s: float = 1.0,
                 prefetch: int | None = None, levels: Sequence[int] = (0,)) -> None:
        self.where = redact_url(url)
        self.levels = tuple(levels)
        self.params = pika.URLParameters(url)
        self.prefix = prefix
        self.delivery_limit = delivery_limit
        self.expires_ms = expires_ms
        self._lock = _SharedLock()
        self._conn: Any = None
        self._ch: Any = None
        self._pub: ConfirmingPublisher | None = None  # a second channel, for publishes
        self.epoch = 0  # bumped with every new channel: a delivery of an older one is lost
        self._declared: set[str] = set()
        # Consumers of this channel, by lane name, and what each delivered that no claim took
        # yet. Both die with the channel (its deliveries go back to the broker).
        self._consumers: dict[str, str] = {}
        self._lanes_by_tag: dict[str, Lane] = {}
        self._buffers: dict[str, collections.deque[Delivery]] = {}
        self.prefetch = prefetch  # per lane; None: the first claim's limit (the free slots)
        self._closed = False
        self._heartbeat_s = heartbeat_s
        self._pump = self._new_pump()
        self._pump_started = False
        self._active = time.monotonic()  # the last claim or wait on a job lane
        self._claims = 0  # claims in progress (the app is not idle while one runs)
        self._claims_lock = threading.Lock()
        self.server_major = 0  # RabbitMQ's major version, known once connected
        forking.register(self)

    def _new_pump(self) -> threading.Thread:
        return threading.Thread(target=self._pump_loop, args=(self._heartbeat_s,),
                                name="conveyor-amqp-pump", daemon=True)

    def _after_fork_in_child(self) -> None:
        """The connection is the parent's: its socket carries the parent's conversation (two
        processes on it mix their frames and hang), and closing it here would end the
        parent's session and leases. It is kept untouched for the child's life and this
        process connects anew on first use; the pump thread and whoever held the lock are
        not in this process."""
        forking.keep_inherited(self._conn, self._ch, self._pub)
        self._conn = self._ch = self._pub = None
        self._lock = _SharedLock()
        self._claims, self._claims_lock = 0, threading.Lock()  # the parent's claims, not ours
        self.epoch += 1  # a delivery the parent held is not this process's to settle
        self._declared = set()
        self._consumers = {}
        self._lanes_by_tag = {}
        self._buffers = {}
        self._pump = self._new_pump()
        self._pump_started = False

    # -- names -----------------------------------------------------------------------------
    def name(self, lane: Lane) -> str:
        if lane.level is None:
            return f"{self.prefix}.{lane.queue}.dead"
        return f"{self.prefix}.{lane.queue}.p{lane.level}"

    def _common_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {"x-queue-type": "quorum"}
        if self.expires_ms is not None:
            args["x-expires"] = self.expires_ms
        return args

    def _lane_args(self, lane: Lane) -> dict[str, Any]:
        args = self._common_args()
        if lane.level is None and self.server_major >= 4:
            # RabbitMQ 4 gives a quorum queue a delivery limit of 20 when none is set, and a
            # dead lane dead-letters nowhere: each listing or redrive peek gives its messages
            # back (a delivery), so the 21st listing would drop every dead job. -1 is "no
            # limit" from 4.0 on; RabbitMQ 3 reads it as a limit below zero and drops a
            # message at its first give-back, so it is sent to 4 only.
            args["x-delivery-limit"] = -1
        if lane.level is not None:
            args.update({
                "x-delivery-limit": self.delivery_limit,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self.name(Lane(lane.queue, None)),
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            })
        return args

    # -- the connection --------------------------------------------------------------------
    def _channel(self) -> Any:
        """The open channel, connecting first if there is none (holding the lock)."""
        if self._closed:
            raise StoreError("this backend is closed")
        if self._ch is not None and self._ch.is_open and self._conn.is_open:
            return self._ch
        self._drop()
        self._conn = pika.BlockingConnection(self.params)
        self.server_major = _announced_major(self._conn)
        ch = self._conn.channel()
        ch.confirm_delivery()
        self._ch = ch
        self.epoch += 1
        self._declared.clear()
        self._consumers.clear()
        self._lanes_by_tag.clear()
        self._buffers.clear()
        if not self._pump_started:
            self._pump_started = True
            self._pump.start()
        return ch

    def _drop(self) -> None:
        conn, self._conn, self._ch, self._pub = self._conn, None, None, None
        self._consumers.clear()
        self._lanes_by_tag.clear()
        self._buffers.clear()
        if conn is not None:
            with contextlib.suppress(Exception):  # it is being thrown away
                conn.close()

    def _pump_loop(self, every: float) -> None:
        """Serve heartbeats and notice a dead connection while nobody calls; once claims
        stop, give back what the consumers took."""
        while not self._closed:
            time.sleep(every)
            with self._lock:
                if self._closed or self._conn is None:
                    continue
                try:
                    self._conn.process_data_events(0)
                    if (self._consumers and not self._claims
                            and time.monotonic() - self._active > UNCLAIMED_S):
                        self._stop_consuming()
                except _GONE as exc:
                    log.warning("RabbitMQ at %s: connection lost (%s); its messages go back "
                                "to the broker", self.where, exc)
                    self._drop()

    def _stop_consuming(self) -> None:
        """Cancel the consumers and give back what they delivered that no claim took (holding
        the lock). Nobody claimed or waited for ``UNCLAIMED_S``: the worker stopped, or this
        app never runs one. Until the app closes, its consumers would keep taking messages no
        claim reads, and other apps' workers would get none. The next claim or wait consumes
        again."""
        for tag in list(self._consumers.values()):
            # pika rejects (requeues) what arrived for the consumer and was not dispatched yet.
            self._ch.basic_cancel(tag)
        self._consumers.clear()
        self._lanes_by_tag.clear()
        self._hand_back_unclaimed()

    def _call(self, what: str, fn: Callable[[Any], T], *, safe: bool) -> T:
        """``fn(channel)`` under the lock, reconnecting and trying again while the broker is
        unreachable, if ``safe`` (running it twice does no harm) or nothing was sent."""
        deadline = time.monotonic() + RETRY_BUDGET
        pause = 0.05
        while True:
            with self._lock:
                sent = False
                try:
                    ch = self._channel()
                    sent = True
                    return fn(ch)
                except pex.ChannelClosedByBroker as exc:
                    self._drop()
                    if exc.reply_code == 406:
                        raise ConfigurationError(
                            f"RabbitMQ at {self.where} refused {what}: {exc.reply_text}; a queue "
                            "of this prefix exists with other settings") from exc
                    error: Exception = exc
                except (pex.UnroutableError, pex.NackError) as exc:
                    raise StoreError(f"RabbitMQ at {self.where} did not take {what} ({exc}): "
                                     "some messages of it may have been taken") from exc
                except _GONE as exc:
                    self._drop()
                    error = exc
            if (safe or not sent) and not self._closed and time.monotonic() + pause < deadline:
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
                continue
            detail = ("nothing was done" if not sent else
                      "it may or may not have happened" if not safe else
                      "a reply was lost; it is safe to try again")
            raise StoreUnavailable(
                f"RabbitMQ at {self.where} is unreachable: {what} failed ({error!r}); {detail}"
            ) from error

    def _declare(self, ch: Any, lane: Lane) -> int:
        """Declare the lane (idempotent; once per channel unless a count is wanted): its ready
        messages."""
        frame = ch.queue_declare(self.name(lane), durable=True, arguments=self._lane_args(lane))
        self._declared.add(self.name(lane))
        return int(frame.method.message_count)

    def _ensure(self, ch: Any, lane: Lane) -> None:
        """Declare ``lane`` if this channel has not. A job lane's siblings (every level of its
        queue) are declared with it: RabbitMQ answers a declare of a quorum queue another
        connection is creating before the queue has a leader, and a ``basic.consume`` on it
        then crashes the channel and closes the whole connection (541 INTERNAL_ERROR), which
        hands back every message the connection held. Declaring a queue's lanes at its first
        enqueue means workers consume lanes that are long made."""
        if self.name(lane) in self._declared:
            return
        siblings = [] if lane.dead else [Lane(lane.queue, lv) for lv in self.levels]
        for other in [*siblings, lane]:
            if self.name(other) not in self._declared:
                self._declare(ch, other)

    def _delay_queue(self, ch: Any, step: int) -> str:
        ms = STEP_MS * 2 ** step
        name = f"{self.prefix}.delay.{ms}"
        if name not in self._declared:
            ch.exchange_declare(name, exchange_type="fanout", durable=True)
            args = self._common_args()
            args.update({"x-message-ttl": ms, "x-dead-letter-exchange": "",
                         "x-dead-letter-strategy": "at-least-once",
                         "x-overflow": "reject-publish"})
            ch.queue_declare(name, durable=True, arguments=args)
            ch.queue_bind(name, name)
            self._declared.add(name)
        return name

    # -- Transport -------------------------------------------------------------------------
    def publish(self, items: Sequence[Outgoing]) -> None:
        if not items:
            return
        props = pika.BasicProperties(delivery_mode=2, content_type="application/json")

        def send(ch: Any) -> None:
            out = []
            for item in items:
                self._ensure(ch, item.lane)
                target = self.name(item.lane)
                exchange = ""
                if item.delay * 1000 >= STEP_MS / 2:
                    step = max(0, min(STEPS - 1, int(math.log2(item.delay * 1000 / STEP_MS))))
                    exchange = self._delay_queue(ch, step)
                out.append((exchange, target, item.body, props))
            publisher = self._publisher()
            if publisher is not None:
                publisher.publish(out)  # the confirms awaited together
                return
            for exchange, target, body, p in out:
                ch.basic_publish(exchange, target, body, p, mandatory=True)

        self._call(f"publishing {len(items)} message(s)", send, safe=False)

    def _publisher(self) -> ConfirmingPublisher | None:
        """The connection's publishing channel (holding the lock), None if this pika lacks
        what it needs (then the main channel publishes one by one)."""
        if (self._pub is None or not self._pub.is_open) and usable(self._ch):
            self._pub = ConfirmingPublisher(self._conn.channel())
        return self._pub

    def receive(self, lane: Lane, limit: int, *, lease_s: float) -> list[Delivery]:
        if lane.dead:
            return self._get(lane, limit)

        def take(ch: Any) -> list[Delivery]:
            self._active = time.monotonic()
            self._consume(ch, lane, limit)
            buf = self._buffers[self.name(lane)]
            if len(buf) < limit:
                self._conn.process_data_events(0)  # what arrived since
            out = [buf.popleft() for _ in range(min(limit, len(buf)))]
            if len(out) == limit:
                return out
            # The consumer pushes at most its prefetch (the first claim's limit), and only
            # some time after it starts: the rest of what the lane has is taken directly, so a
            # claim returns what is there up to its own limit.
            out += self._get_some(ch, lane, limit - len(out))
            if len(out) < limit:
                # The get found the lane empty: what the queue handed the consumer before it
                # (an ack had freed prefetch slots) is out of the queue but may not be here
                # yet. RabbitMQ's channel waits in a get for the queue's answer and writes out
                # the deliveries the queue sent it meanwhile only after the get's reply, and a
                # later method's reply after them: this round trip (restating the prefetch,
                # which changes nothing) brings them in, so a claim does not come back empty
                # while the lane's messages are on their way to this very consumer.
                ch.basic_qos(prefetch_count=self.prefetch)
            # A message the queue gave the consumer before the get is not in the queue for
            # the get: its delivery came in ahead of the get's reply, and pika dispatches it
            # only now. It is ahead of the get's messages in the lane, and the channel's
            # delivery tags count in the order the queue handed messages out, so the claim
            # takes the lane's first ``limit`` by tag and leaves the rest for the next one.
            # Without it a lower lane's job could be left for after a higher lane's, and a
            # lane's jobs went out of the order they came (a claim took 4 before 3).
            self._conn.process_data_events(0)
            if buf:
                out = sorted([*out, *buf], key=lambda d: d.handle[1])
                buf.clear()
                buf.extend(out[limit:])
                out = out[:limit]
            return out

        # Safe to try again: what a lost channel held goes back to the broker.
        return self._call(f"receiving from {self.name(lane)}", take, safe=True)

    @contextlib.contextmanager
    def claiming(self) -> Iterator[None]:
        """Held by the core for a whole claim: between two receives a companion writes each
        job it hands out to its store, which for a big claim can take longer than
        ``UNCLAIMED_S``, and the pump must not take the app for idle then (cancelling the
        consumers republishes all they pushed that no claim took yet)."""
        with self._claims_lock:
            self._claims += 1
        try:
            yield
        finally:
            with self._claims_lock:
                self._claims -= 1
                self._active = time.monotonic()

    def _consume(self, ch: Any, lane: Lane, limit: int | None) -> None:
        """Consume ``lane`` on this channel from now on, with manual acks and at most
        ``prefetch`` unacked messages (the ones running and the ones delivered but not yet
        claimed): a worker's free slots, so it never holds a message it could not start."""
        name = self.name(lane)
        if name in self._consumers:
            return
        self._ensure(ch, lane)
        if self.prefetch is None:
            self.prefetch = max(int(limit or 10), 1)
        ch.basic_qos(prefetch_count=self.prefetch)  # for the consumers made from now on
        tag = ch.basic_consume(name, self._on_message, auto_ack=False)
        self._consumers[name] = tag
        self._lanes_by_tag[tag] = lane
        self._buffers.setdefault(name, collections.deque())

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        lane = self._lanes_by_tag.get(method.consumer_tag)
        if lane is None:  # a consumer of an older channel: its deliveries are gone with it
            return
        count = int((props.headers or {}).get("x-delivery-count", 0))
        self._buffers[self.name(lane)].append(
            Delivery(lane, body, (self.epoch, method.delivery_tag), count + 1))

    def _get(self, lane: Lane, limit: int) -> list[Delivery]:
        """``basic.get``: for the dead lane, which nobody consumes."""
        def get(ch: Any) -> list[Delivery]:
            self._ensure(ch, lane)
            return self._get_some(ch, lane, limit)

        return self._call(f"receiving from {self.name(lane)}", get, safe=True)

    def _get_some(self, ch: Any, lane: Lane, limit: int) -> list[Delivery]:
        """Up to ``limit`` messages of ``lane`` by ``basic.get``, one by one."""
        out: list[Delivery] = []
        name = self.name(lane)
        while len(out) < limit:
            method, props, body = ch.basic_get(name, auto_ack=False)
            if method is None:
                break
            count = int((props.headers or {}).get("x-delivery-count", 0))
            out.append(Delivery(lane, body, (self.epoch, method.delivery_tag), count + 1))
        return out

    def _ours(self, d: Delivery) -> bool:
        return (d.handle[0] == self.epoch and self._ch is not None and self._ch.is_open
                and self._conn.is_open)

    def settle(self, deliveries: Sequence[Delivery]) -> list[bool]:
        with self._lock:
            done = []
            for d in deliveries:
                if not self._ours(d):
                    done.append(False)
                    continue
                try:
                    self._ch.basic_ack(d.handle[1])
                    done.append(True)
                except _GONE:
                    self._drop()
                    done.append(False)
            return done

    def extend(self, deliveries: Sequence[Delivery], *, lease_s: float) -> list[bool]:
        # Nothing to extend: the connection is the lease.
        return self.still_held(deliveries)

    def still_held(self, deliveries: Sequence[Delivery]) -> list[bool]:
        """Whether this transport's live channel still holds each delivery (the core asks
        before a claim returns). The connection is served first, so a channel RabbitMQ closed
        (a consumer timeout, a restart) is noticed now."""
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.process_data_events(0)
                except _GONE:
                    self._drop()
            return [self._ours(d) for d in deliveries]

    def give_back(self, deliveries: Sequence[Delivery], *, counted: bool = False) -> None:
        with self._lock:
            mine = [d for d in deliveries if self._ours(d)]
            lanes: dict[str, tuple[Lane, int]] = {}
            try:
                if counted:  # the counts before, which the give-back must add to
                    for d in mine:
                        name = self.name(d.lane)
                        if name not in lanes:
                            lanes[name] = (d.lane, self._declare(self._ch, d.lane))
                for d in mine:
                    self._ch.basic_nack(d.handle[1], requeue=True)
            except _GONE:
                self._drop()
                return
        if lanes:
            self._until_counted(lanes, collections.Counter(self.name(d.lane) for d in mine))

    def _until_counted(self, lanes: dict[str, tuple[Lane, int]],
                       given: collections.Counter[str]) -> None:
        """Wait (briefly, bounded) until each lane's count holds what was given back to it. A
        quorum queue applies a nack through its log and answers a count from what it applied,
        so a count read right after a give-back can miss the messages: a dead-lane listing
        then stats read the dead jobs as gone. A count may also fall for a reason of its own
        (another listing holds them): then the wait ends at its bound."""
        deadline = time.monotonic() + COUNT_SETTLE_S
        for name, (lane, before) in lanes.items():
            while time.monotonic() < deadline:
                try:
                    now = self.depth(lane).ready
                except StoreUnavailable:
                    return
                if now >= before + given[name]:
                    break
                time.sleep(0.01)

    def wait(self, lanes: Sequence[Lane], timeout: float) -> bool:
        """Serve the connection in short slices (the lock is free between them, for acks and
        heartbeats) until a consumer of ``lanes`` has delivered something."""
        deadline = time.monotonic() + timeout
        jobs = [lane for lane in lanes if not lane.dead]

        def look(ch: Any) -> bool:
            self._active = time.monotonic()
            for lane in jobs:
                self._consume(ch, lane, None)
            if any(self._buffers[self.name(lane)] for lane in jobs):
                return True
            left = deadline - time.monotonic()
            if left > 0:
                self._conn.process_data_events(time_limit=min(left, WAIT_SLICE))
            return any(self._buffers[self.name(lane)] for lane in jobs)

        while True:
            if self._call("waiting for messages", look, safe=True):
                return True
            if time.monotonic() >= deadline:
                return False
            self._lock.let_others_in()

    def depth(self, lane: Lane) -> LaneDepth:
        ready = self._call(f"counting {self.name(lane)}", lambda ch: self._declare(ch, lane),
                           safe=True)
        return LaneDepth(ready=ready)

    def purge(self, lane: Lane) -> int:
        def purge(ch: Any) -> int:
            self._ensure(ch, lane)
            return int(ch.queue_purge(self.name(lane)).method.message_count)

        return self._call(f"purging {self.name(lane)}", purge, safe=True)

    def queues(self) -> list[str] | None:
        return None  # AMQP cannot list queues (the management plugin's API can)

    def close(self) -> None:
        with self._lock:
            try:
                self._hand_back_unclaimed()
            except _GONE:
                log.warning("RabbitMQ at %s: could not hand back unclaimed messages; the "
                            "broker gives them back as it does a lost connection's", self.where)
            finally:
                self._closed = True
                self._drop()

    def _hand_back_unclaimed(self) -> None:
        """Messages a consumer delivered that no claim took: published again as fresh copies,
        then acked, so they do not come back with a higher delivery count (the core would
        charge an attempt for it). A copy the lane refuses (full, or deleted) is given back
        as it is. Raises what a lost connection raises (the broker then gives them back)."""
        if self._ch is None or not self._ch.is_open:
            return
        props = pika.BasicProperties(delivery_mode=2, content_type="application/json")
        for name, buf in self._buffers.items():
            while buf:
                d = buf[0]
                try:
                    self._ch.basic_publish("", name, d.body, props, mandatory=True)
                except (pex.UnroutableError, pex.NackError):
                    self._ch.basic_nack(d.handle[1], requeue=True)
                else:
                    self._ch.basic_ack(d.handle[1])
                buf.popleft()


def open_rabbitmq(url: str, *, state: Backend | None = None) -> BrokerBackend:
    """The RabbitMQ store of ``url``; with ``state``, a companion store keeps the records."""
    parts = urlsplit(url)
    ours = {k: v for k, v in parse_qsl(parts.query) if k in _OURS}
    rest = [(k, v) for k, v in parse_qsl(parts.query) if k not in _OURS]
    if not any(k == "heartbeat" for k, _ in rest):
        rest.append(("heartbeat", "5"))
    pika_url = parts._replace(query=urlencode(rest)).geturl()
    levels = parse_levels(ours.get("levels", "-1,0,1"), url)
    try:
        transport = RabbitTransport(
            pika_url, prefix=ours.get("prefix", "conveyor"), levels=levels,
            delivery_limit=int(ours.get("delivery_limit", 20)),
            expires_ms=int(ours["expires"]) if "expires" in ours else None,
            prefetch=int(ours["prefetch"]) if "prefetch" in ours else None,
        )
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{redact_url(url)!r}: {exc}") from None
    if state is not None:
        return CompanionBackend(url, transport, levels, state)
    return BrokerBackend(url, transport, levels)
