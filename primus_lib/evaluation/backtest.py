"""``primus eval``: replay time as production sees it and score every mode the same way.

Each run is the trainer itself (``loop.Trainer``: its feeds, batch-lag gate, priority rule,
partial-window flush, mode switch, Algorithm 1 steps) in a world that releases the data
hour by hour (``timeline.HourlyWorld``): while the stream is at window ``t``, the stream's
rows of ``t`` (real-time labels) arrive through a replayed stream and batch window
``t - lag`` (complete labels) is committed to the run's training queue. Each stream window is
first scored by the served output of the current model (progressive validation), against
the most complete label known (the batch label of the same request), before anything of it
is trained. What each mode reads is ``modes.py``'s.
"""

from __future__ import annotations

import argparse
import functools
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from primus_lib.data.stream import StreamReader
from primus_lib.data.training_queue import TrainingQueue
from primus_lib.evaluation.report import Report
from primus_lib.evaluation.sources import EvalInputError
from primus_lib.evaluation.timeline import COMPLETE, HourlyWorld, Timeline, WindowStore, load_timeline
from primus_lib.spec.job import PrimusJob
from primus_lib.timegrid import parse_utc
from primus_lib.train.model.modes import MODES
from primus_lib.train.model.objective import StepConfig
from primus_lib.train.model.stepper import LocalStepper
from primus_lib.train.runtime.loop import Trainer
from primus_lib.train.runtime.options import TrainerOptions

__all__ = [
    "BASE_MODES",
    "COMPLETE",
    "BacktestOptions",
    "RunConfig",
    "RunResult",
    "load_timeline",
    "run_backtest",
    "run_one",
]
BASE_MODES = MODES  # kept for callers of the old name
_STORE: WindowStore | None = None  # committed batch windows, shared by runs over the same tables
_VARIANT = re.compile(r"^([a-z_]+)(?:\[(.*)\])?$")


def _flag(value: str) -> bool:
    return value in ("1", "true", "yes")


def _sizes(value: str) -> list[int]:
    return [int(x) for x in value.split("-")]


# key of a variant -> (RunConfig field, parser)
_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {  # Any: each parser returns its own field's type
    "lr": ("lr", float),
    "sparse_lr": ("sparse_lr", float),
    "serve": ("serve", str),
    "corr": ("corr", str),
    "c": ("c", lambda v: v if v == "oracle" else float(v)),
    "adapt": ("adapt", _sizes),
    "memory": ("memory", _sizes),
    "prio": ("prio", float),
    "flush": ("flush", _flag),
    "reread": ("reread", _flag),
}


@dataclass(frozen=True)
class RunConfig:
    """One mode, possibly a variant: ``single_tower[lr=0.01]``, ``mtrm[serve=adapt,corr=none]``."""

    name: str
    mode: str
    lr: float | None = None  # spec.training.learning_rate
    sparse_lr: float | None = None  # spec.training.sparse_learning_rate
    serve: str | None = None  # spec.model.serve (MTRM)
    corr: str | None = None  # spec.model.stream_correction
    c: float | str | None = None  # a known completeness (share of clicks the real-time label sees), or "oracle"
    adapt: list[int] | None = None  # tower sizes
    memory: list[int] | None = None
    prio: float | None = None  # the stream's priority weight (the batch's: 1)
    flush: bool = True  # the trainer's partial-window flush (flush=0: remainders wait for the next window)
    reread: bool | None = None  # batch copies of streamed rows train in full (the paper's single tower)

    @classmethod
    def parse(cls, text: str) -> RunConfig:
        match = _VARIANT.match(text.strip())
        if not match or match.group(1) not in MODES:
            raise ValueError(f"--modes: {text!r}: expected MODE or MODE[key=value,...] with MODE in {MODES}")
        config = cls(name=text.strip(), mode=match.group(1))
        for item in filter(None, (match.group(2) or "").split(",")):
            key, _, value = item.partition("=")
            if key not in _KEYS:
                raise ValueError(f"--modes: {text!r}: unknown key {key!r} (known: {sorted(_KEYS)})")
            field_name, parse = _KEYS[key]
            try:
                config = replace(config, **{field_name: parse(value)})
            except ValueError:
                raise ValueError(f"--modes: {text!r}: {key}={value!r} is not a valid value") from None
        return config

    def step_config(self, job: PrimusJob, timeline: Timeline, seed: int) -> StepConfig:
        """The run's StepConfig: the spec's, with this variant's overrides."""
        known = oracle_completeness(job, timeline) if self.c == "oracle" else self.c
        return StepConfig.resolve(
            job,
            mode=self.mode,
            serve=self.serve,
            correction=self.corr,
            learning_rate=self.lr,
            sparse_learning_rate=self.sparse_lr,
            seed=seed,
            completeness=known,
            reread=self.reread,
        )


