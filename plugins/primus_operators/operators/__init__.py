"""Operators of one training window: source -> data tasks -> joiner -> sink -> trainer."""

from __future__ import annotations

from primus_operators.operators.data_task import PrimusDataTaskOperator
from primus_operators.operators.joiner import PrimusJoinerOperator
from primus_operators.operators.sink import PrimusSinkOperator
from primus_operators.operators.source import PrimusDataSourceOperator
from primus_operators.operators.trainer import PrimusTrainerOperator

__all__ = [
    "PrimusDataSourceOperator",
    "PrimusDataTaskOperator",
    "PrimusJoinerOperator",
    "PrimusSinkOperator",
    "PrimusTrainerOperator",
]
