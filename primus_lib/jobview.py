"""What the Primus view of the Airflow UI shows about one job, read from the job's own state.

One JSON-ready document per job (``job_view``): its windows and their state (planned data tasks,
committed to the training queue, trained), AUC and logloss per trained window (progress.json),
the trainer's input wait and lag, the data executors over time with every scaling decision and
its inputs (``scaling/<role>/decisions.jsonl``), and the job's DTGG as a small graph.

Airflow's side (the DAG runs of each window, the DAG's docs, the pool) is passed in by the
plugin (``primus_operators.view``): this module never imports Airflow and reads only what the
job's roles already share (the job's database, its state directory or remote root).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from primus_lib.allocation import allocations_dir, role_resources
from primus_lib.metrics import names as n
from primus_lib.naming import WINDOW_PARAM
from primus_lib.paths import JobPaths, parse_window_id, window_id
from primus_lib.progress import read_progress
from primus_lib.scaling.store import ScalingStore, replicas_in
from primus_lib.spec.job import PrimusJob
from primus_lib.storage import StorageLocation
from primus_lib.timegrid import window_starts

ROLES = ("data_executor", "stream_executor")
GRID_LIMIT = 240  # windows of the timer shown at most (an open-ended job's newest)


def job_view(
    job: PrimusJob,
    runs: list[dict[str, Any]] | None = None,
    doc: str | None = None,
    pool_slots: int | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The whole document. ``runs``: the job's DAG runs as ``{"window": <window id>, "run_id",
    "state", "run_type", "start_date", "end_date"}``; ``doc``: the DAG's doc_md (its mermaid DTGG);
    ``pool_slots``: the data executors' Airflow pool size (the batch executors' horizontal knob)."""
    now = time.time() if now is None else now
    paths = JobPaths.for_job(job)
    progress = read_progress(paths.progress)
    consumed = progress.get("consumed", {})
    queued = _queued(paths, job)
    windows = window_rows(job, _planned(paths, job), queued, consumed, runs or [], grid_windows(job, now))
    return {
        "job": job.name,
        "window": job.spec.timer.window,
        "training_mode": job.spec.training.mode,
        "backend": job.spec.resources.backend,
        "generated_at": now,
        "windows": windows,
        "metrics": window_metrics(consumed),
        "trainer": trainer_state(progress, queued, paths.metrics_dir, job.name, now),
        "executors": executors(job, pool_slots),
        "dtgg": {"graph": dtgg_graph(job), "mermaid": mermaid_of(doc)},
    }


# -- windows -------------------------------------------------------------------------------------
def grid_windows(job: PrimusJob, now: float, limit: int = GRID_LIMIT) -> list[str]:
    """The newest ``limit`` windows of the timer that have started by ``now`` (and before its end)."""
    timer = job.spec.timer
    stop = datetime.fromtimestamp(now, UTC)
    if timer.end is not None:
        stop = min(stop, timer.end)
    size = timer.window_size
    first = max(timer.start, stop - size * limit)
    return [window_id(start) for start in window_starts(first, stop, size, timer.start)]


