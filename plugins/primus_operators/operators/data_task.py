"""A unit of a window's data tasks (mapped with ``.expand``), run in the job's executor pool."""

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
    """Runs ``primus_lib.data.executor.execute_task`` for a unit of planned data tasks, one after
    another in this process (``dtgg.packing``: a task process per file cost more than most files).

    :param data_tasks: one unit from the DataSource operator's XCom (expand over the list); a
        single task's dict (what the operator took before units) is a unit of one.
    """

    template_fields = ("spec_path",)
    ui_color = "#e8f4d9"

    def __init__(self, *, spec_path: str, data_tasks: list[dict] | dict, **kwargs: Any):
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.data_tasks = [data_tasks] if isinstance(data_tasks, dict) else list(data_tasks)

    def execute(self, context: Any) -> list[Any]:
        from primus_lib.data.executor import execute_task
        from primus_lib.data.executor.task import skip_arrow_pandas_probe
        from primus_lib.data.task import DataTask

        skip_arrow_pandas_probe()  # this process runs data tasks only: pyarrow need not import pandas
        tasks = [DataTask.from_dict(raw) for raw in self.data_tasks]  # every one checked before the first runs
        job = load_spec(self.spec_path)
        outputs = []
        with using(airflow_resolver()):
            for number, task in enumerate(tasks, 1):
                self.log.info("data task %d/%d: %s (%s, %d bytes)", number, len(tasks), task.id, task.uri, task.size)
                outputs.append(_summary(execute_task(job, task)))
        return outputs
