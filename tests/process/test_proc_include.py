"""A real ``conveyor worker --app`` process (and its ``--processes`` children) whose app lists
its task modules in ``include=``: every module's tasks run, and the start log says which."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest
from processrig import Proc, Rig

from conveyor import JobState

pytestmark = pytest.mark.process

APP = """
from conveyor import Conveyor

app = Conveyor(include=["incmail", "incbilling"])  # the store: $CONVEYOR_URL
"""
MAIL = """
import os
from incapp import app

@app.task(queue="mail")
def send_welcome(user: str) -> dict:
    return {"to": user, "pid": os.getpid()}
"""
BILLING = """
import os
from incapp import app

@app.task
def charge(amount: int) -> dict:
    return {"charged": amount, "pid": os.getpid()}
"""


def spawn(rig: Rig, *args: str, name: str) -> Proc:
    """``conveyor <args>`` in the rig's directory, where the app's modules are (not procapp)."""
    out, err = rig.tmp / f"{name}.stdout", rig.tmp / f"{name}.stderr"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        popen = subprocess.Popen([sys.executable, "-m", "conveyor", *args], env=rig.env,
                                 cwd=rig.tmp, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                                 start_new_session=True)
    proc = Proc(popen, name, out, err)
    rig.procs.append(proc)
    return proc


def enqueue(rig: Rig, task: str, args: list[object]) -> int:
    out = subprocess.run([sys.executable, "-m", "conveyor", "enqueue", task, "--args",
                          json.dumps(args), "--app", "incapp:app", "--json"],
                         env=rig.env, cwd=rig.tmp, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)["id"])


@pytest.mark.parametrize("processes", [1, 2])
def test_a_worker_runs_the_tasks_of_every_included_module(rig: Rig, processes: int) -> None:
    for module, source in (("incapp", APP), ("incmail", MAIL), ("incbilling", BILLING)):
        (rig.tmp / f"{module}.py").write_text(source)
    jobs = [enqueue(rig, "incmail.send_welcome", ["ada"]) for _ in range(4)]
    jobs += [enqueue(rig, "incbilling.charge", [n]) for n in range(4)]

    w = spawn(rig, "worker", "--app", "incapp:app", "--processes", str(processes),
              "--concurrency", "2", "--poll-interval", "0.2", "--visibility-timeout", "2",
              name="W")
    rig.wait_started(w, processes)
    done = [rig.wait_job(j, timeout=30) for j in jobs]
    w.send(signal.SIGTERM)
    assert w.wait(20) == 0, w.stderr()

    assert [j.state for j in done] == [JobState.SUCCEEDED] * len(jobs)
    assert {j.result["to"] for j in done if j.task == "incmail.send_welcome"} == {"ada"}
    charged = sorted(j.result["charged"] for j in done if j.task == "incbilling.charge")
    assert charged == [0, 1, 2, 3]
    # Without --queues, the worker serves every queue of the included tasks.
    stderr = w.stderr()
    assert re.search(r"queues default,mail", stderr), stderr
    for line in ("tasks from incmail: send_welcome", "tasks from incbilling: charge"):
        assert len(re.findall(rf"worker \S+ {line}$", stderr, re.M)) == processes, stderr
    if processes > 1:
        assert len({j.result["pid"] for j in done}) >= 1
        assert w.pid not in {j.result["pid"] for j in done}, "the supervisor ran a job itself"
