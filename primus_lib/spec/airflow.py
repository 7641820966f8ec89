"""How the DAG factory runs a job on Airflow: what the deployment's variables used to switch."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field

from primus_lib.spec.base import SpecModel
from primus_lib.spec.types import Duration

TrainerMode = Literal["service", "inline", "skip"]


class AirflowSpec(SpecModel):
    max_active_runs: int = Field(
        3,
        ge=1,
        description="Windows in flight at once (the DAG's max_active_runs); the data executors' backlog metric "
        "counts committed windows against it.",
    )
    source_timeout: Duration = Field(
        timedelta(hours=6), description="How long a DataSource task waits for its partition's success marker."
    )
    poll_interval: Duration = Field(
        timedelta(seconds=30),
        description="How often the source trigger looks for a partition (the trainer trigger: at most every 10s).",
    )
    trainer_wait: Duration = Field(
        timedelta(seconds=15),
        description="How long the train task waits in its worker slot for the trainer to consume its window "
        "before it defers and frees the slot (0s: defer at once). A window consumed sooner is reported within "
        "0.5s; once deferred, the first check comes 15s later (Airflow 3.3's resume race).",
    )
    trainer_mode: TrainerMode = Field(
        "service",
        description="The default of a run's mode param: service (the long-running trainer), inline (primus train "
        "per window, demos and tests) or skip (data only).",
    )
