"""MTRM's delayed validation: stream rows' logits scored when their complete labels arrive."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from primus_lib.train.model.row_keys import row_keys
from primus_lib.train.model.stepper import LocalStepper
from primus_lib.train.model.streamed import StreamedRows
from primus_lib.train.model.validation import BLENDS, EXPERTS, NONE, PRIOR, DelayedValidation, K, Towers, misranked
from tests.train.conftest import minibatch


def _scored(validation, record, ids, labels):
    """A batch step's scoring, as ``Evidence.before_step`` does it."""
    found = record.take(ids)
    if found.logits is not None:
        rows, towers = found.logits
        validation.add(validation.score(towers, np.asarray(labels, np.float32)[rows]))


def _streamed(record, ids, memory, adapt, reread):
    record.record(ids, torch.zeros(len(ids)))
    record.record_logits(Towers(*(np.asarray(t, np.float32) for t in (memory, adapt, reread))))


def test_the_expert_that_ranks_best_gains_the_weight():
    rng = np.random.default_rng(0)
    validation, record = DelayedValidation(halflife_rows=1e9), StreamedRows(logits=True)
    assert validation.weights()["mean"] > 0.7  # the prior: the mean
    for step in range(40):
        ids = [f"s{step}-{i}" for i in range(64)]
        labels = (rng.random(64) < 0.3).astype(np.float32)
        truth = np.where(labels == 1, 2.0, -2.0)
        # the adapt tower ranks the rows almost right, the memory tower the wrong way round, the reread tower at random
        _streamed(record, ids, -truth, truth + rng.normal(0, 1, 64), rng.normal(0, 1, 64))
        assert record.labels_by_key().keys() >= set(row_keys(ids).tolist())
        _scored(validation, record, ids, labels)
        assert not len(record.table)  # every kept row scored once
    w = validation.weights()
    assert max(w, key=w.get) == "adapt" and w["adapt"] > 0.95  # beside it: the blend of 3/4 adapt, 1/4 noise
    assert validation.scored == 40 * 64


