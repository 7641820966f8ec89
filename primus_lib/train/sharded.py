"""The MTRM model with its embedding tables sharded by TorchRec's DistributedModelParallel.

The data-parallel trainer (``distributed.py``) replicates every table on every rank; this
module is the path for tables that outgrow a host. ``ShardedStepper`` has the data-parallel
``Stepper``'s interface (``graph_for``, ``step_synced``, ``predict``, ``model``,
``optimizers``) so the trainer's control loop drives it unchanged:

- **Tables** are a ``ShardedEmbeddingBagCollection`` placed by an ``EmbeddingShardingPlanner``:
  ``table_wise`` only on the CPU/gloo (what works there), on CUDA the planner chooses among
  table_wise / row_wise / column_wise / table_row_wise. ``data_parallel`` is excluded: the
  in-backward optimizer does not train data-parallel tables. Each rank owns its shards; the
  fused row-wise Adagrad (``apply_optimizer_in_backward``) updates them inside backward,
  after the pooled gradients of every rank came back through the all-to-all (so a row's
  update sums every rank's gradient, as one process would).
- **Dense towers** are NOT wrapped in DDP (``init_data_parallel=False``). DMP's default
  wrapper puts one DDP (``static_graph=True``) around the whole model and arms its gradient
  sync in ``forward()``; the MTRM model is driven through its towers (``memory_forward``,
  ``adapt_forward``), so with that wrapper the tower gradients were found NOT reduced
  (2 gloo ranks), and DDP averages over ranks where our loss is a sum over the global row
  count. Instead the
  gradients of exactly the tower a step trains are summed with one flat all-reduce
  (``Group.reduce_grads``), as on the replicated path: Algorithm 1's separation holds by
  construction (tested bit-equal on every rank).
- **Embedding updates** (``spec.model.embedding_updates``): the fused optimizer updates on
  every backward that reaches the tables, so a step whose kind must not update them detaches
  the pooled embeddings (every rank takes the same kind of step: the all-to-all still runs
  forward, no gradient goes back).
- **Zero-row ranks**: every rank must join each step's all-to-alls. A rank with no rows
  joins with one dummy row (ids 0, dense 0) whose loss weight is 0: it contributes zero
  gradient to the towers and to row 0 of each table (row-wise Adagrad leaves a row with a
  zero gradient unchanged), and it returns no result.
- **Checkpoints**: ``save_sharded`` writes the model (ShardedTensors) and the fused
  optimizer state per rank with torch.distributed.checkpoint (DCP) into a hidden temp
  directory, then rank 0 renames it after a barrier: a reader sees all of it or none.
  ``load_sharded`` reads it back into a freshly built sharded model. ``checkpoint_state`` /
  ``load_state_dict`` put that under the trainer's checkpoints directory and hand
  ``save_checkpoint`` a small reference instead of the weights. On S3/WebHDFS the trainer's
  checkpoints directory holds them too (local staging, upload, ``meta.json`` last).
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from primus_lib.spec.job import PrimusJob
from primus_lib.storage import StorageLocation, locate
from primus_lib.train import delayed, modes
from primus_lib.train.batch import Batch
from primus_lib.train.distributed import Group
from primus_lib.train.model import ModelOptions, TwoTowerModel
from primus_lib.train.sharded_checkpoint import MODELS, prune_models
from primus_lib.train.steps import StepResult, batch_rows_loss

# The planner warns on every build that it wants a TopologyFactory; DMP builds its own Topology the same way.
logging.getLogger("torchrec.distributed.planner.types").setLevel(logging.ERROR)

CPU_SHARDING_TYPES = ("table_wise",)
CUDA_SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise")
CPU_CAPABLE = ("table_wise", "column_wise", "table_column_wise")  # the CPU kernels (row_wise & co: CUDA only)
KNOWN_TYPES = (*CUDA_SHARDING_TYPES, "table_column_wise")
SHARDING_ENV = "PRIMUS_SHARDING"  # replicate (default) | dmp
TYPES_ENV = "PRIMUS_SHARDING_TYPES"  # comma list overriding sharding_types()


def sharding_types(device: torch.device) -> tuple[str, ...]:
    """The sharding types the planner may choose on ``device`` (``$PRIMUS_SHARDING_TYPES`` overrides).

    Default: table_wise on the CPU (gloo), table/row/column/table_row_wise on CUDA. data_parallel is
    never offered: the in-backward optimizer does not train data-parallel tables.
    """
    raw = os.environ.get(TYPES_ENV, "").strip()
    if not raw:
        return CUDA_SHARDING_TYPES if device.type == "cuda" else CPU_SHARDING_TYPES
    types = tuple(t.strip() for t in raw.split(",") if t.strip())
    unknown = [t for t in types if t not in KNOWN_TYPES]
    if unknown:
        raise ValueError(f"${TYPES_ENV}: unknown sharding types {unknown}; expected some of {list(KNOWN_TYPES)}")
    if device.type != "cuda":
        cuda_only = [t for t in types if t not in CPU_CAPABLE]
        if cuda_only:
            raise ValueError(f"${TYPES_ENV}: {cuda_only} need CUDA kernels; on the CPU use {list(CPU_CAPABLE)}")
    return types


def make_stepper(job: PrimusJob, *, mode: str | None = None, group: Group | None = None, options=None):
    """The trainer's Stepper: DMP-sharded when ``$PRIMUS_SHARDING=dmp`` under torchrun, else the
    existing one (replicated tables with several ranks, the fused collection in one process)."""
    from primus_lib.train.steps import Stepper

    choice = os.environ.get(SHARDING_ENV, "replicate").strip().lower()
    if choice not in ("replicate", "dmp"):
        raise ValueError(f"${SHARDING_ENV}: expected 'replicate' or 'dmp', got {choice!r}")
    group = group or Group()
    if choice == "dmp" and group.active:
        from primus_lib.paths import JobPaths

        return ShardedStepper(job, mode=mode, options=options, checkpoint_root=JobPaths.for_job(job).checkpoints)
    if group.active and options is None:
        options = ModelOptions(replicated=True)
    return Stepper(job, mode=mode, options=options)


def build_sharded_model(
    job: PrimusJob,
    *,
    two_towers: bool,
    sparse_lr: float,
    device: torch.device,
    options: ModelOptions | None = None,
    types: tuple[str, ...] | None = None,
):
    """The two-tower model with its EmbeddingBagCollection sharded by DMP (collective: every rank calls).

    Returns the ``DistributedModelParallel``; ``dmp.module`` is the ``TwoTowerModel`` whose
    ``embeddings`` is the sharded collection, ``dmp.plan`` the plan every rank agreed on.
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv

    if not dist.is_initialized():
        raise RuntimeError("the DMP-sharded model needs a process group: start `primus train` under torchrun")
    options = options or ModelOptions()
    if options.replicated or options.fused:
        options = ModelOptions(aux=options.aux, adapt_residual=options.adapt_residual, fused=False, replicated=False)
    spec = job.spec
    model = TwoTowerModel(spec.features, spec.model, two_towers=two_towers, sparse_lr=sparse_lr, options=options)
    types = types or sharding_types(device)
    constraints = {f"t_{f.name}": ParameterConstraints(sharding_types=list(types)) for f in spec.features.sparse}
    world = dist.get_world_size()
    topology = Topology(world_size=world, local_world_size=_local_world(world), compute_device=device.type)
    sharders = [EmbeddingBagCollectionSharder()]
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
        device=device,
        plan=plan,
        sharders=sharders,
        init_data_parallel=False,
    )


