"""``primus eval``: replay time as production sees it and score every mode the same way.

Hour by hour: while the stream is at window ``t``, the stream's rows of ``t`` (with their
real-time labels) arrive and batch window ``t - lag`` (complete labels) becomes available.
Each stream window is first scored by the served output of the current model (progressive
validation), against the most complete label known (the clicks joined later, i.e. the batch
label of the same request), and only then handed to the buffers. The buffers are drained
through the trainer's PriorityReader and Stepper (the same code as ``primus train``): every
full minibatch is one step, remainders wait for the next hour.

Modes decide which rows they receive:
- mtrm, single_tower: the stream and the batch; offline: the batch; online: the stream;
- offline_then_online: the batch until ``switch`` (eval start), then the stream, starting
  with the stream rows since the last batch window trained (a catch-up, so no data is lost).
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from primus_lib.paths import window_id
from primus_lib.spec.job import PrimusJob
from primus_lib.timegrid import epoch_ms, parse_utc, window_starts
from primus_lib.train.batch import to_batch
from primus_lib.train.metrics import auc, logloss
from primus_lib.train.model import ModelOptions
from primus_lib.train.priority import Buffer, PriorityReader
from primus_lib.train.replay import batch_window, stream_file
from primus_lib.train.report import Report
from primus_lib.train.steps import Stepper

COMPLETE = "__label_complete"
BASE_MODES = ("mtrm", "single_tower", "offline", "online", "offline_then_online")
_VARIANT = re.compile(r"^([a-z_]+)(?:\[(.*)\])?$")


@dataclass(frozen=True)
class RunConfig:
    """One mode, possibly with ablation overrides: ``mtrm[emb=batch,lr=0.003]``."""

    name: str
    mode: str
    emb: str | None = None
    serve: str | None = None
    lr: float | None = None
    sparse_lr: float | None = None
    residual: bool = False
    aux: str = "logit"
    adapt: list[int] | None = None
    memory: list[int] | None = None
    prio: float | None = None  # stream weight (batch weight 1)

    @classmethod
    def parse(cls, text: str) -> RunConfig:
        match = _VARIANT.match(text.strip())
        if not match or match.group(1) not in BASE_MODES:
            raise ValueError(f"--modes: {text!r}: expected MODE or MODE[key=value,...] with MODE in {BASE_MODES}")
        config = cls(name=text.strip(), mode=match.group(1))
        for item in filter(None, (match.group(2) or "").split(",")):
            key, _, value = item.partition("=")
            conv = {
                "emb": str,
                "serve": str,
                "lr": float,
                "sparse_lr": float,
                "residual": lambda v: v in ("1", "true", "yes"),
                "aux": str,
                "adapt": lambda v: [int(x) for x in v.split("-")],
                "memory": lambda v: [int(x) for x in v.split("-")],
                "prio": float,
            }
            if key not in conv:
                raise ValueError(f"--modes: {text!r}: unknown key {key!r} (known: {sorted(conv)})")
            config = replace(config, **{key: conv[key](value)})
        return config


@dataclass
class BacktestOptions:
    out: Path
    data: Path
    runs: list[RunConfig]
    seeds: list[int]
    start: datetime | None = None
    end: datetime | None = None
    eval_from: datetime | None = None
    threads: int = 1
    data_seeds: bool = False  # regenerate the data per seed (seed s -> data seed s)
    rows_per_hour: int = 3000
    spec_path: Path | None = None
    world: str | None = None  # datagen overrides for --data-seeds

    @classmethod
    def from_cli(cls, args: argparse.Namespace, data: str) -> BacktestOptions:
        names = [m for m in args.modes.split(";" if ";" in args.modes or "[" in args.modes else ",") if m.strip()]
        runs = [RunConfig.parse(m) for m in names]
        runs += [RunConfig.parse(m) for m in args.ablations.split(";") if m.strip()]
        return cls(
            out=Path(args.out),
            data=Path(data),
            runs=runs,
            seeds=[int(s) for s in args.seeds.split(",") if s.strip()],
            start=parse_utc(args.start, "--start") if args.start else None,
            end=parse_utc(args.end, "--end") if args.end else None,
            eval_from=parse_utc(args.eval_from, "--eval-from") if args.eval_from else None,
            threads=args.threads,
            data_seeds=args.data_seeds,
            rows_per_hour=args.rows_per_hour,
            spec_path=Path(args.spec),
            world=args.world,
        )


@dataclass
class Timeline:
    """The decoded data of the whole range, one entry per hour."""

    hours: list[datetime]
    stream: list[pa.Table]  # per hour: stream samples + the complete label
    batch: list[pa.Table]  # per hour: the joined batch window
    lag_hours: int
    eval_from: int  # first scored hour index
    switch: int  # offline_then_online's switch hour index
    load_seconds: float = 0.0


def load_timeline(job: PrimusJob, data: Path, start: datetime, end: datetime, eval_from: datetime | None) -> Timeline:
    began = time.perf_counter()
    batch_spec, stream_spec = job.batch_streams[0], job.stream_streams[0]
    window = job.spec.timer.window_size
    hours = list(window_starts(start, end, window, start))
    batch = [batch_window(job, batch_spec, h) for h in hours]
    label = job.spec.features.label
    keys = (batch_spec.join.keys if batch_spec.join else ["request_id"])[0]
    events = stream_file(job, stream_spec, Path(data) / "stream" / "events.jsonl")
    ts = events.column(job.spec.features.timestamp)
    stream = []
    for h, b in zip(hours, batch, strict=True):
        lo, hi = epoch_ms(h), epoch_ms(h + window)
        part = events.filter(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)))
        complete = b.select([keys, label]).rename_columns([keys, COMPLETE])
        part = part.join(complete, keys=keys, join_type="left outer", use_threads=False)
        part = part.append_column("__fill", pc.fill_null(part.column(COMPLETE), part.column(label))).drop([COMPLETE])
        part = part.rename_columns([*part.column_names[:-1], COMPLETE]).sort_by(job.spec.features.timestamp)
        stream.append(part)
    lag = int(batch_spec.lag / window)
    first = hours.index(eval_from) if eval_from in hours else min(len(hours) - 1, lag + int(timedelta(days=1) / window))
    return Timeline(hours, stream, batch, lag, first, first, time.perf_counter() - began)


@dataclass
class RunResult:
    config: RunConfig
    seed: int
    windows: list[dict] = field(default_factory=list)  # per scored hour: auc/logloss/samples (+ memory_*)
    labels: list[np.ndarray] = field(default_factory=list)
    probs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def run_one(job: PrimusJob, timeline: Timeline, config: RunConfig, seed: int) -> RunResult:
    """One mode, one seed, through the trainer's PriorityReader and Stepper."""
    began = time.perf_counter()
    spec = job.spec
    if config.adapt or config.memory:
        model = spec.model.model_copy(
            update={
                "adapt_tower": config.adapt or spec.model.adapt_tower,
                "memory_tower": config.memory or spec.model.memory_tower,
            }
        )
        job = job.model_copy(update={"spec": spec.model_copy(update={"model": model})})
    stepper = Stepper(
        job,
        mode=config.mode,
        options=ModelOptions(aux=config.aux, adapt_residual=config.residual),
        embedding_updates=config.emb,
        serve=config.serve,
        learning_rate=config.lr,
        sparse_learning_rate=config.sparse_lr,
        seed=seed,
    )
    features = spec.features
    batch_name, stream_name = job.batch_streams[0].name, job.stream_streams[0].name
    weights = dict(spec.training.priority)
    if config.prio is not None:
        weights = {batch_name: 1.0, stream_name: config.prio}
    now = [0.0]
    reader = PriorityReader(
        [
            Buffer(batch_name, "batch", weights.get(batch_name, 1.0), features.timestamp),
            Buffer(stream_name, "stream", weights.get(stream_name, 1.0), features.timestamp),
        ],
        spec.training.batch_size,
        clock=lambda: now[0],
    )
    result = RunResult(config, seed, probs={"served": [], "memory": []}, steps={"batch": 0, "stream": 0})
    two = config.mode == "mtrm"
    uses_batch = config.mode in ("mtrm", "single_tower", "offline", "offline_then_online")
    uses_stream = config.mode in ("mtrm", "single_tower", "online", "offline_then_online")
    lag, switch = timeline.lag_hours, timeline.switch
    for t, hour in enumerate(timeline.hours):
        now[0] = (hour + timedelta(hours=1)).timestamp()
        rows = timeline.stream[t]
        if t >= timeline.eval_from and rows.num_rows:
            batch = to_batch(rows, features)
            served = stepper.predict(batch)
            labels = rows.column(COMPLETE).to_numpy().astype(np.float64)
            entry = {
                "window": window_id(hour),
                "samples": rows.num_rows,
                "auc": auc(labels, served),
                "logloss": logloss(labels, served),
            }
            result.labels.append(labels)
            result.probs["served"].append(served)
            if two:
                memory = stepper.predict(batch, output="adapt" if stepper.serve == "memory" else "memory")
                result.probs["memory"].append(memory)
                entry["other_output_auc"] = auc(labels, memory)
            result.windows.append(entry)
        if config.mode == "offline_then_online":
            if t < switch and t - lag >= 0:
                reader.buffers[batch_name].push(timeline.batch[t - lag])
            if t == switch:
                for back in range(max(0, switch - lag), switch + 1):
                    reader.buffers[stream_name].push(timeline.stream[back].drop([COMPLETE]))
            elif t > switch:
                reader.buffers[stream_name].push(rows.drop([COMPLETE]))
        else:
            if uses_stream:
                reader.buffers[stream_name].push(rows.drop([COMPLETE]))
            if uses_batch and t - lag >= 0:
                reader.buffers[batch_name].push(timeline.batch[t - lag])
        while (chosen := reader.next_minibatch()) is not None:
            buffer, table = chosen
            stepper.step(buffer.kind, to_batch(table, features))
            result.steps[buffer.kind] += 1
    result.seconds = time.perf_counter() - began
    return result


