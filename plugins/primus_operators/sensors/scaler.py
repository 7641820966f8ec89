"""The scaler sensor: between scheduled windows, one scaling step per poke (reschedule mode frees
the worker slot between pokes). Thin: the decisions are primus_lib.scaling's; this only wires
Airflow in (the pool API connection, the resource backend, the run's interval).

Knobs it turns: the job's data-executor pool slots (horizontal, REST /api/v2/pools), the
per-task resources the DAG's mapped tasks read through ``executor_config`` (vertical, stored in the
job directory), and the stream executors' replicas/resources (through the resource backend).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from primus_lib.naming import API_CONNECTION, pool_name


class PrimusScalerSensor(BaseSensorOperator):
    """Run the Dynamic Scaling Manager once per poke until the next window is due.

    :param spec_path: the PrimusJob spec file (templated).
    :param prometheus_url: a Prometheus server scraping the executors and trainers (templated);
        None reads the snapshots in the job's metrics dir (embedded default), else the
        in-process registry (``primus_lib.scaling.step.reader_for``).
    :param prometheus_conn_id: an HTTP connection with that server's login (basic auth, or a bearer
        token in its extra ``token``) and, without ``prometheus_url``, its address.
    :param airflow_conn_id: an HTTP connection to Airflow's API server (host/port, login/password)
        for the pool API; a missing connection skips the pool change (logged).
    :param scale_stream_executors: also scale/resize the stream executors through the backend.
    """

    template_fields = ("spec_path", "prometheus_url", "prometheus_conn_id")

    def __init__(
        self,
        *,
        spec_path: str,
        prometheus_url: str | None = None,
        prometheus_conn_id: str | None = None,
        airflow_conn_id: str = API_CONNECTION,
        scale_stream_executors: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", 60)
        # a poke lost to a transient Airflow error (the metadata database restarting) is retried, not
        # a failed run: each poke is a fresh scaling step (tests/reliability/test_metadata_restart.py)
        kwargs.setdefault("retries", 2)
        kwargs.setdefault("retry_delay", timedelta(seconds=10))
        super().__init__(**kwargs)
        self.spec_path, self.prometheus_url, self.prometheus_conn_id = spec_path, prometheus_url, prometheus_conn_id
        self.airflow_conn_id, self.scale_stream_executors = airflow_conn_id, scale_stream_executors

    def _pool_actuator(self, job):
        from primus_lib.scaling.airflow_pools import PoolActuator
        from primus_operators._common import airflow_api

        api = airflow_api(self.airflow_conn_id)
        if api is None:  # optional in the embedded default
            self.log.warning("no connection %r: pool slots will not be changed", self.airflow_conn_id)
            return None
        return PoolActuator(api, pool_name(job.name))

    def _prometheus(self):
        """The URL, with the login of ``prometheus_conn_id`` (inside ``using``: Airflow's connections)."""
        if not self.prometheus_conn_id:
            return self.prometheus_url
        from primus_lib.credentials import current
        from primus_lib.metrics.readers import PrometheusEndpoint

        where = f"prometheus_conn_id {self.prometheus_conn_id!r}"
        return PrometheusEndpoint.of(self.prometheus_url, current().http(self.prometheus_conn_id, where), where)

    def poke(self, context: Any) -> PokeReturnValue:
        from primus_lib.credentials import using
        from primus_lib.scaling.step import scaling_step
        from primus_lib.timegrid import as_utc
        from primus_operators._common import load_spec
        from primus_operators.hooks.connections import airflow_resolver

        job = load_spec(self.spec_path)
        backend = None
        if self.scale_stream_executors and "stream_executor" in job.spec.resources.roles:
            from primus_lib.resources import backend_for

            backend = backend_for(job, self.spec_path)
        with using(airflow_resolver()):  # snapshots and resources.json may be on the job's shared storage
            decisions = scaling_step(
                job, prometheus=self._prometheus(), pool_actuator=self._pool_actuator(job), backend=backend
            )
        for decision in decisions:
            self.log.info("scaling decision: %s", decision.to_dict())
        end = context.get("data_interval_end")
        window = job.spec.timer.window_size
        due = end is None or datetime.now(UTC) >= as_utc(end) + window
        return PokeReturnValue(is_done=due, xcom_value=[d.to_dict() for d in decisions] if due else None)
