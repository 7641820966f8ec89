"""Run windows of one Primus DAG with ``dag.test()`` in this process and report as JSON.

Used by test_dag_test.py in a subprocess with its own AIRFLOW_HOME (Airflow binds its
configuration and DB at import). argv: dags folder, dag id, output file, ``ISO@mode``...
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import datetime


def main(dags: str, dag_id: str, out: str, runs: list[str]) -> None:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from primus_operators.local_runs import run_windows
    from sqlalchemy import select

    pairs = [(datetime.fromisoformat(when), mode) for when, mode in (item.rsplit("@", 1) for item in runs)]
    report = [asdict(run) for run in run_windows(dags, dag_id, pairs)]
    with create_session() as session:
        events = session.execute(
            select(AssetModel.uri, AssetEvent.extra)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .order_by(AssetEvent.id)
        ).all()
    with open(out, "w") as handle:
        json.dump({"runs": report, "asset_events": [{"uri": u, "extra": e} for u, e in events]}, handle, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
