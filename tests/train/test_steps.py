"""MTRM's step and the baselines' (objective.py, steps.py): what each minibatch kind moves."""

from __future__ import annotations

import io
import threading
import time
import weakref

import numpy as np
import pyarrow as pa
import pytest
import torch

from primus_lib.train.model.batch import to_batch
from primus_lib.train.model.objective import StepConfig, forward
from primus_lib.train.model.stepper import LocalStepper
from primus_lib.train.model.tower_adam import TowerAdam
from primus_lib.train.model.validation import BLENDS
from tests.train.conftest import minibatch as _batch
from tests.train.conftest import same_state


def _snapshot(params):
    return [p.detach().clone() for p in params]


def _equal(before, params):
    return all(torch.equal(a, b.detach()) for a, b in zip(before, params, strict=True))


def _tables(stepper, prefix=""):
    """The weights of the tables named ``prefix``... ("t_": the shared ones, "fresh_", "reread_"; "": all)."""
    tables = stepper.model.embeddings.state_dict()
    return {k: v.clone() for k, v in tables.items() if k.startswith(f"embedding_bags.{prefix}")}


def _moved(before, after):
    return any(not torch.equal(before[k], after[k]) for k in before)


def test_a_batch_step_moves_the_memory_and_reread_towers_and_their_tables_only(tiny):
    _, job = tiny
    stepper = LocalStepper(job, mode="mtrm")
    adapt, memory = _snapshot(stepper.model.adapt_parameters()), _snapshot(stepper.model.memory_parameters())
    reread = _snapshot(stepper.model.reread_parameters())
    tables, fresh, reread_tables = _tables(stepper, "t_"), _tables(stepper, "fresh_"), _tables(stepper, "reread_")
    result = stepper.step("batch", _batch(job))
    assert result.towers == ("memory", "reread")
    assert _equal(adapt, stepper.model.adapt_parameters()), "a batch step changed the adapt tower"
    assert not _equal(memory, stepper.model.memory_parameters()), "a batch step did not train the memory tower"
    assert not _equal(reread, stepper.model.reread_parameters()), "a batch step did not train the reread tower"
    assert _moved(tables, _tables(stepper, "t_")), "a batch step did not move the shared tables"
    assert _moved(reread_tables, _tables(stepper, "reread_")), "a batch step did not move the reread tables"
    assert not _moved(fresh, _tables(stepper, "fresh_")), "a batch step moved the adapt tower's fresh tables"


def test_an_mtrm_stream_step_trains_every_tower_and_the_fresh_tables(tiny):
    _, job = tiny
    stepper = LocalStepper(job, mode="mtrm")
    towers = {t: _snapshot(stepper.model.tower_parameters(t)) for t in ("memory", "adapt", "reread")}
    fresh = _tables(stepper, "fresh_")
    result = stepper.step("stream", _batch(job, seed=2))
    assert result.towers == ("memory", "adapt", "reread")
    assert not any(_equal(before, stepper.model.tower_parameters(t)) for t, before in towers.items())
    assert _moved(fresh, _tables(stepper, "fresh_")), "a stream step did not train the fresh tables"


def test_the_reread_tower_trains_a_streamed_rows_batch_copy_in_full(tiny):
    """The memory tower trains a copy only for what its stream step lacked (zero where the labels agree,
    ``c = 1``); the reread tower trains it again in full, a second epoch."""
    _, job = tiny
    stepper = LocalStepper(job, mode="mtrm", completeness=1.0)
    batch = _batch(job, seed=5)
    stepper.step("stream", batch)
    x = stepper.model.features(batch.sparse, batch.dense, fresh=False)
    stepper.evidence.before_step("batch", batch.keys, batch.labels, stepper.group)
    out = forward(stepper.model, stepper.config, "batch", x, batch.labels, stepper.evidence)
    reread = torch.nn.functional.binary_cross_entropy_with_logits(
        stepper.model.reread_forward(x), batch.labels, reduction="none"
    )
    assert not torch.isnan(stepper.evidence.copies).any()  # every row was streamed
    torch.testing.assert_close(out.loss, reread)  # the memory tower's copy: nothing
    assert out.towers == ("memory", "reread") and float(reread.detach().sum()) > 0


