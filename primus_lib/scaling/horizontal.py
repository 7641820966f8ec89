"""Horizontal policy: the number of data executors, from the load L_u = w . u (the paper's rule).

u = [sample-buffer utilisation, CPU utilisation, memory utilisation] of the data executors.
L_u < threshold -> the buffers run dry (the trainers out-consume the executors): add executors.
L_u > threshold -> the buffers stay full: remove some (their unfinished tasks go back to pending).

Two guards the paper leaves implicit, both read directly from the trainers:
- add only while a trainer is *starved* (waits for data), never while it back-pressures
  (its input queue is full: more executors would only fill buffers; ray #45331), and not while
  executors asked for earlier are still starting (they do not report metrics yet);
- stream executors (role ``stream_executor``) are added only while they are *behind the source*:
  their Kafka lag (rows of their partitions not read yet, ``Snapshot.stream_lag``) is at least
  ``STREAM_LAG_MIN_ROWS``. A trainer starved by a source that only trickles waits at the live
  edge whatever the number of executors; more of them would idle (Ray's autoscaler adds nodes
  for pending demand only). They are sized from the rates they measure (the source's rate and
  backlog over one executor's: ``_sized_by_rates``). Batch data executors keep the rule above.
  Stream executors caught up with the source (lag under ``STREAM_LAG_MIN_ROWS``) and under
  ``STREAM_BUSY_CPU`` (or busier, where their rates size fewer) are removed down to as many as
  their work needs at that load, at least one per decision (at most ``step`` of the pool, unless
  their rates size it): a source-bound stream never back-pressures the trainer, so the rule below
  would keep a surge's executors forever;
  removing one at a time while the rest would idle at half load kept two where one sufficed (the
  work of 0.7 executor after a surge: 4 -> 3 -> 2, then held);
- remove only while the trainers back-pressure (the buffers are full, executors idle) and none
  is starved, at a quarter of the pace of adding (buffers lag the change).

Why CPU and memory get small default weights (docs/scaling.md has the derivation): the buffer and
CPU terms move in opposite directions (an under-provisioned pool has empty buffers and busy CPUs),
so a large CPU/memory weight can hold L_u above the threshold while the trainers starve. With
weights w = [w_b, w_c, w_m], the buffer term alone decides whenever
    b < (threshold - DEAD_BAND - w_c - w_m) / w_b   (add)   or   b > (threshold + DEAD_BAND) / w_b   (remove),
whatever CPU and memory read. The defaults [0.8, 0.1, 0.1] with threshold 0.5 give b < 0.31 -> add and
b > 0.69 -> remove; CPU and memory only tip decisions inside that band, where the starvation guard rules.
"""

from __future__ import annotations

import math

from primus_lib.scaling.base import Decision, PolicyContext, ScalingPolicy
from primus_lib.spec.scaling import HorizontalScaling

DEFAULT_WEIGHTS = (0.8, 0.1, 0.1)
DEAD_BAND = 0.05  # |L_u - threshold| below this: hold (no flapping around the threshold)
STARVED_MIN = 0.02  # a trainer waiting >= 2% of its step time for data (with dry buffers) is starved
BACKPRESSURE_MAX = 0.20  # a trainer whose input queue is full >= 20% of the time is the bottleneck
DOWN_FRACTION = 0.25  # without usage history: scale down at a quarter of the pace of scale-up
HEADROOM = 0.05  # executors kept above the estimated need when scaling down
MIN_DOWN_SHARE = 0.01  # removals smaller than 1% of the pool are not worth a decision (churn)
STREAM_ROLE = "stream_executor"
# stream executors with this many Kafka rows unread (summed) are behind the source: a full default
# poll (``primus executor --poll-rows``) waits; at the live edge they lag by about rate x 0.2 s
STREAM_LAG_MIN_ROWS = 4096
# caught-up stream executors: keep as many as would run their current work at most this busy (the
# rest is headroom for the source's jitter; a surge is caught by the lag rule, not by idle cores)
STREAM_BUSY_CPU = 0.85
# stream executors behind Kafka at this share of their cores or more cannot go faster: the backlog
# grows or drains slowly whatever the trainer's wait reads, so without measured rates they grow by
# the whole ``step``
STREAM_SATURATED_CPU = 0.9
# sized by measured rates, stream executors are to read a backlog within this (Flink's autoscaler's
# default catch-up duration): the source's own rate decides a surge's size, the backlog a long one's
CATCH_UP_SECONDS = 300.0


