"""PostgreSQL bulk enqueue with its COPY path off and on, against the raw COPY baseline, in one run.

    .venv/bin/python benchmarks/pg_copy_ab.py [--jobs 20000] [--rounds 5] [--url ...]

Each round measures, in an order that alternates between rounds: Conveyor ``task.enqueue_many``
of N no-op jobs, 1000 per call, as ``postgres_bench.py``'s enqueue_many scenario does (a fresh
database each), once with the one-statement path (``insert_plain``) for every batch and once
with the COPY path from ``COPY_MIN_JOBS`` on; and ``raw_writes.postgres``, the harness's COPY of
the same rows. Prints each round, the medians and ranges, and each path's ratio to the raw COPY
of its own round.

With ``--interleave``, each round instead keeps the three writers on three databases and
alternates them batch by batch (the order rotating), summing each one's time: on a machine
shared with other work, a burst of load then falls on all three alike. The raw writer there
is raw_writes.postgres's loop (COPY of a stored job's row, 1000 per transaction).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import postgres_bench as pb  # noqa: E402
from harness import raw_writes  # noqa: E402

from conveyor.backends.postgres import enqueue as pg_enqueue  # noqa: E402

COPY_MIN_JOBS = pg_enqueue.COPY_MIN_JOBS


def conveyor_rate(url: str, n: int, copy: bool) -> float:
    pg_enqueue.COPY_MIN_JOBS = COPY_MIN_JOBS if copy else sys.maxsize
    with pb.fresh_database(url, "copyab") as db:
        s = pb.ConveyorSystem(db, 8)
        try:
            t0 = time.perf_counter()
            for start in range(0, n, pb.BATCH):
                s.enqueue_batch(list(range(start, min(n, start + pb.BATCH))))
            dt = time.perf_counter() - t0
            assert s.one("SELECT count(*) FROM conveyor_jobs") == n
        finally:
            s.close()
    return n / dt


@contextlib.contextmanager
def raw_copier(url: str) -> Iterator[Callable[[int, int], None]]:
    """raw_writes.postgres's batch: COPY of a stored job's row with new args, one transaction."""
    s = pb.ConveyorSystem(url, 8)
    template = s.noop.enqueue(0).id
    s.close()
    with psycopg.connect(url, row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM conveyor_jobs WHERE id = %s", [template]).fetchone()
        assert row is not None
        conn.commit()
        cols = [c for c in row if c not in ("id", "args")]
        rest = [Jsonb(row[c]) if isinstance(row[c], dict | list) else row[c] for c in cols]
        sql = f"COPY conveyor_jobs (args, {', '.join(cols)}) FROM STDIN"

        def write(start: int, stop: int) -> None:
            with conn.transaction(), conn.cursor() as cur, cur.copy(sql) as copy:
                for i in range(start, stop):
                    copy.write_row([f'{{"i":{i}}}', *rest])

        yield write


def interleaved_round(url: str, n: int, rnd: int) -> dict[str, float]:
    with contextlib.ExitStack() as stack:
        dbs = [stack.enter_context(pb.fresh_database(url, f"copyab{k}")) for k in range(3)]
        statement, copy = (stack.enter_context(contextlib.closing(pb.ConveyorSystem(db, 8)))
                           for db in dbs[:2])
        raw = stack.enter_context(raw_copier(dbs[2]))

        def conveyor(s: pb.ConveyorSystem, on: bool) -> Callable[[int, int], None]:
            def write(start: int, stop: int) -> None:
                pg_enqueue.COPY_MIN_JOBS = COPY_MIN_JOBS if on else sys.maxsize
                s.enqueue_batch(list(range(start, stop)))
            return write

        writers = {"statement": conveyor(statement, False), "copy": conveyor(copy, True),
                   "raw COPY": raw}
        spent = dict.fromkeys(writers, 0.0)
        names = list(writers)
        for k, start in enumerate(range(0, n, pb.BATCH)):
            shift = (k + rnd) % len(names)
            for name in names[shift:] + names[:shift]:
                t0 = time.perf_counter()
                writers[name](start, min(n, start + pb.BATCH))
                spent[name] += time.perf_counter() - t0
        assert statement.one("SELECT count(*) FROM conveyor_jobs") == n
        assert copy.one("SELECT count(*) FROM conveyor_jobs") == n
    return {name: n / dt for name, dt in spent.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=pb.DEFAULT_URL)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--interleave", action="store_true", help="alternate batch by batch")
    a = p.parse_args()
    raw_args = argparse.Namespace(jobs=a.jobs, pg_url=a.url)
    rates: dict[str, list[float]] = {"statement": [], "copy": [], "raw COPY": []}
    for rnd in range(a.rounds):
        if a.interleave:
            for name, rate in interleaved_round(a.url, a.jobs, rnd).items():
                rates[name].append(rate)
            print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items()),
                  flush=True)
            continue
        order = ["statement", "copy", "raw COPY"]
        for name in order if rnd % 2 == 0 else order[::-1]:
            if name == "raw COPY":
                rate = raw_writes.postgres(raw_args).jobs_per_s
                assert rate is not None
            else:
                rate = conveyor_rate(a.url, a.jobs, copy=name == "copy")
            rates[name].append(rate)
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items()),
              flush=True)
    for name, v in rates.items():
        print(f"{name:>9}: median {statistics.median(v):,.0f}/s, range {min(v):,.0f}-{max(v):,.0f}")
    for name in ("statement", "copy"):
        ratios = [x / r for x, r in zip(rates[name], rates["raw COPY"], strict=True)]
        print(f"{name:>9} / raw COPY of the same round: median x{statistics.median(ratios):.2f}, "
              f"rounds " + ", ".join(f"x{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
