"""Atomic checkpoints of a DMP-sharded model (``sharded.py``) with torch.distributed.checkpoint,
committed by the store's one protocol (``primus_lib.storage.commit``) on every backend.

Every rank lets DCP write into a private staging directory (``StorageLocation.staging``: beside
the model directory on the local disk, a temporary one otherwise) and puts its own files
(``__<rank>_*.distcp``, rank 0 also ``.metadata`` and the towers' optimizers) into the model
directory, durable; once every rank reported its files, rank 0 writes ``meta.json`` LAST,
naming each file and its size: the model directory's commit point, as ``checkpoint.json`` is the
trainer checkpoint's, which is written after it and names it. A reader checks the sizes and loads
from a local copy (the directory itself on the local disk). Model directories no committed trainer
checkpoint names are pruned (a writer killed before its meta.json included). Loading runs nothing
from the checkpoint: DCP's pickled ``.metadata`` goes through an allow-list and every torch file
through ``weights_only`` (``safe_dcp.py``, ``safe_load.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from primus_lib.storage import Parts, StorageLocation, Where, locate
from primus_lib.train.checkpoint.safe_load import load_torch
from primus_lib.train.checkpoint.store import committed_checkpoints

DENSE_OPTIMIZERS = "dense_optimizers.pt"
META = "meta.json"  # a model directory's manifest, written last
MODELS = "sharded"  # under the trainer's checkpoints directory: one DCP directory per checkpoint


def dcp_state(dmp) -> dict:
    """What DCP saves and loads: the sharded model and its fused optimizer."""
    return {"model": dmp.state_dict(), "sparse_optimizer": dmp.fused_optimizer.state_dict()}


def save_dcp(stepper, directory: Where, extra: dict | None = None, plan: dict | None = None) -> StorageLocation:
    """Write ``stepper``'s sharded model to ``directory`` atomically (collective)."""
    import torch.distributed.checkpoint as dcp

    group, directory = stepper.group, locate(directory)
    parts = Parts(directory)
    with directory.staging() as staging:
        dcp.save(dcp_state(stepper.dmp), checkpoint_id=str(staging))
        if group.rank == 0:
            torch.save(stepper.optimizer.state_dict(), staging / DENSE_OPTIMIZERS)
        try:
            sizes, error = parts.put_files(staging), None
        except Exception as exc:  # every rank must learn it
            sizes, error = {}, f"rank {group.rank}: {type(exc).__name__}: {exc}"
    reports = group.gather((sizes, error))
    failure = None
    if group.rank == 0:
        try:
            _commit(parts, _meta(stepper, extra, plan), reports or [(sizes, error)])
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
            directory.delete()  # uncommitted: no meta.json names it, nothing reads it
    failure = group.broadcast(failure)
    if failure:
        raise RuntimeError(f"sharded checkpoint {directory} failed: {failure}")
    return directory


def _meta(stepper, extra: dict | None, plan: dict | None) -> dict:
    return {"world_size": stepper.group.size, "mode": stepper.mode, "plan": plan or {}, **(extra or {})}


def _commit(parts: Parts, meta: dict, reports: list[tuple[dict[str, int], str | None]]) -> None:
    """``meta.json`` naming every rank's files with their sizes, last."""
    errors = [e for _, e in reports if e]
    if errors:
        raise RuntimeError("; ".join(errors))
    if (parts.directory / META).exists():
        raise FileExistsError(f"checkpoint directory {parts.directory} already exists")
    files = {name: size for sizes, _ in reports for name, size in sizes.items()}
    parts.commit(META, json.dumps({**meta, "files": files}, indent=1, sort_keys=True).encode())


def load_dcp(stepper, directory: Where) -> dict:
    """Load a ``save_dcp`` directory into ``stepper``'s (freshly built) sharded model (collective);
    the files meta.json names are checked for their sizes (a directory committed before meta.json
    named its files holds them all)."""
    directory = locate(directory)
    try:
        meta = json.loads((directory / META).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{directory}: not a sharded checkpoint (no meta.json)") from None
    with directory.local_copy(meta.get("files"), directory / META) as local:
        return _load_local(stepper, local, meta, str(directory))


def _load_local(stepper, directory: Path, meta: dict, shown: str) -> dict:
    from primus_lib.train.checkpoint import safe_dcp

    if meta.get("mode") != stepper.mode:
        raise ValueError(f"{shown}/{META}: checkpoint of mode {meta.get('mode')!r}, this trainer runs {stepper.mode!r}")
    # refused before use
    metadata = safe_dcp.read_metadata(directory / safe_dcp.METADATA, f"{shown}/{safe_dcp.METADATA}")
    _check_layout(metadata, shown)
    state = dcp_state(stepper.dmp)
    safe_dcp.load(state, directory, shown)
    stepper.dmp.load_state_dict(state["model"])
    stepper.dmp.fused_optimizer.load_state_dict(state["sparse_optimizer"])
    dense = load_torch(directory / DENSE_OPTIMIZERS, f"{shown}/{DENSE_OPTIMIZERS}")
    stepper.optimizer.load_state_dict(dense)
    return meta


def _check_layout(metadata, shown: str) -> None:
    """A model saved while MTRM's fresh and reread tables were collections of their own (before
    2026-12-07) holds them under names this model no longer has: refused in one line, not by DCP."""
    from primus_lib.train.model.network import LEGACY

    old = sorted(k for k in metadata.state_dict_metadata if k.startswith(tuple(f"model.{m}" for m in LEGACY.values())))
    if old:
        raise ValueError(
            f"{shown}: a sharded MTRM model saved before its tables were one collection ({old[0]}, ...): "
            "resume it with the Primus that wrote it, or start the job afresh"
        )


def prune_models(root: Where) -> None:
    """Delete the model directories under ``root/sharded`` that no committed checkpoint names
    (those of a writer killed before its commit included)."""
    root = locate(root)
    named = set()
    committed, _ = committed_checkpoints(root)
    for name in committed:
        state_file = root / name / "state.pt"
        try:
            state = load_torch(state_file.read_bytes(), state_file)
        except FileNotFoundError:
            continue  # pruned meanwhile: it names nothing to keep
        except (OSError, RuntimeError):
            return  # cannot tell what it names: delete nothing
        if isinstance(state, dict) and "sharded_model" in state:
            named.add(state["sharded_model"].rsplit("/", 1)[-1])
    for entry in (root / MODELS).list():
        if entry.name not in named:
            (root / MODELS / entry.name).delete()
