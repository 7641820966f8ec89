"""Trainer throughput on the user's path: ``primus train`` (``run_trainer``, the CLI's defaults:
its torch threads, ``gc.freeze``, the prefetch thread, a checkpoint per window, metrics) over
committed local windows and an in-memory stream replay, against a bare TorchRec loop of the same
model shape written from TorchRec's documented API alone (``bench/bare_torchrec.py``: nothing
from ``primus_lib``) over the same minibatch sequence (kinds, sizes, rows), built in memory
before its clock starts. Both are timed from model construction to the last step.

Figures (per sample, wall clock):
- ``ratio_vs_bare_torchrec``: MTRM against the bare loop of MTRM's three towers (``..._single_tower``: the
  single tower against the bare one-tower loop); the median of pairs run back to back, every
  pair in the list. The bare loop's tables are TorchRec's ``FusedEmbeddingBagCollection``
  (row-wise Adagrad fused into backward, the fastest documented CPU path); ``..._in_backward``:
  the same against ``EmbeddingBagCollection`` + ``apply_optimizer_in_backward`` (dense table
  gradients: a slower, more favourable baseline), on the first quarter of the minibatches;
- ``ratio``: MTRM time per sample / single_tower time per sample (aim <= 1.15);
- ``input_wait`` = (loop wall - step - checkpoint) / loop wall: everything the training loop
  did besides the model's step and the checkpoints on its thread (waiting on input, idle
  sleeps, choosing and accounting minibatches), from ``Trainer.run``'s start to its end;
  ``..._other_us_per_step`` and ``..._step_us``: the same time and the step's, per step;
- ``..._thread_cpu``: per CPU second of the training thread and its step's helper thread (MTRM's step
  scores and records beside its backward there: ``LocalStepper._beside_backward``), the least noisy
  figure on a shared box;
- ``step_alone_vs_bare_thread_cpu``: the trainer's stepper alone (``LocalStepper.step`` on the same
  minibatches decoded before its clock starts, no loop, no prefetch thread) against the bare loop,
  per CPU second of the same threads: what the step itself costs beside ordinary TorchRec code;
  ``step_in_trainer_vs_alone_thread_cpu``: the same steps' CPU inside ``primus train`` over alone
  (above 1: the loop's other threads slow the step down).

The machine is shared: contenders are interleaved (each round alternates who goes first) and
every run is in the JSON. Run: .venv/bin/python bench/train.py  (last line: one JSON object)
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bare_torchrec  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from primus_lib.data.datagen import generate  # noqa: E402
from primus_lib.data.shards import write_window  # noqa: E402
from primus_lib.data.training_queue import TrainingQueue  # noqa: E402
from primus_lib.evaluation.replay import TableStreamReader, batch_window, stream_file  # noqa: E402
from primus_lib.paths import JobPaths, window_id  # noqa: E402
from primus_lib.spec import load_job  # noqa: E402
from primus_lib.train.model.batch import to_batch  # noqa: E402
from primus_lib.train.model.stepper import LocalStepper  # noqa: E402
from primus_lib.train.runtime.loop import Trainer  # noqa: E402
from primus_lib.train.runtime.trainer import TrainerOptions, compute_threads, run_trainer  # noqa: E402

# 40,000 rows an hour is a small window (a real hour is millions of rows): the checkpoint per
# window weighs more here than in production; the JSON reports its share.
HOURS = int(os.environ.get("BENCH_TRAIN_HOURS", "6"))
ROWS = int(os.environ.get("BENCH_TRAIN_ROWS", "40000"))
ROUNDS = int(os.environ.get("BENCH_TRAIN_ROUNDS", "4"))
START = datetime(2026, 11, 1, tzinfo=UTC)
LAST = window_id(START + timedelta(hours=HOURS - 1))
MODES = ("mtrm", "single_tower")


class Probe:
    """Times the trainer's own methods as ``primus train`` runs them (two clock reads a call)."""

    def __init__(self) -> None:
        self.reset()
        self.helper_cpu_s = 0.0  # the step's helper thread's CPU, never reset (callers take differences)
        self._wrap(LocalStepper, "step", "step_s", self._record)
        self._wrap(Trainer, "checkpoint", "checkpoint_s")
        self._wrap(Trainer, "run", "run_s")
        self._wrap_helper()

    def reset(self) -> None:
        self.step_s = self.checkpoint_s = self.run_s = self.step_cpu_s = 0.0
        self.steps: list[tuple[str, int]] = []  # (kind, rows) of every step, in order

    def _record(self, args: tuple) -> None:
        kind, batch = args[1], args[2]
        if batch is not None:
            self.steps.append((kind, batch.size))

    def _wrap(self, cls: type, name: str, field: str, record=None) -> None:
        inner = getattr(cls, name)

        def timed(*args, **kwargs):
            began, cpu = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter() - began)
                if record is not None:
                    self.step_cpu_s += time.thread_time() - cpu
                    record(args)

        setattr(cls, name, timed)

    def _wrap_helper(self) -> None:
        """The CPU of the step's work on its helper thread (counted in the step's CPU too)."""
        inner = LocalStepper._after_forward

        def timed(*args, **kwargs):
            if threading.current_thread() is threading.main_thread():
                return inner(*args, **kwargs)
            cpu = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                used = time.thread_time() - cpu
                self.helper_cpu_s += used
                self.step_cpu_s += used

        LocalStepper._after_forward = timed  # type: ignore[method-assign]


