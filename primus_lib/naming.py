"""The names Primus gives things in Airflow, in one place: the tag, the pool, task ids, DAG params,
asset URIs, the API connection, and where the job specs live.

They are part of every deployment's Airflow history (task instances, pools, asset events, tags,
connections), so they never change. The DAG factory, the operators, the pool listener, the view
and ``primus backfill`` import them from here; none spells them (tests/test_naming.py reads the
source for that). Names only: no Airflow import, nothing heavy (DAG parsing imports this).
"""

from __future__ import annotations

from pathlib import Path

TAG = "primus"  # on every Primus DAG: the view lists the DAGs carrying it

POOL_PREFIX = "primus-"

# Task ids. A batch stream's tasks sit in a task group named after the stream: "<stream>.join".
TRAIN_TASK = "train"
SCALE_TASK = "scale"
JOIN_TASK = "join"
SINK_TASK = "sink"
SOURCE_TASK_PREFIX = "source_"
EXECUTE_TASK_PREFIX = "execute_"  # the mapped data tasks (one per planned data task of a source)

# DAG params (a manual run's conf, a backfill's dag_run_conf)
MODE_PARAM = "mode"
WINDOW_PARAM = "window_start"

ASSET_SCHEME = "primus"
MODEL_ASSET = "model"  # the trainer's asset; a batch stream's is named after the stream

API_CONNECTION = "primus_airflow_api"  # HTTP connection to Airflow's API server: pools, notes, backfills

DEFAULT_JOBS_DIR = Path(__file__).resolve().parents[1] / "config" / "jobs"  # the checkout's (editable install)
SPEC_SUFFIXES = (".yaml", ".yml")


def pool_name(job_name: str) -> str:
    """The Airflow pool of a job's batch data executors (one slot per executor)."""
    return f"{POOL_PREFIX}{job_name}"


def pool_job(pool: str | None) -> str | None:
    """The job whose data executors ``pool`` holds; None for a pool that is not a Primus job's."""
    return pool[len(POOL_PREFIX) :] if pool and pool.startswith(POOL_PREFIX) else None


def source_task(source: str) -> str:
    """The task that waits for a source's window and plans its data tasks."""
    return f"{SOURCE_TASK_PREFIX}{source}"


def execute_task(source: str) -> str:
    """The mapped task that runs a source's data tasks in the job's pool."""
    return f"{EXECUTE_TASK_PREFIX}{source}"


def asset_uri(job_name: str, name: str) -> str:
    """The asset a job's sink (``name`` = the batch stream) or trainer (``MODEL_ASSET``) updates."""
    return f"{ASSET_SCHEME}://{job_name}/{name}"


def jobs_dir() -> Path:
    """Where the job specs live: ``$PRIMUS_JOBS_DIR``, else ``config/jobs`` of the checkout."""
    from primus_lib.settings import settings

    return Path(settings().jobs_dir or DEFAULT_JOBS_DIR).resolve()


def spec_files(folder: Path | None = None) -> list[Path]:
    """The job spec files of ``folder`` (default ``jobs_dir()``), sorted; [] when it does not exist."""
    folder = folder or jobs_dir()
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in SPEC_SUFFIXES and p.is_file())