def _sized_by_rates(ctx: PolicyContext, remembered: bool = True) -> int | None:
    """Stream executors for the source's rate plus its backlog, from the rates the executors measure
    over their reporting interval (None: not reported), as Flink's autoscaler sizes a source: the
    pool read ``r`` rows/s at ``busy`` CPU, so one executor reads ``r / (n busy)`` rows/s when fully
    busy (or more: the peak per busy core of the look-back, ``PolicyContext.read_capacity``); the
    source received ``a`` rows/s; the backlog is to be read within ``CATCH_UP_SECONDS``.
    A measured rate says how many are needed, so the target is bounded by ``min_replicas`` and
    ``max_replicas`` only (up and down), not by ``step``, which bounds a change made without one (a
    pool of 1 at the default step grew by one executor a decision while a surge left it 10x behind).
    ``remembered=False``: from this interval's rate alone, not the look-back's peak."""
    s = ctx.snapshot
    busy = s.busy_read_rate
    if busy is None or s.source_rate is None or s.stream_lag is None:
        return None
    peak = (ctx.read_capacity or 0.0) * ctx.allocation.cpu if remembered else 0.0
    per_executor = max(busy, peak)
    return math.ceil((s.source_rate + s.stream_lag / CATCH_UP_SECONDS) / per_executor * (1 + HEADROOM))


