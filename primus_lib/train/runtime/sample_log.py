"""The trainer's raw sample log: the sample ids each step trained, for exactly-once checks.

``primus train --sample-log PATH`` (``TrainerOptions.sample_log``; ``PATH.rank<r>`` per rank in a
world of ranks) appends one line per record, each with one ``write``:

    run PID resume S              a trainer process started from the checkpoint of step S (0: none)
    step N STREAM ID,ID,... ROWS  step N trained these ROWS ids (``features.id``) of STREAM
    checkpoint S                  the checkpoint of step S is durable (its offsets committed)

The log is raw: a process killed after its checkpoint of step S had logged steps past S, which
its successor (``resume S``) trains again. ``read_sample_log`` splits it by that rule: a step of
a run is *kept* when no later run resumed from a checkpoint before it (it is in the final model
state: exactly once), else *replayed* (trained again by a successor). The raw log is kept plus
replayed: every sample at least once. A record a kill cut short (no ROWS, or fewer ids) is
counted as ``cut``; it can only be a step past the last checkpoint, which a successor redoes.
Ids are written as the id column's strings: an id holding a space or a comma is not readable.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


class SampleLogWriter:
    """Appends the records of one trainer process (nothing when ``path`` is None)."""

    def __init__(self, path: Path | None, rank: int | None = None):
        if path is not None and rank is not None:
            path = path.with_name(f"{path.name}.rank{rank}")
        self.path = path

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def started(self, resumed_at: int) -> None:
        """``run``: on a fresh line, even when the previous process died mid-record."""
        if self.path is None:
            return
        fresh = ""
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as handle:
                handle.seek(-1, os.SEEK_END)
                fresh = "" if handle.read(1) == b"\n" else "\n"
        self._write(self.path, f"{fresh}run {os.getpid()} resume {resumed_at}")

    def step(self, step: int, stream: str, ids: list[str]) -> None:
        if self.path is not None:
            self._write(self.path, f"step {step} {stream} {','.join(ids)} {len(ids)}")

    def checkpoint(self, step: int) -> None:
        if self.path is not None:
            self._write(self.path, f"checkpoint {step}")

    @staticmethod
    def _write(path: Path, line: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


@dataclass
class Run:
    """One trainer process's records."""

    pid: int
    resumed_at: int
    steps: list[tuple[int, str, list[str]]] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    cut: list[int | None] = field(default_factory=list)  # steps whose record a kill cut (None: which)


@dataclass
class SampleLog:
    """A sample log split into what the final model state holds and what was trained again."""

    runs: list[Run]
    kept: Counter  # (stream, id) -> times, over the steps the final checkpoint covers
    replayed: Counter  # (stream, id) -> times, over the steps a successor trained again

    @property
    def raw(self) -> Counter:
        """Every (stream, id) the log records, as often as it was trained."""
        return self.kept + self.replayed

    @property
    def resumed_at(self) -> list[int]:
        return [r.resumed_at for r in self.runs]

    def count(self, produced: Counter) -> Counts:
        """The figures of an exactly-once check against the produced (stream, id) multiset."""
        extra = self.kept - produced
        return Counts(
            produced=sum(produced.values()),
            trained=sum(self.kept.values()),
            lost=sum((produced - self.kept).values()),
            twice=sum(n for key, n in extra.items() if key in produced),
            unknown=sum(n for key, n in extra.items() if key not in produced),
            replayed=sum(self.replayed.values()),
            cut=sum(len(r.cut) for r in self.runs),
        )


@dataclass(frozen=True)
class Counts:
    """Rows, by the counting rule of ``read_sample_log``: ``trained``, ``lost``, ``twice`` and
    ``unknown`` over the kept steps (the final model state); ``replayed`` over the raw log only."""

    produced: int
    trained: int  # rows of the kept steps
    lost: int  # produced rows the kept steps lack
    twice: int  # trainings of a produced id beyond its produced count
    unknown: int  # kept rows whose id nobody produced
    replayed: int  # rows trained again by a successor after a kill (raw log = trained + replayed)
    cut: int  # step records a kill cut short (their rows are a successor's to redo)

    @property
    def exactly_once(self) -> bool:
        return self.lost == self.twice == self.unknown == 0 and self.trained == self.produced

    def __str__(self) -> str:
        return (
            f"{self.produced} produced, {self.trained} trained in the checkpointed model state ({self.lost} lost, "
            f"{self.twice} twice, {self.unknown} unknown); raw step log {self.trained + self.replayed} rows: "
            f"{self.replayed} replayed after a kill, {self.cut} records cut by it"
        )


def read_sample_logs(texts: list[str]) -> SampleLog:
    """Several ranks' logs together (each split by its own runs)."""
    logs = [read_sample_log(text) for text in texts]
    return SampleLog(
        [run for log in logs for run in log.runs],
        sum((log.kept for log in logs), Counter()),
        sum((log.replayed for log in logs), Counter()),
    )


def read_sample_log(text: str) -> SampleLog:
    """Split a log (one rank's) by the checkpoint each later run resumed from."""
    runs = _runs(text)
    kept: Counter = Counter()
    replayed: Counter = Counter()
    for index, run in enumerate(runs):
        later = [r.resumed_at for r in runs[index + 1 :]]
        covered = min(later) if later else None  # steps past it were redone by a successor
        for step, stream, ids in run.steps:
            (kept if covered is None or step <= covered else replayed).update((stream, i) for i in ids)
        if covered is not None and any(s is not None and s <= covered for s in run.cut):
            raise ValueError(f"run {run.pid}: a step at or before checkpoint {covered} was cut short")
    return SampleLog(runs, kept, replayed)


def first_run_pids(paths: list[Path]) -> list[int]:
    """The first trainer process of each rank's log (its ``run PID resume S`` line), where written yet:
    what a fault test kills."""
    return [runs[0].pid for path in paths if path.exists() and (runs := _runs(path.read_text()))]


def _runs(text: str) -> list[Run]:
    runs: list[Run] = []
    for line in text.splitlines():
        parts = line.split(" ")
        if parts[0] == "run" and len(parts) == 4:
            runs.append(Run(int(parts[1]), int(parts[3])))
        elif not runs or not line:
            continue
        elif parts[0] == "checkpoint" and len(parts) == 2 and parts[1].isdigit():
            runs[-1].checkpoints.append(int(parts[1]))
        elif parts[0] == "step" and len(parts) > 1 and parts[1].isdigit():
            ids = parts[3].split(",") if len(parts) > 3 else []
            if len(parts) == 5 and parts[4].isdigit() and int(parts[4]) == len(ids):
                runs[-1].steps.append((int(parts[1]), parts[2], ids))
            else:  # the step number is whole only when a field follows it
                runs[-1].cut.append(int(parts[1]) if len(parts) > 2 else None)
    return runs
