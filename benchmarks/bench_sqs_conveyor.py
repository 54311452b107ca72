"""The Conveyor side of the SQS benchmark: the same app and worker process as on RabbitMQ.

``python -m bench_sqs_conveyor 'sqs://127.0.0.1:PORT/?prefix=NAME' [--concurrency 8]`` (with
``benchmarks/`` on ``PYTHONPATH``) runs ``conveyor.worker.Worker`` on queue ``default``; stop it
with SIGTERM. The store is Conveyor's SQS transport as it ships: one standard queue per priority
level (the URL's default, level 0: ``NAME-default-p0``) and the dead queue ``NAME-default-dead``,
boto3 for every request. The credentials come from the environment (dummy ones: the server is a
local moto). ``bench_rabbitmq_common`` explains the clock and probe variables.
"""

from __future__ import annotations

from bench_rabbitmq_conveyor import NOOP, PROBE, main, make_app

__all__ = ["NOOP", "PROBE", "lane_queues", "make_app"]


def lane_queues(prefix: str, queue: str = "default") -> list[str]:
    """Every SQS queue Conveyor makes for ``queue`` under ``prefix``: the lane, then the dead."""
    return [f"{prefix}-{queue}-p0", f"{prefix}-{queue}-dead"]


if __name__ == "__main__":
    main()