@dataclass
class BacktestOptions:
    out: Path
    data: Path | None  # binds ${PRIMUS_DATA} (--data); with --data-seeds the generated data's root
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
    model_seed_offset: int = 0  # the model's seed is the seed plus this (other starts on the same data)
    capacity: int | None = None  # rows the trainer can train per hour (None: all that arrived)
    keep_data: bool = False  # with data_seeds: leave the generated data (~0.3 GB a seed) for another run

    @classmethod
    def from_cli(cls, args: argparse.Namespace, data: str | None) -> BacktestOptions:
        if args.world and not args.data_seeds:
            raise ValueError(f"--world {args.world!r}: expected with --data-seeds (it generates the world's data)")
        names = [m for m in args.modes.split(";" if ";" in args.modes or "[" in args.modes else ",") if m.strip()]
        runs = [RunConfig.parse(m) for m in names]
        runs += [RunConfig.parse(m) for m in args.ablations.split(";") if m.strip()]
        return cls(
            out=Path(args.out),
            data=Path(data) if data else None,
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
            model_seed_offset=_model_seed_offset(args.model_seed_offset),
            capacity=_capacity(args.capacity),
            keep_data=args.keep_data,
        )


@dataclass
class RunResult:
    config: RunConfig
    seed: int
    windows: list[dict] = field(default_factory=list)  # per scored hour: auc/logloss/samples (+ memory_*)
    labels: list[np.ndarray] = field(default_factory=list)
    probs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def run_one(
    job: PrimusJob,
    timeline: Timeline,
    config: RunConfig,
    seed: int,
    store: WindowStore | None = None,
    on_hour: Callable[[datetime, dict | None], None] | None = None,
    model_seed: int | None = None,
    capacity: int | None = None,
) -> RunResult:
    """One mode, one seed: the trainer loop over the timeline's hours; ``on_hour(hour, score or None)``
    after each hour. ``model_seed`` (default ``seed``) draws the model's start; the result keeps ``seed``."""
    began = time.perf_counter()
    job = _configured(job, config)
    stepper = LocalStepper(job, config.step_config(job, timeline, seed if model_seed is None else model_seed))
    global _STORE
    if store is None:
        store = _STORE = _STORE or WindowStore()
    windows = store.directories(job, timeline)
    with tempfile.TemporaryDirectory(prefix="primus-eval-run-") as tmp:
        queue = TrainingQueue(Path(tmp) / "ledger.sqlite")
        world = HourlyWorld(job, timeline, stepper, queue, windows, capacity)
        world.on_hour = on_hour
        options = TrainerOptions(
            mode=config.mode,
            poll_interval=0.0,
            # as a service-mode trainer whose next window comes an hour later: flush at once
            flush_grace=0.0 if config.flush else float("inf"),
            prefetch=False,  # inline reads: the world scores between steps, never during one
            metrics=False,
            switch_at=timeline.hours[timeline.switch],
        )
        readers: dict[str, list[StreamReader]] = {job.stream_streams[0].name: [world.replay]}
        trainer = Trainer(
            job, options, readers, CollectorRegistry(), world.clock, stepper=stepper, coordinator=world, queue=queue
        )
        trainer.run()
    scores = world.scores
    return RunResult(
        config, seed, scores.windows, scores.labels, scores.probs, scores.steps, time.perf_counter() - began
    )


def oracle_completeness(job: PrimusJob, timeline: Timeline) -> float:
    """The share of the complete label's clicks that the stream's real-time label sees, read from the
    whole timeline: what a mode that never sees complete labels (online) cannot estimate itself."""
    label = job.spec.features.label
    seen = total = 0.0
    for rows in timeline.stream:
        complete = rows.column(COMPLETE).to_numpy(zero_copy_only=False)
        realtime = rows.column(label).to_numpy(zero_copy_only=False)
        known = ~np.isnan(complete.astype(np.float64))
        seen += float((realtime[known] * complete[known]).sum())
        total += float(complete[known].sum())
    return min(1.0, seen / total) if total else 1.0


def _configured(job: PrimusJob, config: RunConfig) -> PrimusJob:
    """The job with the run's tower sizes and priority weights."""
    spec = job.spec
    update: dict = {}
    model: dict = {}
    if config.adapt or config.memory:
        model.update(
            adapt_tower=config.adapt or spec.model.adapt_tower, memory_tower=config.memory or spec.model.memory_tower
        )
    if model:  # validated as a spec file's model block would be
        update["model"] = type(spec.model).model_validate({**spec.model.model_dump(), **model})
    if config.prio is not None:
        weights = {job.batch_streams[0].name: 1.0, job.stream_streams[0].name: config.prio}
        update["training"] = spec.training.model_copy(update={"priority": weights})
    return job.model_copy(update={"spec": spec.model_copy(update=update)}) if update else job


class Observer(Protocol):
    """What ``primus eval`` shows while it runs (``primus_lib.cli.eval``)."""

    def phase(self, line: str) -> None: ...  # data generation or loading starts
    def planned(self, hours: int) -> None: ...  # hours per run, once the data is loaded
    def hour(self, run: str, seed: int, hour: datetime, score: dict | None) -> None: ...
    def finished(self, line: str) -> None: ...  # one run's summary


