"""Where a Redis job's cost goes at a light load: the worker's and the store's share, per job.

    .venv/bin/python benchmarks/redis_light_load.py load [--rate 300] [--seconds 8]
    .venv/bin/python benchmarks/redis_light_load.py prelude [--calls 300]

``load`` starts one worker process (``bench_redis_conveyor``, concurrency 8) and enqueues
``--rate`` no-op jobs a second for ``--seconds`` from this process, as ``latency_load_ab.py``
does, then prints per job: the worker's CPU (user and system, every thread, from /proc), its
context switches (voluntary: a thread blocked, to wait for a reply or a wake-up; involuntary:
preempted), the store's calls (each script by name, and the plain commands the worker sends),
and each script call's median duration inside Redis (from SLOWLOG, which logs every command
while this runs: that costs Redis a little on every call alike). Latency is by the store's
clock (``attempted_at - created_at``).

``prelude`` measures what a script call costs Redis before its own body runs: a claim on an
empty queue, as loaded, against the same call with the claim's body cut to ``return {}``, after
the key layout alone, after ``_core.lua``, and after ``_common.lua`` (see scripts.py): each
script builds its key tables and defines its helpers on every call, then runs its body.

Redis database 7 (``--redis-db``) under a prefix of its own, deleted at the end; SLOWLOG's
settings are put back as they were.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "src")]

from harness.cpu import CLK_TCK, proc_ticks  # noqa: E402 - after the path is set


@contextmanager
def slowlog_all(r: Any) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """SLOWLOG logs every command while inside; yields a function that reads the log."""
    old = {k: r.config_get(k)[k] for k in ("slowlog-log-slower-than", "slowlog-max-len")}
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 1_000_000)
    r.slowlog_reset()
    try:
        yield lambda: list(r.slowlog_get(1_000_000))
    finally:
        for k, v in old.items():
            r.config_set(k, v)
        r.slowlog_reset()


def script_names(backend: Any) -> dict[str, str]:
    """Each script's SHA1 (as Redis names it) to its name, as the backend's transport loads
    them."""
    t = backend._transport
    return {script.sha: name for name, script in {**t.scripts, **t.bare_scripts}.items()}


def _words(entry: dict[str, Any]) -> list[str]:
    cmd = entry["command"]
    text = cmd.decode(errors="replace") if isinstance(cmd, bytes) else str(cmd)
    return text.split()


def _proc_cpu(pid: int) -> tuple[float, float]:
    """The process's user and system CPU seconds, every thread."""
    ticks = proc_ticks(pid)
    if ticks is None:
        raise RuntimeError(f"process {pid} is gone")
    return ticks.user / CLK_TCK, ticks.system / CLK_TCK


def _proc_switches(pid: int) -> tuple[int, int]:
    vol = invol = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        for line in Path(status).read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol += int(line.split()[1])
    return vol, invol


