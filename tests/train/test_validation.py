"""MTRM's delayed validation: stream rows' logits scored when their complete labels arrive."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from primus_lib.train.model.row_keys import row_keys
from primus_lib.train.model.stepper import LocalStepper
from primus_lib.train.model.streamed import StreamedRows
from primus_lib.train.model.validation import EXPERTS, NONE, PRIOR, DelayedValidation, _log_loss
from tests.train.conftest import minibatch


def _scored(validation, record, ids, labels):
    """A batch step's scoring, as ``Evidence.before_step`` does it."""
    found = record.take(ids)
    if found.logits is not None:
        rows, memory, adapt = found.logits
        validation.add(validation.score(memory, adapt, np.asarray(labels, np.float32)[rows]))


def _streamed(record, ids, memory, adapt):
    record.record(ids, torch.zeros(len(ids)))
    record.record_logits(torch.as_tensor(memory, dtype=torch.float32), torch.as_tensor(adapt, dtype=torch.float32))


def test_the_expert_closest_to_the_complete_labels_gains_the_weight():
    rng = np.random.default_rng(0)
    validation, record = DelayedValidation(halflife_rows=1e9), StreamedRows(logits=True)
    assert validation.weights()["mean"] > 0.9  # the prior: the mean
    for step in range(40):
        ids = [f"s{step}-{i}" for i in range(64)]
        labels = (rng.random(64) < 0.3).astype(np.float32)
        truth = np.where(labels == 1, 2.0, -2.0)  # the adapt tower knows the labels; the memory tower does not
        _streamed(record, ids, np.zeros(64), truth)
        assert record.labels_by_key().keys() >= set(row_keys(ids).tolist())
        _scored(validation, record, ids, labels)
        assert not len(record.table)  # every kept row scored once
    w = validation.weights()
    assert w["adapt"] > 0.99
    assert validation.scored == 40 * 64


def test_real_time_scores_are_the_delay_models_likelihood_of_the_observed_label():
    memory, adapt = np.array([0.5, -1.0, 2.0]), np.array([-0.3, 0.2, 1.0])
    y = np.array([1.0, 0.0, 1.0])
    scores = DelayedValidation().score_realtime(memory, adapt, y, 0.6)
    for logit, got in zip((memory, adapt, (memory + adapt) / 2), scores[:3], strict=True):
        seen = 0.6 / (1 + np.exp(-logit))  # P(y_rt = 1) = c * p
        assert got == pytest.approx(-(y * np.log(seen) + (1 - y) * np.log(1 - seen)).sum())
    assert scores[3] == 3.0
    # c = 1: no click is late, the plain log loss
    assert DelayedValidation().score_realtime(memory, adapt, y, 1.0)[0] == pytest.approx(_log_loss(memory, y).sum())


def _logit(p: float, n: int) -> np.ndarray:
    return np.full(n, np.log(p / (1 - p)))


def test_real_time_scores_count_only_once_centred_on_each_experts_usual_gap():
    """An expert whose real-time score always flatters it (one fitting the real-time label where
    clicks of some rows come later than others') gains nothing from it; a change shows within hours."""
    rng = np.random.default_rng(1)
    n = 20_000
    y = (rng.random(n) < 0.4).astype(np.float64)
    y_rt = y * (rng.random(n) < 0.5)  # c = 0.5
    validation = DelayedValidation(halflife_rows=float("inf"))
    validation.add(NONE, NONE, validation.score_realtime(_logit(0.2, n), _logit(0.4, n), y_rt, 0.5))
    assert validation.loss == PRIOR  # no gap measured yet: real-time scores are not used
    # a day later the complete labels come, and with them each expert's gap between its two scores
    memory, adapt = _logit(0.2, n), _logit(0.4, n)
    complete = validation.score(memory, adapt, y)
    gap = validation.score_gap(validation.score_realtime(memory, adapt, y_rt, 0.5), complete)
    validation.add(complete, gap)
    assert validation.weights()["adapt"] > 0.99
    before = dict(validation.loss)
    # the same towers' real-time scores again: no news, each expert's loss grows by its complete loss' rate
    validation.add(NONE, NONE, validation.score_realtime(memory, adapt, y_rt, 0.5))
    growth = {k: validation.loss[k] - before[k] for k in EXPERTS}
    for i, k in enumerate(EXPERTS):
        assert growth[k] == pytest.approx(complete[i], rel=1e-9)
    # news: the adapt tower turns wrong; its real-time scores move the weight before any complete label
    validation.add(NONE, NONE, validation.score_realtime(memory, _logit(0.05, n), y_rt, 0.5))
    assert validation.weights()["adapt"] < 0.01


def test_unknown_ids_score_nothing_and_the_memory_tower_wins_where_it_is_right():
    validation, record = DelayedValidation(halflife_rows=1e9), StreamedRows(logits=True)
    assert record.take(["nobody"]).logits is None
    assert DelayedValidation().score(np.zeros(0), np.zeros(0), np.zeros(0)) == [0.0, 0.0, 0.0, 0.0]
    labels = np.array([1.0, 0.0] * 32, dtype=np.float32)
    for step in range(20):
        ids = [f"{step}-{i}" for i in range(64)]
        _streamed(record, ids, np.where(labels == 1, 3.0, -3.0), np.zeros(64))
        _scored(validation, record, ids, labels)
    assert validation.weights()["memory"] > 0.99


