"""How much does Primus add to DAG parsing? Parse dags/ with 1 and with 20 job specs, each
file in a fresh interpreter the way Airflow's DAG processor does, against an empty DAG file.

Each round runs one subprocess per parse that imports Airflow, then times only the DagBag
fill of the folder (module import of primus_dags.py + every generated stub); the median of
ROUNDS rounds is reported. Last line: one JSON object (ratio = 20 specs / empty DAG file).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 5))
SPEC = (ROOT / "config" / "jobs" / "ctr-demo.yaml").read_text()
EMPTY_DAG = """from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

with DAG("empty", schedule=None, start_date=datetime(2026, 11, 1)):
    pass
"""
TIMER = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
t = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
took = time.perf_counter() - t
heavy = sorted(m for m in ("torch", "pyarrow", "confluent_kafka", "pandas") if m in sys.modules)
print(json.dumps({"seconds": took, "dags": len(bag.dags), "errors": len(bag.import_errors), "heavy": heavy}))
"""


def primus_folder(root: Path, specs: int) -> tuple[Path, dict[str, str]]:
    jobs, dags = root / f"jobs{specs}", root / f"dags{specs}"
    jobs.mkdir()
    for i in range(specs):
        (jobs / f"job-{i:02d}.yaml").write_text(SPEC.replace("name: ctr-demo", f"name: job-{i:02d}"))
    dags.mkdir()
    for name in ("primus_dags.py", "primus_dag_factory.py", ".airflowignore"):
        shutil.copy2(ROOT / "dags" / name, dags / name)
    env = {"PRIMUS_JOBS_DIR": str(jobs)}
    subprocess.run(
        [sys.executable, str(dags / "primus_dags.py")], env={**os.environ, **env}, check=True, capture_output=True
    )
    return dags, env


def parse(folder: Path, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", TIMER, str(folder)],
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    base_env = {
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PRIMUS_DATA": "/tmp/primus-bench-data",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR",
    }
    with tempfile.TemporaryDirectory(prefix="primus-bench-") as tmp:
        root = Path(tmp)
        base_env["AIRFLOW_HOME"] = str(root / "airflow")
        empty = root / "empty"
        empty.mkdir()
        (empty / "empty_dag.py").write_text(EMPTY_DAG)
        cases = {"empty": (empty, {})}
        for n in (1, 20):
            cases[f"specs_{n}"] = primus_folder(root, n)
        samples: dict[str, list[dict]] = {name: [] for name in cases}
        for _ in range(ROUNDS):
            for name, (folder, env) in cases.items():
                samples[name].append(parse(folder, {**base_env, **env}))
    median = {name: statistics.median(s["seconds"] for s in runs) for name, runs in samples.items()}
    for name, runs in samples.items():
        last = runs[-1]
        print(
            f"{name:9s} median {median[name] * 1000:8.1f} ms  dags={last['dags']} errors={last['errors']} heavy_imports={last['heavy']}"
        )
    result = {
        "bench": "dag_parse",
        "ratio": median["specs_20"] / median["empty"],
        "ratio_vs_empty_1spec": median["specs_1"] / median["empty"],
        "empty_ms": round(median["empty"] * 1000, 1),
        "specs_1_ms": round(median["specs_1"] * 1000, 1),
        "specs_20_ms": round(median["specs_20"] * 1000, 1),
        "per_spec_ms": round((median["specs_20"] - median["specs_1"]) / 19 * 1000, 1),
        "dags_20": samples["specs_20"][-1]["dags"],
        "import_errors": sum(s[-1]["errors"] for s in samples.values()),
        "heavy_imports": sorted({m for runs in samples.values() for s in runs for m in s["heavy"]}),
        "rounds": ROUNDS,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
