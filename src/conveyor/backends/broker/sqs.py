"""Amazon SQS as Conveyor's broker (``sqs://`` URLs, see sqs_settings.py): the Transport of
:class:`~conveyor.backends.broker.core.BrokerBackend` on boto3, with standard queues.

* The lease is SQS's visibility timeout: a receive hides the message for ``ceil(lease_s)``
  seconds, ``extend`` (the heartbeat) is ChangeMessageVisibility.
* Fencing. SQS may accept an outdated receipt handle: its documentation says a delete with one
  can succeed, and some servers (moto) change the visibility or delete through any handle the
  message ever had. So this transport does not take the broker's word alone. Each delivery
  keeps, on this machine's monotonic clock, the time until which SQS holds it for us for sure
  (counted from before the request that set its visibility was sent). Past that (less a margin
  for the next request's way there) the delivery counts as taken back, without asking SQS.
  Before it, ``settle`` first changes the visibility with the handle (SQS refuses a message no
  longer in flight) to hold it while the delete goes out, then deletes. The window left: a
  request that takes longer than the margin to reach SQS, through a handle SQS still accepts.
* Delays are DelaySeconds, 15 minutes at most (``max_delay``); the core sends a longer one
  again when it comes out early.
* Each job lane has a redrive policy into its dead lane after ``max_receives`` receives of one
  message: a backstop for a message that kills every worker that takes it (the core counts
  attempts itself, from ApproximateReceiveCount, and dead-letters first when max_attempts is
  lower).
* ``wait`` polls the lanes' ApproximateNumberOfMessages in growing pauses (a long-polling
  receive would take the messages it finds, and count as their delivery).

With ``fifo=true`` the lanes are FIFO queues (``supports`` unique keys and fair sharing):

* Each message is sent with a MessageGroupId, the digest of ``Outgoing.group`` (the core's
  fair_key, or the job's own id), or a group of its own without one; and a
  MessageDeduplicationId, the digest of ``Outgoing.dedup_id``, or a random one without it.
  SQS hands out a group's messages in order, none while one of the group is held, and drops a
  message whose deduplication id it took in the last 5 minutes (acknowledging it as sent).
* FIFO queues take no per-message DelaySeconds. A delayed message goes to the job lane's
  standard delay queue instead, with DelaySeconds and its group and deduplication id as message
  attributes; ``receive`` (at most once a second per lane, sooner while it finds some) and
  ``wait`` move the due ones into the FIFO lane ("the pump"). A move is a send, then a delete:
  a crash in between sends it again after PUMP_HOLD seconds, with the same deduplication id.

boto3 clients are safe to share between threads (a session is not): both are made once here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ...errors import ConfigurationError, StoreError, StoreUnavailable
from ..base import Backend
from .companion import CompanionBackend
from .core import BrokerBackend
from .sqs_settings import SqsSettings, lane_name, parse_lane_name, parse_sqs_url
from .transport import Delivery, Lane, LaneDepth, Outgoing

log = logging.getLogger("conveyor.broker.sqs")

MAX_DELAY = 900  # SQS's longest DelaySeconds
MAX_VISIBILITY = 43_200  # 12 hours, SQS's longest visibility timeout
BATCH = 10  # entries per batch call
BATCH_BYTES = 256 * 1024  # SQS's limit on the bodies of one SendMessageBatch
RETENTION = 1_209_600  # 14 days, SQS's longest: a waiting or dead job is not dropped sooner
HOLD = 30  # seconds a settle holds a message between its check and its delete
MARGIN = 1.0  # at most this much of a lease is kept back for a request's way to SQS
TRIES = 3
PUMP_EVERY = 1.0  # seconds between a lane's moves of due delayed messages, while none are found
PUMP_HOLD = 30  # seconds a message being moved is hidden in its delay queue
PUMP_MAX = 100  # messages one move takes at most (the claim that makes it waits for it)
GROUP_ATTR = "conveyor-group"  # a delayed message's MessageGroupId, for its move
DEDUP_ATTR = "conveyor-dedup"  # and its MessageDeduplicationId
_GONE_QUEUE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
_THROTTLED = {"Throttling", "ThrottlingException", "RequestThrottled", "RequestThrottledException",
              "ServiceUnavailable", "InternalError", "InternalFailure", "KmsThrottled"}


class SqsRefused(StoreError):
    """SQS answered with an error that trying again will not change (access, a bad request)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Receipt:
    """A delivery's handle: its receipt handle, and until when SQS holds it for this holder."""

    url: str
    handle: str
    message_id: str
    deadline: float  # time.monotonic()
    margin: float

    def hold(self, sent_at: float, seconds: int) -> None:
        """SQS took a visibility of ``seconds`` from a request sent at ``sent_at``."""
        self.deadline = sent_at + seconds
        self.margin = min(MARGIN, seconds * 0.2)

    def live(self, now: float) -> bool:
        return now < self.deadline - self.margin

    def drop(self) -> None:
        self.deadline = -math.inf


