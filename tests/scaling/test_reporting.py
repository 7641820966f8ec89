"""The embedded default's reporting helpers: throttled snapshots, pruning, the optional endpoint."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry

from primus_lib.metrics.instruments import TrainerMetrics
from primus_lib.metrics.reporting import SnapshotWriter, prune_stale, report_every, serve_from_env, snapshot_name
from tests.fixtures._proc import free_port
from tests.fixtures.specs import demo_doc, load


def test_snapshots_are_throttled_and_names_are_file_safe(tmp_path):
    registry = CollectorRegistry()
    metrics = TrainerMetrics("job", "0", registry=registry)
    now = [100.0]
    writer = SnapshotWriter(
        tmp_path, snapshot_name("data_executor", "history/2026:x"), registry, every=5.0, clock=lambda: now[0]
    )
    assert writer.maybe_write()
    (path,) = tmp_path.glob("*.prom")
    assert path.name == "data_executor-history_2026_x.prom"
    metrics.observe_step(1.0, 4.0)
    now[0] += 4.9
    assert not writer.maybe_write()  # within the interval: the file keeps the old value
    assert "primus_trainer_starved_ratio" in path.read_text() and " 0.25" not in path.read_text()
    now[0] += 0.1
    assert writer.maybe_write()
    assert 'primus_trainer_starved_ratio{primus_job="job",role="trainer",worker="0"} 0.25' in path.read_text()


def test_prune_removes_only_old_snapshots(tmp_path):
    old, fresh = tmp_path / "old.prom", tmp_path / "fresh.prom"
    old.write_text("")
    fresh.write_text("")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    assert prune_stale(tmp_path, max_age=600) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.prom"]


def _get(port: int, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_serve_from_env_asks_every_scraper_for_the_token(monkeypatch, tmp_path):
    registry = CollectorRegistry()
    TrainerMetrics("job", "0", registry=registry).observe_step(0.5, 1.0)
    monkeypatch.delenv("PRIMUS_METRICS_PORT", raising=False)
    monkeypatch.setenv("PRIMUS_SECRETS_DIR", str(tmp_path))
    assert serve_from_env(registry) is None
    port = free_port()
    monkeypatch.setenv("PRIMUS_METRICS_PORT", str(port))
    assert serve_from_env(registry) is None  # a port without a token: no endpoint without a login
    (tmp_path / "metrics.token").write_text("s3cret-token\n")  # the mounted secret's
    assert serve_from_env(registry) == port
    status, body = _get(port, "s3cret-token")
    assert status == 200
    assert 'primus_trainer_starved_ratio{primus_job="job",role="trainer",worker="0"} 0.5' in body
    for wrong in (None, "s3cret-toke", "s3cret-token2", ""):
        status, body = _get(port, wrong)
        assert status == 401 and "primus_trainer" not in body, (wrong, status)
    assert serve_from_env(registry) is None  # the port is taken: logged, not raised


def test_executors_and_trainers_report_at_a_twelfth_of_the_scaling_interval(tmp_path):
    def every(interval: str | None) -> float:
        doc = demo_doc(f"file://{tmp_path}")
        if interval is not None:
            doc["spec"].setdefault("scaling", {})["interval"] = interval
        return report_every(load(doc, env={}, storage=tmp_path / "jobs"))

    assert every(None) == 5.0  # the default minute: every 5 s, as before
    assert every("24s") == 2.0
    assert every("5s") == 1.0  # never more often than every second
    assert every("1h") == 5.0  # nor less often than every 5 s
