"""The scaling policy interface (Ray Data autoscaler style: one small ABC, one file per policy)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from primus_lib.metrics.readers import Snapshot, UsagePoint

Action = Literal["scale_up", "scale_down", "resize"]


@dataclass(frozen=True)
class Allocation:
    """What a role has now: replicas and per-worker CPU (cores) / memory (bytes), with bounds."""

    role: str
    replicas: int
    cpu: float
    memory: float
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True)
class PolicyContext:
    now: float
    snapshot: Snapshot
    allocation: Allocation
    history: list[UsagePoint] = field(default_factory=list)
    new_oom_kills: float = 0.0
    # stream executors: the most rows/s one read per busy allotted core over the look-back (None:
    # no rates reported), measured where it was busiest, so least diluted by its fixed costs
    read_capacity: float | None = None


@dataclass(frozen=True)
class Decision:
    """One change, with everything it was based on (logged and exported as a metric)."""

    policy: str
    action: Action
    role: str
    replicas: int | None = None
    cpu: float | None = None
    memory: float | None = None
    reason: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ScalingPolicy(ABC):
    """Looks at one context and proposes at most one decision; the manager applies it."""

    name: str = "abstract"

    @abstractmethod
    def cooldown_seconds(self) -> float:
        """Time after this policy's change before this policy may act again (the others wait
        ``settle_seconds``)."""

    def settle_seconds(self) -> float:
        """Time after this policy's change before *another* policy may act (one strategy at a time)."""
        return self.cooldown_seconds()

    @abstractmethod
    def decide(self, ctx: PolicyContext) -> Decision | None:
        """A decision, or None to hold."""

    def urgent(self, ctx: PolicyContext) -> bool:
        """True when this policy must act even during a cooldown (an OOM kill)."""
        return False
