"""The key layout of a Conveyor store in Redis, in one table (as BullMQ's queue-keys.ts).

Every key is ``{prefix}:<suffix>``; the braces are the Redis Cluster hash tag, so all keys of
one app, and every key a script makes by appending an id or a name to a prefix key, land in
one slot. The scripts get their keys in KEYS (so Cluster can route them) in the order of the
tables below, and never count positions themselves: ``lua_layout`` writes, into each script
at load, a table from each name to its KEYS[i]. Adding a key or a job state is one line here.

A prefix key (a suffix ending in ':') is never created itself. On Redis Cluster that keeps
scripts from running while the app's slot migrates: Redis runs a script there only if every
key it declares is present, and a script that reaches past its KEYS (to P:job:<id>, ...)
could otherwise fail halfway at a key already moved. So a script that does so declares a
prefix key (docs/redis.md, "Slot migrations"; tests/redis/test_redis_cluster.py checks it).
docs/redis.md and the top of ``lua/_common.lua`` say what each key holds.
"""

from __future__ import annotations

from collections.abc import Sequence

# The job states that have index sets (P:state:<state>, P:q:<queue>:<state>).
STATES = ("scheduled", "available", "running", "succeeded", "dead", "cancelled", "waiting")
FINAL_STATES = ("succeeded", "dead", "cancelled")

# The store-wide keys every script of the shared prelude (_common.lua) gets, in this order
# (its KEYS header): name in the scripts -> suffix after "{prefix}:". A suffix ending in ':' is
# a prefix key, to which the script appends an id or a concurrency or rate key.
STORE_KEYS: dict[str, str] = {
    "job": "job:",
    "errors": "errors:",
    "jobs": "jobs",
    **{f"state:{s}": f"state:{s}" for s in STATES},
    "unique": "unique",
    "expiries": "expiries",
    "queues": "queues",
    "ids": "ids",
    "workers": "workers",
    "seen": "seen",
    "cron": "cron",
    # Cron controls, HASHes by schedule name (beside cron, the last tick taken): cron:jobs the
    # id of the job of the latest tick that made one, cron:off when a disabled schedule was
    # disabled, cron:on when it was last enabled again (ticks before that are skipped).
    "cron_jobs": "cron:jobs",
    "cron_off": "cron:off",
    "cron_on": "cron:on",
    "conc": "conc:",
    "rate": "rate:",
    "leases": "leases",
    "schedule": "schedule",
    # One ZSET per final state of every finished job across queues, member id/queue, score =
    # finished_at: prune reads only the due head.
    **{f"done:{s}": f"done:{s}" for s in FINAL_STATES},
    # job.wait: wait:<id> counts the waiters of a job (the client sets it, with a TTL), and
    # wait:<id>:done is the list a finish pushes one mark per waiter to; wait:any counts all.
    "wait": "wait:",
    # Workflows (backends/base.py, "Dependencies"): kids:<id> is a ZSET of the job's children,
    # score 0 while the edge is unsettled (the parent has not finished since the child was
    # written), 1 once settled; batch:<batch id> a HASH of the batch (created_at, parent_id,
    # on_success, on_complete); members:<batch id> a SET of its members' ids, nested batches'
    # members and callbacks included.
    "kids": "kids:",
    "batch": "batch:",
    "members": "members:",
    # Paused queues (backends/base.py, "Pausing a queue"): a HASH queue -> paused since (unix
    # seconds). claim.lua claims nothing of a queue named here; look.lua passes over it.
    "paused": "paused",
    # A broker companion's outbox (Backend.outbox_sweep): a ZSET of the jobs whose message the
    # broker has not confirmed, score = since when. Written only while Backend.outbox is on.
    "outbox": "outbox",
}

# Each queue's keys, "{prefix}:q:<queue>:<name>", in the order of a script's block for the
# queue (after the header): one index set per state, then the rest.
QUEUE_KEYS: tuple[str, ...] = (*STATES, "jobs", "wake", "fair", "due", "inbox")

