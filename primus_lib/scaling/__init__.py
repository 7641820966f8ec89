"""The Dynamic Scaling Manager: horizontal (data executors vs trainers) and vertical (CPU/memory
per executor) policies behind one interface, applied one at a time with cooldowns."""

from __future__ import annotations

from primus_lib.allocation import role_resources, scaling_dir
from primus_lib.scaling.base import Allocation, Decision, PolicyContext, ScalingPolicy
from primus_lib.scaling.forecast import forecast_change
from primus_lib.scaling.horizontal import HorizontalPolicy
from primus_lib.scaling.manager import Actuator, BackendActuator, ScalingManager
from primus_lib.scaling.store import ScalingStore, executor_config
from primus_lib.scaling.vertical import VerticalPolicy

__all__ = [
    "Actuator",
    "Allocation",
    "BackendActuator",
    "Decision",
    "HorizontalPolicy",
    "PolicyContext",
    "ScalingManager",
    "ScalingPolicy",
    "ScalingStore",
    "VerticalPolicy",
    "executor_config",
    "forecast_change",
    "role_resources",
    "scaling_dir",
]
