"""Algorithm 1 and the training modes on one code path.

Every mode consumes minibatches tagged with their kind (``batch`` or ``stream``); which tower
a kind trains in which mode is the table in ``modes.py`` (MTRM: batch -> memory tower,
stream -> adapt tower with ``h_aux``; every other mode: the one tower).

Dense parameters of each tower have their own Adam optimizer, so a batch step cannot move
the adapt tower and a stream step cannot move the memory tower. Embeddings follow
``spec.model.embedding_updates`` in MTRM (single-tower modes always update them); a batch
step's gradient on them is scaled by ``spec.model.batch_embedding_scale`` (its rows are a day
older than the stream's).

Delayed feedback (MTRM, ``delayed.py``): stream steps train the adapt tower with
``spec.model.stream_correction``'s loss, the real-time label being provisional. With
``spec.model.serve: blend`` batch steps also fit the three-number serving head on the complete
label (detached tower logits, its own Adam): still neither tower moves on the other's data.
``complete_label_pass`` (off by default) lets batch rows train the served adapt tower too:
``tower``, its weights only; ``tables``, its weights and the shared tables through it, the memory
tower then reading the tables without moving them (they learn what the served tower learns from).
Its loss is weighted by ``complete_label_weight``: the served tower has already trained on each
batch row once, on the stream, and a full-weight second pass over the same impressions costs
accuracy for a day or two after it starts (docs/training.md, "Sixth round").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from primus_lib.spec.job import PrimusJob
from primus_lib.spec.training import COMPLETE_LABEL_PASSES, complete_label_pass_name
from primus_lib.train import delayed, modes
from primus_lib.train.batch import Batch
from primus_lib.train.hedge import Hedge
from primus_lib.train.model import ModelOptions, TwoTowerModel
from primus_lib.train.modes import KINDS

__all__ = ["KINDS", "StepResult", "Stepper"]


def batch_rows_loss(
    model: TwoTowerModel, x: torch.Tensor, labels: torch.Tensor, second_pass: str, weight: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A batch minibatch's per-row loss on the memory tower (the only tower of one-tower modes)
    and, with the complete-label pass, ``weight`` times the served adapt tower's on the same
    complete labels. With ``tables`` the memory tower reads the tables without moving them.
    Returns the loss, the memory logit and the adapt logit (None without the pass); shared by the
    replicated and the DMP-sharded steppers."""
    logit = model.memory_forward(x.detach() if second_pass == "tables" else x)[0]
    per_row = F.binary_cross_entropy_with_logits(logit, labels, reduction="none")
    if second_pass == "off":
        return per_row, logit, None
    adapt_logit = model.adapt_forward(x if second_pass == "tables" else x.detach())[0]
    second = F.binary_cross_entropy_with_logits(adapt_logit, labels, reduction="none")
    return per_row + weight * second, logit, adapt_logit


@dataclass
class StepResult:
    graph: str  # "memory" | "adapt"
    loss: float
    probs: np.ndarray  # predictions of the trained graph before the update (progressive)