def test_mtrms_memory_tower_and_tables_move_exactly_as_the_single_tower(tiny):
    """The adapt tower reads the shared tables and the memory logit without gradient and the reread tower has
    tables of its own: under one seed, MTRM's memory tower and shared tables are bit-equal to single_tower's
    after any mix of steps."""
    _, job = tiny
    mtrm, single = LocalStepper(job, mode="mtrm", seed=4), LocalStepper(job, mode="single_tower", seed=4)
    for i, kind in enumerate(["stream", "batch", "stream", "stream", "batch", "stream"]):
        batch = _batch(job, seed=10 + i)
        a, b = mtrm.step(kind, batch), single.step(kind, batch)
        assert a.towers == mtrm.config.towers(kind) and b.towers == ("memory",)
    assert _equal(_snapshot(single.model.memory_parameters()), mtrm.model.memory_parameters())
    assert all(torch.equal(v, _tables(mtrm)[k]) for k, v in _tables(single).items())  # the shared tables
    batch = _batch(job, seed=99)
    np.testing.assert_array_equal(mtrm.predict(batch, output="memory"), single.predict(batch))
    for tower in ("adapt", "reread"):  # the other towers add
        assert not np.allclose(mtrm.predict(batch, output=tower), single.predict(batch))


@pytest.mark.parametrize("mode", ["single_tower", "offline", "online", "offline_then_online"])
def test_single_tower_modes_train_one_tower_on_both_kinds(tiny, mode):
    _, job = tiny
    stepper = LocalStepper(job, mode=mode)
    assert stepper.model.adapt_parameters() == stepper.model.reread_parameters() == []
    assert stepper.optimizer.towers == ["memory"]
    assert stepper.step("stream", _batch(job)).towers == stepper.step("batch", _batch(job)).towers == ("memory",)
    for tower in ("adapt", "reread"):
        with pytest.raises(ValueError, match="needs MTRM's towers"):
            stepper.predict(_batch(job), output=tower)
    config = StepConfig.resolve(job, mode=mode)
    with pytest.raises(ValueError, match="minibatch kind"):
        x = torch.zeros(2, stepper.model.memory[0].in_features)
        forward(stepper.model, config, "bogus", x, torch.zeros(2), 1.0)


def test_the_served_outputs(tiny):
    """mean: the mean of the memory and adapt towers' logits; mixture (the default): the validation's weights
    over blends of the towers' logits (before any scored row, the prior's: mostly the mean)."""
    _, job = tiny
    batch = _batch(job)
    stepper = LocalStepper(job, mode="mtrm")
    for kind in ("batch", "stream", "batch"):
        stepper.step(kind, batch)
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    towers = {t: logit(stepper.predict(batch, output=t)) for t in ("memory", "adapt", "reread")}
    mean = stepper.predict(batch, output="mean")
    np.testing.assert_allclose(logit(mean), (towers["memory"] + towers["adapt"]) / 2, rtol=1e-4)
    w = stepper.evidence.validation.weights()
    blend = lambda base, a: 1 / (1 + np.exp(-((1 - a) * towers[base] + a * towers["adapt"])))  # noqa: E731
    served = sum(w[name] * blend(base, a) for name, (base, a) in BLENDS.items())
    np.testing.assert_allclose(stepper.predict(batch), served, rtol=1e-4)
    assert stepper.config.served() == "mixture"
    assert LocalStepper(job, mode="mtrm").evidence.validation.weights()["mean"] > 0.7  # the prior
    adapt_served = LocalStepper(job, mode="mtrm", serve="adapt")
    assert adapt_served.config.served() == "adapt" and LocalStepper(job, mode="online").config.served() == "memory"
    with pytest.raises(ValueError, match="serve: expected one of mixture|mean|adapt|memory|reread"):
        LocalStepper(job, mode="mtrm", serve="blend")


def test_state_round_trip(tiny):
    _, job = tiny
    batch = _batch(job)
    stepper = LocalStepper(job, mode="mtrm")
    for kind in ("batch", "stream", "batch"):
        stepper.step(kind, batch)
    served = stepper.predict(batch)
    clone = LocalStepper(job, mode="mtrm", seed=99)
    buffer = io.BytesIO()  # as a checkpoint does: serialise, then load into a fresh process' model
    torch.save(stepper.checkpoint_state(3), buffer)
    buffer.seek(0)
    clone.load_state_dict(torch.load(buffer, weights_only=True))
    np.testing.assert_array_equal(clone.predict(batch), served)
    assert same_state(clone.evidence.state_dict(), stepper.evidence.state_dict())
    a, b = stepper.step("stream", batch), clone.step("stream", batch)  # optimizer state restored too
    assert a.loss == b.loss
    np.testing.assert_array_equal(clone.predict(batch), stepper.predict(batch))


