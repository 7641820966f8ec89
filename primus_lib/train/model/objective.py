"""What one minibatch trains, in every mode: Primus's MTRM and the baselines on one code path.

=====================  =======================  ===========================================  ====================
mode                   batch minibatch          stream minibatch                             served
=====================  =======================  ===========================================  ====================
mtrm                   memory tower (once),     memory tower, adapt tower (``h_aux``),       ``spec.model.serve``
                       reread tower             reread tower
single_tower           the tower (once)         the tower                                    the tower
offline                the tower                (not read)                                   the tower
online                 (not read)               the tower                                    the tower
offline_then_online    the tower until switch   the tower after the switch                   the tower
=====================  =======================  ===========================================  ====================

The memory tower and the shared tables train on every row a mode reads, exactly as the single
tower does. The adapt tower trains on stream rows only, reading the memory logit (``h_aux``) and the
shared tables without gradient, and its own fresh tables (``network.py``): the fresh view, which the
batch rows (a day old) never reach. The reread tower, with tables of its own, trains on every row each
time it is read: a streamed row's batch copy trains it in full, a second epoch a day later (the
paper's single tower), which wins where tastes move slowly and costs where they flip or sparse
features are many; the memory tower trains each impression once. MTRM's memory tower and shared
tables move exactly as the single tower's. MTRM serves the mixture of blends of its towers that a
validation weighs by how well each ranked (``validation.py``; ``serve: mixture``, the default): on
complete labels a day later and, at once, on real-time labels. A stream row's label is provisional
(late clicks are missing): every tower's stream loss is ``spec.model.stream_correction``'s, but the
adapt tower's, which fits the real-time label and is read through the delay model (``delayed.py``).
(once): a mode that reads both kinds trains each impression once: the batch copy of a streamed row
trains only what its stream step lacked (``streamed.py``). docs/training.md has the measurements.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import get_args

import numpy as np
import torch
from torch.nn import functional as F

from primus_lib.spec.job import PrimusJob
from primus_lib.spec.training import ServedOutput, StreamCorrection
from primus_lib.train.model import delayed, modes
from primus_lib.train.model.delayed import Completeness
from primus_lib.train.model.network import TowerInputs, TwoTowerModel
from primus_lib.train.model.streamed import StreamedRows
from primus_lib.train.model.validation import NONE, DelayedValidation, K, Towers

SERVED: tuple[str, ...] = get_args(ServedOutput)
CORRECTIONS: tuple[str, ...] = get_args(StreamCorrection)


@dataclass(frozen=True)
class StepConfig:
    """Everything a step needs from the spec, resolved once (``resolve``); both steppers read it."""

    mode: str
    serve: str
    correction: str
    learning_rate: float
    sparse_learning_rate: float
    seed: int
    completeness: float | None = None  # a known share of clicks the stream label sees (None: estimated)
    reread: bool = False  # a backtest's baseline: batch copies of streamed rows train in full (the paper's)

    @property
    def two_towers(self) -> bool:
        return modes.two_towers(self.mode)

    @property
    def reads_both(self) -> bool:
        return modes.reads(self.mode, "batch") and modes.reads(self.mode, "stream")

    @property
    def once(self) -> bool:
        """Whether a streamed row's batch copy trains only what its stream step lacked (``streamed.py``)."""
        return self.reads_both and not self.reread

    @property
    def needs_ids(self) -> bool:
        """Whether a step needs its rows' ids: MTRM's delayed validation, the once rule."""
        return self.two_towers or self.once

    def towers(self, kind: str) -> tuple[str, ...]:
        """The towers a minibatch of ``kind`` trains (the table above)."""
        if not self.two_towers:
            return ("memory",)
        return ("memory", "adapt", "reread") if kind == "stream" else ("memory", "reread")

    def served(self, output: str | None = None) -> str:
        """The output served (``output`` overrides it): ``spec.model.serve`` in MTRM, the tower otherwise."""
        return output or (self.serve if self.two_towers else "memory")

    @classmethod
    def resolve(cls, job: PrimusJob, *, mode: str | None = None, **overrides) -> StepConfig:
        """The spec's values, with ``overrides`` (None: the spec's) as ``primus eval`` variants give them."""
        spec = job.spec
        values = {
            "serve": spec.model.serve,
            "correction": spec.model.stream_correction,
            "learning_rate": spec.training.learning_rate,
            "sparse_learning_rate": spec.training.sparse_learning_rate,
            "seed": spec.training.seed,
            **{k: v for k, v in overrides.items() if v is not None},
        }
        config = cls(mode=modes.check_mode(mode or spec.training.mode), **values)
        if config.serve not in SERVED:
            raise ValueError(f"serve: expected one of {'|'.join(SERVED)}, got {config.serve!r}")
        if config.correction not in CORRECTIONS:
            raise ValueError(f"stream_correction: expected one of {'|'.join(CORRECTIONS)}, got {config.correction!r}")
        return config


