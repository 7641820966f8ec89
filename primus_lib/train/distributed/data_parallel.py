"""The coordinator of a data-parallel world (torchrun, world size > 1).

Each rank reads its own share of the data (``ranks.py``) into its own buffers. Ranks must
run the same kind of step together (a batch step all-reduces memory-tower gradients, a
stream step adapt-tower gradients), so every iteration they all-reduce one control vector:
per buffer the rows each rank would take now (a full minibatch, or a remainder of an
exhausted source), the rows queued, whether the rank's feed is drained (``inputs.py``) and
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

from primus_lib.paths import parse_window_id
from primus_lib.progress import window_summary, write_progress
from primus_lib.storage import Where
from primus_lib.timegrid import epoch_ms
from primus_lib.train.checkpoint.safe_load import UnsafeCheckpointError
from primus_lib.train.checkpoint.store import check_checkpoint, load_latest, save_checkpoint
from primus_lib.train.distributed.group import Group, bytes_table, table_bytes
from primus_lib.train.model.batch import Batch
from primus_lib.train.model.metrics import WindowStats
from primus_lib.train.model.objective import StepResult
from primus_lib.train.runtime.coordinator import Coordinator, Decision, Resumed, Snapshot, Wants
from primus_lib.train.runtime.inputs import NEVER, Inputs
from primus_lib.train.runtime.priority import RowShare, priority

FLAGS = ("checkpoint", "done", "idle", "until", "batch_finished")


class DataParallel(Coordinator):
    def __init__(self, mode: str, checkpoints: Where, progress: Where, group: Group, window_ms: int, clock):
        super().__init__(mode, checkpoints, progress)
        self.group = group
        self.rank, self.size = group.rank, group.size
        self.window_ms = window_ms
        self.clock = clock
        self.global_consumed: dict[str, dict] = {}  # rank 0: windows every rank has finished
        self.gated = False
        self.mark: int | None = None
        self.gathered: list[dict] | None = None
        self.share = RowShare()  # the row-level priority, fed the agreed numbers (every rank the same)

    def attach(self, inputs: Inputs) -> None:
        # The batch-lag gate follows the stream over all ranks: closed until the first agreement.
        self.gated = bool(inputs.stream_feeds) and inputs.gates_batch
        self.mark = NEVER if self.gated else None
        inputs.watermark = lambda: self.mark  # read by the prefetch thread

    def _agree_mark(self, inputs: Inputs) -> None:
        """Newest event time read on any rank; the clock once every rank's sources caught up;
        None (no gate) once every rank's bounded sources ended. A rank without stream
        partitions neither holds the gate back nor opens it on its own."""
        if not self.gated:
            return
        feeds = inputs.all_stream_feeds()
        mark = max((f.watermark_ms for f in feeds), default=NEVER)
        behind = float(not all(f.caught_up for f in feeds))
        running = float(not all(f.ended() for f in feeds))
        newest, behind, running = self.group.max([float(mark), behind, running])
        if not running:
            self.mark = None
        elif not behind:
            self.mark = max(int(newest), int(self.clock() * 1000))
        else:
            self.mark = int(newest)

    def decide(self, inputs: Inputs, wants: Wants) -> Decision:
        self._agree_mark(inputs)
        size = inputs.batch_size
        buffers = inputs.reader.buffers
        names = list(buffers)
        values: list[float] = []
        full: dict[str, int] = {}
        partial: dict[str, int] = {}
        for name in names:
            buffer = buffers[name]
            full[name] = min(size, buffer.rows) if buffer.full(size) else 0
            partial[name] = min(size, buffer.rows)
            values += [full[name], buffer.rows, float(buffer.drained or buffer.exhausted), partial[name]]
        # stream-only --until-window: a rank that owns no stream partition agrees to stop
        nothing_to_reach = (
            inputs.limits.until_ms is not None and not inputs.batch_feeds and not any(inputs.stream_feeds.values())
        )
        local = {
            "checkpoint": wants.checkpoint,
            "done": wants.done,
            "idle": wants.idle,
            "until": wants.until or nothing_to_reach,
            "batch_finished": inputs.batch_phase_over(),
        }
        sums = self.group.sum(values + [float(local[f]) for f in FLAGS])
        n = self.size
        width = 4 * len(names)
        flags = {f: sums[width + i] >= n for i, f in enumerate(FLAGS)}
        flags["checkpoint"] = sums[width] > 0  # any rank finished a window
        only = None
        if inputs.limits.switch_ms is not None and not flags["batch_finished"]:
            only = set(inputs.batch_feeds)  # the stream is served once every rank finished the batch phase
        ready: dict[str, float] = {}
        steps: dict[str, tuple[int, int]] = {}  # name -> (global rows, this rank's take)
        for i, name in enumerate(names):
            step_rows, queued, drained, flush = sums[4 * i : 4 * i + 4]
            mine = full[name]
            if drained >= n:  # every rank's feed is drained: remainders go too
                mine, step_rows = partial[name], flush
            step_rows = int(step_rows)
            if step_rows == 0 or (only is not None and name not in only):
                continue
            ready[name] = priority(buffers[name].weight, queued / n, size)
            steps[name] = (step_rows, mine)
        best = self.share.pick(ready)  # the same agreed numbers on every rank: the same pick
        rows, take = steps[best] if best is not None else (0, 0)
        if best is not None:
            self.share.served(best, rows, ready)
        return Decision(best, take, rows, flags["checkpoint"], flags["done"], flags["idle"], flags["until"])

    def step(self, stepper, kind: str, batch: Batch | None, global_rows: int) -> StepResult | None:
        return stepper.step(kind, batch, global_rows, self.group)

    # -- checkpoints --------------------------------------------------------------------
    def save(self, snapshot: Snapshot, stepper) -> None:
        mine: dict = {
            "position": snapshot.position,
            "pending": {n: table_bytes(t) for n, t in snapshot.pending.items()},
            "horizons": snapshot.horizons,
            "streamed": streamed.state_dict() if (streamed := stepper.evidence.streamed) is not None else None,
        }
        gathered = self.group.gather(mine)
        # sharded tables: every rank writes its shards (torch.distributed.checkpoint) first
        sharded_state = stepper.checkpoint_state(snapshot.step) if stepper.syncs_towers else None
        reply: dict = {"error": None, "merged": []}
        if self.rank == 0:
            try:
                if gathered is None:
                    raise RuntimeError("rank 0 gathered no positions")
                reply["merged"] = self._merge(gathered)
                position = {
                    "mode": self.mode,
                    "world_size": self.size,
                    "consumed": self.global_consumed,
                    "ranks": [g["position"] for g in gathered],
                }
                pending = {
                    f"{name}.rank{r}": bytes_table(raw)
                    for r, g in enumerate(gathered)
                    for name, raw in g["pending"].items()
                }
                state = sharded_state if sharded_state is not None else stepper.state_dict()
                if mine["streamed"] is not None:  # each rank's stream rows, restored to that rank
                    state = {**state, "evidence": {**state["evidence"], "streamed": per_rank(gathered)}}
                save_checkpoint(self.checkpoints, snapshot.step, state, position, pending)
            except Exception as exc:  # every rank must learn it, or they wait forever
                reply["error"] = f"{type(exc).__name__}: {exc}"
        reply = self.group.broadcast(reply)
        if reply["error"]:
            raise RuntimeError(f"checkpoint at step {snapshot.step} failed on rank 0: {reply['error']}")
        self.merged_keys = list(reply["merged"])
        self.gathered = gathered

    def publish(self, snapshot: Snapshot, consumed: dict[str, dict]) -> None:
        if self.rank == 0 and self.gathered is not None:
            gathered = self.gathered
            names = snapshot.position["stream"]
            streams = {n: [p for g in gathered for p in g["position"]["stream"][n]] for n in names}
            write_progress(self.progress, self.global_consumed, snapshot.step, streams, self.mode)
        self.gathered = None

    def _merge(self, gathered: list[dict]) -> list[str]:
        """Windows every rank is finished with: statistics summed into ``global_consumed``.

        A batch window is finished when every rank finished its shards of it; a stream window
        when every rank's stream horizon passed its end.
        """
        batch_streams = set(gathered[0]["position"]["batch"])
        keys = sorted({k for g in gathered for k in g["position"]["unmerged"]} - set(self.global_consumed))
        merged = []
        for key in keys:
            stream, window = key.split("/", 1)
            if stream in batch_streams:
                finished = all(key in g["position"]["unmerged"] for g in gathered)
            else:
                end = epoch_ms(parse_window_id(window)) + self.window_ms
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

    def restore(self) -> Resumed | None:
        """Rank 0 reads the checkpoint; each rank gets its own position, all get the model."""
        meta: dict = {"error": None, "step": None}
        payloads: list[dict] | None = None
        state: dict | None = None
        if self.rank == 0:
            try:
                ckpt = load_latest(self.checkpoints)
                if ckpt is not None:
                    check_checkpoint(ckpt.path, ckpt.position, self.mode, self.size)
                    meta = {"error": None, "step": ckpt.step, "path": str(ckpt.path)}
                    self.global_consumed = dict(ckpt.position.get("consumed", {}))
                    payloads = [
                        {
                            "position": pos,
                            "pending": {
                                name.rpartition(".rank")[0]: table_bytes(table)
                                for name, table in ckpt.pending.items()
                                if name.endswith(f".rank{r}")
                            },
                        }
                        for r, pos in enumerate(ckpt.position["ranks"])
                    ]
                    state = ckpt.state
            except Exception as exc:
                unsafe = isinstance(exc, UnsafeCheckpointError)
                meta = {"error": f"{type(exc).__name__}: {exc}", "step": None, "unsafe": unsafe}
        meta = self.group.broadcast(meta)
        if meta["error"]:
            error = UnsafeCheckpointError if meta.get("unsafe") else RuntimeError  # the CLI's one line
            raise error(f"rank 0 could not restore the checkpoint: {meta['error']}")
        if meta["step"] is None:
            return None
        mine = self.group.scatter(payloads)
        state = self.group.broadcast(state)
        if mine is None or state is None:  # rank 0 read a checkpoint: it sends every rank both
            raise RuntimeError(f"rank {self.rank}: rank 0 sent no checkpoint state for step {meta['step']}")
        merged = set(self.group.broadcast(sorted(self.global_consumed)))
        pending = {n: bytes_table(raw) for n, raw in mine["pending"].items()}
        return Resumed(meta["path"], int(meta["step"]), state, mine["position"], pending, merged)

    def consumed(self, local: dict[str, dict]) -> dict[str, dict]:
        return self.global_consumed if self.rank == 0 else local


def per_rank(gathered: list[dict]) -> dict:
    """The once rule's records of every rank, in rank order (``StreamedRows.load_state_dict(state, rank)``)."""
    return {"ranks": [g["streamed"] for g in gathered]}
