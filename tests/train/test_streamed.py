"""Each impression trains once (streamed.py): a streamed row's batch copy trains only what its stream step lacked."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn import functional as F

from primus_lib.train.distributed.data_parallel import per_rank
from primus_lib.train.distributed.group import Group
from primus_lib.train.model import delayed
from primus_lib.train.model.network import TowerInputs
from primus_lib.train.model.objective import Evidence, StepConfig, forward
from primus_lib.train.model.row_keys import row_keys
from primus_lib.train.model.stepper import LocalStepper
from primus_lib.train.model.streamed import StreamedRows
from tests.train.conftest import minibatch


def _row_grads(stepper, kind, batch):
    """d(per-row loss)/d(row's shared embeddings), one row at a time summed: zero rows train nothing; and
    the step's output, its loss the memory tower's alone (MTRM's reread tower trains every copy in full:
    ``test_steps.py``)."""
    model = stepper.model
    x = TowerInputs(*(None if t is None else t.detach() for t in model.features(batch.sparse, batch.dense)))
    x.shared.requires_grad_(True)
    out = forward(model, stepper.config, kind, x, batch.labels, stepper.evidence)
    out.loss.sum().backward()
    if out.reread_logit is not None:
        out.loss = out.loss - F.binary_cross_entropy_with_logits(out.reread_logit, batch.labels, reduction="none")
    return x.shared.grad.abs().sum(dim=1), out


@pytest.mark.parametrize("mode", ["single_tower", "mtrm"])
def test_a_streamed_rows_batch_copy_trains_only_what_the_stream_lacked(tiny, mode):
    """Rows 0-3 streamed with their complete labels (nothing to add), row 4 streamed as a negative and
    clicked late (the copy turns it into a positive), rows 5-7 never streamed (full BCE)."""
    _, job = tiny
    stepper = LocalStepper(job, mode=mode, completeness=1.0)
    ids = [f"r{i}" for i in range(8)]
    complete = [1, 0, 1, 0, 1, 0, 1, 0]
    stepper.step("stream", minibatch(job, ids=ids[:5], labels=[1, 0, 1, 0, 0]))
    batch = minibatch(job, ids=ids, labels=complete, seed=1)
    stepper.evidence.before_step("batch", batch.ids, batch.labels, stepper.group)
    np.testing.assert_array_equal(stepper.evidence.copies.numpy()[:5], [1, 0, 1, 0, 0])
    assert np.isnan(stepper.evidence.copies.numpy()[5:]).all()
    assert stepper.evidence.streamed.labels_by_key() == {}  # taken once: forgotten
    grads, out = _row_grads(stepper, "batch", batch)
    assert torch.all(grads[:4] < 1e-6), "a copy whose label the stream already trained moved the model"
    logit = out.memory_logit.detach()
    assert torch.all(grads[4:] > 1e-3)
    # the late click's copy: BCE(l, 1) - BCE(l, 0), whose gradient in the logit is -1 (pushes it up)
    np.testing.assert_allclose(out.loss[4].item(), (F.softplus(-logit[4]) - F.softplus(logit[4])).item(), rtol=1e-5)
    full = F.binary_cross_entropy_with_logits(logit[5:], batch.labels[5:], reduction="none")
    np.testing.assert_allclose(out.loss[5:].detach().numpy(), full.numpy(), rtol=1e-6)


def test_stream_and_copy_together_train_the_complete_label_once_under_the_delay_correction(tiny):
    """With ``c < 1`` the stream's loss is the delay likelihood; the copy adds the rest, so the pair's
    loss is the complete label's BCE for every combination of labels."""
    _, job = tiny
    c = 0.7
    stepper = LocalStepper(job, mode="single_tower", completeness=c)
    ids, rt, complete = ["a", "b", "c"], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]
    stepper.evidence.streamed.record(ids, torch.tensor(rt))  # a stream step's record of its rows
    batch = minibatch(job, ids=ids, labels=complete)
    stepper.evidence.before_step("batch", batch.ids, batch.labels, stepper.group)
    _, out = _row_grads(stepper, "batch", batch)
    logit = out.memory_logit.detach()
    streamed = delayed.likelihood_loss(logit, torch.tensor(rt), c)
    np.testing.assert_allclose(
        (out.loss.detach() + streamed).numpy(),
        F.binary_cross_entropy_with_logits(logit, torch.tensor(complete), reduction="none").numpy(),
        rtol=1e-5,
    )


def test_modes_that_read_one_kind_and_the_reread_baseline_keep_no_record(tiny):
    _, job = tiny
    for mode in ("online", "offline"):
        config = StepConfig.resolve(job, mode=mode)
        assert not config.once and not config.needs_ids and Evidence(config).streamed is None
    reread = StepConfig.resolve(job, mode="single_tower", reread=True)
    assert not reread.once and not reread.needs_ids
    stepper = LocalStepper(job, mode="single_tower", reread=True)
    stepper.step("stream", minibatch(job, ids=["a"], labels=[0]))
    batch = minibatch(job, ids=["a"], labels=[1])
    stepper.evidence.before_step("batch", batch.ids, batch.labels, stepper.group)
    _, out = _row_grads(stepper, "batch", batch)
    full = F.binary_cross_entropy_with_logits(out.memory_logit.detach(), batch.labels, reduction="none")
    np.testing.assert_allclose(out.loss.detach().numpy(), full.numpy(), rtol=1e-6)
    assert StepConfig.resolve(job, mode="single_tower").needs_ids  # the loop reads ids for the rule


