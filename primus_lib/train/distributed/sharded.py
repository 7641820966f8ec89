"""The MTRM model with its embedding tables sharded by TorchRec's DistributedModelParallel.

The data-parallel trainer (``distributed.py``) replicates every table on every rank; this
module is the path for tables that outgrow a host (``spec.training.sharding: dmp`` under torchrun).
``ShardedStepper`` is a ``steps.Stepper`` on the same ``StepConfig`` and ``objective.forward`` as the
local one, so the trainer's control loop drives it unchanged:

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
- **Embedding updates**: the fused optimizer updates on every backward that reaches the tables;
  the adapt tower reads the shared tables detached and moves only its fresh ones (``network.py``),
  on every rank alike.
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
import uuid
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from primus_lib.settings import settings
from primus_lib.spec.job import PrimusJob
from primus_lib.storage import StorageLocation, Where, locate
from primus_lib.train.checkpoint.sharded import MODELS, prune_models
from primus_lib.train.distributed.group import Group
from primus_lib.train.model.batch import Batch
from primus_lib.train.model.network import TwoTowerModel, table_names
from primus_lib.train.model.objective import Evidence, StepConfig, StepResult, forward, predict_probs, progressive_probs
from primus_lib.train.model.tower_adam import TowerAdam

# The planner warns on every build that it wants a TopologyFactory; DMP builds its own Topology the same way.
logging.getLogger("torchrec.distributed.planner.types").setLevel(logging.ERROR)

CPU_SHARDING_TYPES = ("table_wise",)
CUDA_SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise")
CPU_CAPABLE = ("table_wise", "column_wise", "table_column_wise")  # the CPU kernels (row_wise & co: CUDA only)


def sharding_types(device: torch.device, wanted: Sequence[str] | None = None) -> tuple[str, ...]:
    """The sharding types the planner may choose on ``device`` (``spec.training.sharding_types`` overrides).

    Default: table_wise on the CPU (gloo), table/row/column/table_row_wise on CUDA. data_parallel is
    never offered: the in-backward optimizer does not train data-parallel tables.
    """
    if not wanted:
        return CUDA_SHARDING_TYPES if device.type == "cuda" else CPU_SHARDING_TYPES
    if device.type != "cuda":
        cuda_only = [t for t in wanted if t not in CPU_CAPABLE]
        if cuda_only:
            raise ValueError(
                f"spec.training.sharding_types: {cuda_only} need CUDA kernels; on the CPU use {list(CPU_CAPABLE)}"
            )
    return tuple(wanted)


def build_sharded_model(
    job: PrimusJob, *, two_towers: bool, sparse_lr: float, device: torch.device, types: tuple[str, ...] | None = None
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
    spec = job.spec
    model = TwoTowerModel(spec.features, spec.model, two_towers=two_towers, sparse_lr=sparse_lr, tables="sharded")
    types = types or sharding_types(device, spec.training.sharding_types)
    constraints = {
        name: ParameterConstraints(sharding_types=list(types)) for name in table_names(spec.features, two_towers)
    }
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
    return settings().local_world_size or world


def table_placement(dmp) -> dict[str, list[tuple[str, list[int]]]]:
    """``{table: [(sharding type, ranks holding a shard)]}`` from the plan (for logs and tests)."""
    out: dict[str, list[tuple[str, list[int]]]] = {}
    for module_plan in dmp.plan.plan.values():
        for table, param in module_plan.items():
            out.setdefault(table, []).append((param.sharding_type, sorted(param.ranks or [])))
    return out


class ShardedStepper:
    """MTRM's step on the DMP-sharded model (a ``steps.Stepper``).

    Construction, ``step``, ``predict``, ``checkpoint_state`` and ``load_state_dict`` are
    collective: every rank calls them in the same order.
    """

    syncs_towers = True
    before_backward: Callable[[], None] | None = None  # as LocalStepper's

    def __init__(
        self,
        job: PrimusJob,
        config: StepConfig | None = None,
        *,
        device: torch.device | None = None,
        types: tuple[str, ...] | None = None,
        checkpoint_root: Where | None = None,
        **overrides,
    ):
        self.config = config or StepConfig.resolve(job, **overrides)
        self.job = job
        self.checkpoint_root = locate(checkpoint_root) if checkpoint_root is not None else None
        self.evidence = Evidence(self.config)
        if device is None:  # torchrun: one GPU per local rank
            cuda = torch.cuda.is_available()
            device = torch.device("cuda", settings().local_rank or 0) if cuda else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.device = device
        torch.manual_seed(self.config.seed)
        self.dmp = build_sharded_model(
            job,
            two_towers=self.config.two_towers,
            sparse_lr=self.config.sparse_learning_rate,
            device=self.device,
            types=types,
        )
        self.model: TwoTowerModel = self.dmp.module
        for name in ("memory", "memory_head", "adapt", "adapt_head", "reread", "reread_head"):
            if hasattr(self.model, name):
                getattr(self.model, name).to(self.device)  # the sharded tables already live on their device
        self.group = Group()
        self._broadcast_dense()
        lr = self.config.learning_rate
        # the parameters' lists, once (as LocalStepper's): a step would otherwise walk the modules for them
        self.tower_params = {t: self.model.tower_parameters(t) for t in self.config.towers("stream")}
        self.optimizer = TowerAdam(self.tower_params, lr)
        self._pad = self._dummy_batch()

    @property
    def mode(self) -> str:
        return self.config.mode

    def dense_parameters(self) -> list[nn.Parameter]:
        return self.model.dense_parameters()

    # -- steps -----------------------------------------------------------------------------
    def step(
        self, kind: str, batch: Batch | None, global_rows: int | None = None, group: Group | None = None
    ) -> StepResult | None:
        """One step of ``kind`` on every rank together (collective).

        ``batch`` is this rank's rows (None or empty: it joins with a weight-0 dummy row); the
        loss is this rank's loss sum over ``global_rows`` (required: the ranks agree on it); the
        sharded tables are updated in backward, the towers ``kind`` trains after the gradient all-reduce.
        """
        if global_rows is None:
            raise ValueError("a sharded step needs global_rows: the rows of the step over every rank")
        group = group or self.group
        self.model.train()
        for param in self.dense_parameters():
            param.grad = None
        real = batch if batch is not None and batch.size > 0 else None
        use = real if real is not None else self._pad
        sparse = use.sparse.to(self.device)
        dense, labels = use.dense.to(self.device), use.labels.to(self.device)
        x = self.model.features(sparse, dense, fresh=kind == "stream")
        self.evidence.before_step(
            kind, real.keys if real is not None else None, labels if real is not None else None, group
        )
        out = forward(self.model, self.config, kind, x, labels, self.evidence)
        if real is not None:
            self.evidence.after_forward(kind, out, labels, real.keys)
        loss_sum = out.loss.sum() * (1.0 if real is not None else 0.0)
        if self.before_backward is not None:
            self.before_backward()
        (loss_sum / max(global_rows, 1)).backward()  # every rank: the tables' all-to-all backward is collective
        group.reduce_grads([p for t in out.towers for p in self.tower_params[t]])
        self.optimizer.step()  # the towers ``kind`` does not train have no gradients: Adam skips them
        if real is None:
            return None
        probs = progressive_probs(self.config, out, self.evidence)
        return StepResult(out.towers, float(loss_sum.detach()) / real.size, probs)

    @torch.no_grad()
    def predict(self, batch: Batch | None, output: str | None = None) -> np.ndarray:
        """The served probability of this rank's rows (collective: every rank calls, None = no rows)."""
        self.model.eval()
        use = batch if batch is not None and batch.size else self._pad
        fresh = self.config.served(output) != "memory"  # the same on every rank: the lookups are collective
        x = self.model.features(use.sparse.to(self.device), use.dense.to(self.device), fresh=fresh)
        probs = predict_probs(self.model, self.config, x, self.evidence, output).cpu().numpy()
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
        self.save_sharded(root / name, extra={"step": step})
        return {"sharded_model": name, "evidence": self.evidence.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore from a reference ``checkpoint_state`` returned (collective, like every rank's
        ``load_state_dict`` in the data-parallel restore)."""
        if "sharded_model" not in state:
            raise ValueError(
                "checkpoint state holds no 'sharded_model' reference: it was written by the replicated "
                f"trainer (keys {sorted(state)}); resume it without spec.training.sharding: dmp"
            )
        self.load_sharded(self._root() / state["sharded_model"])
        self.evidence.load_state_dict(state["evidence"], self.group.rank)

    def _root(self) -> StorageLocation:
        if self.checkpoint_root is None:
            raise RuntimeError(
                "ShardedStepper(checkpoint_root=...) is needed to checkpoint (the trainer's checkpoints dir)"
            )
        return locate(self.checkpoint_root)

    def save_sharded(self, directory: Where, extra: dict | None = None) -> StorageLocation:
        """Write a DCP checkpoint to ``directory`` atomically (collective; ``sharded_checkpoint.py``)."""
        from primus_lib.train.checkpoint.sharded import save_dcp

        plan = {t: [[s, r] for s, r in v] for t, v in table_placement(self.dmp).items()}
        return save_dcp(self, directory, extra, plan)

    def load_sharded(self, directory: Where) -> dict:
        """Load a ``save_sharded`` directory into this (freshly built) sharded model (collective)."""
        from primus_lib.train.checkpoint.sharded import load_dcp

        return load_dcp(self, directory)
