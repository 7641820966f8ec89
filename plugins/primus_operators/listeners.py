"""Scheduler-side listener: create a job's executor pool (``naming.pool_name``) when a run starts.

Tasks cannot write to the metadata DB in Airflow 3, so the scheduler makes the pool when a DAG
run of a Primus DAG turns running. The listener runs inside the scheduler loop's guarded
transaction (a commit there breaks its HA locks), so the pool is written from a short-lived
thread with its own session. Its size is ``resources.roles.data_executor.replicas`` (1 when
the role is absent); the scaler changes it later. ``primus backfill --api`` also ensures it.
"""

from __future__ import annotations

import logging
import threading

from airflow.listeners import hookimpl

from primus_lib.naming import pool_job, spec_files

log = logging.getLogger(__name__)


def pool_size(job_name: str) -> int:
    """Executor slots for a job, read from its spec in the jobs folder (1 if not found)."""
    from primus_lib.spec import SpecError, load_job

    for path in spec_files():
        try:
            job = load_job(path)
        except SpecError:
            continue
        if job.name == job_name:
            role = job.spec.resources.roles.get("data_executor")
            return max(1, role.replicas) if role else 1
    return 1


def ensure_pool(name: str, slots: int) -> bool:
    """Create pool ``name`` with ``slots`` if missing; True if it was created."""
    from airflow.models.pool import Pool

    if Pool.get_pool(name) is not None:
        return False
    Pool.create_or_update_pool(name, slots, f"Primus data executors of job {pool_job(name)}", include_deferred=False)
    log.info("created pool %s with %d slots", name, slots)
    return True


def _ensure_pools(pools: dict[str, str]) -> None:
    """``pools``: each Primus pool of the run -> its job."""
    try:
        for pool, job in pools.items():
            ensure_pool(pool, pool_size(job))
    except Exception:  # never let a pool problem escape into the scheduler
        log.exception("primus: could not ensure pools %s", sorted(pools))


@hookimpl
def on_dag_run_running(dag_run, msg: str) -> None:
    try:
        dag = dag_run.dag
        pools = {t.pool: job for t in dag.tasks if (job := pool_job(t.pool))} if dag else {}
    except Exception:  # a listener must never break the scheduler loop
        log.exception("primus: could not read the pools of a DAG run")
        return
    if pools:
        # Own thread = own scoped session: no commit on the scheduler's guarded session.
        worker = threading.Thread(target=_ensure_pools, args=(pools,), name="primus-pools", daemon=True)
        worker.start()
        worker.join(timeout=10)