# Keys only the client uses (never in a script's KEYS): name -> suffix after "{prefix}:".
# Besides these: lock:<name> (try_lock) and wake:<random> (a backend's private wake list).
CLIENT_KEYS: dict[str, str] = {
    # Set once every queue's own running and scheduled sets were swept into the global ones
    # (P:leases, P:schedule): a store written before those existed has no such key.
    "indexed": "indexed",
    # Set once every queue's own finished sets were copied into the done:<state> ZSETs.
    "indexed_done": "indexed:done",
    "maintenance": "lock:maintenance",
}

# The scripts that skip the shared prelude name their own few keys (K in lua_layout):
# enqueue_one.lua the ones the one-job path writes (of STORE_KEYS, then "q:<name>" of the job's
# queue's QUEUE_KEYS), get.lua a job's own hash and error list, lock.lua and unlock.lua the lock.
ENQUEUE_ONE_KEYS = ("job", "jobs", "state:available", "queues", "ids", "q:available", "q:jobs",
                    "q:wake", "q:fair", "q:due", "q:inbox")
GET_KEYS = ("job", "errors")
# look.lua: its own two keys, then four of each queue's block (a lean read of many queues).
LOOK_KEYS = ("paused", "conc")
LOOK_QUEUE_KEYS = ("inbox", "available", "scheduled", "fair")
_LOOK_AT = tuple(QUEUE_KEYS.index(name) for name in LOOK_QUEUE_KEYS)
LOCK_KEYS = ("lock",)
WAITER_KEYS = ("waiters", "anywhere")  # count_waiter.lua: P:wait:<id>, P:wait:any
# History (backends/history.py), the keys of history_record.lua and history_rollup.lua, in this
# order: name -> suffix after "{prefix}:". hist:m:<minute> is a HASH of one minute's counts,
# a field per count and queue ("processed:<queue>", ...), hist:h:<hour> the same for an hour;
# hist:minutes and hist:hours are ZSETs of the buckets that exist (score = member = start).
HISTORY_KEYS: dict[str, str] = {
    "minutes": "hist:minutes",
    "minute": "hist:m:",
    "hours": "hist:hours",
    "hour": "hist:h:",
}


# A partitioned app (partitions.py): partition p, hash tag {prefix#p}, makes the job ids
# n * ID_STRIDE + p (new_id in lua/_core.lua reads p from the tag), so an id names its partition.
ID_STRIDE = 1024

_MAX_BLOCKS = 16_384  # queues whose blocks Keys keeps made (a worker on more remakes them)