def test_the_record_is_bounded_and_survives_a_checkpoint(tiny):
    record = StreamedRows(capacity=3)
    record.record(["a", "b", "c", "d"], torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert record.take(["x", "y"]).labels is None
    copies = record.take(["a", "b", "c", "d"]).labels  # the oldest went: its copy trains in full
    assert np.isnan(copies[0].item()) and copies[1:].tolist() == [0.0, 1.0, 0.0]
    record.record(["a", "b"], torch.tensor([1.0, 0.0]))
    _, job = tiny
    stepper = LocalStepper(job, mode="mtrm")
    stepper.step("stream", minibatch(job, ids=["a", "b"], labels=[1, 0]))
    buffer = io.BytesIO()  # as a checkpoint does, read back with weights_only
    torch.save(stepper.checkpoint_state(1), buffer)
    buffer.seek(0)
    clone = LocalStepper(job, mode="mtrm", seed=5)
    clone.load_state_dict(torch.load(buffer, weights_only=True))
    assert clone.evidence.streamed.take(["b", "a", "z"]).labels[:2].tolist() == [0.0, 1.0]
    assert isinstance(stepper.state_dict()["evidence"]["streamed"]["keys"], torch.Tensor)  # copied whole
    state = stepper.state_dict()
    nul_separated = torch.frombuffer(bytearray(b"b\0a\0"), dtype=torch.uint8)
    for ids in (["b", "a"], nul_separated):  # the ids themselves: the earlier layouts (a list, then bytes)
        state["evidence"]["streamed"] = {"ids": ids, "labels": [0.0, 1.0]}
        older = LocalStepper(job, mode="mtrm")
        older.load_state_dict(state)
        assert older.evidence.streamed.take(["a", "b"]).labels.tolist() == [1.0, 0.0]
    del state["evidence"]["streamed"]  # a checkpoint written before the rule
    LocalStepper(job, mode="mtrm").load_state_dict(state)


def test_a_data_parallel_checkpoint_restores_each_ranks_records():
    """Rank 0 writes the world's checkpoint: it holds every rank's records (gathered at the save),
    and each rank resumes with its own, read back with weights_only."""
    first, second = StreamedRows(), StreamedRows()
    first.record(["x", "y"], torch.tensor([1.0, 0.0]))
    second.record(["z"], torch.tensor([1.0]))
    buffer = io.BytesIO()
    torch.save(per_rank([{"streamed": first.state_dict()}, {"streamed": second.state_dict()}]), buffer)
    restored = []
    for rank in (0, 1):
        buffer.seek(0)
        record = StreamedRows()
        record.load_state_dict(torch.load(buffer, weights_only=True), rank)
        restored.append(record.labels_by_key())
    x, y, z = row_keys(["x", "y", "z"]).tolist()
    assert restored == [{x: 1.0, y: 0.0}, {z: 1.0}]


def test_ids_are_told_apart_by_every_byte_and_rows_without_one_are_never_found():
    record = StreamedRows()
    ids = ["bad\0id", "bad", "bad\0", "", "ünï", "a" * 40]
    record.record(ids, torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0]))
    assert record.take(ids[::-1]).labels.tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert record.labels_by_key() == {}
    keys = row_keys(pa.array(["a", None]))
    record.record(keys, torch.tensor([1.0, 1.0]))
    assert len(record.table) == 1  # the row without an id trained, unrecorded
    found = record.take(keys).labels.tolist()
    assert found[0] == 1.0 and np.isnan(found[1])


def _rank(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        group, record = Group(), StreamedRows()
        if rank == 0:  # each rank trained some stream rows ...
            record.record(["a", "b"], torch.tensor([1.0, 0.0]))
        else:
            record.record(["c"], torch.tensor([0.0]))
        # ... and gets batch copies the other rank streamed (rank 1 has no rows in the second step)
        takes = [["c", "x"], ["y"]] if rank == 0 else [["a", "b", "z"], None]
        got = [record.take(ids, group).labels for ids in takes]
        result = [None if g is None else [None if np.isnan(v) else v for v in g.tolist()] for g in got]
        Path(out, f"rank{rank}.json").write_text(json.dumps({"got": result, "left": len(record.table)}))
    finally:
        dist.destroy_process_group()


def test_data_parallel_ranks_find_the_copies_another_rank_streamed(tmp_path):
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["got"] == [[0.0, None], None] and r1["got"] == [[1.0, 0.0, None], None]
    assert r0["left"] == r1["left"] == 0  # every streamed row's copy was taken once, where it was recorded


def test_a_restored_record_forgets_its_oldest_rows_first():
    """The checkpoint keeps the rows in table order with their positions; a restore into a smaller
    record keeps the newest."""
    ids = [f"row{i}" for i in range(40)]
    record = StreamedRows(capacity=40)
    record.record(ids, torch.arange(40, dtype=torch.float32))
    smaller = StreamedRows(capacity=5)
    smaller.load_state_dict(record.state_dict())
    assert smaller.take(ids).labels.tolist()[35:] == [35.0, 36.0, 37.0, 38.0, 39.0]
    assert len(smaller.table) == 0
