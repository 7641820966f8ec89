"""Atomic checkpoints of a DMP-sharded model (``sharded.py``) with torch.distributed.checkpoint.

Every rank writes its shards into ``.<name>.tmp-<nonce>``; after a barrier rank 0 adds the
towers' Adam states (identical on every rank) and ``meta.json``, fsyncs and renames the
directory; a second barrier lets no rank go on before it is visible. A reader sees all of it
or none. Model directories no committed trainer checkpoint names are pruned.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from primus_lib.durable import fsync_path

DENSE_OPTIMIZERS = "dense_optimizers.pt"
MODELS = "sharded"  # under the trainer's checkpoints directory: one DCP directory per checkpoint


def dcp_state(dmp) -> dict:
    """What DCP saves and loads: the sharded model and its fused optimizer."""
    return {"model": dmp.state_dict(), "sparse_optimizer": dmp.fused_optimizer.state_dict()}


def save_dcp(stepper, directory: Path, extra: dict | None = None, plan: dict | None = None) -> Path:
    """Write ``stepper``'s sharded model to ``directory`` atomically (collective)."""
    import torch.distributed.checkpoint as dcp

    group = stepper.group
    directory = Path(directory)
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
            meta = {"world_size": group.size, "mode": stepper.mode, "plan": plan or {}, **(extra or {})}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
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


def load_dcp(stepper, directory: Path) -> dict:
    """Load a ``save_dcp`` directory into ``stepper``'s (freshly built) sharded model (collective)."""
    import torch.distributed.checkpoint as dcp

    directory = Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{directory}: not a sharded checkpoint (no meta.json)")
    meta = json.loads(meta_path.read_text())
    if meta.get("mode") != stepper.mode:
        raise ValueError(f"{meta_path}: checkpoint of mode {meta.get('mode')!r}, this trainer runs {stepper.mode!r}")
    state = dcp_state(stepper.dmp)
    dcp.load(state, checkpoint_id=str(directory))
    stepper.dmp.load_state_dict(state["model"])
    stepper.dmp.fused_optimizer.load_state_dict(state["sparse_optimizer"])
    dense = torch.load(directory / DENSE_OPTIMIZERS, weights_only=False)
    for name, opt in stepper.optimizers.items():
        opt.load_state_dict(dense[name])
    return meta


def prune_models(root: Path) -> None:
    """Delete model directories under ``root/sharded`` that no committed checkpoint names, and staging leftovers."""
    models = Path(root) / MODELS
    if not models.is_dir():
        return
    named = set()
    for ckpt in Path(root).glob("ckpt-*"):
        try:
            state = torch.load(ckpt / "state.pt", weights_only=False)
        except (OSError, RuntimeError):
            return  # cannot tell what it names: delete nothing
        if isinstance(state, dict) and "sharded_model" in state:
            named.add(Path(state["sharded_model"]).name)
    for path in models.iterdir():
        if path.is_dir() and path.name not in named:
            shutil.rmtree(path, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root``, then ``root`` itself."""
    for path in root.rglob("*"):
        fsync_path(path)
    fsync_path(root)
