"""Checkpoints: model + optimizer state + data position, committed together atomically.

A checkpoint is a directory ``ckpt-<step>-<millis>-<nonce>/`` holding ``state.pt`` (torch state),
``position.json`` (queue cursor, stream offsets, per-window statistics) and one
``pending-<stream>.arrow`` per buffer with rows that were read but not yet trained, then
``checkpoint.json`` (each part's size and sha256) LAST: the store's one commit protocol
(``primus_lib.storage.commit``), the same on the local disk, S3 and HDFS. There is no mutable
pointer: ``load_latest`` lists the directory and takes the newest checkpoint whose
``checkpoint.json`` exists, and reads each part checked against it. A reader never sees half a
checkpoint, and the data position always matches the model: the rows in the pending files plus
everything after the cursor are exactly the rows the model has not trained on.

Recovery: a checkpoint without ``checkpoint.json`` (a writer killed or failed before it) is never
read; the trainer is the one writer, so the next commit prunes every such directory that sorts
below it, with the committed ones past the newest ``keep``. A full disk fails the save with an
OSError naming the file (torch.save is given an open file: on a path it reports only "unexpected
pos"); the failed checkpoint's parts go, and the previous checkpoint stays the latest. A job's
checkpoints written before this protocol (a directory renamed into place and named by a ``LATEST``
file) are read while no checkpoint.json is committed beside them. ``state.pt`` is read back with
``weights_only`` (``safe_load.py``): a checkpoint holding code is refused, never run.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, cast

import pyarrow as pa
import torch

from primus_lib.durable import write_ipc
from primus_lib.storage import Part, Parts, StorageLocation, Where, locate, read_part
from primus_lib.train.checkpoint.safe_load import load_torch

COMMIT = "checkpoint.json"  # a checkpoint's manifest, written last
LATEST = "LATEST"  # the pointer of the layout before checkpoint.json (read only)


@dataclass
class Checkpoint:
    path: StorageLocation
    step: int
    state: dict
    position: dict
    pending: dict[str, pa.Table] = field(default_factory=dict)


def save_checkpoint(
    directory: Where,
    step: int,
    state: dict,
    position: dict,
    pending: dict[str, pa.Table | None],
    keep: int = 2,
) -> StorageLocation:
    directory = locate(directory)
    target = directory / f"ckpt-{step:010d}-{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:6]}"
    with Parts(target) as parts:
        written = []
        with parts.writer("state.pt") as out:
            torch.save(state, cast(IO[bytes], out))  # torch's FileLike names IO[bytes]; it only calls write/flush
        written.append(Part("state.pt", out.size, out.digest.hexdigest()))
        files = {}
        for stream, table in pending.items():
            if table is not None and table.num_rows:
                files[stream] = f"pending-{stream}.arrow"
                with parts.writer(files[stream]) as out:
                    write_ipc(out, table)
                written.append(Part(files[stream], out.size, out.digest.hexdigest()))
        document = json.dumps({"step": step, "pending": files, **position}, indent=1).encode()
        written.append(parts.put("position.json", document))
        commit = {"step": step, "parts": {p.name: {"size": p.size, "sha256": p.sha256} for p in written}}
        parts.commit(COMMIT, json.dumps(commit, indent=1, sort_keys=True).encode())  # the commit point
    _prune(directory, keep)
    return target


def load_latest(directory: Where) -> Checkpoint | None:
    """The newest committed checkpoint under ``directory``, None before the first."""
    directory = locate(directory)
    committed, _ = committed_checkpoints(directory)
    if not committed:
        return _load_pointed(directory)
    path = directory / committed[-1]
    commit = json.loads((path / COMMIT).read_text())
    parts = {
        name: read_part(path, Part(name, expected["size"], expected["sha256"]), COMMIT)
        for name, expected in commit["parts"].items()
    }
    position = json.loads(parts["position.json"].to_pybytes())
    state = load_torch(parts["state.pt"].to_pybytes(), path / "state.pt")
    pending = {s: pa.ipc.open_file(parts[f]).read_all() for s, f in position.get("pending", {}).items()}
    return Checkpoint(path, int(position["step"]), state, position, pending)


def committed_checkpoints(directory: StorageLocation) -> tuple[list[str], list[str]]:
    """(committed, uncommitted) checkpoint names under ``directory``, oldest first; the one a
    ``LATEST`` of the previous layout names counts as committed while no checkpoint.json is."""
    committed: list[str] = []
    torn: list[str] = []
    for entry in directory.list():
        if entry.is_dir and entry.name.startswith(("ckpt-", ".ckpt-")):
            (committed if (directory / entry.name / COMMIT).exists() else torn).append(entry.name)
    if not committed:
        pointed = _pointed(directory)
        if pointed is not None and pointed in torn:
            torn.remove(pointed)
            committed.append(pointed)
    return committed, torn


def _pointed(directory: StorageLocation) -> str | None:
    try:
        return (directory / LATEST).read_text().strip()
    except FileNotFoundError:
        return None


def _load_pointed(directory: StorageLocation) -> Checkpoint | None:
    """The checkpoint ``LATEST`` names (the layout before checkpoint.json), None without one."""
    name = _pointed(directory)
    if name is None:
        return None
    path = directory / name
    try:
        position = json.loads((path / "position.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RuntimeError(f"{path}: checkpoint named by {directory / LATEST} is unreadable: {exc}") from None
    state = load_torch((path / "state.pt").read_bytes(), path / "state.pt")
    pending = {s: pa.ipc.open_file((path / f).read_buffer()).read_all() for s, f in position.get("pending", {}).items()}
    return Checkpoint(path, int(position["step"]), state, position, pending)


def check_checkpoint(path: StorageLocation, pos: dict, mode: str, world_size: int) -> None:
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


def _prune(directory: StorageLocation, keep: int) -> None:
    """Keep the newest ``keep`` committed checkpoints; drop uncommitted ones that sort below the
    newest commit (their writer is gone: one trainer writes checkpoints) and a stale ``LATEST``."""
    committed, torn = committed_checkpoints(directory)
    if not committed or not (directory / committed[-1] / COMMIT).exists():
        return
    stale = committed[: max(0, len(committed) - keep)] + [t for t in torn if t < committed[-1]]
    for name in stale:
        (directory / name).delete()
    (directory / LATEST).delete()
