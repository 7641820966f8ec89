"""One data task of a window (mapped with ``.expand``), run in the job's executor pool."""

from __future__ import annotations

import dataclasses
from typing import Any

from airflow.sdk import BaseOperator

from primus_lib.credentials import using
from primus_operators._common import load_spec
from primus_operators.hooks.connections import airflow_resolver


def _summary(output: Any) -> Any:
    """A small, JSON-able XCom value for a TaskOutput (whatever its exact shape)."""
    if output is None or isinstance(output, (str, int, float, bool, dict, list)):
        return output
    if hasattr(output, "to_dict"):
        return output.to_dict()
    if dataclasses.is_dataclass(output) and not isinstance(output, type):  # an instance, not a dataclass itself
        return {
            k: (str(v) if not isinstance(v, (int, float, str, bool, type(None))) else v)
            for k, v in dataclasses.asdict(output).items()
        }
    return str(output)


class PrimusDataTaskOperator(BaseOperator):
    """Runs ``primus_lib.data.executor.execute_task`` for one planned data task.

    :param data_task: one dict from the DataSource operator's XCom (expand over the list).
    """

    template_fields = ("spec_path",)
    ui_color = "#e8f4d9"

    def __init__(self, *, spec_path: str, data_task: dict, **kwargs: Any):
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.data_task = data_task

    def execute(self, context: Any) -> Any:
        from primus_lib.data.executor import execute_task
        from primus_lib.data.executor.task import skip_arrow_pandas_probe
        from primus_lib.data.task import DataTask

        skip_arrow_pandas_probe()  # this process runs one task: pyarrow need not import pandas
        task = DataTask.from_dict(self.data_task)
        self.log.info("data task %s (%s, %d bytes)", task.id, task.uri, task.size)
        job = load_spec(self.spec_path)
        with using(airflow_resolver()):
            return _summary(execute_task(job, task))
