"""torchrun support: process-group start-up (gloo on CPU, nccl on GPU).

Under ``torchrun --nproc-per-node N primus train SPEC`` every rank runs the same trainer.
This build trains with one rank only: a world size above one is refused with a clear error
rather than training silently on diverging replicas (see docs/training.md for the sharded
design: DistributedModelParallel over a non-fused EBC, rank 0 reading and scattering
minibatches). Not run on a GPU here.
"""

from __future__ import annotations

import os

import torch


def world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def maybe_init_distributed() -> None:
    rank, size = world()
    if "MASTER_ADDR" not in os.environ or torch.distributed.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    torch.distributed.init_process_group(backend=backend)
    if size > 1:
        raise RuntimeError(
            f"primus train: WORLD_SIZE={size} (rank {rank}): multi-rank training is not implemented in this "
            "build; run with --nproc-per-node 1 (see docs/training.md)"
        )
