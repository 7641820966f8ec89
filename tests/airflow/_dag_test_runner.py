"""Run windows of one Primus DAG with ``dag.test()`` in this process and report as JSON.

Used by test_dag_test.py in a subprocess with its own AIRFLOW_HOME (Airflow binds its
configuration and DB at import). argv: dags folder, dag id, output file, ``ISO@mode``...
"""

from __future__ import annotations

import json
import sys
from datetime import datetime


def main(dags: str, dag_id: str, out: str, runs: list[str]) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from primus_operators.listeners import ensure_pool, pool_size
    from sqlalchemy import select

    bag = DagBag(dag_folder=dags)
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags[dag_id]
    ensure_pool(f"primus-{dag_id}", pool_size(dag_id))
    report = []
    for item in runs:
        when, mode = item.rsplit("@", 1)
        dr = dag.test(logical_date=datetime.fromisoformat(when), run_conf={"mode": mode})
        with create_session() as session:
            tis = {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in dr.get_task_instances(session=session)}
            row = session.scalars(
                select(XComModel).where(
                    XComModel.dag_id == dag_id,
                    XComModel.run_id == dr.run_id,
                    XComModel.task_id == "train",
                    XComModel.key == "return_value",
                )
            ).first()
            metrics = XComModel.deserialize_value(row) if row is not None else None
        report.append({"window": when, "mode": mode, "state": str(dr.state), "tasks": tis, "metrics": metrics})
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
