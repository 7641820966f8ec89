"""Sink: commit the window to the job's training queue, strictly in time order, and emit an Asset event."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, BaseOperator

from primus_lib.credentials import using
from primus_lib.naming import asset_uri
from primus_operators._common import load_spec, window_of
from primus_operators.hooks.connections import airflow_resolver
from primus_operators.operators.data_task import _summary


class PrimusSinkOperator(BaseOperator):
    """Calls ``sink_window``; ``depends_on_past`` keeps windows entering the queue in time order.

    The outlet ``primus://<job>/<stream>`` gets one event per window (lineage in the UI);
    its extra carries the window id and the queued window's summary.
    """

    template_fields = ("spec_path",)
    ui_color = "#f7dede"

    def __init__(self, *, spec_path: str, job_name: str, stream: str, **kwargs: Any):
        kwargs.setdefault("depends_on_past", True)
        kwargs.setdefault("outlets", [Asset(asset_uri(job_name, stream))])
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.job_name = job_name
        self.stream = stream

    def execute(self, context: Any) -> Any:
        from primus_lib.data.executor import sink_window
        from primus_lib.paths import window_id

        start = window_of(context)
        job = load_spec(self.spec_path)
        with using(airflow_resolver()):
            queued = _summary(sink_window(job, self.stream, start))
        self.log.info("queued %s window %s: %s", self.stream, window_id(start), queued)
        extra = {"window": window_id(start), "stream": self.stream}
        if isinstance(queued, dict):
            extra.update({k: v for k, v in queued.items() if isinstance(v, (int, float, str, bool))})
        context["outlet_events"][Asset(asset_uri(self.job_name, self.stream))].extra = extra
        return queued