def visibility(lease_s: float) -> int:
    return max(1, min(math.ceil(lease_s), MAX_VISIBILITY))


class SqsTransport:
    kind = "SQS"
    max_delay = float(MAX_DELAY)

    def __init__(self, settings: SqsSettings) -> None:
        self.settings = settings
        self.fifo = settings.fifo
        self.supports: frozenset[str] = (frozenset({"unique", "fair"}) if settings.fifo
                                         else frozenset())
        self._where = settings.where
        # Two clients: one that retries by itself, and one that does not, for the visibility
        # changes of settle and extend: those are retried here, after checking the lease again.
        self._client = _client(settings, tries=TRIES)
        self._fenced = _client(settings, tries=1)
        self._urls: dict[Lane, str] = {}
        self._delay_urls: dict[Lane, str] = {}  # FIFO: each job lane's delay queue
        self._next_pump: dict[Lane, float] = {}  # FIFO: time.monotonic() of the next move
        self._arns: dict[str, str] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()

    # -- calls -----------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[..., Any], maybe: str = "", **kw: Any) -> Any:
        """``fn(**kw)`` with boto3's errors as Conveyor's: StoreUnavailable for what may pass
        (the endpoint unreachable, throttled, failing), SqsRefused for a refusal."""
        from botocore.exceptions import (
            ClientError,
            NoCredentialsError,
            NoRegionError,
            PartialCredentialsError,
        )

        try:
            return fn(**kw)
        except ClientError as exc:
            code, message, status = _error(exc)
            if status >= 500 or code in _THROTTLED:
                raise StoreUnavailable(
                    f"SQS at {self._where} failed {what}: {code}: {message}"
                    + (f"; {maybe}" if maybe else "")) from exc
            raise SqsRefused(code, f"SQS at {self._where} refused {what}: {code}: {message}"
                             ) from exc
        except (NoCredentialsError, PartialCredentialsError, NoRegionError) as exc:
            raise ConfigurationError(
                f"SQS at {self._where}: {exc} (see docs/backends.md, Amazon SQS)") from exc
        except _lost() as exc:
            raise StoreUnavailable(
                f"SQS at {self._where} is unreachable: {what} failed ({exc})"
                + (f"; {maybe}" if maybe else "")) from exc

    def _batch(self, what: str, fn: Callable[..., Any], url: str, entries: dict[str, Any], *,
               live: Callable[[str], bool] | None = None, maybe: str = "",
               ) -> tuple[set[str], dict[str, str]]:
        """One batch call of ``entries`` (by Id), trying again entries SQS failed on its side
        and, with ``live`` (the fenced client, which does not retry by itself), calls that got
        no answer, each time only for entries still ``live``. Returns the Ids done and the
        refused ones with SQS's error code (or "expired": ``live`` said no)."""
        done: set[str] = set()
        refused: dict[str, str] = {}
        todo = dict(entries)
        failure: Exception | None = None
        for attempt in range(TRIES):
            if not todo:
                break
            if attempt:
                time.sleep(0.05 * 2 ** attempt)
            if live is not None:
                for key in [k for k in todo if not live(k)]:
                    refused[key] = "expired"
                    del todo[key]
            if not todo:
                break
            try:
                reply = self._call(what, fn, maybe, QueueUrl=url, Entries=list(todo.values()))
            except StoreUnavailable as exc:
                if live is None:
                    raise
                failure = exc
                continue
            for ok in reply.get("Successful", []):
                done.add(ok["Id"])
                todo.pop(ok["Id"], None)
            for bad in reply.get("Failed", []):
                if bad.get("SenderFault"):
                    refused[bad["Id"]] = bad.get("Code", "")
                    todo.pop(bad["Id"], None)
                else:
                    failure = StoreUnavailable(f"SQS at {self._where} failed {what}: "
                                               f"{bad.get('Code')}: {bad.get('Message')}")
        if todo:
            assert failure is not None
            raise StoreUnavailable(f"{failure}; {maybe}" if maybe else str(failure)) from failure
        return done, refused

    # -- lanes -----------------------------------------------------------------------------
    def _name(self, lane: Lane, *, delay: bool = False) -> str:
        return lane_name(self.settings.prefix, lane.queue, lane.level, fifo=self.fifo,
                         delay=delay)

    def _url(self, lane: Lane, *, create: bool, delay: bool = False,
             again: bool = False) -> str | None:
        """The lane's queue URL (``delay``: its FIFO lane's delay queue); with ``create`` the
        queue is made if it is missing (CreateQueue is idempotent), else None stands for a
        queue that does not exist."""
        cache = self._delay_urls if delay else self._urls
        url = cache.get(lane)
        if url is not None:
            return url
        name = self._name(lane, delay=delay)
        if create:
            attributes = {"MessageRetentionPeriod": str(RETENTION)}
            if self.fifo and not delay:
                attributes["FifoQueue"] = "true"
                attributes["ContentBasedDeduplication"] = "false"
            if not lane.dead and not delay:
                if self.fifo:
                    # Made before its lane: where a lane exists, so does its delay queue.
                    self._url(lane, create=True, delay=True)
                attributes["RedrivePolicy"] = json.dumps({
                    "deadLetterTargetArn": self._arn(Lane(lane.queue, None)),
                    "maxReceiveCount": str(self.settings.max_receives)})
            try:
                url = self._call(f"creating queue {name}", self._client.create_queue,
                                 QueueName=name, Attributes=attributes)["QueueUrl"]
            except SqsRefused as exc:
                if exc.code in _GONE_QUEUE and not lane.dead and not again:
                    # The dead lane the redrive policy names is gone (this process knew it
                    # from before the queues were deleted): it is made again first.
                    self._forget(Lane(lane.queue, None), exc)
                    return self._url(lane, create=True, again=True)
                if exc.code not in ("QueueAlreadyExists", "QueueNameExists"):
                    raise
                # Made before with other attributes (another max_receives): used as it is.
                log.warning("SQS queue %s exists with other attributes than these settings "
                            "ask for; using it as it is", name)
                url = self._lookup(name)
        else:
            url = self._lookup(name)
        if url is None:
            return None
        with self._lock:
            cache[lane] = url
        return url

    def _lookup(self, name: str) -> str | None:
        try:
            url: str = self._call(f"looking up queue {name}", self._client.get_queue_url,
                                  QueueName=name)["QueueUrl"]
        except SqsRefused as exc:
            if exc.code in _GONE_QUEUE:
                return None
            raise
        return url

    def _arn(self, dead: Lane) -> str:
        url = self._url(dead, create=True)
        assert url is not None
        arn = self._arns.get(url)
        if arn is None:
            arn = self._call("reading a queue's ARN", self._client.get_queue_attributes,
                             QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            with self._lock:
                self._arns[url] = arn
        return arn

    def _forget(self, lane: Lane, exc: SqsRefused) -> None:
        """A queue deleted behind our back: made again on next use. A job lane's dead lane is
        forgotten with it: what deleted one (a server restarted without its state, a cleanup)
        most likely deleted both, and the job lane's redrive policy must name one that exists."""
        if exc.code in _GONE_QUEUE:
            with self._lock:
                for gone in {lane, Lane(lane.queue, None)}:
                    url = self._urls.pop(gone, None)
                    self._delay_urls.pop(gone, None)
                    self._arns.pop(url or "", None)

    # -- Transport -------------------------------------------------------------------------
    def publish(self, items: Sequence[Outgoing]) -> None:
        # By queue: a FIFO lane's delayed messages go to its delay queue.
        by_queue: dict[tuple[Lane, bool], list[Outgoing]] = {}
        for item in items:
            by_queue.setdefault((item.lane, self.fifo and item.delay > 0), []).append(item)
        for lane, delayed in by_queue:  # every name checked, and every queue made, before a send
            self._name(lane, delay=delayed)
        urls: dict[tuple[Lane, bool], str | None] = {}
        for lane, delayed in by_queue:
            # A delay queue is made with its lane (which makes it first): where there is no
            # lane, there is no delay queue to look at either.
            urls[(lane, delayed)] = self._url(lane, create=True)
            if delayed:
                urls[(lane, delayed)] = self._url(lane, create=True, delay=True)
        sent = 0
        for (lane, delayed), group in by_queue.items():
            url = urls[(lane, delayed)]
            assert url is not None
            for chunk in _chunks(group):
                entries = {str(i): _entry(str(i), item, fifo=self.fifo, delayed=delayed)
                           for i, item in enumerate(chunk)}
                maybe = (f"{sent} of {len(items)} messages were taken before this batch of "
                         f"{len(chunk)}, which may or may not have been")
                try:
                    _, refused = self._batch("sending messages", self._client.send_message_batch,
                                             url, entries, maybe=maybe)
                except SqsRefused as exc:
                    self._forget(lane, exc)
                    raise SqsRefused(exc.code, f"{exc}; {maybe}") from exc
                if refused:
                    codes = ", ".join(sorted(set(refused.values())))
                    raise SqsRefused(codes, f"SQS at {self._where} refused {len(refused)} "
                                     f"message(s) for queue {lane.queue!r} ({codes}); {maybe}")
                sent += len(chunk)

    def receive(self, lane: Lane, limit: int, *, lease_s: float) -> list[Delivery]:
        url = self._url(lane, create=True)
        assert url is not None
        if self.fifo and not lane.dead:
            self._pump(lane)
        seconds = visibility(lease_s)
        out: list[Delivery] = []
        while len(out) < limit:
            n = min(BATCH, limit - len(out))
            extra: dict[str, Any] = {}
            if self.fifo:
                # boto3's own tries of this call then get the same messages back from SQS,
                # instead of leaving the first try's hidden (and their groups blocked).
                extra["ReceiveRequestAttemptId"] = uuid.uuid4().hex
            sent_at = time.monotonic()
            try:
                reply = self._call(
                    "receiving messages", self._client.receive_message,
                    f"the messages it may have taken come back after {seconds} s",
                    QueueUrl=url, MaxNumberOfMessages=n, VisibilityTimeout=seconds,
                    WaitTimeSeconds=0, AttributeNames=["ApproximateReceiveCount"], **extra)
            except SqsRefused as exc:
                self._forget(lane, exc)
                raise
            messages = reply.get("Messages", [])
            for m in messages:
                receipt = Receipt(url, m["ReceiptHandle"], m["MessageId"], 0.0, 0.0)
                receipt.hold(sent_at, seconds)
                count = int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1))
                out.append(Delivery(lane, m["Body"].encode(), receipt, count,
                                    message_id=m["MessageId"]))
            if len(messages) < n:
                break
        return out

    def _change(self, deliveries: Sequence[Delivery], seconds: int, what: str) -> list[bool]:
        """Set the visibility of each delivery this holder still holds; per delivery whether
        it did."""
        result = [False] * len(deliveries)
        for url, group in _by_url(deliveries):
            for chunk in _batches(group):
                receipts = {str(i): deliveries[i].handle for i in chunk}
                for key in self._change_batch(url, receipts, seconds, what):
                    result[int(key)] = True
        return result

    def _change_batch(self, url: str, receipts: dict[str, Receipt], seconds: int,
                      what: str) -> set[str]:
        entries = {k: {"Id": k, "ReceiptHandle": r.handle, "VisibilityTimeout": seconds}
                   for k, r in receipts.items()}
        checked = time.monotonic()

        def live(key: str) -> bool:
            # Checked right before each try: a try that would reach SQS after the lease ran
            # out, through a handle SQS may still accept, is not sent.
            nonlocal checked
            checked = time.monotonic()
            return receipts[key].live(checked)

        done, refused = self._batch(what, self._fenced.change_message_visibility_batch, url,
                                    entries, live=live,
                                    maybe="the leases may or may not have been changed")
        for key in done:
            receipts[key].hold(checked, seconds)
        for key in refused:
            receipts[key].drop()
        return done

    def extend(self, deliveries: Sequence[Delivery], *, lease_s: float) -> list[bool]:
        return self._change(deliveries, visibility(lease_s), "extending leases")

    def settle(self, deliveries: Sequence[Delivery]) -> list[bool]:
        held = self._change(deliveries, HOLD, "checking leases before a delete")
        result = [False] * len(deliveries)
        mine = [i for i, ok in enumerate(held) if ok]
        for url, group in _by_url([deliveries[i] for i in mine]):
            for chunk in _batches(group):
                entries = {str(mine[i]): {"Id": str(mine[i]),
                                          "ReceiptHandle": deliveries[mine[i]].handle.handle}
                           for i in chunk}
                done, _ = self._batch(
                    "deleting messages", self._client.delete_message_batch, url, entries,
                    maybe=f"the messages may or may not have been deleted (if not, they come "
                          f"back after {HOLD} s)")
                for key in done:
                    result[int(key)] = True
        for d in deliveries:
            d.handle.drop()
        return result

    def give_back(self, deliveries: Sequence[Delivery], *, counted: bool = False) -> None:
        # ``counted`` asks nothing more of SQS: its counts are approximate by definition.
        try:
            self._change(deliveries, 0, "giving messages back")
        except StoreError as exc:
            log.warning("SQS: %d message(s) not given back (%s): they come back when their "
                        "visibility timeout runs out", len(deliveries), exc)
        for d in deliveries:
            d.handle.drop()

    def _pump(self, lane: Lane, *, now: bool = False) -> int:
        """FIFO: move the job lane's due delayed messages from its delay queue into the lane,
        each with the group and deduplication id it was published with; how many. At most once
        per PUMP_EVERY seconds unless ``now`` or the last move found some."""
        at = time.monotonic()
        if not now and at < self._next_pump.get(lane, 0.0):
            return 0
        self._next_pump[lane] = at + PUMP_EVERY
        source = self._url(lane, create=False, delay=True)
        if source is None:
            return 0
        target = self._url(lane, create=True)
        assert target is not None
        moved = 0
        while moved < PUMP_MAX:
            try:
                reply = self._call(
                    "receiving delayed messages", self._client.receive_message,
                    f"the messages it may have taken come back after {PUMP_HOLD} s",
                    QueueUrl=source, MaxNumberOfMessages=BATCH, VisibilityTimeout=PUMP_HOLD,
                    WaitTimeSeconds=0, MessageAttributeNames=[GROUP_ATTR, DEDUP_ATTR])
            except SqsRefused as exc:
                self._forget(lane, exc)
                raise
            messages = reply.get("Messages", [])
            for chunk in _chunks(messages, lambda m: len(m["Body"].encode())):
                moved += self._move(lane, source, target, chunk)
            if len(messages) < BATCH:
                break
        if moved:
            self._next_pump[lane] = 0.0  # more may have come due meanwhile
        return moved

    def _move(self, lane: Lane, source: str, target: str, messages: list[dict[str, Any]]) -> int:
        entries = {}
        for i, m in enumerate(messages):
            attrs = m.get("MessageAttributes", {})
            # A message without them was not sent here by a transport: a group of its own.
            group = attrs.get(GROUP_ATTR, {}).get("StringValue") or _digest(m["MessageId"])
            dedup = attrs.get(DEDUP_ATTR, {}).get("StringValue") or _digest(m["MessageId"])
            entries[str(i)] = {"Id": str(i), "MessageBody": m["Body"], "MessageGroupId": group,
                               "MessageDeduplicationId": dedup}
        maybe = (f"the delayed messages may or may not have been moved; those that were not "
                 f"are moved after {PUMP_HOLD} s")
        try:
            done, refused = self._batch("moving delayed messages", self._client.send_message_batch,
                                        target, entries, maybe=maybe)
        except SqsRefused as exc:
            self._forget(lane, exc)
            raise
        if refused:
            log.error("SQS refused to move %d delayed message(s) of queue %r into their lane "
                      "(%s); they are tried again in %d s", len(refused), lane.queue,
                      ", ".join(sorted(set(refused.values()))), PUMP_HOLD)
        gone = {k: {"Id": k, "ReceiptHandle": messages[int(k)]["ReceiptHandle"]} for k in done}
        if gone:
            self._batch("deleting moved messages", self._client.delete_message_batch, source,
                        gone, maybe=f"a moved message that was not deleted is moved again after "
                                    f"{PUMP_HOLD} s, and dropped by SQS as a duplicate")
        return len(done)

    def wait(self, lanes: Sequence[Lane], timeout: float) -> bool:
        deadline = time.monotonic() + max(timeout, 0.0)
        pause = 0.05
        while True:
            for lane in lanes:
                held, delayed = self._depths(lane)
                if held.ready > 0:
                    return True
                if delayed is not None and delayed.ready > 0 and self._pump(lane, now=True):
                    return True
            left = deadline - time.monotonic()
            if left <= 0 or self._closed.wait(min(pause, left)):
                return False
            pause = min(pause * 2, 1.0)

    def depth(self, lane: Lane) -> LaneDepth:
        held, delayed = self._depths(lane)
        if delayed is None:
            return held
        # A delayed message that is due waits to be moved: ready; one being moved is neither
        # held by a worker nor ready, so it counts as delayed still.
        return LaneDepth(held.ready + delayed.ready, held.in_flight,
                         (delayed.delayed or 0) + (delayed.in_flight or 0))

    def _depths(self, lane: Lane) -> tuple[LaneDepth, LaneDepth | None]:
        """The counts of the lane's queue and (FIFO job lanes) of its delay queue."""
        held = self._count(lane)
        if not self.fifo or lane.dead or self._urls.get(lane) is None:
            return held, None  # no lane (_count looked it up): no delay queue
        return held, self._count(lane, delay=True)

    def _count(self, lane: Lane, *, delay: bool = False) -> LaneDepth:
        url = self._url(lane, create=False, delay=delay)
        if url is None:
            return LaneDepth(0, 0, 0)
        try:
            attrs = self._call(
                "reading a queue's depth", self._client.get_queue_attributes, QueueUrl=url,
                AttributeNames=["ApproximateNumberOfMessages",
                                "ApproximateNumberOfMessagesNotVisible",
                                "ApproximateNumberOfMessagesDelayed"])["Attributes"]
        except SqsRefused as exc:
            self._forget(lane, exc)
            if exc.code in _GONE_QUEUE:
                return LaneDepth(0, 0, 0)
            raise
        return LaneDepth(int(attrs.get("ApproximateNumberOfMessages", 0)),
                         int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0)),
                         int(attrs.get("ApproximateNumberOfMessagesDelayed", 0)))

    def purge(self, lane: Lane) -> int:
        """PurgeQueue: every message goes, held ones too, and on AWS over up to a minute (one
        purge per queue per 60 s). The count is SQS's approximate one from just before."""
        d = self.depth(lane)
        url = self._url(lane, create=False)
        if url is None:
            return 0
        try:
            self._call("purging a queue", self._client.purge_queue, QueueUrl=url)
        except SqsRefused as exc:
            if "PurgeQueueInProgress" in exc.code:
                raise SqsRefused(exc.code, f"{exc} (SQS purges a queue at most once a minute; "
                                 "the purge under way deletes these messages)") from exc
            raise
        return d.ready + (d.delayed or 0) + (d.in_flight or 0)

    def queues(self) -> list[str] | None:
        found: set[str] = set()
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"QueueNamePrefix": f"{self.settings.prefix}-",
                                  "MaxResults": 1000}
            if token:
                kw["NextToken"] = token
            reply = self._call("listing queues", self._client.list_queues, **kw)
            for url in reply.get("QueueUrls", []):
                parsed = parse_lane_name(self.settings.prefix, url.rsplit("/", 1)[-1],
                                         fifo=self.fifo)
                if parsed is not None:
                    found.add(parsed[0])
            token = reply.get("NextToken")
            if not token:
                return sorted(found)

    def close(self) -> None:
        self._closed.set()
        for client in (self._client, self._fenced):
            client.close()


