"""Trainer operator: keep the job's long-running trainer up, wait until it consumed the window.

Lifecycle (start, reattach, restart) belongs to ``primus_lib.resources``; this operator only
asks the backend to ensure the trainer runs, then waits: in its worker for as long as the
trigger's first check would take (a caught-up trainer consumes a window seconds after its
Sink), then deferred.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from primus_lib.credentials import mount, private_directory, using
from primus_lib.naming import API_CONNECTION, MODEL_ASSET, asset_uri
from primus_lib.progress import await_consumed, progress_key
from primus_lib.settings import child_environment
from primus_operators._common import airflow_api, load_spec, window_of
from primus_operators.hooks.connections import airflow_resolver
from primus_operators.triggers.trainer_progress import FIRST_CHECK_AFTER, TrainerProgressTrigger

if TYPE_CHECKING:
    from primus_lib.spec import PrimusJob

MODES = ("service", "inline", "skip")
WAIT_EVERY = 0.5  # seconds between reads of the progress file while the task waits in its worker


def window_keys(job: PrimusJob, start: datetime) -> list[str]:
    """Progress keys (``<stream>/<window-id>``) the trainer must have consumed for this window."""
    from primus_lib.paths import window_id

    return [progress_key(stream.name, window_id(start)) for stream in job.batch_streams]


def summarize(windows: dict[str, dict]) -> dict[str, Any]:
    """One metrics record per window: samples summed, AUC/logloss sample-weighted over streams."""
    samples = sum(int(m.get("samples") or 0) for m in windows.values())
    out: dict[str, Any] = {"samples": samples, "streams": windows}
    for name in ("auc", "logloss"):
        pairs = [(m[name], int(m.get("samples") or 0)) for m in windows.values() if m.get(name) is not None]
        weight = sum(w for _, w in pairs)
        out[name] = (sum(v * w for v, w in pairs) / weight if weight else pairs[0][0]) if pairs else None
    return out


class PrimusTrainerOperator(BaseOperator):
    """Ensures the trainer runs (resource backend of the spec), then defers until the window is consumed.

    ``mode`` (templated; the DAG passes the run's ``mode`` param): ``service`` (default: the
    long-running trainer + deferral), ``inline`` (run ``primus train SPEC --until-window W``
    in a subprocess and wait for it: demos and tests), ``skip`` (data only).
    ``wait_in_worker``: seconds the task reads the progress file in its worker slot before it
    defers (default: the trigger's first-check delay, ``trainer_progress.FIRST_CHECK_AFTER``: a
    window consumed sooner is reported at once, one consumed later at most that much later than a
    deferral at the start would report it; 0: defer at once).
    Returns the window's metrics (XCom) and puts them on the ``primus://<job>/model`` Asset event.

    The job's own errors (its trainer failed, exited or timed out) fail the task without Airflow's
    retries, which are for a try lost on the way (its worker, the metadata database): the error
    comes at once, as the job ends with it.
    """

    template_fields = ("spec_path", "mode")
    ui_color = "#e3dcf5"

    def __init__(
        self,
        *,
        spec_path: str,
        job_name: str,
        mode: str = "service",
        poll_interval: float = 10.0,
        timeout: float = 6 * 3600.0,
        wait_in_worker: float = FIRST_CHECK_AFTER,
        api_conn_id: str = API_CONNECTION,
        **kwargs: Any,
    ):
        kwargs.setdefault("outlets", [Asset(asset_uri(job_name, MODEL_ASSET))])
        super().__init__(**kwargs)
        self.api_conn_id = api_conn_id
        self.spec_path = spec_path
        self.job_name = job_name
        self.mode = mode
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.wait_in_worker = wait_in_worker

    def execute(self, context: Any) -> dict[str, Any] | None:
        from primus_lib.paths import JobPaths

        job = load_spec(self.spec_path)
        mode = self.mode or job.spec.airflow.trainer_mode
        if mode not in MODES:
            raise AirflowFailException(f"mode: expected one of {MODES}, found {mode!r}")
        if mode == "skip":
            self.log.info("mode=skip: not training this window")
            return None
        start = window_of(context)
        keys = window_keys(job, start)
        with using(airflow_resolver()) as resolver:  # the job's connections, as the task resolves them
            paths = JobPaths.for_job(job)
            progress_path = str(paths.progress)
            if mode == "inline":  # the child reads the connections as secret files (a mounted Secret)
                secrets = private_directory(job.name)
                try:
                    self._train_inline(start, mount(resolver, job.connection_ids(), secrets))
                finally:
                    shutil.rmtree(secrets, ignore_errors=True)
            else:
                from primus_lib.resources import ensure_running

                status = ensure_running(job, self.spec_path)  # the local backend mounts them for its roles
                self.log.info("trainer backend: %s; waiting up to %gs for %s", status, self.wait_in_worker, keys)
                if status.phase == "Failed":  # a failed job is reported, not restarted: it will consume nothing
                    raise AirflowFailException(f"trainer job failed: {status.message or f'job {job.name!r} failed'}")
            within = self.wait_in_worker if mode == "service" else 0.0
            every = min(self.poll_interval, WAIT_EVERY)
            metrics = await_consumed(paths.progress, keys, within, every)  # remote: the connection's keys
            if metrics is None and mode == "service":
                from primus_lib.resources import job_failure

                failure = job_failure(self.spec_path)  # failed during the wait: the trigger would say so later
                if failure is not None:
                    raise AirflowFailException(f"trainer job failed: {failure}")
        if metrics is not None:
            return self._record(context, start, metrics)
        if mode == "inline":
            raise AirflowFailException(f"trainer exited without consuming {keys} ({progress_path})")
        self.log.info("trainer running; deferring until it consumed %s", keys)
        self.defer(
            trigger=TrainerProgressTrigger(
                progress_path,
                keys,
                poll_interval=self.poll_interval,
                timeout=self.timeout,
                spec_path=self.spec_path,
                connection_id=job.spec.storage.connection_id,  # the id only: the triggerer resolves it
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout + 5 * self.poll_interval),
        )
        return None  # unreachable: defer raises

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":  # the job failed or timed out: a retry would wait for it again
            raise AirflowFailException(event.get("message", f"trainer trigger failed: {event!r}"))
        return self._record(context, window_of(context), event["windows"])

    def _train_inline(self, start: datetime, secrets: dict[str, str]) -> None:
        from primus_lib.paths import window_id

        command = [
            sys.executable,
            "-m",
            "primus_lib.cli.main",
            "train",
            self.spec_path,
            "--until-window",
            window_id(start),
        ]
        self.log.info("running %s", " ".join(command))
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=self.timeout, env=child_environment(**secrets)
        )
        for line in (done.stdout + done.stderr).splitlines()[-40:]:
            self.log.info("trainer| %s", line)
        if done.returncode != 0:
            raise AirflowFailException(f"`{' '.join(command)}` exited with {done.returncode}")

    def _record(self, context: Any, start: datetime, windows: dict[str, dict]) -> dict[str, Any]:
        from primus_lib.paths import window_id

        metrics = summarize(windows)
        self.log.info(
            "window %s trained: samples=%s auc=%s logloss=%s",
            window_id(start),
            metrics["samples"],
            metrics["auc"],
            metrics["logloss"],
        )
        extra = {"window": window_id(start), **{k: metrics[k] for k in ("samples", "auc", "logloss")}}
        context["outlet_events"][Asset(asset_uri(self.job_name, MODEL_ASSET))].extra = extra
        self._note(
            context,
            f"window {extra['window']}: samples={extra['samples']} auc={_fmt(extra['auc'])} logloss={_fmt(extra['logloss'])}",
        )
        return {"window": window_id(start), **metrics}

    def _note(self, context: Any, text: str) -> None:
        """Put the metrics on the task's note (Grid view) through the API server, when a connection
        ``api_conn_id`` (http, host/port, login/password) exists; tasks cannot write notes otherwise."""
        api = airflow_api(self.api_conn_id)
        if api is None:
            self.log.info("no connection %r: metrics not written to the task note", self.api_conn_id)
            return
        ti = context["ti"]
        try:
            api.set_task_note(ti.dag_id, ti.run_id, ti.task_id, text)
        except Exception as exc:  # a note is a convenience: never fail a trained window for it
            self.log.warning("could not write the task note: %s", exc)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
