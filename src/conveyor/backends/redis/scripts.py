"""The Lua scripts: which there are, and the text each is loaded as.

Each transition is one file in ``lua/``. At load a script is put together from: a shebang (its
flags), the names of its KEYS (generated from keys.py), ``_core.lua``, for most scripts the
shared prelude ``_common.lua``, and its own body. Scripts are only ever these files (never
text built from data).
"""

from __future__ import annotations

from importlib import resources

from .keys import (
    ENQUEUE_ONE_KEYS,
    GET_KEYS,
    HISTORY_KEYS,
    LOCK_KEYS,
    LOOK_KEYS,
    QUEUE_KEYS,
    STORE_KEYS,
    WAITER_KEYS,
    lua_layout,
)

# At maxmemory (noeviction), Redis refuses a script without allow-oom before it runs. New work
# (enqueue, and cron ticks, which use the enqueue script) is refused so. Claiming, finishing and
# pruning must go on, or a full Redis could never drain: they run with allow-oom, and what they
# write is a few fields per job, except the texts callers hand them. An ack's result is written
# whatever its size (a refused ack runs the job again). A step record or an error bigger than
# OOM_SLACK goes by the ':strict' copy of its script (without allow-oom): refused at maxmemory,
# a step record fails its attempt with StorageFull (nothing written); an error is written again
# cut to OOM_SLACK by the allow-oom script, so a retry or kill still happens (see
# RedisBackend._settle_error).
GROWING_SCRIPTS = {"enqueue", "enqueue_one"}
STRICT_SCRIPTS = ("record_step", "retry", "kill")
OOM_SLACK = 1024  # bytes of caller text a script may write past maxmemory
# Scripts that do without _common.lua's prelude (its header of store keys, the queue blocks,
# and its helpers made on every call): only _core.lua comes before them.
LEAN_SCRIPTS = {"enqueue_one", "get", "look"}
# Scripts that finish, write or delete jobs, and so settle or keep their dependencies and
# batches: _deps.lua comes after _common.lua in these only (every other script skips its cost).
DEPS_SCRIPTS = {"enqueue", "ack", "ack_many", "retry", "kill", "reap", "cancel", "cancel_many",
                "prune", "purge", "get_batch", "take"}
# Store-wide locks (try_lock), job.wait's waiter counts and the history: their own keys, no
# helpers.
BARE_SCRIPTS = ("lock", "unlock", "count_waiter", "history_record", "history_rollup")

SCRIPT_NAMES = (
    "enqueue", "enqueue_one", "claim", "heartbeat", "ack", "ack_many", "retry", "kill",
    "release", "reap", "promote", "prune", "cancel", "redrive", "purge", "record_worker",
    "remove_worker", "stats", "list_jobs", "record_step", "look", "get", "sweep", "sweep_done",
    "get_batch", "make_due", "cron_control", "queue_pause", "cancel_many", "take",
    "outbox_sweep",
    *(f"{name}:strict" for name in STRICT_SCRIPTS),
)

# The names of each script's KEYS (see keys.py); every other script takes the shared header
# and queue blocks.
_OWN_KEYS = {"enqueue_one": ENQUEUE_ONE_KEYS, "get": GET_KEYS, "look": LOOK_KEYS,
             "lock": LOCK_KEYS,
             "unlock": LOCK_KEYS, "count_waiter": WAITER_KEYS,
             "history_record": tuple(HISTORY_KEYS), "history_rollup": tuple(HISTORY_KEYS)}


def _layout(name: str) -> str:
    own = _OWN_KEYS.get(name)
    if own is not None:
        return lua_layout(own)
    return lua_layout(list(STORE_KEYS), QUEUE_KEYS)


def _load_script(name: str) -> str:
    """The text of script ``name``; ``<name>:strict`` is that script without allow-oom."""
    name, _, strict = name.partition(":")
    folder = resources.files(__package__).joinpath("lua")
    if name in BARE_SCRIPTS:  # keys of their own: none of the store's helpers
        body = folder.joinpath(f"{name}.lua").read_text("utf-8")
        return f"#!lua flags=allow-oom\n{_layout(name)}{body}"
    common = folder.joinpath("_core.lua").read_text("utf-8")
    if name not in LEAN_SCRIPTS:
        common += "\n" + folder.joinpath("_common.lua").read_text("utf-8")
    if name in DEPS_SCRIPTS:
        common += "\n" + folder.joinpath("_deps.lua").read_text("utf-8")
    body = folder.joinpath(f"{name}.lua").read_text("utf-8")
    # A shebang makes Redis 7 check the script's flags before it runs: a script that grows the
    # store is refused whole at maxmemory instead of failing at its first write, half-done.
    # No script but look is no-writes: even the readers (stats, list_jobs) fold the inboxes of
    # the queues they are given into their indexes first (fold_inbox in _core.lua).
    shebang = "#!lua" if name in GROWING_SCRIPTS or strict else "#!lua flags=allow-oom"
    return f"{shebang}\n{_layout(name)}{common}\n{body}"
