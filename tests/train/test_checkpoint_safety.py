"""Nothing on shared storage is unpickled: a checkpoint whose ``state.pt`` (or DCP ``.metadata``, or
a DCP non-tensor item) carries a pickled call is refused with one line naming the file, and the
call never runs. The payload opens a marker file for writing; each test shows the payload is live
(the old, trusting load creates the marker) after showing the trainer's load does not."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from primus_lib.paths import JobPaths
from primus_lib.spec import load_job
from primus_lib.storage import locate
from primus_lib.train.checkpoint.safe_load import UnsafeCheckpointError
from primus_lib.train.checkpoint.store import load_latest, save_checkpoint
from tests.train.conftest import commit_windows, make_job


class Payload:
    """What an attacker with write access to the bucket plants: unpickling it creates ``marker``
    (``open`` pickles as ``io.open``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _primus() -> list[str]:
    script = Path(sys.executable).parent / "primus"  # the console script, as users run it
    return [str(script)] if script.exists() else [sys.executable, "-m", "primus_lib.cli.main"]


@pytest.mark.integration
def test_primus_train_refuses_a_planted_pickle_in_an_s3_checkpoint_and_runs_nothing(tmp_path, monkeypatch, s3_env):
    bucket = f"primus-{uuid.uuid4().hex[:8]}"
    s3_env.filesystem().create_dir(bucket)
    spec, _ = make_job(tmp_path, monkeypatch, hours=2, lag="1h")
    spec.write_text(spec.read_text() + f'  storage: {{root: "s3://{bucket}/jobs"}}\n')
    job = load_job(spec)
    commit_windows(job, range(1))  # something to train, had the checkpoint been taken
    marker = tmp_path / "payload-ran"
    checkpoints = JobPaths.for_job(job).checkpoints
    # A well-formed commit (checkpoint.json's sizes and sha256 match): whoever writes the bucket can.
    planted = save_checkpoint(checkpoints, 7, {"model": Payload(marker)}, {"mode": "mtrm", "world_size": 1}, {})

    command = [*_primus(), "train", str(spec), "--idle-exit", "5", "--poll-interval", "0.1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert not marker.exists(), "the planted pickle ran in the trainer"
    assert last.startswith("primus train: ") and f"{planted}/state.pt: refused to load" in last, done.stderr[-3000:]
    assert "io.open" in last and "Traceback" not in done.stderr
    # The payload is live: the trusting load of the same bytes runs it.
    torch.load(io.BytesIO((planted / "state.pt").read_bytes()), weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("form", ["torch.save", "raw pickle"])
def test_load_latest_refuses_a_payload_in_a_local_checkpoint(tmp_path, form):
    marker = tmp_path / "payload-ran"
    path = save_checkpoint(tmp_path / "ckpt", 3, {"w": torch.ones(2)}, {"mode": "mtrm"}, {})
    state = {"model": Payload(marker)}
    if form == "torch.save":
        torch.save(state, path / "state.pt")
    else:
        (path / "state.pt").write_bytes(pickle.dumps(state))
    with pytest.raises(ValueError, match=r"state\.pt: \d+ bytes, .*checkpoint\.json records"):
        load_latest(tmp_path / "ckpt")  # swapped under a commit that names other bytes: refused unread
    _recommit(path, "state.pt")  # whoever can write the disk can write a well-formed commit too
    with pytest.raises(UnsafeCheckpointError, match=r"state\.pt: refused to load") as refused:
        load_latest(tmp_path / "ckpt")
    assert str(path / "state.pt") in str(refused.value) and "\n" not in str(refused.value)
    assert not marker.exists()
    with open(path / "state.pt", "rb") as handle:  # the payload is live
        torch.load(handle, weights_only=False) if form == "torch.save" else pickle.load(handle)
    assert marker.exists()


def _recommit(checkpoint, part: str) -> None:
    """Record ``part``'s present size and sha256 in the checkpoint's ``checkpoint.json``."""
    data = (checkpoint / part).read_bytes()
    commit = json.loads((checkpoint / "checkpoint.json").read_text())
    commit["parts"][part] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "checkpoint.json").put_atomic(json.dumps(commit).encode())


def test_a_trainer_state_round_trips_through_the_weights_only_load(tmp_path, monkeypatch):
    """What the trainer checkpoints (towers, Adam and the fused sparse optimizer after a step, the
    completeness counts) is all plain data: the safe load restores it bit for bit."""
    from primus_lib.evaluation.replay import batch_window
    from primus_lib.train.model.batch import to_batch
    from primus_lib.train.model.stepper import LocalStepper
    from tests.train.conftest import START, same_state

    _, job = make_job(tmp_path, monkeypatch, hours=1, lag="1h", rows=80)
    stepper = LocalStepper(job)
    stepper.step("batch", to_batch(batch_window(job, job.stream("history"), START), job.spec.features))
    save_checkpoint(tmp_path / "ckpt", 1, stepper.checkpoint_state(1), {"mode": "mtrm"}, {})
    fresh = LocalStepper(job, seed=5)
    fresh.load_state_dict(load_latest(tmp_path / "ckpt").state)
    ours, theirs = stepper.state_dict(), fresh.state_dict()
    assert same_state(ours["evidence"], theirs["evidence"])
    assert all(torch.equal(v, theirs["model"][k]) for k, v in ours["model"].items())
    assert torch.equal(
        torch.cat([t.flatten() for t in _tensors(ours["optimizers"])]),
        torch.cat([t.flatten() for t in _tensors(theirs["optimizers"])]),
    )


def _tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for k in sorted(tree, key=str) for t in _tensors(tree[k])]
    if isinstance(tree, list | tuple):
        return [t for v in tree for t in _tensors(v)]
    return []


# -- torch.distributed.checkpoint -----------------------------------------------------------------


def _dcp_dir(root: Path, state: dict) -> Path:
    """A real DCP checkpoint (one process) with the ``meta.json`` of a Primus model directory."""
    import torch.distributed.checkpoint as dcp

    directory = root / "model-0000000001-abcdef12"
    dcp.save(state, checkpoint_id=str(directory))
    (directory / "meta.json").write_text(json.dumps({"mode": "mtrm", "world_size": 1, "step": 1}))
    return directory


def test_dcp_metadata_carrying_a_payload_is_refused_and_runs_nothing(tmp_path):
    import torch.distributed.checkpoint as dcp

    from primus_lib.train.checkpoint import safe_dcp
    from primus_lib.train.checkpoint.sharded import load_dcp

    marker = tmp_path / "payload-ran"
    directory = _dcp_dir(tmp_path, {"w": torch.arange(4.0), "lr": {"value": 0.5, "betas": (0.9, 0.99)}})
    loaded = {"w": torch.zeros(4), "lr": {"value": 0.0, "betas": (0.0, 0.0)}}
    safe_dcp.load(loaded, directory)  # DCP's real metadata (dataclasses, dtypes, sizes) passes the allow-list
    assert torch.equal(loaded["w"], torch.arange(4.0)) and loaded["lr"] == {"value": 0.5, "betas": (0.9, 0.99)}

    real = (directory / ".metadata").read_bytes()
    metadata = pickle.loads(real)
    metadata.storage_meta.checkpoint_id = Payload(marker)  # a payload inside otherwise valid metadata
    for planted in (pickle.dumps(metadata), pickle.dumps(Payload(marker))):
        (directory / ".metadata").write_bytes(planted)
        with pytest.raises(UnsafeCheckpointError, match=r"\.metadata: refused to unpickle io\.open") as refused:
            load_dcp(SimpleNamespace(mode="mtrm"), directory)  # refused before the model is touched
        assert str(directory / ".metadata") in str(refused.value) and "\n" not in str(refused.value)
        with pytest.raises(UnsafeCheckpointError, match=r"refused to unpickle io\.open"):
            safe_dcp.load({"w": torch.zeros(4)}, directory)
        assert not marker.exists()
    # DCP's own reader unpickles .metadata: the payload runs there.
    with pytest.raises(BaseException):  # noqa: B017 (after running it, DCP fails on what it got)
        dcp.load({"w": torch.zeros(4)}, checkpoint_id=str(directory))
    assert marker.exists()


def test_a_dcp_item_carrying_a_payload_is_refused_and_runs_nothing(tmp_path):
    import torch.distributed.checkpoint as dcp

    from primus_lib.train.checkpoint import safe_dcp

    marker = tmp_path / "payload-ran"
    directory = _dcp_dir(tmp_path, {"w": torch.arange(4.0), "extra": Payload(marker)})
    assert not marker.exists()
    with pytest.raises(UnsafeCheckpointError, match=r"DCP item extra\): refused to load.*io\.open") as refused:
        safe_dcp.load({"w": torch.zeros(4), "extra": None}, directory)
    assert str(directory) in str(refused.value) and "\n" not in str(refused.value)
    assert not marker.exists()
    dcp.load({"w": torch.zeros(4), "extra": None}, checkpoint_id=str(directory))  # DCP's default planner runs it
    assert marker.exists()


@pytest.mark.integration
def test_a_sharded_model_on_s3_with_a_payload_in_its_metadata_is_refused(tmp_path, s3_env):
    from primus_lib.train.checkpoint.sharded import load_dcp

    bucket = f"primus-{uuid.uuid4().hex[:8]}"
    s3_env.filesystem().create_dir(bucket)
    marker = tmp_path / "payload-ran"
    local = _dcp_dir(tmp_path, {"w": torch.arange(4.0)})
    (local / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    remote = locate(f"s3://{bucket}/jobs/tiny/trainer/checkpoints/sharded/{local.name}")
    files = {}
    for path in sorted(local.iterdir()):
        if path.name != "meta.json":
            (remote / path.name).write_bytes(path.read_bytes())
            files[path.name] = path.stat().st_size
    meta = {**json.loads((local / "meta.json").read_text()), "files": files}
    (remote / "meta.json").put_atomic(json.dumps(meta).encode())
    with pytest.raises(UnsafeCheckpointError) as refused:
        load_dcp(SimpleNamespace(mode="mtrm"), remote)
    assert str(refused.value).startswith(f"{remote}/.metadata: refused to unpickle io.open")
    assert not marker.exists()
