"""Redis Cluster (``redis+cluster://``): the URL, a client pointed at the wrong node, and the
app's slot moved or its node failed over while a producer enqueues and a worker drains.

The cluster is the session's (``redis_cluster``: 3 masters, 3 replicas on loopback, started by
the tests); each test takes a fresh prefix, so a slot of its own, and leaves the cluster healthy.
The conformance files run on it in on_cluster/.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from clusterload import Load
from clusterrig import LocalCluster, Node, wait_until
from redisrig import RedisServer

import conveyor.backends.redis.transport as redis_transport
from conveyor import ConfigurationError, JobState, StoreError, StoreUnavailable
from conveyor.backends import open_backend
from conveyor.backends.base import ErrorInfo, Lease, NewJob
from conveyor.backends.redis import RedisBackend, _exposure_warnings, parse_redis_url
from conveyor.backends.redis.cluster import node_url, seeds_of
from conveyor.backends.redis.keys import Keys
from conveyor.backends.redis.partitions import queue_partition
from conveyor.backends.redis.scripts import BARE_SCRIPTS, SCRIPT_NAMES
from conveyor.testing import temporary_store


def job(queue: str = "q") -> NewJob:
    return NewJob(task="t", queue=queue, args="{}", max_attempts=3, timeout=30.0)


def fresh_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def open_cluster(url: str) -> RedisBackend:
    b = open_backend(url)
    assert isinstance(b, RedisBackend) and b._transport.route is not None
    return b


# -- the URL ---------------------------------------------------------------------------------
def test_a_cluster_url_lists_its_seeds_and_keeps_its_options() -> None:
    options = "?prefix=app&ssl_cert_reqs=none"
    url = f"rediss+cluster://user:p%40ss@10.0.0.1:7000,[::1]:7001,node3/{options}"
    assert seeds_of(url) == [("10.0.0.1", 7000), ("::1", 7001), ("node3", 6379)]
    assert node_url(url, "::1", 7001) == f"rediss://user:p%40ss@[::1]:7001/0{options}"
    prefix, rest, _ = parse_redis_url(url)
    assert prefix == "app" and rest.startswith("rediss+cluster://") and "prefix" not in rest


def test_exposure_warnings_look_at_every_seed() -> None:
    """A cluster off this machine without TLS or a password is warned about like one server;
    one seed off the machine is enough."""
    assert _exposure_warnings("redis+cluster://127.0.0.1:7000,localhost:7001/", "x") == []
    found = _exposure_warnings("redis+cluster://127.0.0.1:7000,10.0.0.2:7001/", "x")
    assert len(found) == 2 and "TLS" in found[0] and "password" in found[1]
    assert _exposure_warnings("rediss+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001/", "x") == []


@pytest.mark.parametrize("url", [
    "redis+cluster://127.0.0.1:7000/3",
    "redis+cluster://127.0.0.1:7000/?db=2",
    "redis+cluster://127.0.0.1:7000,:7001/",
    "redis+cluster://127.0.0.1:notaport/",
])
def test_a_cluster_url_that_cannot_work_is_refused_when_opened(url: str) -> None:
    """A cluster has database 0 only (SELECT of another is refused on every node): said at
    open, not at the first call."""
    with pytest.raises(ConfigurationError) as err:
        open_backend(url)
    if "/3" in url or "db=" in url:
        assert "database 0" in str(err.value)


def test_a_cluster_url_naming_a_standalone_server_says_so(private_redis: RedisServer) -> None:
    b = open_backend(f"redis+cluster://127.0.0.1:{private_redis.port}/?prefix=x")
    try:
        with pytest.raises(StoreError, match="not a Redis Cluster node"):
            b.enqueue_many([job()])
    finally:
        b.close()


def test_every_script_that_reaches_past_its_keys_declares_a_key_never_made() -> None:
    """Scripts touch keys they do not declare (job:<id>, conc:<key>, ...), made from a prefix
    key they do declare ("{P}:job:"), which itself never exists. While a slot migrates, Redis
    runs a script on the source only if every key it declares is there, and answers TRYAGAIN
    (or ASK, then TRYAGAIN on the target) otherwise: with a key that never exists among them,
    no script runs mid-migration, where one could fail at a key already moved after writing
    others. The scripts without such a key touch only the keys they declare (see their Lua)."""
    k = Keys("app")
    own = {"enqueue_one": k.enqueue_one("q"), "get": k.get(1), "lock": [k.lock("x")],
           "unlock": [k.lock("x")], "count_waiter": [k.waiters(1), k.waiters_anywhere()],
           "history_record": k.history(), "history_rollup": k.history()}
    without = set()
    for script in {name.partition(":")[0] for name in (*SCRIPT_NAMES, *BARE_SCRIPTS)}:
        declared = own.get(script, [*k.header, *k.block("q")])
        if not (len(declared) > 1 and any(key.endswith(":") for key in declared)):
            without.add(script)
    assert without == {"get", "lock", "unlock", "count_waiter"}


def test_a_temporary_store_on_a_cluster(redis_cluster: LocalCluster, tmp_path: Path) -> None:
    """conveyor.testing's temporary_store takes a cluster URL: a fresh prefix, its keys
    deleted afterwards from the node that serves its slot."""
    with temporary_store(redis_cluster.url("ignored").split("?")[0], tmp_path) as url:
        b = open_cluster(url)
        try:
            b.enqueue_many([job()])
        finally:
            b.close()
        prefix = parse_redis_url(url)[0]
        owner = redis_cluster.owner(redis_cluster.slot_of(prefix))
        assert _keys(owner, prefix)
    assert not _keys(owner, prefix)


def _keys(node: Node, prefix: str) -> list[str]:
    c = node.client()
    try:
        return list(c.scan_iter(match="{" + prefix + "}*", count=1000))
    finally:
        c.close()


# -- a client pointed at the wrong node --------------------------------------------------------
def test_a_client_pointed_at_nodes_that_do_not_own_the_slot_works(
        redis_cluster: LocalCluster) -> None:
    """Seeds that are a master of other slots, a replica, and a dead address: the owner is found
    from the map, and when the route is wrong anyway (a map gone stale), MOVED brings it back,
    on every kind of connection (pooled commands, scripts, the idle wait, the loop claims)."""
    prefix = fresh_prefix()
    slot = redis_cluster.slot_of(prefix)
    owner = redis_cluster.owner(slot)
    other = redis_cluster.other_master(owner)
    [replica] = redis_cluster.replicas_of(other)
    dead = f"127.0.0.1:{_closed_port()}"
    url = f"redis+cluster://{dead},{other.addr},{replica.addr}/?prefix={prefix}"
    b = open_cluster(url)
    try:
        [r] = b.enqueue_many([job()])
        assert b._transport.route.address == ("127.0.0.1", owner.port)
        assert b._transport.redirects["MOVED"] == 0  # found from the map, not by a MOVED

        # A stale map: the route at another master. Each kind of call finds its way back.
        for call in (lambda: b.get(r.id), lambda: b.enqueue_many([job()]), lambda: b.stats(),
                     lambda: b.wait_for_jobs(["empty"], 0.05),
                     lambda: b.claim("q", 1, worker_id="w", lease_s=30)):
            moved = b._transport.redirects["MOVED"]
            b._transport.route.move("127.0.0.1", other.port)
            call()
            assert b._transport.redirects["MOVED"] == moved + 1
            assert b._transport.route.address == ("127.0.0.1", owner.port)
        assert b.get(r.id).state == JobState.RUNNING
    finally:
        b.close()
    redis_cluster.delete_prefix(prefix)


def test_a_worker_follows_a_stale_route_back(redis_cluster: LocalCluster) -> None:
    """A worker (its loop claims and idle waits included) whose route is moved to a wrong node
    while it runs keeps running jobs."""
    prefix = fresh_prefix()
    owner = redis_cluster.owner(redis_cluster.slot_of(prefix))
    other = redis_cluster.other_master(owner)
    load = Load(redis_cluster.url(prefix), redis_cluster.url(prefix)).start()
    try:
        load.wait_acked(50)
        worker = load.backend(load.worker_app)._transport
        moved = worker.redirects["MOVED"]
        worker.route.move("127.0.0.1", other.port)
        load.wait_acked(50)
        load.finish()
        assert worker.redirects["MOVED"] > moved
        assert worker.route.address == ("127.0.0.1", owner.port)
        assert load.unrun() == [] and load.duplicates() == 0
    finally:
        load.close()
    redis_cluster.delete_prefix(prefix)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the slot moved: each step ---------------------------------------------------------------
def test_mid_migration_reads_follow_ask_and_scripts_wait(redis_cluster: LocalCluster,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped halfway through a migration (the slot IMPORTING on the target, MIGRATING on the
    source, one job's keys moved): a read of the moved job follows ASK to the target (script and
    plain command alike), while a write is answered TRYAGAIN and sent again until the call's
    retry budget runs out, then reported as not done, and nothing was written. When the move
    ends, MOVED takes the backend to the new owner."""
    monkeypatch.setattr(redis_transport, "RETRY_BUDGET", 0.3)
    prefix = fresh_prefix()
    slot = redis_cluster.slot_of(prefix)
    src = redis_cluster.owner(slot)
    dst = redis_cluster.other_master(src)
    b = open_cluster(redis_cluster.url(prefix))
    try:
        [r] = b.enqueue_many([job()])
        [claimed] = b.claim("q", 1, worker_id="w", lease_s=30)
        b.retry(Lease(r.id, claimed.lease_token or ""), ErrorInfo("exception", "boom"), delay=60)
        b.cron_enqueue("tick", 1.0, None)
        before = b.get(r.id)

        redis_cluster.begin_migration(slot, dst)
        redis_cluster.migrate_keys(src, dst, [b.keys.job(r.id), b.keys.errors(r.id),
                                              b.keys.cron])
        c = dst.client()
        try:
            c.script_flush()  # so the target does not have get.lua: loaded there on the way
        finally:
            c.close()
        assert b.get(r.id) == before  # get.lua: both its keys moved, so ASK, then it runs there
        assert b.cron_ticks() == {"tick": 1.0}  # a plain HGETALL of a moved key
        assert b._transport.redirects["ASK followed"] == 2
        with pytest.raises(StoreUnavailable, match="nothing was done"):
            b.enqueue_many([job()])
        assert b._transport.redirects["TRYAGAIN"] >= 2

        c = src.client()
        try:
            rest = c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        finally:
            c.close()
        redis_cluster.migrate_keys(src, dst, rest)
        redis_cluster.end_migration(slot, dst)
        assert b.get(r.id) == before
        assert b._transport.redirects["MOVED"] == 1
        assert b._transport.route.address == ("127.0.0.1", dst.port)
        assert [j.id for j in b.list_jobs(limit=10).jobs] == [r.id]  # the refused one: absent
    finally:
        b.close()
    redis_cluster.delete_prefix(prefix)


