"""One command for every benchmark: Conveyor against its peers on SQLite, PostgreSQL, Redis,
RabbitMQ and SQS (a local moto server).

    python benchmarks/run.py [--stores sqlite,postgres,redis,rabbitmq,sqs] [--rounds 3]
                             [--jobs 20000] [--quick]

The first run creates ``benchmarks/.venv-peers`` (git-ignored) with the peers at pinned versions
(Celery, RQ, Dramatiq, Huey, arq, procrastinate, SAQ, Taskiq), moto's server, matplotlib, and
Conveyor from this checkout (``pip install -e .[postgres,redis,rabbitmq,sqs]``); then it runs
itself again with that environment's Python. Per store, every scenario runs for Conveyor and
every peer that supports the store, the systems taking turns within each round, and the results
go to ``benchmarks/results/<date>-<store>.md`` with PNG charts beside it. ``docs/benchmarks.md``
explains the method. Only the standard library is imported before the re-run, so ``--help``
works anywhere.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER_VENV = HERE / ".venv-peers"
STAMP = PEER_VENV / ".harness-pins"
STORES = ("sqlite", "postgres", "redis", "rabbitmq", "sqs")
# SQS runs on moto, a Python server whose requests cost milliseconds each: it is asked for by
# name (--stores sqs, with a --jobs in the thousands), not part of every run.
DEFAULT_STORES = STORES[:-1]
# The peers at the versions of the documented run. arq 0.28 declares redis<6, so redis-py is
# installed in a second step at the version Conveyor's own tests use (arq works with it). hiredis
# (in Conveyor's redis extra) is pinned too: redis-py uses it for every system here, so all of
# them parse RESP with the same C parser. RabbitMQ: Celery talks to it through py-amqp (kombu),
# Dramatiq and Conveyor through pika, Taskiq through aio-pika; those clients are pinned too. SQS:
# Conveyor and Celery (kombu's SQS transport, which sends its requests through pycurl) use boto3,
# and the server is moto's, from this environment.
PEERS = [
    "celery==5.7.0",
    "kombu==5.7.0",
    "rq==3.0.0",
    "dramatiq[redis,rabbitmq]==2.2.1",
    "huey==3.5.4",
    "arq==0.28.0",
    "procrastinate==3.10.0",
    "saq==0.26.4",
    "taskiq==0.13.0",
    "taskiq-aio-pika==0.6.1",
    "aio-pika==10.2.1",
    "amqp==5.4.2",
    "pika==1.4.4",
    "boto3==1.44.18",
    "pycurl==7.49.0",
    "moto[server]==5.2.6",
    "matplotlib==3.11.2",
]
AFTER = ["redis==8.1.0", "hiredis==3.5.0"]
DEFAULT_AMQP = os.environ.get("CONVEYOR_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
DEFAULT_PG = os.environ.get("CONVEYOR_BENCH_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python benchmarks/run.py",
        description="Benchmark Conveyor against Celery, RQ, Dramatiq, Huey, arq, procrastinate, "
        "SAQ and Taskiq (each on the stores it supports). Writes "
        "benchmarks/results/<date>-<store>.md and PNG charts.",
    )
    p.add_argument(
        "--stores",
        default=",".join(DEFAULT_STORES),
        help="comma-separated subset of sqlite,postgres,redis,rabbitmq,sqs (default: all but "
        "sqs, which runs on a moto server started for the run: ask for it by name)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds per store; medians reported (default 3, --quick 1)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="jobs per throughput scenario (default 20000, --quick 500)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1 round, 500 jobs, 20 idle probes, 1.5 s of load",
    )
    p.add_argument(
        "--systems",
        default=None,
        help="only these systems (e.g. conveyor,celery); default: all of a store's",
    )
    p.add_argument(
        "--concurrency", type=int, default=8, help="worker slots per process (default 8)"
    )
    p.add_argument(
        "--latency-samples",
        type=int,
        default=None,
        help="idle latency probes per round (default 300, --quick 20)",
    )
    p.add_argument(
        "--load-seconds",
        type=float,
        default=None,
        help="steady-load phase length (default 10, --quick 1.5)",
    )
    p.add_argument(
        "--load-probes",
        type=int,
        default=300,
        help="probes per steady-load phase, where probes are needed",
    )
    p.add_argument(
        "--slow-jobs",
        type=int,
        default=None,
        help="jobs RQ (and arq-default) drain on Redis (default --jobs/4)",
    )
    p.add_argument(
        "--pg-url",
        default=DEFAULT_PG,
        help="PostgreSQL for CREATE/DROP DATABASE (default %(default)s)",
    )
    p.add_argument(
        "--redis",
        default="127.0.0.1:6379",
        help="host:port; databases 9-15 are FLUSHed (default %(default)s)",
    )
    p.add_argument(
        "--amqp",
        default=DEFAULT_AMQP,
        help="RabbitMQ; only queues and exchanges named benchrmq-* are made, and deleted "
        "(default %(default)s)",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="seed of the random gaps between latency probes"
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=HERE / "results",
        help="where the reports go (default benchmarks/results)",
    )
    p.add_argument(
        "--producer-nice",
        type=int,
        default=0,
        help="run the steady-load producer (this process's thread that enqueues on a schedule) "
        "at this nice value, e.g. 19: on a 2-core machine it shares the cores with the worker "
        "and the store (default 0)",
    )
    p.add_argument(
        "--no-install",
        action="store_true",
        help="run with the current Python; do not create the peer venv",
    )
    a = p.parse_args(argv)
    a.argv = argv
    a.stores = [s.strip() for s in a.stores.split(",") if s.strip()]
    if not a.stores or set(a.stores) - set(STORES):
        p.error(f"--stores: choose from {','.join(STORES)}")
    a.systems = [s.strip() for s in a.systems.split(",") if s.strip()] if a.systems else None
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.jobs = a.jobs or (500 if a.quick else 20000)
    a.latency_samples = a.latency_samples or (20 if a.quick else 300)
    a.load_seconds = a.load_seconds or (1.5 if a.quick else 10.0)
    a.slow_jobs = a.slow_jobs or max(1, a.jobs // 4)
    if min(a.rounds, a.jobs, a.latency_samples, a.concurrency, a.load_probes, a.slow_jobs) < 1:
        p.error("counts must be >= 1")
    return a


def in_peer_venv() -> bool:
    return Path(sys.prefix).resolve() == PEER_VENV.resolve()


def ensure_peer_venv() -> Path:
    python = PEER_VENV / "bin" / "python"
    wanted = "\n".join([*PEERS, *AFTER]) + "\n"
    if python.exists() and STAMP.exists() and STAMP.read_text() == wanted:
        return python
    print(f"setting up {PEER_VENV} (peers, matplotlib, Conveyor from {ROOT})", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *PEERS, "-e", f"{ROOT}[postgres,redis,rabbitmq,sqs]"], check=True)
    subprocess.run([*pip, *AFTER], check=True)  # prints arq's redis<6 conflict: expected
    STAMP.write_text(wanted)
    return python


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if not a.no_install and not in_peer_venv():
        python = ensure_peer_venv()
        os.execv(str(python), [str(python), str(Path(__file__).resolve()), *argv])
    for path in (str(HERE), str(ROOT / "src")):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    from harness.main import main as run

    return run(a)


if __name__ == "__main__":
    sys.exit(main())