def open_sqs(url: str, *, state: Backend | None = None) -> BrokerBackend:
    """The SQS store of ``url``; with ``state``, a companion store keeps the records."""
    settings = parse_sqs_url(url)
    if state is not None:
        return CompanionBackend(url, SqsTransport(settings), settings.levels, state)
    return BrokerBackend(url, SqsTransport(settings), settings.levels)


def _client(settings: SqsSettings, *, tries: int) -> Any:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError

    try:
        session = boto3.session.Session(
            aws_access_key_id=settings.access_key, aws_secret_access_key=settings.secret_key,
            region_name=settings.region, profile_name=settings.profile)
        config = Config(connect_timeout=settings.timeout, read_timeout=settings.timeout,
                        retries={"mode": "standard", "total_max_attempts": tries},
                        max_pool_connections=32)
        return session.client("sqs", endpoint_url=settings.endpoint, config=config)
    except BotoCoreError as exc:
        raise ConfigurationError(f"SQS at {settings.where}: {exc}") from exc


def _lost() -> tuple[type[Exception], ...]:
    """boto3's errors of a request that got no answer."""
    from botocore.exceptions import ConnectionError, HTTPClientError

    return (ConnectionError, HTTPClientError)


def _error(exc: Any) -> tuple[str, str, int]:
    response = exc.response or {}
    error = response.get("Error", {})
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(error.get("Code", "")), str(error.get("Message", "")), status