def run_backtest(job: PrimusJob, options: BacktestOptions, observer: Observer | None = None) -> Report:
    torch.set_num_threads(options.threads)
    start = options.start or job.spec.timer.start
    end = options.end or job.spec.timer.end
    if end is None:
        raise EvalInputError("the spec's timer is open-ended: give --end")
    for run in options.runs:  # a run's spec change that cannot hold fails before any data is generated
        try:
            _configured(job, run)
        except ValidationError as exc:
            raise EvalInputError(f"--modes: {run.name}: {exc.errors()[0]['msg']}") from exc
    world = None
    if options.data_seeds:
        from primus_lib.data.datagen import world_config

        try:
            world = world_config(options.world)
        except ValueError as exc:
            raise EvalInputError(str(exc)) from exc
        job = with_world_features(job, world.extra_features, world.extra_cardinality)
    report = Report(options.out, [r.name for r in options.runs])  # --out is made when the report is written
    timelines: dict[int, Timeline] = {}
    for seed in options.seeds:
        data = options.data
        if world is not None:
            from primus_lib.data.datagen import generate

            data = options.out / "data" / f"seed-{seed}"
            if not (data / "stream" / "events.jsonl").exists():
                if observer is not None:
                    observer.phase(f"generating data seed {seed} under {data}")
                generate(data, start, end, rows_per_hour=options.rows_per_hour, seed=seed, config=world)
        key = seed if options.data_seeds else -1
        if key not in timelines:
            timelines.clear()
            if observer is not None:
                observer.phase(f"loading the spec's sources{f' (data seed {seed})' if options.data_seeds else ''}")
            timelines[key] = load_timeline(_load(options, job, data), data, start, end, options.eval_from)
            if observer is not None:
                observer.planned(len(timelines[key].hours))
        timeline = timelines[key]
        for config in options.runs:
            on_hour = None
            if observer is not None:
                on_hour = functools.partial(observer.hour, config.name, seed)
            result = run_one(
                job,
                timeline,
                config,
                seed,
                on_hour=on_hour,
                model_seed=seed + options.model_seed_offset,
                capacity=options.capacity,
            )
            report.add(result)
            line = (
                f"  {config.name:<40} seed {seed}: auc {report.overall(result)['auc']:.4f} "
                f"logloss {report.overall(result)['logloss']:.4f} steps {result.steps} {result.seconds:.1f}s"
            )
            if observer is not None:
                observer.finished(line)
            else:
                print(line, flush=True)
    options.out.mkdir(parents=True, exist_ok=True)
    report.write(job, start, end, timelines[next(iter(timelines))], options)
    if world is not None and not options.keep_data:  # a grid over many worlds would fill the disk
        shutil.rmtree(options.out / "data", ignore_errors=True)
    return report


def with_world_features(job: PrimusJob, names: list[str], buckets: int) -> PrimusJob:
    """The job with a generated world's extra sparse features (``--world`` with ``extra_sparse``)
    added to the spec's, one table of ``buckets`` rows each."""
    features = job.spec.features
    known = {f.name for f in features.sparse}
    extra = [type(features.sparse[0])(name=n, buckets=buckets) for n in names if n not in known]
    if not extra:
        return job
    features = features.model_copy(update={"sparse": [*features.sparse, *extra]})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"features": features})})


def _capacity(value: int | None) -> int | None:
    if value is not None and value <= 0:
        raise ValueError(f"--capacity: {value}: expected rows per hour > 0")
    return value


def _model_seed_offset(value: int) -> int:
    if value < 0:
        raise ValueError(f"--model-seed-offset: {value}: expected a whole number >= 0")
    return value


def _load(options: BacktestOptions, job: PrimusJob, data: Path | None) -> PrimusJob:
    """The spec again with ${PRIMUS_DATA} bound to ``data`` (per-seed data roots; with --data-seeds
    the stream is the generated replay file)."""
    from primus_lib.settings import spec_environment
    from primus_lib.spec import load_job

    if options.spec_path is not None and data is not None:
        loaded = load_job(options.spec_path, env={**spec_environment(), "PRIMUS_DATA": str(data)})
        features = job.spec.features  # a generated world's extra features (with_world_features)
        job = loaded.model_copy(update={"spec": loaded.spec.model_copy(update={"features": features})})
    return _generated_stream(job, data) if options.data_seeds and data is not None else job


def _generated_stream(job: PrimusJob, data: Path) -> PrimusJob:
    """--data-seeds: the stream is the replay file datagen wrote (the spec's topic holds other data)."""
    stream = job.stream_streams[0]
    update = {"kafka": None, "uri": f"file://{data}/stream/events.jsonl", "format": "jsonl"}
    sources = [stream.sources[0].model_copy(update=update)]
    streams = [s.model_copy(update={"sources": sources}) if s is stream else s for s in job.spec.dataset.streams]
    dataset = job.spec.dataset.model_copy(update={"streams": streams})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"dataset": dataset})})