def setup(tmp: Path):
    os.environ["PRIMUS_DATA"] = str(tmp / "data")
    os.environ["PRIMUS_HOME"] = str(tmp / "home")
    job = load_job(ROOT / "config" / "jobs" / "ctr-eval.yaml")
    generate(tmp / "data", START, START + timedelta(hours=HOURS), rows_per_hour=ROWS, seed=0)
    paths = JobPaths.for_job(job)
    queue = TrainingQueue(paths.ledger)
    stream = job.batch_streams[0]
    windows = []
    for hour in range(HOURS):
        at = START + timedelta(hours=hour)
        table = batch_window(job, stream, at)
        windows.append(table)
        directory = paths.window_dir(stream.name, at)
        write_window(directory, table, stream=stream.name, window=window_id(at), seed=0, rows_per_shard=4096)
        queue.append(stream.name, window_id(at), str(directory), table.num_rows)
    events = stream_file(job, job.stream_streams[0], tmp / "data" / "stream" / "events.jsonl")
    return job, events, pa.concat_tables(windows)


def ours(job, events, mode: str, probe: Probe) -> dict:
    """One ``primus train`` run from scratch, as the CLI calls it (``until_window`` to stop)."""
    paths = JobPaths.for_job(job)
    paths.checkpoints.delete()
    paths.progress.delete()
    probe.reset()
    gc.collect()
    began, own, helper = time.perf_counter(), time.thread_time(), probe.helper_cpu_s
    run_trainer(job, TrainerOptions(mode=mode, until_window=LAST), {"realtime": [TableStreamReader(events)]})
    wall, own = time.perf_counter() - began, time.thread_time() - own + probe.helper_cpu_s - helper
    rows = sum(n for _, n in probe.steps)
    loop = probe.run_s
    other, steps = loop - probe.step_s - probe.checkpoint_s, max(1, len(probe.steps))  # the loop besides steps
    return {
        "samples_per_s": rows / wall,
        "samples_per_thread_cpu_s": rows / own,
        "rows": rows,
        "input_wait": other / loop,
        "other_us_per_step": other / steps * 1e6,
        "step_us": probe.step_s / steps * 1e6,
        "checkpoint_fraction": probe.checkpoint_s / loop,
        "startup_s": wall - loop,
        "step_cpu_s": probe.step_cpu_s,
        "steps": list(probe.steps),
    }


def shape(job) -> bare_torchrec.Shape:
    spec = job.spec
    return bare_torchrec.Shape(
        sparse={f.name: f.buckets for f in spec.features.sparse},
        dense=list(spec.features.dense),
        label=spec.features.label,
        dim=spec.model.embedding_dim,
        memory=list(spec.model.memory_tower),
        adapt=list(spec.model.adapt_tower),
        lr=spec.training.learning_rate,
        sparse_lr=spec.training.sparse_learning_rate,
    )


