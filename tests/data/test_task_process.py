"""A data task as the DAG runs it: one fresh process per mapped task (and one for the Joiner).

Their start-up is most of a small task's cost (bench/executor.py), so these check what such a
process loads and that the shortcuts taken for it give the same bytes as the long-lived path.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from primus_lib.data.dtgg import plan_source
from primus_lib.data.executor import execute_task
from primus_lib.data.executor.metrics import _queued_in_sqlite, batch_backlog
from primus_lib.data.executor.task import read_staged, staging_path
from primus_lib.data.schema import hash_buckets
from primus_lib.data.training_queue import TrainingQueue
from primus_lib.paths import JobPaths
from tests.data.helpers import T0, write_layout
from tests.fixtures.specs import demo_doc, load, write_spec

HEAVY = ("pandas", "polars", "sqlalchemy", "confluent_kafka", "primus_lib.data.executor.join", "primus_lib.data.dtgg")

# what PrimusDataTaskOperator.execute runs (without Airflow), then the heavy modules it loaded
TASK_PROCESS = """
import json, sys
from primus_lib.data.executor import execute_task
from primus_lib.data.executor.task import skip_arrow_pandas_probe
from primus_lib.data.task import DataTask
from primus_lib.spec import load_job

skip_arrow_pandas_probe()
output = execute_task(load_job(sys.argv[1]), DataTask.from_dict(json.loads(sys.argv[2])))
print(json.dumps({"rows": output.rows, "checksum": output.checksum,
                  "loaded": [m for m in json.loads(sys.argv[3]) if m in sys.modules]}))
"""


def spec_file(tmp_path, name: str) -> tuple:
    storage = {"root": str(tmp_path / name / "jobs")}
    doc = demo_doc(f"file://{tmp_path / 'data'}", hours=1, rows_per_shard=100, storage=storage)
    return load(doc), write_spec(tmp_path / f"{name}.yaml", doc)


def test_a_data_task_process_loads_no_pandas_polars_or_sqlalchemy_and_stages_the_same_bytes(tmp_path):
    """The mapped task's process reads with pyarrow (Polars' import would cost more than its
    reader saves on a small task) and leaves pandas, SQLAlchemy (the backlog metric reads SQLite
    directly), the join and the planner unloaded; a long-lived executor with Polars loaded
    stages the same bytes."""
    import polars  # noqa: F401  (this process: the long-lived executor, Polars' reader)

    write_layout(tmp_path / "data", hours=1, rows=300, files=2)
    job, spec = spec_file(tmp_path, "process")
    warm = load(
        demo_doc(f"file://{tmp_path / 'data'}", hours=1, rows_per_shard=100), storage=tmp_path / "warm" / "jobs"
    )
    for source in ("impressions", "clicks"):
        for task, same in zip(
            plan_source(job, "history", source, T0), plan_source(warm, "history", source, T0), strict=True
        ):
            done = subprocess.run(
                [sys.executable, "-c", TASK_PROCESS, str(spec), task.to_json(), json.dumps(HEAVY)],
                check=True,
                capture_output=True,
                text=True,
            )
            got = json.loads(done.stdout.strip().splitlines()[-1])
            assert got["loaded"] == []
            expected = execute_task(warm, same)
            assert (got["rows"], got["checksum"]) == (expected.rows, expected.checksum)
            assert read_staged(staging_path(job, task)).equals(read_staged(staging_path(warm, same)))


PANDAS_AFTER_PROBE = """
import json, sys
import pyarrow as pa
from primus_lib.data.executor.task import skip_arrow_pandas_probe
from primus_lib.data.schema import hash_buckets

skip_arrow_pandas_probe()
ids = pa.array(json.loads(sys.argv[1]))
assert "pandas" not in sys.modules
hashed = hash_buckets(ids, 1000).tolist()  # string ids: pandas' hash_array, imported here
import pandas as pd
frame = pa.Table.from_pandas(pd.DataFrame({"x": [1, 2]})).to_pandas()
print(json.dumps({"hashed": hashed, "frame": frame["x"].tolist(), "series": pa.array(pd.Series([3, 4])).to_pylist()}))
"""


def test_pandas_works_in_a_process_that_skipped_arrows_pandas_probe():
    ids = ["a", "b", "a", "zz", ""]
    done = subprocess.run(
        [sys.executable, "-c", PANDAS_AFTER_PROBE, json.dumps(ids)], check=True, capture_output=True, text=True
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"hashed": hash_buckets(pa.array(ids), 1000).tolist(), "frame": [1, 2], "series": [3, 4]}


def test_the_backlog_reads_a_local_ledgers_training_queue_as_the_training_queue_does(tmp_path):
    write_layout(tmp_path / "data", hours=1, rows=10, files=1)
    job = load(demo_doc(f"file://{tmp_path / 'data'}", hours=3, rows_per_shard=100), storage=tmp_path / "jobs")
    ledger = JobPaths.for_job(job).ledger
    queue = TrainingQueue(ledger)
    assert _queued_in_sqlite(ledger) == []
    for window, stream in (("20261101T000000Z", "history"), ("20261101T010000Z", "history"), ("w", "other")):
        queue.append(stream, window, f"/x/{window}", 5)
    assert _queued_in_sqlite(ledger) == [(w.stream, w.window) for w in queue.windows()]
    assert batch_backlog(job) == pytest.approx(2 / 3)  # 2 history windows queued, none trained, 3 ahead


def test_a_ledger_without_a_training_queue_has_no_backlog(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    with sqlite3.connect(ledger) as db:
        db.execute("CREATE TABLE other (x INTEGER)")
    assert _queued_in_sqlite(ledger) == []


def test_the_probe_skip_is_a_no_op_once_pandas_is_loaded():
    import pandas  # noqa: F401

    from primus_lib.data.executor.task import skip_arrow_pandas_probe

    before = list(sys.meta_path)
    skip_arrow_pandas_probe()
    assert sys.meta_path == before and pa.array(np.arange(2)).to_pylist() == [0, 1]
