"""The scaling manager reading a real Prometheus server that scrapes real data-executor and trainer
processes (prometheus_client's /metrics on 127.0.0.1:$PRIMUS_METRICS_PORT, served only to a
scraper presenting the token of $PRIMUS_SECRETS_DIR/metrics.token: Prometheus's, the fixture's).

- Data executors: two processes (``python -m tests.scaling.helpers executor``), each running one
  batch window of a tiny job through the project's executor code (DTGG plan, ``execute_task`` per
  data task, join, sink) and serving what those tasks' metrics code reported.
- Trainer: ``primus train SPEC`` (the CLI), which trains the two committed windows and then waits
  for the third, which never comes: starved.
Prometheus' view must equal what the processes themselves reported, and the manager must add an
executor from it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry

from primus_lib.metrics import names as n
from primus_lib.metrics.readers import PrometheusReader, TextfileReader
from primus_lib.scaling import ScalingManager
from tests.fixtures._proc import free_port, start, stop
from tests.resources.conftest import ROOT
from tests.train.conftest import START, make_job

pytestmark = pytest.mark.integration

JOB = "prom-scrape"
ROLES = {
    "data_executor": {"replicas": 4, "min_replicas": 1, "max_replicas": 10, "cpu": 1, "memory": "4Gi"},
    "trainer": {"replicas": 1, "cpu": 1, "memory": "1Gi"},
}
SCALING = {"horizontal": {"enabled": True, "threshold": 0.5, "cooldown": "60s"}, "vertical": {"enabled": False}}


def scraped_job(tmp_path, monkeypatch):
    """The tiny job (offline, 3 hourly windows, no lag) with a data-executor role and horizontal scaling."""
    return make_job(
        tmp_path, monkeypatch, name=JOB, mode="offline", hours=3, lag="0h", rows=120, roles=ROLES, scaling=SCALING
    )


def _metrics(port: int, token_file) -> urllib.request.Request:
    token = token_file.read_text().strip()
    return urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"})


def _serves(port: int, token_file) -> bool:
    with urllib.request.urlopen(_metrics(port, token_file), timeout=2) as reply:
        return reply.status == 200


def _scrape(port: int, token_file) -> dict[tuple[str, str], float]:
    """(metric name, worker) -> value, straight from a process's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(_metrics(port, token_file), timeout=5) as reply:
        text = reply.read().decode()
    return {
        (s.name, s.labels.get(n.WORKER_LABEL, "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def processes(tmp_path, prometheus_server):
    """Start processes with PRIMUS_METRICS_PORT set, serving Prometheus's token; each is stopped by
    its PID at the end."""
    started: list[subprocess.Popen] = []
    token_file = prometheus_server.metrics_token_file

    def spawn(name: str, args: list[str], ready) -> int:
        port = free_port()
        env = {**os.environ, "PRIMUS_METRICS_PORT": str(port), "PRIMUS_SECRETS_DIR": str(token_file.parent)}
        env.update(PYTHONPATH=str(ROOT))
        env.pop("LOCAL_RANK", None)
        log = tmp_path / f"{name}.log"
        started.append(start(args, log, lambda: _serves(port, token_file) and ready(), timeout=180, env=env))
        return port

    yield spawn
    for proc in started:
        stop(proc)


def test_manager_decides_from_prometheus_scraping_real_executors_and_trainer(
    prometheus_server, processes, tmp_path, monkeypatch
):
    import primus_lib.data.dtgg  # noqa: F401 - first: importing primus_lib.data.ledger alone is a circular import
    from primus_lib.data.ledger import TaskLedger
    from primus_lib.data.training_queue import TrainingQueue
    from primus_lib.paths import JobPaths, window_id

    spec, job = scraped_job(tmp_path, monkeypatch)
    paths = JobPaths.for_job(job)

    def committed() -> list[str]:
        return [w.window for w in TrainingQueue(paths.ledger).windows("history")] if paths.ledger.exists() else []

    # two executor processes, one window each, one after the other (the second sees the first's
    # window committed and not trained yet: a batch backlog of 1 window of 3)
    executor_ports, windows = [], [START + timedelta(hours=h) for h in range(2)]
    for i, at in enumerate(windows):
        args = [sys.executable, "-m", "tests.scaling.helpers", "executor", str(spec), at.isoformat()]
        wanted = [window_id(w) for w in windows[: i + 1]]
        executor_ports.append(processes(f"executor-{i}", args, lambda w=wanted: committed() == w))
    ledger = TaskLedger(paths.ledger)
    tasks = {w: [r.task.id for r in ledger.records("history", window_id(w))] for w in windows}
    n_tasks = sum(len(ids) for ids in tasks.values())
    assert all(tasks.values())
    rows = sum(w.rows for w in TrainingQueue(paths.ledger).windows("history"))

    trainer_port = processes(
        "trainer",
        [sys.executable, "-m", "primus_lib.cli.main", "train", str(spec), "--poll-interval", "0.2"],
        lambda: True,
    )

    prometheus_server.add_targets(f"{JOB}-executors", [f"127.0.0.1:{p}" for p in executor_ports])
    prometheus_server.add_targets(f"{JOB}-trainer", [f"127.0.0.1:{trainer_port}"])
    sel = f'primus_job="{JOB}"'
    series = prometheus_server.wait_for(f"{n.BUFFER_UTILISATION}{{{sel}}}", n_tasks, timeout=60)
    # every series came from the executor process that ran the task (its scrape target)
    by_task = {s["metric"]["worker"]: s["metric"]["instance"] for s in series}
    assert by_task == {t: f"127.0.0.1:{executor_ports[i]}" for i, w in enumerate(windows) for t in tasks[w]}
    # the trainer trained both windows' rows, then waited a whole reporting interval for the third
    prometheus_server.wait_for(f"{n.TRAINER_SAMPLES}{{{sel}}} == {rows}", 1, timeout=120)
    prometheus_server.wait_for(f"{n.TRAINER_STARVED}{{{sel}}} == 1", 1, timeout=60)

    reader = PrometheusReader(prometheus_server.endpoint, JOB)
    snap = reader.snapshot()
    # what Prometheus scraped equals what the processes reported: the executors' own snapshot files ...
    files = TextfileReader(JOB, paths.metrics_dir).snapshot()
    assert snap.executors == files.executors == n_tasks
    for field in ("buffer", "cpu", "memory", "cpu_cores_max", "memory_bytes_max", "oom_kills"):
        assert getattr(snap, field) == pytest.approx(getattr(files, field), rel=1e-9, abs=1e-12), field
    # ... and the trainer's own /metrics
    trainer = _scrape(trainer_port, prometheus_server.metrics_token_file)
    assert snap.trainer_starved == trainer[(n.TRAINER_STARVED, "0")] == 1.0
    assert snap.trainer_backpressure == trainer[(n.TRAINER_BACKPRESSURE, "0")] == 0.0
    # the first window's tasks saw no backlog, the second's one committed window of 3 ahead
    first, second = len(tasks[windows[0]]), len(tasks[windows[1]])
    assert snap.buffer == pytest.approx(second * (1 / 3) / (first + second))
    assert 10 * 2**20 < snap.memory_bytes_max < 4 * 2**30  # a real Python process tree's RSS
    assert 0 < snap.memory < 1  # against the role's 4Gi
    history = reader.usage_history(lookback_seconds=60, step_seconds=1)
    assert history and all(p.memory_bytes > 0 for p in history)

    class Recorder:
        def __init__(self):
            self.applied = []

        def apply(self, decision):
            self.applied.append(decision)

    actuator = Recorder()
    manager = ScalingManager(job, reader, actuator, registry=CollectorRegistry())
    decision = manager.tick()
    # L_u = 0.8 x buffer (<= 1/6) + 0.1 x cpu + 0.1 x memory < 0.45 and the trainer starves: add;
    # 4 + ceil(4 x 0.9 / 0.1) capped by step 0.25 of 4 -> +1
    assert decision is not None and (decision.policy, decision.action) == ("horizontal", "scale_up")
    assert decision.replicas == 5 and decision.inputs["executors"] == n_tasks == 4
    assert decision.inputs["trainer_starved"] == 1.0 and actuator.applied == [decision]


def test_recording_rules_are_valid():
    import shutil

    from tests.fixtures._require import missing

    if shutil.which("promtool") is None:
        missing("promtool not installed (Debian prometheus package)")
    done = subprocess.run(
        ["promtool", "check", "rules", str(ROOT / "config" / "prometheus" / "primus-rules.yml")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "SUCCESS: 4 rules found" in done.stdout, done.stdout + done.stderr


def test_the_reader_logs_in_and_a_refusal_says_which_login_is_missing(prometheus_server, tmp_path, monkeypatch, capsys):
    """Prometheus behind basic auth: no login and a wrong one are refused in one line each; the CLI's
    --prometheus-conn-id (an HTTP connection: host, login, password) reads it."""
    from primus_lib.cli.main import main
    from primus_lib.metrics.readers import PrometheusEndpoint, PrometheusError
    from tests.fixtures import connections
    from tests.fixtures.prometheus import LOGIN

    with pytest.raises(PrometheusError, match=r"refused \(401\): it asks for a login: give its connection$"):
        PrometheusReader(prometheus_server.url, JOB).query("up")
    with pytest.raises(PrometheusError, match=r"refused \(401\): check the login of its connection"):
        PrometheusReader(PrometheusEndpoint(prometheus_server.url, LOGIN, "wrong"), JOB).query("up")
    assert PrometheusReader(prometheus_server.endpoint, JOB).query("vector(7)") == 7.0

    spec, _ = scraped_job(tmp_path, monkeypatch)
    host, port = prometheus_server.url.removeprefix("http://").split(":")
    login = {
        "conn_type": "http",
        "host": host,
        "port": int(port),
        "login": LOGIN,
        "password": prometheus_server.password,
    }
    connections.mount(monkeypatch, tmp_path / "secrets", {"prom": login, "prom_wrong": {**login, "password": "x"}})
    assert main(["resources", "autoscale", str(spec), "--prometheus-conn-id", "prom"]) == 0
    capsys.readouterr()
    assert main(["resources", "autoscale", str(spec), "--prometheus-conn-id", "prom_wrong"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"primus resources autoscale: Prometheus {prometheus_server.url}: query ")
    assert err.endswith("refused (401): check the login of its connection")
