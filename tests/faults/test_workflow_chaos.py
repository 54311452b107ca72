"""R18: workflows under random SIGKILL of workers, on every backend (issue 35 item 4).

Batches of ``fault.work`` members with both callbacks (``fault.callback``), some with a member
that is rejected (so ``on_success`` must be cancelled and ``on_complete`` still run), and chains
of ``fault.work`` steps, are enqueued while a nemesis SIGKILLs a random worker every
U(0.3, 0.8) s (concurrency 4, lease 2 s, every other worker prefetching) and starts a new one.
One worker of the first set also kills itself at ``after_ack`` (the moment after a member's
ack committed: in Conveyor that ack and the callback's release are one write, so there is no
moment between them to kill).

Pass: the store drains (no job left waiting, so no child or callback was stranded); each
batch has exactly one job per callback; every ``on_complete`` succeeded and ran; every
``on_success`` succeeded and ran when all members succeeded, and was cancelled, never run,
when one was rejected; a callback's first run started after every member's last run ended; a
chain's step started after its parent's last run ended; every chain step succeeded; runs
beyond one per job at most kills x concurrency (at-least-once, as every job).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import pytest
from faultstore import FaultStore
from harness import (
    Nemesis,
    Report,
    WorkerSpec,
    all_jobs,
    client_app,
    drain,
    make_rng,
    pick,
    read_effects,
)

from conveyor import JobState

pytestmark = [pytest.mark.faults, pytest.mark.process]

BATCHES = pick(24, 120)
MEMBERS = pick(12, 40)
CHAINS = pick(24, 120)
CHAIN_LEN = 5
WORKERS = 3
CONCURRENCY = 4
LEASE = 2.0
DRAIN_S = 90.0


@pytest.mark.timeout(pick(300, 1500))
def test_workflows_survive_sigkill(fault_store: FaultStore, make_cluster) -> None:  # type: ignore[no-untyped-def]
    seed, rng = make_rng(f"R18 workflow chaos / {fault_store.name}")
    cluster = make_cluster(fault_store.url)
    specs = [WorkerSpec(concurrency=CONCURRENCY, lease=LEASE, poll=0.2, prefetch=4 if k % 2 else 0)
             for k in range(WORKERS)]
    cluster.wait_started(*[cluster.spawn(spec, wait=False) for spec in specs])
    # One more worker that SIGKILLs itself right after its first committed ack.
    cluster.spawn(WorkerSpec(concurrency=CONCURRENCY, lease=LEASE, poll=0.2,
                             env={"CONVEYOR_FAULTPOINT": "after_ack"}), name="after-ack")
    app = client_app(fault_store.url)
    work, callback = app.tasks["fault.work"], app.tasks["fault.callback"]
    rejected_batches = set(rng.sample(range(BATCHES), max(1, BATCHES // 6)))
    batches: dict[int, str] = {}
    chains: list[list[int]] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for i in range(max(BATCHES, CHAINS)):
                if i < BATCHES:
                    with app.batch(on_success=callback.s(tag=f"ok-{i}"),
                                   on_complete=callback.s(tag=f"all-{i}")) as b:
                        for m in range(MEMBERS):
                            work.enqueue(n=i * 1000 + m, sleep=round(rng.uniform(0.005, 0.05), 4))
                        if i in rejected_batches:
                            app.tasks["fault.reject"].enqueue(n=i)
                    batches[i] = b.id
                if i < CHAINS:
                    steps = [work.s(n=1_000_000 + i * 10 + k, sleep=round(rng.uniform(0.005, 0.03), 4))
                             for k in range(CHAIN_LEN)]
                    chains.append([j.id for j in app.chain(*steps)])
                time.sleep(rng.uniform(0.15, 0.35))  # chaos lasts several seconds
        except BaseException as exc:
            errors.append(exc)

    try:
        t0 = time.monotonic()
        nemesis = Nemesis(cluster, rng, interval=(0.3, 0.8)).start()
        producer = threading.Thread(target=produce, name="producer")
        producer.start()
        producer.join(timeout=240)
        nemesis.stop()
        assert not errors, errors[:3]
        assert not producer.is_alive(), "the producer did not finish"
        drain_s = drain(app.backend, DRAIN_S, cluster.diagnosis)

        effects = read_effects(cluster.log)
        runs: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for rec in effects:
            runs[rec["job"]].append(rec)
        callbacks = all_jobs(app.backend, task="fault.callback")
        per_tag = Counter(j.args["tag"] for j in callbacks)
        problems: list[str] = []
        problems += [f"{tag}: {n} callback jobs" for tag, n in per_tag.items() if n != 1]
        by_tag = {j.args["tag"]: j for j in callbacks}
        for i, batch_id in batches.items():
            info = app.get_batch(batch_id)
            if info is None or not info.is_finished:
                problems.append(f"batch {i} not finished: {info}")
                continue
            ok, done = by_tag.get(f"ok-{i}"), by_tag.get(f"all-{i}")
            if ok is None or done is None:
                problems.append(f"batch {i}: a callback is missing ({ok}, {done})")
                continue
            member_end = max((r["t"] for m in app.backend.get(done.id).parents  # type: ignore[union-attr]
                              for r in runs.get(m, [])), default=0.0)
            if i in rejected_batches:
                if ok.state is not JobState.CANCELLED or runs.get(ok.id):
                    problems.append(f"batch {i} had a rejected member: on_success {ok.state}, "
                                    f"ran {len(runs.get(ok.id, []))}x")
            else:
                if ok.state is not JobState.SUCCEEDED or not runs.get(ok.id):
                    problems.append(f"batch {i}: on_success {ok.state}, ran {len(runs.get(ok.id, []))}x")
            for cb in (ok, done):
                cb_runs = runs.get(cb.id, [])
                if cb_runs and min(r["t0"] for r in cb_runs) < member_end:
                    problems.append(f"batch {i}: callback {cb.id} ran before a member ended")
            if done.state is not JobState.SUCCEEDED or not runs.get(done.id):
                problems.append(f"batch {i}: on_complete {done.state}")
        for chain in chains:
            for parent, child in itertools.pairwise(chain):
                job = app.backend.get(child)
                if job is None or job.state is not JobState.SUCCEEDED:
                    problems.append(f"chain step {child}: {job.state if job else 'missing'}")
                    continue
                parent_end = max((r["t"] for r in runs.get(parent, [])), default=None)
                child_start = min((r["t0"] for r in runs.get(child, [])), default=None)
                if parent_end is None or child_start is None or child_start < parent_end:
                    problems.append(f"chain step {child} started {child_start}, parent ended {parent_end}")
        kills = nemesis.counts().get("sigkill", 0)
        extra = sum(len(v) - 1 for v in runs.values() if len(v) > 1)
        bound = (kills + 1) * (CONCURRENCY + 4)  # killed slots plus a prefetching worker's holds

        report = Report(name="R18 workflows", backend=fault_store.name, seed=seed)
        report.attempted = report.ok = len(batches) * (MEMBERS + 2) + len(chains) * CHAIN_LEN
        report.executions = len(effects)
        report.faults = {"sigkill": kills}
        report.duplicate_bound = bound
        report.figures = {"batches": len(batches), "members": MEMBERS, "chains": len(chains),
                          "rejected_batches": len(rejected_batches), "extra_runs": extra,
                          "drain_s": round(drain_s, 1), "elapsed_s": round(time.monotonic() - t0, 1),
                          "problems": len(problems)}
        report.emit()

        assert not problems, "\n".join(problems[:20])
        assert extra <= bound, f"{extra} runs beyond one per job, bound {bound}"
        assert kills >= pick(5, 40), f"only {kills} kills"
        assert len(batches) == BATCHES and len(chains) == CHAINS
        if fault_store.sqlite_path is not None:
            assert fault_store.integrity() == "ok"
    finally:
        app.close()
