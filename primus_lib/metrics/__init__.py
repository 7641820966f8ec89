"""prometheus-client instrumentation shared by data executors and trainers, and the readers the
Dynamic Scaling Manager uses (a real Prometheus server, or the in-process registry)."""

from __future__ import annotations

from primus_lib.metrics.instruments import ExecutorMetrics, TrainerMetrics, serve, write_snapshot
from primus_lib.metrics.names import METRIC_NAMES

__all__ = ["METRIC_NAMES", "ExecutorMetrics", "TrainerMetrics", "serve", "write_snapshot"]