# -- the slot moved under load -----------------------------------------------------------------
def test_the_apps_slot_migrated_under_load_loses_nothing(redis_cluster: LocalCluster) -> None:
    """The app's slot moved to another master as redis-cli --cluster reshard does (IMPORTING,
    MIGRATING, MIGRATE in batches, SETSLOT NODE) while a producer enqueues and a worker drains:
    scripts sent mid-migration are answered TRYAGAIN (or ASK, then TRYAGAIN: see
    test_every_script_...) and sent again, plain reads follow ASK, and MOVED takes every
    connection to the new owner. Lost 0, every job succeeded, no duplicate: a redirected call
    did not run, so nothing ran twice. An idle waiter of its own follows too."""
    prefix = fresh_prefix()
    slot = redis_cluster.slot_of(prefix)
    src = redis_cluster.owner(slot)
    dst = redis_cluster.other_master(src)
    url = redis_cluster.url(prefix)
    load = Load(url, url).start()
    waiter = open_cluster(url)
    woken: list[bool] = []
    idle = threading.Thread(target=lambda: woken.append(waiter.wait_for_jobs(["idle"], 60)))
    try:
        load.wait_acked(150)
        idle.start()
        producer = load.backend(load.producers[0].app)._transport

        def first_batch_seen() -> None:
            # After the first batch the app's keys are on both nodes: wait until the producer
            # has met it at least once, so the mixed state is exercised, not just passed over.
            if not getattr(first_batch_seen, "done", False):
                first_batch_seen.done = True  # type: ignore[attr-defined]
                wait_until(lambda: producer.redirects["TRYAGAIN"] + producer.redirects["ASK"]
                           + producer.redirects["ASK followed"] > 0, 10,
                           "the producer to meet the migration")

        moved_keys = redis_cluster.migrate_slot(slot, dst, batch=20, between=first_batch_seen)
        assert redis_cluster.owner(slot) is dst
        load.wait_acked(150)
        # The idle waiter, on a queue of its own, is woken by a job enqueued after the move.
        other = open_cluster(url)
        try:
            other.enqueue_many([job("idle")])
        finally:
            other.close()
        idle.join(30)
        load.finish()

        assert moved_keys > 150
        assert load.unrun() == []
        for p in load.producers:
            assert load.states(p) == {"succeeded": len(p.acked)}, p.errors[-3:]
            assert not p.unsure, p.errors[-3:]
        assert load.duplicates() == 0
        redirects = load.redirects()
        assert redirects["MOVED"] >= 2, redirects  # the producer's and the worker's
        for app in (load.worker_app, *[p.app for p in load.producers]):
            assert load.backend(app)._transport.route.address == ("127.0.0.1", dst.port)
        assert woken == [True]
        assert waiter._transport.route.address == ("127.0.0.1", dst.port)
        # Every key is on the new owner; none is a prefix key (they are never made).
        c = dst.client()
        try:
            keys = list(c.scan_iter(match="{" + prefix + "}*", count=1000))
        finally:
            c.close()
        assert keys and not [k for k in keys if k.endswith(":")]
    finally:
        load.close()
        waiter.close()
        if idle.is_alive():
            idle.join(5)
    redis_cluster.delete_prefix(prefix)


