"""Atomic checkpoints of a DMP-sharded model (``sharded.py``) with torch.distributed.checkpoint.

Every rank writes its shards into ``.<name>.tmp-<nonce>``; after a barrier rank 0 adds the
towers' Adam states (identical on every rank) and ``meta.json``, fsyncs and renames the
directory; a second barrier lets no rank go on before it is visible. A reader sees all of it
or none. Model directories no committed trainer checkpoint names are pruned.

On S3 or WebHDFS (a ``primus_lib.storage.StorageLocation``; s3fs, which DCP's FsspecWriter
would need, is not a dependency) each rank lets DCP write into a private local staging
directory and uploads its own files (``__<rank>_*.distcp``, rank 0 also ``.metadata`` and the
towers' optimizers) into the model directory; once every rank reported its files, rank 0
writes ``meta.json`` LAST (one PUT, naming each file and its size): the model directory's
commit point, as ``checkpoint.json`` is the trainer checkpoint's, which is written after it
and names it. A reader downloads the files meta.json names (sizes checked) and loads locally.
Loading runs nothing from the checkpoint: DCP's pickled ``.metadata`` goes through an allow-list
and every torch file through ``weights_only`` (``safe_dcp.py``, ``safe_load.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from primus_lib.durable import fsync_path
from primus_lib.storage import StorageLocation, locate
from primus_lib.train.checkpoint.safe_load import load_torch

DENSE_OPTIMIZERS = "dense_optimizers.pt"
MODELS = "sharded"  # under the trainer's checkpoints directory: one DCP directory per checkpoint


def dcp_state(dmp) -> dict:
    """What DCP saves and loads: the sharded model and its fused optimizer."""
    return {"model": dmp.state_dict(), "sparse_optimizer": dmp.fused_optimizer.state_dict()}


def save_dcp(stepper, directory: Path | StorageLocation, extra: dict | None = None,
             plan: dict | None = None) -> Path | StorageLocation:  # fmt: skip
    """Write ``stepper``'s sharded model to ``directory`` atomically (collective)."""
    import torch.distributed.checkpoint as dcp

    group = stepper.group
    directory = locate(directory)
    if isinstance(directory, StorageLocation):
        return _save_remote(stepper, directory, _meta(stepper, extra, plan))
    nonce = group.broadcast(uuid.uuid4().hex[:8])
    tmp = directory.parent / f".{directory.name}.tmp-{nonce}"
    if group.rank == 0:
        tmp.mkdir(parents=True, exist_ok=False)
    dist.barrier()
    dcp.save(dcp_state(stepper.dmp), checkpoint_id=str(tmp))
    dist.barrier()
    error = None
    if group.rank == 0:
        try:
            dense = {name: opt.state_dict() for name, opt in stepper.optimizers.items()}
            torch.save(dense, tmp / DENSE_OPTIMIZERS)
            (tmp / "meta.json").write_text(json.dumps(_meta(stepper, extra, plan), indent=1, sort_keys=True))
            _fsync_tree(tmp)
            if directory.exists():
                raise FileExistsError(f"checkpoint directory {directory} already exists")
            os.rename(tmp, directory)
            fsync_path(directory.parent)
        except Exception as exc:  # every rank must learn it
            error = f"{type(exc).__name__}: {exc}"
            shutil.rmtree(tmp, ignore_errors=True)
    error = group.broadcast(error)
    if error:
        raise RuntimeError(f"sharded checkpoint {directory} failed on rank 0: {error}")
    return directory


def _meta(stepper, extra: dict | None, plan: dict | None) -> dict:
    return {"world_size": stepper.group.size, "mode": stepper.mode, "plan": plan or {}, **(extra or {})}


def _save_remote(stepper, directory: StorageLocation, meta: dict) -> StorageLocation:
    """DCP into a private local staging dir per rank, each rank uploads its files, rank 0 commits
    ``meta.json`` (naming every file with its size) last (collective)."""
    import torch.distributed.checkpoint as dcp

    group = stepper.group
    with tempfile.TemporaryDirectory(prefix="primus-dcp-") as staging:
        dcp.save(dcp_state(stepper.dmp), checkpoint_id=staging)
        if group.rank == 0:
            torch.save({name: opt.state_dict() for name, opt in stepper.optimizers.items()},
                       Path(staging) / DENSE_OPTIMIZERS)  # fmt: skip
        try:
            sizes, error = _upload(Path(staging), directory), None
        except Exception as exc:  # every rank must learn it
            sizes, error = {}, f"rank {group.rank}: {type(exc).__name__}: {exc}"
    reports = group.gather((sizes, error))
    failure = None
    if group.rank == 0:
        errors = [e for _, e in reports or [(sizes, error)] if e]
        files = {name: size for part, _ in reports or [(sizes, error)] for name, size in part.items()}
        try:
            if errors:
                raise RuntimeError("; ".join(errors))
            if (directory / "meta.json").exists():
                raise FileExistsError(f"checkpoint directory {directory} already exists")
            (directory / "meta.json").put_atomic(
                json.dumps({**meta, "files": files}, indent=1, sort_keys=True).encode()
            )
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
            directory.delete()  # uncommitted: no meta.json names it, nothing reads it
    failure = group.broadcast(failure)
    if failure:
        raise RuntimeError(f"sharded checkpoint {directory} failed: {failure}")
    return directory


