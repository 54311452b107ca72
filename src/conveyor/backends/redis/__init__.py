"""The Redis backend: one Lua script per state transition, keys that fit one Cluster slot.

``redis://[[user]:password@]host[:port][/db][?prefix=NAME]`` (``rediss://`` for TLS), or
``redis+cluster://host:port,host:port/?prefix=NAME`` (``rediss+cluster://``) for Redis Cluster
(``cluster.py``). All keys of one app start with ``{NAME}:`` (default ``conveyor``); the braces
are the Cluster hash tag.
The key layout is the table in ``keys.py`` (described in docs/redis.md and at the top of
``lua/_common.lua``); the parts are listed in ``backend.py``.

The names below are re-exported for the code and tests that import them from here. A test
that changes a module constant must patch it where it is read (e.g. ``transport.RETRY_BUDGET``).
"""

from __future__ import annotations

from .admin import BATCH, LIST_BUDGET
from .backend import RedisBackend
from .enqueue import ENQUEUE_CHUNK
from .keys import QUEUE_KEYS, STATES, Keys
from .maintenance import SWEEP_PER_REAP, SWEEP_QUEUES
from .scripts import OOM_SLACK, SCRIPT_NAMES, _load_script
from .transport import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SOCKET_TIMEOUT,
    IDLE_CLOSE_S,
    RETRY_BUDGET,
    WAIT_SLICE,
    _exposure_warnings,
    parse_redis_url,
)

__all__ = [
    "BATCH",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_SOCKET_TIMEOUT",
    "ENQUEUE_CHUNK",
    "IDLE_CLOSE_S",
    "LIST_BUDGET",
    "OOM_SLACK",
    "QUEUE_KEYS",
    "RETRY_BUDGET",
    "SCRIPT_NAMES",
    "STATES",
    "SWEEP_PER_REAP",
    "SWEEP_QUEUES",
    "WAIT_SLICE",
    "Keys",
    "RedisBackend",
    "_exposure_warnings",
    "_load_script",
    "parse_redis_url",
]
