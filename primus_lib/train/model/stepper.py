"""The steppers: who runs a minibatch's step (``objective.py``) on which tables.

``Stepper`` is the protocol the training loop drives; ``LocalStepper`` owns a model whose tables
live in this process (fused: one process; replicated: every data-parallel rank holds them all and
sums the gradients), ``sharded.ShardedStepper`` one whose tables TorchRec's DMP shards across
ranks. Both read one ``StepConfig`` resolved from the spec, so a mode means the same on both.
Each tower has its own Adam (one optimizer, a group per tower: ``tower_adam.py``), moved by the
minibatch kinds that train it (``objective.py``'s table), each on its own loss (the adapt tower's never
reaches the memory tower or the shared tables).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Protocol

import numpy as np
import torch

from primus_lib.spec.job import PrimusJob
from primus_lib.train.distributed.group import Group, launched_by_torchrun
from primus_lib.train.model.batch import Batch
from primus_lib.train.model.network import Tables, TwoTowerModel, current_name
from primus_lib.train.model.objective import Evidence, StepConfig, StepResult, forward, predict_probs, progressive_probs
from primus_lib.train.model.tower_adam import TowerAdam

__all__ = ["LocalStepper", "StepConfig", "StepResult", "Stepper", "make_stepper"]


class Stepper(Protocol):
    """What the training loop and its coordinators ask of a stepper."""

    config: StepConfig
    model: TwoTowerModel
    syncs_towers: bool  # True: it broadcasts its starting towers itself (collective construction)
    before_backward: Callable[[], None] | None  # called just before each backward pass (the GIL is free then)

    @property
    def mode(self) -> str: ...

    def step(
        self, kind: str, batch: Batch | None, global_rows: int | None = None, group: Group | None = None
    ) -> StepResult | None: ...

    def predict(self, batch: Batch, output: str | None = None) -> np.ndarray: ...

    def state_dict(self) -> dict: ...

    def checkpoint_state(self, step: int) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def table_sharding(job: PrimusJob) -> str:
    """``spec.training.sharding``, else ``dmp`` for a trainer with GPUs: only the sharded model puts its
    tables and towers on a GPU, so a GPU trainer left at ``replicate`` would train on its CPU."""
    if job.spec.training.sharding is not None:
        return job.spec.training.sharding
    return "dmp" if job.trainer_gpus else "replicate"


def make_stepper(job: PrimusJob, config: StepConfig, group) -> Stepper:
    """The trainer's stepper: DMP-sharded tables under torchrun when the job shards them (any world
    size: a one-GPU trainer is a world of one), replicated tables for several ranks, the fused
    collection in one process."""
    if launched_by_torchrun() and table_sharding(job) == "dmp":
        from primus_lib.paths import JobPaths
        from primus_lib.train.distributed.sharded import ShardedStepper

        return ShardedStepper(job, config, checkpoint_root=JobPaths.for_job(job).checkpoints)
    return LocalStepper(job, config, tables="replicated" if group.active else "fused")


class LocalStepper:
    """A model whose tables this process holds; one step of one minibatch kind at a time."""

    syncs_towers = False
    # called as each backward pass starts, which runs without the GIL (the trainer's prefetch thread works then)
    before_backward: Callable[[], None] | None = None

    def __init__(self, job: PrimusJob, config: StepConfig | None = None, *, tables: Tables = "fused", **overrides):
        self.config = config or StepConfig.resolve(job, **overrides)
        spec = job.spec
        self.evidence = Evidence(self.config)
        self.group = Group()  # this process's world (a world of one unless under torchrun)
        torch.manual_seed(self.config.seed)
        self.model = TwoTowerModel(
            spec.features,
            spec.model,
            two_towers=self.config.two_towers,
            sparse_lr=self.config.sparse_learning_rate,
            tables=tables,
        )
        lr = self.config.learning_rate
        # the parameters' lists, once: a step would otherwise walk the modules for them (~30 times)
        self.tower_params = {t: self.model.tower_parameters(t) for t in self.config.towers("stream")}
        self.optimizer = TowerAdam(self.tower_params, lr)
        self.params = list(self.model.parameters())
        self.tables = self.model.table_parameters()
        self._beside: ThreadPoolExecutor | None = None  # MTRM's bookkeeping of a step, beside its backward
        self._retired: list = []  # for the next step's helper to free: the last step's graph, ``release``d objects
        self.sparse: torch.optim.Optimizer | None = None  # replicated tables: stepped after the all-reduce
        if tables == "replicated":
            from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

            self.sparse = RowWiseAdagrad(self.tables, lr=self.config.sparse_learning_rate)

    @property
    def mode(self) -> str:
        return self.config.mode

    def _forward(self, kind: str, batch: Batch):
        if not self.model.training:  # train() walks every module: only after predict()
            self.model.train()
        x = self.model.features(batch.sparse, batch.dense, fresh=kind == "stream")
        return forward(self.model, self.config, kind, x, batch.labels, self.evidence)

    def _after_forward(self, kind: str, out, batch: Batch, scores: Callable[[], None] | None = None) -> np.ndarray:
        """A batch step's deferred ``scores`` of its copies; the stream rows' record and scores
        (``Evidence.after_forward``); then the step's progressive predictions."""
        if scores is not None:
            scores()
        self.evidence.after_forward(kind, out, batch.labels, batch.keys)
        return progressive_probs(self.config, out, self.evidence)

    def _beside_backward(
        self, kind: str, out, batch: Batch, scores: Callable[[], None] | None, then: Callable[[np.ndarray], Any] | None
    ) -> tuple[Future | None, Future | None]:
        """``_after_forward`` on a helper thread while backward runs (which frees the GIL; its kernels keep
        to the cores torch was given), then the caller's ``then`` with its predictions. Nothing either reads
        or writes is backward's; the step waits for the first before its update, never for ``then``. On
        bench/train.py's minibatches MTRM's is ~0.5 ms of a 4-5 ms stream step (the rows' record, the
        validation's scores, the served mixture) and ~0.2 ms of a batch step (its copies' scores). (None,
        None): too little to hand over alone (the single tower's record, ~0.1 ms: no faster beside); the
        step does it after backward.

        Then the helper frees the graph the last step kept and what the caller ``release``d, which the
        training thread freed between steps (bench/train.py: the graph 0.11 ms a single-tower step, 0.15 ms
        an MTRM one; the loop's minibatch 0.04-0.06 ms)."""
        # the list is their only holder: whichever thread empties it frees them (no helper this step: this
        # one, as it returns)
        retired, self._retired = self._retired, []
        if then is None and scores is None and (kind != "stream" or out.adapt_logit is None):
            return None, None
        if self._beside is None:
            self._beside = ThreadPoolExecutor(1, thread_name_prefix="primus-step")
        probs = self._beside.submit(self._after_forward, kind, out, batch, scores)
        # one worker, in order: ``then`` starts once the predictions are done
        follow = self._beside.submit(lambda: then(probs.result())) if then is not None else None
        if retired:
            self._beside.submit(retired.clear)
        return probs, follow

    def release(self, obj: object) -> None:
        """Hand ``obj``, which the caller holds no more, to the next step's helper to free, beside backward."""
        self._retired.append(obj)

    def step(
        self,
        kind: str,
        batch: Batch | None,
        global_rows: int | None = None,
        group: Group | None = None,
        *,
        then: Callable[[np.ndarray], Any] | None = None,
    ) -> StepResult | None:
        """One step. In a data-parallel world this rank's rows (``batch``; None when it has none) are part
        of a global minibatch of ``global_rows``: the gradients of the towers ``kind`` trains and of the
        tables are summed over ranks (``group.reduce_grads``), so every rank applies the same update.
        Alone (no ``group``), the minibatch is the batch.

        ``then(probs)`` (the training loop's own work on the step: ``loop.Trainer._after_step``) runs on the
        step's helper thread beside backward and the update; ``StepResult.then`` is its future. It is not
        called for a step without rows."""
        group = group or self.group
        if global_rows is None:
            if batch is None:
                raise ValueError("a step without rows needs global_rows: the rows of the step over every rank")
            global_rows = batch.size
        towers = self.config.towers(kind)
        for param in self.params:
            param.grad = None
        real = batch if batch is not None and batch.size > 0 else None
        scores = self.evidence.before_step(
            kind, real.keys if real is not None else None, real.labels if real is not None else None, group, defer=True
        )
        result = None
        handed: list[Future | None] = []
        try:
            if real is None:
                if scores is not None:  # no backward to run beside
                    scores()
            else:
                out = self._forward(kind, real)
                loss_sum = out.loss.sum()
                scaled = loss_sum / global_rows

                def hand_over(*_) -> None:  # backward's first node: the GIL stays free from here on
                    handed.extend(self._beside_backward(kind, out, real, scores, then))
                    if self.before_backward is not None:
                        self.before_backward()

                hook = scaled.grad_fn.register_prehook(hand_over)
                # the graph lives to the end of the step: backward freeing each saved tensor would take the
                # GIL (torch drops its Python object), waiting on the helper threads every time
                scaled.backward(retain_graph=True)  # fused tables: row-wise Adagrad runs inside backward
                hook.remove()
                beside, follow = handed
                if beside is None:
                    probs = self._after_forward(kind, out, real, scores)
                else:
                    probs = beside.result()
                    self._retired.append((out, scaled, loss_sum))  # the graph: the next step's helper frees it
                result = StepResult(out.towers, float(loss_sum.detach()) / real.size, probs, follow)
            if group.active:
                group.reduce_grads([p for t in towers for p in self.tower_params[t]], self.tables)
            self.optimizer.step()  # the towers ``kind`` does not train have no gradients: Adam skips them
            if self.sparse is not None:
                self.sparse.step()
        except BaseException:
            # the caller never sees this step's ``then``: let the helper finish it (its own error stays in its
            # future) before the caller, unwinding, closes what it reads
            wait([f for f in handed if f is not None])
            raise
        return result

    @torch.no_grad()
    def predict(self, batch: Batch, output: str | None = None) -> np.ndarray:
        """The served probability (``output`` overrides it: one of ``spec.model.serve``'s values)."""
        self.model.eval()
        x = self.model.features(batch.sparse, batch.dense, fresh=self.config.served(output) != "memory")
        return predict_probs(self.model, self.config, x, self.evidence, output).numpy()

    # -- checkpoint state ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizers": self.optimizer.state_dict(),
            "sparse_optimizer": self.sparse_optimizer().state_dict(),
            "evidence": self.evidence.state_dict(),
        }

    def checkpoint_state(self, step: int) -> dict:
        """What a checkpoint stores of this stepper: its whole state (the sharded one stores a reference)."""
        return self.state_dict()

    def load_state_dict(self, state: dict) -> None:
        weights = {current_name(name): w for name, w in state["model"].items()}  # either layout (network.py)
        missing = [name for name in self.model.state_dict() if name not in weights]
        if missing:
            raise ValueError(
                f"the checkpoint lacks {len(missing)} of the model's weights ({', '.join(missing[:3])}...): another "
                "model wrote it (mode, features or a Primus before MTRM's fresh tables or its reread tower); resume it "
                "with the spec and version that wrote it, or start the job afresh"
            )
        self.model.load_state_dict(weights)
        self.optimizer.load_state_dict(state["optimizers"])
        self.sparse_optimizer().load_state_dict(state["sparse_optimizer"])
        self.evidence.load_state_dict(state["evidence"], self.group.rank)

    def sparse_optimizer(self):
        return self.sparse if self.sparse is not None else self.model.embeddings.fused_optimizer()