# -- the app's node failed over under load -----------------------------------------------------
def test_a_manual_failover_under_load_loses_nothing(redis_cluster: LocalCluster) -> None:
    """CLUSTER FAILOVER on the replica of the app's master: the master holds writes until the
    replica has caught up, then the replica takes over and the old master answers MOVED. Lost 0,
    every job succeeded and none ran twice, as with a migration."""
    prefix = fresh_prefix()
    slot = redis_cluster.slot_of(prefix)
    master = redis_cluster.owner(slot)
    [replica] = redis_cluster.replicas_of(master)
    url = redis_cluster.url(prefix)
    load = Load(url, url).start()
    try:
        load.wait_acked(150)
        redis_cluster.manual_failover(replica)
        wait_until(lambda: redis_cluster.owner(slot) is replica, 20, "the replica to own the slot")
        load.wait_acked(150)
        load.finish()
        assert load.unrun() == []
        for p in load.producers:
            assert load.states(p) == {"succeeded": len(p.acked)}, p.errors[-3:]
        assert load.duplicates() == 0
        # Every backend went over, by a MOVED from the demoted master, or (a blocked pop's
        # connection, which the demotion closes) by asking the cluster again.
        for app in (load.worker_app, *[p.app for p in load.producers]):
            assert load.backend(app)._transport.route.address == ("127.0.0.1", replica.port)
    finally:
        load.close()
    redis_cluster.wait_healthy()
    redis_cluster.delete_prefix(prefix)


