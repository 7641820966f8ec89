"""What the view needs from Airflow's metadata database: a Primus DAG's spec file and docs (from
its serialized DAG), the runs of each window, and its data executors' pool. Read in the API
server through Airflow's ORM session; everything about the job itself is primus_lib.jobview's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from primus_lib.naming import EXECUTE_TASK_PREFIX, TAG, TRAIN_TASK

# the mapped data tasks, ``<stream>.execute_<source>``, as a LIKE pattern ("_" escaped)
DATA_TASKS_LIKE = "%." + EXECUTE_TASK_PREFIX.replace("_", "\\_") + "%"


@dataclass(frozen=True)
class PrimusDag:
    dag_id: str
    spec_path: str
    doc_md: str | None


def primus_dag(dag_id: str) -> PrimusDag | None:
    """The DAG's spec (its trainer task's ``spec_path``) and docs; None when the DAG is unknown
    or not a Primus job's."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        dag = SerializedDagModel.get_dag(dag_id, session=session)
    if dag is None or TAG not in (dag.tags or ()) or not dag.has_task(TRAIN_TASK):
        return None
    spec_path = getattr(dag.get_task(TRAIN_TASK), "spec_path", None)
    if not spec_path:
        return None
    return PrimusDag(dag_id, str(spec_path), getattr(dag, "doc_md", None))


def primus_dag_ids() -> list[str]:
    """Every DAG with the Primus tag (one per job spec), sorted."""
    from airflow.models.dag import DagModel, DagTag
    from airflow.utils.session import create_session

    query = select(DagModel.dag_id).join(DagTag, DagTag.dag_id == DagModel.dag_id).where(DagTag.name == TAG)
    with create_session() as session:
        return sorted(set(session.scalars(query)))


def window_runs(dag_id: str) -> list[dict[str, Any]]:
    """The DAG's runs, each with the window it processes (``primus_lib.jobview.window_of_run``) and
    its data tasks' states (``DATA_TASKS_LIKE``)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from primus_lib.jobview import window_of_run

    out = []
    with create_session() as session:
        tasks = _data_task_states(session, dag_id)
        for run in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id)):
            try:
                window = window_of_run(run.data_interval_start, run.logical_date, run.conf)
            except ValueError:  # a manual run with a malformed window_start: shown nowhere
                continue
            if window is None:
                continue
            out.append(
                {
                    "window": window,
                    "run_id": run.run_id,
                    "state": str(run.state),
                    "run_type": str(run.run_type),
                    "start_date": _iso(run.start_date),
                    "end_date": _iso(run.end_date),
                    "data_tasks": tasks.get(run.run_id, {}),
                }
            )
    return out


def _data_task_states(session, dag_id: str) -> dict[str, dict[str, int]]:
    """run id -> data-task state -> count, in one query."""
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import func

    query = (
        select(TI.run_id, TI.state, func.count())
        .where(TI.dag_id == dag_id, TI.task_id.like(DATA_TASKS_LIKE, escape="\\"))
        .group_by(TI.run_id, TI.state)
    )
    out: dict[str, dict[str, int]] = {}
    for run_id, state, count in session.execute(query):
        out.setdefault(run_id, {})[str(state or "none")] = count
    return out


def pool_slots(pool: str) -> int | None:
    """The pool's slots (the batch data executors' count), None when it does not exist yet."""
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.scalar(select(Pool.slots).where(Pool.pool == pool))


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None
