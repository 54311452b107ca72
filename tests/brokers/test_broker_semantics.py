"""The job lifecycle on a message broker (BrokerBackend over each transport): what the stores'
conformance suite checks, in the terms a broker can answer. A broker cannot look a job up by
id, so the checks go through claims, the dead lane and the broker's counts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from brokerkit import Broker, alone, wait_for

from conveyor import JobState, LeaseLost, QueueFull, Unsupported
from conveyor.backends.base import Backend, ErrorInfo, Lease, NewJob
from conveyor.backends.broker.core import MAX_STALLS
from conveyor.backends.broker.transport import Lane, Outgoing

Open = Callable[[], Backend]


def job(**kw: object) -> NewJob:
    base: dict[str, object] = {"task": "t.work", "queue": "q", "args": '{"n": 1}',
                               "max_attempts": 3, "timeout": 30.0}
    base.update(kw)
    return NewJob(**base)  # type: ignore[arg-type]


def claim_all(b: Backend, broker: Broker, queue: str = "q", limit: int = 10,
              worker: str = "w1") -> list:
    return b.claim(queue, limit, worker_id=worker, lease_s=broker.lease_s)


def lease(j: object) -> Lease:
    return Lease(j.id, j.lease_token)  # type: ignore[attr-defined]


def claim_soon(b: Backend, broker: Broker, n: int = 1, queue: str = "q",
               timeout: float = 15.0) -> list:
    got: list = []

    def more() -> bool:
        got.extend(claim_all(b, broker, queue, n - len(got)))
        return len(got) >= n

    wait_for(more, timeout)
    return got


def test_enqueue_claim_ack(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    ids = [r.id for r in b.enqueue_many([job(args=json.dumps({"n": i})) for i in range(5)])]
    assert len(set(ids)) == 5 and all(0 < i < 2**63 for i in ids)
    got = claim_soon(b, broker, 5)
    assert sorted(j.id for j in got) == sorted(ids)
    first = got[0]
    assert first.state is JobState.RUNNING and first.attempts == 1 and first.task == "t.work"
    assert first.lease_token and first.worker_id == "w1"
    assert b.ack_many([(lease(j), None) for j in got]) == [True] * 5
    assert claim_all(b, broker) == []
    with pytest.raises(LeaseLost):  # acked already: the lease is gone
        b.ack(lease(first), None)


def test_claim_never_hands_out_more_than_asked(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    b.enqueue_many([job() for _ in range(6)])
    assert len(claim_soon(b, broker, 4)) == 4
    assert len(claim_all(b, broker, limit=4)) <= 2


def test_lower_priority_levels_first(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    b.enqueue_many([job(priority=5, args='{"n": 5}'), job(priority=0, args='{"n": 0}'),
                    job(priority=-7, args='{"n": -7}')])
    wait_for(lambda: b.stats().queues and b.stats().queues[0].available == 3)
    got = claim_all(b, broker)
    # Lanes -1, 0, 1 by default: a priority runs in its nearest lane, lowest lane first.
    assert [j.args["n"] for j in got] == [-7, 0, 5]
    assert [j.priority for j in got] == [-7, 0, 5]


def test_delay_is_held_by_the_broker(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    start = time.time()
    b.enqueue_many([job(delay=1.5)])
    assert claim_all(b, broker) == []
    (got,) = claim_soon(b, broker)
    assert time.time() - start >= 1.5 - 0.06  # EARLY: a message this close runs at once
    assert got.attempts == 1


def test_retry_counts_the_attempt_and_keeps_the_error(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    b.enqueue_many([job(max_attempts=3)])
    (j1,) = claim_soon(b, broker)
    state = b.retry(lease(j1), ErrorInfo("exception", "boom", "ValueError"), delay=0.3)
    assert state is JobState.SCHEDULED
    with pytest.raises(LeaseLost):  # settled by the retry
        b.ack(lease(j1), None)
    (j2,) = claim_soon(b, broker)
    assert j2.id == j1.id and j2.attempts == 2
    assert [(e["attempt"], e["kind"], e["message"]) for e in j2.errors] == [
        (1, "exception", "boom")]
    assert b.retry(lease(j2), ErrorInfo("exception", "again"), delay=0) is JobState.AVAILABLE
    (j3,) = claim_soon(b, broker)
    assert j3.attempts == 3
    # The last attempt's retry goes dead.
    assert b.retry(lease(j3), ErrorInfo("exception", "last"), delay=0) is JobState.DEAD
    (dead,) = wait_for(lambda: b.list_jobs(state=JobState.DEAD, queue="q").jobs)
    assert dead.id == j1.id and dead.state is JobState.DEAD
    assert [e["message"] for e in dead.errors] == ["boom", "again", "last"]


def test_kill_list_redrive_purge(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    b.enqueue_many([job(args=json.dumps({"n": i})) for i in range(3)])
    got = claim_soon(b, broker, 3)
    for j in got:
        b.kill(lease(j), ErrorInfo("rejected", f"no {j.args['n']}"))
    page = wait_for(lambda: len(b.list_jobs(state=JobState.DEAD, queue="q").jobs) == 3
                    and b.list_jobs(state=JobState.DEAD, queue="q"))
    jobs = page.jobs  # type: ignore[attr-defined]
    assert [j.id for j in jobs] == sorted((j.id for j in got), reverse=True)  # newest first
    assert all(j.finished_at is not None and j.errors[-1]["kind"] == "rejected" for j in jobs)
    # Paged by cursor, as the stores page.
    first = b.list_jobs(state=JobState.DEAD, queue="q", limit=2)
    rest = b.list_jobs(state=JobState.DEAD, queue="q", cursor=first.next_cursor, limit=2)
    assert [j.id for j in first.jobs + rest.jobs] == [j.id for j in jobs]
    assert b.stats().queues[0].dead == 3
    # Redrive one by id: back in its lane with its attempts reset; the others stay dead.
    assert b.redrive([got[0].id], queue="q") == 1
    (again,) = claim_soon(b, broker)
    assert again.id == got[0].id and again.attempts == 1
    b.ack(lease(again), None)
    assert len(b.list_jobs(state=JobState.DEAD, queue="q").jobs) == 2
    assert b.purge(queue="q") in (2, -1)
    wait_for(lambda: b.list_jobs(state=JobState.DEAD, queue="q").jobs == [])


def test_the_dead_count_holds_across_listings_and_redrives(open_broker: Open,
                                                          broker: Broker) -> None:
    """Listing the dead lane takes its messages and gives them back; a count read right after
    (the dashboard lists, then reads stats) must still count them. RabbitMQ applies a give-back
    after it answers the next count, so the give-back waits until the count holds them."""
    b = open_broker()
    b.enqueue_many([job(args=json.dumps({"n": i})) for i in range(4)])
    got = claim_soon(b, broker, 4)
    for j in got:
        b.kill(lease(j), ErrorInfo("rejected", "no"))
    wait_for(lambda: b.stats().queues[0].dead == 4)
    for _ in range(15):
        assert len(b.list_jobs(state=JobState.DEAD, queue="q").jobs) == 4
        assert b.stats().queues[0].dead == 4
    assert b.redrive([got[0].id], queue="q") == 1
    assert b.stats().queues[0].dead == 3


def test_a_holder_that_lost_the_message_is_fenced(open_broker: Open, broker: Broker) -> None:
    zombie, successor = open_broker(), open_broker()
    zombie.enqueue_many([job(max_attempts=5)])
    (old,) = claim_soon(zombie, broker)
    broker.lose(zombie, broker.lease_s)
    (new,) = claim_soon(successor, broker)
    # With a companion store the lost hand-out cost an attempt; alone, one of MAX_STALLS free.
    assert new.id == old.id and new.attempts == (2 if broker.companion else 1)
    # The zombie can neither finish nor fail nor heartbeat the attempt it lost ...
    with pytest.raises(LeaseLost):
        zombie.ack(lease(old), None)
    with pytest.raises(LeaseLost):
        zombie.retry(lease(old), ErrorInfo("exception", "late"), delay=0)
    with pytest.raises(LeaseLost):
        zombie.kill(lease(old), ErrorInfo("exception", "late"))
    assert zombie.heartbeat([lease(old)], lease_s=broker.lease_s) == {old.id}
    # ... and published nothing: the successor's attempt is the only copy.
    assert successor.heartbeat([lease(new)], lease_s=broker.lease_s) == set()
    successor.ack(lease(new), None)
    assert claim_all(successor, broker) == []
    assert successor.list_jobs(state=JobState.DEAD, queue="q").jobs == []


def test_a_claim_that_meets_its_message_again_hands_it_out_once(
        open_broker: Open, broker: Broker) -> None:
    """The holder loses a message in the middle of a claim (after receiving it, before the
    claim's next receive) and the broker hands it to that same claim again. The claim returns
    the job once, as the newer hand-out: the older one's lease went with it, and a worker
    keys its jobs by id (two of one id in a claim ran one attempt twice)."""
    b = open_broker()
    b.enqueue_many([job(max_attempts=5)])
    transport = b.transport  # type: ignore[attr-defined]
    receive = transport.receive
    first: list = []

    def receive_then_lose(lane: Lane, limit: int, *, lease_s: float) -> list:
        got = receive(lane, limit, lease_s=lease_s)
        if got and not first:
            first.extend(got)
            broker.lose(b, broker.lease_s)
            wait_for(lambda: transport.depth(lane).ready == 1)  # the broker has it back
        return got

    transport.receive = receive_then_lose
    jobs = claim_all(b, broker, limit=2)
    assert len(first) == 1
    again = 2 if broker.companion else 1  # alone: a lost hand-out of MAX_STALLS free ones
    assert [(j.id, j.attempts) for j in jobs] == [(json.loads(first[0].body)["id"], again)]
    b.ack(lease(jobs[0]), None)
    assert claim_all(b, broker) == []


def test_lost_hand_outs_use_up_the_attempts(open_broker: Open, broker: Broker) -> None:
    """With a companion store every hand-out the store saw counts (take leased it to a worker).
    A broker alone counts hand-outs, not starts: the first MAX_STALLS it took back are free."""
    b = open_broker()
    b.enqueue_many([job(max_attempts=2)])
    free = 0 if broker.companion else MAX_STALLS
    expected = [1] * (free + 1) + [2]
    for attempt in expected:
        holder = open_broker()
        (j,) = claim_soon(holder, broker)
        assert j.attempts == attempt
        broker.lose(holder, broker.lease_s)
    # The next hand-out has no attempt left: dead, with the expiry recorded. (The broker hands
    # it to the next claimer when it has taken it back: claimed until it shows up dead.)
    other = open_broker()
    claimed: list = []

    def dead_after_claims() -> list:
        claimed.extend(claim_all(other, broker))
        return other.list_jobs(state=JobState.DEAD, queue="q").jobs

    (dead,) = wait_for(dead_after_claims)
    assert claimed == []
    assert dead.errors[-1]["kind"] == "lease_expired" and dead.attempts == 2


def test_release_does_not_count_the_attempt(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    b.enqueue_many([job()])
    (j,) = claim_soon(b, broker)
    assert b.release([lease(j), Lease(12345, "f" * 26)]) == [j.id]
    (again,) = claim_soon(b, broker)
    assert again.id == j.id and again.attempts == 1


def test_heartbeat_keeps_the_lease(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    b.enqueue_many([job()])
    (j,) = claim_soon(b, broker)
    stranger = Lease(j.id, "0" * 26)
    assert b.heartbeat([lease(j), stranger], lease_s=broker.lease_s) == {j.id}
    assert b.heartbeat([lease(j)], lease_s=broker.lease_s) == set()
    b.ack(lease(j), None)


@alone
def test_a_message_that_is_not_a_job_goes_to_the_dead_lane(
        open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    b.transport.publish([Outgoing(Lane("q", 0), b"not json")])  # type: ignore[attr-defined]
    b.enqueue_many([job()])
    (j,) = claim_soon(b, broker)  # the job behind it is still served
    b.ack(lease(j), None)
    wait_for(lambda: b.stats().queues[0].dead == 1)
    assert b.list_jobs(state=JobState.DEAD, queue="q").jobs == []  # not a job: not listed


def test_max_depth_counts_the_broker_queue(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    b.enqueue_many([job(max_depth=3) for _ in range(3)])
    wait_for(lambda: b.stats().queues[0].available == 3)
    with pytest.raises(QueueFull) as info:
        b.enqueue_many([job(max_depth=3)])
    # Named as a store names it, for the app's wait_if_full and the caller's message.
    assert (info.value.queue, info.value.depth, info.value.limit) == ("q", 3, 3)


@alone
@pytest.mark.parametrize("kw,name,capability", [
    ({"unique_key": "k"}, "unique", "deduplicate by unique_key"),
    ({"after": (1,)}, "dependencies", "run jobs after= others"),
    ({"concurrency_key": "c", "concurrency_limit": 1}, "limits", "concurrency or rate limits"),
    ({"fair_key": "tenant"}, "fair", "share a queue fairly"),
])
def test_what_a_broker_cannot_do_is_refused_by_name(
        open_broker: Open, broker: Broker, kw: dict, name: str, capability: str) -> None:
    b = open_broker()
    supported = b.transport.supports  # type: ignore[attr-defined]
    assert (name in b.missing) == (name not in supported)
    if name in supported:
        # The broker does it itself (SQS FIFO): accepted, and the job runs.
        b.enqueue_many([job(**kw)])
        (got,) = claim_soon(b, broker)
        assert getattr(got, next(iter(kw))) == kw[next(iter(kw))]
        b.ack(lease(got), None)
        return
    with pytest.raises(Unsupported, match=capability) as info:
        b.enqueue_many([job(), job(**kw)])
    assert "docs/backends.md" in str(info.value)
    # The way out it names: a companion store for records, a store of jobs for the rest.
    assert ("state=" in str(info.value)) == (info.value.capability == "deduplicate by unique_key")
    assert claim_all(b, broker) == []  # nothing of the batch was written


@alone
def test_prune_refuses_unfinished_states_as_a_store_does(open_broker: Open) -> None:
    b = open_broker()
    with pytest.raises(ValueError, match="finished"):
        b.prune(older_than=0, states=(JobState.SUCCEEDED, JobState.AVAILABLE))
    assert b.prune(older_than=0, states=(JobState.SUCCEEDED, JobState.DEAD)) == 0


@alone
def test_lookups_are_refused_by_name(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    for call, capability in [(lambda: b.get(1), "lookup"), (lambda: b.cancel(1), "cancel"),
                             (lambda: b.list_jobs(), "listing"),
                             (lambda: b.record_step(1, "s", None, uid=None), "steps"),
                             (lambda: b.cron_ticks(), "cron"),
                             (lambda: b.pause_queue("q"), "pause"),
                             (lambda: b.history(since=0, until=1), "history"),
                             (lambda: b.record_history([]), "history"),
                             (lambda: b.get_batch("b"), "dependencies"),
                             (lambda: b.make_due([1]), "run_now")]:
        with pytest.raises(Unsupported):
            call()
        assert capability in b.missing
