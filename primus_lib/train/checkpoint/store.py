"""Checkpoints: model + optimizer state + data position, committed together atomically.

A checkpoint is a directory ``ckpt-<step>-<nonce>/`` holding ``state.pt`` (torch state),
``position.json`` (queue cursor, stream offsets, per-window statistics) and one
``pending-<stream>.arrow`` per buffer with rows that were read but not yet trained. It is
built under a hidden name and renamed into place; ``LATEST`` (rewritten by rename) names the
committed one. A reader never sees half a checkpoint, and the data position always matches
the model: the rows in the pending files plus everything after the cursor are exactly the
rows the model has not trained on.

On S3 or WebHDFS (``directory`` a ``primus_lib.storage.StorageLocation``) there is no rename and
no mutable pointer: the parts are written into ``ckpt-<step>-<millis>-<nonce>/`` and
``checkpoint.json`` (each part's size and sha256) LAST, in one PUT. ``load_latest`` lists the
directory and takes the newest checkpoint whose ``checkpoint.json`` exists and whose parts
match it; a torn one (a writer killed before its checkpoint.json) is never read, and pruned
once a newer checkpoint is committed. A full disk fails the save with an OSError naming the
file (torch.save is given an open file: on a path it reports only "unexpected pos"); the
staging directory goes, and ``LATEST`` still names the previous checkpoint. ``state.pt`` is read
back with ``weights_only`` (``safe_load.py``): a checkpoint holding code is refused, never run.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import torch

from primus_lib.durable import atomic_write, fsync_path, ipc_bytes, naming, write_ipc
from primus_lib.storage import StorageLocation, locate
from primus_lib.train.checkpoint.safe_load import load_torch

LATEST = "LATEST"
COMMIT = "checkpoint.json"  # the commit point of a checkpoint on remote storage, written last


@dataclass
class Checkpoint:
    path: Path | StorageLocation
    step: int
    state: dict
    position: dict
    pending: dict[str, pa.Table] = field(default_factory=dict)


def save_checkpoint(
    directory: Path | StorageLocation,
    step: int,
    state: dict,
    position: dict,
    pending: dict[str, pa.Table | None],
    keep: int = 2,
) -> Path | StorageLocation:
    directory = locate(directory)
    if isinstance(directory, StorageLocation):
        return _save_remote(directory, step, state, position, pending, keep)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{step:010d}-{uuid.uuid4().hex[:8]}"
    staging = directory / f".{name}.tmp"
    staging.mkdir()
    try:
        with naming(staging / "state.pt"), open(staging / "state.pt", "wb") as handle:
            torch.save(state, handle)
        files = {}
        for stream, table in pending.items():
            if table is not None and table.num_rows:
                files[stream] = f"pending-{stream}.arrow"
                write_ipc(staging / files[stream], table, fsync=False)  # fsynced below with the rest
        with naming(staging / "position.json"):
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


def load_latest(directory: Path | StorageLocation) -> Checkpoint | None:
    directory = locate(directory)
    if isinstance(directory, StorageLocation):
        return _load_remote(directory)
    try:
        name = (directory / LATEST).read_text().strip()
    except FileNotFoundError:
        return None
    path = directory / name
    try:
        position = json.loads((path / "position.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RuntimeError(f"{path}: checkpoint named by {directory / LATEST} is unreadable: {exc}") from None
    state = load_torch(path / "state.pt")
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


def _save_remote(directory: StorageLocation, step: int, state: dict, position: dict,
                 pending: dict[str, pa.Table | None], keep: int) -> StorageLocation:  # fmt: skip
    target = directory / f"ckpt-{step:010d}-{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:6]}"
    buffer = io.BytesIO()
    torch.save(state, buffer)
    parts: dict[str, bytes] = {"state.pt": buffer.getvalue()}
    files = {}
    for stream, table in pending.items():
        if table is not None and table.num_rows:
            files[stream] = f"pending-{stream}.arrow"
            parts[files[stream]] = ipc_bytes(table)
    parts["position.json"] = json.dumps({"step": step, "pending": files, **position}, indent=1).encode()
    for name, data in parts.items():
        (target / name).write_bytes(data)
    commit = {
        "step": step,
        "parts": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in parts.items()},
    }
    (target / COMMIT).put_atomic(json.dumps(commit, indent=1, sort_keys=True).encode())  # the commit point
    _prune_remote(directory, keep)
    return target


def _committed_remote(directory: StorageLocation) -> tuple[list[str], list[str]]:
    """(committed, torn) checkpoint names, oldest first."""
    committed, torn = [], []
    for entry in directory.list():
        if entry.is_dir and entry.name.startswith("ckpt-"):
            (committed if (directory / entry.name / COMMIT).exists() else torn).append(entry.name)
    return committed, torn


def _load_remote(directory: StorageLocation) -> Checkpoint | None:
    committed, _ = _committed_remote(directory)
    for name in reversed(committed):
        path = directory / name
        commit = json.loads((path / COMMIT).read_text())
        parts = {}
        for part, expected in commit["parts"].items():
            data = (path / part).read_bytes()
            if len(data) != expected["size"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
                raise RuntimeError(f"{path / part}: does not match {path / COMMIT} (size or sha256)")
            parts[part] = data
        position = json.loads(parts["position.json"])
        state = load_torch(parts["state.pt"], path / "state.pt")
        pending = {
            s: pa.ipc.open_file(pa.py_buffer(parts[f])).read_all() for s, f in position.get("pending", {}).items()
        }
        return Checkpoint(path, int(position["step"]), state, position, pending)
    return None


def _prune_remote(directory: StorageLocation, keep: int) -> None:
    """Keep the newest ``keep`` committed checkpoints; drop torn ones older than the newest commit
    (their writer is gone: one trainer writes a checkpoint directory)."""
    committed, torn = _committed_remote(directory)
    if not committed:
        return
    stale = committed[: max(0, len(committed) - keep)] + [t for t in torn if t < committed[-1]]
    for name in stale:
        (directory / name).delete()
