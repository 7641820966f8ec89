from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from airflow.dag_processing.dagbag import DagBag
from primus_operators.dag_factory import sync_stubs

from tests.fixtures.airflow import ROOT, copy_dags
from tests.fixtures.specs import AIRFLOW_ROLES, airflow_doc, write_spec

KUBE_ROLES = {role: {**fields, "image": "primus:1"} for role, fields in AIRFLOW_ROLES.items()}


def _sync(dags: Path, env_jobs: Path | None, monkeypatch) -> None:
    if env_jobs is not None:
        monkeypatch.setenv("PRIMUS_JOBS_DIR", str(env_jobs))
    sync_stubs(dags)


def test_dagbag_of_the_repo_dags_folder_has_no_import_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path))
    monkeypatch.delenv("PRIMUS_JOBS_DIR", raising=False)
    subprocess.run([sys.executable, str(ROOT / "dags" / "primus_dags.py")], check=True, capture_output=True)
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    assert "ctr-demo" in bag.dag_ids
    dag = bag.dags["ctr-demo"]
    ids = {t.task_id for t in dag.tasks}
    assert {
        "history.source_impressions",
        "history.source_clicks",
        "history.execute_impressions",
        "history.join",
        "history.sink",
        "train",
    } <= ids


def test_one_broken_spec_breaks_only_its_own_dag_and_names_file_and_field(monkeypatch, tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write_spec(jobs / "alpha.yaml", airflow_doc("alpha"))
    write_spec(jobs / "omega.yml", airflow_doc("omega"))
    write_spec(jobs / "broken.yaml", airflow_doc("broken", window="2h"))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    dags = copy_dags(tmp_path / "dags")
    _sync(dags, jobs, monkeypatch)
    bag = DagBag(dag_folder=str(dags))
    assert sorted(bag.dag_ids) == ["alpha", "omega"]
    assert len(bag.import_errors) == 1
    ((where, error),) = bag.import_errors.items()
    assert where.endswith("primus_jobs/broken.py")
    assert "broken.yaml" in error and "spec.timer.window" in error and "'1h' or '1d'" in error


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and mtime: what parsing must leave alone."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    }


def test_the_deploy_step_makes_every_dag_visible_on_the_first_parse_and_parsing_writes_nothing(monkeypatch, tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for name in ("alpha", "omega", "zeta"):
        write_spec(jobs / f"{name}.yaml", airflow_doc(name))
    write_spec(jobs / "broken.yaml", airflow_doc("broken", window="2h"))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PRIMUS_JOBS_DIR", str(jobs))
    dags = copy_dags(tmp_path / "dags")  # a fresh copy of dags/, as a git-sync or an image delivers it
    deploy = [sys.executable, str(dags / "primus_dags.py")]
    assert subprocess.run([*deploy, "--check"], capture_output=True).returncode == 1  # nothing generated yet
    subprocess.run(deploy, check=True, capture_output=True)
    assert subprocess.run([*deploy, "--check"], capture_output=True).returncode == 0
    before = _tree(dags)
    bag = DagBag(dag_folder=str(dags))  # the DAG processor's first pass over the folder
    assert sorted(bag.dag_ids) == ["alpha", "omega", "zeta"]
    assert {Path(d.fileloc).name for d in bag.dags.values()} == {"alpha.py", "omega.py", "zeta.py"}
    ((where, error),) = bag.import_errors.items()
    assert where.endswith("primus_jobs/broken.py")
    assert "broken.yaml" in error and "spec.timer.window" in error
    assert _tree(dags) == before  # parsing wrote nothing (a read-only bundle parses the same)


def test_out_of_date_dag_files_are_an_import_error_of_primus_dags_naming_the_fix(monkeypatch, tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write_spec(jobs / "alpha.yaml", airflow_doc("alpha"))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PRIMUS_JOBS_DIR", str(jobs))
    dags = copy_dags(tmp_path / "dags")
    bag = DagBag(dag_folder=str(dags))
    assert bag.dag_ids == [] and not (dags / "primus_jobs").exists()  # never generated while parsing
    ((where, error),) = bag.import_errors.items()
    assert where.endswith("primus_dags.py")
    assert "primus_jobs/alpha.py missing" in error and "python dags/primus_dags.py" in error
    _sync(dags, None, monkeypatch)
    (dags / "primus_jobs" / "mine.py").write_text("# a user's file, not generated\n")
    (jobs / "alpha.yaml").rename(jobs / "beta.yaml")
    errors = DagBag(dag_folder=str(dags)).import_errors
    assert "primus_jobs/beta.py missing" in errors[str(dags / "primus_dags.py")]
    assert "alpha.py has no spec any more" in errors[str(dags / "primus_dags.py")]
    assert "alpha.yaml: no such job spec" in errors[str(dags / "primus_jobs" / "alpha.py")]
    _sync(dags, None, monkeypatch)
    assert sorted(p.name for p in (dags / "primus_jobs").glob("*.py")) == ["beta.py", "mine.py"]
    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {} and bag.dag_ids == ["alpha"]  # the job's name, from beta.yaml


def test_dag_shape_pool_sink_order_asset_params_and_doc(monkeypatch, tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write_spec(jobs / "alpha.yaml", airflow_doc("alpha", airflow={"poll_interval": "1s", "trainer_wait": "40s"}))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    dags = copy_dags(tmp_path / "dags")
    _sync(dags, jobs, monkeypatch)
    dag = DagBag(dag_folder=str(dags)).dags["alpha"]
    execute = dag.get_task("history.execute_clicks")
    assert execute.pool == "primus-alpha"
    sink = dag.get_task("history.sink")
    assert sink.depends_on_past is True
    assert [a.uri for a in sink.outlets] == ["primus://alpha/history"]
    assert set(dag.get_task("train").upstream_task_ids) == {"history.sink"}
    assert set(dag.get_task("history.join").upstream_task_ids) == {
        "history.execute_impressions",
        "history.execute_clicks",
    }
    assert sorted(t.task_id for t in dag.tasks) == [  # users' Airflow history holds these ids
        "history.execute_clicks",
        "history.execute_impressions",
        "history.join",
        "history.sink",
        "history.source_clicks",
        "history.source_impressions",
        "scale",
        "train",
    ]
    # the scaler follows the window's data, beside the trainer: a window still training does not hold it back
    assert set(dag.get_task("scale").upstream_task_ids) == {"history.sink"}
    train = dag.get_task("train")
    assert [a.uri for a in train.outlets] == ["primus://alpha/model"] and train.mode == "{{ params.mode }}"
    assert train.retries == 2  # idempotent, like join and sink: a lost try does not fail the window
    assert train.wait_in_worker == 40.0 and train.poll_interval == 1.0  # spec.airflow's
    assert dag.params["mode"] == "service" and "window_start" in dag.params
    assert "primus" in dag.tags and "window:1h" in dag.tags
    assert "```mermaid" in dag.doc_md and "left join on request_id" in dag.doc_md
    assert dag.timetable.serialize()["window"] == "1h"


def test_kubernetes_jobs_get_the_vertical_scalers_pod_override_on_the_data_tasks(monkeypatch, tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write_spec(jobs / "kube.yaml", airflow_doc("kube", backend="kubernetes", roles=KUBE_ROLES))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    dags = copy_dags(tmp_path / "dags")
    _sync(dags, jobs, monkeypatch)
    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {}
    pod = bag.dags["kube"].get_task("history.execute_impressions").partial_kwargs["executor_config"]["pod_override"]
    assert pod.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}


def test_the_dag_files_need_nothing_on_sys_path_but_the_installed_package(monkeypatch, tmp_path):
    """A DAG folder (a git-sync, an image layer) holds only primus_dags.py and the generated files:
    parsed in an isolated interpreter (no PYTHONPATH, no script or working directory on sys.path)
    by a plain DagBag, which adds nothing to sys.path itself, every job's DAG is there and no file
    of the folder put it on sys.path (a copied factory beside them used to be imported that way)."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for name in ("alpha", "omega"):
        write_spec(jobs / f"{name}.yaml", airflow_doc(name))
    dags = copy_dags(tmp_path / "dags")
    env = {**os.environ, "PRIMUS_JOBS_DIR": str(jobs), "PRIMUS_DATA": str(tmp_path / "data")}
    subprocess.run([sys.executable, "-I", str(dags / "primus_dags.py")], env=env, check=True, capture_output=True)
    assert sorted(p.name for p in dags.rglob("*.py")) == ["alpha.py", "omega.py", "primus_dags.py"]
    probe = (
        "import json, sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "before = list(sys.path)\n"
        "bag = DagBag(dag_folder=sys.argv[1])\n"
        "print(json.dumps([sorted(bag.dag_ids), bag.import_errors, [p for p in sys.path if p not in before]]))\n"
    )
    isolated = [sys.executable, "-I", "-c", probe, str(dags)]
    done = subprocess.run(isolated, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [["alpha", "omega"], {}, []]


def test_a_missing_piece_of_the_dag_is_an_import_error_not_a_dropped_task(monkeypatch, tmp_path):
    """The scaler sensor used to be optional (``except ImportError``: the DAG silently lost its
    ``scale`` task); a module that cannot be imported is now the DAG file's import error."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write_spec(jobs / "alpha.yaml", airflow_doc("alpha"))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    dags = copy_dags(tmp_path / "dags")
    _sync(dags, jobs, monkeypatch)
    monkeypatch.setitem(sys.modules, "primus_operators.sensors.scaler", None)  # what a broken install gives
    bag = DagBag(dag_folder=str(dags))
    assert bag.dag_ids == []
    ((where, error),) = bag.import_errors.items()
    assert where.endswith("primus_jobs/alpha.py") and "primus_operators.sensors.scaler" in error