@dataclass
class StepResult:
    towers: tuple[str, ...]  # the towers this step trained
    loss: float
    probs: np.ndarray  # the step's predictions of its rows before the update (progressive)
    then: Future | None = None  # what the step's ``then`` returns, maybe still running (``LocalStepper.step``)


@dataclass
class Forward:
    loss: torch.Tensor  # per row
    memory_logit: torch.Tensor
    adapt_logit: torch.Tensor | None  # the adapt tower's complete-label logit, without gradient
    towers: tuple[str, ...]
    reread_logit: torch.Tensor | None = None  # without gradient


class Evidence:
    """What a stepper learns from the labels beyond the gradients, the same on every rank: ``c`` (the
    share of clicks the stream label sees) and, in MTRM, the delayed validation of its outputs."""

    def __init__(self, config: StepConfig):
        self.correct = config.correction != "none"
        self.once = config.once
        before = delayed.UNINFORMED if config.reads_both else 1.0  # online: no complete label will come
        self.completeness = Completeness(fixed=config.completeness, before=before)
        self.validation = DelayedValidation() if config.two_towers else None
        # the stream rows awaiting their batch copies: the once rule's labels, the validation's logits
        self.streamed = StreamedRows(logits=config.two_towers) if config.needs_ids else None
        self.copies: torch.Tensor | None = None  # this batch minibatch's real-time labels (NaN: never streamed)
        self.realtime = NONE  # the last stream step's real-time scores, summed over ranks with the next step's

    def before_step(
        self, kind: str, keys: np.ndarray | None, labels: torch.Tensor | None, group, *, defer: bool = False
    ) -> Callable[[], None] | None:
        """Fold in this minibatch's clicks and scored rows, summed over the ranks (``labels`` None: none here).
        ``defer`` (a world of one): a batch step's scoring of its copies is returned for the stepper to run
        beside backward (the step reads none of it), else done here."""
        self.copies = None
        found = None
        if self.streamed is not None and kind == "batch":  # every rank, every step: the lookup is collective
            found = self.streamed.take(keys, group)
            self.copies = found.labels if self.once else None
        if not self.correct and self.validation is None:
            return None
        local = [float(labels.sum()), float(labels.numel())] if labels is not None else [0.0, 0.0]
        realtime, self.realtime = self.realtime, NONE
        if defer and kind == "batch" and self.validation is not None and not group.active:
            if self.correct:
                self.completeness.add(kind, local[0], int(local[1]))  # a world of one: its sum is its own
            validation = self.validation
            return lambda: validation.add(*self._copy_scores(found, labels), realtime)
        summed = group.sum(local + [v for scores in self._copy_scores(found, labels) for v in scores] + realtime)
        if self.correct:
            self.completeness.add(kind, summed[0], int(summed[1]))
        if self.validation is not None:
            n = K + 1  # each score: a loss per expert, then the rows
            self.validation.add(summed[2 : 2 + n], summed[2 + n : 2 + 2 * n], summed[2 + 2 * n :])
        return None

    def _copy_scores(self, found, labels: torch.Tensor | None) -> tuple[list[float], list[float]]:
        """A batch step's copies scored on their complete labels, and how their real-time scores differ."""
        if self.validation is None or found is None or found.logits is None or labels is None:
            return NONE, NONE
        rows, logits = found.logits
        y = labels.detach().cpu().numpy()[rows]
        if found.labels is None:
            return DelayedValidation.score(logits, y), NONE
        complete, realtime = DelayedValidation.scores(logits, y, found.labels.numpy()[rows])
        return complete, DelayedValidation.score_gap(realtime, complete)

    def after_forward(self, kind: str, out: Forward, labels: torch.Tensor, keys: np.ndarray | None) -> None:
        """A stream step's rows into the record (the once rule's labels, the validation's logits: read by
        later batch steps alone) and its towers' scores at once on the real-time labels."""
        if kind != "stream":
            return
        if self.streamed is not None:
            self.streamed.record(keys, labels)
        if out.adapt_logit is None or out.reread_logit is None:
            return
        logits = Towers(*(t.detach().cpu().numpy() for t in (out.memory_logit, out.adapt_logit, out.reread_logit)))
        if self.streamed is not None:
            self.streamed.record_logits(logits)
        if self.validation is not None:
            self.realtime = DelayedValidation.score(logits, labels.detach().cpu().numpy())

    @property
    def c(self) -> float:
        return self.completeness.value

    def state_dict(self) -> dict:
        state = {"completeness": self.completeness.state_dict()}
        if self.validation is not None:
            state["validation"] = self.validation.state_dict()
        if self.streamed is not None:
            state["streamed"] = self.streamed.state_dict()
        return state

    def load_state_dict(self, state: dict, rank: int = 0) -> None:
        self.completeness.load_state_dict(state["completeness"])
        if self.validation is not None:
            self.validation.load_state_dict(state["validation"])
        if self.streamed is not None and "streamed" in state:  # a checkpoint from before the rule has none
            self.streamed.load_state_dict(state["streamed"], rank)