def test_a_step_after_predict_trains_in_training_mode_and_matches_one_without(tiny):
    _, job = tiny
    batch = _batch(job)
    served, plain = LocalStepper(job, mode="mtrm"), LocalStepper(job, mode="mtrm")
    served.predict(batch)
    assert not any(m.training for m in served.model.modules())  # predict() switched to eval
    a, b = served.step("stream", batch), plain.step("stream", batch)
    assert all(m.training for m in served.model.modules())  # the step switched back, every module
    assert a.loss == b.loss
    np.testing.assert_array_equal(a.probs, b.probs)


def test_row_ids_are_read_only_when_asked_for(tiny):
    _, job = tiny
    assert _batch(job).ids[:2] == ["r0", "r1"]
    table = pa.table(
        {
            "request_id": ["a", "b"],
            "clicked": [1.0, 0.0],
            "ts": [1, 2],
            "user_id": [1, 2],
            "item_id": [3, 4],
            "category": [5, 6],
            "price": [1.0, 2.0],
            "age": [20.0, 30.0],
        }
    )
    assert to_batch(table, job.spec.features).ids is None
    assert to_batch(table, job.spec.features, "request_id").ids == ["a", "b"]


def test_the_towers_fused_adam_agrees_with_torchs_default(tiny):
    """The towers' Adam runs fused (faster); the towers' weights are those of the single-tensor Adam that
    CPU parameters get by default, to float rounding (the tables' row-wise Adagrad divides by the root of
    a row's squared gradients, so a row's first, tiny gradients can differ by far more than the rounding:
    compared on average), and a resumed stepper keeps the fused path."""
    _, job = tiny
    ours, plain = LocalStepper(job, mode="mtrm", seed=5), LocalStepper(job, mode="mtrm", seed=5)
    lr = plain.config.learning_rate
    plain.optimizer = TowerAdam(plain.tower_params, lr, fused=False, foreach=False)
    assert all(g["fused"] for g in ours.optimizer.param_groups)
    for i, kind in enumerate(["stream", "batch", "stream", "stream", "batch"]):
        batch = _batch(job, seed=20 + i)
        ours.step(kind, batch), plain.step(kind, batch)
    for a, b in zip(ours.model.dense_parameters(), plain.model.dense_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(ours.tables, plain.tables, strict=True):
        assert (a - b).abs().mean() < 1e-5 * a.abs().mean()
    resumed = LocalStepper(job, mode="mtrm")
    resumed.load_state_dict(plain.state_dict())  # a checkpoint written unfused
    assert all(g["fused"] and not g["foreach"] for g in resumed.optimizer.param_groups)
    resumed.step("stream", _batch(job, seed=30))  # and it steps


@pytest.mark.parametrize("kind", ["batch", "stream"])
def test_the_hook_before_backward_runs_once_a_step_before_the_gradients(tiny, kind):
    """``before_backward`` (the trainer's prefetch thread works during backward) runs once per step, when
    no gradient is computed yet."""
    _, job = tiny
    stepper = LocalStepper(job, mode="mtrm")
    seen = []
    stepper.before_backward = lambda: seen.append([p.grad for p in stepper.model.memory_parameters()])
    stepper.step(kind, _batch(job))
    assert len(seen) == 1 and all(g is None for g in seen[0])
    assert all(p.grad is not None for p in stepper.model.memory_parameters())


def test_mtrms_bookkeeping_beside_backward_gives_exactly_what_it_gives_inline(tiny):
    """The rows' record, the validation's scores (stream rows at once, batch copies a day later) and the
    served mixture run on a helper thread while backward runs: the same predictions, weights and state."""
    _, job = tiny
    beside, inline = LocalStepper(job, mode="mtrm", seed=4), LocalStepper(job, mode="mtrm", seed=4)
    inline._beside_backward = lambda *args: (None, None)  # everything after backward, on the step's thread
    ids = [f"r{i}" for i in range(16)]
    for i, kind in enumerate(["stream", "stream", "batch", "stream", "batch", "batch"]):
        batch = _batch(job, ids=ids[(i % 2) * 8 : (i % 2) * 8 + 8], seed=40 + i)
        a, b = beside.step(kind, batch), inline.step(kind, batch)
        np.testing.assert_array_equal(a.probs, b.probs)
    assert beside._beside is not None and inline._beside is None
    assert beside.evidence.validation.scored > 0  # copies were scored
    assert same_state(beside.state_dict(), inline.state_dict())


@pytest.mark.parametrize("mode", ["mtrm", "single_tower"])
def test_the_graph_backward_keeps_is_freed_by_the_next_steps_helper(tiny, mode):
    """Backward keeps the graph (freeing a saved tensor inside it takes the GIL, which the step's helper
    threads hold), and a step with a helper leaves it to the next step's helper to free, beside that
    step's backward: every layer's output (each saved by the next layer for backward) is freed, on the
    helper unless its step had none (a single tower's step without ``then``: freed as it returns)."""
    _, job = tiny
    stepper = LocalStepper(job, mode=mode)
    freed: list[tuple[int, list[str]]] = []
    step = 0

    def keep(module, inputs, output):
        if isinstance(output, torch.Tensor) and output.grad_fn is not None:
            thread: list[str] = []
            weakref.finalize(output, lambda: thread.append(threading.current_thread().name))
            freed.append((step, thread))

    hooks = [module.register_forward_hook(keep) for module in stepper.model.modules()]
    kept: list[list[str]] = []  # the outputs alive as their step returned: the graph's
    for step, kind in enumerate(["stream", "batch", "stream"]):
        result = stepper.step(kind, _batch(job, seed=60 + step), then=(lambda probs: len(probs)) if step else None)
        assert result is not None and (result.then is None) == (step == 0)
        if mode == "mtrm" or step:  # the step had a helper: its graph outlives it
            kept += [thread for s, thread in freed if s == step and not thread]
    for hook in hooks:
        hook.remove()
    assert len(kept) > 5
    stepper.step("batch", _batch(job, seed=70), then=len)
    assert stepper._beside is not None
    stepper._beside.submit(lambda: None).result()  # the helper is done with the step's work
    assert [thread for _, thread in freed if not thread] == []
    assert kept == [["primus-step_0"]] * len(kept)


def test_a_step_failing_after_it_handed_over_waits_for_its_helpers_work(tiny):
    """The loop never joins the ``then`` of a step that raised, and unwinds at once (closing the inputs
    that work reads): the step lets the helper finish it first, and raises its own error."""
    _, job = tiny
    stepper = LocalStepper(job, mode="mtrm")
    finished: list[int] = []

    def then(probs):
        time.sleep(0.3)  # still reading when the update fails, unless the step waits
        finished.append(len(probs))

    def fail():
        raise RuntimeError("the update failed")

    stepper.optimizer.step = fail
    with pytest.raises(RuntimeError, match="the update failed"):
        stepper.step("stream", _batch(job), then=then)
    assert finished == [64]


@pytest.mark.parametrize("mode", ["mtrm", "single_tower"])
def test_the_lengths_and_offsets_minibatches_share_stay_as_made(tiny, mode):
    """Minibatches of a size share one lengths and one offsets tensor (``batch._single_valued``): steps,
    predictions and a checkpoint's state read them and never write them."""
    _, job = tiny
    stepper = LocalStepper(job, mode=mode)
    batches = [_batch(job, seed=80 + i) for i in range(4)]
    shared = batches[0].sparse
    assert all(b.sparse.lengths() is shared.lengths() and b.sparse.offsets() is shared.offsets() for b in batches)
    for i, batch in enumerate(batches):
        stepper.step("stream" if i % 2 else "batch", batch, then=len)
        stepper.predict(batch)
    stepper.state_dict()
    n = shared.lengths().numel()
    assert n == 64 * len(job.spec.features.sparse)
    assert torch.equal(shared.lengths(), torch.ones(n, dtype=torch.int64))
    assert torch.equal(shared.offsets(), torch.arange(n + 1, dtype=torch.int64))