def minibatches(steps: list[tuple[str, int]], batch_rows: pa.Table, events: pa.Table) -> list[tuple[str, pa.Table]]:
    """The trainer's minibatch sequence (kind and size of each step) cut from the same rows in order."""
    at = {"batch": 0, "stream": 0}
    source = {"batch": batch_rows, "stream": events}
    out = []
    for kind, n in steps:
        out.append((kind, source[kind].slice(at[kind], n)))
        at[kind] += n
    return out


def bare(job, steps, batch_rows, events, mode: str, tables: str = "fused", share: float = 1.0) -> dict:
    mbs = minibatches(steps[: max(1, int(len(steps) * share))], batch_rows, events)
    gc.collect()
    return bare_torchrec.run(shape(job), mbs, two_towers=mode == "mtrm", tables=tables)


def alone(job, steps, batch_rows, events, mode: str, probe: Probe) -> dict:
    """The trainer's stepper alone on the same minibatches, decoded before the clock starts."""
    ids = job.spec.features.id or "request_id"
    batches = [(kind, to_batch(t, job.spec.features, ids)) for kind, t in minibatches(steps, batch_rows, events)]
    gc.collect()
    cpu, helper = time.thread_time(), probe.helper_cpu_s
    stepper = LocalStepper(job, mode=mode)
    for kind, batch in batches:
        stepper.step(kind, batch)
    used = time.thread_time() - cpu + probe.helper_cpu_s - helper
    return {"thread_cpu_s": used, "rows": sum(b.size for _, b in batches)}


def reader_only(job, events) -> float:
    """The same feeds and priority reader with no training: how fast input can be served."""
    trainer = Trainer(
        job, TrainerOptions(poll_interval=0.0, until_window=LAST), {"realtime": [TableStreamReader(events)]}
    )
    began = time.perf_counter()
    rows = 0
    while True:
        arrived = trainer.fill()
        got = trainer.reader.next_minibatch()
        if got is None:
            if not arrived:
                break
            continue
        to_batch(got[1], job.spec.features)  # decoding into tensors is input work too
        rows += got[1].num_rows
    trainer.inputs.close()
    return rows / (time.perf_counter() - began)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _r(x: float, digits: int = 3) -> float:
    return round(x, digits)


