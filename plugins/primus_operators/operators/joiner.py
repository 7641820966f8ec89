"""Joiner: the barrier of a window's batch stream, and the sample join of its sources."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from primus_lib.credentials import using
from primus_operators._common import load_spec, window_of
from primus_operators.hooks.connections import airflow_resolver
from primus_operators.operators.data_task import _summary


class PrimusJoinerOperator(BaseOperator):
    """Runs after every data task of the window; calls ``join_window`` -> Manifest (via XCom)."""

    template_fields = ("spec_path",)
    ui_color = "#f3e6d8"

    def __init__(self, *, spec_path: str, stream: str, **kwargs: Any):
        kwargs.setdefault("trigger_rule", "none_failed")  # a source with no files skips its mapped task
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.stream = stream

    def execute(self, context: Any) -> Any:
        from airflow.sdk.exceptions import AirflowFailException

        from primus_lib.data.executor import join_window
        from primus_lib.data.executor.task import skip_arrow_pandas_probe
        from primus_lib.data.sources.quality import WindowDataError

        skip_arrow_pandas_probe()  # this process joins one window: pyarrow need not import pandas
        start = window_of(context)
        job = load_spec(self.spec_path)
        with using(airflow_resolver()):
            try:
                manifest = join_window(job, self.stream, start)
            except WindowDataError as exc:  # the data itself is wrong: a retry would read the same rows
                raise AirflowFailException(str(exc)) from None
        self.log.info("joined %s window %s: %s", self.stream, start.isoformat(), manifest)
        return _summary(manifest)