class Stepper:
    """Owns the model and its optimizers; runs one minibatch of one kind."""

    def __init__(
        self,
        job: PrimusJob,
        *,
        mode: str | None = None,
        options: ModelOptions | None = None,
        embedding_updates: str | None = None,
        serve: str | None = None,
        learning_rate: float | None = None,
        sparse_learning_rate: float | None = None,
        seed: int | None = None,
        stream_correction: str | None = None,
        complete_label_pass: str | bool | None = None,
        batch_embedding_scale: float | None = None,
        complete_label_weight: float | None = None,
        soft_after_rows: int | None = None,
        completeness: float | None = None,
    ):
        spec = job.spec
        self.mode = mode or spec.training.mode
        self.embedding_updates = embedding_updates or spec.model.embedding_updates
        self.serve = serve or spec.model.serve
        two = modes.two_towers(self.mode)
        self.correction = stream_correction or spec.model.stream_correction  # every mode's stream steps
        if self.correction not in delayed.CORRECTIONS:
            raise ValueError(f"stream_correction: expected one of {delayed.CORRECTIONS}, got {self.correction!r}")
        after = spec.model.soft_after_rows if soft_after_rows is None else soft_after_rows
        if after < 0:
            raise ValueError(f"soft_after_rows: expected a row count >= 0, got {after!r}")
        self.soft_after_rows = after
        self.memory_rows = 0  # complete-labelled rows the memory tower has trained on (soft_after_rows)
        second = spec.model.complete_label_pass if complete_label_pass is None else complete_label_pass
        second = complete_label_pass_name(second)
        if second not in COMPLETE_LABEL_PASSES:
            raise ValueError(f"complete_label_pass: expected one of {COMPLETE_LABEL_PASSES}, got {second!r}")
        self.second_pass = second if two else "off"
        weight = spec.model.complete_label_weight if complete_label_weight is None else complete_label_weight
        if not 0 < weight <= 1:
            raise ValueError(f"complete_label_weight: expected a number in (0, 1], got {weight!r}")
        self.second_weight = weight
        self.blending = two and modes.served_output(self.mode, self.serve) == "blend"
        self.hedge = Hedge() if two and modes.served_output(self.mode, self.serve) == "hedge" else None
        if self.blending:
            options = replace(options or ModelOptions(), blend=True)
        # the spec's value is MTRM's; an explicit one (eval's bemb=) applies to any mode
        spec_scale = spec.model.batch_embedding_scale if two else 1.0
        self.batch_emb_scale = spec_scale if batch_embedding_scale is None else batch_embedding_scale
        if not (self.updates_embeddings("batch") and self.updates_embeddings("stream")):
            self.batch_emb_scale = 1.0  # one kind alone moves the tables: row-wise Adagrad is scale-free
        self.completeness = delayed.Completeness(fixed=completeness)
        lr = learning_rate or spec.training.learning_rate
        sparse_lr = sparse_learning_rate or spec.training.sparse_learning_rate or lr
        torch.manual_seed(spec.training.seed if seed is None else seed)
        self.model = TwoTowerModel(
            spec.features, spec.model, two_towers=modes.two_towers(self.mode), sparse_lr=sparse_lr, options=options
        )
        self.optimizers: dict[str, torch.optim.Optimizer] = {
            "memory": torch.optim.Adam(self.model.memory_parameters(), lr=lr)
        }
        if modes.two_towers(self.mode):
            self.optimizers["adapt"] = torch.optim.Adam(self.model.adapt_parameters(), lr=lr)
        if self.blending:
            self.optimizers["serve"] = torch.optim.Adam(self.model.blend_parameters(), lr=lr)
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.sparse: torch.optim.Optimizer | None = None  # replicated embeddings: stepped after the all-reduce
        if self.model.options.replicated:
            from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

            self.sparse = RowWiseAdagrad(self.model.embeddings.parameters(), lr=sparse_lr)

    def graph_for(self, kind: str) -> str:
        """Which computation graph a minibatch of ``kind`` runs (mode routing)."""
        return modes.graph_for(self.mode, kind)

    def updates_embeddings(self, kind: str) -> bool:
        return modes.updates_embeddings(self.mode, self.embedding_updates, kind)

    def step(self, kind: str, batch: Batch) -> StepResult:
        graph = self.graph_for(kind)
        if not self.model.training:  # train() walks every module: only after predict()
            self.model.train()
        x = self.tower_inputs(kind, batch)
        if self.correction != "none":
            self.completeness.update(kind, batch.labels)
        per_row, logit = self.forward_loss(kind, graph, x, batch.labels)
        loss = per_row.mean()
        optimizers = self.stepped(kind, graph)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()  # the fused row-wise Adagrad updates the touched embedding rows here
        for optimizer in optimizers:
            optimizer.step()
        if kind == "batch":
            self.memory_rows += batch.size
        return StepResult(graph, float(loss.detach()), torch.sigmoid(logit.detach()).numpy())

    def tower_inputs(self, kind: str, batch: Batch) -> torch.Tensor:
        """The towers' inputs: a kind that must not update the tables detaches them; batch steps
        scale their gradient by ``batch_embedding_scale`` (the value is unchanged)."""
        emb = self.model.embed(batch.sparse)
        if not self.updates_embeddings(kind):
            emb = emb.detach()
        elif kind == "batch" and self.batch_emb_scale != 1.0:
            emb = emb * self.batch_emb_scale + emb.detach() * (1.0 - self.batch_emb_scale)
        return self.model.inputs(emb, batch.dense)

    def forward_loss(self, kind: str, graph: str, x: torch.Tensor, labels: torch.Tensor):
        """Per-row loss of ``graph`` on ``x`` and its logit: the stream correction on the adapt
        tower, plus the blend head's BCE on batch steps when serving the blend."""
        if graph == "adapt":
            logit, memory_logit = self.model.adapt_forward(x)
            c = self.completeness.value
            if self.hedge is not None:  # scored before the step: out of sample for every expert
                self.hedge.observe(logit, memory_logit, labels, c)
            return delayed.stream_loss(self.stream_correction(), logit, labels, c, memory_logit), logit
        if kind != "batch":  # a one-tower mode's stream step: the correction, its own odds as soft's teacher
            logit = self.model.memory_forward(x)[0]
            c = self.completeness.value
            return delayed.stream_loss(self.stream_correction(), logit, labels, c, logit.detach()), logit
        per_row, logit, adapt_logit = batch_rows_loss(self.model, x, labels, self.second_pass, self.second_weight)
        if self.blending:
            if adapt_logit is None:
                with torch.no_grad():
                    adapt_logit = self.model.adapt_forward(x.detach())[0]
            served = self.model.blend_logit(adapt_logit, logit)
            per_row = per_row + F.binary_cross_entropy_with_logits(served, labels, reduction="none")
        return per_row, logit

    def stream_correction(self) -> str:
        """The correction of this stream step (``soft`` may wait: ``delayed.correction_now``)."""
        return delayed.correction_now(self.correction, self.memory_rows, self.soft_after_rows)

    def stepped(self, kind: str, graph: str) -> list[torch.optim.Optimizer]:
        """The optimizers a minibatch of ``kind`` steps: its tower's, and the blend head's on batch steps."""
        extra = []
        if kind == "batch" and self.second_pass != "off":
            extra.append(self.optimizers["adapt"])
        if kind == "batch" and self.blending:
            extra.append(self.optimizers["serve"])
        return [self.optimizers[graph], *extra]

    def step_synced(self, kind: str, batch: Batch | None, global_rows: int, group) -> StepResult | None:
        """One data-parallel step: this rank's rows (``batch``; None when it has none) are part of a
        global minibatch of ``global_rows``. Only the parameters ``kind`` updates get gradients; they
        are summed over ranks (``group.reduce_grads``), so every rank applies the same update."""
        graph = self.graph_for(kind)
        if not self.model.training:
            self.model.train()
        params = self.model.adapt_parameters() if graph == "adapt" else self.model.memory_parameters()
        if self.second_pass != "off" and kind == "batch":
            params = [*params, *self.model.adapt_parameters()]
        if self.blending and kind == "batch":
            params = [*params, *self.model.blend_parameters()]
        update_emb = self.updates_embeddings(kind)
        tables = list(self.model.embeddings.parameters()) if update_emb else []
        for param in self.model.parameters():
            param.grad = None
        result = None
        if self.correction != "none":  # every rank the same c: the global minibatch's clicks
            local = (float(batch.labels.sum()), batch.size) if batch is not None and batch.size else (0.0, 0)
            clicks, rows = group.sum([local[0], float(local[1])])
            self.completeness.add(kind, clicks, int(rows))
        if batch is not None and batch.size:
            x = self.tower_inputs(kind, batch)
            per_row, logit = self.forward_loss(kind, graph, x, batch.labels)
            loss_sum = per_row.sum()
            (loss_sum / global_rows).backward()
            result = StepResult(graph, float(loss_sum.detach()) / batch.size, torch.sigmoid(logit.detach()).numpy())
        group.reduce_grads(params, tables)
        for optimizer in self.stepped(kind, graph):
            optimizer.step()
        if update_emb and self.sparse is not None:
            self.sparse.step()
        if kind == "batch":
            self.memory_rows += global_rows
        return result

    @torch.no_grad()
    def predict(self, batch: Batch, output: str | None = None) -> np.ndarray:
        """The served probability (``output`` overrides: "memory" | "adapt")."""
        self.model.eval()
        x = self.model.inputs(self.model.embed(batch.sparse), batch.dense)
        output = output or modes.served_output(self.mode, self.serve)
        if output == "blend":
            logit = self.model.blend_logit(*self.model.adapt_forward(x))
        elif output == "hedge":
            return self.hedge.predict(*self.model.adapt_forward(x)).numpy()
        else:
            logit = self.model.adapt_forward(x)[0] if output == "adapt" else self.model.memory_forward(x)[0]
        return torch.sigmoid(logit).numpy()

    # -- checkpoint state ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},
            "sparse_optimizer": self.sparse_optimizer().state_dict(),
            "completeness": self.completeness.state_dict(),
            "memory_rows": self.memory_rows,
            **({"hedge": self.hedge.state_dict()} if self.hedge is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][name])
        self.sparse_optimizer().load_state_dict(state["sparse_optimizer"])
        if "completeness" in state:  # checkpoints from before the stream correction have none
            self.completeness.load_state_dict(state["completeness"])
        self.memory_rows = int(state.get("memory_rows", 0))
        if self.hedge is not None and "hedge" in state:
            self.hedge.load_state_dict(state["hedge"])

    def sparse_optimizer(self):
        if self.sparse is not None:
            return self.sparse
        emb = self.model.embeddings
        if hasattr(emb, "fused_optimizer"):
            return emb.fused_optimizer()

        raise NotImplementedError("sparse optimizer state of a non-fused EBC comes from DMP's fused_optimizer")
