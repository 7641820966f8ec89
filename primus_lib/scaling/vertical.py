"""Vertical policy: CPU and memory per data executor.

new allocation = peak usage in the look-back window + forecast D(N) + safety margin x peak,
skipped when the change is below ``min_change`` (a fraction of the current allocation). An OOM kill
grows memory by ``oom_growth`` at once (urgent: not held back by cooldowns).
"""

from __future__ import annotations

import math

from primus_lib.scaling.base import Decision, PolicyContext, ScalingPolicy
from primus_lib.scaling.forecast import forecast_change
from primus_lib.spec.scaling import VerticalScaling

MIN_SAMPLES = 3  # fewer usage points than this in the window: no forecast, hold
CPU_QUANTUM = 0.1  # cores: allocations are rounded up to this
MEMORY_QUANTUM = 64 * 2**20  # bytes
MIN_CPU = 0.1
MIN_MEMORY = 256 * 2**20
SETTLE_SECONDS = 120.0  # after a resize, the horizontal policy waits this long (pods restart)


def _round_up(value: float, quantum: float, floor: float) -> float:
    return round(max(floor, math.ceil(value / quantum - 1e-9) * quantum), 6)


class VerticalPolicy(ScalingPolicy):
    name = "vertical"

    def __init__(self, spec: VerticalScaling, role: str = "data_executor") -> None:
        self.spec, self.role = spec, role

    def cooldown_seconds(self) -> float:
        return self.spec.lookback.total_seconds()  # a fresh window of usage under the new size

    def settle_seconds(self) -> float:
        return SETTLE_SECONDS

    def urgent(self, ctx: PolicyContext) -> bool:
        return self.spec.enabled and ctx.new_oom_kills > 0

    def target(self, series: list[float]) -> tuple[float, float, float]:
        """(target, peak, forecast) for one resource's usage series."""
        peak = max(series)
        change = forecast_change(series)
        return max(0.0, peak + change) + self.spec.safety_margin * peak, peak, change

    def _big_enough(self, new: float, current: float) -> bool:
        return current <= 0 or abs(new - current) / current >= self.spec.min_change

    def decide(self, ctx: PolicyContext) -> Decision | None:
        if not self.spec.enabled:
            return None
        alloc = ctx.allocation
        window = [p for p in ctx.history if p.at >= ctx.now - self.spec.lookback.total_seconds()]
        inputs: dict = {
            "cpu_now": alloc.cpu,
            "memory_now": alloc.memory,
            "samples": len(window),
            "new_oom_kills": ctx.new_oom_kills,
        }
        cpu, memory = alloc.cpu, alloc.memory
        reasons = []
        if len(window) >= MIN_SAMPLES:
            cpu_t, cpu_peak, cpu_d = self.target([p.cpu_cores for p in window])
            mem_t, mem_peak, mem_d = self.target([p.memory_bytes for p in window])
            inputs.update(cpu_peak=cpu_peak, cpu_forecast=cpu_d, memory_peak=mem_peak, memory_forecast=mem_d)
            cpu_t = _round_up(cpu_t, CPU_QUANTUM, MIN_CPU)
            mem_t = _round_up(mem_t, MEMORY_QUANTUM, MIN_MEMORY)
            if self._big_enough(cpu_t, alloc.cpu):
                cpu = cpu_t
                reasons.append(f"cpu {alloc.cpu:g} -> {cpu_t:g} (peak {cpu_peak:.2f} + forecast {cpu_d:+.2f} + margin)")
            if self._big_enough(mem_t, alloc.memory):
                memory = mem_t
                reasons.append(f"memory {alloc.memory:.0f} -> {mem_t:.0f}")
        if ctx.new_oom_kills > 0:
            grown = _round_up(alloc.memory * (1 + self.spec.oom_growth), MEMORY_QUANTUM, MIN_MEMORY)
            if grown > memory:
                memory = grown
                reasons.append(f"{ctx.new_oom_kills:g} OOM kill(s): memory x{1 + self.spec.oom_growth:g}")
        if (cpu, memory) == (alloc.cpu, alloc.memory):
            return None
        return Decision(
            self.name,
            "resize",
            alloc.role,
            cpu=cpu,
            memory=memory,
            reason="; ".join(reasons),
            inputs=inputs,
            at=ctx.now,
        )
