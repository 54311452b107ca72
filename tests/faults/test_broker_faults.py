"""R19: the RabbitMQ store under faults, on a private node (rabbitrig.py; never the shared one).

A broker keeps no job table (an acked message is gone), so the checker works from the
producer's history and the side-effect log alone (harness.check_effects), plus what the broker
does count: its lanes' depth.

* **Chaos** (test_rabbitmq_chaos_loses_nothing): three worker processes (concurrency 4) reach
  the node through a TCP proxy; a producer enqueues fault.work jobs at a steady rate straight
  to the node. A nemesis SIGKILLs a random worker every U(a, b) s and starts a new one; a
  second one, on a schedule through the producer's run, cuts every connection (in turn: the
  broker closes them, ``rabbitmqctl close_all_connections``, the producer's too; the proxy
  resets the workers' with RST), once in a storm of ten cuts 0.3 s apart, and SIGKILLs the
  node, then boots it again on the same directories. Pass: lost = 0 (every ``ok`` enqueue has its side effect), unexpected = 0, no
  attempt ran twice, drained within DRAIN_S of the end of the faults (every ``ok`` job done,
  nothing left on the lanes or in the dead lane once the workers stopped), every worker the
  nemesis did not kill still alive. Enqueues that failed while the node was away are ``fail``
  or ``info`` in the history, not lost.

  Duplicates are bounded: the connection is the lease, and what a holder had not acked when
  its connection went goes back to the queue. A killed worker's are its running jobs and the
  finished ones whose acks had not reached the broker (2 x concurrency, as in R1). A cut or a
  restart takes every worker's connection at once: 2 x concurrency per worker. The bound is
  kills x 2C + (cuts + restarts) x workers x 2C.

* **Freeze** (test_frozen_worker_loses_its_jobs_to_another): a worker is SIGSTOPped just after
  it started a job (its JSON DEBUG log says so), for longer than two heartbeats
  (``heartbeat=2``): RabbitMQ drops its connection and hands its jobs out again. SIGCONTed, its
  tasks finish their sleep and write their side effects (the duplicates: at most 2 x its
  concurrency), and their acks are refused (the lease-lost warning): every job's one recorded
  success is from its last attempt, none twice. The one exception allowed: an ack whose frames
  left just before the freeze reaches the broker, but the worker, finding its connection dead
  under the ack, cannot know and reports it refused; such a job ran once and nobody else ran
  it. The thawed worker then works on, on a new channel. lost 0.

CI: 1,000 jobs; full: 5,000 and more of every fault.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from harness import (
    Cluster,
    History,
    Nemesis,
    Producer,
    WorkerSpec,
    check_effects,
    client_app,
    is_stopped,
    make_rng,
    pick,
    read_effects,
)
from processrig import Proc, wait_until
from proxy import Proxy
from rabbitrig import RabbitNode
from stores import BackendUnavailable, _unavailable, also_ran

from conveyor import Conveyor
from conveyor.backends import open_backend
from conveyor.backends.broker.core import MAX_STALLS
from conveyor.backends.broker.transport import Lane

pytestmark = [pytest.mark.faults, pytest.mark.process]

JOBS = pick(1000, 5000)
WORKERS, CONCURRENCY, LEASE = 3, 4, 2.0
RATE = pick(40.0, 50.0)  # enqueues per second: the run lasts long enough for every fault
KILL_EVERY = pick((1.5, 3.0), (1.0, 3.0))
# The broker's faults, in this order, spread over the producer's run.
BROKER_FAULTS = pick(["close", "reset", "storm", "restart", "close", "reset"],
                     ["close", "reset", "storm", "restart"] * 4)
# A storm: this many cuts (close and reset in turn), STORM_EVERY s apart, so that cuts land
# in the middle of claims (a claim that met its own message twice was found so).
STORM_CUTS, STORM_EVERY = 10, 0.3
OUTAGE = 1.0  # seconds the node stays down before it is booted again (booting takes more)
DRAIN_S = 90.0
LEASE_LOST = ("lease lost", "success was discarded")


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    try:
        node = RabbitNode(tmp_path_factory.mktemp("rabbit")).start()
    except BackendUnavailable as exc:
        _unavailable("rabbitmq", exc)
    also_ran.add("rabbitmq")
    try:
        yield node
    finally:
        node.stop()


def _lanes_left(url: str) -> dict[str, int]:
    """Messages ready on each lane of queue ``default`` (and its dead lane), by a connection of
    its own: after the workers stopped, anything unacked is back to ready."""
    backend = open_backend(url)
    try:
        lanes = [*backend.lanes("default"), Lane("default", None)]  # type: ignore[attr-defined]
        transport = backend.transport  # type: ignore[attr-defined]
        return {transport.name(ln): transport.depth(ln).ready for ln in lanes}
    finally:
        backend.close()


def job_log(proc: Proc) -> list[dict[str, Any]]:
    """The JSON log records of ``proc`` about jobs (``--log-format json``)."""
    out = []
    for line in proc.stderr().splitlines():
        if line.startswith("{") and '"job_id"' in line:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _lease_lost_lines(text: str) -> int:
    return sum(text.count(s) for s in LEASE_LOST)


class BrokerNemesis:
    """The broker's faults of ``schedule``, one every ``every`` seconds after ``first``:
    ``close`` (the broker closes every connection), ``reset`` (the proxy RSTs the workers'),
    ``storm`` (STORM_CUTS of those in turn, STORM_EVERY s apart), ``restart`` (SIGKILL the
    node, wait OUTAGE, boot it again)."""

    def __init__(self, node: RabbitNode, proxy: Proxy, schedule: list[str], *, first: float,
                 every: float) -> None:
        self.node, self.proxy, self.schedule = node, proxy, schedule
        self.first, self.every = first, every
        self.counts: Counter[str] = Counter()
        self.cut: list[int] = []  # connections each cut closed (close) or reset (reset)
        self.storm: list[int] = []  # the same, for the cuts of storms
        self.down_s: list[float] = []
        self.back_at: list[float] = []  # time.time() when a restarted node answered again
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-nemesis", daemon=True)

    def _run(self) -> None:
        try:
            if self._stop.wait(self.first):
                return
            for i, fault in enumerate(self.schedule):
                if i and self._stop.wait(self.every):
                    return
                if fault in ("close", "reset"):
                    self.cut.append(self._cut(fault))
                elif fault == "storm":
                    for k in range(STORM_CUTS):
                        if k and self._stop.wait(STORM_EVERY):
                            return
                        self.storm.append(self._cut(("close", "reset")[k % 2]))
                else:
                    t = time.monotonic()
                    self.node.kill()
                    time.sleep(OUTAGE)
                    self.node.start()
                    self.down_s.append(round(time.monotonic() - t, 1))
                    self.back_at.append(time.time())
                self.counts[fault] += 1
        except BaseException as exc:
            self.error = exc

    def _cut(self, how: str) -> int:
        if how == "close":
            return self.node.close_all_connections("R19 connection cut")
        return self.proxy.reset()

    def start(self) -> BrokerNemesis:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the broker nemesis did not finish"

    def stop(self) -> None:
        self._stop.set()
        self.join(120)


@pytest.mark.timeout(pick(300, 1200))
def test_rabbitmq_chaos_loses_nothing(rabbit: RabbitNode,
                                      make_cluster: Callable[..., Cluster]) -> None:
    seed, rng = make_rng("R19 rabbitmq chaos")
    url = rabbit.url(f"prefix=r19{uuid.uuid4().hex[:8]}")
    jobs = [(n, 1.0 if rng.random() < 0.02 else round(rng.uniform(0.005, 0.05), 4))
            for n in range(JOBS)]
    proxy = Proxy("127.0.0.1", rabbit.port).start()
    cluster = make_cluster(proxy.url_for(url))
    spec = WorkerSpec(concurrency=CONCURRENCY, lease=LEASE, poll=0.2)
    cluster.wait_started(*[cluster.spawn(spec, wait=False) for _ in range(WORKERS)])
    app = client_app(url)
    history = History()
    broker = BrokerNemesis(rabbit, proxy, BROKER_FAULTS, first=2.0,
                           every=(JOBS / RATE - 4.0) / len(BROKER_FAULTS))
    try:
        t0 = time.monotonic()
        nemesis = Nemesis(cluster, rng, interval=KILL_EVERY).start()
        broker.start()
        producer = Producer(app, history, jobs, rate=RATE).start()
        try:
            producer.join(timeout=JOBS / RATE + 180)
            broker.join(120)
        finally:
            nemesis.stop()
            broker.stop()
        assert broker.error is None, f"the broker nemesis failed: {broker.error!r}"
        t_faults_end = time.monotonic()

        ok = history.ok_ids()

        def drained() -> bool:
            done = {int(r["n"]) for r in read_effects(cluster.log) if r.get("e") == "done"}
            return ok.keys() <= done

        wait_until(drained, DRAIN_S, lambda: f"every ok job to run\n{cluster.diagnosis()}",
                   interval=0.2)
        drain_s = time.monotonic() - t_faults_end
        killed = {pid for _, _, _, pid in nemesis.events}
        died = [p for p in cluster.procs if p.pid not in killed and not p.alive()]
        cluster.wait_started(*cluster.live())  # (a SIGTERM before its handlers kills one)
        stderr = cluster.stderr_all()
        codes = cluster.sigterm_all()
        left = _lanes_left(url)
        elapsed = time.monotonic() - t0

        effects = read_effects(cluster.log)
        report = check_effects("R19 rabbitmq chaos", "rabbitmq", seed, history, effects,
                               free_handouts=MAX_STALLS)
        kills = nemesis.counts().get("sigkill", 0)
        cuts = len(broker.cut) + len(broker.storm)
        restarts = broker.counts["restart"]
        report.faults = {"sigkill": kills, "connection_cuts": cuts,
                         "rabbitmq_sigkill": restarts}
        report.duplicate_bound = (kills * 2 * CONCURRENCY
                                  + (cuts + restarts) * WORKERS * 2 * CONCURRENCY)
        back = broker.back_at[0] if broker.back_at else None
        starts_after = sorted(r["t0"] for r in effects if back is not None and r["t0"] >= back)
        errors = history.by_type("fail") + history.by_type("info")
        took = history.durations()
        report.figures = {
            "workers": WORKERS, "concurrency": CONCURRENCY, "elapsed_s": round(elapsed, 1),
            "drain_s": round(drain_s, 1), "jobs_per_s": round(report.ok / elapsed, 1),
            "node_down_s": broker.down_s,
            "first_job_start_after_back_s": (round(starts_after[0] - back, 2)
                                             if starts_after and back else None),
            "connections_per_cut": broker.cut, "connections_cut_in_storms": sum(broker.storm),
            "enqueue_errors": len(errors),
            "first_error": (errors[0].error or "")[:100] if errors else None,
            "slowest_enqueue_s": round(max(took.values()), 2) if took else None,
            "lease_lost_logged": _lease_lost_lines(stderr),
        }
        report.emit()

        assert not producer.errors, f"an enqueue raised a non-ConveyorError: {producer.errors[:3]}"
        report.assert_clean(expect=None, context=cluster.diagnosis())
        assert not died, f"workers died by themselves: {died}\n{cluster.diagnosis()}"
        assert all(c == 0 for c in codes.values()), f"workers did not stop cleanly: {codes}"
        assert not any(left.values()), f"messages left on the broker after the drain: {left}"
        # The run did what it says: every fault happened, most enqueues were taken, jobs ran.
        assert restarts >= 1 and cuts >= 2 and kills >= pick(5, 30), report.faults
        assert all(broker.cut), f"a cut that found no connection to cut: {broker.cut}"
        assert len(broker.storm) == broker.counts["storm"] * STORM_CUTS and sum(broker.storm)
        # (A broker alone charges hand-outs it took back only past MAX_STALLS: duplicates show
        # the faults bit as well as later attempts do.)
        assert max(report.attempts_hist) >= 2 or report.duplicated_total > 0, \
            "no job was handed out again: no fault bit"
        assert report.ok >= JOBS * 0.9, f"most enqueues failed: {errors[:3]}"
        assert report.executions >= report.ok
    finally:
        app.close()
        proxy.close()
        if rabbit.proc is None or rabbit.proc.poll() is not None:
            rabbit.start()  # for the next test, if a restart failed half-way


FREEZE_JOBS = 40
FREEZE_SLEEP = 1.0  # each job's run: the frozen worker is surely inside some
HEARTBEAT = 2  # seconds; RabbitMQ drops a client silent for about two of them
FREEZE_S = 4 * HEARTBEAT + 2


@pytest.mark.timeout(180)
def test_frozen_worker_loses_its_jobs_to_another(rabbit: RabbitNode,
                                                 make_cluster: Callable[..., Cluster]) -> None:
    seed, _ = make_rng("R19 rabbitmq freeze")  # nothing random here but the timing
    url = rabbit.url(f"prefix=r19f{uuid.uuid4().hex[:8]}&heartbeat={HEARTBEAT}")
    cluster = make_cluster(url)
    spec = WorkerSpec(concurrency=2, lease=LEASE, poll=0.1,
                      args=("--log-level", "DEBUG", "--log-format", "json"))
    frozen, other = cluster.spawn(spec, name="frozen"), cluster.spawn(spec, name="other")
    app: Conveyor = client_app(url)
    history = History()
    task = app.tasks["fault.work"]
    try:
        for n in range(FREEZE_JOBS):
            history.record(n, lambda n=n: task.enqueue(n, FREEZE_SLEEP).id)

        def ran_by(proc_pid: int) -> list[dict[str, Any]]:
            return [r for r in read_effects(cluster.log) if r["pid"] == proc_pid]

        # Both run jobs; freeze one just after it started a job (its DEBUG log says so) that
        # has not finished: it is then asleep in that job, holding it unacked.
        def started_unfinished() -> bool:
            done = {int(r["job"]) for r in ran_by(frozen.pid)}
            return bool(ran_by(other.pid)) and any(
                e.get("outcome") == "started" and int(e["job_id"]) not in done
                for e in job_log(frozen))

        wait_until(started_unfinished, 30, "both workers to run jobs", interval=0.005)
        frozen.send(signal.SIGSTOP)
        wait_until(lambda: is_stopped(frozen.pid), 5, "the worker to stop")
        t_stop = time.time()
        time.sleep(FREEZE_S)  # the fault itself: a frozen process, past two heartbeats
        frozen.send(signal.SIGCONT)
        t_cont = time.time()
        wait_until(lambda: _lease_lost_lines(frozen.stderr()) > 0, 30,
                   lambda: f"the thawed worker to find its jobs lost\n{frozen.stderr()[-3000:]}")
        # It works on, on a new channel: give it jobs and see it run some.
        for n in range(FREEZE_JOBS, 2 * FREEZE_JOBS):
            history.record(n, lambda n=n: task.enqueue(n, 0.05).id)
        ok = history.ok_ids()
        wait_until(lambda: ok.keys() <= {int(r["n"]) for r in read_effects(cluster.log)}, 60,
                   lambda: f"every job to run\n{cluster.diagnosis()}")
        codes = cluster.sigterm_all()
        left = _lanes_left(url)

        effects = read_effects(cluster.log)
        report = check_effects("R19 rabbitmq freeze", "rabbitmq", seed, history, effects,
                               free_handouts=MAX_STALLS)
        # Handed out again after the frozen worker's connection was dropped: jobs the frozen
        # worker had started that the other one ran. (Not "a later attempt": a broker alone
        # charges no attempt for the first MAX_STALLS hand-outs it took back.)
        last = {}
        for r in effects:
            last[int(r["job"])] = max(last.get(int(r["job"]), 0), int(r["attempt"]))
        started_frozen = {int(e["job_id"]) for e in job_log(frozen) if e.get("outcome") == "started"}
        taken = started_frozen & {int(r["job"]) for r in effects if r["pid"] == other.pid}
        # The outcomes the workers recorded (their DEBUG log, as JSON): (job, attempt) acked.
        acks = [(pname, int(e["job_id"]), int(e["attempt"]))
                for pname, p in (("frozen", frozen), ("other", other)) for e in job_log(p)
                if e.get("outcome") == "succeeded"]
        acked = Counter(j for _, j, _ in acks)
        discarded = {int(e["job_id"]) for e in job_log(frozen)
                     if e.get("outcome") == "lease_lost" and "discarded" in e["message"]}
        after = [r for r in effects if r["pid"] == frozen.pid and r["t0"] > t_cont]
        report.faults = {"sigstop": 1}
        report.duplicate_bound = 2 * spec.concurrency
        report.figures = {"freeze_s": round(t_cont - t_stop, 1), "heartbeat_s": HEARTBEAT,
                          "taken_over": len(taken), "late_acks_refused": len(discarded),
                          "lease_lost_logged": _lease_lost_lines(frozen.stderr()),
                          "frozen_ran_after_thaw": len(after)}
        report.emit()

        report.assert_clean(expect=None, context=cluster.diagnosis())
        assert all(c == 0 for c in codes.values()), codes
        assert not any(left.values()), f"messages left on the broker: {left}"
        assert taken, "the frozen worker's jobs were not handed out again"
        assert _lease_lost_lines(frozen.stderr()), "the thawed worker did not notice"
        # One outcome per job, from its last attempt: no zombie's ack was taken.
        stale = [(p, j, a) for p, j, a in acks if a != last[j]]
        assert not stale, f"acks of attempts the broker had taken back: {stale}"
        assert not [j for j, c in acked.items() if c > 1], f"jobs acked twice: {acks}"
        # A job with no recorded ack must be one whose ack reached the broker although the
        # frozen worker could not tell (AMQP acks are not answered; its connection died under
        # the ack): then it ran exactly once and nobody else ran it.
        unacked = set(ok.values()) - set(acked)
        assert all(j in discarded and last[j] == 1 for j in unacked), \
            f"jobs never acked: {sorted(unacked)[:10]}"
        assert after, "the thawed worker ran nothing more (it did not recover its connection)"
    finally:
        app.close()