def _pairs_misranked(logit: np.ndarray, y: np.ndarray) -> float:
    """``misranked`` by counting every (click, no click) pair."""
    pos, neg = logit[y == 1], logit[y == 0]
    wrong = (pos[:, None] < neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return len(y) * wrong / (len(pos) * len(neg))


def test_an_experts_loss_is_its_rows_times_one_minus_its_auc():
    rng = np.random.default_rng(2)
    towers = Towers(*(rng.normal(0, 1, 200).round(1) for _ in range(3)))  # ties
    y = (rng.random(200) < 0.3).astype(np.float64)
    scores = DelayedValidation.score(towers, y)
    assert len(scores) == K + 1 and scores[K] == 200.0
    for (base, a), got in zip(BLENDS.values(), scores[:K], strict=True):
        blend = (1 - a) * getattr(towers, base) + a * towers.adapt
        assert got == pytest.approx(_pairs_misranked(blend, y), rel=1e-12)
    assert misranked(np.array([0.1, 0.5, 0.3]), np.array([0.0, 1.0, 0.0])).tolist() == [0.0]  # ranked right
    assert misranked(np.array([0.1, 0.5]), np.array([1.0, 1.0])).tolist() == [0.0]  # no pair: nothing to rank
    assert misranked(np.array([0.2, 0.2]), np.array([1.0, 0.0])).tolist() == [1.0]  # a tie counts half, x 2 rows
    late = y * (rng.random(200) < 0.5)  # a second set of labels of the same rows, scored on the same sort
    assert DelayedValidation.scores(towers, y, late) == [scores, DelayedValidation.score(towers, late)]
    both = np.array([[0.3, 0.1, 0.2], [0.1, 0.1, 0.2]])  # one sort for several experts, ties in one only
    assert misranked(both, np.array([1.0, 0.0, 0.0])).tolist() == [0.0, 3 * 0.75]


def test_real_time_scores_count_only_once_centred_on_each_experts_usual_gap():
    """An expert whose real-time score always flatters it (one that ranks rows by their real-time
    label, where clicks of some rows come later than others') gains nothing from it; a change shows
    within hours."""
    rng = np.random.default_rng(1)
    n = 20_000
    y = (rng.random(n) < 0.4).astype(np.float64)
    y_rt = y * (rng.random(n) < 0.5)  # half the clicks are late
    memory = y + rng.normal(0, 1.5, n)  # ranks by the complete label, noisily
    adapt = y_rt + rng.normal(0, 1.0, n)  # ranks by the real-time label
    reread = y + rng.normal(0, 3.0, n)  # by the complete label, more noisily
    towers = Towers(memory, adapt, reread)
    validation = DelayedValidation(halflife_rows=float("inf"))
    validation.add(NONE, NONE, validation.score(towers, y_rt))
    assert validation.loss == PRIOR  # no gap measured yet: real-time scores are not used
    # a day later the complete labels come, and with them each expert's gap between its two scores
    complete = validation.score(towers, y)
    gap = validation.score_gap(validation.score(towers, y_rt), complete)
    assert gap[EXPERTS.index("adapt")] < gap[EXPERTS.index("memory")]  # the real-time label flatters the adapt tower
    validation.add(complete, gap)
    assert max(validation.weights(), key=validation.weights().get) == min(
        EXPERTS, key=lambda k: complete[EXPERTS.index(k)]
    )
    before = dict(validation.loss)
    # the same towers' real-time scores again: no news, each expert's loss grows by its complete loss
    validation.add(NONE, NONE, validation.score(towers, y_rt))
    for i, k in enumerate(EXPERTS):
        assert validation.loss[k] - before[k] == pytest.approx(complete[i], rel=1e-9)
    # news: the adapt tower turns wrong; its real-time scores count against it before any complete label
    before = dict(validation.loss)
    validation.add(NONE, NONE, validation.score(Towers(memory, -adapt, reread), y_rt))
    a, m = EXPERTS.index("adapt"), EXPERTS.index("memory")
    assert validation.loss["adapt"] - before["adapt"] > complete[a] + 0.3 * n  # AUC fell by more than 0.3
    assert validation.loss["memory"] - before["memory"] == pytest.approx(complete[m], rel=1e-9)


def test_unknown_ids_score_nothing_and_the_memory_tower_wins_where_it_is_right():
    validation, record = DelayedValidation(halflife_rows=1e9), StreamedRows(logits=True)
    assert record.take(["nobody"]).logits is None
    assert DelayedValidation().score(Towers(*[np.zeros(0)] * 3), np.zeros(0)) == [0.0] * (K + 1)
    labels = np.array([1.0, 0.0] * 32, dtype=np.float32)
    rng = np.random.default_rng(4)
    for step in range(20):
        ids = [f"{step}-{i}" for i in range(64)]
        _streamed(record, ids, np.where(labels == 1, 3.0, -3.0), rng.normal(0, 10, 64), rng.normal(0, 10, 64))
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
    _streamed(record, ["a", "b"], [1.0, -1.0], [0.0, 0.0], [0.0, 0.0])
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

    def record(self, ids, labels, memory, adapt, reread):
        for i, key in enumerate(ids):  # a repeated id: its last occurrence's row
            self.rows[key] = (self.age, float(labels[i]), float(memory[i]), float(adapt[i]), float(reread[i]))
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
            return labels, [0.0] * (K + 1)
        towers = dict(zip(("memory", "adapt", "reread"), np.asarray(logits, dtype=np.float64).T, strict=True))
        yy = np.asarray(y, dtype=np.float64)[found]
        blends = [
            towers[base] if a == 0 else towers["adapt"] if a == 1 else (1 - a) * towers[base] + a * towers["adapt"]
            for base, a in BLENDS.values()
        ]
        return labels, [*(float(misranked(blend, yy)[0]) for blend in blends), float(len(found))]


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
            reread = torch.tensor(rng.normal(0, 3, 96), dtype=torch.float32)
            memory[:3] = torch.tensor([-0.0, float("inf"), -float("inf")])
            reread[3:5] = torch.tensor([float("inf"), -0.0])
            fast.record(ids, labels)
            fast.record_logits(Towers(memory.numpy(), adapt.numpy(), reread.numpy()))
            slow.record(ids, labels.numpy(), memory.numpy(), adapt.numpy(), reread.numpy())
            live = [k for k, row in slow.rows.items() if row[0] >= slow.age - 300]  # older: written over
            assert set(fast.labels_by_key()) == set(row_keys(live).tolist())
        else:
            y = rng.integers(0, 2, 96).astype(np.float32)
            forgotten += sum(1 for k in ids if k in slow.rows and slow.rows[k][0] < slow.age - 300)
            labels, losses = slow.take(ids, y)
            found = fast.take(ids)
            got = np.full(96, np.nan) if found.labels is None else found.labels.numpy()
            np.testing.assert_array_equal(got, np.asarray(labels, np.float32))
            score = [0.0] * (K + 1)
            if found.logits is not None:
                rows, towers = found.logits
                score = DelayedValidation().score(towers, y[rows])
            np.testing.assert_array_equal(score, losses)
    assert forgotten > 0  # some taken ids were older than the capacity


def test_mtrm_scores_stream_rows_at_once_on_real_time_labels_and_later_on_complete_ones(tiny):
    _, job = tiny
    stepper = LocalStepper(job, mode="mtrm")
    validation, evidence = stepper.evidence.validation, stepper.evidence
    first = [f"a{i}" for i in range(8)]
    stepper.step("stream", minibatch(job, ids=first, labels=[0, 1, 0, 0, 1, 0, 0, 0]))
    assert validation.loss == PRIOR and evidence.realtime[K] == 8  # counted with the next step's sums
    stepper.step("batch", minibatch(job, ids=first, labels=[0, 1, 1, 0, 1, 0, 0, 1]))
    assert validation.gap_rows == 8 and validation.scored == 8  # the copies: complete scores and the gaps
    before = dict(validation.loss)
    stepper.step("stream", minibatch(job, ids=[f"b{i}" for i in range(6)], labels=[1, 0, 0, 0, 0, 1]))
    pending = list(evidence.realtime)
    assert pending[K] == 6 and validation.loss == before
    stepper.step("batch", minibatch(job, ids=["never-streamed"], labels=[0]))
    keep = validation.decay**6
    for i, name in enumerate(EXPERTS):  # each real-time loss centred on the expert's measured gap
        centred = pending[i] - 6 * validation.gap[i] / validation.gap_rows
        assert validation.loss[name] == pytest.approx(before[name] * keep + centred)
    assert validation.scored == 8  # real-time scores are not complete-label evidence
