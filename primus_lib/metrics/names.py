"""Metric names: one place, so instrumentation, readers, PromQL and dashboards agree."""

from __future__ import annotations

BUFFER_UTILISATION = "primus_executor_buffer_utilisation"  # sample buffer fill, 0..1
CPU_UTILISATION = "primus_executor_cpu_utilisation"  # used cores / allocated cores, 0..1
MEMORY_UTILISATION = "primus_executor_memory_utilisation"  # RSS / memory limit, 0..1
CPU_USED_CORES = "primus_executor_cpu_used_cores"
MEMORY_USED_BYTES = "primus_executor_memory_used_bytes"
OOM_KILLS = "primus_executor_oom_kills_total"
SAMPLES = "primus_executor_samples_total"
# stream executors: Kafka messages of their partitions not read yet (high watermark - position), rows
STREAM_LAG = "primus_executor_stream_lag_rows"
# stream executors, over their last reporting interval: rows they read, and rows their partitions received
STREAM_READ_RATE = "primus_executor_stream_read_rows_per_second"
STREAM_SOURCE_RATE = "primus_executor_stream_source_rows_per_second"
TRAINER_STARVED = "primus_trainer_starved_ratio"  # share of step time spent waiting for data, 0..1
TRAINER_BACKPRESSURE = "primus_trainer_backpressure_ratio"  # share of time the input queue was full, 0..1
TRAINER_SAMPLES = "primus_trainer_samples_total"
DECISIONS = "primus_scaling_decisions_total"
TARGET = "primus_scaling_target"
LOAD = "primus_scaling_load"

METRIC_NAMES = (
    BUFFER_UTILISATION,
    CPU_UTILISATION,
    MEMORY_UTILISATION,
    CPU_USED_CORES,
    MEMORY_USED_BYTES,
    OOM_KILLS,
    SAMPLES,
    STREAM_LAG,
    STREAM_READ_RATE,
    STREAM_SOURCE_RATE,
    TRAINER_STARVED,
    TRAINER_BACKPRESSURE,
    TRAINER_SAMPLES,
    DECISIONS,
    TARGET,
    LOAD,
)

# Every series carries these labels.
JOB_LABEL, ROLE_LABEL, WORKER_LABEL = "primus_job", "role", "worker"
