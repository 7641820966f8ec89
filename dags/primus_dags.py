"""Airflow DAG file of Primus: one DAG per job spec in config/jobs/ ($PRIMUS_JOBS_DIR overrides).

This file keeps ``primus_jobs/`` in sync (one generated DAG file per spec: a broken spec then
shows as an import error of its own file, naming the spec file and field, and no other DAG
breaks). New specs appear after Airflow's next DAG-folder listing
(``[dag_processor] refresh_interval``); ``python dags/primus_dags.py`` syncs at once.
Task runs parse only their own job's stub, so nothing is written from workers.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # Airflow adds the bundle root; plain imports and DagBag(...) may not
    sys.path.insert(0, _HERE)

from airflow.sdk import get_parsing_context  # noqa: E402
from primus_dag_factory import HERE, sync_stubs  # noqa: E402

if get_parsing_context().dag_id is None:  # the DAG processor, not a task run of one DAG
    sync_stubs(HERE)

if __name__ == "__main__":
    for stub in sync_stubs(HERE):
        print(stub)
