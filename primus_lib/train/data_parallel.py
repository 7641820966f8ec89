"""The trainer loop, steps and checkpoints of a data-parallel world (torchrun, world size > 1).

Each rank reads its own share of the data (``ranks.py``) into its own buffers. Ranks must
run the same kind of step together (a batch step all-reduces memory-tower gradients, a
stream step adapt-tower gradients), so every iteration they all-reduce one control vector:
per buffer the rows each rank would take now (a full minibatch, or a remainder of an
exhausted source), the rows queued, whether the rank's feed is drained (``trainer.py``) and
the remainder it would flush, plus flags (checkpoint wanted, done, idle, until reached).
Every rank derives the same decision from the sums:

- the next minibatch comes from the buffer with the highest ``w * sigmoid(q)``, ``q`` the
  global queue in global minibatches, among buffers some rank can serve; ranks with
  nothing ready for it join the step with zero rows (zero gradient), so nobody waits on
  a slow partition and every row is still trained once;
- a batch buffer's partial remainder is flushed only when *every* rank's feed is drained
  (or exhausted): then each rank takes what it holds, up to a minibatch, and a window that
  does not fill a global minibatch completes without waiting for the next window, while
  no rank still reading the same window has its rows split off;
- the loss is the sum over this rank's rows divided by the global row count, so the
  all-reduced gradient is the mean over the global minibatch.

Checkpoints: every rank captures its cursors and unread rows under its lock at the same
step; rank 0 gathers them and writes model + optimizers (identical on all ranks) + every
rank's position in one atomic checkpoint; only then do ranks commit stream offsets. Rank 0
merges per-window statistics over ranks for progress.json (samples summed).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from primus_lib.paths import parse_window_id
from primus_lib.progress import window_summary, write_progress
from primus_lib.timegrid import epoch_ms
from primus_lib.train.batch import to_batch
from primus_lib.train.checkpoint import check_checkpoint, load_latest, save_checkpoint
from primus_lib.train.distributed import bytes_table, table_bytes
from primus_lib.train.metrics import WindowStats
from primus_lib.train.priority import priority

if TYPE_CHECKING:
    from primus_lib.train.trainer import Trainer

log = logging.getLogger("primus.trainer")
FLAGS = ("checkpoint", "done", "idle", "until", "batch_finished")
NEVER = -(2**62)


class DataParallel:
    def __init__(self, trainer: Trainer):
        self.t = trainer
        self.group = trainer.group
        self.names = list(trainer.reader.buffers)
        self.takes: dict[str, int] = {}
        self.global_consumed: dict[str, dict] = {}  # rank 0: windows every rank has finished
        # The batch-lag gate follows the stream over all ranks: closed until the first agreement.
        self.gated = bool(trainer.stream_feeds) and trainer.mode != "offline_then_online"
        self.mark: int | None = NEVER if self.gated else None

    def watermark_ms(self) -> int | None:
        """The stream's position over every rank (read by the prefetch thread)."""
        return self.mark

    def _agree_mark(self) -> None:
        """Newest event time read on any rank; the clock once every rank's sources caught up;
        None (no gate) once every rank's bounded sources ended. A rank without stream
        partitions neither holds the gate back nor opens it on its own."""
        if not self.gated:
            return
        t = self.t
        feeds = [f for fs in t.stream_feeds.values() for f in fs]
        mark = max((f.watermark_ms for f in feeds), default=NEVER)
        behind = float(not all(f.caught_up for f in feeds))
        running = float(not all(f.ended() for f in feeds))
        mark, behind, running = self.group.max([float(mark), behind, running])
        if not running:
            self.mark = None
        elif not behind:
            self.mark = max(int(mark), int(t.clock() * 1000))
        else:
            self.mark = int(mark)

    # -- the per-iteration agreement ----------------------------------------------------
    def control(self, idle: bool) -> tuple[str | None, int, dict[str, bool]]:
        """(buffer to step, global rows of that step, flags true on every rank / any rank)."""
        t = self.t
        self._agree_mark()
        size = t.batch_size
        values: list[float] = []
        full: dict[str, int] = {}
        partial: dict[str, int] = {}
        for name in self.names:
            buffer = t.reader.buffers[name]
            full[name] = min(size, buffer.rows) if buffer.full(size) else 0
            partial[name] = min(size, buffer.rows)
            values += [full[name], buffer.rows, float(buffer.drained or buffer.exhausted), partial[name]]
        options = t.options
        want = t.windows_done_since_checkpoint or bool(
            t.checkpoint_every_s and time.monotonic() - t.last_checkpoint_at >= t.checkpoint_every_s
        )
        batch = [t.reader.buffers[n] for n in t.batch_feeds]
        local = {
            "checkpoint": want,
            "done": t._all_done(),
            "idle": idle and options.idle_exit is not None,
            "until": t._until_reached() or self._nothing_to_reach(),
            "batch_finished": all(b.exhausted and b.rows == 0 for b in batch),
        }
        sums = self.group.sum(values + [float(local[f]) for f in FLAGS])
        n = self.group.size
        width = 4 * len(self.names)
        flags = {f: sums[width + i] >= n for i, f in enumerate(FLAGS)}
        flags["checkpoint"] = sums[width] > 0  # any rank finished a window
        only = None
        if t.mode == "offline_then_online" and not flags["batch_finished"]:
            only = set(t.batch_feeds)  # the stream is served once every rank finished the batch phase
        best, best_p, rows = None, -1.0, 0
        self.takes = {}
        for i, name in enumerate(self.names):
            take, queued, drained, flush = sums[4 * i : 4 * i + 4]
            self.takes[name] = full[name]
            if drained >= n:  # every rank's feed is drained: remainders go too
                self.takes[name], take = partial[name], flush
            take = int(take)
            if take == 0 or (only is not None and name not in only):
                continue
            p = priority(t.reader.buffers[name].weight, queued / n, size)
            if p > best_p:
                best, best_p, rows = name, p, take
        return best, rows, flags

    def _nothing_to_reach(self) -> bool:
        """Stream-only --until-window: a rank that owns no stream partition agrees to stop."""
        t = self.t
        return t.options.until_window is not None and not t.batch_feeds and not any(t.stream_feeds.values())

    def loop(self) -> None:
        t, options = self.t, self.t.options
        idle_since = time.monotonic()
        im = t.input_metrics
        began = fed = time.perf_counter()
        stepped = full = False
        while True:
            if im is not None:  # the previous iteration, then this one's start
                im.end(began, fed, stepped, full)
                began, full = im.begin(), im.queues_full()
            arrived = t.fill()
            fed = time.perf_counter()
            stepped = False
            if arrived:
                idle_since = time.monotonic()
            idle = options.idle_exit is not None and time.monotonic() - idle_since > options.idle_exit
            chosen, rows, flags = self.control(idle)
            if flags["checkpoint"] or (
                options.checkpoint_steps and t.step - t.last_checkpoint_step >= options.checkpoint_steps
            ):
                self.checkpoint()
            if options.max_steps is not None and t.step >= options.max_steps:
                break
            if flags["until"]:
                break
            if chosen is not None:
                self.train_one(chosen, rows)
                stepped = True
                idle_since = time.monotonic()
                if t.step_delay:
                    time.sleep(t.step_delay)
                continue
            if flags["done"]:
                break
            if flags["idle"]:
                log.info("no new data on any rank for %.0fs: exiting", options.idle_exit)
                break
            if not arrived:
                time.sleep(
                    options.poll_interval if t.prefetch is None else max(0.001, min(options.poll_interval, 0.01))
                )

    def train_one(self, name: str, global_rows: int) -> None:
        t = self.t
        buffer = t.reader.buffers[name]
        take = self.takes.get(name, 0)
        rows = t.reader.serve(name, take) if take else None
        batch = to_batch(rows, t.features, t.id_column) if rows is not None else None
        result = t.stepper.step_synced(buffer.kind, batch, global_rows, self.group)
        t.step += 1
        if batch is not None and result is not None:
            t._account(buffer, rows, batch, result)

    # -- checkpoints --------------------------------------------------------------------
    def checkpoint(self) -> None:
        t = self.t
        if t.step == t.last_checkpoint_step:
            return
        with t.lock:  # this rank's cursors and every row they produced, together
            t.transfer()
            t._close_stream_windows()
            mine = {
                "position": {**t.position(), "unmerged": dict(t.unmerged)},
                "pending": {n: table_bytes(b.pending()) for n, b in t.reader.buffers.items()},
                "horizons": {n: t.stream_horizon(n) for n in t.stream_feeds},
            }
        gathered = self.group.gather(mine)
        # sharded tables: every rank writes its shards (torch.distributed.checkpoint) first
        sharded_state = t.stepper.checkpoint_state(t.step) if getattr(t.stepper, "sharded", False) else None
        reply: dict = {"error": None, "merged": []}
        if self.group.rank == 0:
            try:
                reply["merged"] = self._merge(gathered)
                position = {
                    "mode": t.mode,
                    "world_size": self.group.size,
                    "consumed": self.global_consumed,
                    "ranks": [g["position"] for g in gathered],
                }
                pending = {
                    f"{name}.rank{r}": bytes_table(raw)
                    for r, g in enumerate(gathered)
                    for name, raw in g["pending"].items()
                }
                state = sharded_state if sharded_state is not None else t.stepper.state_dict()
                save_checkpoint(t.paths.checkpoints, t.step, state, position, pending)
            except Exception as exc:  # every rank must learn it, or they wait forever
                reply["error"] = f"{type(exc).__name__}: {exc}"
        reply = self.group.broadcast(reply)
        if reply["error"]:
            raise RuntimeError(f"checkpoint at step {t.step} failed on rank 0: {reply['error']}")
        for key in reply["merged"]:
            t.unmerged.pop(key, None)
        t.last_checkpoint_step = t.step
        t.last_checkpoint_at = time.monotonic()
        t.windows_done_since_checkpoint = False
        for name, feeds in t.stream_feeds.items():  # only now is the position durable
            for feed, saved in zip(feeds, mine["position"]["stream"][name], strict=True):
                feed.reader.commit(saved["offsets"])
        if self.group.rank == 0:
            streams = {n: [p for g in gathered for p in g["position"]["stream"][n]] for n in t.stream_feeds}
            write_progress(t.paths.progress, self.global_consumed, t.step, streams, t.mode)
        t.publish_metrics()

    def _merge(self, gathered: list[dict]) -> list[str]:
        """Windows every rank is finished with: statistics summed into ``global_consumed``.

        A batch window is finished when every rank finished its shards of it; a stream window
        when every rank's stream horizon passed its end.
        """
        t = self.t
        keys = sorted({k for g in gathered for k in g["position"]["unmerged"]} - set(self.global_consumed))
        merged = []
        for key in keys:
            stream, window = key.split("/", 1)
            if stream in t.batch_feeds:
                finished = all(key in g["position"]["unmerged"] for g in gathered)
            else:
                end = epoch_ms(parse_window_id(window)) + t.window_ms
                finished = all(g["horizons"].get(stream, 2**62) >= end for g in gathered)
            if not finished:
                continue
            total = WindowStats()
            for g in gathered:
                raw = g["position"]["unmerged"].get(key)
                if raw is not None:
                    total.merge(WindowStats.from_dict(raw))
            self.global_consumed[key] = window_summary(total)
            merged.append(key)
        return merged

    def restore(self) -> None:
        """Rank 0 reads the checkpoint; each rank gets its own position, all get the model."""
        t = self.t
        meta: dict = {"error": None, "step": None}
        payloads, state = None, None
        if self.group.rank == 0:
            try:
                ckpt = load_latest(t.paths.checkpoints)
                if ckpt is not None:
                    check_checkpoint(ckpt.path, ckpt.position, t.mode, self.group.size)
                    meta = {"error": None, "step": ckpt.step, "path": str(ckpt.path)}
                    self.global_consumed = dict(ckpt.position.get("consumed", {}))
                    payloads = [
                        {
                            "position": pos,
                            "pending": {n: table_bytes(ckpt.pending.get(f"{n}.rank{r}")) for n in t.reader.buffers},
                        }
                        for r, pos in enumerate(ckpt.position["ranks"])
                    ]
                    state = ckpt.state
            except Exception as exc:
                meta = {"error": f"{type(exc).__name__}: {exc}", "step": None}
        meta = self.group.broadcast(meta)
        if meta["error"]:
            raise RuntimeError(f"rank 0 could not restore the checkpoint: {meta['error']}")
        if meta["step"] is None:
            t.log_run(0)
            return
        mine = self.group.scatter(payloads)
        t.stepper.load_state_dict(self.group.broadcast(state))
        t.step = int(meta["step"])
        pos = mine["position"]
        t.apply_position(pos, {n: bytes_table(raw) for n, raw in mine["pending"].items()})
        merged = set(self.group.broadcast(sorted(self.global_consumed)))
        t.unmerged = {k: v for k, v in pos.get("unmerged", {}).items() if k not in merged}
        t.last_checkpoint_step = t.step
        t.log_run(t.step)
        log.info("rank %d resumed from %s at step %d", self.group.rank, meta["path"], t.step)
