"""What the executor does for workflows (issue 35): a chain step with ``pass_result`` gets its
parent's result as its first argument, and ``current_job().parent_results()`` reads the
parents' results. A dict of stored jobs stands in for the store; async tasks need no threads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from conveyor import Conveyor, Job, JobState, current_job
from conveyor.executor import Execution, Outcome, OutcomeKind


class Jobs:
    """A store that only reads jobs back."""

    def __init__(self, *jobs: Job) -> None:
        self.jobs = {j.id: j for j in jobs}

    def get(self, job_id: int) -> Job | None:
        return self.jobs.get(job_id)


def job(job_id: int, task: str = "t", *, state: JobState = JobState.SUCCEEDED,
        result: Any = None, args: dict[str, Any] | None = None,
        parents: tuple[int, ...] = (), meta: dict[str, Any] | None = None) -> Job:
    return Job(id=job_id, task=task, queue="default", args=args or {}, state=state, attempts=1,
               max_attempts=3, priority=0, run_at=0.0, timeout=30.0, created_at=0.0,
               result=result, parents=parents, meta=meta or {})


@pytest.fixture
def app(tmp_path: Path) -> Conveyor:
    app = Conveyor(f"sqlite:///{tmp_path}/unused.db")

    @app.task(name="double")
    async def double(x: Any, plus: int = 0) -> Any:
        return x * 2 + plus if isinstance(x, int) else x

    @app.task(name="parents")
    async def parents() -> Any:
        ctx = current_job()
        assert ctx is not None
        return {str(k): v for k, v in ctx.parent_results().items()}

    return app


def run(app: Conveyor, j: Job, store: Jobs) -> Outcome:
    async def go() -> Outcome:
        return await Execution(j, app.tasks, None, store).run()  # type: ignore[arg-type]

    return asyncio.run(go())


def test_a_step_gets_its_parents_result_as_its_first_argument(app: Conveyor) -> None:
    store = Jobs(job(1, result=20))
    step = job(2, "double", state=JobState.RUNNING, args={"plus": 1}, parents=(1,),
               meta={"pass_result": {"many": False}})
    outcome = run(app, step, store)
    assert outcome.kind is OutcomeKind.SUCCEEDED and json.loads(outcome.result or "") == 41


def test_after_a_group_the_step_gets_the_list_of_results_in_order(app: Conveyor) -> None:
    store = Jobs(job(5, result="a"), job(6, result="b"), job(7, result="c"))
    step = job(8, "double", state=JobState.RUNNING, parents=(5, 6, 7),
               meta={"pass_result": {"many": True}})
    outcome = run(app, step, store)
    assert json.loads(outcome.result or "") == ["a", "b", "c"]


def test_a_parent_that_is_gone_makes_the_step_dead_with_bad_arguments(app: Conveyor) -> None:
    step = job(2, "double", state=JobState.RUNNING, parents=(1,),
               meta={"pass_result": {"many": False}})
    outcome = run(app, step, Jobs())
    assert outcome.kind is OutcomeKind.DEAD
    assert outcome.error is not None and outcome.error.kind == "bad_arguments"
    assert "parent job 1" in outcome.error.message


def test_stored_arguments_that_already_fill_the_parameter_are_refused(app: Conveyor) -> None:
    step = job(2, "double", state=JobState.RUNNING, args={"x": 3}, parents=(1,),
               meta={"pass_result": {"many": False}})
    outcome = run(app, step, Jobs(job(1, result=20)))
    assert outcome.error is not None and outcome.error.kind == "bad_arguments"


def test_parent_results_reads_every_parent_and_none_for_one_that_failed(app: Conveyor) -> None:
    store = Jobs(job(1, result={"n": 1}), job(2, state=JobState.DEAD, result=None),
                 job(3, result=[3]))
    ctx_job = job(9, "parents", state=JobState.RUNNING, parents=(1, 2, 3))
    outcome = run(app, ctx_job, store)
    assert json.loads(outcome.result or "") == {"1": {"n": 1}, "2": None, "3": [3]}


def test_parent_results_of_a_job_without_parents_is_empty(app: Conveyor) -> None:
    outcome = run(app, job(9, "parents", state=JobState.RUNNING), Jobs())
    assert json.loads(outcome.result or "") == {}
