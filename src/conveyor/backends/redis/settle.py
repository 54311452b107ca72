"""The fenced calls on leased jobs: heartbeat, ack (alone and in batches), retry, kill and
release. Each checks the lease token in its script, so a repeat is harmless; a repeat refused
after a lost reply is looked at, to tell "my write landed" from "the lease was lost"."""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Sequence
from typing import Any

import redis

from ...errors import LeaseLost, StorageFull, StoreError
from ...job import JobState
from ..base import ErrorInfo, Lease
from .codec import SETTLED_AS, _cut, _error_members
from .core import MAX_CACHED_QUEUES, RedisCore
from .scripts import OOM_SLACK
from .transport import ScriptCall


class SettleMixin(RedisCore):
    def heartbeat(self, leases: Sequence[Lease], *, lease_s: float, now: float | None = None,
                  held: Collection[int] = ()) -> set[int]:
        if not leases:
            return set()
        args: list[Any] = [self._now_arg(now), repr(float(lease_s))]
        for lease in leases:
            args += [lease.job_id, lease.token, "1" if lease.job_id in held else "0"]
        res = self._run("heartbeat", self._guess([lease.job_id for lease in leases]), args,
                        safe=True)
        return {int(i) for i in res[1:]}

    def _settle(self, name: str, lease: Lease, args: Sequence[Any],
                now: float | None) -> list[Any]:
        """A fenced script on one job. Retried on connection errors: the fence makes a repeat
        harmless, and if the repeat is refused we look whether the first one had landed. A
        repeat may also come from the caller (the worker tries an outcome again after a
        StoreUnavailable): a lease whose last call here got no answer is in _unsure, and its
        refusal is looked at the same way, so an ack that landed unseen reports success."""
        tries = 0
        kind = name.partition(":")[0]
        unsure = self._was_unsure(lease)
        if len(self._unsure) > MAX_CACHED_QUEUES:
            self._unsure.clear()
        self._unsure[lease.job_id] = lease.token  # until an answer comes back

        def run(keys: list[str], argv: list[Any]) -> Any:
            nonlocal tries
            tries += 1
            return self._script(name, keys, argv)

        def last() -> Any:
            return self._transport.r.hmget(self.keys.job(lease.job_id),
                                           ["last_token", "last_outcome"])

        qs = self._guess([lease.job_id])
        for _ in range(4):
            keys = list(self.keys.header)
            for q in qs:
                keys += self.keys.block(q)
            argv = [len(qs), *qs, self._now_arg(now), lease.job_id, lease.token, *args]
            tries = 0
            res: list[Any] = self._transport.call(kind, functools.partial(run, keys, argv),
                                                  safe=True)
            if res[0] == "need":
                qs = [*qs, *res[1:]]
                continue
            if res[0] == "lost" and (tries > 1 or unsure):  # resent after a connection error
                token, outcome = self._transport.call("check", last, safe=True)
                if token == lease.token and outcome in SETTLED_AS[kind]:
                    res = ["ok", outcome]
            self._unsure.pop(lease.job_id, None)
            self._forget(lease.job_id)
            return res
        raise StoreError(
            f"Redis at {self._where}: {name} could not find the queue of job {lease.job_id}")

    def _was_unsure(self, lease: Lease) -> bool:
        """Whether a settle of this lease got no answer before (see _settle): a refusal of it
        now may be its own landed write, to be looked at."""
        return self._unsure.get(lease.job_id) == lease.token

    def ack(self, lease: Lease, result: str | None, *, now: float | None = None) -> None:
        res = self._settle("ack", lease, ["0" if result is None else "1", result or ""], now)
        if res[0] != "ok":
            raise LeaseLost(lease.job_id, "ack refused")

    def ack_many(self, acks: Sequence[tuple[Lease, str | None]], *,
                 now: float | None = None) -> list[bool]:
        """The batch in one ack_many script call. Anything unusual (a queue not guessed, an
        error reply, a broken connection) falls back to one careful ack each."""
        if len(acks) < 2:
            return super().ack_many(acks, now=now)
        try:
            replies = self._transport.send_scripts([self._acks_call(acks, now)])
        except (redis.ConnectionError, redis.TimeoutError):
            replies = [None]  # it may have landed: the fallback checks each
        return self._acks_held(acks, replies[0], now)

    def _acks_call(self, acks: Sequence[tuple[Lease, str | None]],
                   now: float | None) -> ScriptCall:
        """One ack_many call for the batch, with the blocks of every queue its jobs may be
        in."""
        qs: list[str] = []
        queue_of = self._queue_of  # (what _guess reads, without a list per ack)
        for lease, _ in acks:
            q = queue_of.get(lease.job_id)
            if q is not None and q not in qs:
                qs.append(q)
        keys = list(self.keys.header)
        for q in qs:
            keys += self.keys.block(q)
        argv: list[Any] = [len(qs), *qs, self._now_arg(now)]
        for lease, result in acks:
            argv += [lease.job_id, lease.token, "0" if result is None else "1", result or ""]
        return "ack_many", keys, argv

    def _acks_held(self, acks: Sequence[tuple[Lease, str | None]], reply: Any,
                   now: float | None) -> list[bool]:
        """ack_many's replies as held or not; any ack it could not settle is acked on its
        own."""
        if not (isinstance(reply, list) and len(reply) == len(acks)):
            reply = [None] * len(acks)  # an error reply, or none: it may have landed
            for lease, _ in acks:  # until each is answered (see _settle)
                self._unsure[lease.job_id] = lease.token
        if not self._unsure and reply.count("ok") == len(reply):
            # The usual answer: every ack held, and no earlier settle of ours went unanswered.
            forget = self._queue_of.pop
            for lease, _ in acks:
                forget(lease.job_id, None)
            return [True] * len(acks)
        held: list[bool] = []
        for (lease, result), r in zip(acks, reply, strict=True):
            if r == "ok" or (r == "lost" and not self._was_unsure(lease)):
                self._unsure.pop(lease.job_id, None)
                self._forget(lease.job_id)
                held.append(r == "ok")
            else:
                # 'need:<queue>' (nothing done), unknown, or refused after a lost reply:
                # looked at
                held.append(self._ack_or_landed(lease, result, now))
        return held

    def _ack_or_landed(self, lease: Lease, result: str | None, now: float | None) -> bool:
        try:
            self.ack(lease, result, now=now)
            return True
        except LeaseLost:
            # A pipelined try may have landed before the connection broke.
            def last() -> Any:
                return self._transport.r.hget(self.keys.job(lease.job_id), "last_token")

            return bool(self._transport.call("check", last, safe=True) == lease.token)

    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float,
              now: float | None = None) -> JobState:
        d = float(delay)
        if math.isnan(d) or math.isinf(d):
            raise ValueError(f"retry delay must be a finite number of seconds, got {delay!r}")
        res = self._settle_error("retry", lease, [repr(max(d, 0.0))], error, now)
        if res[0] != "ok":
            raise LeaseLost(lease.job_id, "retry refused")
        return JobState(res[1])

    def _settle_error(self, name: str, lease: Lease, args: Sequence[Any], error: ErrorInfo,
                      now: float | None) -> list[Any]:
        """retry or kill with the error as its last argument. One bigger than OOM_SLACK is sent
        by the strict script first; refused at maxmemory (before it ran), it goes again cut to
        fit, so a full Redis still records the outcome, and grows by at most OOM_SLACK."""
        members = _error_members(error)
        if len(members) <= OOM_SLACK:
            return self._settle(name, lease, [*args, members], now)
        try:
            return self._settle(f"{name}:strict", lease, [*args, members], now)
        except StorageFull as exc:
            if "maxmemory" not in str(exc):
                raise  # MISCONF (a disk full): the cut error would be refused too
        return self._settle(name, lease, [*args, _error_members(_cut(error))], now)

    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        res = self._settle_error("kill", lease, [], error, now)
        if res[0] != "ok":
            raise LeaseLost(lease.job_id, "kill refused")

    def release(self, leases: Sequence[Lease], *, now: float | None = None) -> list[int]:
        if not leases:
            return []
        args: list[Any] = [self._now_arg(now)]
        for lease in leases:
            args += [lease.job_id, lease.token]
        res = self._run("release", self._guess([lease.job_id for lease in leases]), args,
                        safe=True)
        released = [int(i) for i in res[1:]]
        for i in released:
            self._forget(i)
        return released