def run_backtest(job: PrimusJob, options: BacktestOptions) -> Report:
    torch.set_num_threads(options.threads)
    start = options.start or job.spec.timer.start
    end = options.end or job.spec.timer.end
    if end is None:
        raise ValueError("the spec's timer is open-ended: give --end")
    options.out.mkdir(parents=True, exist_ok=True)
    report = Report(options.out, [r.name for r in options.runs])
    timelines: dict[int, Timeline] = {}
    for seed in options.seeds:
        data = options.data
        if options.data_seeds:
            from primus_lib.data.datagen import generate, world_config

            data = options.out / "data" / f"seed-{seed}"
            if not (data / "stream" / "events.jsonl").exists():
                config = world_config(options.world)
                generate(data, start, end, rows_per_hour=options.rows_per_hour, seed=seed, config=config)
        key = seed if options.data_seeds else -1
        if key not in timelines:
            timelines.clear()
            timelines[key] = load_timeline(_load(options, job, data), data, start, end, options.eval_from)
        timeline = timelines[key]
        for config in options.runs:
            result = run_one(job, timeline, config, seed)
            report.add(result)
            print(
                f"  {config.name:<40} seed {seed}: auc {report.overall(result)['auc']:.4f} "
                f"logloss {report.overall(result)['logloss']:.4f} steps {result.steps} {result.seconds:.1f}s",
                flush=True,
            )
    report.write(job, start, end, timelines[next(iter(timelines))], options)
    return report


def _load(options: BacktestOptions, job: PrimusJob, data: Path) -> PrimusJob:
    """The spec again with ${PRIMUS_DATA} bound to ``data`` (per-seed data roots)."""
    import os

    from primus_lib.spec import load_job

    if options.spec_path is None:
        return job
    return load_job(options.spec_path, env={**os.environ, "PRIMUS_DATA": str(data)})