class Keys:
    """The keys of one app (``prefix``), built from the tables above."""

    def __init__(self, prefix: str) -> None:
        p = "{" + prefix + "}"
        self.p = p
        store = {name: f"{p}:{suffix}" for name, suffix in STORE_KEYS.items()}
        self.store = store
        self.header = list(store.values())  # the KEYS header of the prelude's scripts
        self.job_prefix, self.all_jobs = store["job"], store["jobs"]
        self.queues, self.ids, self.cron = store["queues"], store["ids"], store["cron"]
        self.leases, self.schedule = store["leases"], store["schedule"]
        self.indexed = f"{p}:{CLIENT_KEYS['indexed']}"
        self.indexed_done = f"{p}:{CLIENT_KEYS['indexed_done']}"
        self.maintenance = f"{p}:{CLIENT_KEYS['maintenance']}"
        self._blocks: dict[str, tuple[str, ...]] = {}  # queue -> block(queue)
        self._look: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # see look()

    def job(self, job_id: int) -> str:
        return f"{self.store['job']}{job_id}"

    def waiters(self, job_id: int) -> str:
        return f"{self.store['wait']}{job_id}"

    def waiters_anywhere(self) -> str:
        return f"{self.store['wait']}any"

    def done(self, job_id: int) -> str:
        return f"{self.store['wait']}{job_id}:done"

    def errors(self, job_id: int) -> str:
        return f"{self.store['errors']}{job_id}"

    def queue(self, queue: str, what: str) -> str:
        return f"{self.p}:q:{queue}:{what}"

    def block(self, queue: str) -> list[str]:
        """The queue's keys as a script's block for it (QUEUE_KEYS), a list of the caller's
        own. Made once per queue: a busy worker asks for its queue's twice a claim."""
        block = self._blocks.get(queue)
        if block is None:
            if len(self._blocks) >= _MAX_BLOCKS:
                self._blocks.clear()
            block = self._blocks[queue] = tuple(self.queue(queue, what) for what in QUEUE_KEYS)
        return list(block)

    def state(self, state: str) -> str:
        return self.store[f"state:{state}"]

    def done_index(self, state: str) -> str:
        """P:done:<state>: the finished jobs of one final state across queues."""
        return self.store[f"done:{state}"]

    def lock(self, name: str) -> str:
        return f"{self.p}:lock:{name}"

    def history(self) -> list[str]:
        """The history scripts' KEYS (HISTORY_KEYS)."""
        return [f"{self.p}:{suffix}" for suffix in HISTORY_KEYS.values()]

    def private_wake(self, tag: str) -> str:
        return f"{self.p}:wake:{tag}"

    def enqueue_one(self, queue: str) -> list[str]:
        """enqueue_one.lua's KEYS (ENQUEUE_ONE_KEYS) for a job of ``queue``."""
        return [self.queue(queue, name[2:]) if name.startswith("q:") else self.store[name]
                for name in ENQUEUE_ONE_KEYS]

    def look(self, queues: Sequence[str]) -> list[str]:
        """look.lua's KEYS (LOOK_KEYS, then LOOK_QUEUE_KEYS of each queue). The last list made
        is kept: an idle worker looks at the same queues every time, thousands of them on a
        worker with a queue per tenant. (A list of the caller's own.)"""
        asked = tuple(queues)
        if self._look is not None and self._look[0] == asked:
            return list(self._look[1])
        keys = [self.store[name] for name in LOOK_KEYS]
        for q in asked:
            block = self.block(q)
            keys += [block[i] for i in _LOOK_AT]
        self._look = (asked, tuple(keys))
        return keys

    def get(self, job_id: int) -> list[str]:
        """get.lua's KEYS (GET_KEYS): the job's hash and its error list."""
        return [self.job(job_id), self.errors(job_id)]


def _lua_names(names: Sequence[str], base: str) -> str:
    return ", ".join(f"['{name}'] = KEYS[{base}{i}]" for i, name in enumerate(names, 1))


def lua_layout(store: Sequence[str], queue: Sequence[str] = ()) -> str:
    """Lua that names a script's KEYS: ``K`` maps each of ``store`` to its key, ``STATES``
    lists the job states, and (with ``queue``) ``K_STATE`` maps each state to its P:state:<s>
    key, ``queue_keys(b, name)`` makes the table of a queue block that starts after KEYS[b],
    and NHEAD and NQK are the header's and a block's lengths. Written out as table
    constructors, so naming costs a script nothing at run time."""
    for name in (*store, *queue):
        assert name.replace(":", "").replace("_", "").isalnum(), name  # Lua literal safety
    lines = [
        "-- Generated from keys.py at load: which of KEYS each name is (see there).",
        f"local K = {{{_lua_names(store, '')}}}",
        "local STATES = {" + ", ".join(f"'{s}'" for s in STATES) + "}",
        f"local ID_STRIDE = {ID_STRIDE}",
    ]
    if queue:
        index = {name: i for i, name in enumerate(store, 1)}
        states = ", ".join(f"['{s}'] = KEYS[{index[f'state:{s}']}]" for s in STATES)
        lines += [
            f"local K_STATE = {{{states}}}",
            f"local NHEAD, NQK = {len(store)}, {len(queue)}",
            "local function queue_keys(b, name)",
            f"  return {{name = name, {_lua_names(queue, 'b + ')}}}",
            "end",
        ]
    return "\n".join(lines) + "\n"
