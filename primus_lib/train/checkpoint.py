"""Checkpoints: model + optimizer state + data position, committed together atomically.

A checkpoint is a directory ``ckpt-<step>-<nonce>/`` holding ``state.pt`` (torch state),
``position.json`` (queue cursor, stream offsets, per-window statistics) and one
``pending-<stream>.arrow`` per buffer with rows that were read but not yet trained. It is
built under a hidden name and renamed into place; ``LATEST`` (rewritten by rename) names the
committed one. A reader never sees half a checkpoint, and the data position always matches
the model: the rows in the pending files plus everything after the cursor are exactly the
rows the model has not trained on.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import torch

from primus_lib.durable import atomic_write, fsync_path, write_ipc

LATEST = "LATEST"


@dataclass
class Checkpoint:
    path: Path
    step: int
    state: dict
    position: dict
    pending: dict[str, pa.Table] = field(default_factory=dict)


def save_checkpoint(
    directory: Path, step: int, state: dict, position: dict, pending: dict[str, pa.Table | None], keep: int = 2
) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{step:010d}-{uuid.uuid4().hex[:8]}"
    staging = directory / f".{name}.tmp"
    staging.mkdir()
    try:
        torch.save(state, staging / "state.pt")
        files = {}
        for stream, table in pending.items():
            if table is not None and table.num_rows:
                files[stream] = f"pending-{stream}.arrow"
                write_ipc(staging / files[stream], table, fsync=False)  # fsynced below with the rest
        (staging / "position.json").write_text(json.dumps({"step": step, "pending": files, **position}, indent=1))
        for child in staging.iterdir():
            fsync_path(child)
        fsync_path(staging)  # its entries, before the rename publishes them
        os.rename(staging, directory / name)
        fsync_path(directory)
        atomic_write(directory / LATEST, name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _prune(directory, keep)
    return directory / name


def load_latest(directory: Path) -> Checkpoint | None:
    directory = Path(directory)
    try:
        name = (directory / LATEST).read_text().strip()
    except FileNotFoundError:
        return None
    path = directory / name
    try:
        position = json.loads((path / "position.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RuntimeError(f"{path}: checkpoint named by {directory / LATEST} is unreadable: {exc}") from None
    state = torch.load(path / "state.pt", weights_only=False)
    pending = {}
    for stream, file in position.get("pending", {}).items():
        with pa.memory_map(str(path / file)) as source:
            pending[stream] = pa.ipc.open_file(source).read_all()
    return Checkpoint(path, int(position["step"]), state, position, pending)


def check_checkpoint(path: Path, pos: dict, mode: str, world_size: int) -> None:
    """A checkpoint resumes only the same mode and the same number of ranks (each rank's cursors
    follow its share of the data)."""
    if pos.get("mode") != mode:
        raise RuntimeError(f"{path}: checkpoint of mode {pos.get('mode')!r}, trainer runs {mode!r}")
    written = int(pos.get("world_size", 1))
    if written != world_size:
        raise RuntimeError(
            f"{path}: checkpoint written by {written} rank(s), this trainer runs {world_size}: "
            "resume with the same --nnodes x --nproc-per-node (or start from a fresh PRIMUS_HOME)"
        )


def _prune(directory: Path, keep: int) -> None:
    latest = (directory / LATEST).read_text().strip()
    committed = sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith("ckpt-"))
    stale = [p for p in committed if p.name != latest][: max(0, len(committed) - keep)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    for path in directory.iterdir():  # staging dirs of a killed writer
        if path.name.startswith(".ckpt-") and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