def test_rows_without_logits_are_not_scored():
    """Rows restored from a checkpoint, or recorded by a stream step that ran no forward, have none."""
    record = StreamedRows(logits=True)
    record.record(["a", "b"], torch.tensor([1.0, 0.0]))  # no record_logits
    clone = StreamedRows(logits=True)
    clone.load_state_dict(record.state_dict())
    for r in (record, clone):
        found = r.take(["a", "b"])
        assert found.logits is None and found.labels.tolist() == [1.0, 0.0]
    assert StreamedRows().take(["a"]).logits is None  # a single tower keeps no logits


def test_state_round_trip():
    validation, record = DelayedValidation(), StreamedRows(logits=True)
    _streamed(record, ["a", "b"], [1.0, -1.0], [0.0, 0.0])
    _scored(validation, record, ["a", "b"], [1.0, 0.0])
    clone = DelayedValidation()
    clone.load_state_dict(validation.state_dict())
    assert clone.weights() == pytest.approx(validation.weights()) and clone.scored == 2
    assert clone.loss != PRIOR
    clone.load_state_dict({**validation.state_dict(), "every": 4})  # an older state's sampling: ignored
    assert clone.scored == 2


class _RowByRow:
    """The record and the scoring as plain dicts, one row at a time: what the columns must give."""

    def __init__(self, capacity: int):
        self.capacity, self.rows, self.age = capacity, {}, 0

    def record(self, ids, labels, memory, adapt):
        for i, key in enumerate(ids):  # a repeated id: its last occurrence's row
            self.rows[key] = (self.age, float(labels[i]), float(memory[i]), float(adapt[i]))
            self.age += 1

    def take(self, ids, y):
        labels, found, logits = [], [], []
        for i, key in enumerate(ids):
            got = self.rows.pop(key, None)
            if got is None or got[0] < self.age - self.capacity:
                labels.append(float("nan"))
                continue
            labels.append(got[1])
            found.append(i)
            logits.append(got[2:])
        if not found:
            return labels, [0.0, 0.0, 0.0, 0.0]
        memory, adapt = np.asarray(logits, dtype=np.float64).T
        yy = np.asarray(y, dtype=np.float64)[found]
        losses = [_log_loss(memory, yy).sum(), _log_loss(adapt, yy).sum(), _log_loss((memory + adapt) / 2, yy).sum()]
        return labels, [*map(float, losses), float(len(found))]


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the infinite logits
def test_the_columns_give_exactly_what_the_row_by_row_dicts_gave():
    """The same labels and bit-equal losses, on repeated ids within and across minibatches, unknown
    ids, ids older than the capacity (their slots written over), signed zeros and
    infinite logits."""
    rng = np.random.default_rng(3)
    fast, slow = StreamedRows(capacity=300, logits=True), _RowByRow(capacity=300)
    forgotten = 0
    for step in range(80):
        ids = [f"k{v}" for v in rng.integers(0, 900, 96)]  # repeats, and ids never recorded
        if step % 3 != 2:
            labels = torch.tensor(rng.integers(0, 2, 96), dtype=torch.float32)
            memory = torch.tensor(rng.normal(0, 3, 96), dtype=torch.float32)
            adapt = torch.tensor(rng.normal(0, 3, 96), dtype=torch.float32)
            memory[:3] = torch.tensor([-0.0, float("inf"), -float("inf")])
            fast.record(ids, labels)
            fast.record_logits(memory, adapt)
            slow.record(ids, labels.numpy(), memory.numpy(), adapt.numpy())
            live = [k for k, row in slow.rows.items() if row[0] >= slow.age - 300]  # older: written over
            assert set(fast.labels_by_key()) == set(row_keys(live).tolist())
        else:
            y = rng.integers(0, 2, 96).astype(np.float32)
            forgotten += sum(1 for k in ids if k in slow.rows and slow.rows[k][0] < slow.age - 300)
            labels, losses = slow.take(ids, y)
            found = fast.take(ids)
            got = np.full(96, np.nan) if found.labels is None else found.labels.numpy()
            np.testing.assert_array_equal(got, np.asarray(labels, np.float32))
            score = [0.0] * 4
            if found.logits is not None:
                rows, m, a = found.logits
                score = DelayedValidation().score(m, a, y[rows])
            np.testing.assert_array_equal(score, losses)  # NaN: the infinities
    assert forgotten > 0  # some taken ids were older than the capacity


def test_mtrm_scores_stream_rows_at_once_on_real_time_labels_and_later_on_complete_ones(tiny):
    _, job = tiny
    stepper = LocalStepper(job, mode="mtrm")
    validation, evidence = stepper.evidence.validation, stepper.evidence
    first = [f"a{i}" for i in range(8)]
    stepper.step("stream", minibatch(job, ids=first, labels=[0, 1, 0, 0, 1, 0, 0, 0]))
    assert validation.loss == PRIOR and evidence.realtime[3] == 8  # counted with the next step's sums
    stepper.step("batch", minibatch(job, ids=first, labels=[0, 1, 1, 0, 1, 0, 0, 1]))
    assert validation.gap_rows == 8 and validation.scored == 8  # the copies: complete scores and the gaps
    before = dict(validation.loss)
    stepper.step("stream", minibatch(job, ids=[f"b{i}" for i in range(6)], labels=[1, 0, 0, 0, 0, 1]))
    pending = list(evidence.realtime)
    assert pending[3] == 6 and validation.loss == before
    stepper.step("batch", minibatch(job, ids=["never-streamed"], labels=[0]))
    keep = validation.decay**6
    for i, name in enumerate(EXPERTS):  # each real-time loss centred on the expert's measured gap
        centred = pending[i] - 6 * validation.gap[i] / validation.gap_rows
        assert validation.loss[name] == pytest.approx(before[name] * keep + centred)
    assert validation.scored == 8  # real-time scores are not complete-label evidence
