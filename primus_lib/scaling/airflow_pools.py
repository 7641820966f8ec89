"""Pool slots as the horizontal knob of batch data executors: the mapped data-executor tasks run
in the job's pool, one slot per executor. The HTTP calls are ``primus_lib.airflow_api``'s."""

from __future__ import annotations

from primus_lib.airflow_api import AirflowApi
from primus_lib.scaling.base import Decision


class PoolActuator:
    """Horizontal decisions for batch data executors = the job's pool slots (one slot per executor)."""

    def __init__(self, api: AirflowApi, pool: str) -> None:
        self.api, self.pool = api, pool

    def apply(self, decision: Decision) -> None:
        if decision.replicas is not None:
            self.api.set_pool_slots(
                self.pool, decision.replicas, description=f"primus data executors ({decision.reason})"
            )