def test_a_partitioned_app_loses_nothing_when_one_partition_moves_and_another_fails_over(
        redis_cluster: LocalCluster) -> None:
    """One app of three partitions under load on a queue of each: partition 0's slot is
    migrated to another master, then partition 1's master is failed over to its replica. The
    other partitions go on meanwhile; each partition's backend follows its own slot. Lost 0,
    every job succeeded, none ran twice."""
    prefix = fresh_prefix()
    url = redis_cluster.url(prefix, query="&partitions=3")
    queues: dict[int, str] = {}
    i = 0
    while len(queues) < 3:
        queues.setdefault(queue_partition(f"q{i}", 3), f"q{i}")
        i += 1
    load = Load(url, url, queues=tuple(queues.values())).start()
    try:
        load.wait_acked(150)
        slot0 = redis_cluster.slot_of(f"{prefix}#0")
        dst = redis_cluster.other_master(redis_cluster.owner(slot0))
        assert redis_cluster.migrate_slot(slot0, dst, batch=20) > 0
        assert redis_cluster.owner(slot0) is dst
        load.wait_acked(150)
        slot1 = redis_cluster.slot_of(f"{prefix}#1")
        [replica] = redis_cluster.replicas_of(redis_cluster.owner(slot1))
        redis_cluster.manual_failover(replica)
        wait_until(lambda: redis_cluster.owner(slot1) is replica, 20,
                   "the replica to own partition 1's slot")
        load.wait_acked(150)
        load.finish()
        assert load.unrun() == []
        for p in load.producers:
            assert load.states(p) == {"succeeded": len(p.acked)}, p.errors[-3:]
        assert load.duplicates() == 0
        done = {q.queue: q.succeeded for q in load.worker_app.backend.stats().queues}
        assert all(done.get(q, 0) > 0 for q in queues.values()), done
        assert load.redirects()["MOVED"] >= 2
    finally:
        load.close()
    redis_cluster.wait_healthy()
    for p in range(3):
        redis_cluster.delete_prefix(f"{prefix}#{p}")