def _entry(key: str, item: Outgoing, *, fifo: bool = False,
           delayed: bool = False) -> dict[str, Any]:
    """A SendMessageBatch entry: for a standard queue with its delay; for a FIFO lane with its
    group and deduplication id, or (``delayed``) for the lane's delay queue with both kept as
    attributes for the move."""
    entry: dict[str, Any] = {"Id": key, "MessageBody": item.body.decode()}
    if item.delay > 0 and (delayed or not fifo):
        entry["DelaySeconds"] = min(math.ceil(item.delay), MAX_DELAY)
    if not fifo:
        return entry
    group = _digest(item.group) if item.group is not None else uuid.uuid4().hex
    dedup = _digest(item.dedup_id) if item.dedup_id is not None else uuid.uuid4().hex
    if delayed:
        entry["MessageAttributes"] = {
            GROUP_ATTR: {"DataType": "String", "StringValue": group},
            DEDUP_ATTR: {"DataType": "String", "StringValue": dedup}}
    else:
        entry["MessageGroupId"] = group
        entry["MessageDeduplicationId"] = dedup
    return entry


def _digest(text: str) -> str:
    """A group or deduplication id SQS takes (at most 128 characters of a set) for any text:
    its SHA-256 in hex, the same in every process."""
    return hashlib.sha256(text.encode()).hexdigest()


T = TypeVar("T")


def _chunks(items: list[T], size: Callable[[T], int] | None = None) -> Iterator[list[T]]:
    """Batches of at most BATCH messages and BATCH_BYTES of bodies (a bigger body goes alone);
    ``size`` is a message's body size (default: an Outgoing's)."""
    measure: Callable[[Any], int] = size or (lambda item: len(item.body))
    chunk: list[T] = []
    total = 0
    for item in items:
        n = measure(item)
        if chunk and (len(chunk) == BATCH or total + n > BATCH_BYTES):
            yield chunk
            chunk, total = [], 0
        chunk.append(item)
        total += n
    if chunk:
        yield chunk


def _by_url(deliveries: Sequence[Delivery]) -> list[tuple[str, list[int]]]:
    """The deliveries' indexes grouped by queue URL."""
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(deliveries):
        groups.setdefault(d.handle.url, []).append(i)
    return list(groups.items())


def _batches(indexes: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(indexes), BATCH):
        yield indexes[start:start + BATCH]