def window_rows(
    job: PrimusJob,
    planned: dict[str, dict[str, dict[str, int]]],
    queued: dict[str, dict[str, int]],
    consumed: dict[str, dict],
    runs: list[dict[str, Any]],
    grid: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """One row per window of the timer up to now, or that any part of the job knows about, oldest
    first; ``state`` is the furthest step it reached: trained > committed > planned > waiting
    (the DAG run's own state is beside it)."""
    streams = [s.name for s in job.batch_streams]
    by_run = {r["window"]: r for r in sorted(runs, key=lambda r: str(r.get("start_date") or ""))}
    ids = set(grid) | set(by_run) | {w for s in streams for w in planned.get(s, {})}
    ids |= {w for s in streams for w in queued.get(s, {})}
    ids |= {key.split("/", 1)[1] for key in consumed if "/" in key}
    rows = []
    for wid in sorted(ids):
        keys = [f"{s}/{wid}" for s in streams] or [k for k in consumed if k.endswith(f"/{wid}")]
        trained = [consumed[k] for k in keys if k in consumed]
        per_stream = {
            s: {
                "tasks": planned.get(s, {}).get(wid),
                "committed_rows": queued.get(s, {}).get(wid),
                "trained": f"{s}/{wid}" in consumed,
            }
            for s in streams
        }
        if keys and len(trained) == len(keys):
            state = "trained"
        elif streams and all(wid in queued.get(s, {}) for s in streams):
            state = "committed"
        elif any(wid in planned.get(s, {}) for s in streams):
            state = "planned"
        else:
            state = "waiting"
        rows.append(
            {
                "window": wid,
                "start": _iso(wid),
                "state": state,
                "run": by_run.get(wid),
                "streams": per_stream,
                "samples": sum(t.get("samples", 0) for t in trained) if trained else None,
            }
        )
    return rows


def window_metrics(consumed: dict[str, dict]) -> list[dict[str, Any]]:
    """AUC and logloss of each trained window (one point per ``consumed`` entry), oldest first."""
    points = []
    for key, entry in consumed.items():
        stream, _, wid = key.partition("/")
        if not isinstance(entry, dict):
            raise ValueError(f"progress.json: consumed[{key!r}]: expected an object, found {entry!r}")
        points.append(
            {
                "stream": stream,
                "window": wid,
                "start": _iso(wid),
                "auc": entry.get("auc"),
                "logloss": entry.get("logloss"),
                "samples": entry.get("samples"),
                "at": entry.get("at"),
            }
        )
    return sorted(points, key=lambda p: (p["window"], p["stream"]))


def _planned(paths: JobPaths, job: PrimusJob) -> dict[str, dict[str, dict[str, int]]]:
    """stream -> window -> data-task counts by state, from the task ledger (nothing before it exists)."""
    if not _ledger_exists(paths):
        return {}
    from primus_lib.data.ledger import TaskLedger

    ledger = TaskLedger(paths.ledger)
    out: dict[str, dict[str, dict[str, int]]] = {}
    for stream in job.batch_streams:
        windows = out.setdefault(stream.name, {w: {} for w in ledger.planned_windows(stream.name)})
        for record in ledger.records(stream.name):
            counts = windows.setdefault(record.task.window, {})
            counts[record.state] = counts.get(record.state, 0) + 1
    return out


def _queued(paths: JobPaths, job: PrimusJob) -> dict[str, dict[str, int]]:
    """stream -> window -> rows committed to the training queue by the sink."""
    if not _ledger_exists(paths):
        return {}
    from primus_lib.data.training_queue import TrainingQueue

    out: dict[str, dict[str, int]] = {}
    for window in TrainingQueue(paths.ledger).windows():
        out.setdefault(window.stream, {})[window.window] = window.rows
    return out


def _ledger_exists(paths: JobPaths) -> bool:
    """A PostgreSQL database is always there; a SQLite file only once a role made it (a view
    must not create one)."""
    return paths.database is not None or Path(paths.root / "ledger.sqlite").exists()


# -- trainer ------------------------------------------------------------------------------------
def trainer_state(
    progress: dict, queued: dict[str, dict[str, int]], metrics_dir: StorageLocation, job_name: str, now: float
) -> dict[str, Any]:
    """Input wait (the share of loop time the trainer waited for data), back-pressure, and lag:
    windows committed but not trained yet, and how far (seconds of windows) training is behind
    the newest committed window."""
    consumed = progress.get("consumed", {})
    behind = sorted(f"{s}/{w}" for s, ws in queued.items() for w in ws if f"{s}/{w}" not in consumed)
    newest_committed = max((w for ws in queued.values() for w in ws), default=None)
    newest_trained = max((k.split("/", 1)[1] for k in consumed if "/" in k), default=None)
    lag_seconds = None
    if newest_committed and newest_trained:
        delta = parse_window_id(newest_committed) - parse_window_id(newest_trained)
        lag_seconds = max(0.0, delta.total_seconds())
    gauges = trainer_gauges(metrics_dir, job_name, now)
    return {
        "step": progress.get("step"),
        "mode": progress.get("mode"),
        "written_at": progress.get("written_at"),
        "input_wait": gauges.get(n.TRAINER_STARVED),
        "backpressure": gauges.get(n.TRAINER_BACKPRESSURE),
        "metrics_at": gauges.get("at"),
        "lag_windows": len(behind),
        "untrained": behind,
        "lag_seconds": lag_seconds,
        "newest_committed": newest_committed,
        "newest_trained": newest_trained,
        "stream_position": progress.get("stream_position") or {},
    }


def trainer_gauges(metrics_dir: StorageLocation, job_name: str, now: float) -> dict[str, float]:
    """The highest starved / back-pressure ratio over the trainer ranks' newest snapshots, and
    when the newest was written (``at``); {} before the trainer's first snapshot."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {n.TRAINER_STARVED, n.TRAINER_BACKPRESSURE}
    out: dict[str, float] = {}
    for text, mtime in _snapshots(metrics_dir, "trainer"):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted and sample.labels.get(n.JOB_LABEL) == job_name:
                    out[sample.name] = max(out.get(sample.name, 0.0), float(sample.value))
        out["at"] = max(out.get("at", 0.0), mtime if mtime is not None else now)
    return out


def _snapshots(directory: StorageLocation, prefix: str) -> list[tuple[str, float | None]]:
    """(text, mtime) of the ``<prefix>*.prom`` snapshots in the job's metrics dir."""
    found = []
    for entry in directory.list():
        if entry.name.startswith(prefix) and entry.name.endswith(".prom"):
            try:
                found.append(((directory / entry.name).read_text(), entry.mtime))
            except FileNotFoundError:  # removed between listing and reading
                continue
    return found


# -- executors and scaling ----------------------------------------------------------------------
def executors(job: PrimusJob, pool_slots: int | None = None) -> dict[str, dict[str, Any]]:
    """Per data-executor role: the count now, its CPU/memory, and its count over time, one point
    per scaling decision that changed it (each decision listed with its inputs)."""
    out = {}
    for role in ROLES:
        spec = job.spec.resources.roles.get(role)
        if spec is None:
            continue
        store = ScalingStore(allocations_dir(job) / role)
        decisions = store.decisions()
        state = store.load()
        replicas = replicas_in(state, spec.replicas)
        if role == "data_executor" and pool_slots is not None:
            replicas = pool_slots  # the batch executors run as the pool's mapped tasks
        series = executor_series(spec.replicas, decisions)
        cpu, memory = role_resources(job, role)
        out[role] = {
            "replicas": replicas,
            "spec_replicas": spec.replicas,
            "min": spec.min_count,
            "max": spec.max_count,
            "cpu": cpu,
            "memory": memory,
            "series": series,
            "decisions": decisions,
        }
    return out


def executor_series(initial: int, decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The executor count after each decision, starting at the spec's count (``at`` None)."""
    series: list[dict[str, Any]] = [{"at": None, "replicas": initial, "action": "spec"}]
    for decision in sorted(decisions, key=lambda d: d.get("at") or 0.0):
        replicas = decision.get("replicas")
        if replicas is not None:
            series.append({"at": decision.get("at"), "replicas": int(replicas), "action": decision.get("action")})
    return series


# -- DTGG -----------------------------------------------------------------------------------------
def dtgg_graph(job: PrimusJob) -> dict[str, list[dict[str, Any]]]:
    """The job's Data Task Graph as nodes in columns (0 timer .. 5 trainer) and edges: the same
    graph the DAG's mermaid docs draw, laid out for a plain SVG (no JavaScript library)."""
    timer = job.spec.timer
    nodes = [{"id": "timer", "label": f"Timer: {timer.window} from {timer.start:%Y-%m-%d %H:%M}Z", "column": 0}]
    edges = []
    for stream in job.spec.dataset.streams:
        sid = stream.name
        if stream.kind != "batch":
            topics = ", ".join(s.kafka.topic if s.kafka else s.name for s in stream.sources)
            nodes.append({"id": sid, "label": f"{sid}: stream {topics}", "column": 1})
            edges.append({"from": sid, "to": "trainer", "label": stream.shuffle})
            continue
        how = f"{stream.join.how} join on {', '.join(stream.join.keys)}" if stream.join else "union"
        nodes += [
            {"id": f"{sid}/join", "label": f"{sid}: {how}", "column": 3},
            {"id": f"{sid}/sink", "label": f"{sid}: sink, lag {stream.lag}", "column": 4},
        ]
        for source in stream.sources:
            src = f"{sid}/{source.name}"
            nodes += [
                {"id": src, "label": f"{source.name}: {source.format}", "column": 1},
                {"id": f"{src}/tasks", "label": f"data tasks ({source.name})", "column": 2},
            ]
            edges += [
                {"from": "timer", "to": src},
                {"from": src, "to": f"{src}/tasks"},
                {"from": f"{src}/tasks", "to": f"{sid}/join"},
            ]
        edges += [{"from": f"{sid}/join", "to": f"{sid}/sink"}, {"from": f"{sid}/sink", "to": "trainer"}]
    label = f"trainer: {job.spec.training.mode} on {job.spec.resources.backend}"
    nodes.append({"id": "trainer", "label": label, "column": 5})
    return {"nodes": nodes, "edges": edges}


def mermaid_of(doc: str | None) -> str | None:
    """The mermaid block of the DAG's docs (``dtgg_doc``), without its fences; None when absent."""
    if not doc or "```mermaid" not in doc:
        return None
    body = doc.split("```mermaid", 1)[1]
    return body.split("```", 1)[0].strip("\n")


def window_of_run(
    data_interval_start: datetime | None, logical_date: datetime | None, conf: dict | None = None
) -> str | None:
    """The window id a DAG run processes: a manual run's ``window_start`` conf, else its data
    interval's start (else its logical date); None for a run with neither."""
    start = (conf or {}).get(WINDOW_PARAM)
    if start:
        from primus_lib.timegrid import as_utc

        return window_id(as_utc(start, WINDOW_PARAM))
    found = data_interval_start or logical_date
    return window_id(found) if found is not None else None


def _iso(wid: str) -> str | None:
    try:
        return parse_window_id(wid).isoformat()
    except ValueError:
        return None