def _upload(staging: Path, directory: StorageLocation) -> dict[str, int]:
    """Put every file of this rank's staging dir under ``directory``; returns name -> size."""
    sizes = {}
    for path in sorted(staging.rglob("*")):
        if path.is_file():
            name = path.relative_to(staging).as_posix()
            data = path.read_bytes()
            (directory / name).write_bytes(data)
            sizes[name] = len(data)
    return sizes


def load_dcp(stepper, directory: Path | StorageLocation) -> dict:
    """Load a ``save_dcp`` directory into ``stepper``'s (freshly built) sharded model (collective)."""
    directory = locate(directory)
    if isinstance(directory, StorageLocation):
        return _load_remote(stepper, directory)
    return _load_local(stepper, directory)


def _load_remote(stepper, directory: StorageLocation) -> dict:
    """Download the files ``meta.json`` names (their sizes checked) to a private dir, load from there."""
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{directory}: not a sharded checkpoint (no meta.json)") from None
    with tempfile.TemporaryDirectory(prefix="primus-dcp-") as staging:
        for name, size in meta.get("files", {}).items():
            data = (directory / name).read_bytes()
            if len(data) != size:
                raise ValueError(f"{directory / name}: {len(data)} bytes, {directory / 'meta.json'} records {size}")
            target = Path(staging) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        (Path(staging) / "meta.json").write_text(json.dumps(meta))
        return _load_local(stepper, Path(staging), shown=str(directory))


def _load_local(stepper, directory: Path, shown: str | None = None) -> dict:
    from primus_lib.train.checkpoint import safe_dcp

    directory = Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{directory}: not a sharded checkpoint (no meta.json)")
    meta = json.loads(meta_path.read_text())
    if meta.get("mode") != stepper.mode:
        where = f"{shown}/meta.json" if shown else meta_path
        raise ValueError(f"{where}: checkpoint of mode {meta.get('mode')!r}, this trainer runs {stepper.mode!r}")
    metadata = f"{shown}/{safe_dcp.METADATA}" if shown else None
    safe_dcp.read_metadata(directory / safe_dcp.METADATA, metadata)  # refused before the model is touched
    state = dcp_state(stepper.dmp)
    safe_dcp.load(state, directory, shown)
    stepper.dmp.load_state_dict(state["model"])
    stepper.dmp.fused_optimizer.load_state_dict(state["sparse_optimizer"])
    dense = load_torch(directory / DENSE_OPTIMIZERS, f"{shown}/{DENSE_OPTIMIZERS}" if shown else None)
    for name, opt in stepper.optimizers.items():
        opt.load_state_dict(dense[name])
    return meta


def prune_models(root: Path | StorageLocation) -> None:
    """Delete model directories under ``root/sharded`` that no committed checkpoint names, and staging leftovers."""
    root = locate(root)
    if isinstance(root, StorageLocation):
        _prune_remote(root)
        return
    models = Path(root) / MODELS
    if not models.is_dir():
        return
    named = set()
    for ckpt in Path(root).glob("ckpt-*"):
        try:
            state = load_torch(ckpt / "state.pt")
        except (OSError, RuntimeError):
            return  # cannot tell what it names: delete nothing
        if isinstance(state, dict) and "sharded_model" in state:
            named.add(Path(state["sharded_model"]).name)
    for path in models.iterdir():
        if path.is_dir() and path.name not in named:
            shutil.rmtree(path, ignore_errors=True)


def _prune_remote(root: StorageLocation) -> None:
    """As ``prune_models``: a model directory without meta.json (a writer killed before its
    commit) is named by no checkpoint either, so it goes too."""
    named = set()
    for entry in root.list():
        if not (entry.is_dir and entry.name.startswith("ckpt-")):
            continue
        try:
            state = load_torch((root / entry.name / "state.pt").read_bytes(), root / entry.name / "state.pt")
        except FileNotFoundError:
            continue  # a torn trainer checkpoint without its state names nothing readable
        except (OSError, RuntimeError):
            return  # cannot tell what it names: delete nothing
        if isinstance(state, dict) and "sharded_model" in state:
            named.add(Path(state["sharded_model"]).name)
    for entry in (root / MODELS).list():
        if entry.is_dir and entry.name not in named:
            (root / MODELS / entry.name).delete()


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root``, then ``root`` itself."""
    for path in root.rglob("*"):
        fsync_path(path)
    fsync_path(root)