class HorizontalPolicy(ScalingPolicy):
    name = "horizontal"

    def __init__(self, spec: HorizontalScaling, role: str = "data_executor") -> None:
        self.spec, self.role = spec, role
        total = sum(spec.weights)
        self.weights = tuple(w / total for w in spec.weights)

    def cooldown_seconds(self) -> float:
        return self.spec.cooldown.total_seconds()

    def load(self, ctx: PolicyContext) -> float:
        s = ctx.snapshot
        return sum(w * u for w, u in zip(self.weights, (s.buffer, s.cpu, s.memory), strict=True))

    # -- predicates -------------------------------------------------------------------------
    def _starved(self, ctx: PolicyContext) -> bool:
        return ctx.snapshot.trainer_starved >= STARVED_MIN

    def _back_pressured(self, ctx: PolicyContext) -> bool:
        return ctx.snapshot.trainer_backpressure >= BACKPRESSURE_MAX

    def _behind_source(self, ctx: PolicyContext) -> bool:
        """Stream executors only: Kafka holds rows they have not read (unknown lag: not shown behind)."""
        if ctx.allocation.role != STREAM_ROLE:
            return True
        lag = ctx.snapshot.stream_lag
        return lag is not None and lag >= STREAM_LAG_MIN_ROWS

    def _surplus_at_source(self, ctx: PolicyContext) -> int:
        """Stream executors caught up with Kafka and under ``STREAM_BUSY_CPU``: how many to remove.
        Down to as many as would run their current work at that load, and at least one: an executor's
        fixed cost (its polls, Flight calls, metrics) is paid by each, so n executors read busier than
        their rows make them and fewer would do the same work with less; a removal too many shows as
        lag, which adds them back. Executors that report their rates go down to what the rates size
        (``_sized_by_rates``) in one decision, as they came: by CPU alone, one a decision, a surge's
        pool of 4 took three cooldowns to drain while its fixed costs kept each 0.15-core executor
        66-83% busy. Without rates at most ``step`` of the pool.

        A pool at least ``STREAM_BUSY_CPU`` busy leaves only where this interval's rates size fewer
        (not the look-back's peak, which a busy pool is not reaching): one that has just read its
        backlog was busy over the interval it reports, yet its rates carry that (the pool read ``r``
        at that CPU); gated on the CPU alone, a surge's pool that had caught up (2,360 rows behind,
        95% busy) stayed until the scaler's next tick."""
        s, a = ctx.snapshot, ctx.allocation
        if a.role != STREAM_ROLE or s.stream_lag is None or s.stream_lag >= STREAM_LAG_MIN_ROWS or self._starting(ctx):
            return 0
        busy = s.cpu >= STREAM_BUSY_CPU
        sized = _sized_by_rates(ctx, remembered=not busy)
        if busy and sized is None:
            return 0
        keep = a.replicas if busy else min(a.replicas - 1, math.ceil(s.cpu * a.replicas / STREAM_BUSY_CPU - 1e-9))
        if sized is not None:
            return max(0, a.replicas - max(a.min_replicas, min(keep, sized)))
        keep = max(a.min_replicas, keep)
        return max(0, min(a.replicas - keep, max(1, math.floor(a.replicas * self.spec.step))))

    def _starting(self, ctx: PolicyContext) -> bool:
        """Executors asked for earlier do not report yet: their effect is still to come."""
        return ctx.snapshot.executors < ctx.allocation.replicas

    def _should_scale_up(self, ctx: PolicyContext, load: float) -> bool:
        return (
            load < self.spec.threshold - DEAD_BAND
            and self._starved(ctx)
            and not self._back_pressured(ctx)
            and self._behind_source(ctx)
            and not self._starting(ctx)
            and ctx.allocation.replicas < ctx.allocation.max_replicas
        )

    def _should_scale_down(self, ctx: PolicyContext, load: float) -> bool:
        return (
            load > self.spec.threshold + DEAD_BAND
            and not self._starved(ctx)
            and self._back_pressured(ctx)
            and ctx.allocation.replicas > ctx.allocation.min_replicas
        )

    # -- sizes ------------------------------------------------------------------------------
    def _up_by(self, ctx: PolicyContext) -> int:
        """A trainer waiting a share s of its time gets (1 - s) of its demand: need n / (1 - s), plus
        the HEADROOM a scale-down keeps (so the two agree on the target and buffers refill).
        Stream executors behind Kafka: as many as their measured rates call for
        (``_sized_by_rates``: at any CPU, since the rates carry it; a saturation gate on one
        interval's CPU, 0.88 where a surge began mid-interval, fell back to one at a time); without
        rates, saturated ones grow by the whole step (a backlog in Kafka is demand the trainer's
        wait, which also counts batch windows and the executors' buffers, understates)."""
        n, s = ctx.allocation.replicas, min(ctx.snapshot.trainer_starved, 0.9)
        cap = math.ceil(n * self.spec.step)
        if ctx.allocation.role == STREAM_ROLE:
            sized = _sized_by_rates(ctx)
            if sized is not None:
                return max(1, sized - n)
            if ctx.snapshot.cpu >= STREAM_SATURATED_CPU:
                return cap
        wanted = math.ceil(n / (1.0 - s) * (1 + HEADROOM)) - n
        return max(1, min(wanted, cap))

    def _down_by(self, ctx: PolicyContext, load: float) -> int:
        """Back-pressured executors are throttled: each uses cpu x cores now, and could use the peak
        per-executor usage seen in the window; keep enough at that peak (+ HEADROOM) for today's
        output. Without history: in proportion to L_u's excess, slowly. At most ``step`` of the pool."""
        n, theta = ctx.allocation.replicas, self.spec.threshold
        cap = math.floor(n * self.spec.step)
        peak = max((p.cpu_cores for p in ctx.history), default=0.0)
        used = ctx.snapshot.cpu * ctx.allocation.cpu
        if peak > 0 and used > 0:
            keep = math.ceil(n * min(1.0, used / peak) * (1 + HEADROOM))
            drop = max(0, min(n - keep, cap))
            return drop if drop >= n * MIN_DOWN_SHARE else 0
        excess = min(1.0, (load - theta) / max(1e-9, 1.0 - theta))
        return max(1, math.floor(n * self.spec.step * excess * DOWN_FRACTION))

    def decide(self, ctx: PolicyContext) -> Decision | None:
        if not self.spec.enabled:
            return None
        load = self.load(ctx)
        alloc = ctx.allocation
        inputs = {
            "load": round(load, 4),
            "threshold": self.spec.threshold,
            "weights": list(self.weights),
            **ctx.snapshot.to_dict(),
            "replicas": alloc.replicas,
        }
        if self._should_scale_up(ctx, load):
            target = min(alloc.max_replicas, alloc.replicas + self._up_by(ctx))
            reason = f"L_u {load:.3f} < {self.spec.threshold} and trainer starved {ctx.snapshot.trainer_starved:.2f}"
            if alloc.role == STREAM_ROLE:
                reason += f" and stream executors {ctx.snapshot.stream_lag:.0f} rows behind Kafka"
            return Decision(
                self.name, "scale_up", alloc.role, replicas=target, reason=reason, inputs=inputs, at=ctx.now
            )
        if self._should_scale_down(ctx, load):
            target = max(alloc.min_replicas, alloc.replicas - self._down_by(ctx, load))
            if target == alloc.replicas:
                return None
            reason = f"L_u {load:.3f} > {self.spec.threshold} and no trainer starved"
            return Decision(
                self.name, "scale_down", alloc.role, replicas=target, reason=reason, inputs=inputs, at=ctx.now
            )
        surplus = self._surplus_at_source(ctx)
        if surplus:
            target = alloc.replicas - surplus
            s = ctx.snapshot
            why = "their rates" if s.cpu >= STREAM_BUSY_CPU else f"under {STREAM_BUSY_CPU:.0%}"
            reason = (
                f"stream executors caught up with Kafka ({s.stream_lag:.0f} rows behind) at "
                f"{s.cpu:.0%} CPU, {why}: {target} can serve it"
            )
            return Decision(
                self.name, "scale_down", alloc.role, replicas=target, reason=reason, inputs=inputs, at=ctx.now
            )
        return None