def main() -> None:
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        job, events, batch_rows = setup(Path(tmp))
        probe = Probe()
        threads = compute_threads(job)
        runs: dict[str, list[dict]] = {m: [] for m in MODES}
        bares: dict[str, list[dict]] = {m: [] for m in MODES}
        alones: dict[str, list[dict]] = {m: [] for m in MODES}
        for r in range(ROUNDS):  # interleaved: each round alternates who goes first
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                steps = runs[mode][-1]["steps"] if runs[mode] else None
                if r % 2 == 1 and steps is not None:  # the bare loop first
                    torch.set_num_threads(threads)
                    bares[mode].append(bare(job, steps, batch_rows, events, mode))
                    runs[mode].append(ours(job, events, mode, probe))
                else:
                    runs[mode].append(ours(job, events, mode, probe))
                    torch.set_num_threads(threads)
                    bares[mode].append(bare(job, runs[mode][-1]["steps"], batch_rows, events, mode))
                alones[mode].append(alone(job, runs[mode][-1]["steps"], batch_rows, events, mode, probe))
            loads.append(os.getloadavg()[0])
        torch.set_num_threads(threads)
        backward = {m: bare(job, runs[m][0]["steps"], batch_rows, events, m, "in_backward", 0.25) for m in MODES}
        reader = reader_only(job, events)
    pairs = {
        m: [o["samples_per_s"] / b["samples_per_s"] for o, b in zip(runs[m], bares[m], strict=True)] for m in MODES
    }
    cpu_pairs = {
        m: [
            o["samples_per_thread_cpu_s"] / b["samples_per_thread_cpu_s"]
            for o, b in zip(runs[m], bares[m], strict=True)
        ]
        for m in MODES
    }
    # per row of training-thread (and step helper) CPU: the fastest of each's ROUNDS runs (the machine's noise only adds)
    step_alone = {m: min(a["thread_cpu_s"] / a["rows"] for a in alones[m]) for m in MODES}
    step_bare = {m: min(1.0 / b["samples_per_thread_cpu_s"] for b in bares[m]) for m in MODES}
    step_in = {m: min(o["step_cpu_s"] / o["rows"] for o in runs[m]) for m in MODES}
    cost = [s["samples_per_s"] / m["samples_per_s"] for m, s in zip(runs["mtrm"], runs["single_tower"], strict=True)]
    rate = {m: _median([x["samples_per_s"] for x in runs[m]]) for m in MODES}
    bare_rate = {m: _median([x["samples_per_s"] for x in bares[m]]) for m in MODES}
    waits = {m: [x["input_wait"] for x in runs[m]] for m in MODES}
    result = {
        "bench": "train",
        "ratio": _r(_median(cost)),
        "ratio_meaning": "MTRM time per sample / single_tower time per sample, primus train end to end (aim <= 1.15)",
        "ratio_rounds": [_r(x) for x in cost],
        "ratio_vs_bare_torchrec": _r(_median(pairs["mtrm"])),
        "ratio_vs_bare_torchrec_meaning": "primus train MTRM samples/s / bare TorchRec loop of the same three towers (aim >= 0.85)",
        "ratio_vs_bare_torchrec_pairs": [_r(x) for x in pairs["mtrm"]],
        "ratio_vs_bare_torchrec_single_tower": _r(_median(pairs["single_tower"])),
        "ratio_vs_bare_torchrec_single_tower_pairs": [_r(x) for x in pairs["single_tower"]],
        "ratio_vs_bare_torchrec_thread_cpu": _r(_median(cpu_pairs["mtrm"])),
        "ratio_vs_bare_torchrec_single_tower_thread_cpu": _r(_median(cpu_pairs["single_tower"])),
        "ratio_vs_bare_in_backward": _r(rate["mtrm"] / backward["mtrm"]["samples_per_s"]),
        "ratio_vs_bare_in_backward_single_tower": _r(rate["single_tower"] / backward["single_tower"]["samples_per_s"]),
        "step_alone_vs_bare_thread_cpu": _r(step_bare["mtrm"] / step_alone["mtrm"]),
        "step_alone_vs_bare_thread_cpu_single_tower": _r(step_bare["single_tower"] / step_alone["single_tower"]),
        "step_in_trainer_vs_alone_thread_cpu": _r(step_in["mtrm"] / step_alone["mtrm"]),
        "step_in_trainer_vs_alone_thread_cpu_single_tower": _r(step_in["single_tower"] / step_alone["single_tower"]),
        "input_wait": _r(max(_median(waits["mtrm"]), _median(waits["single_tower"])), 4),
        "input_wait_meaning": "(loop wall - step - checkpoint) / loop wall, the larger of MTRM's and single_tower's "
        "medians (aim <= 0.01)",
        "mtrm_input_wait_runs": [_r(x, 4) for x in waits["mtrm"]],
        "single_tower_input_wait_runs": [_r(x, 4) for x in waits["single_tower"]],
        # the input wait in time: the loop's own work per step beside the step (1% of a step is step_us / 100)
        **{f"{m}_other_us_per_step": round(_median([x["other_us_per_step"] for x in runs[m]])) for m in MODES},
        **{f"{m}_step_us": round(_median([x["step_us"] for x in runs[m]])) for m in MODES},
        "mtrm_samples_per_s": round(rate["mtrm"]),
        "single_tower_samples_per_s": round(rate["single_tower"]),
        "bare_torchrec_samples_per_s": round(bare_rate["mtrm"]),
        "bare_torchrec_single_tower_samples_per_s": round(bare_rate["single_tower"]),
        "bare_in_backward_samples_per_s": round(backward["mtrm"]["samples_per_s"]),
        "bare_in_backward_single_tower_samples_per_s": round(backward["single_tower"]["samples_per_s"]),
        "mtrm_checkpoint_fraction": _r(_median([x["checkpoint_fraction"] for x in runs["mtrm"]])),
        "mtrm_startup_s": _r(_median([x["startup_s"] for x in runs["mtrm"]])),
        "reader_samples_per_s": round(reader),
        "reader_vs_mtrm_consumption": round(reader / rate["mtrm"], 2),
        "rounds": ROUNDS,
        "load_average_1m": [_r(x, 2) for x in loads],
        "rows": runs["mtrm"][0]["rows"],
        "rows_per_window": ROWS,
        "batch_size": job.spec.training.batch_size,
        "threads": threads,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