def load(a: argparse.Namespace) -> None:
    import redis
    from bench_redis_common import PROBE_KEY
    from bench_redis_conveyor import make_app
    from harness.common import paced
    from sqlite_bench import Proc, percentile, running

    base = f"redis://{a.redis}/{a.redis_db}"
    prefix = f"light-{uuid.uuid4().hex[:8]}"
    url = f"{base}?prefix={prefix}"
    r = redis.Redis.from_url(base)
    app, noop, probe = make_app(url)
    names = script_names(app.backend)
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    # The worker runs this checkout's library, whichever one the environment installed.
    path = os.pathsep.join([str(HERE), str(ROOT / "src"),
                            *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = Proc("light-load-worker", [sys.executable, "-m", "bench_redis_conveyor", url,
                                      "--concurrency", "8"], tmp,
                env={"BENCH_REDIS_URL": base, "PYTHONPATH": path})
    ids: list[int] = []
    try:
        with running(proc):
            r.delete(PROBE_KEY)
            probe.enqueue("warm")  # waits for the worker to be up
            if r.blpop([PROBE_KEY], timeout=60) is None:
                raise TimeoutError("the worker did not start")
            time.sleep(0.5)
            pid = proc.popen.pid
            with slowlog_all(r) as read_log:
                cpu0, sw0 = _proc_cpu(pid), _proc_switches(pid)
                _, achieved = paced(a.rate, a.seconds, lambda i: ids.append(noop.enqueue(i).id))
                deadline = time.monotonic() + 60
                while r.zcard(f"{{{prefix}}}:state:succeeded") < len(ids) + 1:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the load did not finish")
                    time.sleep(0.05)
                cpu1, sw1 = _proc_cpu(pid), _proc_switches(pid)
                log = read_log()
        n = len(ids)
        pipe = r.pipeline(transaction=False)
        for i in ids:
            pipe.hmget(f"{{{prefix}}}:job:{i}", ["created_at", "attempted_at"])
        lat = [(float(s) - float(c)) * 1000 for c, s in pipe.execute() if c and s]
        print(f"{n} jobs at {achieved:,.0f} jobs/s; pick-up by the store's clock: p50 "
              f"{percentile(lat, 50):.2f} ms, p99 {percentile(lat, 99):.2f} ms")
        print(f"worker, per job: CPU user {(cpu1[0] - cpu0[0]) / n * 1000:.3f} ms, system "
              f"{(cpu1[1] - cpu0[1]) / n * 1000:.3f} ms; context switches voluntary "
              f"{(sw1[0] - sw0[0]) / n:.1f}, involuntary {(sw1[1] - sw0[1]) / n:.1f}")
        # A script's own commands are logged before it (they finish first): only top-level
        # calls are counted, and a script's time includes its commands.
        calls: dict[str, list[int]] = collections.defaultdict(list)
        inner = 0
        for entry in sorted(log, key=lambda e: e["id"]):
            words = _words(entry)
            if not words:
                continue
            verb = words[0].upper()
            if verb == "EVALSHA":
                calls[names.get(words[1], words[1][:8])].append(entry["duration"])
            elif verb in ("BLPOP", "SPUBLISH", "PUBLISH"):
                calls[verb].append(entry["duration"])
            else:
                inner += 1
        print("store calls per job (median time in Redis per call):")
        for name, durations in sorted(calls.items(), key=lambda kv: -len(kv[1])):
            print(f"  {name:14} {len(durations) / n:5.2f}  {statistics.median(durations):6.0f} us")
        print(f"  (commands run inside scripts, or for the producer: {inner / n:.1f} per job)")
    finally:
        app.close()
        for key in r.scan_iter(f"{{{prefix}}}*", count=1000):
            r.delete(key)


def prelude(a: argparse.Namespace) -> None:
    import redis

    import conveyor.backends.redis.transport as transport
    from conveyor.backends.redis import scripts

    folder = Path(scripts.__file__).parent / "lua"
    core = (folder / "_core.lua").read_text()
    common = (folder / "_common.lua").read_text()
    body = (folder / "claim.lua").read_text()
    load_script = scripts._load_script
    as_loaded = load_script("claim")
    head = as_loaded[: len(as_loaded) - len(body)]
    shebang = head.split("\n", 1)[0]
    layout = scripts._layout("claim")
    variants = {
        "as loaded": as_loaded,
        "no prelude (the keys and arguments only)": f"{shebang}\nreturn {{}}",
        "key layout only": f"{shebang}\n{layout}\nreturn {{}}",
        "+ _core.lua": f"{shebang}\n{layout}{core}\nreturn {{}}",
        "+ _common.lua (all before the body)": f"{head}\nreturn {{}}",
    }
    assert head == f"{shebang}\n{layout}{core}\n{common}\n", "scripts.py's assembly changed"
    r = redis.Redis.from_url(f"redis://{a.redis}/{a.redis_db}")
    trivial = r.script_load(f"{shebang}\nreturn 1")
    # Rounds alternate the variants: one run's median moves by 10-20 us from run to run on a
    # busy host, more than some of the differences measured.
    medians: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(a.rounds):
        for label, text in variants.items():
            medians[label].append(_empty_claims(a, r, transport, load_script, text))
        with slowlog_all(r) as read_log:
            for _ in range(a.calls):
                r.evalsha(trivial, 0)
            log = read_log()
        medians["a script that returns 1 (no keys)"].append(
            statistics.median(e["duration"] for e in log if _words(e)[:1] == ["EVALSHA"]))
    print(f"a claim on an empty queue, time in Redis: the median of {a.rounds} rounds' medians"
          f" of {a.calls} calls (each round's in brackets)")
    for label, values in medians.items():
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {label:42} {statistics.median(values):5.0f} us  ({rounds})")


def _empty_claims(a: argparse.Namespace, r: Any, transport: Any, load_script: Any,
                  text: str) -> float:
    """The median time in Redis of ``a.calls`` claims on empty queues, the claim script
    loaded as ``text``."""
    from conveyor import Conveyor

    transport._load_script = lambda name: text if name == "claim" else load_script(name)
    prefix = f"prelude-{uuid.uuid4().hex[:8]}"
    app = Conveyor(f"redis://{a.redis}/{a.redis_db}?prefix={prefix}")
    try:
        backend = app.backend
        with slowlog_all(r) as read_log:
            for i in range(a.calls):
                # A queue of its own each time: an empty claim remembers, per queue, that
                # nothing waits there (the queue's hold), and a later claim would skip more.
                backend.claim(f"q{i}", 8, worker_id="bench", lease_s=30)
            log = read_log()
        return statistics.median(e["duration"] for e in log if _words(e)[:1] == ["EVALSHA"])
    finally:
        transport._load_script = load_script
        app.close()
        for key in r.scan_iter(f"{{{prefix}}}*", count=1000):
            r.delete(key)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("what", choices=("load", "prelude"))
    p.add_argument("--rate", type=float, default=300.0, help="jobs/s offered (default 300)")
    p.add_argument("--seconds", type=float, default=8.0, help="load length (default 8)")
    p.add_argument("--calls", type=int, default=300, help="calls per prelude variant and round")
    p.add_argument("--rounds", type=int, default=5, help="prelude rounds (default 5)")
    p.add_argument("--redis", default="127.0.0.1:6379")
    p.add_argument("--redis-db", type=int, default=7)
    a = p.parse_args()
    load(a) if a.what == "load" else prelude(a)


if __name__ == "__main__":
    main()