def _local_world(world: int) -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))


def table_placement(dmp) -> dict[str, list[tuple[str, list[int]]]]:
    """``{table: [(sharding type, ranks holding a shard)]}`` from the plan (for logs and tests)."""
    out: dict[str, list[tuple[str, list[int]]]] = {}
    for module_plan in dmp.plan.plan.values():
        for table, param in module_plan.items():
            out.setdefault(table, []).append((param.sharding_type, sorted(param.ranks or [])))
    return out


class ShardedStepper:
    """Algorithm 1 on the DMP-sharded model; the data-parallel ``Stepper``'s interface.

    Construction, ``step_synced``, ``predict``, ``checkpoint_state`` and ``load_state_dict`` are
    collective: every rank calls them in the same order.
    """

    sharded = True

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
        device: torch.device | None = None,
        types: tuple[str, ...] | None = None,
        checkpoint_root: Path | StorageLocation | None = None,
    ):
        spec = job.spec
        self.job = job
        self.checkpoint_root = locate(checkpoint_root) if checkpoint_root is not None else None
        self.mode = mode or spec.training.mode
        self.embedding_updates = embedding_updates or spec.model.embedding_updates
        self.serve = serve or spec.model.serve
        if modes.two_towers(self.mode) and self.serve == "blend":
            raise NotImplementedError("the DMP-sharded stepper serves one tower: spec.model.serve blend needs "
                                      "the replicated Stepper")  # fmt: skip
        self.correction = spec.model.stream_correction if modes.two_towers(self.mode) else "none"
        self.soft_after_rows = spec.model.soft_after_rows
        self.memory_rows = 0  # complete-labelled rows the memory tower has trained on (delayed.correction_now)
        self.second_pass = spec.model.complete_label_pass if modes.two_towers(self.mode) else "off"
        self.second_weight = spec.model.complete_label_weight
        both = self.embedding_updates == "both"  # one kind alone moving the tables: Adagrad is scale-free
        self.batch_emb_scale = spec.model.batch_embedding_scale if modes.two_towers(self.mode) and both else 1.0
        self.completeness = delayed.Completeness()  # not checkpointed here: re-estimated after a resume
        lr = learning_rate or spec.training.learning_rate
        sparse_lr = sparse_learning_rate or spec.training.sparse_learning_rate or lr
        if device is None:  # torchrun: one GPU per local rank (not run here: no GPU)
            cuda = torch.cuda.is_available()
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.device = device
        torch.manual_seed(spec.training.seed if seed is None else seed)
        self.dmp = build_sharded_model(
            job,
            two_towers=modes.two_towers(self.mode),
            sparse_lr=sparse_lr,
            device=self.device,
            options=options,
            types=types,
        )
        self.model: TwoTowerModel = self.dmp.module
        for tower in (
            self.model.memory,
            self.model.memory_head,
            getattr(self.model, "adapt", None),
            getattr(self.model, "adapt_head", None),
        ):
            if tower is not None:
                tower.to(self.device)  # the sharded tables already live on their device
        self.group = Group()
        self._broadcast_dense()
        self.optimizers: dict[str, torch.optim.Optimizer] = {
            "memory": torch.optim.Adam(self.model.memory_parameters(), lr=lr)
        }
        if modes.two_towers(self.mode):
            self.optimizers["adapt"] = torch.optim.Adam(self.model.adapt_parameters(), lr=lr)
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.sparse = None  # the tables' optimizer is fused into backward (dmp.fused_optimizer)
        self._pad = self._dummy_batch()

    # -- routing (same as Stepper) -------------------------------------------------------
    def graph_for(self, kind: str) -> str:
        return modes.graph_for(self.mode, kind)

    def updates_embeddings(self, kind: str) -> bool:
        return modes.updates_embeddings(self.mode, self.embedding_updates, kind)

    def dense_parameters(self) -> list[nn.Parameter]:
        return [*self.model.memory_parameters(), *self.model.adapt_parameters()]

    # -- steps -----------------------------------------------------------------------------
    def step_synced(
        self, kind: str, batch: Batch | None, global_rows: int, group: Group | None = None
    ) -> StepResult | None:
        """One step of ``kind`` on every rank together (collective).

        ``batch`` is this rank's rows (None or empty: it joins with a weight-0 dummy row); the
        loss is this rank's BCE sum over ``global_rows``; the sharded tables are updated in
        backward (when ``kind`` updates embeddings), the tower ``kind`` trains after the
        gradient all-reduce.
        """
        group = group or self.group
        graph = self.graph_for(kind)
        self.model.train()
        params = self.model.adapt_parameters() if graph == "adapt" else self.model.memory_parameters()
        second = kind == "batch" and self.second_pass != "off"  # the complete labels through the served tower
        if second:
            params = [*params, *self.model.adapt_parameters()]
        for param in self.dense_parameters():
            param.grad = None
        real = batch is not None and batch.size > 0
        use = batch if real else self._pad
        sparse = use.sparse.to(self.device)
        dense, labels = use.dense.to(self.device), use.labels.to(self.device)
        emb = self.model.embed(sparse)
        if not self.updates_embeddings(kind):
            emb = emb.detach()  # no gradient reaches the tables: the fused optimizer does not run
        elif kind == "batch" and self.batch_emb_scale != 1.0:  # as in Stepper.tower_inputs
            emb = emb * self.batch_emb_scale + emb.detach() * (1.0 - self.batch_emb_scale)
        x = self.model.inputs(emb, dense)
        if self.correction != "none":  # every rank the same c: the global minibatch's clicks
            clicks, rows = group.sum([float(labels.sum()) if real else 0.0, float(batch.size) if real else 0.0])
            self.completeness.add(kind, clicks, int(rows))
        if graph == "adapt":  # MTRM's stream correction (delayed.py), as in the replicated Stepper
            logit, memory_logit = self.model.adapt_forward(x)
            correction = delayed.correction_now(self.correction, self.memory_rows, self.soft_after_rows)
            per_row = delayed.stream_loss(correction, logit, labels, self.completeness.value, memory_logit)
        elif kind == "batch":
            per_row, logit, _ = batch_rows_loss(self.model, x, labels, self.second_pass, self.second_weight)
        else:
            logit = self.model.memory_forward(x)[0]
            per_row = nn.functional.binary_cross_entropy_with_logits(logit, labels, reduction="none")
        weight = 1.0 if real else 0.0
        loss_sum = per_row.sum() * weight
        (loss_sum / max(global_rows, 1)).backward()  # every rank: the tables' all-to-all backward is collective
        group.reduce_grads(params)
        self.optimizers[graph].step()
        if second:
            self.optimizers["adapt"].step()
        if kind == "batch":
            self.memory_rows += global_rows
        if not real:
            return None
        probs = torch.sigmoid(logit.detach()).cpu().numpy()
        return StepResult(graph, float(loss_sum.detach()) / batch.size, probs)

    @torch.no_grad()
    def predict(self, batch: Batch | None, output: str | None = None) -> np.ndarray:
        """The served probability of this rank's rows (collective: every rank calls, None = no rows)."""
        self.model.eval()
        use = batch if batch is not None and batch.size else self._pad
        x = self.model.inputs(self.model.embed(use.sparse.to(self.device)), use.dense.to(self.device))
        output = output or modes.served_output(self.mode, self.serve)
        logit = self.model.adapt_forward(x)[0] if output == "adapt" else self.model.memory_forward(x)[0]
        probs = torch.sigmoid(logit).cpu().numpy()
        return probs if batch is not None and batch.size else probs[:0]

    def _dummy_batch(self) -> Batch:
        from torchrec import KeyedJaggedTensor

        keys = self.model.keys
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.zeros(len(keys), dtype=torch.int64),
            lengths=torch.ones(len(keys), dtype=torch.int64),
        )
        return Batch(
            sparse=sparse,
            dense=torch.zeros(1, self.model.n_dense),
            labels=torch.zeros(1),
            ts=np.zeros(1, np.int64),
        )

    def _broadcast_dense(self) -> None:
        """Every rank starts its towers from rank 0's weights (the tables are owned, not copied)."""
        for param in self.dense_parameters():
            dist.broadcast(param.data, src=0)

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        raise RuntimeError(
            "a DMP-sharded model has no single-process state: call checkpoint_state(step) on every rank "
            "and pass the reference it returns to save_checkpoint"
        )

    def checkpoint_state(self, step: int) -> dict:
        """Save the sharded model under ``<checkpoint_root>/sharded/`` (collective); the small
        reference it returns is what rank 0 stores as the checkpoint's ``state``.

        The model directory is durable before the checkpoint that names it is committed; model
        directories no committed checkpoint names (a run killed in between) are pruned first.
        """
        root = self._root()
        if self.group.rank == 0:
            prune_models(root)
        nonce = self.group.broadcast(uuid.uuid4().hex[:8])
        name = f"{MODELS}/model-{step:010d}-{nonce}"
        if isinstance(root, Path):  # S3/WebHDFS have no directories to make
            (root / MODELS).mkdir(parents=True, exist_ok=True)
        self.save_sharded(root / name, extra={"step": step})
        return {"sharded_model": name, "memory_rows": self.memory_rows}

    def load_state_dict(self, state: dict) -> None:
        """Restore from a reference ``checkpoint_state`` returned (collective, like every rank's
        ``load_state_dict`` in the data-parallel restore)."""
        if "sharded_model" not in state:
            raise ValueError(
                "checkpoint state holds no 'sharded_model' reference: it was written by the replicated "
                f"trainer (keys {sorted(state)}); resume it without ${SHARDING_ENV}=dmp"
            )
        self.load_sharded(self._root() / state["sharded_model"])
        self.memory_rows = int(state.get("memory_rows", 0))

    def _root(self) -> Path | StorageLocation:
        if self.checkpoint_root is None:
            raise RuntimeError(
                "ShardedStepper(checkpoint_root=...) is needed to checkpoint (the trainer's checkpoints dir)"
            )
        return self.checkpoint_root

    def save_sharded(self, directory: Path | StorageLocation, extra: dict | None = None) -> Path | StorageLocation:
        """Write a DCP checkpoint to ``directory`` atomically (collective; ``sharded_checkpoint.py``)."""
        from primus_lib.train.sharded_checkpoint import save_dcp

        plan = {t: [[s, r] for s, r in v] for t, v in table_placement(self.dmp).items()}
        return save_dcp(self, directory, extra, plan)

    def load_sharded(self, directory: Path | StorageLocation) -> dict:
        """Load a ``save_sharded`` directory into this (freshly built) sharded model (collective)."""
        from primus_lib.train.sharded_checkpoint import load_dcp

        return load_dcp(self, directory)