def test_the_same_app_from_every_node(redis_cluster: LocalCluster) -> None:
    """Each node as the only seed: the same app, whichever node the client starts from."""
    prefix = fresh_prefix()
    ids = []
    for node in redis_cluster.nodes:
        b = open_cluster(redis_cluster.url(prefix, seeds=[node]))
        try:
            ids += [r.id for r in b.enqueue_many([job()])]
            assert sorted(j.id for j in b.list_jobs(limit=100).jobs) == sorted(ids)
        finally:
            b.close()
    redis_cluster.delete_prefix(prefix)


def test_a_master_killed_under_load_fails_over(redis_cluster: LocalCluster) -> None:
    """SIGKILL of the app's master under load: its replica is promoted (after
    cluster-node-timeout and an election) and every backend finds it by asking the other nodes
    again. Replication is asynchronous, so a write the master acknowledged in the last moment
    before the kill may never have reached the replica: two producers side by side, one whose
    enqueues wait for a replica (wait_replicas=1: WAIT after the script), one whose do not.
    The first loses nothing it was told was enqueued; the second's losses are measured (on
    loopback, with little replication lag, usually none) and only bounded by what the master
    acknowledged and had not yet sent. Duplicates come from acks and claims lost the same way:
    at most the jobs running plus one batch of acks, 2 x concurrency. The killed node is started
again once its replica has taken over, and rejoins as the new master's replica."""
    prefix = fresh_prefix()
    slot = redis_cluster.slot_of(prefix)
    master = redis_cluster.owner(slot)
    [replica] = redis_cluster.replicas_of(master)
    url = redis_cluster.url(prefix)
    load = Load(url, url + "&wait_replicas=1", url, concurrency=4).start()
    try:
        load.wait_acked(150)
        master.kill()
        wait_until(lambda: redis_cluster.owner(slot) is replica, 30, "the replica to take over")
        # The killed node back, as the replica of the new master (until then the new master
        # has no replica, and every waited enqueue is reported unsure after its WAIT).
        redis_cluster.restart(master)
        redis_cluster.wait_healthy()
        load.wait_acked(150)
        load.finish(lost_ok=True)
        waited, unwaited = load.producers
        assert not [n for n in load.unrun() if n in waited.acked]
        assert load.states(waited) == {"succeeded": len(waited.acked)}, waited.errors[-3:]
        lost = [n for n in load.unrun() if n in unwaited.acked]
        states = load.states(unwaited)
        assert states["succeeded"] + states["gone"] == len(unwaited.acked)
        assert states["gone"] >= len(lost)
        assert load.duplicates() <= 2 * 4
        for app in (load.worker_app, *[p.app for p in load.producers]):
            assert load.backend(app)._transport.route.address == ("127.0.0.1", replica.port)
        print(f"\nSIGKILL failover: acknowledged {len(waited.acked)} with wait_replicas=1 (lost "
              f"0), {len(unwaited.acked)} without (lost {len(lost)}, ids holding another job "
              f"or none {states['gone']}); unsure {len(waited.unsure) + len(unwaited.unsure)}; "
              f"duplicates {load.duplicates()}")
    finally:
        load.close()
        if not master.alive():
            redis_cluster.restart(master)
        redis_cluster.wait_healthy()
    redis_cluster.delete_prefix(prefix)


def test_an_enqueue_no_replica_confirmed_is_reported(private_redis: RedisServer) -> None:
    """wait_replicas=N: an enqueue returns once N replicas have it (WAIT, up to half the socket
    timeout). A server without replicas: written on the primary, but reported as unsure, since
    a failover now could lose it. (Standalone servers with replicas, under Sentinel, take the
    option too.)"""
    url = f"{private_redis.url}&wait_replicas=1&socket_timeout=0.4"
    b = open_backend(url)
    try:
        with pytest.raises(StoreUnavailable, match="0 of 1 replicas"):
            b.enqueue_many([job()])
        assert len(b.list_jobs(limit=10).jobs) == 1  # it is there, on the primary only
        [claimed] = b.claim("q", 1, worker_id="w", lease_s=30)  # other scripts do not wait
        b.ack(Lease(claimed.id, claimed.lease_token or ""), None)
    finally:
        b.close()


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_wait_replicas_must_be_a_count(value: str) -> None:
    with pytest.raises(ConfigurationError, match="wait_replicas"):
        open_backend(f"redis://127.0.0.1:1/0?wait_replicas={value}")
