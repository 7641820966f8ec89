"""The trainer process (``primus train``): start-up under torchrun or alone, then the loop.

The pieces: ``options.py`` (what a run does), ``inputs.py`` (feeds, buffers, the batch-lag
rule, window completion), ``windows.py`` (per-window statistics, consumed windows),
``coordinator.py`` / ``data_parallel.py`` (what the ranks agree on), ``loop.py`` (the one
training loop). This module keeps the names callers import.
"""

from __future__ import annotations

import gc

import torch
from prometheus_client import CollectorRegistry

from primus_lib.data.stream import StreamReader
from primus_lib.spec.job import PrimusJob
from primus_lib.train.model.modes import default_switch, max_lag
from primus_lib.train.runtime.feeds import open_stream_readers
from primus_lib.train.runtime.loop import Trainer
from primus_lib.train.runtime.options import TrainerOptions

__all__ = [
    "Trainer",
    "TrainerOptions",
    "compute_threads",
    "default_switch",
    "max_lag",
    "open_stream_readers",
    "run_trainer",
]


def compute_threads(job: PrimusJob) -> int:
    """Torch's intra-op threads: the trainer role's cores but one, which the prefetch and checkpoint
    threads use. Two threads on two loaded cores made each step 10-17x slower (docs/training.md):
    an OpenMP team waits, spinning, for a member the other threads took the core from."""
    return max(1, int(job.spec.resources.roles["trainer"].cpu) - 1)


def run_trainer(
    job: PrimusJob,
    options: TrainerOptions,
    stream_readers: dict[str, list[StreamReader]] | None = None,
    registry: CollectorRegistry | None = None,
) -> str:
    """Start the process group when launched by torchrun, run the trainer, tear the group down."""
    from primus_lib.train.distributed.group import maybe_init_distributed

    torch.set_num_threads(compute_threads(job))
    maybe_init_distributed(job.spec.training.collective_timeout)
    try:
        trainer = Trainer(job, options, stream_readers, registry)
        # The imports and the model are hundreds of thousands of long-lived objects: frozen, the
        # collector's full passes (each a pause of 0.1-0.2 s mid-step) stop walking them.
        gc.freeze()
        return trainer.run()
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