def forward(
    model: TwoTowerModel, config: StepConfig, kind: str, x: TowerInputs, labels: torch.Tensor, evidence: Evidence
) -> Forward:
    """Per-row loss of a minibatch of ``kind`` (``"batch"``: complete labels; ``"stream"``: provisional)."""
    if kind not in modes.KINDS:
        raise ValueError(f"minibatch kind: expected one of {modes.KINDS}, got {kind!r}")
    if kind == "batch":
        memory_logit = model.memory_forward(x)
        loss = F.binary_cross_entropy_with_logits(memory_logit, labels, reduction="none")
        if evidence.copies is not None:  # a streamed row's copy trains only what its stream step lacked
            copies = evidence.copies.to(memory_logit.device)  # kept on the host; the logits may be on a GPU
            seen = ~torch.isnan(copies)
            trained = delayed.stream_loss(config.correction, memory_logit, copies.nan_to_num(0.0), evidence.c)
            loss = loss - torch.where(seen, trained, torch.zeros_like(trained))
        if not config.two_towers:
            return Forward(loss, memory_logit, None, ("memory",))
        reread_logit = model.reread_forward(x)  # every batch row in full: a streamed row's copy is a second epoch
        loss = loss + F.binary_cross_entropy_with_logits(reread_logit, labels, reduction="none")
        return Forward(loss, memory_logit, None, config.towers(kind), reread_logit.detach())
    memory_logit = model.memory_forward(x)
    c = evidence.c
    loss = delayed.stream_loss(config.correction, memory_logit, labels, c)
    if not config.two_towers:
        return Forward(loss, memory_logit, None, ("memory",))
    adapt_logit = model.adapt_forward(x, memory_logit)
    loss = loss + F.binary_cross_entropy_with_logits(adapt_logit, labels, reduction="none")  # the real-time label
    reread_logit = model.reread_forward(x)
    loss = loss + delayed.stream_loss(config.correction, reread_logit, labels, c)
    adapt_output = _adapt_output(config, adapt_logit.detach(), c)
    return Forward(loss, memory_logit, adapt_output, config.towers(kind), reread_logit.detach())


def _adapt_output(config: StepConfig, adapt_logit: torch.Tensor, c: float) -> torch.Tensor:
    """The adapt tower's complete-label logit: it fits the real-time label (``delayed.py``)."""
    return delayed.complete_logit(adapt_logit, c) if config.correction == "likelihood" else adapt_logit


def served_probs(output: str, memory_logit: torch.Tensor, out: Towers | None, evidence: Evidence) -> torch.Tensor:
    """The probability of ``output`` from the memory logit and (MTRM) the three towers' logits ``out``."""
    if output not in SERVED:
        raise ValueError(f"output: expected one of {'|'.join(SERVED)}, got {output!r}")
    if output == "memory":
        return torch.sigmoid(memory_logit)
    if out is None:
        raise ValueError(f"served output {output!r} needs MTRM's towers (mode mtrm)")
    if output == "mixture":
        if evidence.validation is None:
            raise ValueError("served output 'mixture' needs the towers' delayed validation (mode mtrm)")
        return evidence.validation.mixture(out)
    return torch.sigmoid({"adapt": out.adapt, "reread": out.reread, "mean": (out.memory + out.adapt) / 2}[output])


def progressive_probs(config: StepConfig, out: Forward, evidence: Evidence) -> np.ndarray:
    """A step's predictions of its rows before the update: the served output where every tower ran
    (MTRM's stream rows), else the memory tower's."""
    memory = out.memory_logit.detach()
    if out.adapt_logit is None or out.reread_logit is None:
        return torch.sigmoid(memory).cpu().numpy()
    towers = Towers(memory, out.adapt_logit, out.reread_logit)
    return served_probs(config.served(), memory, towers, evidence).detach().cpu().numpy()


@torch.no_grad()
def predict_probs(model: TwoTowerModel, config: StepConfig, x: TowerInputs, evidence: Evidence, output=None):
    """The served probability of ``x`` (``output``: one of ``SERVED``, overrides it)."""
    output = config.served(output)
    memory_logit = model.memory_forward(x)
    if output == "memory" or not model.two_towers:
        return served_probs(output, memory_logit, None, evidence)
    adapt_logit = _adapt_output(config, model.adapt_forward(x, memory_logit), evidence.c)
    return served_probs(output, memory_logit, Towers(memory_logit, adapt_logit, model.reread_forward(x)), evidence)
