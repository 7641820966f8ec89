"""The trainer, in four rooms:

- ``model/``: the network, what a step trains in each mode (``objective.py``), the stream
  correction, MTRM's delayed validation, the steppers (``stepper.py``), batches and metrics;
- ``runtime/``: the one training loop and what feeds it (inputs, feeds, the priority reader,
  prefetch, window accounting, the coordinator of a world of one, the sample log);
- ``distributed/``: torchrun's process group, the data-parallel coordinator, ranks' shares of the
  data, the DMP-sharded stepper;
- ``checkpoint/``: atomic checkpoints (local and remote), DCP checkpoints of sharded tables, and the
  loads that refuse pickles.

The backtest that drives this trainer over replayed worlds is ``primus_lib.evaluation``.
"""
